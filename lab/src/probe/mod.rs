//! Frequency-energy probe: which rotary frequencies a trained model actually uses
//! (Wu, Liu, Jadbabaie 2026, arXiv 2607.07678, §3 "frequency energy"; SCIENCE.md §3).
//!
//! For one layer and head, RoPE pair `i` contributes to the score of query `t` and key `s`
//! a sinusoid of amplitude `A_i(t,s) = |q_i(t)|·|k_i(s)|` (`|·|` the 2-D norm of the pair).
//! The pair's **energy** is `E_i = mean_{(t,s) real, s≤t} A_i(t,s)²` over the evaluation batch.
//! Because `A_i² = a_q(t)·a_k(s)` with `a = |·|²`, the mean over causal pairs is
//! `Σ_t a_q(t) · Σ_{s≤t} a_k(s) / (L(L+1)/2)`: a prefix sum, O(L·d) per head, never `L×L×d`.
//!
//! **Real pairs only.** A causal pair `(t, s)` counts when both positions hold a token of the
//! example, not padding: the energy is the mean of `A_i(t,s)²` over the *real* causal pairs of
//! every example of the batch (each pair weighs the same), the prefix sum running over real keys
//! at real queries only. Tasks that right-pad their contexts (iGSM, indirect indexing: token 0
//! after the text) would otherwise mix in the attention of pad queries and keys, and θ_eff would
//! depend on how much padding a context has (issue 51: the same iGSM problems gave θ_eff 0.0203,
//! 0.0425, 0.0655 at `seq_len` 352, 704, 1408). With no padding every pair is real and the
//! arithmetic is the one before (bit for bit).
//!
//! From the normalised spectrum `p_i = E_i / Σ_j E_j`:
//! - effective frequency `θ_eff = exp(Σ_i p_i ln θ_i)` (log-mean, radians per token);
//! - entropy `H = −Σ_i p_i ln p_i` (nats; `ln(d/2)` when uniform, 0 when all energy is in one pair);
//! - argmax frequency `θ_{argmax p}`.
//!
//! A run's single `θ_eff` averages `p` over all layers and heads, then takes the log-mean
//! ([`pooled_spectrum`]). For NoPE the same quantities are computed on the RoPE grid as a
//! control (no rotation is applied, so they measure pair-norm structure only).
//!
//! PoPE (one frequency per component, `θ_c = base^(−(c−1)/d)`): the amplitude is
//! `μ_q,c(t)·μ_k,c(s)` with `μ = softplus`, the same prefix sum applies. TAPA: the frequency of a
//! token pair is `ω = 2π·(q_P·k_P)/√((1−ρ)d)` per unit of `|m−n|^α`; its energy is the
//! amplitude² mass in log-spaced `|ω|` bins ([`tapa_bins`]), an O(L²) computation.

use crate::model::SpectrumMap;
use rayon::prelude::*;

/// Σ over causal pairs `(t, s)`, `s ≤ t`, of `a_q(t, f)·a_k(s, f)` for each frequency `f`.
///
/// `aq`, `ak`: one head's squared amplitudes, row-major `[seq, n_freq]`. Returns `[n_freq]` sums
/// (not yet divided by the number of pairs, so sequences can be added). O(seq·n_freq), by a
/// prefix sum over keys.
pub fn energy_sums(aq: &[f64], ak: &[f64], seq: usize, n_freq: usize) -> Vec<f64> {
    energy_sums_real(aq, ak, seq, n_freq, None)
}

/// [`energy_sums`] over the real causal pairs only: `real[t]` says whether position `t` holds a
/// token of the example (not padding), `[seq]`; `None`: every position is real. A pair
/// `(t, s)` counts when `real[t]` and `real[s]` (see the [module docs](self)).
pub fn energy_sums_real(
    aq: &[f64],
    ak: &[f64],
    seq: usize,
    n_freq: usize,
    real: Option<&[bool]>,
) -> Vec<f64> {
    assert_eq!(aq.len(), seq * n_freq, "aq must be [seq, n_freq]");
    assert_eq!(ak.len(), seq * n_freq, "ak must be [seq, n_freq]");
    if let Some(r) = real {
        assert_eq!(r.len(), seq, "real must be [seq]");
    }
    let mut prefix_k = vec![0.0f64; n_freq];
    let mut sums = vec![0.0f64; n_freq];
    for t in 0..seq {
        if real.is_some_and(|r| !r[t]) {
            continue;
        }
        let row = t * n_freq..(t + 1) * n_freq;
        for ((p, s), (&a_q, &a_k)) in prefix_k
            .iter_mut()
            .zip(sums.iter_mut())
            .zip(aq[row.clone()].iter().zip(&ak[row]))
        {
            *p += a_k;
            *s += a_q * *p;
        }
    }
    sums
}

/// Squared norms `x_a(t)² + x_b(t)²` of the pairs `dims`, `[seq, dims.len()]`, from one head's
/// `x`: `[seq, head_dim]` (other dims are ignored).
pub fn pair_amplitudes(
    x: &[f32],
    seq: usize,
    head_dim: usize,
    dims: &[(usize, usize)],
) -> Vec<f64> {
    let mut out = Vec::with_capacity(seq * dims.len());
    for t in 0..seq {
        let row = &x[t * head_dim..(t + 1) * head_dim];
        for &(a, b) in dims {
            out.push(row[a] as f64 * row[a] as f64 + row[b] as f64 * row[b] as f64);
        }
    }
    out
}

/// PoPE squared magnitudes `softplus(x_c(t))²`, `[seq, head_dim]` (PoPE paper, §3: `μ = softplus(x)`).
pub fn pope_amplitudes(x: &[f32]) -> Vec<f64> {
    x.iter()
        .map(|&v| {
            let v = v as f64;
            let sp = if v > 30.0 { v } else { v.exp().ln_1p() };
            sp * sp
        })
        .collect()
}

pub use crate::model::tapa::{tapa_bin, tapa_bins};

/// TAPA energy sums for one head (SCIENCE.md §3): for every causal pair `(m, n)` the phase
/// frequency is `ω = 2π·(q_P·k_P)/√((1−ρ)d)` (or the linear-ablation phase) per unit of `|m−n|^α`,
/// its amplitude `q_A·k_A/√(ρd)`; the amplitude² is added to the bin of `|ω|` ([`tapa_bins`]).
/// O(seq²·head_dim): TAPA's frequency depends on the token pair.
pub fn tapa_energy_sums(
    q: &[f32],
    k: &[f32],
    seq: usize,
    head_dim: usize,
    amp_dim: usize,
    linear_phase: bool,
) -> Vec<f64> {
    tapa_energy_sums_real(q, k, seq, head_dim, amp_dim, linear_phase, None)
}

/// [`tapa_energy_sums`] over the real causal pairs only (`real`: `[seq]`, `None`: all real).
pub fn tapa_energy_sums_real(
    q: &[f32],
    k: &[f32],
    seq: usize,
    head_dim: usize,
    amp_dim: usize,
    linear_phase: bool,
    real: Option<&[bool]>,
) -> Vec<f64> {
    let p_dim = head_dim - amp_dim;
    let (sa, sp) = ((amp_dim as f64).sqrt(), (p_dim as f64).sqrt());
    let mut sums = vec![0.0f64; tapa_bins().len()];
    let is_real = |t: usize| real.is_none_or(|r| r[t]);
    for m in 0..seq {
        if !is_real(m) {
            continue;
        }
        let qm = &q[m * head_dim..(m + 1) * head_dim];
        for n in 0..=m {
            if !is_real(n) {
                continue;
            }
            let kn = &k[n * head_dim..(n + 1) * head_dim];
            let amp: f64 = (0..amp_dim)
                .map(|j| qm[j] as f64 * kn[j] as f64)
                .sum::<f64>()
                / sa;
            let phase: f64 = if linear_phase {
                (amp_dim..head_dim)
                    .map(|j| qm[j] as f64 + kn[j] as f64)
                    .sum::<f64>()
            } else {
                (amp_dim..head_dim)
                    .map(|j| qm[j] as f64 * kn[j] as f64)
                    .sum::<f64>()
            } / sp;
            let omega = 2.0 * std::f64::consts::PI * phase;
            sums[tapa_bin(omega)] += amp * amp;
        }
    }
    sums
}

/// Energy sums of one head (`q`, `k`: `[seq, head_dim]`) for an encoding read as `map`
/// (its [`Spectrum`](crate::model::Spectrum)'s map): one sum per channel.
pub fn head_energy_sums(
    map: &SpectrumMap,
    q: &[f32],
    k: &[f32],
    seq: usize,
    head_dim: usize,
) -> Vec<f64> {
    head_energy_sums_real(map, q, k, seq, head_dim, None)
}

/// [`head_energy_sums`] over the real causal pairs only (`real`: `[seq]`, `None`: all real;
/// see the [module docs](self)).
pub fn head_energy_sums_real(
    map: &SpectrumMap,
    q: &[f32],
    k: &[f32],
    seq: usize,
    head_dim: usize,
    real: Option<&[bool]>,
) -> Vec<f64> {
    match map {
        SpectrumMap::Pairs { dims } => energy_sums_real(
            &pair_amplitudes(q, seq, head_dim, dims),
            &pair_amplitudes(k, seq, head_dim, dims),
            seq,
            dims.len(),
            real,
        ),
        SpectrumMap::Components => energy_sums_real(
            &pope_amplitudes(q),
            &pope_amplitudes(k),
            seq,
            head_dim,
            real,
        ),
        SpectrumMap::TapaBins {
            amp_dim,
            linear_phase,
        } => tapa_energy_sums_real(q, k, seq, head_dim, *amp_dim, *linear_phase, real),
    }
}

/// Number of causal pairs `(t, s)` with `0 ≤ s ≤ t < seq`: `seq(seq+1)/2`.
pub fn n_causal_pairs(seq: usize) -> usize {
    seq * (seq + 1) / 2
}

/// Number of real causal pairs of one example: `Σ_{t real} #{s ≤ t : s real}` (`real`: `[seq]`).
/// For `r` real positions, `r(r+1)/2` wherever they lie.
pub fn n_real_pairs(real: &[bool]) -> usize {
    n_causal_pairs(real.iter().filter(|&&r| r).count())
}

/// Energy per layer, head and pair, averaged over the real causal pairs of the batch.
///
/// `layers[l] = (q, k)` with `q`, `k` row-major `[batch, heads, seq, head_dim]`; `real`: which
/// positions hold a token (not padding), row-major `[batch, seq]`, `None` when every position
/// does. Returns `energy[l][h][i]` (units of squared activations, squared): the sum over every
/// example's real causal pairs divided by their number (see the [module docs](self)).
pub fn layer_head_energy(
    layers: &[(Vec<f32>, Vec<f32>)],
    batch: usize,
    heads: usize,
    seq: usize,
    head_dim: usize,
    map: &SpectrumMap,
    real: Option<&[bool]>,
) -> Vec<Vec<Vec<f64>>> {
    let (sums, pairs) = layer_head_energy_sums(layers, batch, heads, seq, head_dim, map, real);
    divide_energy(sums, pairs)
}

/// [`layer_head_energy`] before the division: the energy sums over the batch's real causal
/// pairs, `sums[l][h][i]`, and the number of those pairs (so that the sums of several chunks
/// of a batch can be added before dividing).
pub fn layer_head_energy_sums(
    layers: &[(Vec<f32>, Vec<f32>)],
    batch: usize,
    heads: usize,
    seq: usize,
    head_dim: usize,
    map: &SpectrumMap,
    real: Option<&[bool]>,
) -> (Vec<Vec<Vec<f64>>>, usize) {
    if let Some(r) = real {
        assert_eq!(r.len(), batch * seq, "real must be [batch, seq]");
    }
    let per_seq = seq * head_dim;
    let real_of = |b: usize| real.map(|r| &r[b * seq..(b + 1) * seq]);
    let n_pairs: usize = match real {
        None => batch * n_causal_pairs(seq),
        Some(_) => (0..batch).map(|b| n_real_pairs(real_of(b).unwrap())).sum(),
    };
    let sums = layers
        .iter()
        .map(|(q, k)| {
            (0..heads)
                .into_par_iter()
                .map(|h| {
                    let mut total: Vec<f64> = Vec::new();
                    for b in 0..batch {
                        let off = (b * heads + h) * per_seq;
                        let e = head_energy_sums_real(
                            map,
                            &q[off..off + per_seq],
                            &k[off..off + per_seq],
                            seq,
                            head_dim,
                            real_of(b),
                        );
                        if total.is_empty() {
                            total = vec![0.0; e.len()];
                        }
                        for (t, x) in total.iter_mut().zip(e) {
                            *t += x;
                        }
                    }
                    total
                })
                .collect()
        })
        .collect();
    (sums, n_pairs)
}

/// `sums[l][h][i] / pairs`: energy sums over `pairs` real causal pairs into their mean. With no
/// pair (an all-padding batch) the energy is 0 (uniform once normalised).
pub fn divide_energy(sums: Vec<Vec<Vec<f64>>>, pairs: usize) -> Vec<Vec<Vec<f64>>> {
    let norm = pairs.max(1) as f64;
    sums.into_iter()
        .map(|l| {
            l.into_iter()
                .map(|h| h.iter().map(|x| x / norm).collect())
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
    theta[argmax_index(p)]
}

/// Index of the largest value (the first one on ties; 0 for an empty slice).
pub fn argmax_index(xs: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best
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

/// Each layer's spectrum `p̄_l = mean_h p_{l,h}` (normalised spectra of its heads, averaged so every
/// head counts equally) from `energy[l][h][i]`. Returns `[layers][n_freq]`.
pub fn layer_spectra(energy: &[Vec<Vec<f64>>]) -> Vec<Vec<f64>> {
    energy
        .iter()
        .map(|layer| pooled_spectrum(std::slice::from_ref(layer)))
        .collect()
}

/// Kullback–Leibler divergence `KL(p‖q) = Σ_i p_i ln(p_i/q_i)` in nats, for normalised spectra on
/// the same grid. Terms with `p_i = 0` contribute 0; `q_i` is floored at `1e-12` so a frequency
/// that had no energy at initialisation gives a large but finite value.
pub fn kl_divergence(p: &[f64], q: &[f64]) -> f64 {
    assert_eq!(p.len(), q.len(), "spectra on different grids");
    p.iter()
        .zip(q)
        .filter(|(pi, _)| **pi > 0.0)
        .map(|(pi, qi)| pi * (pi / qi.max(1e-12)).ln())
        .sum()
}

/// The run's positional layer (docs/analysis-rules.md, R2): the layer whose spectrum moved
/// furthest from its own initialisation, `argmax_l KL(p̄_l^final ‖ p̄_l^init)`, lowest layer on
/// ties. `init`, `last`: `[layers][n_freq]` layer spectra ([`layer_spectra`]). Returns the layer
/// and every layer's KL (nats); `None` when there is no layer.
pub fn positional_layer(init: &[Vec<f64>], last: &[Vec<f64>]) -> Option<(usize, Vec<f64>)> {
    let kls: Vec<f64> = init
        .iter()
        .zip(last)
        .map(|(q, p)| kl_divergence(p, q))
        .collect();
    (!kls.is_empty()).then(|| (argmax_index(&kls), kls))
}

/// [`positional_layer`] restricted to the layers with `candidates[l]` (hybrid models: the
/// layers that use the run's encoding, docs/analysis-rules.md R2). `None` when no layer is a
/// candidate. The KLs of every layer are returned.
pub fn positional_layer_among(
    init: &[Vec<f64>],
    last: &[Vec<f64>],
    candidates: &[bool],
) -> Option<(usize, Vec<f64>)> {
    let (_, kls) = positional_layer(init, last)?;
    let masked: Vec<f64> = kls
        .iter()
        .zip(candidates)
        .map(|(&k, &c)| if c { k } else { f64::NEG_INFINITY })
        .collect();
    candidates
        .iter()
        .any(|&c| c)
        .then(|| (argmax_index(&masked), kls))
}

/// Mean attention weight per lag `Δ = t − s` over the query positions `queries` (SCIENCE.md §8,
/// "where the positional work happens": what a layer attends to).
///
/// `weights`: one head's causal attention probabilities, row-major `[seq, seq]` (row = query
/// `t`, column = key `s`, zero above the diagonal); `queries`: the query positions to average
/// over (e.g. the task's scored positions). Returns `[seq]` sums of weights per lag (not yet
/// divided by the number of queries, so heads and batches can be added): dividing by
/// `queries.len()` gives a distribution over lags.
pub fn attention_lag_sums(weights: &[f32], seq: usize, queries: &[usize]) -> Vec<f64> {
    assert_eq!(weights.len(), seq * seq, "weights must be [seq, seq]");
    let mut sums = vec![0.0f64; seq];
    for &t in queries {
        let row = &weights[t * seq..(t + 1) * seq];
        for (s, &w) in row[..=t].iter().enumerate() {
            sums[t - s] += w as f64;
        }
    }
    sums
}

/// The lag with the largest share of a lag profile and that share (first lag on ties).
pub fn top_lag(profile: &[f64]) -> (usize, f64) {
    let best = argmax_index(profile);
    (best, profile.get(best).copied().unwrap_or(0.0))
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
    use crate::model::PairLayout;
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

    /// RoPE's channels: every pair of `layout` over the whole head.
    fn pairs(layout: PairLayout, d: usize) -> SpectrumMap {
        SpectrumMap::Pairs {
            dims: (0..d / 2).map(|i| layout.pair_dims(i, d)).collect(),
        }
    }

    #[test]
    fn prefix_sum_equals_brute_force_on_random_inputs() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let (seq, d) = (37, 12);
        let q: Vec<f32> = (0..seq * d).map(|_| rng.random_range(-2.0..2.0)).collect();
        let k: Vec<f32> = (0..seq * d).map(|_| rng.random_range(-2.0..2.0)).collect();
        for layout in [PairLayout::Adjacent, PairLayout::RotateHalf] {
            let fast: Vec<f64> = head_energy_sums(&pairs(layout, d), &q, &k, seq, d)
                .iter()
                .map(|x| x / n_causal_pairs(seq) as f64)
                .collect();
            let slow = brute_force(&q, &k, seq, d, layout);
            for (a, b) in fast.iter().zip(&slow) {
                assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{a} vs {b}");
            }
        }
    }

    /// The energy over real pairs is the brute-force mean over the pairs whose two positions are
    /// real, wherever the padding lies; and right padding (whatever its q, k hold) leaves a
    /// sequence's spectrum exactly as without it, at any amount of padding.
    #[test]
    fn padding_is_left_out_of_the_energy() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let (seq, d) = (23, 8);
        let map = pairs(PairLayout::Adjacent, d);
        let q: Vec<f32> = (0..seq * d).map(|_| rng.random_range(-2.0..2.0)).collect();
        let k: Vec<f32> = (0..seq * d).map(|_| rng.random_range(-2.0..2.0)).collect();
        // Scattered pad positions: the brute force over real pairs.
        let real: Vec<bool> = (0..seq).map(|t| t % 3 != 1).collect();
        let mut slow = vec![0.0f64; d / 2];
        let mut n = 0usize;
        for t in (0..seq).filter(|&t| real[t]) {
            for s in (0..=t).filter(|&s| real[s]) {
                n += 1;
                for (i, e) in slow.iter_mut().enumerate() {
                    let a = |x: &[f32], p: usize| {
                        (x[p * d + 2 * i] as f64).powi(2) + (x[p * d + 2 * i + 1] as f64).powi(2)
                    };
                    *e += a(&q, t) * a(&k, s);
                }
            }
        }
        assert_eq!(n, n_real_pairs(&real));
        let fast = head_energy_sums_real(&map, &q, &k, seq, d, Some(&real));
        for (a, b) in fast.iter().zip(&slow) {
            assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{a} vs {b}");
        }
        // Right padding: 9 real positions, then 14 pad positions of large values. Every
        // encoding's map, one head, two examples with different amounts of padding.
        let maps = [
            map.clone(),
            SpectrumMap::Components,
            SpectrumMap::TapaBins {
                amp_dim: 4,
                linear_phase: false,
            },
        ];
        for m in &maps {
            let prefix = 9;
            let own = head_energy_sums(m, &q[..prefix * d], &k[..prefix * d], prefix, d);
            let mut padded_q = q.clone();
            let mut padded_k = k.clone();
            for x in padded_q[prefix * d..]
                .iter_mut()
                .chain(&mut padded_k[prefix * d..])
            {
                *x = 50.0;
            }
            let real: Vec<bool> = (0..seq).map(|t| t < prefix).collect();
            let with_pad = head_energy_sums_real(m, &padded_q, &padded_k, seq, d, Some(&real));
            assert_eq!(own, with_pad, "{m:?}");
            // All real: the unmasked sums, bit for bit.
            let all = vec![true; seq];
            assert_eq!(
                head_energy_sums_real(m, &q, &k, seq, d, Some(&all)),
                head_energy_sums(m, &q, &k, seq, d)
            );
        }
        // layer_head_energy: one head, two examples of seq 4 with 2 and 3 real positions; the
        // mean over their 3 + 6 real pairs. d = 2, q = k = (1, 0) everywhere: every pair's
        // energy is 1, so the mean is 1 however the pairs are counted — and the pad positions
        // hold 10, which must not enter.
        let mut x = vec![0.0f32; 2 * 4 * 2];
        for (t, v) in x.chunks_mut(2).enumerate() {
            let (b, pos) = (t / 4, t % 4);
            v[0] = if pos < 2 + b { 1.0 } else { 10.0 };
        }
        let real = [true, true, false, false, true, true, true, false];
        let map = SpectrumMap::Pairs { dims: vec![(0, 1)] };
        let e = layer_head_energy(&[(x.clone(), x.clone())], 2, 1, 4, 2, &map, Some(&real));
        assert_eq!(e, vec![vec![vec![1.0]]]);
        let e = layer_head_energy(&[(x.clone(), x)], 2, 1, 4, 2, &map, None);
        assert!(e[0][0][0] > 100.0, "{e:?}");
    }

    #[test]
    fn hand_computed_two_positions() {
        // d = 2 (one pair), seq = 2: q = [(1,0), (0,2)], k = [(3,0), (0,1)].
        // a_q = [1, 4], a_k = [9, 1]; pairs (0,0),(1,0),(1,1): 1·9 + 4·9 + 4·1 = 49; mean 49/3.
        let q = [1.0, 0.0, 0.0, 2.0];
        let k = [3.0, 0.0, 0.0, 1.0];
        let e = head_energy_sums(&pairs(PairLayout::Adjacent, 2), &q, &k, 2, 2);
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
    fn layer_spectra_average_heads_per_layer() {
        // Layer 0: heads all in pair 0 and all in pair 1 → [0.5, 0.5]; layer 1: one head [1, 3].
        let energy = vec![vec![vec![7.0, 0.0], vec![0.0, 0.2]], vec![vec![1.0, 3.0]]];
        assert_eq!(
            layer_spectra(&energy),
            vec![vec![0.5, 0.5], vec![0.25, 0.75]]
        );
    }

    #[test]
    fn kl_hand_computed() {
        // KL([1/2, 1/2] ‖ [1/4, 3/4]) = ½ ln 2 + ½ ln(2/3).
        let k = kl_divergence(&[0.5, 0.5], &[0.25, 0.75]);
        assert!((k - (0.5 * 2f64.ln() + 0.5 * (2.0f64 / 3.0).ln())).abs() < 1e-15);
        assert_eq!(kl_divergence(&[0.3, 0.7], &[0.3, 0.7]), 0.0);
        // A zero share in p contributes nothing; a zero in q is floored, not infinite.
        assert_eq!(kl_divergence(&[0.0, 1.0], &[0.5, 0.5]), 2f64.ln());
        assert!(kl_divergence(&[1.0, 0.0], &[0.0, 1.0]).is_finite());
    }

    #[test]
    fn positional_layer_is_the_one_that_moved_most() {
        let uniform = vec![0.25; 4];
        let init = vec![uniform.clone(), uniform.clone(), uniform.clone()];
        // Layer 1 concentrates most; layer 2 a little; layer 0 not at all.
        let last = vec![
            uniform.clone(),
            vec![0.85, 0.05, 0.05, 0.05],
            vec![0.4, 0.2, 0.2, 0.2],
        ];
        let (l, kls) = positional_layer(&init, &last).unwrap();
        assert_eq!(l, 1);
        assert_eq!(kls[0], 0.0);
        assert!(kls[1] > kls[2] && kls[2] > 0.0);
        // Ties go to the lower layer.
        let (l, _) = positional_layer(&init[..2], &[last[1].clone(), last[1].clone()]).unwrap();
        assert_eq!(l, 0);
        assert!(positional_layer(&[], &[]).is_none());
        // Hybrid models: layer 1 (NoPE) is not a candidate, so layer 2 (moved more than 0).
        let (l, kls) = positional_layer_among(&init, &last, &[true, false, true]).unwrap();
        assert_eq!((l, kls.len()), (2, 3));
        assert!(positional_layer_among(&init, &last, &[false, false, false]).is_none());
    }

    #[test]
    fn attention_lags_hand_computed() {
        // seq 3: query 1 puts 0.25 on key 0 (lag 1) and 0.75 on itself; query 2 puts all on
        // key 0 (lag 2). Query 0 is not averaged.
        let w = [1.0f32, 0.0, 0.0, 0.25, 0.75, 0.0, 1.0, 0.0, 0.0];
        let sums = attention_lag_sums(&w, 3, &[1, 2]);
        assert_eq!(sums, vec![0.75, 0.25, 1.0]);
        assert_eq!(top_lag(&sums), (2, 1.0));
        assert_eq!(top_lag(&[0.5, 0.5]), (0, 0.5));
    }

    #[test]
    fn pope_amplitude_is_squared_softplus() {
        let a = pope_amplitudes(&[0.0, 1.0, 40.0]);
        assert!((a[0] - 2f64.ln().powi(2)).abs() < 1e-12);
        assert!((a[1] - (1.0 + 1f64.exp()).ln().powi(2)).abs() < 1e-12);
        assert!((a[2] - 1600.0).abs() < 1e-6);
    }

    /// TAPA, d = 2 (ρ = 0.5: one amplitude and one phase dimension), seq = 2:
    /// q = [(1, 1), (2, 1)], k = [(1, 1.2/2π), (1, 0)].
    /// Pairs: (0,0) amp 1, ω = 1.2; (1,0) amp 2, ω = 1.2; (1,1) amp 2, ω = 0 (→ first bin).
    #[test]
    fn tapa_energy_hand_computed() {
        let tau = 2.0 * std::f32::consts::PI;
        let q = [1.0f32, 1.0, 2.0, 1.0];
        let k = [1.0f32, 1.2 / tau, 1.0, 0.0];
        let e = tapa_energy_sums(&q, &k, 2, 2, 1, false);
        let bins = tapa_bins();
        // Bins are 1/6 decade wide from 10^−2: ω = 1.2 (log10 = 0.079) is in bin 12, centre 10^(1/12).
        assert!((bins[12] - 10f64.powf(1.0 / 12.0)).abs() < 1e-12);
        assert!((e[12] - 5.0).abs() < 1e-5, "{e:?}");
        assert!((e[0] - 4.0).abs() < 1e-9, "{e:?}");
        assert!((e.iter().sum::<f64>() - 9.0).abs() < 1e-5);
    }

    #[test]
    fn layer_head_energy_indexes_batch_and_heads() {
        // batch 2, heads 2, seq 1, d 2: energy = a_q·a_k per (b, h), averaged over b.
        let q = vec![1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 4.0, 0.0];
        let k = vec![1.0; 8];
        let map = SpectrumMap::Pairs { dims: vec![(0, 1)] };
        let e = layer_head_energy(&[(q, k)], 2, 2, 1, 2, &map, None);
        // head 0: (1·2 + 9·2)/2 = 10; head 1: (4·2 + 16·2)/2 = 20.
        assert_eq!(e, vec![vec![vec![10.0], vec![20.0]]]);
    }
}
