//! Sweeps: grid expansion, run identity, scheduling, resume, sharding, merging, status
//! (DESIGN.md "Run identity").

pub mod cluster;
pub mod commands;
pub mod law;
pub mod provenance;
pub mod runner;
pub mod spec;
pub mod status;

pub use runner::{Backend, SweepOptions, SweepReport, run_sweep};
pub use spec::{SweepSpec, find_sweep, list_sweeps, sweeps_dir};
