//! Flash-style causal attention as CubeCL kernels (wgpu, CUDA), forward and backward, for NoPE,
//! RoPE, PoPE and TAPA (Dao et al. 2022, *FlashAttention*, Alg. 1; Dao 2023, *FlashAttention-2*,
//! Alg. 1–2). The score matrix is never stored: memory is O(seq · head_dim) per head.
//!
//! # Design
//!
//! - **Encodings that are a dot product of transformed vectors** (NoPE, RoPE, PoPE): a *prep*
//!   kernel maps `q`, `k` to `q̃`, `k̃` (width `W = head_dim`, or `2·head_dim` for PoPE) once, and
//!   the attention kernels compute `s_ij = q̃_i·k̃_j / √head_dim`. The backward returns `dq̃`,
//!   `dk̃`, and a *prep-backward* kernel maps them back to `dq`, `dk` (and PoPE's `dδ`).
//!   - RoPE: `q̃_i = a · R(i·θ) q_i`, `k̃_j = a · R(j·θ) k_j` per rotation pair
//!     ([`PairLayout::pair_dims`]), `a` = YaRN's attention factor; back: `dq = a · R(−i·θ) dq̃`.
//!   - PoPE (arXiv 2509.10534 §3): `q̃ = [μ_q cos(iθ), μ_q sin(iθ)]`,
//!     `k̃ = [μ_k cos(jθ+δ), μ_k sin(jθ+δ)]`, `μ = softplus(x)`; back through `σ(x)` and
//!     `∂k̃/∂δ`, with `dδ` written per `(batch, head, key, component)` and summed with burn ops.
//! - **TAPA** (arXiv 2509.12635 §3) is not a dot product: the attention kernels evaluate
//!   `s_ij = A_ij · cos(2π·|i−j|^α·P_ij)` on the raw `q`, `k` and differentiate it directly
//!   (chain rule through `A` and `P`).
//!
//! Six layouts ([`CubeStrategy`]), all tested against the reference:
//! - [`CubeStrategy::Rows`]: **one unit per query row** (forward, `dq`) or **one unit per key
//!   row** (`dk`, `dv`), looping over the visible keys (queries) read from global memory;
//! - [`CubeStrategy::Tiled`] (default): one cube per block of `tile` rows; the keys (queries) the
//!   block needs are staged through shared memory one tile of `tile` rows at a time, so a cube
//!   reads each row once instead of once per unit (tile ≤ 64 rows, ≤ 32 KiB of shared memory);
//! - [`CubeStrategy::TiledSplit`]: `Tiled` with the key-side backward split into a `dv` and a `dk`
//!   launch, fewer accumulators per unit at the price of computing the scores twice.
//! - [`CubeStrategy::TiledStaged`]: `Tiled` with each unit's own read-only rows of the backward
//!   (`q̃_i`, `dout_i` for `dq`; `k̃_j`, `v_j` for `dk`, `dv`) in shared memory instead of
//!   registers, so that only the gradient accumulators take registers.
//! - [`CubeStrategy::Cmma`]: the forward on tensor cores (`cmma`, f16 operands, f32
//!   accumulation) for the dot-product encodings and TAPA (its amplitude part; the quadratic
//!   phase's product too), forward and
//!   backward (`attn_fwd_cmma`, `attn_bwd_dq_cmma`, `attn_bwd_dkdv_cmma`); on devices
//!   without tensor cores (lavapipe) the same kernels run emulated ([`CmmaPath::Emulated`]), and
//!   shapes they do not take run `Tiled`;
//!   [`CubeStrategy::CmmaWide`]: the same with several planes per cube sharing each tile.
//!
//! Each unit keeps its row's accumulators in registers (`Array`s of comptime size) with an online
//! softmax (running max `m`, running sum `l`). The forward saves `lse = m + ln l`; the backward
//! recomputes `p_ij = exp(s_ij − lse_i)`, with `Δ_i = Σ_c dout_ic·out_ic` precomputed,
//! `dS_ij = p_ij·(dout_i·v_j − Δ_i)` (FlashAttention-2 Alg. 2). No plane (subgroup) operations
//! and no tensor cores, so the kernels run on Mesa's lavapipe as well as on CUDA: a correct,
//! portable baseline, not a FlashAttention-class kernel (the scores are scalar f32 dot products).
//! On lavapipe (CPU) the tiled layout is ~2× slower than rows (barriers emulated on 2 cores); on
//! GPUs it is untested here (see `bench/gpu.sh`).
//!
//! The kernels are also the `Cube` implementation of
//! [`FusedAttentionBackend`](super::fused::FusedAttentionBackend) (forward, and a registered
//! backward under autodiff), for burn's CubeCL backend without fusion (`wgpu`) and with it
//! (`cuda`, or `wgpu,fusion`): see [`CubePrimitives`].
//!
//! Masking: key `j` is visible from query `i` iff `j ≤ i` (positions are `0..seq`). A row with no
//! visible key (impossible under this mask, the diagonal is always visible) would give a zero
//! output, `lse = 1e30` and zero gradients, never NaN. The running max starts at the finite
//! `−1e30`, so no `exp(−∞ − −∞)` can occur.
//!
//! Layout: `q`, `k`, `v`, `out`, `dout`: `[batch, heads, seq, head_dim]` f32 (made contiguous on
//! entry, except heads stored `[batch, seq, heads, head_dim]`, which RoPE's and PoPE's first kernel
//! reads in place, NoPE's and TAPA's copies in one launch, and whose layout the outputs keep:
//! [`kernel_qk`]); `lse`: `[batch, heads, seq]`.
//! Angles are computed on the device in f32 (`pos·θ`, as PyTorch implementations of RoPE do); the
//! CPU reference builds its tables in f64.

use burn::backend::ops::FloatTensorOps;
use burn::backend::{DType, Shape, TensorMetadata};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim, calculate_cube_count_elemwise};

use super::map::{PairLayout, TapaPhase};

/// Units per cube (workgroup) of every kernel.
const CUBE_UNITS: u32 = 64;

/// The positional encoding evaluated inside the kernels.
#[derive(Clone, Debug)]
pub enum CubeEncoding {
    /// `s = q·k/√d`.
    Nope,
    /// RoPE (Su et al. 2021, eq. 34), with any scaling's inverse frequencies.
    Rope {
        /// `θ_p`, `[head_dim/2]`, radians per token.
        inv_freq: Vec<f64>,
        /// Which dims form pair `p`.
        layout: PairLayout,
        /// Multiplier of both rotated vectors (YaRN's attention factor; 1 otherwise).
        attention_factor: f64,
    },
    /// PoPE (arXiv 2509.10534 §3).
    Pope {
        /// `θ_c = base^(−c/d)`, `[head_dim]`, radians per token.
        theta: Vec<f64>,
        /// Phase bias δ, `[heads · head_dim]` f32 on the same device as `q`, radians.
        delta: CubeTensor,
    },
    /// TAPA (arXiv 2509.12635 §3).
    Tapa {
        /// Amplitude dims: the first `amp_dim` components (`1 ≤ amp_dim < head_dim`).
        amp_dim: usize,
        /// Distance exponent α of `|i−j|^α`.
        alpha: f64,
        /// Quadratic `q_P·k_P` or linear `Σq_P + Σk_P` phase.
        phase: TapaPhase,
        /// Gain `g` of the phase argument (1 = the paper); it rides on the phase's `1/√p`.
        phase_gain: f64,
    },
}

impl CubeEncoding {
    /// Whether a first kernel maps `q`, `k` into `q̃`, `k̃` (RoPE's rotation, PoPE's polar map),
    /// reading them row by row (NoPE's and TAPA's attention kernels read `q`, `k` themselves).
    fn rotates(&self) -> bool {
        matches!(self, CubeEncoding::Rope { .. } | CubeEncoding::Pope { .. })
    }
}

/// How the attention kernels are laid out on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CubeStrategy {
    /// One unit per row, every unit reading its keys (queries) from global memory.
    Rows,
    /// One cube per block of `tile` rows, staging key (query) tiles of `tile` rows in shared
    /// memory. `None`: the largest of 64, 32, 16, 8, 4, 2, 1 whose tiles fit in 32 KiB (lavapipe's
    /// shared-memory limit; CUDA allows 48 KiB).
    Tiled {
        /// Rows per tile (= units per cube), or `None` for the automatic choice.
        tile: Option<usize>,
    },
    /// [`CubeStrategy::Tiled`], except that the key-side backward runs as two launches of the
    /// tiled `dk`/`dv` kernel, one writing `dv`, one writing `dk`, so that a unit holds `k̃_j` and
    /// `dv_j` (`w + d` floats) in one and `k̃_j`, `v_j` and `dk̃_j` (`2w + d`) in the other instead
    /// of all four (`2w + 2d`: 384 floats for PoPE at head_dim 64, past the 255 registers of an
    /// NVIDIA thread). The scores are computed twice. A candidate for PoPE's slow backward on CUDA
    /// (docs/performance.md, "GPU"); `lab bench attention --strategy tiled-split` times it.
    TiledSplit {
        /// Rows per tile (= units per cube), or `None` for the automatic choice.
        tile: Option<usize>,
    },
    /// [`CubeStrategy::Tiled`], except that the backward kernels keep each unit's own read-only
    /// rows (`q̃_i`, `dout_i` in the `dq` kernel; `k̃_j`, `v_j` in the `dk`/`dv` kernel) in shared
    /// memory, one row per unit at a stride of `w + 1` / `d + 1` floats (consecutive units then
    /// read different banks), instead of local arrays: a unit's registers hold only its gradient
    /// accumulators (`w` for `dq̃`; `w + d` for `dk̃`, `dv`). Compiled for sm 90, the tiled backward
    /// spills for every encoding (PoPE's key-side kernel keeps its arrays in local memory:
    /// docs/performance.md, "The kernels on sm 90 without a GPU"); this layout is the candidate
    /// that removes the spills at the price of a second shared-memory read per multiply-add. The
    /// automatic tile of its backward fits `2(w + d) + 4` floats per row in the device's shared
    /// memory (at most 64 KiB); its forward is `Tiled`'s.
    TiledStaged {
        /// Rows per tile (= units per cube), or `None` for the automatic choice.
        tile: Option<usize>,
    },
    /// [`CubeStrategy::Cmma`] with up to [`CMMA_WIDE_PLANES`] planes per cube (as many as fit
    /// the device's shared memory and 48 KiB: [`cmma_fwd_shared_bytes`]), each owning 16 query
    /// rows and all of them sharing each key tile the cube loads (up to 64 query rows per cube): the
    /// keys and values are read from global memory (L2) once per 64 query rows instead of once
    /// per 16. At 4096 tokens × 8 heads × head_dim 64 the one-plane kernel streams about 2 GB of
    /// f32 keys and values per call (by estimate 0.2–0.3 ms at an assumed 7–10 TB/s of L2
    /// bandwidth, against FlashAttention-2's measured 0.10 ms for the whole op), this one a quarter. Falls back like
    /// `Cmma`; its tensor-core backward takes as many planes (at most four) as fit the shared
    /// memory ([`cmma_bwd_shared_bytes`], 48 KiB at most).
    CmmaWide {
        /// Rows per tile of the backward, or `None` for the automatic choice.
        tile: Option<usize>,
    },
    /// The forward on tensor cores (`cmma` 16×16×16, f16 operands, f32 accumulation; the
    /// `attn_fwd_cmma` kernel) where it applies ([`cmma_path_of`] `TensorCores`: a device with that `cmma`
    /// form and 32-unit planes, a dot-product encoding or TAPA, `W`, `head_dim` and TAPA's
    /// `amp_dim` multiples of 16),
    /// [`CubeStrategy::Tiled`]'s forward elsewhere. The backward on tensor cores too, where the
    /// forward is (`attn_bwd_dq_cmma`, `attn_bwd_dkdv_cmma`: FlashAttention-2's backward with
    /// 16×16 tiles, `dS` and `P` rounded to f16); `Tiled`'s elsewhere. On a
    /// device without that `cmma` form the same kernels run emulated ([`CmmaPath::Emulated`]: each
    /// product computed by the units from the same f16 operands), so lavapipe checks their
    /// logic. Outputs differ from the f32 layouts by f16 rounding of `q̃`, `k̃`, `v`, `p`,
    /// `dout` and `dS` (about 1e-3 relative; `lab selfcheck` group `kernel cmma`).
    Cmma {
        /// Rows per tile of the backward, or `None` for the automatic choice.
        tile: Option<usize>,
    },
}

impl CubeStrategy {
    /// `rows`, `tiled`, `tiled-split`, `tiled-staged` or `cmma` (automatic tile;
    /// [`super::CUBE_STRATEGIES`]).
    ///
    /// # Errors
    /// Any other name: one line listing the allowed ones.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "rows" => Ok(Self::Rows),
            "tiled" => Ok(Self::Tiled { tile: None }),
            "tiled-split" => Ok(Self::TiledSplit { tile: None }),
            "tiled-staged" => Ok(Self::TiledStaged { tile: None }),
            "cmma" => Ok(Self::Cmma { tile: None }),
            "cmma-wide" => Ok(Self::CmmaWide { tile: None }),
            other => Err(format!(
                "--strategy: unknown kernel layout `{other}` (allowed: {})",
                super::CUBE_STRATEGIES.join(", ")
            )),
        }
    }
}

/// The layout [`CubeAttentionParams::new`] uses (the model's fused attention): `Tiled` unless
/// [`set_default_strategy`] changed it.
static DEFAULT_STRATEGY: std::sync::RwLock<CubeStrategy> =
    std::sync::RwLock::new(CubeStrategy::Tiled { tile: None });

/// Make `strategy` the layout of every [`CubeAttentionParams::new`] from now on, in this process
/// (`lab bench attention --strategy`; results agree to f32 rounding whatever the layout).
pub fn set_default_strategy(strategy: CubeStrategy) {
    *DEFAULT_STRATEGY.write().unwrap_or_else(|e| e.into_inner()) = strategy;
}

/// The layout [`CubeAttentionParams::new`] uses now.
pub fn default_strategy() -> CubeStrategy {
    *DEFAULT_STRATEGY.read().unwrap_or_else(|e| e.into_inner())
}

/// Parameters of the fused attention (the encoding; positions are always `0..seq`).
#[derive(Clone, Debug)]
pub struct CubeAttentionParams {
    /// The encoding.
    pub encoding: CubeEncoding,
    /// Kernel layout (results agree to f32 rounding).
    pub strategy: CubeStrategy,
}

impl CubeAttentionParams {
    /// `encoding` with the default strategy ([`default_strategy`]: tiled, automatic tile, unless
    /// [`set_default_strategy`] changed it).
    pub fn new(encoding: CubeEncoding) -> Self {
        Self {
            encoding,
            strategy: default_strategy(),
        }
    }
}

/// Planes (32 units, 16 query rows each) per cube of [`CubeStrategy::CmmaWide`], at most (fewer
/// where the device's shared memory holds fewer).
pub const CMMA_WIDE_PLANES: usize = 4;

/// Shared memory budget of the tiled kernels, bytes.
const SHARED_BYTES: usize = 32 * 1024;

/// Tile rows for the tiled kernels: the largest power of two ≤ 64 whose staged rows
/// (`w + d + 2` floats each, the backward's largest) fit in [`SHARED_BYTES`].
fn auto_tile(w: usize, d: usize) -> usize {
    let per_row = (w + d + 2) * 4;
    [64, 32, 16, 8, 4, 2, 1]
        .into_iter()
        .find(|&bn| bn * per_row <= SHARED_BYTES)
        .unwrap_or(1)
}

/// Tile rows of [`CubeStrategy::TiledStaged`]'s backward: the largest power of two ≤ 64 whose
/// shared rows (the staged tiles, `w + d + 2` floats, and the unit's own rows, `w + d + 2` with
/// their padding) fit in `max_shared` bytes (the device's limit), capped at 64 KiB.
fn auto_tile_staged(w: usize, d: usize, max_shared: usize) -> usize {
    let per_row = (2 * (w + d) + 4) * 4;
    let budget = max_shared.min(64 * 1024);
    [64, 32, 16, 8, 4, 2, 1]
        .into_iter()
        .find(|&bn| bn * per_row <= budget)
        .unwrap_or(1)
}

/// Gradients returned by [`backward`]; each like its input.
#[derive(Clone, Debug)]
pub struct CubeGrads {
    /// `∂L/∂q`, `[batch, heads, seq, head_dim]`.
    pub dq: CubeTensor,
    /// `∂L/∂k`, `[batch, heads, seq, head_dim]`.
    pub dk: CubeTensor,
    /// `∂L/∂v`, `[batch, heads, seq, head_dim]`.
    pub dv: CubeTensor,
    /// PoPE only: `∂L/∂δ`, `[heads · head_dim]`.
    pub ddelta: Option<CubeTensor>,
}

/// `kernels::$k::launch(client, count, dim, args…)`. While [`super::cuda_source`] captures
/// (feature `cuda-source`), the same kernel with the same arguments is recorded for the CUDA
/// compiler instead, and nothing runs.
macro_rules! launch {
    ($k:ident, $client:expr, $count:expr, $dim:expr, $($arg:expr),+ $(,)?) => {{
        #[cfg(feature = "cuda-source")]
        {
            if let Some((props, target)) = super::cuda_source::capturing() {
                super::cuda_source::record(
                    stringify!($k),
                    super::cuda_source::count_of(&$count),
                    Box::new(kernels::$k::create_dummy_kernel(props, target, $count, $dim, $($arg),+)),
                );
            } else if super::cuda_host::teeing() {
                let kinds = vec![$(super::cuda_host::TeeArg::kind(&$arg)),+];
                let count = super::cuda_source::count_of(&$count);
                let dim: CubeDim = $dim;
                super::cuda_host::launch_teed(
                    stringify!($k),
                    count,
                    [dim.0.x, dim.0.y, dim.0.z],
                    kinds,
                    || kernels::$k::launch($client, $count, $dim, $($arg),+),
                );
            } else {
                kernels::$k::launch($client, $count, $dim, $($arg),+);
            }
        }
        #[cfg(not(feature = "cuda-source"))]
        kernels::$k::launch($client, $count, $dim, $($arg),+);
    }};
}

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

#[allow(missing_docs)]
mod kernels {
    use cubecl::prelude::*;
    use half::f16;

    /// `Σ_{c ∈ [start, end)} x[xb + c] · y[yb + c]` (`x` a unit's own row: a local `Array` with
    /// `xb = 0`, or its row of a shared tile).
    #[cube]
    pub fn dot_range(
        x: &[f32],
        xb: usize,
        y: &[f32],
        yb: usize,
        #[comptime] start: usize,
        #[comptime] end: usize,
    ) -> f32 {
        let mut acc = 0.0f32;
        #[unroll]
        for c in start..end {
            acc += x[xb + c] * y[yb + c];
        }
        acc
    }

    /// `Σ_{c ∈ [start, end)} y[yb + c]`.
    #[cube]
    pub fn sum_range(
        y: &[f32],
        yb: usize,
        #[comptime] start: usize,
        #[comptime] end: usize,
    ) -> f32 {
        let mut acc = 0.0f32;
        #[unroll]
        for c in start..end {
            acc += y[yb + c];
        }
        acc
    }

    /// `Σ_{c ∈ [start, end)} x[xb + c]`.
    #[cube]
    pub fn sum_local(
        x: &[f32],
        xb: usize,
        #[comptime] start: usize,
        #[comptime] end: usize,
    ) -> f32 {
        let mut acc = 0.0f32;
        #[unroll]
        for c in start..end {
            acc += x[xb + c];
        }
        acc
    }

    /// TAPA's score from its scaled parts: `amp · cos(2π |i − j|^α · phase)`, `amp = q_A·k_A/√(ρd)`,
    /// `phase = q_P·k_P/√((1−ρ)d)` (or the linear phase), the module docs' formula.
    #[cube]
    pub fn tapa_score(amp: f32, phase: f32, i: usize, j: usize, alpha: f32) -> f32 {
        amp * f32::cos(6.283_185_307_179_586f32 * dist_pow(i, j, alpha) * phase)
    }

    /// A zeroed 16×16 f32 `cmma` accumulator (the tensor-core kernels' only `cmma` shape).
    #[cube]
    pub fn mma_zero() -> cmma::Matrix<f32> {
        cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            16usize,
            16usize,
            16usize,
            cmma::MatrixLayout::Undefined,
            0.0f32,
        )
    }

    /// The 16×16 f16 `A` operand of a `cmma` step at `x[0..]`, row-major, row stride `stride`.
    #[cube]
    pub fn mma_a(x: &[f16], stride: u32) -> cmma::Matrix<f16> {
        cmma::Matrix::<f16>::from_slice(
            cmma::MatrixIdent::A,
            16usize,
            16usize,
            16usize,
            cmma::MatrixLayout::RowMajor,
            x,
            stride,
        )
    }

    /// The 16×16 f16 `B` operand (`[k, n]`) of a `cmma` step at `x[0..]`: row-major with row
    /// stride `stride`, or `col_major` (its columns are the rows of `x`: `Bᵀ` stored row-major,
    /// as key rows are for `Q Kᵀ`).
    #[cube]
    pub fn mma_b(x: &[f16], stride: u32, #[comptime] col_major: bool) -> cmma::Matrix<f16> {
        let layout = comptime!(if col_major {
            cmma::MatrixLayout::ColMajor
        } else {
            cmma::MatrixLayout::RowMajor
        });
        cmma::Matrix::<f16>::from_slice(
            cmma::MatrixIdent::B,
            16usize,
            16usize,
            16usize,
            layout,
            x,
            stride,
        )
    }

    /// The score-side products of one tile of the tensor-core backward: `X Yᵀ` into
    /// `sc[sb..sb + 256]` and `U Zᵀ` into `sc[sb + dpo..sb + dpo + 256]` (16 × 16, row-major), for
    /// the plane's 16 rows `X` (`x[xb..]`, `w` wide) and `U` (`u[ub..]`, `d` wide) and a tile's
    /// 16 rows `Y` (`y[0..]`) and `Z` (`z[0..]`), all f16 with row strides `w`, `d`. TAPA's
    /// quadratic phase (`chains` 2): `X Yᵀ` over the first `split` 16-column blocks, and over the
    /// rest into `sc[sb + 256..]`. On tensor cores (`cmma`, f32 accumulation), or `emulate`d by
    /// the plane's 32 units from the same operands (unit `lane` computes entries `s·32 + lane`).
    #[cube]
    pub fn mma_score_tiles(
        x: &[f16],
        xb: usize,
        y: &[f16],
        u: &[f16],
        ub: usize,
        z: &[f16],
        sc: &mut [f32],
        sb: usize,
        lane: usize,
        #[comptime] w: usize,
        #[comptime] d: usize,
        #[comptime] split: usize,
        #[comptime] chains: usize,
        #[comptime] dpo: usize,
        #[comptime] emulate: bool,
    ) {
        if emulate {
            for s in 0..8usize {
                let e = s * 32usize + lane;
                let xo = xb + (e / 16usize) * w;
                let yo = (e % 16usize) * w;
                for ch in 0..chains {
                    let lo = ch * split * 16usize;
                    let hi = (split + ch * comptime!(w / 16 - split)) * 16usize;
                    let mut acc = 0.0f32;
                    for kk in lo..hi {
                        acc += f32::cast_from(x[xo + kk]) * f32::cast_from(y[yo + kk]);
                    }
                    sc[sb + ch * 256usize + e] = acc;
                }
                let uo = ub + (e / 16usize) * d;
                let zo = (e % 16usize) * d;
                let mut acc = 0.0f32;
                for kk in 0..d {
                    acc += f32::cast_from(u[uo + kk]) * f32::cast_from(z[zo + kk]);
                }
                sc[sb + dpo + e] = acc;
            }
        } else {
            let stride_w = comptime!(w as u32);
            let stride_d = comptime!(d as u32);
            #[unroll]
            for ch in 0..chains {
                let acc = mma_zero();
                let lo = ch * split;
                let hi = split + ch * comptime!(w / 16 - split);
                for c in lo..hi {
                    let a = mma_a(&x[xb + c * 16..xb + comptime!(16 * w)], stride_w);
                    let b = mma_b(&y[c * 16..comptime!(16 * w)], stride_w, true);
                    cmma::execute(&a, &b, &acc, &acc);
                }
                cmma::store(
                    &mut sc[sb + ch * 256usize..sb + ch * 256usize + 256usize],
                    &acc,
                    16u32,
                    cmma::MatrixLayout::RowMajor,
                );
            }
            let acc = mma_zero();
            #[unroll]
            for c in 0..comptime!(d / 16) {
                let a = mma_a(&u[ub + c * 16..ub + comptime!(16 * d)], stride_d);
                let b = mma_b(&z[c * 16..comptime!(16 * d)], stride_d, true);
                cmma::execute(&a, &b, &acc, &acc);
            }
            cmma::store(
                &mut sc[sb + dpo..sb + dpo + 256usize],
                &acc,
                16u32,
                cmma::MatrixLayout::RowMajor,
            );
        }
    }

    /// `A B` for the plane's 16 × 16 f16 tile `A` (`a[ab..ab + 256]`, row-major) and a tile's 16
    /// f16 rows `B` of `n` columns (`b[0..]`, row stride `n`), into `out[ob..]` (16 × n f32,
    /// row-major), the first `cols` columns only (the others are not written). `two` (TAPA's
    /// quadratic phase): the columns from `switch` on take a second tile `a[ab + 256..]`. On
    /// tensor cores, or `emulate`d as in [`mma_score_tiles`].
    #[cube]
    pub fn mma_tile_rows(
        a: &[f16],
        ab: usize,
        b: &[f16],
        out: &mut [f32],
        ob: usize,
        lane: usize,
        #[comptime] n: usize,
        #[comptime] cols: usize,
        #[comptime] two: bool,
        #[comptime] switch: usize,
        #[comptime] emulate: bool,
    ) {
        if emulate {
            for s in 0..comptime!(n / 2) {
                let e = s * 32usize + lane;
                let col = e % n;
                if col < cols {
                    let mut ao = ab + (e / n) * 16usize;
                    if two {
                        if col >= switch {
                            ao += 256usize;
                        }
                    }
                    let mut acc = 0.0f32;
                    for kk in 0..16usize {
                        acc += f32::cast_from(a[ao + kk]) * f32::cast_from(b[kk * n + col]);
                    }
                    out[ob + e] = acc;
                }
            }
        } else {
            let stride = comptime!(n as u32);
            let mut at = mma_a(&a[ab..ab + 256usize], 16u32);
            #[unroll]
            for c in 0..comptime!(cols / 16) {
                if two {
                    if comptime!(switch / 16) == c {
                        cmma::load(&mut at, &a[ab + 256usize..ab + 512usize], 16u32);
                    }
                }
                let bt = mma_b(&b[c * 16..comptime!(16 * n)], stride, false);
                let o = mma_zero();
                cmma::execute(&at, &bt, &o, &o);
                cmma::store(
                    &mut out[ob + c * 16..ob + comptime!(16 * n)],
                    &o,
                    stride,
                    cmma::MatrixLayout::RowMajor,
                );
            }
        }
    }

    /// TAPA distance power `|i − j|^α` (0 on the diagonal).
    #[cube]
    pub fn dist_pow(i: usize, j: usize, alpha: f32) -> f32 {
        let mut out = 0.0f32;
        if i != j {
            let dist = if i > j { i - j } else { j - i };
            out = f32::exp(alpha * f32::ln(f32::cast_from(dist as u32)));
        }
        out
    }

    /// TAPA amplitude term `x_A·y_A / √a` (symmetric in the two rows).
    #[cube]
    pub fn tapa_amp(
        x: &[f32],
        xb: usize,
        y: &[f32],
        yb: usize,
        inv_sqrt_a: f32,
        #[comptime] amp: usize,
    ) -> f32 {
        dot_range(x, xb, y, yb, 0usize, amp) * inv_sqrt_a
    }

    /// TAPA phase term `x_P·y_P / √p` (quadratic) or `(Σx_P + Σy_P)/√p` (linear), `x_sum = Σx_P`.
    #[cube]
    pub fn tapa_phase(
        x: &[f32],
        xb: usize,
        x_sum: f32,
        y: &[f32],
        yb: usize,
        inv_sqrt_p: f32,
        #[comptime] amp: usize,
        #[comptime] d: usize,
        #[comptime] linear: bool,
    ) -> f32 {
        let mut raw = 0.0f32;
        if linear {
            raw += x_sum + sum_range(y, yb, amp, d);
        } else {
            raw += dot_range(x, xb, y, yb, amp, d);
        }
        raw * inv_sqrt_p
    }

    /// Score `s_ij` of row `x` (query `i`, or key `j` — the score is symmetric in the two rows)
    /// against the row at `y[yb..yb + w]`: `scale · x·y` on score-space vectors (NoPE, RoPE,
    /// PoPE), or TAPA's `A · cos(2π |i − j|^α P)` on raw q/k (TAPA, eq. 3). `x_sum = Σ x_P`
    /// (linear phase only).
    #[cube]
    pub fn score(
        x: &[f32],
        xb: usize,
        x_sum: f32,
        y: &[f32],
        yb: usize,
        i: usize,
        j: usize,
        scale: f32,
        inv_sqrt_a: f32,
        inv_sqrt_p: f32,
        alpha: f32,
        #[comptime] w: usize,
        #[comptime] tapa: bool,
        #[comptime] amp: usize,
        #[comptime] linear: bool,
    ) -> f32 {
        let mut s = 0.0f32;
        if tapa {
            let a = tapa_amp(x, xb, y, yb, inv_sqrt_a, amp);
            let p = tapa_phase(x, xb, x_sum, y, yb, inv_sqrt_p, amp, w, linear);
            s += tapa_score(a, p, i, j, alpha);
        } else {
            s += dot_range(x, xb, y, yb, 0usize, w) * scale;
        }
        s
    }

    /// One backward term of [`score`]: with `p_ij = exp(s_ij − lse_i)` and
    /// `ds_ij = p_ij (dp_ij − Δ_i)` (FlashAttention-2, Alg. 2), adds `ds_ij · ∂s_ij/∂x` to `g`
    /// and returns `p_ij` (for `dv`). Arguments as in [`score`]; `yg` is where the update reads
    /// the other row (`yb`, the same row: a different expression only to keep a compiler from
    /// reusing the score's loads, [`CubeStrategy::TiledStaged`]). TAPA's derivatives are
    /// `∂s/∂A = cos φ` and `∂s/∂P = −A sin φ · 2π|i − j|^α`.
    #[cube]
    pub fn add_score_grad(
        g: &mut Array<f32>,
        x: &[f32],
        xb: usize,
        x_sum: f32,
        y: &[f32],
        yb: usize,
        yg: usize,
        i: usize,
        j: usize,
        lse_i: f32,
        dp: f32,
        delta_i: f32,
        scale: f32,
        inv_sqrt_a: f32,
        inv_sqrt_p: f32,
        alpha: f32,
        #[comptime] w: usize,
        #[comptime] tapa: bool,
        #[comptime] amp: usize,
        #[comptime] linear: bool,
    ) -> f32 {
        let mut p = 0.0f32;
        if tapa {
            let a = tapa_amp(x, xb, y, yb, inv_sqrt_a, amp);
            let ph = tapa_phase(x, xb, x_sum, y, yb, inv_sqrt_p, amp, w, linear);
            let two_pi_dist = 6.283_185_307_179_586f32 * dist_pow(i, j, alpha);
            let phi = two_pi_dist * ph;
            let cos_phi = f32::cos(phi);
            p += f32::exp(a * cos_phi - lse_i);
            let ds = p * (dp - delta_i);
            let ga = ds * cos_phi * inv_sqrt_a;
            let gp = -ds * a * f32::sin(phi) * two_pi_dist * inv_sqrt_p;
            #[unroll]
            for c in 0..amp {
                g[c] += ga * y[yg + c];
            }
            if linear {
                #[unroll]
                for c in amp..w {
                    g[c] += gp;
                }
            } else {
                #[unroll]
                for c in amp..w {
                    g[c] += gp * y[yg + c];
                }
            }
        } else {
            let s = dot_range(x, xb, y, yb, 0usize, w) * scale;
            p += f32::exp(s - lse_i);
            let ds = p * (dp - delta_i) * scale;
            #[unroll]
            for c in 0..w {
                g[c] += ds * y[yg + c];
            }
        }
        p
    }

    /// Forward: one unit per query row. `q`, `k`: `[rows, w]`; `v`, `out`: `[rows, d]` (`out`
    /// token-major, [`row_start`], when `out_token_major`); `lse`: `[rows]`. `tapa` selects the
    /// TAPA score on raw q/k (then `w == d`).
    #[cube(launch, create_dummy_kernel)]
    pub fn attn_fwd(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        out: &mut [f32],
        lse: &mut [f32],
        rows: u32,
        seq: u32,
        heads: u32,
        scale: f32,
        inv_sqrt_a: f32,
        inv_sqrt_p: f32,
        alpha: f32,
        #[comptime] w: usize,
        #[comptime] d: usize,
        #[comptime] tapa: bool,
        #[comptime] amp: usize,
        #[comptime] linear: bool,
        #[comptime] out_token_major: bool,
    ) {
        let r = ABSOLUTE_POS;
        if r >= rows as usize {
            terminate!();
        }
        let l = seq as usize;
        let i = r % l;
        let base = r - i; // first row of this (batch, head)
        let mut qi = Array::<f32>::new(w);
        #[unroll]
        for c in 0..w {
            qi[c] = q[r * w + c];
        }
        let mut acc = Array::<f32>::new(d);
        #[unroll]
        for c in 0..d {
            acc[c] = 0.0f32;
        }
        let mut q_sum = 0.0f32;
        if tapa {
            q_sum = sum_local(qi.as_slice(), 0usize, amp, w);
        }
        // Running max, starting at the finite −1e30 (written as an update: a negative literal
        // initialiser would be folded into a comptime constant by the `cube` macro).
        let mut m = 0.0f32;
        m -= 1.0e30f32;
        let mut sum = 0.0f32;
        for j in 0..i + 1 {
            let s = score(
                qi.as_slice(),
                0usize,
                q_sum,
                k,
                (base + j) * w,
                i,
                j,
                scale,
                inv_sqrt_a,
                inv_sqrt_p,
                alpha,
                w,
                tapa,
                amp,
                linear,
            );
            let m_new = f32::max(m, s);
            let corr = f32::exp(m - m_new);
            let p = f32::exp(s - m_new);
            sum = sum * corr + p;
            let vb = (base + j) * d;
            #[unroll]
            for c in 0..d {
                acc[c] = acc[c] * corr + p * v[vb + c];
            }
            m = m_new;
        }
        let mut inv = 0.0f32;
        let mut row_lse = 1.0e30f32;
        if sum > 0.0f32 {
            inv = 1.0f32 / sum;
            row_lse = m + f32::ln(sum);
        }
        let os = row_start(r, seq, heads, d, out_token_major);
        #[unroll]
        for c in 0..d {
            out[os + c] = acc[c] * inv;
        }
        lse[r] = row_lse;
    }

    /// `delta[r] = Σ_c dout[r, c] · out[r, c]`, one unit per row; `out` token-major
    /// ([`row_start`]) when `out_token_major`.
    #[cube(launch, create_dummy_kernel)]
    pub fn row_dot(
        dout: &[f32],
        out: &[f32],
        delta: &mut [f32],
        rows: u32,
        seq: u32,
        heads: u32,
        #[comptime] d: usize,
        #[comptime] out_token_major: bool,
    ) {
        let r = ABSOLUTE_POS;
        if r >= rows as usize {
            terminate!();
        }
        let os = row_start(r, seq, heads, d, out_token_major);
        let mut acc = 0.0f32;
        #[unroll]
        for c in 0..d {
            acc += dout[r * d + c] * out[os + c];
        }
        delta[r] = acc;
    }

    /// Partial sums of squares of several tensors for a gradient norm: unit `u < units` adds,
    /// tensor after tensor in the sequence's order, `x[i]²` over `i = u, u + units, u + 2·units,
    /// … < len(x)` into `partials[offset + u]` (one launch for all the tensors; the sequence is
    /// unrolled at compile time, so a kernel is compiled per number of tensors).
    #[cube(launch, create_dummy_kernel)]
    pub fn sq_sum_partials(
        xs: &Sequence<Box<[f32]>>,
        partials: &mut [f32],
        units: u32,
        offset: u32,
    ) {
        let u = ABSOLUTE_POS as u32;
        if u >= units {
            terminate!();
        }
        let count = xs.len().comptime();
        let mut acc = 0.0f32;
        #[unroll]
        for t in 0..count {
            let x = &xs[t];
            let n = x.len() as u32;
            if u < n {
                let iters = (n - u).div_ceil(units);
                for k in 0..iters {
                    let v = x[(u + k * units) as usize];
                    acc += v * v;
                }
            }
        }
        partials[(offset + u) as usize] = acc;
    }

    /// The end of a training step's statistics, one cube of `units` units: unit `t` adds
    /// `partials[t], partials[t + units], …` (`< n`), then unit 0 adds the `units` sums in order
    /// and writes `stats = [loss[0], correct[0], Σ partials]` and `clip[0] = min(1, max_norm /
    /// (√Σ + 1e-6))` (PyTorch's `clip_grad_norm_` factor; 1 when `max_norm ≤ 0`, or when the
    /// sum is not a number).
    #[cube(launch, create_dummy_kernel)]
    pub fn step_stats(
        partials: &[f32],
        loss: &[f32],
        correct: &[f32],
        stats: &mut [f32],
        clip: &mut [f32],
        n: u32,
        max_norm: f32,
        #[comptime] units: usize,
    ) {
        let t = UNIT_POS as usize;
        let mut sums = Shared::<[f32]>::new_slice(units);
        let mut acc = 0.0f32;
        let len = n as usize;
        if t < len {
            let iters = (len - t).div_ceil(units);
            for k in 0..iters {
                acc += partials[t + k * units];
            }
        }
        sums[t] = acc;
        sync_cube();
        if t == 0 {
            let mut total = 0.0f32;
            for u in 0..units {
                total += sums[u];
            }
            stats[0] = loss[0];
            stats[1] = correct[0];
            stats[2] = total;
            let mut factor = 1.0f32;
            if max_norm > 0.0f32 {
                let c = max_norm / (f32::sqrt(total) + 1.0e-6f32);
                if c < 1.0f32 {
                    factor = c;
                }
            }
            clip[0] = factor;
        }
    }

    /// `erf(x)` by Abramowitz & Stegun 7.1.26 (absolute error ≤ 1.5e-7), from `e = exp(−x²)`:
    /// the form of [`crate::kernels::pointwise::erf_approx`].
    #[cube]
    pub fn erf_as(x: f32, e: f32) -> f32 {
        let ax = f32::abs(x);
        let t = 1.0f32 / (1.0f32 + 0.327_591_1f32 * ax);
        let poly = t
            * (0.254_829_6f32
                + t * (-0.284_496_74f32
                    + t * (1.421_413_8f32 + t * (-1.453_152_1f32 + t * 1.061_405_4f32))));
        let y = 1.0f32 - poly * e;
        let mut out = y;
        if x < 0.0f32 {
            out = -y;
        }
        out
    }

    /// GELU, exact form (Hendrycks & Gimpel 2016): `y = x·Φ(x)`, `Φ(x) = ½(1 + erf(x/√2))`, element
    /// `i` per unit, `n` elements.
    #[cube(launch, create_dummy_kernel)]
    pub fn gelu_fwd(x: &[f32], y: &mut [f32], n: u32) {
        let i = ABSOLUTE_POS;
        if i >= n as usize {
            terminate!();
        }
        let v = x[i];
        let z = v * 0.707_106_77f32;
        y[i] = v * 0.5f32 * (1.0f32 + erf_as(z, f32::exp(-z * z)));
    }

    /// GELU's backward: `dx = dy·(Φ(x) + x·φ(x))`, `φ(x) = e^(−x²/2)/√(2π)`, element `i` per unit.
    #[cube(launch, create_dummy_kernel)]
    pub fn gelu_bwd(x: &[f32], dy: &[f32], dx: &mut [f32], n: u32) {
        let i = ABSOLUTE_POS;
        if i >= n as usize {
            terminate!();
        }
        let v = x[i];
        let z = v * 0.707_106_77f32;
        let e = f32::exp(-z * z);
        let cdf = 0.5f32 * (1.0f32 + erf_as(z, e));
        dx[i] = dy[i] * (cdf + v * e * 0.398_942_3f32);
    }

    /// The masked cross-entropy of each row of logits, row `r` per unit (`logits`: `[rows,
    /// vocab]`; `targets`, `mask`, `loss`, `correct`: `[rows]`, the targets as f32 ids):
    /// `loss[r] = (logsumexp(x_r) − x_r[t_r])·mask[r]` (the max subtracted first) and `correct[r] =
    /// [argmax x_r = t_r]·mask[r]`, the first maximum as burn's `argmax` takes it.
    #[cube(launch, create_dummy_kernel)]
    pub fn xent_fwd(
        logits: &[f32],
        targets: &[f32],
        mask: &[f32],
        loss: &mut [f32],
        correct: &mut [f32],
        rows: u32,
        vocab: u32,
    ) {
        let r = ABSOLUTE_POS;
        if r >= rows as usize {
            terminate!();
        }
        let v = vocab as usize;
        let base = r * v;
        let mut m = logits[base];
        let mut arg = 0usize;
        for c in 1..v {
            let x = logits[base + c];
            if x > m {
                m = x;
                arg = c;
            }
        }
        let mut sum = 0.0f32;
        for c in 0..v {
            sum += f32::exp(logits[base + c] - m);
        }
        let t = u32::cast_from(targets[r]) as usize;
        let w = mask[r];
        loss[r] = (m + f32::ln(sum) - logits[base + t]) * w;
        let mut hit = 0.0f32;
        if arg == t {
            hit = 1.0f32;
        }
        correct[r] = hit * w;
    }

    /// [`xent_fwd`]'s gradient: `dlogits[r, c] = dloss[r]·mask[r]·(softmax(x_r)_c − [c = t_r])`,
    /// row `r` per unit.
    #[cube(launch, create_dummy_kernel)]
    pub fn xent_bwd(
        logits: &[f32],
        targets: &[f32],
        mask: &[f32],
        dloss: &[f32],
        dlogits: &mut [f32],
        rows: u32,
        vocab: u32,
    ) {
        let r = ABSOLUTE_POS;
        if r >= rows as usize {
            terminate!();
        }
        let v = vocab as usize;
        let base = r * v;
        let mut m = logits[base];
        for c in 1..v {
            m = f32::max(m, logits[base + c]);
        }
        let mut sum = 0.0f32;
        for c in 0..v {
            sum += f32::exp(logits[base + c] - m);
        }
        let g = dloss[r] * mask[r] / sum;
        let t = u32::cast_from(targets[r]) as usize;
        for c in 0..v {
            let mut d = f32::exp(logits[base + c] - m) * g;
            if c == t {
                d -= dloss[r] * mask[r];
            }
            dlogits[base + c] = d;
        }
    }

    /// RMSNorm over rows of `d` (Zhang & Sennrich 2019, eq. 4), row `r` per unit: `inv[r] =
    /// 1/√(mean(x²) + eps)`, `y = x·inv·gain`.
    #[cube(launch, create_dummy_kernel)]
    pub fn rms_norm_fwd(
        x: &[f32],
        gain: &[f32],
        y: &mut [f32],
        inv: &mut [f32],
        rows: u32,
        d: u32,
        eps: f32,
    ) {
        let r = ABSOLUTE_POS;
        if r >= rows as usize {
            terminate!();
        }
        let w = d as usize;
        let base = r * w;
        let mut ss = 0.0f32;
        for c in 0..w {
            let v = x[base + c];
            ss += v * v;
        }
        let k = 1.0f32 / f32::sqrt(ss / f32::cast_from(d) + eps);
        inv[r] = k;
        for c in 0..w {
            y[base + c] = x[base + c] * k * gain[c];
        }
    }

    /// RMSNorm's backward, row `r` per unit: with `k = inv[r]` and `u = gain ⊙ dy`,
    /// `dx = k·u − x·k³·(u·x)/d`, and `xk_dy = dy ⊙ x·k`, whose column sums are `dgain`.
    #[cube(launch, create_dummy_kernel)]
    pub fn rms_norm_bwd(
        x: &[f32],
        gain: &[f32],
        inv: &[f32],
        dy: &[f32],
        dx: &mut [f32],
        xk_dy: &mut [f32],
        rows: u32,
        d: u32,
    ) {
        let r = ABSOLUTE_POS;
        if r >= rows as usize {
            terminate!();
        }
        let w = d as usize;
        let base = r * w;
        let k = inv[r];
        let mut dot = 0.0f32;
        for c in 0..w {
            dot += gain[c] * dy[base + c] * x[base + c];
        }
        let t = k * k * k * dot / f32::cast_from(d);
        for c in 0..w {
            let xc = x[base + c];
            let g = dy[base + c];
            dx[base + c] = k * gain[c] * g - xc * t;
            xk_dy[base + c] = g * xc * k;
        }
    }

    /// One AdamW update of one parameter tensor, element `i` per unit (PyTorch's
    /// `torch.optim.AdamW`, Loshchilov & Hutter 2019, Alg. 2, in the f32 operations and order of
    /// the lab's tensor-op update, [`crate::train::AdamW`]): `g = grad·s` (`s` = `scale[0]` when
    /// `device_scale`, else `host_scale`), `m' = m·β₁ + g·(1−β₁)`, `v' = v·β₂ + g²·(1−β₂)` (on
    /// the `first` step `m = v = 0`, not read), `x' = x·keep − lr·(m'/b₁)/(√(v'/b₂) + ε)` with
    /// `keep = 1 − lr·λ` and the bias corrections `b₁ = 1−β₁ᵗ`, `b₂ = 1−β₂ᵗ`. `n` elements.
    #[cube(launch, create_dummy_kernel)]
    pub fn adamw_update(
        x: &[f32],
        grad: &[f32],
        m: &[f32],
        v: &[f32],
        scale: &[f32],
        x_out: &mut [f32],
        m_out: &mut [f32],
        v_out: &mut [f32],
        n: u32,
        host_scale: f32,
        beta1: f32,
        one_minus_beta1: f32,
        beta2: f32,
        one_minus_beta2: f32,
        bias1: f32,
        bias2: f32,
        eps: f32,
        keep: f32,
        lr: f32,
        #[comptime] first: bool,
        #[comptime] device_scale: bool,
    ) {
        let i = ABSOLUTE_POS;
        if i >= n as usize {
            terminate!();
        }
        let mut s = host_scale;
        if device_scale {
            s = scale[0];
        }
        let g = grad[i] * s;
        let mut mi = g * one_minus_beta1;
        let mut vi = g * g * one_minus_beta2;
        if !first {
            mi = m[i] * beta1 + g * one_minus_beta1;
            vi = v[i] * beta2 + g * g * one_minus_beta2;
        }
        let update = (mi / bias1) / (f32::sqrt(vi / bias2) + eps);
        x_out[i] = x[i] * keep - update * lr;
        m_out[i] = mi;
        v_out[i] = vi;
    }

    /// Backward for `dq` (or `dq̃`): one unit per query row, looping over keys `j ≤ i`.
    #[cube(launch, create_dummy_kernel)]
    pub fn attn_bwd_dq(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dout: &[f32],
        lse: &[f32],
        delta: &[f32],
        dq: &mut [f32],
        rows: u32,
        seq: u32,
        scale: f32,
        inv_sqrt_a: f32,
        inv_sqrt_p: f32,
        alpha: f32,
        #[comptime] w: usize,
        #[comptime] d: usize,
        #[comptime] tapa: bool,
        #[comptime] amp: usize,
        #[comptime] linear: bool,
    ) {
        let r = ABSOLUTE_POS;
        if r >= rows as usize {
            terminate!();
        }
        let l = seq as usize;
        let i = r % l;
        let base = r - i;
        let mut qi = Array::<f32>::new(w);
        let mut gq = Array::<f32>::new(w);
        #[unroll]
        for c in 0..w {
            qi[c] = q[r * w + c];
            gq[c] = 0.0f32;
        }
        let mut doi = Array::<f32>::new(d);
        #[unroll]
        for c in 0..d {
            doi[c] = dout[r * d + c];
        }
        let lse_i = lse[r];
        let delta_i = delta[r];
        let mut q_sum = 0.0f32;
        if tapa {
            q_sum = sum_local(qi.as_slice(), 0usize, amp, w);
        }
        for j in 0..i + 1 {
            let kb = (base + j) * w;
            let dp = dot_range(doi.as_slice(), 0usize, v, (base + j) * d, 0usize, d);
            add_score_grad(
                &mut gq,
                qi.as_slice(),
                0usize,
                q_sum,
                k,
                kb,
                kb,
                i,
                j,
                lse_i,
                dp,
                delta_i,
                scale,
                inv_sqrt_a,
                inv_sqrt_p,
                alpha,
                w,
                tapa,
                amp,
                linear,
            );
        }
        #[unroll]
        for c in 0..w {
            dq[r * w + c] = gq[c];
        }
    }

    /// Backward for `dk` (or `dk̃`) and `dv`: one unit per key row, looping over queries `i ≥ j`.
    #[cube(launch, create_dummy_kernel)]
    pub fn attn_bwd_dkdv(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dout: &[f32],
        lse: &[f32],
        delta: &[f32],
        dk: &mut [f32],
        dv: &mut [f32],
        rows: u32,
        seq: u32,
        scale: f32,
        inv_sqrt_a: f32,
        inv_sqrt_p: f32,
        alpha: f32,
        #[comptime] w: usize,
        #[comptime] d: usize,
        #[comptime] tapa: bool,
        #[comptime] amp: usize,
        #[comptime] linear: bool,
    ) {
        let r = ABSOLUTE_POS;
        if r >= rows as usize {
            terminate!();
        }
        let l = seq as usize;
        let j = r % l;
        let base = r - j;
        let mut kj = Array::<f32>::new(w);
        let mut gk = Array::<f32>::new(w);
        #[unroll]
        for c in 0..w {
            kj[c] = k[r * w + c];
            gk[c] = 0.0f32;
        }
        let mut vj = Array::<f32>::new(d);
        let mut gv = Array::<f32>::new(d);
        #[unroll]
        for c in 0..d {
            vj[c] = v[r * d + c];
            gv[c] = 0.0f32;
        }
        let mut k_sum = 0.0f32;
        if tapa {
            k_sum = sum_local(kj.as_slice(), 0usize, amp, w);
        }
        for i in j..l {
            let qr = base + i;
            let qb = qr * w;
            let ob = qr * d;
            let lse_i = lse[qr];
            let delta_i = delta[qr];
            let dp = dot_range(vj.as_slice(), 0usize, dout, ob, 0usize, d);
            let p = add_score_grad(
                &mut gk,
                kj.as_slice(),
                0usize,
                k_sum,
                q,
                qb,
                qb,
                i,
                j,
                lse_i,
                dp,
                delta_i,
                scale,
                inv_sqrt_a,
                inv_sqrt_p,
                alpha,
                w,
                tapa,
                amp,
                linear,
            );
            #[unroll]
            for c in 0..d {
                gv[c] += p * dout[ob + c];
            }
        }
        #[unroll]
        for c in 0..w {
            dk[r * w + c] = gk[c];
        }
        #[unroll]
        for c in 0..d {
            dv[r * d + c] = gv[c];
        }
    }

    // -----------------------------------------------------------------------------------------
    // Tiled kernels: one cube per (block of `bn` rows, batch·head), `bn` units; the key (query)
    // rows a block needs are staged through shared memory one tile of `bn` rows at a time, so each
    // row is read from global memory once per cube instead of once per unit. Units past the end
    // of the sequence take part in the loads and barriers but compute nothing.
    // -----------------------------------------------------------------------------------------

    /// Tiled forward; same contract as [`attn_fwd`]. Launch: cube count
    /// `(ceil(seq/bn), batch·heads, 1)`, cube dim `bn`.
    #[cube(launch, create_dummy_kernel)]
    pub fn attn_fwd_tiled(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        out: &mut [f32],
        lse: &mut [f32],
        seq: u32,
        heads: u32,
        scale: f32,
        inv_sqrt_a: f32,
        inv_sqrt_p: f32,
        alpha: f32,
        #[comptime] w: usize,
        #[comptime] d: usize,
        #[comptime] tapa: bool,
        #[comptime] amp: usize,
        #[comptime] linear: bool,
        #[comptime] bn: usize,
        #[comptime] out_token_major: bool,
    ) {
        let l = seq as usize;
        let t = UNIT_POS as usize;
        let block = CUBE_POS_X as usize;
        let base = CUBE_POS_Y as usize * l;
        let i = block * bn + t;
        let active = i < l;
        let r = base + i;
        let mut qi = Array::<f32>::new(w);
        let mut acc = Array::<f32>::new(d);
        #[unroll]
        for c in 0..w {
            qi[c] = 0.0f32;
        }
        #[unroll]
        for c in 0..d {
            acc[c] = 0.0f32;
        }
        if active {
            #[unroll]
            for c in 0..w {
                qi[c] = q[r * w + c];
            }
        }
        let mut q_sum = 0.0f32;
        if tapa {
            q_sum += sum_local(qi.as_slice(), 0usize, amp, w);
        }
        let mut m = 0.0f32;
        m -= 1.0e30f32;
        let mut sum = 0.0f32;
        let mut ks = Shared::<[f32]>::new_slice(comptime!(bn * w));
        let mut vs = Shared::<[f32]>::new_slice(comptime!(bn * d));
        for tile in 0..block + 1 {
            let j0 = tile * bn;
            let jl = j0 + t;
            if jl < l {
                #[unroll]
                for c in 0..w {
                    ks[t * w + c] = k[(base + jl) * w + c];
                }
                #[unroll]
                for c in 0..d {
                    vs[t * d + c] = v[(base + jl) * d + c];
                }
            }
            sync_cube();
            if active {
                let mut jend = j0 + bn;
                if jend > i + 1 {
                    jend = i + 1;
                }
                for j in j0..jend {
                    let s = score(
                        qi.as_slice(),
                        0usize,
                        q_sum,
                        &ks,
                        (j - j0) * w,
                        i,
                        j,
                        scale,
                        inv_sqrt_a,
                        inv_sqrt_p,
                        alpha,
                        w,
                        tapa,
                        amp,
                        linear,
                    );
                    let m_new = f32::max(m, s);
                    let corr = f32::exp(m - m_new);
                    let p = f32::exp(s - m_new);
                    sum = sum * corr + p;
                    let vb = (j - j0) * d;
                    #[unroll]
                    for c in 0..d {
                        acc[c] = acc[c] * corr + p * vs[vb + c];
                    }
                    m = m_new;
                }
            }
            sync_cube();
        }
        if active {
            let mut inv = 0.0f32;
            let mut row_lse = 1.0e30f32;
            if sum > 0.0f32 {
                inv = 1.0f32 / sum;
                row_lse = m + f32::ln(sum);
            }
            let os = row_start(r, seq, heads, d, out_token_major);
            #[unroll]
            for c in 0..d {
                out[os + c] = acc[c] * inv;
            }
            lse[r] = row_lse;
        }
    }

    /// Forward on tensor cores: the contract of [`attn_fwd`] for the dot-product encodings
    /// (NoPE, RoPE, PoPE on `q̃`, `k̃`) and for TAPA. `cmma` 16×16×16
    /// with f16 operands and f32 accumulation (FlashAttention-2, Alg. 1, with WMMA-style
    /// fragments). A cube holds `planes` planes of 32 units, plane `p` owning the 16 query rows
    /// `i0 + 16p ..`; per key tile of 16 (loaded once per cube, f32 → f16), each plane that sees
    /// the tile computes `S = Q̃ K̃ᵀ` over `w/16` steps — for TAPA two products, the amplitude
    /// `Q_A K_Aᵀ` over the first `amp/16` steps and the phase `Q_P K_Pᵀ` over the rest (the
    /// linear phase: `Σ q_P + Σ k_P` from row sums in f32, the amplitude product alone), combined
    /// per entry as in [`score`] — then the online softmax by one unit per query row on the scores
    /// staged in shared memory, `P` rounded to f16, then `P V` per 16 output columns into shared
    /// memory, from which each unit rescales its 16·d/32 entries of the output tile in registers
    /// (fragments cannot be rescaled per row in place). Launch: cube count
    /// `(ceil(seq/(16·planes)), batch·heads, 1)`, cube dim `32·planes` (every unit of a plane
    /// takes part in its `cmma` calls); `w`, `d` and (TAPA) `amp` multiples of 16. Shared memory
    /// `(32·planes + 32)·w + (32 + 64·planes)·d + 1600·planes` bytes, `1024·planes` more for TAPA's
    /// quadratic phase, `64·planes + 64` for its linear phase (PoPE at d 64: 15.6 KiB with one
    /// plane, 44 KiB with four).
    #[cube(launch, create_dummy_kernel)]
    pub fn attn_fwd_cmma(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        out: &mut [f32],
        lse: &mut [f32],
        seq: u32,
        heads: u32,
        scale: f32,
        inv_sqrt_a: f32,
        inv_sqrt_p: f32,
        alpha: f32,
        #[comptime] w: usize,
        #[comptime] d: usize,
        #[comptime] tapa: bool,
        #[comptime] amp: usize,
        #[comptime] linear: bool,
        #[comptime] planes: usize,
        #[comptime] emulate: bool,
        #[comptime] out_token_major: bool,
    ) {
        let l = seq as usize;
        let t = UNIT_POS as usize;
        // `planes` planes of 32 units per cube, plane `pl` owning query rows
        // `i0 + 16·pl .. i0 + 16·pl + 16`; every key tile is loaded once per cube for all of them.
        let pl = t / 32usize;
        let lane = t % 32usize;
        let units = comptime!(32 * planes);
        let block = CUBE_POS_X as usize;
        let base = CUBE_POS_Y as usize * l;
        let i0 = block * comptime!(16 * planes);
        let ip = i0 + pl * 16usize;
        // TAPA's quadratic phase is a second product; its linear phase is a sum of row sums.
        let two = comptime!(tapa && !linear);
        let sc_per = comptime!(if two { 512usize } else { 256usize });
        let mut qs = Shared::<[f16]>::new_aligned_slice(comptime!(16 * planes * w), 32usize);
        let mut ks = Shared::<[f16]>::new_aligned_slice(comptime!(16 * w), 32usize);
        let mut vs = Shared::<[f16]>::new_aligned_slice(comptime!(16 * d), 32usize);
        let mut ps = Shared::<[f16]>::new_aligned_slice(comptime!(256 * planes), 32usize);
        // Each plane's scores of a key tile; TAPA's phase products after them.
        let mut sc = Shared::<[f32]>::new_aligned_slice(comptime!(planes * sc_per), 32usize);
        // TAPA's linear phase: `Σ q_P` of each plane's rows, then `Σ k_P` of the key tile's.
        let mut psum =
            Shared::<[f32]>::new_slice(comptime!(if linear { 16 * planes + 16 } else { 1 }));
        let mut pv = Shared::<[f32]>::new_aligned_slice(comptime!(16 * planes * d), 32usize);
        // The plane's output tile, 16 × d, held by its 32 units: unit `lane` owns entries
        // `s·32 + lane` (row `(s·32 + lane) / d`), so it never leaves registers.
        let mut os = Array::<f32>::new(comptime!(d / 2));
        let mut corr = Shared::<[f32]>::new_slice(comptime!(16 * planes));
        let qb = pl * comptime!(16 * w);
        let ob = pl * comptime!(16 * d);
        let sb = pl * sc_per;
        let pb = pl * 256usize;
        let cb = pl * 16usize;
        // The query tiles (rows past the sequence are zeros) and zero output tiles.
        #[unroll(!emulate)]
        for s in 0..comptime!(w / 2) {
            let e = s * units + t;
            let i = i0 + e / w;
            let mut x = 0.0f32;
            if i < l {
                x = q[(base + i) * w + e % w];
            }
            qs[e] = f16::cast_from(x);
        }
        #[unroll(!emulate)]
        for s in 0..comptime!(d / 2) {
            os[s] = 0.0f32;
        }
        if linear {
            if lane < 16 {
                let i = ip + lane;
                let mut x = 0.0f32;
                if i < l {
                    x += sum_range(q, (base + i) * w, amp, w);
                }
                psum[cb + lane] = x;
            }
        }
        let mut m = 0.0f32;
        m -= 1.0e30f32;
        let mut sum = 0.0f32;
        let stride_w = comptime!(w as u32);
        let stride_d = comptime!(d as u32);
        // Key tiles up to the cube's last query row; a plane computes only those its rows see.
        let last_tile = block * planes + planes - 1usize;
        let plane_last = block * planes + pl;
        for tile in 0..last_tile + 1 {
            let j0 = tile * 16;
            #[unroll(!emulate)]
            for s in 0..comptime!(w / (2 * planes)) {
                let e = s * units + t;
                let j = j0 + e / w;
                let mut x = 0.0f32;
                if j < l {
                    x = k[(base + j) * w + e % w];
                }
                ks[e] = f16::cast_from(x);
            }
            #[unroll(!emulate)]
            for s in 0..comptime!(d / (2 * planes)) {
                let e = s * units + t;
                let j = j0 + e / d;
                let mut x = 0.0f32;
                if j < l {
                    x = v[(base + j) * d + e % d];
                }
                vs[e] = f16::cast_from(x);
            }
            if linear {
                if t < 16 {
                    let j = j0 + t;
                    let mut x = 0.0f32;
                    if j < l {
                        x += sum_range(k, (base + j) * w, amp, w);
                    }
                    psum[comptime!(16 * planes) + t] = x;
                }
            }
            sync_cube();
            // `seen` is uniform over a plane: its `cmma` calls are taken by all its units or none.
            let seen = tile <= plane_last;
            // S = Q̃ K̃ᵀ: A = the plane's query rows (row-major, stride w), B = the key rows read
            // as a column-major [w, 16] matrix (stride w). One chain of `cmma` steps over the w/16
            // column blocks into the plane's `sc[0..256]`; TAPA: two, the amplitude's blocks
            // (0..amp/16) into `sc[0..256]` and the phase's (amp/16..w/16) into `sc[256..512]`.
            if seen {
                let split = comptime!(if tapa { amp / 16 } else { w / 16 });
                let chains = comptime!(if two { 2usize } else { 1usize });
                #[unroll(!emulate)]
                for ch in 0..chains {
                    let lo = ch * split;
                    let hi = split + ch * comptime!(w / 16 - split);
                    if emulate {
                        // The same 16×16 tile without tensor cores: unit `lane` of the plane
                        // computes entries `s·32 + lane` (row `/16`, key `%16`) from the f16
                        // operands, accumulating in f32 (the `cmma` chain's contract).
                        for s in 0..8usize {
                            let e = s * 32usize + lane;
                            let qo = qb + (e / 16usize) * w;
                            let ko = (e % 16usize) * w;
                            let mut x = 0.0f32;
                            for kk in lo * 16usize..hi * 16usize {
                                x += f32::cast_from(qs[qo + kk]) * f32::cast_from(ks[ko + kk]);
                            }
                            sc[sb + ch * 256usize + e] = x;
                        }
                    } else {
                        let acc = mma_zero();
                        for c in lo..hi {
                            let a = mma_a(&qs[qb + c * 16..qb + comptime!(16 * w)], stride_w);
                            let b = mma_b(&ks[c * 16..comptime!(16 * w)], stride_w, true);
                            cmma::execute(&a, &b, &acc, &acc);
                        }
                        cmma::store(
                            &mut sc[sb + ch * 256..sb + ch * 256 + 256],
                            &acc,
                            16u32,
                            cmma::MatrixLayout::RowMajor,
                        );
                    }
                }
            }
            sync_cube();
            // Online softmax, one unit per query row of its plane; the scores go back into the
            // plane's `sc[0..256]`. A tile the row does not see leaves m, sum unchanged (corr 1).
            if lane < 16 {
                let i = ip + lane;
                let mut m_new = m;
                for jj in 0..16usize {
                    let j = j0 + jj;
                    if j <= i && j < l {
                        let e = sb + lane * 16 + jj;
                        let mut s_ij = 0.0f32;
                        if tapa {
                            let mut phase = 0.0f32;
                            if linear {
                                phase += psum[cb + lane] + psum[comptime!(16 * planes) + jj];
                            } else {
                                phase += sc[e + 256];
                            }
                            s_ij += tapa_score(sc[e] * inv_sqrt_a, phase * inv_sqrt_p, i, j, alpha);
                        } else {
                            s_ij += sc[e] * scale;
                        }
                        sc[e] = s_ij;
                        m_new = f32::max(m_new, s_ij);
                    }
                }
                let c = f32::exp(m - m_new);
                let mut row = 0.0f32;
                for jj in 0..16usize {
                    let j = j0 + jj;
                    let mut p = 0.0f32;
                    if j <= i && j < l {
                        p = f32::exp(sc[sb + lane * 16 + jj] - m_new);
                    }
                    ps[pb + lane * 16 + jj] = f16::cast_from(p);
                    row += p;
                }
                sum = sum * c + row;
                m = m_new;
                corr[cb + lane] = c;
            }
            sync_cube();
            // P V, 16 output columns at a time, into the plane's pv (row-major, stride d).
            if emulate {
                if seen {
                    // Without tensor cores: unit `lane` computes entries `s·32 + lane` of the plane's
                    // 16 × d tile `P V` (row `/d`, column `%d`) from the f16 operands.
                    for s in 0..comptime!(d / 2) {
                        let e = s * 32usize + lane;
                        let po = pb + (e / d) * 16usize;
                        let col = e % d;
                        let mut x = 0.0f32;
                        for kk in 0..16usize {
                            x += f32::cast_from(ps[po + kk]) * f32::cast_from(vs[kk * d + col]);
                        }
                        pv[ob + e] = x;
                    }
                }
            } else {
                if seen {
                    let a = mma_a(&ps[pb..pb + 256usize], 16u32);
                    #[unroll(!emulate)]
                    for c in 0..comptime!(d / 16) {
                        let b = mma_b(&vs[c * 16..comptime!(16 * d)], stride_d, false);
                        let o = mma_zero();
                        cmma::execute(&a, &b, &o, &o);
                        cmma::store(
                            &mut pv[ob + c * 16..ob + comptime!(16 * d)],
                            &o,
                            stride_d,
                            cmma::MatrixLayout::RowMajor,
                        );
                    }
                }
            }
            sync_cube();
            // Each plane rescales its own rows (a tile the plane does not see changes nothing).
            if seen {
                #[unroll(!emulate)]
                for s in 0..comptime!(d / 2) {
                    let e = s * 32 + lane;
                    os[s] = os[s] * corr[cb + e / d] + pv[ob + e];
                }
            }
            sync_cube();
        }
        if lane < 16 {
            let i = ip + lane;
            let mut inv = 0.0f32;
            if i < l && sum > 0.0f32 {
                inv = 1.0f32 / sum;
                lse[base + i] = m + f32::ln(sum);
            }
            corr[cb + lane] = inv;
        }
        sync_cube();
        #[unroll(!emulate)]
        for s in 0..comptime!(d / 2) {
            let e = s * 32 + lane;
            let i = ip + e / d;
            if i < l {
                out[row_start(base + i, seq, heads, d, out_token_major) + e % d] =
                    os[s] * corr[cb + e / d];
            }
        }
    }

    /// Backward for `dq̃` on tensor cores, for the dot-product encodings (NoPE, RoPE, PoPE on `q̃`,
    /// `k̃`) and TAPA: the contract of [`attn_bwd_dq_tiled`] (writes `dq̃ [rows, w]` from the
    /// forward's `lse` and `delta = rowsum(dout ⊙ out)`), as FlashAttention-2's backward (Alg. 2) splits
    /// it, query side: plane `p` of the cube owns the 16 query rows `i0 + 16p ..`; per key tile
    /// of 16 (loaded once per cube, f32 → f16) each plane that sees it computes
    /// `S = Q̃ K̃ᵀ` (`w/16` `cmma` steps) and `dP = dO Vᵀ` (`d/16`), then per entry
    /// `dS = P ⊙ (dP − Δ) · scale` with `P = exp(S·scale − lse)` (causal mask), rounded to
    /// f16, then `dS K̃` (`w/16` products of 16 columns) staged in shared memory, which each unit
    /// adds to its `16·w/32` entries of the plane's `dq̃` tile held in registers. TAPA: `S` as
    /// two products (amplitude over the first `amp` columns, phase over the rest, as in
    /// [`attn_fwd_cmma`]), and two `dS` tiles, `dS·∂s/∂A` for the amplitude columns of `K̃` and
    /// `dS·∂s/∂P` for the phase columns ([`add_score_grad`]). f16 operands,
    /// f32 accumulation. `emulate`: each product computed by the plane's units from the same
    /// f16 operands (devices without tensor cores; [`super::CmmaPath::Emulated`]). Launch: cube count
    /// `(ceil(seq/(16·planes)), batch·heads, 1)`, cube dim `32·planes`; `w`, `d` multiples of
    /// 16 (TAPA: `amp` too). TAPA's linear phase: the amplitude product only; the phase
    /// columns of `dq̃` get the row sums of `dS·∂s/∂P` (the phase is a sum of row sums, its
    /// derivative the same for every phase column). Shared memory
    /// [`super::cmma_bwd_shared_bytes`]`(w, d, tapa, planes).0`.
    #[cube(launch, create_dummy_kernel)]
    pub fn attn_bwd_dq_cmma(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dout: &[f32],
        lse: &[f32],
        delta: &[f32],
        dq: &mut [f32],
        seq: u32,
        scale: f32,
        inv_sqrt_a: f32,
        inv_sqrt_p: f32,
        alpha: f32,
        #[comptime] w: usize,
        #[comptime] d: usize,
        #[comptime] tapa: bool,
        #[comptime] amp: usize,
        #[comptime] linear: bool,
        #[comptime] planes: usize,
        #[comptime] emulate: bool,
    ) {
        let l = seq as usize;
        let t = UNIT_POS as usize;
        let pl = t / 32usize;
        let lane = t % 32usize;
        let units = comptime!(32 * planes);
        let block = CUBE_POS_X as usize;
        let base = CUBE_POS_Y as usize * l;
        let i0 = block * comptime!(16 * planes);
        let ip = i0 + pl * 16usize;
        let mut qs = Shared::<[f16]>::new_aligned_slice(comptime!(16 * planes * w), 32usize);
        let mut dos = Shared::<[f16]>::new_aligned_slice(comptime!(16 * planes * d), 32usize);
        let mut ks = Shared::<[f16]>::new_aligned_slice(comptime!(16 * w), 32usize);
        let mut vs = Shared::<[f16]>::new_aligned_slice(comptime!(16 * d), 32usize);
        // TAPA's quadratic phase is a second product; its linear phase a sum of row sums.
        let two = comptime!(tapa && !linear);
        // Each plane's dS (TAPA's quadratic phase: the amplitude's, then the phase's).
        let ds_per = comptime!(if two { 512usize } else { 256usize });
        let mut dss = Shared::<[f16]>::new_aligned_slice(comptime!(planes * ds_per), 32usize);
        // Each plane's S (first 256; TAPA's quadratic phase: the amplitude's, then the phase's)
        // and dP (last 256) of a key tile.
        let sc_per = comptime!(ds_per + 256usize);
        let mut sc = Shared::<[f32]>::new_aligned_slice(comptime!(planes * sc_per), 32usize);
        // TAPA's linear phase: `Σ q_P` of each plane's rows (at the end, the phase columns of
        // their `dq`), then `Σ k_P` of the key tile's.
        let mut psum =
            Shared::<[f32]>::new_slice(comptime!(if linear { 16 * planes + 16 } else { 1 }));
        // TAPA's linear phase: unit `lane < 16`'s running `Σ_j ∂s_ij/∂P · dS_ij` of row `lane`.
        let mut gsum = 0.0f32;
        // Each plane's product dS K̃ of a key tile, 16 × w row-major.
        let mut gs = Shared::<[f32]>::new_aligned_slice(comptime!(16 * planes * w), 32usize);
        // Each plane's lse (first 16) and Δ (next 16) of its rows.
        let mut stat = Shared::<[f32]>::new_slice(comptime!(32 * planes));
        let mut acc = Array::<f32>::new(comptime!(w / 2));
        let qb = pl * comptime!(16 * w);
        let db = pl * comptime!(16 * d);
        let sb = pl * sc_per;
        let pb = pl * ds_per;
        let tb = pl * 32usize;
        let dpo = ds_per;
        #[unroll(!emulate)]
        for s in 0..comptime!(w / 2) {
            let e = s * units + t;
            let i = i0 + e / w;
            let mut x = 0.0f32;
            if i < l {
                x = q[(base + i) * w + e % w];
            }
            qs[e] = f16::cast_from(x);
        }
        #[unroll(!emulate)]
        for s in 0..comptime!(d / 2) {
            let e = s * units + t;
            let i = i0 + e / d;
            let mut x = 0.0f32;
            if i < l {
                x = dout[(base + i) * d + e % d];
            }
            dos[e] = f16::cast_from(x);
        }
        if lane < 16 {
            let i = ip + lane;
            let mut lse_i = 0.0f32;
            let mut delta_i = 0.0f32;
            if i < l {
                lse_i = lse[base + i];
                delta_i = delta[base + i];
            }
            stat[tb + lane] = lse_i;
            stat[tb + 16usize + lane] = delta_i;
            if linear {
                let mut x = 0.0f32;
                if i < l {
                    x += sum_range(q, (base + i) * w, amp, w);
                }
                psum[pl * 16usize + lane] = x;
            }
        }
        #[unroll(!emulate)]
        for s in 0..comptime!(w / 2) {
            acc[s] = 0.0f32;
        }
        let last_tile = block * planes + planes - 1usize;
        let plane_last = block * planes + pl;
        for tile in 0..last_tile + 1 {
            let j0 = tile * 16;
            #[unroll(!emulate)]
            for s in 0..comptime!(w / (2 * planes)) {
                let e = s * units + t;
                let j = j0 + e / w;
                let mut x = 0.0f32;
                if j < l {
                    x = k[(base + j) * w + e % w];
                }
                ks[e] = f16::cast_from(x);
            }
            #[unroll(!emulate)]
            for s in 0..comptime!(d / (2 * planes)) {
                let e = s * units + t;
                let j = j0 + e / d;
                let mut x = 0.0f32;
                if j < l {
                    x = v[(base + j) * d + e % d];
                }
                vs[e] = f16::cast_from(x);
            }
            if linear {
                if t < 16 {
                    let j = j0 + t;
                    let mut x = 0.0f32;
                    if j < l {
                        x += sum_range(k, (base + j) * w, amp, w);
                    }
                    psum[comptime!(16 * planes) + t] = x;
                }
            }
            sync_cube();
            // Uniform over a plane: its `cmma` calls are taken by all its units or none.
            let seen = tile <= plane_last;
            let split = comptime!(if tapa { amp / 16 } else { w / 16 });
            let chains = comptime!(if two { 2usize } else { 1usize });
            // S = Q̃ K̃ᵀ into sc[sb..sb + 256], dP = dO Vᵀ into sc[sb + 256..sb + 512]
            // (B: the key rows read as a column-major [w, 16] / [d, 16] matrix).
            if seen {
                mma_score_tiles(
                    &qs, qb, &ks, &dos, db, &vs, &mut sc, sb, lane, w, d, split, chains, dpo,
                    emulate,
                );
            }
            sync_cube();
            // dS = P ⊙ (dP − Δ) · scale, entry `s·32 + lane` (row `/16`, key `%16`), in f16.
            if seen {
                #[unroll(!emulate)]
                for s in 0..8usize {
                    let e = s * 32usize + lane;
                    let r = e / 16usize;
                    let i = ip + r;
                    let j = j0 + e % 16usize;
                    let mut ds = 0.0f32;
                    let mut ds_p = 0.0f32;
                    if j <= i && j < l && i < l {
                        let dp = sc[sb + dpo + e] - stat[tb + 16usize + r];
                        if tapa {
                            // ∂s/∂A = cos φ, ∂s/∂P = −A sin φ · 2π|i − j|^α ([`add_score_grad`]).
                            let a_ij = sc[sb + e] * inv_sqrt_a;
                            let two_pi_dist = 6.283_185_307_179_586f32 * dist_pow(i, j, alpha);
                            let mut phase = 0.0f32;
                            if linear {
                                phase += psum[pl * 16usize + r]
                                    + psum[comptime!(16 * planes) + e % 16usize];
                            } else {
                                phase += sc[sb + 256usize + e];
                            }
                            let phi = two_pi_dist * phase * inv_sqrt_p;
                            let cos_phi = f32::cos(phi);
                            let g = f32::exp(a_ij * cos_phi - stat[tb + r]) * dp;
                            ds += g * cos_phi * inv_sqrt_a;
                            ds_p -= g * a_ij * f32::sin(phi) * two_pi_dist * inv_sqrt_p;
                        } else {
                            ds += f32::exp(sc[sb + e] * scale - stat[tb + r]) * dp * scale;
                        }
                    }
                    dss[pb + e] = f16::cast_from(ds);
                    if two {
                        dss[pb + 256usize + e] = f16::cast_from(ds_p);
                    }
                    if linear {
                        // The amplitude product was read above; the slot now holds the phase's
                        // term, summed per row below.
                        sc[sb + e] = ds_p;
                    }
                }
            }
            sync_cube();
            // dS K̃ (16 × w, row-major) into gs[qb..].
            if seen {
                // TAPA's linear phase: the amplitude columns only.
                let cols = comptime!(if linear { amp } else { w });
                mma_tile_rows(&dss, pb, &ks, &mut gs, qb, lane, w, cols, two, amp, emulate);
            }
            sync_cube();
            // The next tile's loads write ks, vs only; gs is written again two barriers later.
            if seen {
                #[unroll(!emulate)]
                for s in 0..comptime!(w / 2) {
                    acc[s] += gs[qb + s * 32usize + lane];
                }
                if linear {
                    if lane < 16 {
                        for jj in 0..16usize {
                            gsum += sc[sb + lane * 16usize + jj];
                        }
                    }
                }
            }
        }
        // TAPA's linear phase: every phase column of row i gets `Σ_j ∂s_ij/∂P · dS_ij`; the
        // plane's row sums of `q_P` are no longer read, so their slots take it.
        if linear {
            if lane < 16 {
                psum[pl * 16usize + lane] = gsum;
            }
            sync_cube();
        }
        #[unroll(!emulate)]
        for s in 0..comptime!(w / 2) {
            let e = s * 32usize + lane;
            let i = ip + e / w;
            if i < l {
                let mut x = acc[s];
                if linear {
                    if e % w >= amp {
                        x = psum[pl * 16usize + e / w];
                    }
                }
                dq[(base + i) * w + e % w] = x;
            }
        }
    }

    /// Backward for `dk̃` and `dv` on tensor cores, for the dot-product encodings and TAPA (two
    /// `dS` tiles for the quadratic phase, row sums for the linear one, as in
    /// [`attn_bwd_dq_cmma`]): the contract of
    /// [`attn_bwd_dkdv_tiled`] (writes `dk̃ [rows, w]`, `dv [rows, d]`), FlashAttention-2's
    /// backward (Alg. 2), key side: plane `p` of the cube owns the 16 keys `j0 + 16p ..` (their
    /// `k̃`, `v` in shared memory as f16 for the whole kernel); per query tile of 16 from the
    /// cube's first key on (`q̃`, `dout` loaded once per cube, f32 → f16, with their `lse`, `Δ`),
    /// each plane that sees it computes `Sᵀ = K̃ Q̃ᵀ` and `dPᵀ = V dOᵀ`, per entry
    /// `Pᵀ = exp(S·scale − lse)` and `dSᵀ = Pᵀ ⊙ (dPᵀ − Δ) · scale` (causal mask) rounded to
    /// f16, then `Pᵀ dO` (`d/16` products) and `dSᵀ Q̃` (`w/16`) staged in shared memory, which
    /// each unit adds to its `16·d/32` and `16·w/32` entries of the plane's `dv`, `dk̃` tiles in
    /// registers. `emulate` as in [`attn_bwd_dq_cmma`]; launch likewise. Shared memory
    /// [`super::cmma_bwd_shared_bytes`]`(w, d, tapa, planes).1`.
    #[cube(launch, create_dummy_kernel)]
    pub fn attn_bwd_dkdv_cmma(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dout: &[f32],
        lse: &[f32],
        delta: &[f32],
        dk: &mut [f32],
        dv: &mut [f32],
        seq: u32,
        scale: f32,
        inv_sqrt_a: f32,
        inv_sqrt_p: f32,
        alpha: f32,
        #[comptime] w: usize,
        #[comptime] d: usize,
        #[comptime] tapa: bool,
        #[comptime] amp: usize,
        #[comptime] linear: bool,
        #[comptime] planes: usize,
        #[comptime] emulate: bool,
    ) {
        let l = seq as usize;
        let t = UNIT_POS as usize;
        let pl = t / 32usize;
        let lane = t % 32usize;
        let units = comptime!(32 * planes);
        let block = CUBE_POS_X as usize;
        let base = CUBE_POS_Y as usize * l;
        let j0c = block * comptime!(16 * planes);
        let jp = j0c + pl * 16usize;
        let mut ks = Shared::<[f16]>::new_aligned_slice(comptime!(16 * planes * w), 32usize);
        let mut vs = Shared::<[f16]>::new_aligned_slice(comptime!(16 * planes * d), 32usize);
        let mut qs = Shared::<[f16]>::new_aligned_slice(comptime!(16 * w), 32usize);
        let mut dos = Shared::<[f16]>::new_aligned_slice(comptime!(16 * d), 32usize);
        let mut pss = Shared::<[f16]>::new_aligned_slice(comptime!(256 * planes), 32usize);
        // TAPA's quadratic phase is a second product; its linear phase a sum of row sums.
        let two = comptime!(tapa && !linear);
        // Each plane's dSᵀ (TAPA's quadratic phase: the amplitude's, then the phase's).
        let ds_per = comptime!(if two { 512usize } else { 256usize });
        let mut dss = Shared::<[f16]>::new_aligned_slice(comptime!(planes * ds_per), 32usize);
        // Each plane's Sᵀ (first 256; TAPA's quadratic phase: the amplitude's, then the
        // phase's) and dPᵀ (last 256) of a query tile.
        let sc_per = comptime!(ds_per + 256usize);
        let mut sc = Shared::<[f32]>::new_aligned_slice(comptime!(planes * sc_per), 32usize);
        // TAPA's linear phase: `Σ q_P` of the query tile's rows, then `Σ k_P` of each plane's
        // keys (at the end, the phase columns of their `dk`).
        let mut psum =
            Shared::<[f32]>::new_slice(comptime!(if linear { 16 * planes + 16 } else { 1 }));
        // TAPA's linear phase: unit `lane < 16`'s running `Σ_i ∂s_ij/∂P · dS_ij` of key `lane`.
        let mut gsum = 0.0f32;
        // Each plane's products Pᵀ dO (16 × d) and dSᵀ Q̃ (16 × w) of a query tile.
        let mut gv = Shared::<[f32]>::new_aligned_slice(comptime!(16 * planes * d), 32usize);
        let mut gk = Shared::<[f32]>::new_aligned_slice(comptime!(16 * planes * w), 32usize);
        // lse (first 16) and Δ (next 16) of the query tile's rows.
        let mut stat = Shared::<[f32]>::new_slice(32usize);
        let mut acc_k = Array::<f32>::new(comptime!(w / 2));
        let mut acc_v = Array::<f32>::new(comptime!(d / 2));
        let kb = pl * comptime!(16 * w);
        let vb = pl * comptime!(16 * d);
        let sb = pl * sc_per;
        let pb = pl * 256usize;
        let gb = pl * ds_per;
        let dpo = ds_per;
        #[unroll(!emulate)]
        for s in 0..comptime!(w / 2) {
            let e = s * units + t;
            let j = j0c + e / w;
            let mut x = 0.0f32;
            if j < l {
                x = k[(base + j) * w + e % w];
            }
            ks[e] = f16::cast_from(x);
            acc_k[s] = 0.0f32;
        }
        #[unroll(!emulate)]
        for s in 0..comptime!(d / 2) {
            let e = s * units + t;
            let j = j0c + e / d;
            let mut x = 0.0f32;
            if j < l {
                x = v[(base + j) * d + e % d];
            }
            vs[e] = f16::cast_from(x);
            acc_v[s] = 0.0f32;
        }
        if linear {
            if lane < 16 {
                let j = jp + lane;
                let mut x = 0.0f32;
                if j < l {
                    x += sum_range(k, (base + j) * w, amp, w);
                }
                psum[16usize + pl * 16usize + lane] = x;
            }
        }
        let first_tile = block * planes;
        let plane_first = block * planes + pl;
        let tiles = (l + 15usize) / 16usize;
        for tile in first_tile..tiles {
            let i0 = tile * 16;
            #[unroll(!emulate)]
            for s in 0..comptime!(w / (2 * planes)) {
                let e = s * units + t;
                let i = i0 + e / w;
                let mut x = 0.0f32;
                if i < l {
                    x = q[(base + i) * w + e % w];
                }
                qs[e] = f16::cast_from(x);
            }
            #[unroll(!emulate)]
            for s in 0..comptime!(d / (2 * planes)) {
                let e = s * units + t;
                let i = i0 + e / d;
                let mut x = 0.0f32;
                if i < l {
                    x = dout[(base + i) * d + e % d];
                }
                dos[e] = f16::cast_from(x);
            }
            if t < 16 {
                let i = i0 + t;
                let mut lse_i = 0.0f32;
                let mut delta_i = 0.0f32;
                if i < l {
                    lse_i = lse[base + i];
                    delta_i = delta[base + i];
                }
                stat[t] = lse_i;
                stat[16usize + t] = delta_i;
                if linear {
                    let mut x = 0.0f32;
                    if i < l {
                        x += sum_range(q, (base + i) * w, amp, w);
                    }
                    psum[t] = x;
                }
            }
            sync_cube();
            // Uniform over a plane: the tile holds a row at or after the plane's first key.
            let seen = tile >= plane_first;
            let split = comptime!(if tapa { amp / 16 } else { w / 16 });
            let chains = comptime!(if two { 2usize } else { 1usize });
            // Sᵀ = K̃ Q̃ᵀ into sc[sb..sb + 256], dPᵀ = V dOᵀ into sc[sb + 256..sb + 512].
            if seen {
                mma_score_tiles(
                    &ks, kb, &qs, &vs, vb, &dos, &mut sc, sb, lane, w, d, split, chains, dpo,
                    emulate,
                );
            }
            sync_cube();
            // Pᵀ and dSᵀ, entry `s·32 + lane` (key `/16`, query `%16`), in f16.
            if seen {
                #[unroll(!emulate)]
                for s in 0..8usize {
                    let e = s * 32usize + lane;
                    let c = e % 16usize;
                    let j = jp + e / 16usize;
                    let i = i0 + c;
                    let mut p = 0.0f32;
                    let mut ds = 0.0f32;
                    let mut ds_p = 0.0f32;
                    if j <= i && i < l && j < l {
                        let dp = sc[sb + dpo + e] - stat[16usize + c];
                        if tapa {
                            // ∂s/∂A = cos φ, ∂s/∂P = −A sin φ · 2π|i − j|^α ([`add_score_grad`]).
                            let a_ij = sc[sb + e] * inv_sqrt_a;
                            let two_pi_dist = 6.283_185_307_179_586f32 * dist_pow(i, j, alpha);
                            let mut phase = 0.0f32;
                            if linear {
                                phase += psum[c] + psum[16usize + pl * 16usize + e / 16usize];
                            } else {
                                phase += sc[sb + 256usize + e];
                            }
                            let phi = two_pi_dist * phase * inv_sqrt_p;
                            let cos_phi = f32::cos(phi);
                            p += f32::exp(a_ij * cos_phi - stat[c]);
                            ds += p * dp * cos_phi * inv_sqrt_a;
                            ds_p -= p * dp * a_ij * f32::sin(phi) * two_pi_dist * inv_sqrt_p;
                        } else {
                            p += f32::exp(sc[sb + e] * scale - stat[c]);
                            ds += p * dp * scale;
                        }
                    }
                    pss[pb + e] = f16::cast_from(p);
                    dss[gb + e] = f16::cast_from(ds);
                    if two {
                        dss[gb + 256usize + e] = f16::cast_from(ds_p);
                    }
                    if linear {
                        // The amplitude product was read above; the slot now holds the phase's
                        // term, summed per key below.
                        sc[sb + e] = ds_p;
                    }
                }
            }
            sync_cube();
            // Pᵀ dO (16 × d) into gv[vb..], dSᵀ Q̃ (16 × w) into gk[kb..], row-major.
            if seen {
                mma_tile_rows(&pss, pb, &dos, &mut gv, vb, lane, d, d, false, d, emulate);
                // TAPA's linear phase: the amplitude columns only.
                let cols = comptime!(if linear { amp } else { w });
                mma_tile_rows(&dss, gb, &qs, &mut gk, kb, lane, w, cols, two, amp, emulate);
            }
            sync_cube();
            // The next tile's loads write qs, dos, stat only; gv, gk are written again two
            // barriers later.
            if seen {
                #[unroll(!emulate)]
                for s in 0..comptime!(d / 2) {
                    acc_v[s] += gv[vb + s * 32usize + lane];
                }
                #[unroll(!emulate)]
                for s in 0..comptime!(w / 2) {
                    acc_k[s] += gk[kb + s * 32usize + lane];
                }
                if linear {
                    if lane < 16 {
                        for c in 0..16usize {
                            gsum += sc[sb + lane * 16usize + c];
                        }
                    }
                }
            }
        }
        // TAPA's linear phase: every phase column of key j gets `Σ_i ∂s_ij/∂P · dS_ij`; the
        // plane's key sums of `k_P` are no longer read, so their slots take it.
        if linear {
            if lane < 16 {
                psum[16usize + pl * 16usize + lane] = gsum;
            }
            sync_cube();
        }
        #[unroll(!emulate)]
        for s in 0..comptime!(d / 2) {
            let e = s * 32usize + lane;
            let j = jp + e / d;
            if j < l {
                dv[(base + j) * d + e % d] = acc_v[s];
            }
        }
        #[unroll(!emulate)]
        for s in 0..comptime!(w / 2) {
            let e = s * 32usize + lane;
            let j = jp + e / w;
            if j < l {
                let mut x = acc_k[s];
                if linear {
                    if e % w >= amp {
                        x = psum[16usize + pl * 16usize + e / w];
                    }
                }
                dk[(base + j) * w + e % w] = x;
            }
        }
    }

    /// Tiled backward for `dq` (or `dq̃`); same contract as [`attn_bwd_dq`], launch as
    /// [`attn_fwd_tiled`].
    #[cube(launch, create_dummy_kernel)]
    pub fn attn_bwd_dq_tiled(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dout: &[f32],
        lse: &[f32],
        delta: &[f32],
        dq: &mut [f32],
        seq: u32,
        scale: f32,
        inv_sqrt_a: f32,
        inv_sqrt_p: f32,
        alpha: f32,
        #[comptime] w: usize,
        #[comptime] d: usize,
        #[comptime] tapa: bool,
        #[comptime] amp: usize,
        #[comptime] linear: bool,
        #[comptime] bn: usize,
        #[comptime] stage: bool,
    ) {
        let l = seq as usize;
        let t = UNIT_POS as usize;
        let block = CUBE_POS_X as usize;
        let base = CUBE_POS_Y as usize * l;
        let i = block * bn + t;
        let active = i < l;
        let r = base + i;
        // `stage` (comptime, CubeStrategy::TiledStaged): the unit's own read-only rows q̃_i and
        // dout_i live in shared memory (row stride w + 1, d + 1: conflict-free across a plane)
        // instead of local arrays, so only the dq̃ accumulator takes registers.
        let mut qi = Array::<f32>::new(comptime!(if stage { 1 } else { w }));
        let mut gq = Array::<f32>::new(w);
        let mut doi = Array::<f32>::new(comptime!(if stage { 1 } else { d }));
        // The own rows follow the tiles in `ks` and `vs`.
        let mut ks = Shared::<[f32]>::new_slice(comptime!(if stage {
            bn * w + bn * (w + 1)
        } else {
            bn * w
        }));
        let mut vs = Shared::<[f32]>::new_slice(comptime!(if stage {
            bn * d + bn * (d + 1)
        } else {
            bn * d
        }));
        let qo = comptime!(bn * w) + t * comptime!(w + 1);
        let oo = comptime!(bn * d) + t * comptime!(d + 1);
        #[unroll]
        for c in 0..w {
            gq[c] = 0.0f32;
        }
        if !stage {
            #[unroll]
            for c in 0..w {
                qi[c] = 0.0f32;
            }
            #[unroll]
            for c in 0..d {
                doi[c] = 0.0f32;
            }
        }
        let mut lse_i = 0.0f32;
        let mut delta_i = 0.0f32;
        if active {
            if stage {
                #[unroll]
                for c in 0..w {
                    ks[qo + c] = q[r * w + c];
                }
                #[unroll]
                for c in 0..d {
                    vs[oo + c] = dout[r * d + c];
                }
            } else {
                #[unroll]
                for c in 0..w {
                    qi[c] = q[r * w + c];
                }
                #[unroll]
                for c in 0..d {
                    doi[c] = dout[r * d + c];
                }
            }
            lse_i += lse[r];
            delta_i += delta[r];
        }
        let mut q_sum = 0.0f32;
        if tapa {
            if stage {
                q_sum += sum_local(ks.as_slice(), qo, amp, w);
            } else {
                q_sum += sum_local(qi.as_slice(), 0usize, amp, w);
            }
        }
        for tile in 0..block + 1 {
            let j0 = tile * bn;
            let jl = j0 + t;
            if jl < l {
                #[unroll]
                for c in 0..w {
                    ks[t * w + c] = k[(base + jl) * w + c];
                }
                #[unroll]
                for c in 0..d {
                    vs[t * d + c] = v[(base + jl) * d + c];
                }
            }
            sync_cube();
            if active {
                let mut jend = j0 + bn;
                if jend > i + 1 {
                    jend = i + 1;
                }
                for j in j0..jend {
                    let kb = (j - j0) * w;
                    let mut kg = kb;
                    let mut xo = 0usize;
                    let mut xdo = 0usize;
                    if stage {
                        // 0 for every j < 2^31, but not provably: the own rows' loads stay in the
                        // loop (not hoisted into registers, which would undo the staging), and
                        // the update re-reads k̃_j instead of keeping the score's loads.
                        let opaque = j / 2147483648usize;
                        kg += opaque;
                        xo += qo + opaque;
                        xdo += oo + opaque;
                    }
                    // The unit's own rows: local arrays, or (staged) its rows of `ks` and `vs`.
                    let xq = if stage { ks.as_slice() } else { qi.as_slice() };
                    let xd = if stage { vs.as_slice() } else { doi.as_slice() };
                    let dp = dot_range(xd, xdo, &vs, (j - j0) * d, 0usize, d);
                    add_score_grad(
                        &mut gq, xq, xo, q_sum, &ks, kb, kg, i, j, lse_i, dp, delta_i, scale,
                        inv_sqrt_a, inv_sqrt_p, alpha, w, tapa, amp, linear,
                    );
                }
            }
            sync_cube();
        }
        if active {
            #[unroll]
            for c in 0..w {
                dq[r * w + c] = gq[c];
            }
        }
    }

    /// Tiled backward for `dk` (or `dk̃`) and `dv`; same contract as [`attn_bwd_dkdv`]. One cube
    /// per block of `bn` key rows, staging the query-side rows (`q̃`, `dout`, `lse`, `Δ`) of the
    /// blocks at and after it.
    #[cube(launch, create_dummy_kernel)]
    pub fn attn_bwd_dkdv_tiled(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        dout: &[f32],
        lse: &[f32],
        delta: &[f32],
        dk: &mut [f32],
        dv: &mut [f32],
        seq: u32,
        scale: f32,
        inv_sqrt_a: f32,
        inv_sqrt_p: f32,
        alpha: f32,
        #[comptime] w: usize,
        #[comptime] d: usize,
        #[comptime] tapa: bool,
        #[comptime] amp: usize,
        #[comptime] linear: bool,
        #[comptime] bn: usize,
        #[comptime] with_dk: bool,
        #[comptime] with_dv: bool,
        #[comptime] stage: bool,
    ) {
        let l = seq as usize;
        let t = UNIT_POS as usize;
        let block = CUBE_POS_X as usize;
        let base = CUBE_POS_Y as usize * l;
        let j = block * bn + t;
        let active = j < l;
        let r = base + j;
        // `with_dk` / `with_dv` (comptime): which of `dk`, `dv` this launch writes; the state
        // of the other is never touched, so the compiler drops it (CubeStrategy::TiledSplit).
        // `stage` (comptime, CubeStrategy::TiledStaged): the unit's own read-only rows k̃_j and
        // v_j live in shared memory (row stride w + 1, d + 1: conflict-free across a plane)
        // instead of local arrays, so only the dk̃ and dv accumulators take registers.
        let mut kj = Array::<f32>::new(comptime!(if stage { 1 } else { w }));
        let mut gk = Array::<f32>::new(w);
        let mut vj = Array::<f32>::new(comptime!(if stage { 1 } else { d }));
        let mut gv = Array::<f32>::new(d);
        // The own rows follow the tiles in `qs` and `dos`.
        let mut qs = Shared::<[f32]>::new_slice(comptime!(if stage {
            bn * w + bn * (w + 1)
        } else {
            bn * w
        }));
        let mut dos = Shared::<[f32]>::new_slice(comptime!(if stage {
            bn * d + bn * (d + 1)
        } else {
            bn * d
        }));
        let ko = comptime!(bn * w) + t * comptime!(w + 1);
        let vo = comptime!(bn * d) + t * comptime!(d + 1);
        if !stage {
            #[unroll]
            for c in 0..w {
                kj[c] = 0.0f32;
            }
        }
        if with_dk {
            #[unroll]
            for c in 0..w {
                gk[c] = 0.0f32;
            }
            if !stage {
                #[unroll]
                for c in 0..d {
                    vj[c] = 0.0f32;
                }
            }
        }
        if with_dv {
            #[unroll]
            for c in 0..d {
                gv[c] = 0.0f32;
            }
        }
        if active {
            if stage {
                #[unroll]
                for c in 0..w {
                    qs[ko + c] = k[r * w + c];
                }
                if with_dk {
                    #[unroll]
                    for c in 0..d {
                        dos[vo + c] = v[r * d + c];
                    }
                }
            } else {
                #[unroll]
                for c in 0..w {
                    kj[c] = k[r * w + c];
                }
                if with_dk {
                    #[unroll]
                    for c in 0..d {
                        vj[c] = v[r * d + c];
                    }
                }
            }
        }
        let mut k_sum = 0.0f32;
        if tapa {
            if stage {
                k_sum += sum_local(qs.as_slice(), ko, amp, w);
            } else {
                k_sum += sum_local(kj.as_slice(), 0usize, amp, w);
            }
        }
        let mut ls = Shared::<[f32]>::new_slice(bn);
        let mut dls = Shared::<[f32]>::new_slice(bn);
        let n_tiles = (l + bn - 1) / bn;
        for tile in block..n_tiles {
            let i0 = tile * bn;
            let il = i0 + t;
            if il < l {
                let qr = base + il;
                #[unroll]
                for c in 0..w {
                    qs[t * w + c] = q[qr * w + c];
                }
                #[unroll]
                for c in 0..d {
                    dos[t * d + c] = dout[qr * d + c];
                }
                ls[t] = lse[qr];
                dls[t] = delta[qr];
            }
            sync_cube();
            if active {
                let mut istart = i0;
                if istart < j {
                    istart = j;
                }
                let mut iend = i0 + bn;
                if iend > l {
                    iend = l;
                }
                for i in istart..iend {
                    let tq = i - i0;
                    let qb = tq * w;
                    let ob = tq * d;
                    let lse_i = ls[tq];
                    let delta_i = dls[tq];
                    let mut p = 0.0f32;
                    // Staged: an offset that is 0 for every i < 2^31 but that the compiler cannot
                    // prove constant. The own rows' loads then stay in the loop instead of being
                    // hoisted into registers (which would undo the staging), and the updates
                    // re-read q̃_i and dout_i instead of keeping the score's loads.
                    let mut og = ob;
                    let mut qg = qb;
                    let mut xo = 0usize;
                    let mut xvo = 0usize;
                    if stage {
                        let opaque = i / 2147483648usize;
                        og += opaque;
                        qg += opaque;
                        xo += ko + opaque;
                        xvo += vo + opaque;
                    }
                    // The unit's own rows: local arrays, or (staged) its rows of `qs` and `dos`.
                    let xk = if stage { qs.as_slice() } else { kj.as_slice() };
                    let xv = if stage { dos.as_slice() } else { vj.as_slice() };
                    if with_dk {
                        let dp = dot_range(xv, xvo, &dos, ob, 0usize, d);
                        p += add_score_grad(
                            &mut gk, xk, xo, k_sum, &qs, qb, qg, i, j, lse_i, dp, delta_i, scale,
                            inv_sqrt_a, inv_sqrt_p, alpha, w, tapa, amp, linear,
                        );
                    } else {
                        let s = score(
                            xk, xo, k_sum, &qs, qb, i, j, scale, inv_sqrt_a, inv_sqrt_p, alpha, w,
                            tapa, amp, linear,
                        );
                        p += f32::exp(s - lse_i);
                    }
                    if with_dv {
                        #[unroll]
                        for c in 0..d {
                            gv[c] += p * dos[og + c];
                        }
                    }
                }
            }
            sync_cube();
        }
        if active {
            if with_dk {
                #[unroll]
                for c in 0..w {
                    dk[r * w + c] = gk[c];
                }
            }
            if with_dv {
                #[unroll]
                for c in 0..d {
                    dv[r * d + c] = gv[c];
                }
            }
        }
    }

    /// RoPE on one row per unit, queries and keys in one launch: units `r < rows` rotate row `r`
    /// of `xq` into `out_q`, units `rows ≤ r < 2·rows` row `r − rows` of `xk` into `out_k`;
    /// `out = a · R(±pos·θ) x` on the first `rot` dims (`inverse` rotates by −pos·θ, the
    /// transpose, for the backward); dims `rot..d` are copied unchanged (partial rotary).
    /// `inv_freq`: `[rot/2]`. Rows are those of `[batch, heads, seq, d]` tensors stored as
    /// such, or (`x_token_major`, `out_token_major`) as `[batch, seq, heads, d]` ([`row_start`]).
    /// With `carry`, units `2·rows ≤ r < 3·rows` copy row `r − 2·rows` of `xc` into `out_c` in
    /// the same layouts (the tensor that would otherwise need a copy launch of its own: `v` or
    /// `dout` into rows, `dv` back into token-major); without, those two are not read.
    #[cube(launch, create_dummy_kernel)]
    pub fn rope_rotate(
        xq: &[f32],
        xk: &[f32],
        xc: &[f32],
        inv_freq: &[f32],
        out_q: &mut [f32],
        out_k: &mut [f32],
        out_c: &mut [f32],
        rows: u32,
        seq: u32,
        heads: u32,
        factor: f32,
        #[comptime] d: usize,
        #[comptime] rot: usize,
        #[comptime] adjacent: bool,
        #[comptime] inverse: bool,
        #[comptime] x_token_major: bool,
        #[comptime] out_token_major: bool,
        #[comptime] carry: bool,
    ) {
        let r = ABSOLUTE_POS;
        let rows = rows as usize;
        let sets = comptime!(if carry { 3usize } else { 2usize });
        if r >= sets * rows {
            terminate!();
        }
        let row = r % rows;
        let xs = row_start(row, seq, heads, d, x_token_major);
        let os = row_start(row, seq, heads, d, out_token_major);
        let pos = f32::cast_from((row % seq as usize) as u32);
        if r < rows {
            rope_row(
                xq, inv_freq, out_q, xs, os, pos, factor, d, rot, adjacent, inverse,
            );
        } else if r < 2 * rows {
            rope_row(
                xk, inv_freq, out_k, xs, os, pos, factor, d, rot, adjacent, inverse,
            );
        } else {
            copy_row(xc, out_c, xs, os, d);
        }
    }

    /// `out[os..os + d] = x[xs..xs + d]`.
    #[cube]
    pub fn copy_row(x: &[f32], out: &mut [f32], xs: usize, os: usize, #[comptime] d: usize) {
        #[unroll]
        for c in 0..d {
            out[os + c] = x[xs + c];
        }
    }

    /// Two or three (`carry`) `[batch, heads, seq, d]` tensors copied in one launch, one row per
    /// unit, between the layouts `x_token_major` and `out_token_major` say ([`row_start`]):
    /// units `r < rows` copy row `r` of `x0` into `out0`, `rows ≤ r < 2·rows` of `x1` into `out1`,
    /// `2·rows ≤ r < 3·rows` of `x2` into `out2` (without `carry`, those two are not read) —
    /// NoPE's and TAPA's heads into rows (q, k and `v` or `dout`) and their gradients back.
    #[cube(launch, create_dummy_kernel)]
    pub fn copy_rows(
        x0: &[f32],
        x1: &[f32],
        x2: &[f32],
        out0: &mut [f32],
        out1: &mut [f32],
        out2: &mut [f32],
        rows: u32,
        seq: u32,
        heads: u32,
        #[comptime] d: usize,
        #[comptime] x_token_major: bool,
        #[comptime] out_token_major: bool,
        #[comptime] carry: bool,
    ) {
        let r = ABSOLUTE_POS;
        let rows = rows as usize;
        let sets = comptime!(if carry { 3usize } else { 2usize });
        if r >= sets * rows {
            terminate!();
        }
        let row = r % rows;
        let xs = row_start(row, seq, heads, d, x_token_major);
        let os = row_start(row, seq, heads, d, out_token_major);
        if r < rows {
            copy_row(x0, out0, xs, os, d);
        } else if r < 2 * rows {
            copy_row(x1, out1, xs, os, d);
        } else {
            copy_row(x2, out2, xs, os, d);
        }
    }

    /// Where logical row `r` of a `[batch, heads, seq, d]` tensor starts in its buffer: `r·d`
    /// when it is stored as such; when it is stored `[batch, seq, heads, d]` (`token_major`:
    /// the projections' layout, which the model's `swap_dims(1, 2)` splits into heads without
    /// a copy), `((b·seq + i)·heads + h)·d` for `r = (b·heads + h)·seq + i`.
    #[cube]
    pub fn row_start(
        r: usize,
        seq: u32,
        heads: u32,
        #[comptime] d: usize,
        #[comptime] token_major: bool,
    ) -> usize {
        let mut start = r * d;
        if token_major {
            let l = seq as usize;
            let nh = heads as usize;
            let bh = r / l;
            let i = r % l;
            start = ((bh / nh * l + i) * nh + bh % nh) * d;
        }
        start
    }

    /// One row of [`rope_rotate`]: `x` from element `xs`, `out` from element `os`, at position
    /// `pos`.
    #[cube]
    #[allow(clippy::too_many_arguments)]
    pub fn rope_row(
        x: &[f32],
        inv_freq: &[f32],
        out: &mut [f32],
        xs: usize,
        os: usize,
        pos: f32,
        factor: f32,
        #[comptime] d: usize,
        #[comptime] rot: usize,
        #[comptime] adjacent: bool,
        #[comptime] inverse: bool,
    ) {
        let half = rot / 2;
        if adjacent {
            #[unroll]
            for p in 0..half {
                rotate_pair(
                    x,
                    out,
                    xs,
                    os,
                    2 * p,
                    2 * p + 1,
                    pos * inv_freq[p],
                    factor,
                    inverse,
                );
            }
        } else {
            #[unroll]
            for p in 0..half {
                rotate_pair(
                    x,
                    out,
                    xs,
                    os,
                    p,
                    p + half,
                    pos * inv_freq[p],
                    factor,
                    inverse,
                );
            }
        }
        #[unroll]
        for c in rot..d {
            out[os + c] = x[xs + c];
        }
    }

    /// `out[os + (ia, ib)] = a · R(±ang) x[xs + (ia, ib)]`.
    #[cube]
    #[allow(clippy::too_many_arguments)]
    pub fn rotate_pair(
        x: &[f32],
        out: &mut [f32],
        xs: usize,
        os: usize,
        ia: usize,
        ib: usize,
        ang: f32,
        factor: f32,
        #[comptime] inverse: bool,
    ) {
        let c = f32::cos(ang) * factor;
        let mut s = f32::sin(ang) * factor;
        if inverse {
            s = -s;
        }
        let xa = x[xs + ia];
        let xb = x[xs + ib];
        out[os + ia] = xa * c - xb * s;
        out[os + ib] = xa * s + xb * c;
    }

    /// Numerically stable softplus `ln(1 + eˣ)`.
    #[cube]
    pub fn softplus(x: f32) -> f32 {
        f32::max(x, 0.0f32) + f32::log1p(f32::exp(-f32::abs(x)))
    }

    /// Logistic sigmoid (softplus' derivative).
    #[cube]
    pub fn sigmoid(x: f32) -> f32 {
        1.0f32 / (1.0f32 + f32::exp(-x))
    }

    /// PoPE q̃ and k̃ in one launch, one row per unit: units `r < rows` map row `r` of `xq`
    /// into `out_q`, units `rows ≤ r < 2·rows` row `r − rows` of `xk` (with δ) into `out_k`:
    /// `[rows, d]` → `[rows, 2d]`. `theta`: `[d]`; `delta`: `[heads · d]`. `x_token_major`:
    /// `xq`, `xk` stored `[batch, seq, heads, d]` ([`row_start`]). With `carry`, units
    /// `2·rows ≤ r < 3·rows` copy row `r − 2·rows` of `xc` (in `xq`'s layout) into `out_c`
    /// (row-major `[rows, d]`), as [`rope_rotate`] does.
    #[cube(launch, create_dummy_kernel)]
    pub fn pope_prep(
        xq: &[f32],
        xk: &[f32],
        xc: &[f32],
        theta: &[f32],
        delta: &[f32],
        out_q: &mut [f32],
        out_k: &mut [f32],
        out_c: &mut [f32],
        rows: u32,
        seq: u32,
        heads: u32,
        #[comptime] d: usize,
        #[comptime] x_token_major: bool,
        #[comptime] carry: bool,
    ) {
        let r = ABSOLUTE_POS;
        let rows = rows as usize;
        let sets = comptime!(if carry { 3usize } else { 2usize });
        if r >= sets * rows {
            terminate!();
        }
        let row = r % rows;
        let xs = row_start(row, seq, heads, d, x_token_major);
        if r < rows {
            pope_row(xq, theta, delta, out_q, row, xs, seq, heads, d, false);
        } else if r < 2 * rows {
            pope_row(xk, theta, delta, out_k, row, xs, seq, heads, d, true);
        } else {
            copy_row(xc, out_c, xs, row * d, d);
        }
    }

    /// Row `r` of [`pope_prep`] (`x`'s from element `xs`): q̃ (`is_key = false`) or k̃ (`true`).
    #[cube]
    #[allow(clippy::too_many_arguments)]
    pub fn pope_row(
        x: &[f32],
        theta: &[f32],
        delta: &[f32],
        out: &mut [f32],
        r: usize,
        xs: usize,
        seq: u32,
        heads: u32,
        #[comptime] d: usize,
        #[comptime] is_key: bool,
    ) {
        let l = seq as usize;
        let pos = f32::cast_from((r % l) as u32);
        let h = (r / l) % heads as usize;
        #[unroll]
        for c in 0..d {
            let mu = softplus(x[xs + c]);
            let mut ang = pos * theta[c];
            if is_key {
                ang += delta[h * d + c];
            }
            out[r * 2 * d + c] = mu * f32::cos(ang);
            out[r * 2 * d + d + c] = mu * f32::sin(ang);
        }
    }

    /// PoPE backward of [`pope_prep`], queries and keys in one launch as there: `gq`, `gk`:
    /// `[rows, 2d]` (`dq̃`, `dk̃`) → `dq`, `dk`: `[rows, d]` and, for keys, `dphase[r, c] =
    /// ∂L/∂(angle)` (summed into `dδ` by the host). `x_token_major`: `q`, `k` and so `dq`, `dk`
    /// stored `[batch, seq, heads, d]` ([`row_start`]); `gq`, `gk`, `dphase` are row-major.
    /// With `carry`, units `2·rows ≤ r < 3·rows` copy row `r − 2·rows` of `gc` (row-major
    /// `[rows, d]`) into `dc` in `q`'s layout (`dv` back into token-major).
    #[cube(launch, create_dummy_kernel)]
    pub fn pope_prep_bwd(
        q: &[f32],
        k: &[f32],
        theta: &[f32],
        delta: &[f32],
        gq: &[f32],
        gk: &[f32],
        gc: &[f32],
        dq: &mut [f32],
        dk: &mut [f32],
        dc: &mut [f32],
        dphase: &mut [f32],
        rows: u32,
        seq: u32,
        heads: u32,
        #[comptime] d: usize,
        #[comptime] x_token_major: bool,
        #[comptime] carry: bool,
    ) {
        let r = ABSOLUTE_POS;
        let rows = rows as usize;
        let sets = comptime!(if carry { 3usize } else { 2usize });
        if r >= sets * rows {
            terminate!();
        }
        let row = r % rows;
        let xs = row_start(row, seq, heads, d, x_token_major);
        if r < rows {
            pope_row_bwd(
                q, theta, delta, gq, dq, dphase, row, xs, seq, heads, d, false,
            );
        } else if r < 2 * rows {
            pope_row_bwd(
                k, theta, delta, gk, dk, dphase, row, xs, seq, heads, d, true,
            );
        } else {
            copy_row(gc, dc, row * d, xs, d);
        }
    }

    /// Row `r` of [`pope_prep_bwd`] (`x`'s and `dx`'s from element `xs`).
    #[cube]
    #[allow(clippy::too_many_arguments)]
    pub fn pope_row_bwd(
        x: &[f32],
        theta: &[f32],
        delta: &[f32],
        g: &[f32],
        dx: &mut [f32],
        dphase: &mut [f32],
        r: usize,
        xs: usize,
        seq: u32,
        heads: u32,
        #[comptime] d: usize,
        #[comptime] is_key: bool,
    ) {
        let l = seq as usize;
        let pos = f32::cast_from((r % l) as u32);
        let h = (r / l) % heads as usize;
        #[unroll]
        for c in 0..d {
            let xv = x[xs + c];
            let mut ang = pos * theta[c];
            if is_key {
                ang += delta[h * d + c];
            }
            let cs = f32::cos(ang);
            let sn = f32::sin(ang);
            let gc = g[r * 2 * d + c];
            let gs = g[r * 2 * d + d + c];
            // ∂L/∂μ = g_c cos + g_s sin;  ∂μ/∂x = σ(x).
            dx[xs + c] = (gc * cs + gs * sn) * sigmoid(xv);
            if is_key {
                // ∂L/∂angle = μ (−g_c sin + g_s cos).
                dphase[r * d + c] = softplus(xv) * (gs * cs - gc * sn);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------------

/// `[batch, heads, seq, head_dim]` of a rank-4 tensor.
fn dims4(t: &CubeTensor) -> [usize; 4] {
    let s = t.shape();
    assert_eq!(s.num_dims(), 4, "expected [batch, heads, seq, head_dim]");
    [s[0], s[1], s[2], s[3]]
}

/// Contiguous f32 copy (or the tensor itself when it already is).
fn prepare(t: CubeTensor, what: &str) -> CubeTensor {
    assert_eq!(t.dtype, DType::F32, "{what}: the cube kernels take f32");
    let t = into_contiguous(t);
    assert!(
        t.is_contiguous(),
        "{what}: not contiguous after into_contiguous"
    );
    t
}

/// Whether `t`, `[batch, heads, seq, head_dim]`, is stored densely as `[batch, seq, heads,
/// head_dim]` (and not also contiguous, as it is when `heads` or `seq` is 1): the model's heads,
/// split from the projections' output by `swap_dims(1, 2)` without a copy
/// (`crate::model::Block::forward`).
fn is_token_major(t: &CubeTensor) -> bool {
    if t.dtype != DType::F32 || t.meta.is_tiled() || t.is_contiguous() {
        return false;
    }
    let [b, h, l, d] = dims4(t);
    let want = [l * h * d, d, h * d, 1];
    let dims = [b, h, l, d];
    let strides = t.meta.strides();
    (0..4).all(|i| dims[i] == 1 || strides[i] == want[i])
}

/// `q`, `k` as the attention's first kernel reads them: kept as they are when both are
/// token-major ([`is_token_major`]), contiguous ([`prepare`]) otherwise. RoPE's and PoPE's first
/// kernel ([`rope_rotate`], [`pope_prep`]) reads them row by row wherever a row is and copies a
/// token-major `v` or `dout` into rows in the same launch ([`transform`]); its inverse writes
/// `dq`, `dk`, `dv` in that layout, as the forward kernels write `out`: the model's head split
/// and merge cost no copy launch (eight fewer per layer and step). NoPE's and TAPA's attention
/// kernels read rows, so one [`copy_rows`] launch makes them (q, k and `v` or `dout`) and one
/// more gives the gradients back in that layout (three launches per layer and step for eight).
fn kernel_qk(q: CubeTensor, k: CubeTensor) -> [CubeTensor; 2] {
    if is_token_major(&q) && is_token_major(&k) {
        return [q, k];
    }
    [prepare(q, "q"), prepare(k, "k")]
}

/// A new f32 tensor `[batch, heads, seq, head_dim]` on `like`'s device (uninitialised), stored
/// `[batch, seq, heads, head_dim]` when `token_major` ([`is_token_major`]), contiguous otherwise.
fn empty_heads(like: &CubeTensor, shape: [usize; 4], token_major: bool) -> CubeTensor {
    let [b, h, l, d] = shape;
    if token_major {
        CubeBackend::float_swap_dims(empty_like(like, vec![b, l, h, d]), 1, 2)
    } else {
        empty_like(like, vec![b, h, l, d])
    }
}

/// A new contiguous f32 tensor of `shape` on `like`'s device (uninitialised).
fn empty_like(like: &CubeTensor, shape: Vec<usize>) -> CubeTensor {
    let n: usize = shape.iter().product();
    let handle = like.client.empty(n.max(1) * 4);
    CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        Shape::from(shape),
        handle,
        DType::F32,
    )
}

/// An f32 device buffer holding `values` (as f32), as a tensor `[len]`.
fn upload(like: &CubeTensor, values: &[f64]) -> CubeTensor {
    let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
    let v = if v.is_empty() { vec![0.0f32] } else { v };
    let handle = like.client.create_from_slice(f32::as_bytes(&v));
    CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        Shape::from(vec![v.len()]),
        handle,
        DType::F32,
    )
}

fn arg(t: &CubeTensor) -> BufferArg {
    #[cfg(feature = "cuda-source")]
    super::cuda_host::note_buffer(t);
    t.clone().into_buffer_arg()
}

fn launch_dims(like: &CubeTensor, units: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new_1d(CUBE_UNITS);
    let count = calculate_cube_count_elemwise(&like.client, units.max(1), dim);
    (count, dim)
}

/// Elements of the gradients per unit of [`sum_of_squares`], on average.
const SQ_SUM_PER_UNIT: usize = 256;

/// Tensors per launch of [`sum_of_squares`]: each is one storage binding, and lavapipe allows 31
/// per kernel.
const SQ_SUM_TENSORS_PER_LAUNCH: usize = 24;

/// Units of each `sq_sum_partials` launch for tensors of `sizes` elements (empty ones skipped):
/// one launch per 24 tensors, `⌈N/256⌉` units for its `N` elements. Their sum is the length of
/// [`square_partials`]' output.
fn square_partials_units(sizes: impl IntoIterator<Item = usize>) -> Vec<usize> {
    let sizes: Vec<usize> = sizes.into_iter().filter(|&n| n > 0).collect();
    sizes
        .chunks(SQ_SUM_TENSORS_PER_LAUNCH)
        .map(|g| g.iter().sum::<usize>().div_ceil(SQ_SUM_PER_UNIT))
        .collect()
}

/// Partial sums of `x²` over every element of `ts` (f32 tensors of any shapes on one CubeCL
/// device), `[units]` f32, nothing read back: one launch of `sq_sum_partials` per 24 tensors,
/// its `⌈N/256⌉` units (`N` the launch's elements) each adding, tensor after tensor, every
/// `units`-th element from its own index (coalesced reads, a fixed order). `None` when every
/// tensor is empty. The kernel takes each tensor's length from its buffer binding, which for a
/// view (burn-cubecl's slice: the same buffer at an offset) is the view's own range
/// (`sum_of_squares_matches_a_direct_sum`). The lab's global gradient norm on CubeCL devices
/// ([`step_stats`]): one launch for the quick model's 19 gradients, where burn's
/// `square().sum()` takes three per gradient (a fused square, a zero fill and an atomic
/// shared-memory sum).
pub fn square_partials(ts: Vec<CubeTensor>) -> Option<CubeTensor> {
    let ts: Vec<CubeTensor> = ts
        .into_iter()
        .map(|t| prepare(t, "gradient"))
        .filter(|t| t.shape().num_elements() > 0)
        .collect();
    let first = ts.first()?;
    let units = square_partials_units(ts.iter().map(|t| t.shape().num_elements()));
    let partials = empty_like(first, vec![units.iter().sum()]);
    let client = first.client.clone();
    let mut offset = 0usize;
    for (group, &u) in ts.chunks(SQ_SUM_TENSORS_PER_LAUNCH).zip(&units) {
        let (count, dim) = launch_dims(first, u);
        let seq = || group.iter().map(arg).collect::<SequenceArg<Box<[f32]>>>();
        // Not `launch!`: its CPU run of the CUDA C++ (`cuda_host`) takes buffers and scalars only.
        #[cfg(feature = "cuda-source")]
        if let Some((props, target)) = super::cuda_source::capturing() {
            super::cuda_source::record(
                "sq_sum_partials",
                super::cuda_source::count_of(&count),
                Box::new(kernels::sq_sum_partials::create_dummy_kernel(
                    props,
                    target,
                    count,
                    dim,
                    seq(),
                    arg(&partials),
                    u as u32,
                    offset as u32,
                )),
            );
            offset += u;
            continue;
        }
        kernels::sq_sum_partials::launch(
            &client,
            count,
            dim,
            seq(),
            arg(&partials),
            u as u32,
            offset as u32,
        );
        offset += u;
    }
    Some(partials)
}

/// `Σ x²` over every element of `ts` as f64: [`square_partials`], then one read of the partials,
/// summed on the host in a fixed order (the same bits run after run). Empty input: 0.
///
/// # Panics
/// If the device read fails.
pub fn sum_of_squares(ts: Vec<CubeTensor>) -> f64 {
    match square_partials(ts) {
        Some(p) => cube_to_host(p).iter().map(|&p| p as f64).sum(),
        None => 0.0,
    }
}

/// Units of the one cube of `step_stats`.
const STEP_STATS_UNITS: usize = 256;

/// A training step's statistics on the device: `stats` `[3]` f32 `[loss, correct, Σ g²]` — the
/// loss and the correct count copied from `loss` and `correct` (`[1]` each), the sum of squares
/// of every element of `grads` ([`square_partials`], then one cube of the `step_stats` kernel
/// adding the partials in a fixed order) — and `clip` `[1]`, PyTorch's clip factor
/// `min(1, max_norm/(√Σ + 1e-6))` (1 for `max_norm ≤ 0`). Two launches, nothing read back: the
/// lab's training step on CubeCL devices scales the gradients by `clip` on the device and reads
/// `stats` once, at its end ([`crate::train`]'s `cube_step`). Sums in f32.
///
/// # Panics
/// On a non-f32 tensor.
pub fn step_stats(
    grads: Vec<CubeTensor>,
    loss: CubeTensor,
    correct: CubeTensor,
    max_norm: f32,
) -> StepStats<CubeTensor> {
    let (loss, correct) = (prepare(loss, "loss"), prepare(correct, "correct"));
    let partials = square_partials(grads);
    let n = partials.as_ref().map_or(0, |p| p.shape().num_elements());
    // Without gradients the kernel reads no partial; any buffer binds.
    let partials = partials.unwrap_or_else(|| loss.clone());
    let stats = empty_like(&loss, vec![3]);
    let clip = empty_like(&loss, vec![1]);
    let client = loss.client.clone();
    launch!(
        step_stats,
        &client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(STEP_STATS_UNITS as u32),
        arg(&partials),
        arg(&loss),
        arg(&correct),
        arg(&stats),
        arg(&clip),
        n as u32,
        max_norm,
        STEP_STATS_UNITS,
    );
    StepStats { stats, clip }
}

/// What [`step_stats`] returns, as tensors `T`.
#[derive(Clone, Debug)]
pub struct StepStats<T> {
    /// `[3]`: loss, correct count, sum of squares of the gradients.
    pub stats: T,
    /// `[1]`: the clip factor.
    pub clip: T,
}

/// AdamW's scalars for one update ([`adamw_update`]), each computed in f64 on the host and rounded
/// to f32, as burn rounds the scalar of a tensor-scalar operation (the lab's tensor-op update,
/// [`crate::train::AdamW`], uses the same values).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWHyper {
    /// β₁.
    pub beta1: f32,
    /// `1 − β₁`.
    pub one_minus_beta1: f32,
    /// β₂.
    pub beta2: f32,
    /// `1 − β₂`.
    pub one_minus_beta2: f32,
    /// The first moment's bias correction `1 − β₁ᵗ` at the 1-based step `t`.
    pub bias1: f32,
    /// The second moment's bias correction `1 − β₂ᵗ`.
    pub bias2: f32,
    /// ε, added outside the square root.
    pub eps: f32,
    /// `1 − lr·λ`: the decoupled weight decay's factor (1 for a tensor without decay).
    pub keep: f32,
    /// The learning rate.
    pub lr: f32,
}

impl AdamWHyper {
    /// The scalars of step `t` (1-based) at learning rate `lr` and weight decay `decay` (0 for a
    /// tensor that is not decayed).
    pub fn new(beta1: f64, beta2: f64, eps: f64, t: i32, lr: f64, decay: f64) -> Self {
        Self {
            beta1: beta1 as f32,
            one_minus_beta1: (1.0 - beta1) as f32,
            beta2: beta2 as f32,
            one_minus_beta2: (1.0 - beta2) as f32,
            bias1: (1.0 - beta1.powi(t)) as f32,
            bias2: (1.0 - beta2.powi(t)) as f32,
            eps: eps as f32,
            keep: (1.0 - lr * decay) as f32,
            lr: lr as f32,
        }
    }
}

/// What the gradient is multiplied by in [`adamw_update`] (the global-norm clip factor).
#[derive(Clone, Debug)]
pub enum UpdateScale<T> {
    /// A factor known on the host.
    Host(f32),
    /// A `[1]` tensor on the device (the clip factor of [`step_stats`]).
    Device(T),
}

/// One AdamW update of a parameter `x` (f32, any shape) from its gradient `grad` (same shape) and
/// its moments `(m, v)` (same shape; `None` on the first step: zeros): `[x', m', v']`, new
/// tensors of `x`'s shape. One launch of the `adamw_update` kernel, nothing read back; the
/// element-wise operations of the tensor-op update in the same f32 order (PyTorch's AdamW,
/// Loshchilov & Hutter 2019, Alg. 2; [`crate::train::AdamW`]). The lab's update on CubeCL
/// devices: one operation per parameter where the tensor ops register sixteen in burn's fusion
/// stream (`LAB_ADAMW`, [`crate::train::AdamWKernel`]).
///
/// # Panics
/// On a non-f32 tensor or a shape different from `x`'s.
pub fn adamw_update(
    x: CubeTensor,
    grad: CubeTensor,
    moments: Option<(CubeTensor, CubeTensor)>,
    scale: UpdateScale<CubeTensor>,
    hyper: &AdamWHyper,
) -> [CubeTensor; 3] {
    let x = prepare(x, "parameter");
    let grad = prepare(grad, "gradient");
    let shape = x.shape().to_vec();
    assert_eq!(
        grad.shape().to_vec(),
        shape,
        "gradient: not the parameter's shape"
    );
    let first = moments.is_none();
    // On the first step the kernel reads no moment; any buffer binds.
    let (m, v) = match moments {
        Some((m, v)) => {
            let (m, v) = (prepare(m, "first moment"), prepare(v, "second moment"));
            assert_eq!(
                m.shape().to_vec(),
                shape,
                "first moment: not the parameter's shape"
            );
            assert_eq!(
                v.shape().to_vec(),
                shape,
                "second moment: not the parameter's shape"
            );
            (m, v)
        }
        None => (grad.clone(), grad.clone()),
    };
    let (scale, host_scale, device_scale) = match scale {
        UpdateScale::Host(s) => (grad.clone(), s, false),
        UpdateScale::Device(s) => (prepare(s, "gradient scale"), 1.0, true),
    };
    let n = x.shape().num_elements();
    let [x_out, m_out, v_out] = [(); 3].map(|_| empty_like(&x, shape.clone()));
    let (count, dim) = launch_dims(&x, n);
    let client = x.client.clone();
    let h = hyper;
    launch!(
        adamw_update,
        &client,
        count,
        dim,
        arg(&x),
        arg(&grad),
        arg(&m),
        arg(&v),
        arg(&scale),
        arg(&x_out),
        arg(&m_out),
        arg(&v_out),
        n as u32,
        host_scale,
        h.beta1,
        h.one_minus_beta1,
        h.beta2,
        h.one_minus_beta2,
        h.bias1,
        h.bias2,
        h.eps,
        h.keep,
        h.lr,
        first,
        device_scale,
    );
    [x_out, m_out, v_out]
}

/// GELU (exact form) of `x` (f32, any shape): one launch of `gelu_fwd`
/// ([`crate::kernels::pointwise`]'s formula and `erf`).
///
/// # Panics
/// On a non-f32 tensor.
pub fn gelu_forward(x: CubeTensor) -> CubeTensor {
    let x = prepare(x, "gelu input");
    let n = x.shape().num_elements();
    let y = empty_like(&x, x.shape().to_vec());
    let (count, dim) = launch_dims(&x, n);
    let client = x.client.clone();
    launch!(gelu_fwd, &client, count, dim, arg(&x), arg(&y), n as u32);
    y
}

/// GELU's input gradient from the input `x` and the output gradient `dy` (same shape): one launch
/// of `gelu_bwd`.
///
/// # Panics
/// On a non-f32 tensor or mismatched shapes.
pub fn gelu_backward(x: CubeTensor, dy: CubeTensor) -> CubeTensor {
    let (x, dy) = (
        prepare(x, "gelu input"),
        prepare(dy, "gelu output gradient"),
    );
    assert_eq!(
        x.shape().to_vec(),
        dy.shape().to_vec(),
        "gelu: dy must have x's shape"
    );
    let n = x.shape().num_elements();
    let dx = empty_like(&x, x.shape().to_vec());
    let (count, dim) = launch_dims(&x, n);
    let client = x.client.clone();
    launch!(
        gelu_bwd,
        &client,
        count,
        dim,
        arg(&x),
        arg(&dy),
        arg(&dx),
        n as u32
    );
    dx
}

/// `(rows, d)` of a tensor normalised over its last axis, and its gain's length checked.
/// `(rows, vocab)` of the cross-entropy's logits `[…, vocab]`, checked against `targets` and
/// `mask` (`rows` elements each).
fn xent_dims(logits: &CubeTensor, targets: &CubeTensor, mask: &CubeTensor) -> (usize, usize) {
    let shape = logits.shape();
    let vocab = *shape
        .last()
        .expect("cross-entropy: logits have at least one axis");
    let rows = shape.num_elements() / vocab.max(1);
    assert!(vocab >= 1, "cross-entropy: empty vocabulary");
    assert_eq!(
        targets.shape().num_elements(),
        rows,
        "cross-entropy: one target per row"
    );
    assert_eq!(
        mask.shape().num_elements(),
        rows,
        "cross-entropy: one mask value per row"
    );
    (rows, vocab)
}

/// The masked cross-entropy of each row (one launch of `xent_fwd`): `logits` `[…, vocab]`,
/// `targets` (f32 ids in `0..vocab`) and `mask` with one value per row. Returns `(loss, correct)`,
/// each shaped as `targets`: `(logsumexp − picked logit)·mask` in nats, and `[argmax =
/// target]·mask`. The scored mean is `Σ loss / n_scored` ([`crate::model::masked_cross_entropy`]).
///
/// # Panics
/// On a non-f32 tensor or mismatched sizes. A target outside `0..vocab` reads out of bounds of its
/// row (the caller's batches hold vocabulary ids).
pub fn xent_forward(
    logits: CubeTensor,
    targets: CubeTensor,
    mask: CubeTensor,
) -> (CubeTensor, CubeTensor) {
    let (rows, vocab) = xent_dims(&logits, &targets, &mask);
    let shape = targets.shape().to_vec();
    let logits = prepare(logits, "logits");
    let (targets, mask) = (prepare(targets, "targets"), prepare(mask, "loss mask"));
    let (loss, correct) = (
        empty_like(&logits, shape.clone()),
        empty_like(&logits, shape),
    );
    let (count, dim) = launch_dims(&logits, rows);
    launch!(
        xent_fwd,
        &logits.client,
        count,
        dim,
        arg(&logits),
        arg(&targets),
        arg(&mask),
        arg(&loss),
        arg(&correct),
        rows as u32,
        vocab as u32,
    );
    (loss, correct)
}

/// [`xent_forward`]'s logit gradient from the per-row loss gradient `dloss` (one launch of
/// `xent_bwd`): `dloss·mask·(softmax − onehot(target))`, shaped as `logits`.
///
/// # Panics
/// As [`xent_forward`], or a `dloss` of another size than `targets`.
pub fn xent_backward(
    logits: CubeTensor,
    targets: CubeTensor,
    mask: CubeTensor,
    dloss: CubeTensor,
) -> CubeTensor {
    let (rows, vocab) = xent_dims(&logits, &targets, &mask);
    assert_eq!(
        dloss.shape().num_elements(),
        rows,
        "cross-entropy: one loss gradient per row"
    );
    let logits = prepare(logits, "logits");
    let (targets, mask) = (prepare(targets, "targets"), prepare(mask, "loss mask"));
    let dloss = prepare(dloss, "loss gradient");
    let dlogits = empty_like(&logits, logits.shape().to_vec());
    let (count, dim) = launch_dims(&logits, rows);
    launch!(
        xent_bwd,
        &logits.client,
        count,
        dim,
        arg(&logits),
        arg(&targets),
        arg(&mask),
        arg(&dloss),
        arg(&dlogits),
        rows as u32,
        vocab as u32,
    );
    dlogits
}

fn rms_dims(x: &CubeTensor, gain: &CubeTensor) -> (usize, usize) {
    let dims = x.shape().to_vec();
    let d = *dims.last().expect("rms_norm: x has at least one axis");
    assert_eq!(
        gain.shape().num_elements(),
        d,
        "rms_norm: gain must have x's last dimension"
    );
    (x.shape().num_elements() / d.max(1), d)
}

/// RMSNorm of `x` `[…, d]` with `gain` `[d]` (ε = [`crate::kernels::pointwise::RMS_EPS`]):
/// `(y, inv)`, `y` like `x`, `inv` `[rows]` the reciprocal RMS of each row (for the backward). One
/// launch of `rms_norm_fwd`, a row per unit.
///
/// # Panics
/// On a non-f32 tensor or a gain of the wrong length.
pub fn rms_norm_forward(x: CubeTensor, gain: CubeTensor) -> (CubeTensor, CubeTensor) {
    let (x, gain) = (prepare(x, "rms_norm input"), prepare(gain, "rms_norm gain"));
    let (rows, d) = rms_dims(&x, &gain);
    let y = empty_like(&x, x.shape().to_vec());
    let inv = empty_like(&x, vec![rows]);
    let (count, dim) = launch_dims(&x, rows);
    let client = x.client.clone();
    launch!(
        rms_norm_fwd,
        &client,
        count,
        dim,
        arg(&x),
        arg(&gain),
        arg(&y),
        arg(&inv),
        rows as u32,
        d as u32,
        super::pointwise::RMS_EPS,
    );
    (y, inv)
}

/// RMSNorm's gradients `(dx, dgain)` from `x`, `gain`, the forward's `inv` and the output
/// gradient `dy`: one launch of `rms_norm_bwd` (a row per unit: `dx` and `dy ⊙ x·inv`), then the
/// column sums of the latter by burn's `sum_dim` (`dgain` `[d]`).
///
/// # Panics
/// On a non-f32 tensor or mismatched shapes.
pub fn rms_norm_backward(
    x: CubeTensor,
    gain: CubeTensor,
    inv: CubeTensor,
    dy: CubeTensor,
) -> (CubeTensor, CubeTensor) {
    let (x, gain) = (prepare(x, "rms_norm input"), prepare(gain, "rms_norm gain"));
    let (inv, dy) = (prepare(inv, "rms_norm inv"), prepare(dy, "rms_norm dy"));
    assert_eq!(
        x.shape().to_vec(),
        dy.shape().to_vec(),
        "rms_norm: dy must have x's shape"
    );
    let (rows, d) = rms_dims(&x, &gain);
    let dx = empty_like(&x, x.shape().to_vec());
    let xk_dy = empty_like(&x, vec![rows, d]);
    let (count, dim) = launch_dims(&x, rows);
    let client = x.client.clone();
    launch!(
        rms_norm_bwd,
        &client,
        count,
        dim,
        arg(&x),
        arg(&gain),
        arg(&inv),
        arg(&dy),
        arg(&dx),
        arg(&xk_dy),
        rows as u32,
        d as u32,
    );
    let dgain =
        CubeBackend::float_reshape(CubeBackend::float_sum_dim(xk_dy, 0), gain.shape().clone());
    (dx, dgain)
}

/// The device tensor behind a float tensor of a `wgpu` or `cuda` device (burn's `Cube` backend,
/// fused or not; resolving a fused tensor runs what is pending on its stream).
///
/// # Panics
/// If `t` is not on a CubeCL device.
pub fn tensor_to_cube<const D: usize>(t: burn::tensor::Tensor<D>) -> CubeTensor {
    <burn::backend::Cube as CubePrimitives>::to_cube(
        t.try_into_primitive::<burn::backend::Cube>()
            .expect("a wgpu or cuda tensor is a Cube primitive"),
    )
}

/// Submit every operation burn's fusion stream holds up to `t` (a tensor of a `wgpu` or `cuda`
/// device): their kernels are launched — queued on the device, nothing read back, the host not
/// waiting for them. Without burn's fusion, kernels launch as each operation is called and this
/// does nothing. The lab's training step on CubeCL devices calls it after the loss and after the
/// gradients' statistics ([`crate::train`]'s `cube_step`) so the device works on one part of the
/// step while the host records the next. On lavapipe, three rounds each, the tiny model's step
/// went from 32–41 to 24–32 ms with the read-once step, and the device-bound quick model's rose
/// 8 % (lavapipe shares the host's two cores; docs/performance.md, "One read per step").
///
/// # Panics
/// If `t` is not on a CubeCL device.
pub fn submit_pending<const D: usize>(t: &burn::tensor::Tensor<D>) {
    drop(tensor_to_cube(t.clone()));
}

/// Comptime/runtime settings of the attention kernels for one call.
struct Plan {
    rows: usize,
    seq: usize,
    head_dim: usize,
    /// Width of the transformed q̃/k̃ rows.
    w: usize,
    scale: f32,
    tapa: bool,
    amp: usize,
    linear: bool,
    inv_sqrt_a: f32,
    inv_sqrt_p: f32,
    alpha: f32,
}

impl Plan {
    fn new(shape: [usize; 4], enc: &CubeEncoding) -> Self {
        let [b, h, l, d] = shape;
        let mut plan = Plan {
            rows: b * h * l,
            seq: l,
            head_dim: d,
            w: d,
            scale: 1.0 / (d as f32).sqrt(),
            tapa: false,
            amp: 0,
            linear: false,
            inv_sqrt_a: 1.0,
            inv_sqrt_p: 1.0,
            alpha: 0.0,
        };
        match enc {
            CubeEncoding::Nope => {}
            CubeEncoding::Rope { inv_freq, .. } => {
                assert!(d % 2 == 0, "RoPE needs an even head_dim");
                assert!(
                    !inv_freq.is_empty() && 2 * inv_freq.len() <= d,
                    "inv_freq must be [rotary_dim/2] with 2 ≤ rotary_dim ≤ head_dim"
                );
            }
            CubeEncoding::Pope { theta, delta } => {
                assert_eq!(theta.len(), d, "PoPE theta must be [head_dim]");
                assert_eq!(
                    delta.shape().num_elements(),
                    h * d,
                    "PoPE delta must be [heads·head_dim]"
                );
                plan.w = 2 * d;
            }
            CubeEncoding::Tapa {
                amp_dim,
                alpha,
                phase,
                phase_gain,
            } => {
                assert!(
                    *amp_dim >= 1 && *amp_dim < d,
                    "TAPA amp_dim must be in 1..head_dim"
                );
                plan.tapa = true;
                plan.amp = *amp_dim;
                plan.linear = *phase == TapaPhase::Linear;
                plan.inv_sqrt_a = 1.0 / (*amp_dim as f32).sqrt();
                plan.inv_sqrt_p = (*phase_gain / ((d - amp_dim) as f64).sqrt()) as f32;
                plan.alpha = *alpha as f32;
            }
        }
        plan
    }
}

/// `(q̃, k̃, c)`: `q̃`, `k̃` contiguous `[rows, w]` for the dot-product encodings, `(q, k)` as
/// contiguous rows for NoPE and TAPA (copied by [`copy_rows`] when token-major); `c` is `carry`
/// (`v` in the forward, `dout` in the backward) made contiguous, copied by the same launch when it
/// and `q` are token-major ([`is_token_major`]: one launch fewer), by [`prepare`] otherwise. `q`,
/// `k` as [`kernel_qk`] leaves them.
fn transform(
    q: &CubeTensor,
    k: &CubeTensor,
    carry: CubeTensor,
    enc: &CubeEncoding,
    plan: &Plan,
) -> (CubeTensor, CubeTensor, CubeTensor) {
    let shape = dims4(q);
    let token_major = is_token_major(q);
    let rotates = enc.rotates();
    if !rotates && !token_major {
        // NoPE's and TAPA's rows as they are: no launch.
        return (q.clone(), k.clone(), prepare(carry, "v or dout"));
    }
    let carried = token_major && is_token_major(&carry);
    let (carry_in, carry_out) = if carried {
        (carry, empty_like(q, shape.to_vec()))
    } else {
        let c = prepare(carry, "v or dout");
        (c.clone(), c)
    };
    // Written only when carried: a one-element stand-in otherwise.
    let out_c = if carried {
        carry_out.clone()
    } else {
        empty_like(q, vec![1])
    };
    // q's rows, then k's (then the carried tensor's): one unit each.
    let sets = if carried { 3 } else { 2 };
    let (count, dim) = launch_dims(q, sets * plan.rows);
    let (rows, seq, d) = (plan.rows as u32, plan.seq as u32, plan.head_dim);
    let heads = shape[1] as u32;
    match enc {
        CubeEncoding::Nope | CubeEncoding::Tapa { .. } => {
            let (out_q, out_k) = (empty_like(q, shape.to_vec()), empty_like(k, shape.to_vec()));
            launch!(
                copy_rows,
                &q.client,
                count,
                dim,
                arg(q),
                arg(k),
                arg(&carry_in),
                arg(&out_q),
                arg(&out_k),
                arg(&out_c),
                rows,
                seq,
                heads,
                d,
                true,
                false,
                carried,
            );
            (out_q, out_k, carry_out)
        }
        CubeEncoding::Rope {
            inv_freq,
            layout,
            attention_factor,
        } => {
            let freqs = upload(q, inv_freq);
            let (out_q, out_k) = (
                empty_like(q, vec![plan.rows, d]),
                empty_like(k, vec![plan.rows, d]),
            );
            launch!(
                rope_rotate,
                &q.client,
                count,
                dim,
                arg(q),
                arg(k),
                arg(&carry_in),
                arg(&freqs),
                arg(&out_q),
                arg(&out_k),
                arg(&out_c),
                rows,
                seq,
                heads,
                *attention_factor as f32,
                d,
                2 * inv_freq.len(),
                *layout == PairLayout::Adjacent,
                false,
                token_major,
                false,
                carried,
            );
            (out_q, out_k, carry_out)
        }
        CubeEncoding::Pope { theta, delta } => {
            let theta = upload(q, theta);
            let (out_q, out_k) = (
                empty_like(q, vec![plan.rows, 2 * d]),
                empty_like(k, vec![plan.rows, 2 * d]),
            );
            launch!(
                pope_prep,
                &q.client,
                count,
                dim,
                arg(q),
                arg(k),
                arg(&carry_in),
                arg(&theta),
                arg(delta),
                arg(&out_q),
                arg(&out_k),
                arg(&out_c),
                rows,
                seq,
                heads,
                d,
                token_major,
                carried,
            );
            (out_q, out_k, carry_out)
        }
    }
}

/// `None` for [`CubeStrategy::Rows`]; otherwise `(tile rows, cube count, cube dim)` of the
/// tiled kernels: one cube per (block of `tile` rows, batch·head).
fn tiling(strategy: &CubeStrategy, plan: &Plan) -> Option<(usize, CubeCount, CubeDim)> {
    let (CubeStrategy::Tiled { tile }
    | CubeStrategy::TiledSplit { tile }
    | CubeStrategy::TiledStaged { tile }
    | CubeStrategy::Cmma { tile }
    | CubeStrategy::CmmaWide { tile }) = strategy
    else {
        return None;
    };
    let bn = tile.unwrap_or_else(|| auto_tile(plan.w, plan.head_dim));
    Some(tile_launch(bn, plan))
}

/// Shared memory per cube on `client`'s device, bytes (while capturing for CUDA, the CUDA
/// device's).
fn max_shared(client: &cubecl::client::Client) -> usize {
    #[cfg(feature = "cuda-source")]
    if let Some((props, _)) = super::cuda_source::capturing() {
        return props.hardware.max_shared_memory_size;
    }
    client.properties().hardware.max_shared_memory_size
}

/// `(bn, cube count, cube dim)` of the tiled kernels for tiles of `bn` rows: one cube per (block
/// of `bn` rows, batch·head), `bn` units each.
fn tile_launch(bn: usize, plan: &Plan) -> (usize, CubeCount, CubeDim) {
    assert!(bn >= 1, "tile must be at least one row");
    let blocks = plan.seq.div_ceil(bn).max(1);
    let slices = (plan.rows / plan.seq.max(1)).max(1);
    (
        bn,
        CubeCount::Static(blocks as u32, slices as u32, 1),
        CubeDim::new_1d(bn as u32),
    )
}

/// Whether `client`'s device runs the tensor-core forward: `cmma` with f16 operands, f32
/// accumulation and the 16×16×16 shape, and planes of exactly 32 units (the kernel's cube is
/// one plane). False on lavapipe (Mesa 22.3 has no cooperative matrices) and on the CPU.
pub fn cmma_supported(client: &cubecl::client::Client) -> bool {
    cmma_supported_by(client.properties())
}

/// [`cmma_supported`] from a device's properties.
pub fn cmma_supported_by(props: &cubecl::ir::DeviceProperties) -> bool {
    use cubecl::ir::features::MmaConfig;
    use cubecl::ir::{ElemType, FloatKind};
    let f16 = ElemType::Float(FloatKind::F16);
    props.hardware.plane_size_min == 32
        && props.hardware.plane_size_max == 32
        && props.features.matmul.cmma.contains(&MmaConfig {
            a_type: f16,
            b_type: f16,
            cd_type: ElemType::Float(FloatKind::F32),
            m: 16,
            n: 16,
            k: 16,
        })
}

/// How the `Cmma`/`CmmaWide` layouts' tensor-core kernels run on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmmaPath {
    /// On the device's tensor cores ([`cmma_supported`]).
    TensorCores,
    /// On a device without that `cmma` form (lavapipe): each `cmma` product computed by the
    /// plane's units from the same f16 operands with f32 accumulation. The kernels are otherwise
    /// the ones tensor cores run (tiles, planes, online softmax, register tiles), so their logic
    /// is checked on any device; their numbers match the tensor-core path's up to f32 summation
    /// order.
    Emulated,
}

/// How [`forward`] and [`backward`] with `params` on `q`'s device and shape `[batch, heads, seq,
/// head_dim]` run the tensor-core kernels; `None` where a scalar f32 layout runs (another layout,
/// or shapes [`cmma_shapes_fit`] refuses).
pub fn cmma_path_of(q: &CubeTensor, params: &CubeAttentionParams) -> Option<CmmaPath> {
    let plan = Plan::new(dims4(q), &params.encoding);
    cmma_path(&q.client, &params.strategy, &plan)
}

/// [`cmma_path_of`] from a plan.
fn cmma_path(
    client: &cubecl::client::Client,
    strategy: &CubeStrategy,
    plan: &Plan,
) -> Option<CmmaPath> {
    let fits = matches!(
        strategy,
        CubeStrategy::Cmma { .. } | CubeStrategy::CmmaWide { .. }
    ) && cmma_shapes_fit(
        plan.w,
        plan.head_dim,
        plan.tapa.then_some((plan.amp, plan.linear)),
    );
    if !fits {
        return None;
    }
    // While capturing for CUDA, the device that counts is the CUDA one being compiled for.
    #[cfg(feature = "cuda-source")]
    let supported = match super::cuda_source::capturing() {
        Some((props, _)) => cmma_supported_by(&props),
        None => cmma_supported(client),
    };
    #[cfg(not(feature = "cuda-source"))]
    let supported = cmma_supported(client);
    Some(if supported {
        CmmaPath::TensorCores
    } else {
        CmmaPath::Emulated
    })
}

/// Shared memory of the tensor-core backward kernels with `planes` planes per cube, bytes:
/// `(attn_bwd_dq_cmma, attn_bwd_dkdv_cmma)` (f16 operand tiles, f32 score and product tiles;
/// `w` the transformed row width, `d` the head dim; `tapa` is `Some(linear_phase)` for TAPA,
/// whose quadratic phase holds a second score tile and a second `dS` tile per plane, and whose
/// linear phase holds the rows' phase sums).
pub fn cmma_bwd_shared_bytes(
    w: usize,
    d: usize,
    tapa: Option<bool>,
    planes: usize,
) -> (usize, usize) {
    let p = planes;
    // The phase sums' slot (one float unless TAPA's linear phase), padded to 32 bytes.
    let tapa_extra = match tapa {
        Some(false) => 1536 * p + 32,
        Some(true) => (4 * (16 * p + 16)).next_multiple_of(32),
        None => 32,
    };
    let dq = 32 * p * w + 32 * p * d + 32 * w + 32 * d + 512 * p + 2048 * p + 64 * p * w + 128 * p;
    let dkdv =
        32 * p * w + 32 * p * d + 32 * w + 32 * d + 1024 * p + 2048 * p + 64 * p * (w + d) + 128;
    (dq + tapa_extra, dkdv + tapa_extra)
}

/// Shared memory of the tensor-core forward `attn_fwd_cmma` with `planes` planes per cube, bytes,
/// as cubecl-cpp lays it out for CUDA (each array aligned to 32 bytes): the planes' query tiles
/// and a key and value tile in f16, each plane's `P` tile (f16), score tile(s) (f32; TAPA's
/// quadratic phase two) and `P V` product (f32), the rows' rescaling factors, and the phase
/// sums' slot (TAPA's linear phase; one float otherwise). Arguments as
/// [`cmma_bwd_shared_bytes`]'s.
pub fn cmma_fwd_shared_bytes(w: usize, d: usize, tapa: Option<bool>, planes: usize) -> usize {
    let p = planes;
    let scores = if tapa == Some(false) { 2048 } else { 1024 };
    let sums = match tapa {
        Some(true) => (4 * (16 * p + 16)).next_multiple_of(32),
        _ => 32,
    };
    32 * p * w + 32 * w + 32 * d + 512 * p + scores * p + sums + 64 * p * d + 64 * p
}

/// Planes per cube of the tensor-core forward: 1 for `Cmma`; for `CmmaWide` the largest of
/// [`CMMA_WIDE_PLANES`], 2, 1 whose kernel fits `max_shared` bytes and 48 KiB (lavapipe offers
/// 32 KiB: two planes at head_dim 64; the H200 four).
fn cmma_fwd_planes(strategy: &CubeStrategy, plan: &Plan, max_shared: usize) -> usize {
    if !matches!(strategy, CubeStrategy::CmmaWide { .. }) {
        return 1;
    }
    let budget = max_shared.min(48 * 1024);
    let tapa = plan.tapa.then_some(plan.linear);
    [CMMA_WIDE_PLANES, 2, 1]
        .into_iter()
        .find(|&p| cmma_fwd_shared_bytes(plan.w, plan.head_dim, tapa, p) <= budget)
        .unwrap_or(1)
}

/// Planes per cube of the tensor-core backward: 1 for `Cmma`; for `CmmaWide` the largest of
/// [`CMMA_WIDE_PLANES`], 2, 1 whose two kernels fit `max_shared` bytes and the 48 KiB a CUDA
/// kernel may declare statically.
fn cmma_bwd_planes(strategy: &CubeStrategy, plan: &Plan, max_shared: usize) -> usize {
    if !matches!(strategy, CubeStrategy::CmmaWide { .. }) {
        return 1;
    }
    let budget = max_shared.min(48 * 1024);
    [CMMA_WIDE_PLANES, 2, 1]
        .into_iter()
        .find(|&p| {
            let tapa = plan.tapa.then_some(plan.linear);
            let (dq, dkdv) = cmma_bwd_shared_bytes(plan.w, plan.head_dim, tapa, p);
            dq.max(dkdv) <= budget
        })
        .unwrap_or(1)
}

/// Whether `attn_fwd_cmma` takes an encoding of these shapes: `w` (the transformed row width:
/// `head_dim`, or `2·head_dim` for PoPE) and `head_dim` multiples of 16; for TAPA (`tapa =
/// Some((amp_dim, linear_phase))`) `amp_dim` a multiple of 16 too (the amplitude product on
/// tensor cores; the quadratic phase's product as well, the linear phase's row sums in f32).
/// The device is not consulted ([`cmma_supported`]).
pub fn cmma_shapes_fit(w: usize, head_dim: usize, tapa: Option<(usize, bool)>) -> bool {
    let tapa_fits = match tapa {
        None => true,
        Some((amp_dim, _)) => amp_dim % 16 == 0,
    };
    tapa_fits && w % 16 == 0 && head_dim % 16 == 0
}

fn validate(q: &CubeTensor, k: &CubeTensor, v: &CubeTensor) -> [usize; 4] {
    let shape = dims4(q);
    assert_eq!(dims4(k), shape, "k must have q's shape");
    assert_eq!(dims4(v), shape, "v must have q's shape");
    shape
}

fn prepare_encoding(enc: &CubeEncoding) -> CubeEncoding {
    match enc {
        CubeEncoding::Pope { theta, delta } => CubeEncoding::Pope {
            theta: theta.clone(),
            delta: prepare(delta.clone(), "delta"),
        },
        other => other.clone(),
    }
}

/// Causal attention forward.
///
/// `q`, `k`, `v`: `[batch, heads, seq, head_dim]` f32 on one cube device. Returns
/// `(out [batch, heads, seq, head_dim], lse [batch, heads, seq])`, `lse` in nats (log of the
/// softmax normaliser of each query row, scores as defined in the module docs). `out` is stored
/// as `q` is when `q`, `k` are token-major ([`kernel_qk`]), contiguous otherwise.
///
/// # Panics
/// On mismatched shapes, a non-f32 dtype, or encoding parameters of the wrong length.
pub fn forward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    params: &CubeAttentionParams,
) -> (CubeTensor, CubeTensor) {
    let (out, lse, _) = forward_saving(q, k, v, params);
    (out, lse)
}

/// [`forward`], with `q`, `k`, `v` as its kernels read them (see [`AttentionOutput::qkv`]).
fn forward_saving(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    params: &CubeAttentionParams,
) -> (CubeTensor, CubeTensor, [CubeTensor; 3]) {
    let shape = validate(&q, &k, &v);
    let enc = prepare_encoding(&params.encoding);
    let [q, k] = kernel_qk(q, k);
    let plan = Plan::new(shape, &enc);
    let (qt, kt, v) = transform(&q, &k, v, &enc, &plan);
    let [b, h, l, d] = shape;
    // The output in q's layout: a token-major one (the model's heads) merges its heads without a
    // copy.
    let token_major = is_token_major(&q);
    let out = empty_heads(&q, shape, token_major);
    let lse = empty_like(&q, vec![b, h, l]);
    if let Some(path) = cmma_path(&q.client, &params.strategy, &plan) {
        let planes = cmma_fwd_planes(&params.strategy, &plan, max_shared(&q.client));
        launch!(
            attn_fwd_cmma,
            &q.client,
            CubeCount::Static(l.div_ceil(16 * planes) as u32, (b * h) as u32, 1),
            CubeDim::new_1d(32 * planes as u32),
            arg(&qt),
            arg(&kt),
            arg(&v),
            arg(&out),
            arg(&lse),
            plan.seq as u32,
            h as u32,
            plan.scale,
            plan.inv_sqrt_a,
            plan.inv_sqrt_p,
            plan.alpha,
            plan.w,
            d,
            plan.tapa,
            plan.amp,
            plan.linear,
            planes,
            path == CmmaPath::Emulated,
            token_major,
        );
        return (out, lse, [q, k, v]);
    }
    match tiling(&params.strategy, &plan) {
        None => {
            let (count, dim) = launch_dims(&q, plan.rows);
            launch!(
                attn_fwd,
                &q.client,
                count,
                dim,
                arg(&qt),
                arg(&kt),
                arg(&v),
                arg(&out),
                arg(&lse),
                plan.rows as u32,
                plan.seq as u32,
                h as u32,
                plan.scale,
                plan.inv_sqrt_a,
                plan.inv_sqrt_p,
                plan.alpha,
                plan.w,
                d,
                plan.tapa,
                plan.amp,
                plan.linear,
                token_major,
            );
        }
        Some((bn, count, dim)) => {
            launch!(
                attn_fwd_tiled,
                &q.client,
                count,
                dim,
                arg(&qt),
                arg(&kt),
                arg(&v),
                arg(&out),
                arg(&lse),
                plan.seq as u32,
                h as u32,
                plan.scale,
                plan.inv_sqrt_a,
                plan.inv_sqrt_p,
                plan.alpha,
                plan.w,
                d,
                plan.tapa,
                plan.amp,
                plan.linear,
                bn,
                token_major,
            );
        }
    }
    (out, lse, [q, k, v])
}

/// The causal attention forward of CubeCL's own library kernel — cubek-attention's flash
/// attention behind burn-cubecl's `attention` op (autotuned among its tensor-core and unit
/// routines and its unfused fallback where burn-cubecl's `autotune` feature is on, as in the
/// `cuda` build; the fallback elsewhere) — on the lab's transformed rows, f16 inputs: a
/// reference for how far CubeCL itself gets on this GPU (`lab bench attention --strategy
/// library`), not a layout of [`forward`] (no `lse`, no backward).
///
/// `q̃ = scale·√w · q̃` so that the library's default `1/√w` gives the lab's score (the flash
/// routines take no scale). Returns `out [batch, heads, seq, head_dim]` (f32).
///
/// # Errors
/// TAPA (its score is not a dot product), or the library's refusal (one line).
pub fn library_forward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    params: &CubeAttentionParams,
) -> Result<CubeTensor, String> {
    use burn::backend::Scalar;
    use burn::tensor::FloatDType;
    use burn_cubecl::kernel::attention::{AttentionStrategy, attention};
    let shape = validate(&q, &k, &v);
    let (q, k, v) = (prepare(q, "q"), prepare(k, "k"), prepare(v, "v"));
    let enc = prepare_encoding(&params.encoding);
    let plan = Plan::new(shape, &enc);
    if plan.tapa {
        return Err("TAPA's score is not a dot product: no library kernel computes it".into());
    }
    let (qt, kt, v) = transform(&q, &k, v, &enc, &plan);
    let [b, h, l, _] = shape;
    let rows = |t: CubeTensor, w: usize| {
        let t = CubeBackend::float_reshape(t, Shape::from(vec![b, h, l, w]));
        CubeBackend::float_cast(t, FloatDType::F16)
    };
    let prescale = plan.scale * (plan.w as f32).sqrt();
    let qt = CubeBackend::float_mul_scalar(qt, Scalar::new(prescale, &DType::F32));
    let (qt, kt, v) = (rows(qt, plan.w), rows(kt, plan.w), rows(v, plan.head_dim));
    let options = burn::backend::ops::AttentionModuleOptions {
        scale: Some(1.0 / (plan.w as f64).sqrt()),
        softcap: None,
        is_causal: true,
    };
    let out = attention(qt, kt, v, None, None, options, AttentionStrategy::default())
        .map_err(|e| format!("the library attention refused: {e:?}"))?;
    Ok(CubeBackend::float_cast(out, FloatDType::F32))
}

/// Causal attention backward.
///
/// `q`, `k`, `v`, `out`, `dout`: `[batch, heads, seq, head_dim]`; `lse`: `[batch, heads, seq]`,
/// both from [`forward`] with the same `params`. Returns `dq`, `dk`, `dv` like `q`, and for PoPE
/// `dδ` `[heads · head_dim]` (summed over batch and positions).
pub fn backward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    out: CubeTensor,
    lse: CubeTensor,
    dout: CubeTensor,
    params: &CubeAttentionParams,
) -> CubeGrads {
    let shape = validate(&q, &k, &v);
    assert_eq!(dims4(&out), shape, "out must have q's shape");
    assert_eq!(dims4(&dout), shape, "dout must have q's shape");
    let [b, h, l, d] = shape;
    assert_eq!(
        lse.shape().num_elements(),
        b * h * l,
        "lse must be [batch, heads, seq]"
    );
    let enc = prepare_encoding(&params.encoding);
    let [q, k] = kernel_qk(q, k);
    let token_major = is_token_major(&q);
    // The forward's output in q's layout ([`forward`]): read in place by `row_dot`.
    let out = if token_major && is_token_major(&out) {
        out
    } else {
        prepare(out, "out")
    };
    let out_token_major = is_token_major(&out);
    let (v, lse) = (prepare(v, "v"), prepare(lse, "lse"));
    let plan = Plan::new(shape, &enc);
    let (qt, kt, dout) = transform(&q, &k, dout, &enc, &plan);
    let (count, dim) = launch_dims(&q, plan.rows);
    let client = q.client.clone();
    let (rows, seq) = (plan.rows as u32, plan.seq as u32);

    let delta = empty_like(&q, vec![plan.rows]);
    launch!(
        row_dot,
        &client,
        count.clone(),
        dim,
        arg(&dout),
        arg(&out),
        arg(&delta),
        rows,
        seq,
        h as u32,
        d,
        out_token_major,
    );

    let dqt = empty_like(&q, vec![plan.rows, plan.w]);
    let dkt = empty_like(&q, vec![plan.rows, plan.w]);
    let dv = empty_like(&q, vec![b, h, l, d]);
    // The tensor-core backward takes what the tensor-core forward takes (`cmma_shapes_fit`).
    if let Some(path) = cmma_path(&client, &params.strategy, &plan) {
        let planes = cmma_bwd_planes(&params.strategy, &plan, max_shared(&client));
        let count = CubeCount::Static(l.div_ceil(16 * planes) as u32, (b * h) as u32, 1);
        let dim = CubeDim::new_1d(32 * planes as u32);
        let emulate = path == CmmaPath::Emulated;
        launch!(
            attn_bwd_dq_cmma,
            &client,
            count.clone(),
            dim,
            arg(&qt),
            arg(&kt),
            arg(&v),
            arg(&dout),
            arg(&lse),
            arg(&delta),
            arg(&dqt),
            seq,
            plan.scale,
            plan.inv_sqrt_a,
            plan.inv_sqrt_p,
            plan.alpha,
            plan.w,
            d,
            plan.tapa,
            plan.amp,
            plan.linear,
            planes,
            emulate,
        );
        launch!(
            attn_bwd_dkdv_cmma,
            &client,
            count,
            dim,
            arg(&qt),
            arg(&kt),
            arg(&v),
            arg(&dout),
            arg(&lse),
            arg(&delta),
            arg(&dkt),
            arg(&dv),
            seq,
            plan.scale,
            plan.inv_sqrt_a,
            plan.inv_sqrt_p,
            plan.alpha,
            plan.w,
            d,
            plan.tapa,
            plan.amp,
            plan.linear,
            planes,
            emulate,
        );
    } else {
        match tiling(&params.strategy, &plan) {
            None => {
                launch!(
                    attn_bwd_dq,
                    &client,
                    count.clone(),
                    dim,
                    arg(&qt),
                    arg(&kt),
                    arg(&v),
                    arg(&dout),
                    arg(&lse),
                    arg(&delta),
                    arg(&dqt),
                    rows,
                    seq,
                    plan.scale,
                    plan.inv_sqrt_a,
                    plan.inv_sqrt_p,
                    plan.alpha,
                    plan.w,
                    d,
                    plan.tapa,
                    plan.amp,
                    plan.linear,
                );
                launch!(
                    attn_bwd_dkdv,
                    &client,
                    count.clone(),
                    dim,
                    arg(&qt),
                    arg(&kt),
                    arg(&v),
                    arg(&dout),
                    arg(&lse),
                    arg(&delta),
                    arg(&dkt),
                    arg(&dv),
                    rows,
                    seq,
                    plan.scale,
                    plan.inv_sqrt_a,
                    plan.inv_sqrt_p,
                    plan.alpha,
                    plan.w,
                    d,
                    plan.tapa,
                    plan.amp,
                    plan.linear,
                );
            }
            Some((bn, tcount, tdim)) => {
                let stage = matches!(params.strategy, CubeStrategy::TiledStaged { .. });
                let (bn, tcount, tdim) = match params.strategy {
                    CubeStrategy::TiledStaged { tile: None } => {
                        tile_launch(auto_tile_staged(plan.w, d, max_shared(&client)), &plan)
                    }
                    _ => (bn, tcount, tdim),
                };
                launch!(
                    attn_bwd_dq_tiled,
                    &client,
                    tcount.clone(),
                    tdim,
                    arg(&qt),
                    arg(&kt),
                    arg(&v),
                    arg(&dout),
                    arg(&lse),
                    arg(&delta),
                    arg(&dqt),
                    seq,
                    plan.scale,
                    plan.inv_sqrt_a,
                    plan.inv_sqrt_p,
                    plan.alpha,
                    plan.w,
                    d,
                    plan.tapa,
                    plan.amp,
                    plan.linear,
                    bn,
                    stage,
                );
                // Tiled: one launch writes both; TiledSplit: `dv`, then `dk` (the type's docs).
                let parts: &[(bool, bool)] = match params.strategy {
                    CubeStrategy::TiledSplit { .. } => &[(false, true), (true, false)],
                    _ => &[(true, true)],
                };
                for &(with_dk, with_dv) in parts {
                    launch!(
                        attn_bwd_dkdv_tiled,
                        &client,
                        tcount.clone(),
                        tdim,
                        arg(&qt),
                        arg(&kt),
                        arg(&v),
                        arg(&dout),
                        arg(&lse),
                        arg(&delta),
                        arg(&dkt),
                        arg(&dv),
                        seq,
                        plan.scale,
                        plan.inv_sqrt_a,
                        plan.inv_sqrt_p,
                        plan.alpha,
                        plan.w,
                        d,
                        plan.tapa,
                        plan.amp,
                        plan.linear,
                        bn,
                        with_dk,
                        with_dv,
                        stage,
                    );
                }
            }
        }
    }

    let reshape = |t: CubeTensor| -> CubeTensor {
        CubeBackend::float_reshape(t, Shape::from(vec![b, h, l, d]))
    };
    let rotates = enc.rotates();
    if !rotates && !token_major {
        // NoPE's and TAPA's gradients as the kernels wrote them: no launch.
        return CubeGrads {
            dq: reshape(dqt),
            dk: reshape(dkt),
            dv,
            ddelta: None,
        };
    }
    // The rotations' inverse (NoPE's and TAPA's `copy_rows`) writes dq, dk in q's layout and,
    // when that is token-major, copies dv into it in the same launch: the model merges the heads
    // again without a copy launch of its own. `dv_out` is written only then: a one-element
    // stand-in otherwise.
    let (dv_rows, dv, dv_out) = if token_major {
        let t = empty_heads(&q, shape, true);
        (dv, t.clone(), t)
    } else {
        (dv.clone(), dv, empty_like(&q, vec![1]))
    };
    let sets = if token_major { 3 } else { 2 };
    match &enc {
        CubeEncoding::Nope | CubeEncoding::Tapa { .. } => {
            let (dq, dk) = (empty_heads(&q, shape, true), empty_heads(&k, shape, true));
            launch!(
                copy_rows,
                &client,
                launch_dims(&q, sets * plan.rows).0,
                dim,
                arg(&dqt),
                arg(&dkt),
                arg(&dv_rows),
                arg(&dq),
                arg(&dk),
                arg(&dv_out),
                rows,
                seq,
                h as u32,
                d,
                false,
                true,
                true,
            );
            CubeGrads {
                dq,
                dk,
                dv,
                ddelta: None,
            }
        }
        CubeEncoding::Rope {
            inv_freq,
            layout,
            attention_factor,
        } => {
            let freqs = upload(&q, inv_freq);
            // dq, dk in q's layout: token-major ones need no copy to merge the heads again.
            let (dq, dk) = (
                empty_heads(&dqt, shape, token_major),
                empty_heads(&dkt, shape, token_major),
            );
            launch!(
                rope_rotate,
                &client,
                launch_dims(&q, sets * plan.rows).0,
                dim,
                arg(&dqt),
                arg(&dkt),
                arg(&dv_rows),
                arg(&freqs),
                arg(&dq),
                arg(&dk),
                arg(&dv_out),
                rows,
                seq,
                h as u32,
                *attention_factor as f32,
                d,
                2 * inv_freq.len(),
                *layout == PairLayout::Adjacent,
                true,
                false,
                token_major,
                token_major,
            );
            CubeGrads {
                dq,
                dk,
                dv,
                ddelta: None,
            }
        }
        CubeEncoding::Pope { theta, delta } => {
            let theta = upload(&q, theta);
            let heads = (delta.shape().num_elements() / d) as u32;
            let dphase = empty_like(&q, vec![b, h, l, d]);
            let (dq, dk) = (
                empty_heads(&q, shape, token_major),
                empty_heads(&k, shape, token_major),
            );
            launch!(
                pope_prep_bwd,
                &client,
                launch_dims(&q, sets * plan.rows).0,
                dim,
                arg(&q),
                arg(&k),
                arg(&theta),
                arg(delta),
                arg(&dqt),
                arg(&dkt),
                arg(&dv_rows),
                arg(&dq),
                arg(&dk),
                arg(&dv_out),
                arg(&dphase),
                rows,
                seq,
                heads,
                d,
                token_major,
                token_major,
            );
            // dδ[h, c] = Σ_{b, j} dphase[b, h, j, c].
            let s = CubeBackend::float_sum_dim(dphase, 2);
            let s = CubeBackend::float_sum_dim(s, 0);
            let ddelta = CubeBackend::float_reshape(s, Shape::from(vec![h * d]));
            CubeGrads {
                dq,
                dk,
                dv,
                ddelta: Some(ddelta),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Backend extension: the cube kernels behind `crate::kernels::fused::FusedAttentionBackend`
// ---------------------------------------------------------------------------------------------

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;

use super::cpu::KernelEncoding;
use super::fused::FusedAttentionBackend;
use super::pointwise::{FusedLossBackend, FusedPointwiseBackend};

impl CubeAttentionParams {
    /// The cube parameters of the CPU kernels' encoding; `delta` is PoPE's phase bias
    /// `[heads · head_dim]` (required for PoPE, ignored otherwise).
    ///
    /// # Panics
    /// PoPE without `delta`.
    pub fn from_kernel_encoding(encoding: KernelEncoding, delta: Option<CubeTensor>) -> Self {
        let encoding = match encoding {
            KernelEncoding::Nope => CubeEncoding::Nope,
            KernelEncoding::Rope {
                inv_freq,
                layout,
                attention_factor,
            } => CubeEncoding::Rope {
                inv_freq,
                layout,
                attention_factor,
            },
            KernelEncoding::Pope { theta } => CubeEncoding::Pope {
                theta,
                delta: delta.expect("PoPE attention needs delta"),
            },
            KernelEncoding::Tapa {
                amp_dim,
                alpha,
                phase,
                phase_gain,
            } => CubeEncoding::Tapa {
                amp_dim,
                alpha,
                phase,
                phase_gain,
            },
        };
        Self::new(encoding)
    }
}

/// The CubeCL backends the extension is implemented for: burn's unfused [`CubeBackend`], and
/// (feature `fusion`, which `cuda` turns on) `Fusion<CubeBackend>`.
///
/// On `CubeBackend` the attention kernels run when the op is called. On `Fusion<CubeBackend>`
/// [`CubePrimitives::attention_forward`] and [`CubePrimitives::attention_backward`] are
/// registered in burn's fusion stream as one custom operation each (lazy, like burn's own
/// operations): the kernels run when the stream reaches them, and the stream is not drained at
/// each call (the host's share of a small training step fell by 40 % on lavapipe:
/// docs/performance.md, "One fusion block per stretch, and the attention in the stream");
/// `LAB_FUSION_ATTENTION=eager` restores the draining path
/// ([`super::fusion_config::AttentionMode`]).
pub trait CubePrimitives: burn::backend::Backend {
    /// The device tensor behind a float primitive of this backend (on `Fusion`: the stream is
    /// drained up to it).
    fn to_cube(t: FloatTensor<Self>) -> CubeTensor;
    /// A float primitive of this backend holding `t`.
    fn from_cube(t: CubeTensor) -> FloatTensor<Self>;

    /// [`forward`] on this backend's tensors, from `q`, `k`, `v` `[batch, heads, seq, head_dim]`
    /// f32 and, for PoPE, `delta` `[heads · head_dim]`.
    ///
    /// # Panics
    /// As [`forward`]: mismatched shapes, a non-f32 dtype, PoPE without `delta`.
    fn attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        delta: Option<FloatTensor<Self>>,
        spec: &AttentionSpec,
    ) -> AttentionOutput<Self> {
        eager_forward::<Self>(q, k, v, delta, spec)
    }

    /// [`backward`] on this backend's tensors: `[dq, dk, dv]` like `q`, then PoPE's `dδ`
    /// `[heads · head_dim]`.
    fn attention_backward(
        saved: AttentionSaved<Self>,
        dout: FloatTensor<Self>,
    ) -> Vec<FloatTensor<Self>> {
        eager_backward::<Self>(saved, dout)
    }

    /// [`step_stats`] on this backend's tensors: `[loss, correct, Σ g²]` and the clip factor
    /// from the gradients (any shapes, f32), the loss and the correct count (`[1]` each). On
    /// `Fusion` one lazy operation in the stream, like the attention's, so the step is not
    /// drained.
    fn step_stats(
        grads: Vec<FloatTensor<Self>>,
        loss: FloatTensor<Self>,
        correct: FloatTensor<Self>,
        max_norm: f32,
    ) -> StepStats<FloatTensor<Self>> {
        let s = step_stats(
            grads.into_iter().map(Self::to_cube).collect(),
            Self::to_cube(loss),
            Self::to_cube(correct),
            max_norm,
        );
        StepStats {
            stats: Self::from_cube(s.stats),
            clip: Self::from_cube(s.clip),
        }
    }

    /// [`adamw_update`] on this backend's tensors: `[x', m', v']` from the parameter, its
    /// gradient, its moments (`None` on the first step) and the gradients' scale. On `Fusion` one
    /// lazy operation in the stream per parameter.
    fn adamw_update(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        scale: UpdateScale<FloatTensor<Self>>,
        hyper: &AdamWHyper,
    ) -> [FloatTensor<Self>; 3] {
        let scale = match scale {
            UpdateScale::Host(s) => UpdateScale::Host(s),
            UpdateScale::Device(s) => UpdateScale::Device(Self::to_cube(s)),
        };
        adamw_update(
            Self::to_cube(x),
            Self::to_cube(grad),
            moments.map(|(m, v)| (Self::to_cube(m), Self::to_cube(v))),
            scale,
            hyper,
        )
        .map(Self::from_cube)
    }

    /// [`gelu_forward`] on this backend's tensors (on `Fusion` one lazy operation).
    fn gelu_fwd(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::from_cube(gelu_forward(Self::to_cube(x)))
    }

    /// [`gelu_backward`] on this backend's tensors (on `Fusion` one lazy operation).
    fn gelu_bwd(x: FloatTensor<Self>, dy: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::from_cube(gelu_backward(Self::to_cube(x), Self::to_cube(dy)))
    }

    /// [`rms_norm_forward`] on this backend's tensors: `(y, inv)` (on `Fusion` one lazy
    /// operation).
    fn rms_norm_fwd(
        x: FloatTensor<Self>,
        gain: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (y, inv) = rms_norm_forward(Self::to_cube(x), Self::to_cube(gain));
        (Self::from_cube(y), Self::from_cube(inv))
    }

    /// [`rms_norm_backward`] on this backend's tensors: `(dx, dgain)` (on `Fusion` one lazy
    /// operation).
    fn rms_norm_bwd(
        x: FloatTensor<Self>,
        gain: FloatTensor<Self>,
        inv: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dx, dg) = rms_norm_backward(
            Self::to_cube(x),
            Self::to_cube(gain),
            Self::to_cube(inv),
            Self::to_cube(dy),
        );
        (Self::from_cube(dx), Self::from_cube(dg))
    }

    /// [`xent_forward`] on this backend's tensors: `(loss, correct)` per row (on `Fusion` one
    /// lazy operation).
    fn xent_fwd(
        logits: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        mask: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (loss, correct) = xent_forward(
            Self::to_cube(logits),
            Self::to_cube(targets),
            Self::to_cube(mask),
        );
        (Self::from_cube(loss), Self::from_cube(correct))
    }

    /// [`xent_backward`] on this backend's tensors (on `Fusion` one lazy operation).
    fn xent_bwd(
        logits: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        mask: FloatTensor<Self>,
        dloss: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::from_cube(xent_backward(
            Self::to_cube(logits),
            Self::to_cube(targets),
            Self::to_cube(mask),
            Self::to_cube(dloss),
        ))
    }
}

/// What [`CubePrimitives::attention_forward`] returns.
#[derive(Clone, Debug)]
pub struct AttentionOutput<B: burn::backend::Backend> {
    /// `[batch, heads, seq, head_dim]`.
    pub out: FloatTensor<B>,
    /// Log-sum-exp of each query row, `[batch, heads, seq]`, nats.
    pub lse: FloatTensor<B>,
    /// `q`, `k`, `v` as the backward should be given them: token-major `q`, `k` as they are (the
    /// model's heads split by `swap_dims`, [`kernel_qk`]: the backward's first launch reads them,
    /// and their layout is the gradients'), other strided ones as contiguous copies; `v` as the
    /// kernels read it, a contiguous copy of a strided one (made by [`prepare`] or, token-major,
    /// by the first launch), so that the backward does not copy it again.
    pub qkv: [FloatTensor<B>; 3],
}

/// [`CubePrimitives::attention_forward`] run now, on the inputs resolved to device tensors.
fn eager_forward<B: CubePrimitives>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    delta: Option<FloatTensor<B>>,
    spec: &AttentionSpec,
) -> AttentionOutput<B> {
    let params = spec.params(delta.map(B::to_cube));
    let (out, lse, qkv) = forward_saving(B::to_cube(q), B::to_cube(k), B::to_cube(v), &params);
    AttentionOutput {
        out: B::from_cube(out),
        lse: B::from_cube(lse),
        qkv: qkv.map(B::from_cube),
    }
}

/// [`CubePrimitives::attention_backward`] run now, on the inputs resolved to device tensors.
fn eager_backward<B: CubePrimitives>(
    saved: AttentionSaved<B>,
    dout: FloatTensor<B>,
) -> Vec<FloatTensor<B>> {
    let params = saved.spec.params(saved.delta.map(B::to_cube));
    let g = backward(
        B::to_cube(saved.q),
        B::to_cube(saved.k),
        B::to_cube(saved.v),
        B::to_cube(saved.out),
        B::to_cube(saved.lse),
        B::to_cube(dout),
        &params,
    );
    let mut grads = vec![g.dq, g.dk, g.dv];
    grads.extend(g.ddelta);
    grads.into_iter().map(B::from_cube).collect()
}

/// The attention op's settings besides its tensors: the encoding (PoPE's δ is a tensor input of
/// the op, not part of it) and the kernel layout, fixed when the op is called.
#[derive(Clone, Debug)]
pub struct AttentionSpec {
    /// The encoding, as the CPU kernels take it.
    pub encoding: KernelEncoding,
    /// Kernel layout.
    pub strategy: CubeStrategy,
}

impl AttentionSpec {
    /// `encoding` with the layout [`default_strategy`] gives now.
    pub fn new(encoding: KernelEncoding) -> Self {
        Self {
            encoding,
            strategy: default_strategy(),
        }
    }

    /// The kernels' parameters, with PoPE's `delta` once it is a device tensor.
    ///
    /// # Panics
    /// PoPE without `delta`.
    fn params(&self, delta: Option<CubeTensor>) -> CubeAttentionParams {
        let mut params = CubeAttentionParams::from_kernel_encoding(self.encoding.clone(), delta);
        params.strategy = self.strategy;
        params
    }
}

/// What the attention backward needs, saved by the forward under autodiff (this backend's
/// tensors: on `Fusion`, lazy ones).
#[derive(Clone, Debug)]
pub struct AttentionSaved<B: burn::backend::Backend> {
    /// `[batch, heads, seq, head_dim]`.
    pub q: FloatTensor<B>,
    /// `[batch, heads, seq, head_dim]`.
    pub k: FloatTensor<B>,
    /// `[batch, heads, seq, head_dim]`.
    pub v: FloatTensor<B>,
    /// The forward's output, `[batch, heads, seq, head_dim]`.
    pub out: FloatTensor<B>,
    /// The forward's log-sum-exp, `[batch, heads, seq]`, nats.
    pub lse: FloatTensor<B>,
    /// PoPE's phase bias `[heads · head_dim]`; `None` otherwise.
    pub delta: Option<FloatTensor<B>>,
    /// Encoding and layout.
    pub spec: AttentionSpec,
}

/// Host `values` (row-major f32) of shape `shape` as a kernel tensor on a `wgpu` or `cuda`
/// `device`, through burn's `Cube` backend (fused or not): inputs for [`forward`] and
/// [`backward`] called directly (`lab selfcheck`, the wgpu tests).
///
/// # Panics
/// If `device` is not a CubeCL device or `values.len()` is not the product of `shape`.
pub fn host_to_cube<const N: usize>(
    values: &[f32],
    shape: [usize; N],
    device: &burn::tensor::Device,
) -> CubeTensor {
    use burn::tensor::{Tensor, TensorData};
    <burn::backend::Cube as CubePrimitives>::to_cube(
        Tensor::<N>::from_data(TensorData::new(values.to_vec(), shape), device)
            .try_into_primitive::<burn::backend::Cube>()
            .expect("a wgpu or cuda tensor is a Cube primitive"),
    )
}

/// A kernel tensor's values on the host, row-major f32, whatever its rank (1 to 4).
///
/// # Panics
/// If the kernel launch or the read failed, or on another rank.
pub fn cube_to_host(t: CubeTensor) -> Vec<f32> {
    try_cube_to_host(t).unwrap_or_else(|e| panic!("{e}"))
}

/// [`cube_to_host`] with a failed launch or read (a device out of memory, a kernel the device
/// refused) as an error: its first line.
///
/// # Panics
/// On a rank other than 1 to 4.
pub fn try_cube_to_host(t: CubeTensor) -> Result<Vec<f32>, String> {
    use burn::tensor::Tensor;
    type C = burn::backend::Cube;
    let rank = t.shape().num_dims();
    let t = <C as CubePrimitives>::from_cube(t);
    let data = match rank {
        1 => Tensor::<1>::from_primitive::<C>(t).try_into_data(),
        2 => Tensor::<2>::from_primitive::<C>(t).try_into_data(),
        3 => Tensor::<3>::from_primitive::<C>(t).try_into_data(),
        4 => Tensor::<4>::from_primitive::<C>(t).try_into_data(),
        r => panic!("cube_to_host: rank {r} tensor (1 to 4 supported)"),
    };
    let data = data.map_err(|e| {
        // The first line says what failed, the last the innermost cause (burn's error chain).
        let text = format!("{e}");
        let boilerplate = [
            "Caused by:",
            "Backtrace",
            "No backtrace available",
            "Asked at:",
        ];
        let mut lines = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !boilerplate.contains(l));
        let first = lines.next().unwrap_or("no message");
        match lines.last() {
            Some(cause) => format!("kernel launch or read failed: {first} ({cause})"),
            None => format!("kernel launch or read failed: {first}"),
        }
    })?;
    Ok(data.try_to_vec::<f32>().expect("f32 kernel output"))
}

impl CubePrimitives for CubeBackend {
    fn to_cube(t: FloatTensor<Self>) -> CubeTensor {
        t
    }
    fn from_cube(t: CubeTensor) -> FloatTensor<Self> {
        t
    }
}

#[cfg(feature = "fusion")]
type FusionCube = burn::backend::fusion::Fusion<CubeBackend>;

/// Shape `[batch, heads, seq, head_dim]` of `q`, checked against `k` and `v` on the calling
/// thread (a lazy operation's kernels run on burn-fusion's device thread, where a panic would
/// not reach the caller).
#[cfg(feature = "fusion")]
fn lazy_dims(
    q: &FloatTensor<FusionCube>,
    k: &FloatTensor<FusionCube>,
    v: &FloatTensor<FusionCube>,
) -> [usize; 4] {
    let dims: &[usize] = &q.shape;
    let [b, h, l, d] = dims else {
        panic!("attention needs q [batch, heads, seq, head_dim], got {dims:?}");
    };
    assert_eq!(k.shape, q.shape, "k must have q's shape");
    assert_eq!(v.shape, q.shape, "v must have q's shape");
    for t in [q, k, v] {
        assert_eq!(
            t.dtype,
            DType::F32,
            "attention kernels need f32, got {:?}",
            t.dtype
        );
    }
    [*b, *h, *l, *d]
}

/// Register `run` in burn's fusion stream as one custom operation `id` reading `inputs` and
/// writing f32 tensors of `output_shapes` (in `run`'s order). Returns the lazy outputs; `run`
/// gets the inputs as device tensors when the stream executes it (burn-fusion's device thread).
#[cfg(feature = "fusion")]
fn register_lazy(
    id: &str,
    inputs: Vec<FloatTensor<FusionCube>>,
    output_shapes: Vec<Shape>,
    run: impl Fn(Vec<CubeTensor>) -> Vec<CubeTensor> + Send + Sync + 'static,
) -> Vec<FloatTensor<FusionCube>> {
    use burn::backend::fusion::custom::{
        CustomOpIr, HandleContainer, OperationFn, OperationIr, StreamId, TensorIr,
    };
    use burn::backend::fusion::{FusionBackend, FusionRuntime};
    type Handles = HandleContainer<
        <<CubeBackend as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle,
    >;
    let client = inputs[0].client.clone();
    let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let outputs: Vec<TensorIr> = output_shapes
        .into_iter()
        .map(|shape| TensorIr::uninit(client.create_empty_handle(), shape, DType::F32))
        .collect();
    let desc = CustomOpIr {
        id: id.to_string(),
        inputs: inputs.clone(),
        outputs: outputs.clone(),
        scalars: Vec::new(),
    };
    let op = OperationFn(move |handles: &mut Handles| {
        let tensors = inputs
            .iter()
            .map(|ir| handles.get_float_tensor::<CubeBackend>(ir))
            .collect();
        for (ir, t) in outputs.iter().zip(run(tensors)) {
            handles.register_float_tensor::<CubeBackend>(&ir.id, t);
        }
        Ok(())
    });
    client.register(StreamId::current(), OperationIr::Custom(desc), op)
}

#[cfg(feature = "fusion")]
impl CubePrimitives for FusionCube {
    fn to_cube(t: FloatTensor<Self>) -> CubeTensor {
        let client = t.client.clone();
        client.resolve_tensor_float::<CubeBackend>(t)
    }
    fn from_cube(t: CubeTensor) -> FloatTensor<Self> {
        use burn::backend::StreamId;
        use burn::backend::fusion::{NoOp, get_client};
        use burn::backend::ir::{BackendIr, InitOperationIr, OperationIr, OperationOutput};
        let client = get_client::<CubeBackend>(&t.device);
        let (shape, dtype) = (t.shape(), t.dtype);
        let handle = CubeBackend::float_tensor_handle(t);
        let desc = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
        client
            .register(
                StreamId::current(),
                OperationIr::Init(desc),
                NoOp::<CubeBackend>::new(),
            )
            .output()
    }

    fn attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        delta: Option<FloatTensor<Self>>,
        spec: &AttentionSpec,
    ) -> AttentionOutput<Self> {
        if super::fusion_config::attention_mode() == super::fusion_config::AttentionMode::Eager {
            return eager_forward::<Self>(q, k, v, delta, spec);
        }
        let [b, h, l, _] = lazy_dims(&q, &k, &v);
        let shape = q.shape.clone();
        let output_shapes = vec![
            shape.clone(),
            Shape::from(vec![b, h, l]),
            shape.clone(),
            shape.clone(),
            shape,
        ];
        let mut inputs = vec![q, k, v];
        inputs.extend(delta);
        let spec = spec.clone();
        let mut outputs = register_lazy("lab_attention_forward", inputs, output_shapes, move |t| {
            let params = spec.params(t.get(3).cloned());
            let (out, lse, [q, k, v]) =
                forward_saving(t[0].clone(), t[1].clone(), t[2].clone(), &params);
            vec![out, lse, q, k, v]
        })
        .into_iter();
        let mut next = || outputs.next().expect("five outputs");
        AttentionOutput {
            out: next(),
            lse: next(),
            qkv: [next(), next(), next()],
        }
    }

    fn attention_backward(
        saved: AttentionSaved<Self>,
        dout: FloatTensor<Self>,
    ) -> Vec<FloatTensor<Self>> {
        if super::fusion_config::attention_mode() == super::fusion_config::AttentionMode::Eager {
            return eager_backward::<Self>(saved, dout);
        }
        lazy_dims(&saved.q, &saved.k, &saved.v);
        assert_eq!(dout.shape, saved.q.shape, "dout must have q's shape");
        let mut output_shapes = vec![saved.q.shape.clone(); 3];
        output_shapes.extend(saved.delta.as_ref().map(|d| d.shape.clone()));
        let mut inputs = vec![saved.q, saved.k, saved.v, saved.out, saved.lse, dout];
        inputs.extend(saved.delta);
        let spec = saved.spec;
        register_lazy("lab_attention_backward", inputs, output_shapes, move |t| {
            let params = spec.params(t.get(6).cloned());
            let g = backward(
                t[0].clone(),
                t[1].clone(),
                t[2].clone(),
                t[3].clone(),
                t[4].clone(),
                t[5].clone(),
                &params,
            );
            let mut grads = vec![g.dq, g.dk, g.dv];
            grads.extend(g.ddelta);
            grads
        })
    }

    fn step_stats(
        grads: Vec<FloatTensor<Self>>,
        loss: FloatTensor<Self>,
        correct: FloatTensor<Self>,
        max_norm: f32,
    ) -> StepStats<FloatTensor<Self>> {
        for t in grads.iter().chain([&loss, &correct]) {
            assert_eq!(
                t.dtype,
                DType::F32,
                "step statistics: the cube kernels take f32"
            );
        }
        let n_grads = grads.len();
        let mut inputs = grads;
        inputs.extend([loss, correct]);
        let mut out = register_lazy(
            "lab_step_stats",
            inputs,
            vec![Shape::from(vec![3]), Shape::from(vec![1])],
            move |mut t| {
                let correct = t.pop().expect("correct");
                let loss = t.pop().expect("loss");
                debug_assert_eq!(t.len(), n_grads);
                let s = step_stats(t, loss, correct, max_norm);
                vec![s.stats, s.clip]
            },
        );
        let clip = out.pop().expect("two outputs");
        let stats = out.pop().expect("two outputs");
        StepStats { stats, clip }
    }

    fn adamw_update(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        scale: UpdateScale<FloatTensor<Self>>,
        hyper: &AdamWHyper,
    ) -> [FloatTensor<Self>; 3] {
        let shape = x.shape.clone();
        let first = moments.is_none();
        let mut inputs = vec![x, grad];
        if let Some((m, v)) = moments {
            inputs.extend([m, v]);
        }
        let host_scale = match scale {
            UpdateScale::Host(s) => Some(s),
            UpdateScale::Device(s) => {
                inputs.push(s);
                None
            }
        };
        for t in &inputs {
            assert_eq!(t.dtype, DType::F32, "AdamW: the cube kernels take f32");
        }
        let hyper = *hyper;
        let out = register_lazy("lab_adamw", inputs, vec![shape; 3], move |mut t| {
            let scale = match host_scale {
                Some(s) => UpdateScale::Host(s),
                None => UpdateScale::Device(t.pop().expect("the scale")),
            };
            let moments = (!first).then(|| (t[2].clone(), t[3].clone()));
            adamw_update(t[0].clone(), t[1].clone(), moments, scale, &hyper).to_vec()
        });
        out.try_into().expect("three outputs")
    }

    fn gelu_fwd(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let shape = x.shape.clone();
        let mut out = register_lazy("lab_gelu", vec![x], vec![shape], |t| {
            vec![gelu_forward(t[0].clone())]
        });
        out.pop().expect("one output")
    }

    fn gelu_bwd(x: FloatTensor<Self>, dy: FloatTensor<Self>) -> FloatTensor<Self> {
        let shape = x.shape.clone();
        let mut out = register_lazy("lab_gelu_backward", vec![x, dy], vec![shape], |t| {
            vec![gelu_backward(t[0].clone(), t[1].clone())]
        });
        out.pop().expect("one output")
    }

    fn rms_norm_fwd(
        x: FloatTensor<Self>,
        gain: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let shape = x.shape.clone();
        let d = *shape.last().expect("rms_norm: x has at least one axis");
        let rows = shape.num_elements() / d.max(1);
        let mut out = register_lazy(
            "lab_rms_norm",
            vec![x, gain],
            vec![shape, Shape::from(vec![rows])],
            |t| {
                let (y, inv) = rms_norm_forward(t[0].clone(), t[1].clone());
                vec![y, inv]
            },
        );
        let inv = out.pop().expect("two outputs");
        (out.pop().expect("two outputs"), inv)
    }

    fn rms_norm_bwd(
        x: FloatTensor<Self>,
        gain: FloatTensor<Self>,
        inv: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let shapes = vec![x.shape.clone(), gain.shape.clone()];
        let mut out = register_lazy(
            "lab_rms_norm_backward",
            vec![x, gain, inv, dy],
            shapes,
            |t| {
                let (dx, dg) =
                    rms_norm_backward(t[0].clone(), t[1].clone(), t[2].clone(), t[3].clone());
                vec![dx, dg]
            },
        );
        let dg = out.pop().expect("two outputs");
        (out.pop().expect("two outputs"), dg)
    }

    fn xent_fwd(
        logits: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        mask: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let shapes = vec![targets.shape.clone(), targets.shape.clone()];
        let mut out = register_lazy("lab_xent", vec![logits, targets, mask], shapes, |t| {
            let (loss, correct) = xent_forward(t[0].clone(), t[1].clone(), t[2].clone());
            vec![loss, correct]
        });
        let correct = out.pop().expect("two outputs");
        (out.pop().expect("two outputs"), correct)
    }

    fn xent_bwd(
        logits: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        mask: FloatTensor<Self>,
        dloss: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let shape = logits.shape.clone();
        let mut out = register_lazy(
            "lab_xent_backward",
            vec![logits, targets, mask, dloss],
            vec![shape],
            |t| {
                vec![xent_backward(
                    t[0].clone(),
                    t[1].clone(),
                    t[2].clone(),
                    t[3].clone(),
                )]
            },
        );
        out.pop().expect("one output")
    }
}

macro_rules! impl_plain_extension {
    ($backend:ty) => {
        impl FusedAttentionBackend for $backend {
            fn fused_attention(
                q: FloatTensor<Self>,
                k: FloatTensor<Self>,
                v: FloatTensor<Self>,
                encoding: KernelEncoding,
            ) -> FloatTensor<Self> {
                let spec = AttentionSpec::new(encoding);
                <Self as CubePrimitives>::attention_forward(q, k, v, None, &spec).out
            }

            fn fused_pope_attention(
                q: FloatTensor<Self>,
                k: FloatTensor<Self>,
                v: FloatTensor<Self>,
                delta: FloatTensor<Self>,
                theta: Vec<f64>,
            ) -> FloatTensor<Self> {
                let spec = AttentionSpec::new(KernelEncoding::Pope { theta });
                <Self as CubePrimitives>::attention_forward(q, k, v, Some(delta), &spec).out
            }
        }
    };
}

impl_plain_extension!(CubeBackend);
#[cfg(feature = "fusion")]
impl_plain_extension!(FusionCube);

/// The registered backward of the cube attention on backend `B` (`N` = 3 parents q, k, v, or 4
/// with PoPE's δ).
struct CubeAttentionBackward<B>(core::marker::PhantomData<B>);

impl<B> core::fmt::Debug for CubeAttentionBackward<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("CubeAttentionBackward")
    }
}

impl<B: CubePrimitives, const N: usize> Backward<B, N> for CubeAttentionBackward<B> {
    type State = AttentionSaved<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dout = grads.consume::<B>(&ops.node);
        let values = B::attention_backward(ops.state, dout);
        for (node, grad) in ops.parents.into_iter().zip(values) {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

fn autodiff_attention<B: CubePrimitives, C: CheckpointStrategy, const N: usize>(
    inputs: [FloatTensor<Autodiff<B, C>>; N],
    spec: AttentionSpec,
) -> FloatTensor<Autodiff<B, C>> {
    let nodes = inputs.each_ref().map(|t| t.node());
    let [q, k, v] = [0, 1, 2].map(|i| inputs[i].primitive().clone());
    let delta = inputs.get(3).map(|t| t.primitive().clone());
    match CubeAttentionBackward::<B>(core::marker::PhantomData)
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let fwd = B::attention_forward(q, k, v, delta.clone(), &spec);
            let [q, k, v] = fwd.qkv;
            let saved = AttentionSaved {
                q,
                k,
                v,
                out: fwd.out.clone(),
                lse: fwd.lse,
                delta,
                spec,
            };
            prep.finish(saved, fwd.out)
        }
        OpsKind::UnTracked(prep) => {
            let fwd = B::attention_forward(q, k, v, delta, &spec);
            prep.finish(fwd.out)
        }
    }
}

macro_rules! impl_autodiff_extension {
    ($backend:ty) => {
        impl<C: CheckpointStrategy> FusedAttentionBackend for Autodiff<$backend, C> {
            fn fused_attention(
                q: FloatTensor<Self>,
                k: FloatTensor<Self>,
                v: FloatTensor<Self>,
                encoding: KernelEncoding,
            ) -> FloatTensor<Self> {
                autodiff_attention::<$backend, C, 3>([q, k, v], AttentionSpec::new(encoding))
            }

            fn fused_pope_attention(
                q: FloatTensor<Self>,
                k: FloatTensor<Self>,
                v: FloatTensor<Self>,
                delta: FloatTensor<Self>,
                theta: Vec<f64>,
            ) -> FloatTensor<Self> {
                autodiff_attention::<$backend, C, 4>(
                    [q, k, v, delta],
                    AttentionSpec::new(KernelEncoding::Pope { theta }),
                )
            }
        }
    };
}

impl_autodiff_extension!(CubeBackend);
#[cfg(feature = "fusion")]
impl_autodiff_extension!(FusionCube);

/// The registered backward of the cube GELU on backend `B`; its state is the input.
struct CubeGeluBackward<B>(core::marker::PhantomData<B>);

impl<B> core::fmt::Debug for CubeGeluBackward<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("CubeGeluBackward")
    }
}

impl<B: CubePrimitives> Backward<B, 1> for CubeGeluBackward<B> {
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            grads.register::<B>(node.id, B::gelu_bwd(ops.state, dy));
        }
    }
}

/// The registered backward of the cube RMSNorm on backend `B`; its state is `(x, gain, inv)`.
struct CubeRmsNormBackward<B>(core::marker::PhantomData<B>);

impl<B> core::fmt::Debug for CubeRmsNormBackward<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("CubeRmsNormBackward")
    }
}

impl<B: CubePrimitives> Backward<B, 2> for CubeRmsNormBackward<B> {
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_g] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (x, gain, inv) = ops.state;
        let (dx, dg) = B::rms_norm_bwd(x, gain, inv, dy);
        if let Some(node) = node_x {
            grads.register::<B>(node.id, dx);
        }
        if let Some(node) = node_g {
            grads.register::<B>(node.id, dg);
        }
    }
}

/// The registered backward of the cube cross-entropy on backend `B` (differentiable in the logits
/// only); its state is `(logits, targets, mask)`.
struct CubeXentBackward<B>(core::marker::PhantomData<B>);

impl<B> core::fmt::Debug for CubeXentBackward<B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("CubeXentBackward")
    }
}

impl<B: CubePrimitives> Backward<B, 1> for CubeXentBackward<B> {
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let dloss = grads.consume::<B>(&ops.node);
        let (logits, targets, mask) = ops.state;
        if let Some(node) = node {
            grads.register::<B>(node.id, B::xent_bwd(logits, targets, mask, dloss));
        }
    }
}

macro_rules! impl_loss_extension {
    ($backend:ty) => {
        impl FusedLossBackend for $backend {
            fn fused_cross_entropy(
                logits: FloatTensor<Self>,
                targets: FloatTensor<Self>,
                mask: FloatTensor<Self>,
            ) -> (FloatTensor<Self>, FloatTensor<Self>) {
                <Self as CubePrimitives>::xent_fwd(logits, targets, mask)
            }
        }

        impl<C: CheckpointStrategy> FusedLossBackend for Autodiff<$backend, C> {
            fn fused_cross_entropy(
                logits: FloatTensor<Self>,
                targets: FloatTensor<Self>,
                mask: FloatTensor<Self>,
            ) -> (FloatTensor<Self>, FloatTensor<Self>) {
                type B = $backend;
                let (tp, mp) = (targets.primitive().clone(), mask.primitive().clone());
                let (loss, correct) = match CubeXentBackward::<B>(core::marker::PhantomData)
                    .prepare::<C>([logits.node()])
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => {
                        let lp = logits.primitive().clone();
                        let (loss, correct) =
                            <B as CubePrimitives>::xent_fwd(lp.clone(), tp.clone(), mp.clone());
                        (prep.finish((lp, tp, mp), loss), correct)
                    }
                    OpsKind::UnTracked(prep) => {
                        let (loss, correct) =
                            <B as CubePrimitives>::xent_fwd(logits.primitive().clone(), tp, mp);
                        (prep.finish(loss), correct)
                    }
                };
                // The correct count is not differentiable: a constant of the graph.
                let correct = <Self as burn::backend::AutodiffBackend>::from_inner(correct);
                (loss, correct)
            }
        }
    };
}

impl_loss_extension!(CubeBackend);
#[cfg(feature = "fusion")]
impl_loss_extension!(FusionCube);

macro_rules! impl_pointwise_extension {
    ($backend:ty) => {
        impl FusedPointwiseBackend for $backend {
            fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
                <Self as CubePrimitives>::gelu_fwd(x)
            }

            fn fused_rms_norm(x: FloatTensor<Self>, gain: FloatTensor<Self>) -> FloatTensor<Self> {
                <Self as CubePrimitives>::rms_norm_fwd(x, gain).0
            }
        }

        impl<C: CheckpointStrategy> FusedPointwiseBackend for Autodiff<$backend, C> {
            fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
                type B = $backend;
                match CubeGeluBackward::<B>(core::marker::PhantomData)
                    .prepare::<C>([x.node()])
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => {
                        let xp = x.primitive().clone();
                        let y = <B as CubePrimitives>::gelu_fwd(xp.clone());
                        prep.finish(xp, y)
                    }
                    OpsKind::UnTracked(prep) => {
                        prep.finish(<B as CubePrimitives>::gelu_fwd(x.primitive().clone()))
                    }
                }
            }

            fn fused_rms_norm(x: FloatTensor<Self>, gain: FloatTensor<Self>) -> FloatTensor<Self> {
                type B = $backend;
                match CubeRmsNormBackward::<B>(core::marker::PhantomData)
                    .prepare::<C>([x.node(), gain.node()])
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => {
                        let (xp, gp) = (x.primitive().clone(), gain.primitive().clone());
                        let (y, inv) = <B as CubePrimitives>::rms_norm_fwd(xp.clone(), gp.clone());
                        prep.finish((xp, gp, inv), y)
                    }
                    OpsKind::UnTracked(prep) => {
                        let (xp, gp) = (x.primitive().clone(), gain.primitive().clone());
                        prep.finish(<B as CubePrimitives>::rms_norm_fwd(xp, gp).0)
                    }
                }
            }
        }
    };
}

impl_pointwise_extension!(CubeBackend);
#[cfg(feature = "fusion")]
impl_pointwise_extension!(FusionCube);
