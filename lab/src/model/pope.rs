//! PoPE: polar coordinate positional embedding (Gopalakrishnan, Csordás, Schmidhuber, Mozer,
//! *Decoupling the "What" and "Where" With Polar Coordinate Positional Embeddings*, ICML 2026,
//! arXiv 2509.10534, §3; SCIENCE.md §1).
//!
//! Every one of the `d` components of a head is its own frequency `θ_c = base^(−(c−1)/d)`,
//! `c = 1..d`. Magnitudes are content only, `μ = softplus(x)`; phases are position only: the query
//! at position `t` has phase `t·θ_c`, the key at `s` has `s·θ_c + δ_c`, with a learnable bias
//! `δ` per head and component, clamped to `[−2π, 0]`. The score is
//!
//! `a_ts = Σ_c μ_q,tc · μ_k,sc · cos((s − t)·θ_c + δ_c) / √d`,
//!
//! computed as an ordinary dot product of the `2d`-vectors `[μ_q cos(tθ), μ_q sin(tθ)]` and
//! `[μ_k cos(sθ+δ), μ_k sin(sθ+δ)]` (no complex matrix).

use burn::module::{Module, Param};
use burn::tensor::activation::softplus;
use burn::tensor::{Device, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::ModelConfig;
use super::encoding::{EncodingParams, KernelEncoding, PositionalEncoding, Spectrum, SpectrumMap};

/// Lower bound of δ (radians).
pub const DELTA_MIN: f64 = -2.0 * std::f64::consts::PI;
/// Upper bound of δ (radians).
pub const DELTA_MAX: f64 = 0.0;

/// How δ is initialised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeltaInit {
    /// δ = 0 (the paper's default).
    #[default]
    Zero,
    /// δ uniform in `[−2π, 0]`.
    Uniform,
}

/// PoPE's parameter (config section `encoding = "pope"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PopeParams {
    /// Initialisation of the phase bias δ (`zero`, the paper's default, or `uniform` in
    /// [−2π, 0]).
    #[serde(default)]
    pub pope_delta_init: DeltaInit,
}

impl EncodingParams for PopeParams {
    const NAMES: &'static [&'static str] = &["pope_delta_init"];
}

/// PoPE frequencies `θ_c = base^(−(c−1)/d)`, `c = 1..d` (radians per token), `[d]`.
pub fn pope_freqs(head_dim: usize, base: f64) -> Vec<f64> {
    (0..head_dim)
        .map(|c| base.powf(-(c as f64) / head_dim as f64))
        .collect()
}

/// PoPE score function with its phase bias δ.
#[derive(Module, Debug)]
pub struct Pope {
    /// Per-head dimension `d`.
    pub head_dim: usize,
    /// Number of heads.
    pub n_heads: usize,
    /// `θ_c`, `[d]`, radians per token.
    #[module(skip)]
    pub theta: Vec<f64>,
    /// Phase bias δ, flattened `[n_heads · head_dim]` (a vector, so weight decay skips it),
    /// radians, kept in `[−2π, 0]` by [`Pope::clamp_delta`].
    pub delta: Param<Tensor<1>>,
}

impl Pope {
    /// PoPE for `n_heads` heads of dimension `head_dim`; δ drawn from `seed` when uniform.
    pub fn new(
        head_dim: usize,
        n_heads: usize,
        base: f64,
        init: DeltaInit,
        seed: u64,
        device: &Device,
    ) -> Self {
        let n = head_dim * n_heads;
        let values: Vec<f32> = match init {
            DeltaInit::Zero => vec![0.0; n],
            DeltaInit::Uniform => {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0xDE17A);
                (0..n)
                    .map(|_| rng.random_range(DELTA_MIN..=DELTA_MAX) as f32)
                    .collect()
            }
        };
        Self {
            head_dim,
            n_heads,
            theta: pope_freqs(head_dim, base),
            delta: Param::from_data(TensorData::new(values, [n]), device),
        }
    }

    /// δ as `[1, heads, 1, d]`.
    fn delta4(&self) -> Tensor<4> {
        self.delta
            .val()
            .reshape([1, self.n_heads, 1, self.head_dim])
    }

    /// `(cos, sin)` of `t·θ_c`, each `[1, 1, seq, d]`.
    fn tables(&self, seq: usize, device: &Device) -> (Tensor<4>, Tensor<4>) {
        let d = self.head_dim;
        let mut cos = Vec::with_capacity(seq * d);
        let mut sin = Vec::with_capacity(seq * d);
        for t in 0..seq {
            for &th in &self.theta {
                let a = t as f64 * th;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        let cos = Tensor::<2>::from_data(TensorData::new(cos, [seq, d]), device);
        let sin = Tensor::<2>::from_data(TensorData::new(sin, [seq, d]), device);
        (cos.unsqueeze(), sin.unsqueeze())
    }

    /// The `2d`-dimensional Cartesian vectors `(q̃, k̃)`, each `[batch, heads, seq, 2d]`.
    pub fn cartesian(&self, q: Tensor<4>, k: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let [_, _, l, _] = q.dims();
        let (cos, sin) = self.tables(l, &q.device());
        let mu_q = softplus(q, 1.0);
        let mu_k = softplus(k, 1.0);
        let delta = self.delta4();
        let (cd, sd) = (delta.clone().cos(), delta.sin());
        // cos(sθ + δ) = cos sθ cos δ − sin sθ sin δ;  sin(sθ + δ) = sin sθ cos δ + cos sθ sin δ.
        let k_cos = cos.clone() * cd.clone() - sin.clone() * sd.clone();
        let k_sin = sin.clone() * cd + cos.clone() * sd;
        let q_t = Tensor::cat(vec![mu_q.clone() * cos, mu_q * sin], 3);
        let k_t = Tensor::cat(vec![mu_k.clone() * k_cos, mu_k * k_sin], 3);
        (q_t, k_t)
    }

    /// `q`, `k`: `[batch, heads, seq, head_dim]` → scores `[batch, heads, seq, seq]` (scaled by `1/√d`).
    pub fn scores(&self, q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
        let (q_t, k_t) = self.cartesian(q, k);
        q_t.matmul(k_t.swap_dims(2, 3)) / (self.head_dim as f64).sqrt()
    }

    /// Project δ back into `[−2π, 0]` (called after every optimiser step).
    pub fn clamp_delta(mut self) -> Self {
        self.delta = self.delta.map(|t| {
            let tracked = t.is_require_grad();
            let c = t.inner().clamp(DELTA_MIN, DELTA_MAX);
            let c = Tensor::from_inner(c);
            if tracked { c.require_grad() } else { c }
        });
        self
    }
}

impl PositionalEncoding for Pope {
    const NAME: &'static str = "pope";
    type Params = PopeParams;
    const FITS_LAW: bool = true;
    const ROPE_SCALABLE: bool = false;

    fn new(config: &ModelConfig, params: &PopeParams, seed: u64, device: &Device) -> Self {
        Pope::new(
            config.head_dim(),
            config.n_heads,
            config.rope_base,
            params.pope_delta_init,
            seed,
            device,
        )
    }

    fn spectrum(config: &ModelConfig, _params: &PopeParams) -> Spectrum {
        Spectrum {
            map: SpectrumMap::Components,
            freqs: pope_freqs(config.head_dim(), config.rope_base),
        }
    }

    fn scores(&self, q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
        Pope::scores(self, q, k)
    }

    fn kernel_map(&self) -> (KernelEncoding, Option<Tensor<1>>) {
        let theta = self.theta.clone();
        (KernelEncoding::Pope { theta }, Some(self.delta.val()))
    }

    fn project(self) -> Self {
        self.clamp_delta()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn softplus64(x: f64) -> f64 {
        (1.0 + x.exp()).ln()
    }

    /// The score equals the polar formula on random inputs (f64 reference).
    #[test]
    fn score_equals_polar_formula() {
        let device = Device::flex();
        let (b, h, l, d) = (1, 2, 5, 4);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let qv: Vec<f32> = (0..b * h * l * d)
            .map(|_| rng.random_range(-2.0..2.0))
            .collect();
        let kv: Vec<f32> = (0..b * h * l * d)
            .map(|_| rng.random_range(-2.0..2.0))
            .collect();
        let pope = Pope::new(d, h, 100.0, DeltaInit::Uniform, 9, &device);
        let delta = pope.delta.val().into_data().try_to_vec::<f32>().unwrap();
        let q = Tensor::<4>::from_data(TensorData::new(qv.clone(), [b, h, l, d]), &device);
        let k = Tensor::<4>::from_data(TensorData::new(kv.clone(), [b, h, l, d]), &device);
        let s = pope.scores(q, k).into_data().try_to_vec::<f32>().unwrap();
        for hh in 0..h {
            for t in 0..l {
                for ss in 0..l {
                    let mut want = 0.0f64;
                    for c in 0..d {
                        let mq = softplus64(qv[(hh * l + t) * d + c] as f64);
                        let mk = softplus64(kv[(hh * l + ss) * d + c] as f64);
                        let dl = delta[hh * d + c] as f64;
                        want += mq * mk * ((ss as f64 - t as f64) * pope.theta[c] + dl).cos();
                    }
                    want /= (d as f64).sqrt();
                    let got = s[(hh * l + t) * l + ss] as f64;
                    assert!(
                        (got - want).abs() < 1e-4 * want.abs().max(1.0),
                        "{got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn frequencies_are_the_paper_grid() {
        let f = pope_freqs(4, 10000.0);
        assert_eq!(f[0], 1.0);
        assert!((f[2] - 0.01).abs() < 1e-15);
        assert!((f[3] - 10000f64.powf(-0.75)).abs() < 1e-15);
    }

    #[test]
    fn clamp_projects_into_range() {
        let device = Device::flex();
        let mut p = Pope::new(2, 1, 100.0, DeltaInit::Zero, 0, &device);
        p.delta = Param::from_data(TensorData::new(vec![1.0f32, -7.0], [2]), &device);
        let p = p.clamp_delta();
        let v = p.delta.val().into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(v, vec![0.0, (-2.0 * std::f64::consts::PI) as f32]);
    }
}
