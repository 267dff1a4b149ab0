//! Fused attention kernels (issue 4). `cpu`: flash-style forward and backward in Rust for NoPE
//! and RoPE, checked against the reference attention; not yet wired into burn's autodiff.
//! `cube` (features `wgpu` / `cuda`): the same flash-style attention as CubeCL kernels, for NoPE,
//! RoPE, PoPE and TAPA.

pub mod cpu;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod cube;
