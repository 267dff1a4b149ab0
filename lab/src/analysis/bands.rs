//! Which rotary pairs the causal check ablates (SCIENCE.md §8 "Causal check by ablation";
//! rules fixed in docs/analysis-rules.md, R5).
//!
//! An ablated pair gets `θ_i = 0` at evaluation: it becomes a NoPE pair (its q/k content still
//! scores). A band is [`BAND_PAIRS`] adjacent pairs. The **law band** brackets the law's
//! frequency `π/W`; the **far band** is the band of the same width, disjoint from it, whose
//! frequencies still make half a turn within the training context (`θ·L ≥ π`, so removing their
//! rotation can change a score) and whose log-centre is farthest from `ln(π/W)`.

use serde::{Deserialize, Serialize};

/// Pairs per ablated band.
pub const BAND_PAIRS: usize = 2;

/// Which band to ablate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Band {
    /// The pairs around `π/W`.
    Law,
    /// A band of equal width far from `π/W` (see the module docs).
    Far,
}

impl Band {
    /// Lower-case name (`law`, `far`), as in the `evals` table's `ablate_band` column.
    pub fn name(self) -> &'static str {
        match self {
            Band::Law => "law",
            Band::Far => "far",
        }
    }
}

/// The law band for width `width` (tokens) on a decreasing frequency grid `theta` (radians per
/// token, `θ_0 > θ_1 > …`, at least two pairs): the pairs `i, i+1` with `θ_i ≥ π/W > θ_{i+1}`;
/// the first two when `π/W ≥ θ_0`, the last two when `π/W < θ_last`.
pub fn law_band(theta: &[f64], width: f64) -> Vec<usize> {
    assert!(
        theta.len() >= BAND_PAIRS,
        "need at least {BAND_PAIRS} pairs"
    );
    let target = std::f64::consts::PI / width;
    let n = theta.len();
    let i = if target >= theta[0] {
        0
    } else {
        (0..n - 1)
            .find(|&i| theta[i] >= target && target > theta[i + 1])
            .unwrap_or(n - BAND_PAIRS)
    };
    (i..i + BAND_PAIRS).collect()
}

/// The far band (module docs): `None` when no band qualifies.
pub fn far_band(theta: &[f64], width: f64, seq_len: usize) -> Option<Vec<usize>> {
    let law = law_band(theta, width);
    let target = (std::f64::consts::PI / width).ln();
    let half_turn = |t: f64| t * seq_len as f64 >= std::f64::consts::PI;
    let mut best: Option<(usize, f64)> = None;
    for j in 0..=theta.len() - BAND_PAIRS {
        let band = j..j + BAND_PAIRS;
        if band.clone().any(|i| law.contains(&i)) || !band.clone().all(|i| half_turn(theta[i])) {
            continue;
        }
        let centre = band.clone().map(|i| theta[i].ln()).sum::<f64>() / BAND_PAIRS as f64;
        let dist = (centre - target).abs();
        if best.is_none_or(|(_, d)| dist > d) {
            best = Some((j, dist));
        }
    }
    best.map(|(j, _)| (j..j + BAND_PAIRS).collect())
}

/// The pairs of `band` for a run of width `width` and training length `seq_len`.
pub fn band_pairs(band: Band, theta: &[f64], width: f64, seq_len: usize) -> Option<Vec<usize>> {
    match band {
        Band::Law => Some(law_band(theta, width)),
        Band::Far => far_band(theta, width, seq_len),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rope::inv_freq;

    /// head_dim 32, base 10⁴: θ_i = 10^(−i/4), i = 0..15. π/4 = 0.785 lies between θ_0 = 1 and
    /// θ_1 = 0.562; π/64 = 0.0491 between θ_5 = 0.0562 and θ_6 = 0.0316.
    #[test]
    fn law_band_brackets_pi_over_w() {
        let theta = inv_freq(32, 10000.0);
        assert_eq!(law_band(&theta, 4.0), vec![0, 1]);
        assert_eq!(law_band(&theta, 64.0), vec![5, 6]);
        // π/16 = 0.196: θ_2 = 0.316 ≥ 0.196 > θ_3 = 0.178.
        assert_eq!(law_band(&theta, 16.0), vec![2, 3]);
        // Above the grid (W = 2: π/2 > 1) and below it (W = 10⁶).
        assert_eq!(law_band(&theta, 2.0), vec![0, 1]);
        assert_eq!(law_band(&theta, 1e6), vec![14, 15]);
    }

    /// With seq_len 128 the half-turn condition θ·128 ≥ π keeps pairs 0..=6 (θ_6 = 0.0316:
    /// 4.05 rad; θ_7 = 0.0178: 2.28 rad).
    #[test]
    fn far_band_is_disjoint_far_and_turns_within_the_context() {
        let theta = inv_freq(32, 10000.0);
        // W = 4 (law {0,1}): candidates {2,3} … {5,6}; the farthest from ln(π/4) is {5,6}.
        assert_eq!(far_band(&theta, 4.0, 128), Some(vec![5, 6]));
        // W = 64 (law {5,6}): candidates {0,1} … {3,4}; the farthest is {0,1}.
        assert_eq!(far_band(&theta, 64.0, 128), Some(vec![0, 1]));
        // W = 16 (law {2,3}, ln(π/16) = −1.628): {0,1} centre −0.288 (1.34 away),
        // {4,5} −2.59 (0.96), {5,6} −3.17 (1.54) → {5,6}.
        assert_eq!(far_band(&theta, 16.0, 128), Some(vec![5, 6]));
        // A context too short for any disjoint band to make half a turn.
        assert_eq!(far_band(&theta, 4.0, 4), None);
        assert_eq!(band_pairs(Band::Law, &theta, 4.0, 4), Some(vec![0, 1]));
    }
}
