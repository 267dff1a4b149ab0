//! NoPE: no positional encoding (SCIENCE.md §1). Scores are `q·k/√d`; position reaches the
//! model only through the causal mask.

use burn::module::Module;
use burn::tensor::Tensor;

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
