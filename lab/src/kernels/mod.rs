//! Fused attention kernels (issue 4). `cpu`: flash-style forward and backward in Rust for NoPE
//! and RoPE, checked against the reference attention; not yet wired into burn's autodiff.

pub mod cpu;
