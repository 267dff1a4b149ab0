//! What the fused kernels know about a positional encoding: its score-space map, described by
//! plain data (inverse frequencies, pair layout, TAPA's split) with no model types, so that the
//! kernels depend on nothing above them and every encoding of the model maps itself onto one of
//! these descriptions (`model::PositionalEncoding::kernel_map`).

use serde::{Deserialize, Serialize};

/// Which q/k dimensions form rotation pair `i` (see module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PairLayout {
    /// Pair `i` = dims `(2i, 2i+1)`.
    Adjacent,
    /// Pair `i` = dims `(i, i + d/2)`.
    RotateHalf,
}

impl PairLayout {
    /// Config/table name: `adjacent` or `rotate-half`.
    pub fn name(self) -> &'static str {
        match self {
            PairLayout::Adjacent => "adjacent",
            PairLayout::RotateHalf => "rotate-half",
        }
    }

    /// The two dimensions `(a, b)` of pair `i` when the first `head_dim` dims are rotated (the
    /// whole head, or partial rotary's `rotary_dim`); `a` is the "real" part, `b` the
    /// "imaginary" part.
    pub fn pair_dims(self, i: usize, head_dim: usize) -> (usize, usize) {
        match self {
            PairLayout::Adjacent => (2 * i, 2 * i + 1),
            PairLayout::RotateHalf => (i, i + head_dim / 2),
        }
    }

    /// Permutation `perm` such that a vector `x` in the adjacent layout equals, in this layout,
    /// `y[j] = x[perm[j]]`. Identity for [`PairLayout::Adjacent`]; for rotate-half,
    /// `perm = [0, 2, 4, …, d−2, 1, 3, …, d−1]`.
    pub fn permutation(self, head_dim: usize) -> Vec<usize> {
        let mut perm = vec![0; head_dim];
        for i in 0..head_dim / 2 {
            let (a, b) = self.pair_dims(i, head_dim);
            perm[a] = 2 * i;
            perm[b] = 2 * i + 1;
        }
        perm
    }
}

/// Phase form.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TapaPhase {
    /// `q_P·k_P` (the paper's quadratic phase).
    #[default]
    Quadratic,
    /// `Σ q_P + Σ k_P` (the linear-phase ablation).
    Linear,
}

/// The positional part handled inside the kernel.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelEncoding {
    /// Plain `q·k/√d`.
    Nope,
    /// RoPE with these inverse frequencies `[r/2]` (any scaling's) and pair layout: the first
    /// `r = 2·inv_freq.len()` dims of each head are rotated, pair `i` =
    /// `layout.pair_dims(i, r)`; dims `r..head_dim` pass through unchanged (partial rotary;
    /// `r = head_dim` for RoPE). A pair with `θ_i = 0` is the identity (p-RoPE).
    Rope {
        /// `θ_i`, radians per token.
        inv_freq: Vec<f64>,
        /// Pair layout.
        layout: PairLayout,
        /// Multiplier of the cos/sin tables (YaRN's attention factor; 1 otherwise).
        attention_factor: f64,
    },
    /// PoPE (Gopalakrishnan et al. 2026, §3): `θ_c` per component `[d]`, radians per token.
    /// The phase bias δ is an input of the kernel (`[heads · d]`), not part of the encoding.
    Pope {
        /// `θ_c = base^(−c/d)`, `[d]`.
        theta: Vec<f64>,
    },
    /// TAPA (Wang et al. 2025, §3): amplitude dimensions, distance exponent, phase form.
    Tapa {
        /// Amplitude dimensions `a` (the first `a` of each head); phase dimensions are the rest.
        amp_dim: usize,
        /// Distance exponent α.
        alpha: f64,
        /// Quadratic `q_P·k_P` or linear `Σq_P + Σk_P`.
        phase: TapaPhase,
        /// Gain `g` of the phase argument (`2π·|m−n|^α·g·P/√p`; 1 = the paper).
        phase_gain: f64,
    },
}

impl KernelEncoding {
    /// Width of the score-space vectors `q̃`, `k̃` for head dimension `d`.
    pub(crate) fn score_dim(&self, d: usize) -> usize {
        match self {
            KernelEncoding::Pope { .. } => 2 * d,
            _ => d,
        }
    }
}
