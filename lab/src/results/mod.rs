//! The run tables (`runs`, `curves`, `spectrum`, `layers`, `fit`; [`tables`]) and the plan they describe ([`plan`]), documented in
//! `results/README.md`, on the generic Parquet layer of [`crate::store`] (re-exported here).
//!
//! Every file is written to a temporary name in the same folder (`.<name>.tmp-<pid>`), flushed,
//! fsynced and renamed into place, so a reader sees a table whole or not at all.

pub mod plan;
pub mod tables;

pub use crate::store::*;
