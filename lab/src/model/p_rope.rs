//! p-RoPE (Barbero, Vitvitskyi, Perivolaropoulos, Pascanu, Veličković, *Round and Round We Go!
//! What makes Rotary Positional Encodings useful?*, ICLR 2025, arXiv 2410.06205, §6): RoPE on the
//! highest fraction `p` of the frequencies only; the other pairs are not rotated (NoPE pairs, a
//! position-free "semantic" channel).
//!
//! With `d/2` RoPE frequencies `θ_i = base^(−2i/d)` (decreasing in `i`), p-RoPE keeps the first
//! `m = ⌊p·d/2⌋` and sets `θ_i = 0` for `i ≥ m`, in the pair layout of the whole head (as the
//! paper's Gemma implementation does, with infinite timescales). `p = 1` is RoPE; `p → 0` NoPE.
//! A pair with `θ = 0` is the identity map (`cos 0 = 1`, `sin 0 = 0`). The probe reads the `m`
//! rotated pairs only.

use burn::module::Module;
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::ModelConfig;
use super::encoding::{
    EncodingParams, KernelEncoding, ParamError, PositionalEncoding, Spectrum, SpectrumMap,
};
use super::rope::{Rope, inv_freq};

/// Rotated pairs `m = ⌊p · head_dim/2⌋` (a `1e-9` tolerance absorbs decimal round-off, so
/// `p = 0.75` of 16 pairs keeps 12).
pub fn kept_pairs(head_dim: usize, p: f64) -> usize {
    ((p * (head_dim / 2) as f64 + 1e-9).floor() as usize).min(head_dim / 2)
}

/// p-RoPE inverse frequencies `[d/2]`: RoPE's `θ_i` for `i < m` ([`kept_pairs`]), 0 after.
pub fn p_rope_inv_freq(head_dim: usize, rope_base: f64, p: f64) -> Vec<f64> {
    let m = kept_pairs(head_dim, p);
    let mut f = inv_freq(head_dim, rope_base);
    f.iter_mut().skip(m).for_each(|t| *t = 0.0);
    f
}

/// p-RoPE's parameter (config section `encoding = "p-rope"`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PRopeParams {
    /// Fraction `p ∈ (0, 1]` of RoPE's frequencies kept, the highest ones (at least one pair).
    #[serde(default = "one")]
    pub rope_p: f64,
}

fn one() -> f64 {
    1.0
}

impl Default for PRopeParams {
    /// `p = 1`: every pair rotated (RoPE).
    fn default() -> Self {
        PRopeParams { rope_p: 1.0 }
    }
}

impl EncodingParams for PRopeParams {
    const NAMES: &'static [&'static str] = &["rope_p"];

    fn validate(&self, head_dim: usize) -> Result<(), ParamError> {
        let pairs = head_dim / 2;
        if !(self.rope_p > 0.0 && self.rope_p <= 1.0) || kept_pairs(head_dim, self.rope_p) == 0 {
            return Err((
                "rope_p",
                self.rope_p.to_string(),
                format!(
                    "must be in [1/{pairs}, 1] (keep at least one of the {pairs} rotary pairs)"
                ),
            ));
        }
        Ok(())
    }
}

/// p-RoPE score function: a [`Rope`] whose lowest frequencies are 0. No learned parameters.
#[derive(Module, Debug)]
pub struct PRope {
    /// The rotation, over the whole head.
    pub rope: Rope,
    /// Rotated pairs `m`.
    pub kept: usize,
}

impl PositionalEncoding for PRope {
    const NAME: &'static str = "p-rope";
    type Params = PRopeParams;
    const FITS_LAW: bool = true;
    const ROPE_SCALABLE: bool = false;

    fn new(config: &ModelConfig, params: &PRopeParams, _seed: u64, _device: &Device) -> Self {
        let d = config.head_dim();
        let freqs = p_rope_inv_freq(d, config.rope_base, params.rope_p);
        PRope {
            rope: Rope::with_inv_freq(d, freqs, config.pair_layout),
            kept: kept_pairs(d, params.rope_p),
        }
    }

    fn spectrum(config: &ModelConfig, params: &PRopeParams) -> Spectrum {
        let r = <PRope as PositionalEncoding>::new(config, params, 0, &Device::flex());
        Spectrum {
            map: SpectrumMap::Pairs {
                dims: r.rope.pair_dims()[..r.kept].to_vec(),
            },
            freqs: r.rope.inv_freq[..r.kept].to_vec(),
        }
    }

    fn scores(&self, q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
        self.rope.scores(q, k)
    }

    fn kernel_map(&self) -> (KernelEncoding, Option<Tensor<1>>) {
        (self.rope.kernel_rope(), None)
    }
}
