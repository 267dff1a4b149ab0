//! Fused attention kernels (issue 4).
//!
//! - [`cpu`]: flash-style forward and backward in Rust for NoPE, RoPE, PoPE and TAPA.
//! - [`fused`]: the burn backend extension that makes them a differentiable op, and
//!   [`fused::positional_attention`], the entry point the model uses.
//! - [`pointwise`]: fused RMSNorm and GELU with their backwards.
//! - [`gemm`]: strided matrix products through the `gemm` crate.
//! - `cube` (features `wgpu` / `cuda`): the same flash-style attention as CubeCL kernels, for
//!   NoPE, RoPE, PoPE and TAPA, behind the same backend extension.
//! - `cuda_source` (feature `cuda-source`): the CUDA C++ those kernels compile to on an NVIDIA
//!   GPU, generated without one (`lab bench cuda-source`).
//! - `cuda_host` (feature `cuda-source`): that CUDA C++ run on the CPU, launch by launch, against
//!   the same kernels on `wgpu` (`lab bench cuda-host`).
//! - [`launches`]: the CubeCL kernel launches of a pass, counted by name and timed on the device
//!   (`lab bench train-step --profile-steps`).
//! - [`kernel_cache`]: CubeCL's on-disk cache of compiled kernels and autotune decisions
//!   (`LAB_KERNEL_CACHE`), so the runs of a GPU sweep do not each compile everything again.
//! - [`fusion_config`]: burn's operation fusion as the lab sets it (`LAB_FUSION_MAX_BLOCKS`).

/// Runs `$impl(args)` compiled for AVX-512, AVX2+FMA or the baseline, whichever the CPU has, so
/// that the loops `$impl` inlines vectorise at the machine's width (the crate itself is compiled
/// for baseline x86-64). Without fast-math, LLVM keeps the order of every floating-point
/// operation, so the three copies give the same bits.
macro_rules! dispatch_simd {
    ($impl:ident, ($($arg:ident : $ty:ty),*)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
            unsafe fn v4($($arg: $ty),*) { $impl($($arg),*) }
            #[target_feature(enable = "avx2,fma")]
            unsafe fn v3($($arg: $ty),*) { $impl($($arg),*) }
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
            {
                // SAFETY: the CPU has the features `v4` is compiled for.
                unsafe { v4($($arg),*) }
            } else if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: the CPU has the features `v3` is compiled for.
                unsafe { v3($($arg),*) }
            } else {
                $impl($($arg),*)
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            $impl($($arg),*)
        }
    }};
}

pub mod cpu;
/// Elementwise tolerance `|got − want| ≤ abs + rel·|want|` (the kernels' checks: `lab selfcheck`'s
/// constants in [`crate::selfcheck`], the host runs of `cuda_host`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Tolerance {
    /// Absolute part.
    pub abs: f64,
    /// Relative part.
    pub rel: f64,
}

#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
pub mod cube;
#[cfg(feature = "cuda-source")]
pub mod cuda_host;
#[cfg(feature = "cuda-source")]
pub mod cuda_source;
pub mod fused;
pub mod fusion_config;
pub mod gemm;
pub mod kernel_cache;
pub mod launches;
pub mod map;
pub mod pointwise;

pub use fused::positional_attention;

/// The CubeCL kernel layouts [`set_cube_strategy`] accepts: `rows`, `tiled` (the default),
/// `tiled-split`, `tiled-staged`, `cmma` and `cmma-wide` (forward and backward on tensor cores,
/// emulated where the device has none; `cube::CubeStrategy`, features `wgpu` / `cuda`).
pub const CUBE_STRATEGIES: [&str; 6] = [
    "rows",
    "tiled",
    "tiled-split",
    "tiled-staged",
    "cmma",
    "cmma-wide",
];

/// Lay out every CubeCL attention call that follows in this process as `name` (one of
/// [`CUBE_STRATEGIES`]; results agree to f32 rounding, `cmma` to f16 rounding, only the time changes): `lab bench
/// attention --strategy`. The Rust kernels of the CPU have one layout; there `tiled` is accepted
/// as the no-op default.
///
/// # Errors
/// An unknown name, or a layout other than `tiled` in a build without `wgpu` or `cuda`: one line.
pub fn set_cube_strategy(name: &str) -> Result<(), String> {
    if !CUBE_STRATEGIES.contains(&name) {
        return Err(format!(
            "--strategy: unknown kernel layout `{name}` (allowed: {})",
            CUBE_STRATEGIES.join(", ")
        ));
    }
    set_strategy_in_build(name)
}

#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
fn set_strategy_in_build(name: &str) -> Result<(), String> {
    cube::set_default_strategy(cube::CubeStrategy::parse(name)?);
    Ok(())
}

/// The operand type the `cmma` layouts compute with on `device` (a `wgpu` or `cuda` device) for
/// an encoding and `head_dim`, labelling `lab bench attention --strategy cmma`'s timings:
/// `f16-f32acc` on tensor cores, `f16-f32acc-emulated` where the device has none
/// ([`cube::CmmaPath`]), `None` where the shapes do not fit ([`cube::cmma_shapes_fit`]; `tapa` is
/// `Some((amp_dim, linear_phase))` for TAPA, `None` for the dot-product encodings, whose `w` is
/// `head_dim` or, for PoPE, `2·head_dim`: a multiple of 16 whenever `head_dim` is) and a scalar
/// f32 layout runs.
#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
pub fn cmma_dtype(
    device: &burn::tensor::Device,
    tapa: Option<(usize, bool)>,
    head_dim: usize,
) -> Option<&'static str> {
    if !cube::cmma_shapes_fit(head_dim, head_dim, tapa) {
        return None;
    }
    let client = cube::host_to_cube(&[0.0], [1], device).client;
    Some(if cube::cmma_supported(&client) {
        "f16-f32acc"
    } else {
        "f16-f32acc-emulated"
    })
}

/// Without a CubeCL backend there are no tensor-core kernels.
#[cfg(not(any(feature = "wgpu", feature = "cuda-plain")))]
pub fn cmma_dtype(
    _device: &burn::tensor::Device,
    _tapa: Option<(usize, bool)>,
    _head_dim: usize,
) -> Option<&'static str> {
    None
}

#[cfg(not(any(feature = "wgpu", feature = "cuda-plain")))]
fn set_strategy_in_build(name: &str) -> Result<(), String> {
    if name == "tiled" {
        Ok(())
    } else {
        Err(format!(
            "--strategy {name}: a CubeCL kernel layout; this build has no CubeCL backend (cargo feature wgpu or cuda)"
        ))
    }
}

/// Parse a two-way switch read from the environment variable `var` (`LAB_STEP_READS`, `LAB_ADAMW`,
/// `LAB_POINTWISE`, `LAB_FUSION_ATTENTION`): unset, blank or the first name gives the first choice
/// (the default), the second name the second; surrounding spaces are ignored.
///
/// # Errors
/// Anything else: one line naming the variable and the values allowed
/// (`` VAR = `x`: allowed values are a (the default) or b ``).
pub fn parse_switch<T: Copy>(
    var: &str,
    value: Option<&str>,
    [(first, default), (second, other)]: [(&str, T); 2],
) -> Result<T, String> {
    match value.map(str::trim) {
        None | Some("") => Ok(default),
        Some(v) if v == first => Ok(default),
        Some(v) if v == second => Ok(other),
        Some(v) => Err(format!(
            "{var} = `{v}`: allowed values are {first} (the default) or {second}"
        )),
    }
}

/// A two-way switch of this process read once from an environment variable ([`parse_switch`]'s
/// rules; the first choice is the default): `LAB_STEP_READS`, `LAB_ADAMW`, `LAB_POINTWISE`.
pub struct Switch<T: 'static> {
    var: &'static str,
    choices: [(&'static str, T); 2],
    fixed: std::sync::OnceLock<T>,
}

impl<T: Copy + PartialEq> Switch<T> {
    /// The switch read from `var`, `choices[0]` the default.
    pub const fn new(var: &'static str, choices: [(&'static str, T); 2]) -> Self {
        Self {
            var,
            choices,
            fixed: std::sync::OnceLock::new(),
        }
    }

    /// `value` as this switch reads it ([`parse_switch`]).
    ///
    /// # Errors
    /// A value that names neither choice: one line naming the variable and the values allowed.
    pub fn parse(&self, value: Option<&str>) -> Result<T, String> {
        parse_switch(self.var, value, self.choices)
    }

    /// The name of `choice`, as the variable spells it.
    pub fn name(&self, choice: T) -> &'static str {
        let [(first, _), (second, other)] = self.choices;
        if choice == other { second } else { first }
    }

    /// Fix the switch from the environment for this process; later calls change nothing.
    ///
    /// # Errors
    /// A value [`Switch::parse`] refuses.
    pub fn configure(&self) -> Result<T, String> {
        let choice = self.parse(std::env::var(self.var).ok().as_deref())?;
        Ok(*self.fixed.get_or_init(|| choice))
    }

    /// What [`Switch::configure`] fixed (the default when it was never called).
    pub fn get(&self) -> T {
        self.fixed.get().copied().unwrap_or(self.choices[0].1)
    }
}

/// How the model's RMSNorm, GELU and loss run on a CubeCL device (`wgpu`, `cuda`;
/// `LAB_POINTWISE`): the lab's kernels ([`cube::rms_norm_forward`], [`cube::gelu_forward`],
/// [`cube::xent_forward`] and their backwards, one operation each) or burn's tensor operations
/// (about 170 for the quick model's five RMSNorms and two GELUs, forward and backward, which burn's
/// fusion registers one by one: without fusion, where each is a launch, the step's 321 launches
/// became 163; and 27 for the masked cross-entropy, 144 → 120). flex always uses [`pointwise`]'s
/// kernels for RMSNorm and GELU and burn's operations for the loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointwiseKernel {
    /// The lab's kernels (the default).
    Fused,
    /// burn's tensor operations (the model's path on CubeCL devices until 2026-12-06).
    Ops,
}

static POINTWISE: Switch<PointwiseKernel> = Switch::new(
    "LAB_POINTWISE",
    [
        ("fused", PointwiseKernel::Fused),
        ("ops", PointwiseKernel::Ops),
    ],
);

impl PointwiseKernel {
    /// Parse the value of `LAB_POINTWISE` (`None` when unset: `Fused`).
    ///
    /// # Errors
    /// Anything but `fused` or `ops`: one line naming the variable and the values allowed.
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        POINTWISE.parse(value)
    }

    /// `fused` or `ops`, as `LAB_POINTWISE` spells it.
    pub fn name(self) -> &'static str {
        POINTWISE.name(self)
    }
}

/// Fix [`pointwise_kernel`] from `LAB_POINTWISE` for this process; later calls change nothing.
/// `Backend::device` calls it for `wgpu` and `cuda`.
///
/// # Errors
/// A value [`PointwiseKernel::parse`] refuses.
pub fn configure_pointwise() -> Result<PointwiseKernel, String> {
    POINTWISE.configure()
}

/// The [`PointwiseKernel`] that [`configure_pointwise`] fixed (`Fused` when it was never called).
pub fn pointwise_kernel() -> PointwiseKernel {
    POINTWISE.get()
}

/// Whether `device` (autodiff or not) is burn-flex, the CPU backend of the Rust kernels in
/// [`cpu`] and [`pointwise`]. The attention extension and the fused RMSNorm/GELU also have CubeCL
/// implementations (features `wgpu`, `cuda`).
pub fn is_flex(device: &burn::tensor::Device) -> bool {
    matches!(
        device.clone().inner().as_dispatch(),
        burn::backend::DispatchDevice::Flex(_)
    )
}

#[cfg(test)]
mod tests {
    use burn::tensor::Device;

    /// `LAB_POINTWISE`: fused (also unset or blank) or ops; anything else refused in one line.
    #[test]
    fn parse_lab_pointwise() {
        use super::PointwiseKernel;
        assert_eq!(PointwiseKernel::parse(None), Ok(PointwiseKernel::Fused));
        assert_eq!(PointwiseKernel::parse(Some("")), Ok(PointwiseKernel::Fused));
        assert_eq!(
            PointwiseKernel::parse(Some("ops")),
            Ok(PointwiseKernel::Ops)
        );
        assert_eq!(PointwiseKernel::Fused.name(), "fused");
        let err = PointwiseKernel::parse(Some("flex")).unwrap_err();
        assert_eq!(
            err,
            "LAB_POINTWISE = `flex`: allowed values are fused (the default) or ops"
        );
    }

    /// Unknown layouts are refused by name; `tiled` (the default) is always accepted, and in a
    /// build without CubeCL nothing else is.
    #[test]
    fn cube_strategy_names_are_checked() {
        let err = super::set_cube_strategy("diagonal").unwrap_err();
        assert!(
            err.starts_with("--strategy: unknown kernel layout `diagonal`"),
            "{err}"
        );
        assert!(err.contains("rows, tiled, tiled-split"), "{err}");
        assert_eq!(super::set_cube_strategy("tiled"), Ok(()));
        #[cfg(not(any(feature = "wgpu", feature = "cuda-plain")))]
        assert!(
            super::set_cube_strategy("rows")
                .unwrap_err()
                .contains("no CubeCL backend")
        );
    }

    #[test]
    fn flex_is_recognised_through_autodiff() {
        assert!(super::is_flex(&Device::flex()));
        assert!(super::is_flex(&Device::flex().autodiff()));
    }
}
