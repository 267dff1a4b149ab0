//! RoPE: rotary position embedding (Su et al. 2021, *RoFormer*, eq. 34; SCIENCE.md §1).
//!
//! A head of dimension `d` is cut into `d/2` rotation pairs; pair `i` is rotated by the angle
//! `t·θ_i` at position `t`, with `θ_i = rope_base^(−2i/d)`, `i = 0..d/2−1` (radians per token).
//! The score of query position `t` and key position `s` is `Σ_i Re[q̃_i(t) conj(k̃_i(s))] / √d`,
//! i.e. each pair contributes `|q_i||k_i| cos(θ_i (t−s) + φ_q,i − φ_k,i)`.
//!
//! Two pair layouts are offered (they are the same model up to a fixed permutation of the q/k
//! dimensions, see [`PairLayout::permutation`]):
//! - [`PairLayout::Adjacent`]: pair `i` = dims `(2i, 2i+1)` (GPT-J, x-transformers, burn-nn);
//! - [`PairLayout::RotateHalf`]: pair `i` = dims `(i, i+d/2)` (Hugging Face Llama, GPT-NeoX).

use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};

use super::ModelConfig;
use super::encoding::{KernelEncoding, NoParams, PositionalEncoding, Spectrum, SpectrumMap};
use super::scaling::ScaledFreqs;

pub use crate::kernels::map::PairLayout;

/// RoPE inverse frequencies `θ_i = base^(−2i/d)`, `i = 0..d/2` (radians per token).
///
/// Source: RoFormer eq. 15; Hugging Face `modeling_rope_utils._compute_default_rope_parameters`.
pub fn inv_freq(head_dim: usize, rope_base: f64) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| rope_base.powf(-((2 * i) as f64) / head_dim as f64))
        .collect()
}

/// RoPE score function. No trainable parameters.
#[derive(Module, Debug)]
pub struct Rope {
    /// Per-head dimension `d` (even).
    pub head_dim: usize,
    /// Pair layout.
    #[module(skip)]
    pub layout: PairLayout,
    /// `θ_i`, `[r/2]`, radians per token: the first `r = 2·len` dims are rotated (`r = d` for
    /// RoPE; `r < d` for partial rotary, whose other dims pass through unchanged).
    #[module(skip)]
    pub inv_freq: Vec<f64>,
    /// Multiplier of the cos/sin tables (YaRN's attention factor; 1 otherwise), so scores scale
    /// by its square, as in Hugging Face's rotary embedding.
    #[module(skip)]
    pub attention_factor: f64,
}

impl Rope {
    /// RoPE with `θ_i = rope_base^(−2i/head_dim)`.
    pub fn new(head_dim: usize, rope_base: f64, layout: PairLayout) -> Self {
        Self {
            head_dim,
            layout,
            inv_freq: inv_freq(head_dim, rope_base),
            attention_factor: 1.0,
        }
    }

    /// Rotary on the first `2·inv_freq.len()` dims of each head with these frequencies, in
    /// `layout` within those dims; the other dims pass through (partial rotary, p-RoPE).
    ///
    /// # Panics
    /// When `2·inv_freq.len() > head_dim`.
    pub fn with_inv_freq(head_dim: usize, inv_freq: Vec<f64>, layout: PairLayout) -> Self {
        assert!(
            2 * inv_freq.len() <= head_dim,
            "inv_freq longer than head_dim/2"
        );
        Self {
            head_dim,
            layout,
            inv_freq,
            attention_factor: 1.0,
        }
    }

    /// Rotated dims `r = 2·inv_freq.len()` (the first `r` of each head).
    pub fn rotary_dim(&self) -> usize {
        2 * self.inv_freq.len()
    }

    /// The rotary pairs' dims `(a, b)`, pair `i` = `layout.pair_dims(i, r)`.
    pub fn pair_dims(&self) -> Vec<(usize, usize)> {
        let r = self.rotary_dim();
        (0..r / 2).map(|i| self.layout.pair_dims(i, r)).collect()
    }

    /// Replace the frequencies by a scaling's (see [`crate::model::scaling`]).
    pub fn with_freqs(mut self, freqs: &ScaledFreqs) -> Self {
        assert_eq!(
            freqs.inv_freq.len(),
            self.inv_freq.len(),
            "inv_freq must be [rotary_dim/2]"
        );
        self.inv_freq = freqs.inv_freq.clone();
        self.attention_factor = freqs.attention_factor;
        self
    }

    /// `(cos, sin)` tables `[seq, r/2]` of the angles `t·θ_i`, `t = 0..seq`.
    fn tables(&self, seq: usize, like: &Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(seq * half);
        let mut sin = Vec::with_capacity(seq * half);
        for t in 0..seq {
            for &theta in &self.inv_freq {
                let angle = t as f64 * theta;
                cos.push((angle.cos() * self.attention_factor) as f32);
                sin.push((angle.sin() * self.attention_factor) as f32);
            }
        }
        let device = like.device();
        let cos = Tensor::<2>::from_data(TensorData::new(cos, [seq, half]), &device);
        let sin = Tensor::<2>::from_data(TensorData::new(sin, [seq, half]), &device);
        (cos.unsqueeze(), sin.unsqueeze())
    }

    /// Rotate `x`: `[batch, heads, seq, head_dim]` by position (position `t` = index on axis 2):
    /// the first `r` dims ([`Rope::rotary_dim`]); the others are returned as they are.
    pub fn rotate(&self, x: Tensor<4>) -> Tensor<4> {
        let [_, _, _, d] = x.dims();
        let r = self.rotary_dim();
        if r == d {
            return self.rotate_all(x);
        }
        let pass = x.clone().narrow(3, r, d - r);
        Tensor::cat(vec![self.rotate_all(x.narrow(3, 0, r)), pass], 3)
    }

    /// Rotate every dim of `x` (`[batch, heads, seq, r]`, `r = 2·inv_freq.len()`).
    fn rotate_all(&self, x: Tensor<4>) -> Tensor<4> {
        let [b, h, l, d] = x.dims();
        let half = d / 2;
        let (cos, sin) = self.tables(l, &x);
        match self.layout {
            PairLayout::Adjacent => {
                let pairs = x.reshape([b * h, l, half, 2]);
                let re = pairs.clone().narrow(3, 0, 1).reshape([b, h, l, half]);
                let im = pairs.narrow(3, 1, 1).reshape([b, h, l, half]);
                let out_re = re.clone() * cos.clone() - im.clone() * sin.clone();
                let out_im = re * sin + im * cos;
                Tensor::cat(
                    vec![
                        out_re.reshape([b * h, l, half, 1]),
                        out_im.reshape([b * h, l, half, 1]),
                    ],
                    3,
                )
                .reshape([b, h, l, d])
            }
            PairLayout::RotateHalf => {
                let re = x.clone().narrow(3, 0, half);
                let im = x.narrow(3, half, half);
                let out_re = re.clone() * cos.clone() - im.clone() * sin.clone();
                let out_im = re * sin + im * cos;
                Tensor::cat(vec![out_re, out_im], 3)
            }
        }
    }

    /// `q`, `k`: `[batch, heads, seq, head_dim]` → `[batch, heads, seq, seq]`,
    /// `rot(q)·rot(k)ᵀ/√d`.
    pub fn scores(&self, q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
        let q = self.rotate(q);
        let k = self.rotate(k);
        q.matmul(k.swap_dims(2, 3)) / (self.head_dim as f64).sqrt()
    }

    /// The fused kernels' description.
    pub fn kernel_rope(&self) -> KernelEncoding {
        KernelEncoding::Rope {
            inv_freq: self.inv_freq.clone(),
            layout: self.layout,
            attention_factor: self.attention_factor,
        }
    }
}

impl PositionalEncoding for Rope {
    const NAME: &'static str = "rope";
    type Params = NoParams;
    const FITS_LAW: bool = true;
    const ROPE_SCALABLE: bool = true;

    fn new(config: &ModelConfig, _params: &NoParams, _seed: u64, _device: &Device) -> Self {
        Rope::new(config.head_dim(), config.rope_base, config.pair_layout)
    }

    fn spectrum(config: &ModelConfig, _params: &NoParams) -> Spectrum {
        let r = Rope::new(config.head_dim(), config.rope_base, config.pair_layout);
        Spectrum {
            map: SpectrumMap::Pairs {
                dims: r.pair_dims(),
            },
            freqs: r.inv_freq,
        }
    }

    fn scores(&self, q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
        Rope::scores(self, q, k)
    }

    fn kernel_map(&self) -> (KernelEncoding, Option<Tensor<1>>) {
        (self.kernel_rope(), None)
    }

    fn with_scaling(self, freqs: &ScaledFreqs) -> Self {
        self.with_freqs(freqs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    fn random_tensor(shape: [usize; 4], seed: u64, device: &Device) -> (Vec<f32>, Tensor<4>) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let n = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        (
            v.clone(),
            Tensor::from_data(TensorData::new(v, shape), device),
        )
    }

    #[test]
    fn inv_freq_matches_closed_form() {
        let f = inv_freq(8, 10000.0);
        let expect = [1.0, 0.1, 0.01, 0.001];
        for (a, b) in f.iter().zip(expect) {
            assert!((a - b).abs() < 1e-12 * b.max(1.0), "{a} vs {b}");
        }
    }

    #[test]
    fn permutation_is_hand_computed() {
        assert_eq!(PairLayout::Adjacent.permutation(6), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(
            PairLayout::RotateHalf.permutation(6),
            vec![0, 2, 4, 1, 3, 5]
        );
    }

    /// Rotating a single pair by position t turns (1, 0) into (cos tθ, sin tθ).
    #[test]
    fn rotation_of_unit_vector() {
        let device = Device::flex();
        let rope = Rope::new(2, 10000.0, PairLayout::Adjacent);
        let x = Tensor::<4>::from_data(
            TensorData::new(vec![1.0f32, 0.0, 1.0, 0.0, 1.0, 0.0], [1, 1, 3, 2]),
            &device,
        );
        let y = rope.rotate(x).into_data().try_to_vec::<f32>().unwrap();
        for t in 0..3 {
            let a = t as f32; // θ_0 = 1
            assert!((y[2 * t] - a.cos()).abs() < 1e-6);
            assert!((y[2 * t + 1] - a.sin()).abs() < 1e-6);
        }
    }

    /// The two layouts give identical scores once q/k dims are permuted (SCIENCE.md §1).
    #[test]
    fn layouts_agree_after_permutation() {
        let device = Device::flex();
        let (b, h, l, d) = (2, 3, 7, 8);
        let (qv, q) = random_tensor([b, h, l, d], 1, &device);
        let (kv, k) = random_tensor([b, h, l, d], 2, &device);
        let adjacent = Rope::new(d, 100.0, PairLayout::Adjacent);
        let half = Rope::new(d, 100.0, PairLayout::RotateHalf);
        let perm = PairLayout::RotateHalf.permutation(d);
        let permute = |v: &[f32]| -> Tensor<4> {
            let mut out = vec![0.0f32; v.len()];
            for row in 0..b * h * l {
                for j in 0..d {
                    out[row * d + j] = v[row * d + perm[j]];
                }
            }
            Tensor::from_data(TensorData::new(out, [b, h, l, d]), &device)
        };
        let s1 = adjacent
            .scores(q, k)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let s2 = half
            .scores(permute(&qv), permute(&kv))
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let max_diff = s1
            .iter()
            .zip(&s2)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(max_diff < 1e-5, "max diff {max_diff}");
        // And the layouts are not trivially equal without the permutation.
        let s3 = half
            .scores(
                Tensor::from_data(TensorData::new(qv, [b, h, l, d]), &device),
                Tensor::from_data(TensorData::new(kv, [b, h, l, d]), &device),
            )
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let diff3 = s1
            .iter()
            .zip(&s3)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff3 > 1e-3);
    }

    /// Scores depend on positions only through t − s: shifting both by the same amount is
    /// invisible. Checked with a hand-built polar formula for one pair.
    #[test]
    fn score_is_polar_formula() {
        let device = Device::flex();
        let d = 2;
        let rope = Rope::new(d, 10000.0, PairLayout::Adjacent);
        // q at every position = (1, 2); k at every position = (0.5, -1).
        let l = 5;
        let qv: Vec<f32> = (0..l).flat_map(|_| [1.0, 2.0]).collect();
        let kv: Vec<f32> = (0..l).flat_map(|_| [0.5, -1.0]).collect();
        let q = Tensor::<4>::from_data(TensorData::new(qv, [1, 1, l, d]), &device);
        let k = Tensor::<4>::from_data(TensorData::new(kv, [1, 1, l, d]), &device);
        let s = rope.scores(q, k).into_data().try_to_vec::<f32>().unwrap();
        let (nq, pq) = ((1.0f64 + 4.0).sqrt(), 2.0f64.atan2(1.0));
        let (nk, pk) = ((0.25f64 + 1.0).sqrt(), (-1.0f64).atan2(0.5));
        for t in 0..l {
            for s_ in 0..l {
                let delta = t as f64 - s_ as f64;
                let expect = nq * nk * (delta + pq - pk).cos() / (d as f64).sqrt();
                assert!((s[t * l + s_] as f64 - expect).abs() < 1e-5);
            }
        }
    }
}
