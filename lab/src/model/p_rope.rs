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

use super::ModelConfig;
use super::encoding::{KernelEncoding, PositionalEncoding, Spectrum, SpectrumMap};
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

/// p-RoPE score function: a [`Rope`] whose lowest frequencies are 0. No parameters.
#[derive(Module, Debug)]
pub struct PRope {
    /// The rotation, over the whole head.
    pub rope: Rope,
    /// Rotated pairs `m`.
    pub kept: usize,
}

impl PositionalEncoding for PRope {
    const NAME: &'static str = "p-rope";
    const FITS_LAW: bool = true;
    const ROPE_SCALABLE: bool = false;

    fn new(config: &ModelConfig, _seed: u64, _device: &Device) -> Self {
        let d = config.head_dim();
        let freqs = p_rope_inv_freq(d, config.rope_base, config.rope_p);
        PRope {
            rope: Rope::with_inv_freq(d, freqs, config.pair_layout),
            kept: kept_pairs(d, config.rope_p),
        }
    }

    fn spectrum(config: &ModelConfig) -> Spectrum {
        let r = <PRope as PositionalEncoding>::new(config, 0, &Device::flex());
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
