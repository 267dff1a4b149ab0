//! Fused attention kernels (issue 4).
//!
//! - [`cpu`]: flash-style forward and backward in Rust for NoPE, RoPE, PoPE and TAPA.
//! - [`fused`]: the burn backend extension that makes them a differentiable op, and
//!   [`fused::positional_attention`], the entry point the model uses.
//! - [`pointwise`]: fused RMSNorm and GELU with their backwards.
//! - [`gemm`]: strided matrix products through the `gemm` crate.
//! - `cube` (features `wgpu` / `cuda`): the same flash-style attention as CubeCL kernels, for
//!   NoPE, RoPE, PoPE and TAPA, behind the same backend extension.

pub mod cpu;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod cube;
pub mod fused;
pub mod gemm;
pub mod map;
pub mod pointwise;

pub use fused::positional_attention;

/// Whether `device` (autodiff or not) is burn-flex, the CPU backend of the Rust kernels in
/// [`cpu`] and [`pointwise`]. The attention extension also has CubeCL implementations (features
/// `wgpu`, `cuda`); the fused RMSNorm/GELU exist for flex only.
pub fn is_flex(device: &burn::tensor::Device) -> bool {
    matches!(
        device.clone().inner().as_dispatch(),
        burn::backend::DispatchDevice::Flex(_)
    )
}

#[cfg(test)]
mod tests {
    use burn::tensor::Device;

    #[test]
    fn flex_is_recognised_through_autodiff() {
        assert!(super::is_flex(&Device::flex()));
        assert!(super::is_flex(&Device::flex().autodiff()));
    }
}
