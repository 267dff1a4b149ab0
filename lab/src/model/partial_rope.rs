//! Partial rotary (GPT-NeoX, Black et al. 2022, `rotary_pct`; GPT-J, Wang & Komatsuzaki 2021,
//! `rotary_dim`; Hugging Face `partial_rotary_factor` in `modeling_rope_utils`): RoPE on the
//! first `r = rotary_dim` dims of each head with frequencies over `r`,
//! `θ_i = base^(−2i/r)`, `i < r/2`; dims `r..d` pass through, bit-identical to the input.
//!
//! Both conventions the field uses are the run's `pair_layout` within the rotated dims:
//! `rotate-half` pairs `(i, i + r/2)` (GPT-NeoX, Llama-style `rotate_half` on `x[..r]`),
//! `adjacent` pairs `(2i, 2i+1)` (GPT-J's interleaved rotary). The probe reads the `r/2` rotated
//! pairs only.

use burn::module::Module;
use burn::tensor::{Device, Tensor};

use super::ModelConfig;
use super::encoding::{KernelEncoding, PositionalEncoding, Spectrum, SpectrumMap};
use super::rope::{Rope, inv_freq};

/// Partial-rotary score function: a [`Rope`] over the first `rotary_dim` dims. No parameters.
#[derive(Module, Debug)]
pub struct PartialRope {
    /// The rotation of the first `rotary_dim` dims.
    pub rope: Rope,
}

impl PositionalEncoding for PartialRope {
    const NAME: &'static str = "partial-rope";
    const FITS_LAW: bool = true;
    const ROPE_SCALABLE: bool = false;

    fn new(config: &ModelConfig, _seed: u64, _device: &Device) -> Self {
        let r = config.rotary_dim();
        let freqs = inv_freq(r, config.rope_base);
        PartialRope {
            rope: Rope::with_inv_freq(config.head_dim(), freqs, config.pair_layout),
        }
    }

    fn spectrum(config: &ModelConfig) -> Spectrum {
        let r = <PartialRope as PositionalEncoding>::new(config, 0, &Device::flex()).rope;
        Spectrum {
            map: SpectrumMap::Pairs {
                dims: r.pair_dims(),
            },
            freqs: r.inv_freq,
        }
    }

    fn scores(&self, q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
        self.rope.scores(q, k)
    }

    fn kernel_map(&self) -> (KernelEncoding, Option<Tensor<1>>) {
        (self.rope.kernel_rope(), None)
    }
}
