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
use serde::{Deserialize, Serialize};

use super::ModelConfig;
use super::encoding::{
    EncodingParams, KernelEncoding, ParamError, PositionalEncoding, Spectrum, SpectrumMap,
};
use super::rope::{Rope, inv_freq};

/// Partial rotary's parameter (config section `encoding = "partial-rope"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialRopeParams {
    /// Rotated dims `r` of each head (even, `2..=head_dim`; 0 = `head_dim`); frequencies
    /// `rope_base^(−2i/r)`; the run's `pair_layout` within them (`rotate-half`: GPT-NeoX,
    /// `adjacent`: GPT-J).
    #[serde(default)]
    pub rotary_dim: usize,
}

impl PartialRopeParams {
    /// The rotated dims for heads of `head_dim` (`rotary_dim`, or `head_dim` when 0).
    pub fn rotated(&self, head_dim: usize) -> usize {
        if self.rotary_dim == 0 {
            head_dim
        } else {
            self.rotary_dim
        }
    }
}

impl EncodingParams for PartialRopeParams {
    const NAMES: &'static [&'static str] = &["rotary_dim"];

    fn validate(&self, head_dim: usize) -> Result<(), ParamError> {
        if self.rotary_dim != 0 && (self.rotary_dim % 2 != 0 || self.rotary_dim > head_dim) {
            return Err((
                "rotary_dim",
                self.rotary_dim.to_string(),
                format!("must be 0 (all of head_dim) or an even number in 2..={head_dim}"),
            ));
        }
        Ok(())
    }
}

/// Partial-rotary score function: a [`Rope`] over the first `rotary_dim` dims. No learned
/// parameters.
#[derive(Module, Debug)]
pub struct PartialRope {
    /// The rotation of the first `rotary_dim` dims.
    pub rope: Rope,
}

impl PositionalEncoding for PartialRope {
    const NAME: &'static str = "partial-rope";
    type Params = PartialRopeParams;
    const FITS_LAW: bool = true;
    const ROPE_SCALABLE: bool = false;

    fn new(config: &ModelConfig, params: &PartialRopeParams, _seed: u64, _device: &Device) -> Self {
        let r = params.rotated(config.head_dim());
        let freqs = inv_freq(r, config.rope_base);
        PartialRope {
            rope: Rope::with_inv_freq(config.head_dim(), freqs, config.pair_layout),
        }
    }

    fn spectrum(config: &ModelConfig, params: &PartialRopeParams) -> Spectrum {
        let r = <PartialRope as PositionalEncoding>::new(config, params, 0, &Device::flex()).rope;
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
