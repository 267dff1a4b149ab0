//! NoPE: no positional encoding (SCIENCE.md §1). Scores are `q·k/√d`; position reaches the
//! model only through the causal mask.

use burn::module::Module;
use burn::tensor::{Device, Tensor};

use super::ModelConfig;
use super::encoding::{KernelEncoding, NoParams, PositionalEncoding, Spectrum};

/// NoPE score function (no parameters).
#[derive(Module, Debug)]
pub struct Nope {
    /// Per-head dimension `d` (the scale is `1/√d`).
    pub head_dim: usize,
}

impl Nope {
    /// NoPE for heads of dimension `head_dim`.
    pub fn new(head_dim: usize) -> Self {
        Self { head_dim }
    }

    /// `q`, `k`: `[batch, heads, seq, head_dim]` → `[batch, heads, seq, seq]`, `q·kᵀ/√d`.
    pub fn scores(&self, q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
        q.matmul(k.swap_dims(2, 3)) / (self.head_dim as f64).sqrt()
    }
}

impl PositionalEncoding for Nope {
    const NAME: &'static str = "nope";
    type Params = NoParams;
    const FITS_LAW: bool = false;
    const ROPE_SCALABLE: bool = false;

    fn new(config: &ModelConfig, _params: &NoParams, _seed: u64, _device: &Device) -> Self {
        Nope::new(config.head_dim())
    }

    /// The RoPE grid of the same `rope_base` and pair layout, as a control: no rotation is
    /// applied, so the "spectrum" measures pair-norm structure only.
    fn spectrum(config: &ModelConfig, params: &NoParams) -> Spectrum {
        <super::Rope as PositionalEncoding>::spectrum(config, params)
    }

    fn scores(&self, q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
        Nope::scores(self, q, k)
    }

    fn kernel_map(&self) -> (KernelEncoding, Option<Tensor<1>>) {
        (KernelEncoding::Nope, None)
    }
}
