//! `lab bench attention`: wall time of the fused attention op the model calls
//! ([`crate::kernels::positional_attention`]), forward and forward + backward, on any backend: the Rust
//! kernels on `cpu`, the CubeCL kernels (autotuned strategy) on `wgpu` and `cuda`.
//!
//! Each timed call is followed by [`Device::sync`], so GPU times include the kernels' completion;
//! the median over `iters` calls after `warmup` untimed ones is reported. Inputs are uniform in ±1
//! (f32), PoPE's δ spread over [−2π, 0), the encodings' frequencies from `rope_base` 10000 with the
//! rotate-half layout, TAPA with `tapa_alpha` 0.1 on half the head dims.

use std::time::Instant;

use burn::tensor::{Device, Tensor, TensorData};
use rand::{Rng, SeedableRng};

use crate::model::{
    Encoding, EncodingConfig, ModelConfig, PairLayout, PositionalAttention, TapaPhase,
};

/// The amplitude dimensions of the TAPA head [`bench_attention`] builds at `head_dim`: the
/// default `tapa_rho` (0.5) times `head_dim`, rounded ([`crate::model::Tapa::new`]).
pub fn tapa_amp_dim(head_dim: usize) -> usize {
    let p = crate::model::TapaParams::default();
    crate::model::Tapa::new(head_dim, p.tapa_rho, p.tapa_alpha, TapaPhase::Quadratic).amp_dim
}

/// The encodings `lab bench attention` times.
pub const BENCH_ENCODINGS: [&str; 5] = ["nope", "rope", "pope", "tapa", "tapa-linear"];

/// One timing of the fused attention op.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AttentionBench {
    /// `nope`, `rope`, `pope`, `tapa` (quadratic phase) or `tapa-linear`.
    pub encoding: String,
    /// `cpu`, `wgpu` or `cuda`.
    pub backend: String,
    /// `op`: the model's fused op on the CPU; on `wgpu`/`cuda` the CubeCL launch layout it ran
    /// with (`tiled`, the model's default, or another of `lab bench attention --strategy`).
    pub strategy: &'static str,
    /// `f32`, or `f16-f32acc` where a `cmma` layout ran on tensor cores (f16 operands, f32
    /// accumulation, forward and backward), `f16-f32acc-emulated` where it ran the same kernels
    /// with the products emulated (a device without tensor cores: lavapipe).
    pub dtype: &'static str,
    /// Shape `[batch, heads, seq, head_dim]` of q, k, v.
    pub batch: usize,
    /// Heads.
    pub heads: usize,
    /// Sequence length (query and key positions `0..seq`).
    pub seq: usize,
    /// Per-head dims.
    pub head_dim: usize,
    /// Median ms of a forward call (with sync).
    pub fwd_ms: f64,
    /// Median ms of a forward and a backward call of `Σ out ⊙ G` (with sync); NaN (JSON
    /// `null`) for the `library` row, which has no backward.
    pub fwd_bwd_ms: f64,
    /// The `library` row only: largest |out − the lab's `tiled` forward| on the same inputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub out_max_diff: Option<f64>,
}

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn time_ms(mut f: impl FnMut(), warmup: usize, iters: usize, device: &Device) -> f64 {
    for _ in 0..warmup {
        f();
    }
    let _ = device.sync();
    let times = (0..iters.max(1))
        .map(|_| {
            let t0 = Instant::now();
            f();
            let _ = device.sync();
            t0.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    median(times)
}

/// The fused op's encoding `encoding` (one of [`BENCH_ENCODINGS`]) as `lab bench attention`
/// builds it for `heads` × `head_dim` (rotate-half pairs, the kernel checks' parameters), with
/// PoPE's phase bias δ `[heads · head_dim]` spread over [−2π, 0) in a fixed pattern (timing does
/// not depend on its values); `None` for the other encodings.
///
/// # Errors
/// An unknown encoding name (one line listing the allowed ones), or an odd `head_dim`.
pub fn bench_encoding(
    encoding: &str,
    heads: usize,
    head_dim: usize,
) -> Result<(crate::kernels::cpu::KernelEncoding, Option<Vec<f32>>), String> {
    let (h, d) = (heads, head_dim);
    if d == 0 || d % 2 == 1 {
        return Err(format!("--head-dim {d}: must be even and at least 2"));
    }
    let (kind, phase) = match encoding {
        "nope" => (Encoding::Nope, TapaPhase::Quadratic),
        "rope" => (Encoding::Rope, TapaPhase::Quadratic),
        "pope" => (Encoding::Pope, TapaPhase::Quadratic),
        "tapa" => (Encoding::Tapa, TapaPhase::Quadratic),
        "tapa-linear" => (Encoding::Tapa, TapaPhase::Linear),
        other => {
            return Err(format!(
                "--encodings: unknown encoding `{other}` (allowed: {})",
                BENCH_ENCODINGS.join(", ")
            ));
        }
    };
    let cfg = ModelConfig {
        pair_layout: PairLayout::RotateHalf,
        ..ModelConfig::attention_only(EncodingConfig::for_kernel_checks(kind, phase), h, d)
    };
    let pos = PositionalAttention::new(&cfg, 0, &Device::flex());
    let (kernel_encoding, delta) = pos.kernel_encoding();
    let delta = delta.map(|_| {
        (0..h * d)
            .map(|i| -2.0 * std::f32::consts::PI * ((i % 7) as f32 / 7.0))
            .collect()
    });
    Ok((kernel_encoding, delta))
}

/// The inputs `q`, `k`, `v` and the output gradient `g` of `shape` every attention bench draws:
/// uniform in [−1, 1), seed 0, row-major.
fn bench_inputs(shape: [usize; 4]) -> [Vec<f32>; 4] {
    let n: usize = shape.iter().product();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    [(); 4].map(|_| (0..n).map(|_| rng.random_range(-1.0..1.0)).collect())
}

/// Time the fused attention op for `encoding` (one of [`BENCH_ENCODINGS`]) at `shape`
/// `[batch, heads, seq, head_dim]` on `device` (plain; the backward runs on its autodiff wrapper).
///
/// # Errors
/// An unknown encoding name (one line listing the allowed ones), or an odd `head_dim`.
pub fn bench_attention(
    device: &Device,
    backend: &str,
    encoding: &str,
    shape: [usize; 4],
    warmup: usize,
    iters: usize,
) -> Result<AttentionBench, String> {
    let [b, h, l, d] = shape;
    let (kernel_encoding, delta) = bench_encoding(encoding, h, d)?;
    let [q, k, v, g] = bench_inputs(shape);
    let tensor =
        |x: &[f32], dev: &Device| Tensor::<4>::from_data(TensorData::new(x.to_vec(), shape), dev);
    let delta_on = |dev: &Device| {
        delta
            .as_ref()
            .map(|x| Tensor::<1>::from_data(TensorData::new(x.clone(), [h * d]), dev))
    };
    let attend = |q: &Tensor<4>, k: &Tensor<4>, v: &Tensor<4>, delta: &Option<Tensor<1>>| {
        crate::kernels::positional_attention(
            q.clone(),
            k.clone(),
            v.clone(),
            delta.clone(),
            kernel_encoding.clone(),
        )
    };
    let (tq, tk, tv) = (tensor(&q, device), tensor(&k, device), tensor(&v, device));
    let td = delta_on(device);
    let fwd_ms = time_ms(
        || {
            let _ = attend(&tq, &tk, &tv, &td);
        },
        warmup,
        iters,
        device,
    );
    let ad = device.clone().autodiff();
    let (aq, ak, av) = (
        tensor(&q, &ad).require_grad(),
        tensor(&k, &ad).require_grad(),
        tensor(&v, &ad).require_grad(),
    );
    let (ag, adelta) = (tensor(&g, &ad), delta_on(&ad).map(|t| t.require_grad()));
    let fwd_bwd_ms = time_ms(
        || {
            let _ = (attend(&aq, &ak, &av, &adelta) * ag.clone())
                .sum()
                .backward();
        },
        warmup,
        iters,
        &ad,
    );
    Ok(AttentionBench {
        encoding: encoding.to_string(),
        backend: backend.to_string(),
        strategy: "op",
        dtype: "f32",
        batch: b,
        heads: h,
        seq: l,
        head_dim: d,
        fwd_ms,
        fwd_bwd_ms,
        out_max_diff: None,
    })
}

/// `lab bench attention --strategy library` (`wgpu`/`cuda`): the forward of CubeCL's own library
/// flash attention ([`crate::kernels::cube::library_forward`]: the lab's transformed rows, f16
/// inputs, burn-cubecl's autotuned `attention` op) for a dot-product `encoding` at `shape`, on the
/// inputs [`bench_attention`] draws; `out_max_diff` against the lab's `tiled` forward. A
/// reference for the tensor-core layouts, forward only (`fwd_bwd_ms` NaN).
///
/// # Errors
/// As [`bench_attention`]; TAPA (no dot-product score); the library's refusal; a build without
/// `wgpu`/`cuda`.
#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
pub fn bench_library_attention(
    device: &Device,
    backend: &str,
    encoding: &str,
    shape: [usize; 4],
    warmup: usize,
    iters: usize,
) -> Result<AttentionBench, String> {
    use crate::kernels::cube::{self, CubeAttentionParams, CubeStrategy};
    let [b, h, l, d] = shape;
    let (kernel_encoding, delta) = bench_encoding(encoding, h, d)?;
    let [q, k, v, _] = bench_inputs(shape);
    let (q, k, v) = [q, k, v]
        .map(|x| cube::host_to_cube(&x, shape, device))
        .into();
    let delta = delta.map(|x| cube::host_to_cube(&x, [h * d], device));
    let mut params = CubeAttentionParams::from_kernel_encoding(kernel_encoding, delta);
    params.strategy = CubeStrategy::parse("tiled")?;
    let attend = || cube::library_forward(q.clone(), k.clone(), v.clone(), &params);
    let got = cube::try_cube_to_host(attend()?)
        .map_err(|e| format!("--strategy library at seq {l}: the library attention: {e}"))?;
    let want = cube::try_cube_to_host(cube::forward(q.clone(), k.clone(), v.clone(), &params).0)
        .map_err(|e| format!("--strategy library at seq {l}: the lab's tiled forward: {e}"))?;
    let out_max_diff = got
        .iter()
        .zip(&want)
        .map(|(a, b)| f64::from((a - b).abs()))
        .fold(0.0, f64::max);
    let fwd_ms = time_ms(
        || {
            let _ = attend();
        },
        warmup,
        iters,
        device,
    );
    Ok(AttentionBench {
        encoding: encoding.to_string(),
        backend: backend.to_string(),
        strategy: "library",
        dtype: "f16",
        batch: b,
        heads: h,
        seq: l,
        head_dim: d,
        fwd_ms,
        fwd_bwd_ms: f64::NAN,
        out_max_diff: Some(out_max_diff),
    })
}

/// Without `wgpu`/`cuda`: one line saying so.
#[cfg(not(any(feature = "wgpu", feature = "cuda-plain")))]
pub fn bench_library_attention(
    _device: &Device,
    _backend: &str,
    _encoding: &str,
    _shape: [usize; 4],
    _warmup: usize,
    _iters: usize,
) -> Result<AttentionBench, String> {
    Err("--strategy library: CubeCL's library attention needs a build with the cargo feature `wgpu` or `cuda`".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_attention_times_every_encoding_and_refuses_bad_input() {
        for enc in BENCH_ENCODINGS {
            let r = bench_attention(&Device::flex(), "cpu", enc, [1, 2, 16, 8], 0, 1).unwrap();
            assert!(r.fwd_ms > 0.0 && r.fwd_bwd_ms > 0.0, "{r:?}");
            assert_eq!((r.seq, r.head_dim), (16, 8));
        }
        let e = bench_attention(&Device::flex(), "cpu", "alibi", [1, 1, 4, 8], 0, 1).unwrap_err();
        assert!(e.contains("allowed: nope, rope"), "{e}");
        let e = bench_attention(&Device::flex(), "cpu", "rope", [1, 1, 4, 7], 0, 1).unwrap_err();
        assert!(e.starts_with("--head-dim 7"), "{e}");
    }
}
