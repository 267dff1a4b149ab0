//! `lab`: a laboratory for the science of positional encodings in transformers.
//!
//! Data flows one way (DESIGN.md): a sweep file expands into runs ([`sweep`]); each run
//! generates its task ([`tasks`]), trains a model with a positional encoding ([`model`],
//! [`train`]), probes which rotary frequencies it uses ([`probe`]) and writes Parquet tables
//! ([`results`]); the sweep then fits the law θ* ∝ 1/W ([`analysis`]). Trained runs are
//! checkpoints ([`checkpoint`]) that [`eval`] evaluates at other lengths with any RoPE scaling
//! ([`model::scaling`]); [`generate`] prints any task's examples; [`kernels`] holds the fused
//! attention kernels and [`fast`] the whole-step CPU training path built on them; [`plot`] draws
//! each sweep's figures and [`report`] a sweep's one-page HTML report, [`compare`] two results folders; [`mi`] measures the data's mutual-information profiles (`lab mi`);
//! [`bench`] times the fused attention op (`lab bench attention`), [`selfcheck`] checks a
//! backend's kernels and training step against the reference (`lab selfcheck`); [`section`] nests a task's and an encoding's flat parameters into their config sections; [`paths`] resolves the lab root that the sweep files, results and data share.

#![warn(missing_docs)]

pub mod analysis;
pub mod bench;
pub mod checkpoint;
pub mod compare;
pub mod config;
pub mod decode;
pub mod eval;
pub mod fast;
pub mod generate;
pub mod hint;
pub mod indirect;
pub mod kernels;
pub mod mi;
pub mod model;
pub mod needle;
pub mod paths;
pub mod plot;
pub mod probe;
pub mod report;
pub mod results;
pub mod section;
pub mod selfcheck;
pub mod store;
pub mod sweep;
pub mod task;
pub mod train;

pub use tasks;
