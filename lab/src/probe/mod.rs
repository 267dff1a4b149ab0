//! Frequency-energy probe: which rotary frequencies a trained model actually uses
//! (Wu, Liu, Jadbabaie 2026, arXiv 2607.07678, §3 "frequency energy"; SCIENCE.md §3).
//!
//! For one layer and head, RoPE pair `i` contributes to the score of query `t` and key `s`
//! a sinusoid of amplitude `A_i(t,s) = |q_i(t)|·|k_i(s)|` (`|·|` the 2-D norm of the pair).
//! The pair's **energy** is `E_i = mean_{s≤t} A_i(t,s)²`, averaged over the evaluation batch.
//! Because `A_i² = a_q(t)·a_k(s)` with `a = |·|²`, the mean over causal pairs is
//! `Σ_t a_q(t) · Σ_{s≤t} a_k(s) / (L(L+1)/2)`: a prefix sum, O(L·d) per head, never `L×L×d`.
//!
//! From the normalised spectrum `p_i = E_i / Σ_j E_j`:
//! - effective frequency `θ_eff = exp(Σ_i p_i ln θ_i)` (log-mean, radians per token);
//! - entropy `H = −Σ_i p_i ln p_i` (nats; `ln(d/2)` when uniform, 0 when all energy is in one pair);
//! - argmax frequency `θ_{argmax p}`.
//!
//! A run's single `θ_eff` averages `p` over all layers and heads, then takes the log-mean
//! ([`pooled_spectrum`]). For NoPE the same quantities are computed on the RoPE grid as a
//! control (no rotation is applied, so they measure pair-norm structure only).

use crate::model::PairLayout;
use rayon::prelude::*;

/// Sum over causal pairs `(t, s)`, `s ≤ t`, of `|q_i(t)|²·|k_i(s)|²`, for each pair `i`.
///
/// `q`, `k`: one head's vectors, row-major `[seq, head_dim]`. Returns `[head_dim/2]` sums (not
/// yet divided by the number of pairs, so several sequences can be added). O(seq·head_dim).
pub fn pair_energy_sums(
    q: &[f32],
    k: &[f32],
    seq: usize,
    head_dim: usize,
    layout: PairLayout,
) -> Vec<f64> {
    assert_eq!(q.len(), seq * head_dim, "q must be [seq, head_dim]");
    assert_eq!(k.len(), seq * head_dim, "k must be [seq, head_dim]");
    let n_pairs = head_dim / 2;
    let dims: Vec<(usize, usize)> = (0..n_pairs)
        .map(|i| layout.pair_dims(i, head_dim))
        .collect();
    let mut prefix_k = vec![0.0f64; n_pairs];
    let mut sums = vec![0.0f64; n_pairs];
    for t in 0..seq {
        let row_q = &q[t * head_dim..(t + 1) * head_dim];
        let row_k = &k[t * head_dim..(t + 1) * head_dim];
        for (i, &(a, b)) in dims.iter().enumerate() {
            let ak = row_k[a] as f64 * row_k[a] as f64 + row_k[b] as f64 * row_k[b] as f64;
            prefix_k[i] += ak;
            let aq = row_q[a] as f64 * row_q[a] as f64 + row_q[b] as f64 * row_q[b] as f64;
            sums[i] += aq * prefix_k[i];
        }
    }
    sums
}

/// Number of causal pairs `(t, s)` with `0 ≤ s ≤ t < seq`: `seq(seq+1)/2`.
pub fn n_causal_pairs(seq: usize) -> usize {
    seq * (seq + 1) / 2
}

/// Energy per layer, head and pair, averaged over the batch and over causal pairs.
///
/// `layers[l] = (q, k)` with `q`, `k` row-major `[batch, heads, seq, head_dim]`.
/// Returns `energy[l][h][i]` (units of squared activations, squared).
pub fn layer_head_energy(
    layers: &[(Vec<f32>, Vec<f32>)],
    batch: usize,
    heads: usize,
    seq: usize,
    head_dim: usize,
    layout: PairLayout,
) -> Vec<Vec<Vec<f64>>> {
    let per_seq = seq * head_dim;
    let norm = (batch * n_causal_pairs(seq)) as f64;
    layers
        .iter()
        .map(|(q, k)| {
            (0..heads)
                .into_par_iter()
                .map(|h| {
                    let mut total = vec![0.0f64; head_dim / 2];
                    for b in 0..batch {
                        let off = (b * heads + h) * per_seq;
                        let e = pair_energy_sums(
                            &q[off..off + per_seq],
                            &k[off..off + per_seq],
                            seq,
                            head_dim,
                            layout,
                        );
                        for (t, x) in total.iter_mut().zip(e) {
                            *t += x;
                        }
                    }
                    total.iter().map(|x| x / norm).collect()
                })
                .collect()
        })
        .collect()
}

/// `p_i = E_i / Σ_j E_j`. An all-zero spectrum maps to the uniform one.
pub fn normalise(energy: &[f64]) -> Vec<f64> {
    let total: f64 = energy.iter().sum();
    if total <= 0.0 || !total.is_finite() {
        return vec![1.0 / energy.len() as f64; energy.len()];
    }
    energy.iter().map(|e| e / total).collect()
}

/// Effective frequency `θ_eff = exp(Σ_i p_i ln θ_i)` (radians per token); `p` normalised.
pub fn effective_freq(p: &[f64], theta: &[f64]) -> f64 {
    p.iter()
        .zip(theta)
        .map(|(p, t)| p * t.ln())
        .sum::<f64>()
        .exp()
}

/// Spectrum entropy `−Σ p_i ln p_i` in nats.
pub fn entropy(p: &[f64]) -> f64 {
    -p.iter()
        .filter(|&&x| x > 0.0)
        .map(|x| x * x.ln())
        .sum::<f64>()
}

/// `θ` of the pair with the largest share (first one on ties).
pub fn argmax_freq(p: &[f64], theta: &[f64]) -> f64 {
    let mut best = 0;
    for (i, &x) in p.iter().enumerate() {
        if x > p[best] {
            best = i;
        }
    }
    theta[best]
}

/// Average of the normalised spectra of every layer and head (`energy[l][h][i]`).
pub fn pooled_spectrum(energy: &[Vec<Vec<f64>>]) -> Vec<f64> {
    let mut acc: Vec<f64> = Vec::new();
    let mut n = 0usize;
    for layer in energy {
        for head in layer {
            let p = normalise(head);
            if acc.is_empty() {
                acc = vec![0.0; p.len()];
            }
            for (a, x) in acc.iter_mut().zip(p) {
                *a += x;
            }
            n += 1;
        }
    }
    acc.iter().map(|a| a / n.max(1) as f64).collect()
}

/// Summary of one spectrum.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpectrumSummary {
    /// `θ_eff`, radians per token.
    pub effective_freq: f64,
    /// Entropy in nats.
    pub entropy: f64,
    /// Argmax frequency, radians per token.
    pub argmax_freq: f64,
}

/// Summarise a normalised spectrum `p` on the grid `theta`.
pub fn summarise(p: &[f64], theta: &[f64]) -> SpectrumSummary {
    SpectrumSummary {
        effective_freq: effective_freq(p, theta),
        entropy: entropy(p),
        argmax_freq: argmax_freq(p, theta),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rope::inv_freq;
    use rand::{Rng, SeedableRng};

    /// O(L²) definition, for comparison.
    fn brute_force(q: &[f32], k: &[f32], seq: usize, d: usize, layout: PairLayout) -> Vec<f64> {
        let mut e = vec![0.0; d / 2];
        for t in 0..seq {
            for s in 0..=t {
                for (i, ei) in e.iter_mut().enumerate() {
                    let (a, b) = layout.pair_dims(i, d);
                    let nq = ((q[t * d + a] as f64).powi(2) + (q[t * d + b] as f64).powi(2)).sqrt();
                    let nk = ((k[s * d + a] as f64).powi(2) + (k[s * d + b] as f64).powi(2)).sqrt();
                    *ei += (nq * nk).powi(2);
                }
            }
        }
        e.iter().map(|x| x / n_causal_pairs(seq) as f64).collect()
    }

    #[test]
    fn prefix_sum_equals_brute_force_on_random_inputs() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let (seq, d) = (37, 12);
        let q: Vec<f32> = (0..seq * d).map(|_| rng.random_range(-2.0..2.0)).collect();
        let k: Vec<f32> = (0..seq * d).map(|_| rng.random_range(-2.0..2.0)).collect();
        for layout in [PairLayout::Adjacent, PairLayout::RotateHalf] {
            let fast: Vec<f64> = pair_energy_sums(&q, &k, seq, d, layout)
                .iter()
                .map(|x| x / n_causal_pairs(seq) as f64)
                .collect();
            let slow = brute_force(&q, &k, seq, d, layout);
            for (a, b) in fast.iter().zip(&slow) {
                assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn hand_computed_two_positions() {
        // d = 2 (one pair), seq = 2: q = [(1,0), (0,2)], k = [(3,0), (0,1)].
        // a_q = [1, 4], a_k = [9, 1]; pairs (0,0),(1,0),(1,1): 1·9 + 4·9 + 4·1 = 49; mean 49/3.
        let q = [1.0, 0.0, 0.0, 2.0];
        let k = [3.0, 0.0, 0.0, 1.0];
        let e = pair_energy_sums(&q, &k, 2, 2, PairLayout::Adjacent);
        assert_eq!(e, vec![49.0]);
    }

    #[test]
    fn all_energy_in_one_pair_gives_that_theta() {
        let theta = inv_freq(16, 10000.0);
        let mut p = vec![0.0; 8];
        p[3] = 1.0;
        let s = summarise(&p, &theta);
        assert!((s.effective_freq - theta[3]).abs() < 1e-15);
        assert_eq!(s.argmax_freq, theta[3]);
        assert_eq!(s.entropy, 0.0);
    }

    #[test]
    fn equal_energies_give_geometric_mean() {
        let theta = inv_freq(16, 10000.0);
        let p = normalise(&[2.5; 8]);
        let geo = theta.iter().map(|t| t.ln()).sum::<f64>() / 8.0;
        assert!((effective_freq(&p, &theta) - geo.exp()).abs() < 1e-12);
        // Geometric mean of base^(-2i/d), i = 0..7 with d = 16: base^(-7/16).
        assert!((effective_freq(&p, &theta) - 10000f64.powf(-7.0 / 16.0)).abs() < 1e-12);
        assert!((entropy(&p) - 8f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn pooling_averages_normalised_spectra() {
        // Two heads: one all in pair 0, one all in pair 1 → pooled [0.5, 0.5], whatever the scale.
        let energy = vec![vec![vec![100.0, 0.0], vec![0.0, 0.001]]];
        assert_eq!(pooled_spectrum(&energy), vec![0.5, 0.5]);
    }

    #[test]
    fn layer_head_energy_indexes_batch_and_heads() {
        // batch 2, heads 2, seq 1, d 2: energy = a_q·a_k per (b, h), averaged over b.
        let q = vec![1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 4.0, 0.0];
        let k = vec![1.0; 8];
        let e = layer_head_energy(&[(q, k)], 2, 2, 1, 2, PairLayout::Adjacent);
        // head 0: (1·2 + 9·2)/2 = 10; head 1: (4·2 + 16·2)/2 = 20.
        assert_eq!(e, vec![vec![vec![10.0], vec![20.0]]]);
    }
}
