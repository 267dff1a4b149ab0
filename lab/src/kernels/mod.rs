//! Fused attention kernels (issue 4).
//!
//! - [`cpu`]: flash-style forward and backward in Rust for NoPE, RoPE, PoPE and TAPA.
//! - [`fused`]: the burn backend extension that makes them a differentiable op, and
//!   [`fused::positional_attention`], the entry point the model uses.
//! - [`pointwise`]: fused RMSNorm and GELU with their backwards.
//! - `cube` (features `wgpu` / `cuda`): the same flash-style attention as CubeCL kernels, for
//!   NoPE, RoPE, PoPE and TAPA, behind the same backend extension.

pub mod cpu;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod cube;
pub mod fused;
pub mod pointwise;

pub use fused::positional_attention;
