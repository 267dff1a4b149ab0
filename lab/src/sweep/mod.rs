//! Sweeps: grid expansion, run identity, scheduling, resume, merging (DESIGN.md "Run identity").

pub mod runner;
pub mod spec;

pub use runner::{Backend, SweepOptions, SweepReport, run_sweep};
pub use spec::{SweepSpec, find_sweep, list_sweeps, sweeps_dir};
