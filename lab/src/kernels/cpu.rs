//! Flash-style causal attention on the CPU, forward and backward, for NoPE, RoPE, PoPE and TAPA
//! (Dao et al. 2022, *FlashAttention*, Alg. 1; Dao 2023, *FlashAttention-2*, Alg. 1–2).
//!
//! Plain Rust on `f32` slices, parallel over `batch × heads` with rayon. The score matrix is never
//! stored: keys are visited in tiles of [`TILE`] with an online softmax (running max `m`, running
//! sum `l`), and the forward saves only the output and the log-sum-exp `lse = m + ln l` per query
//! row, from which the backward recomputes the probabilities tile by tile. Memory is O(L·d) per
//! head (a few `[seq, head_dim]` work buffers).
//!
//! **Encodings inside the kernel.** Each head's q and k are first mapped to score-space vectors
//! `q̃`, `k̃` (RoPE: rotated by position, times YaRN's attention factor; PoPE: the `2d`-vectors
//! `[μ cos(tθ), μ sin(tθ)]` with `μ = softplus`, key phases shifted by δ; NoPE: unchanged), so
//! that the score is the dot product `q̃·k̃/√d`. The backward computes `dq̃`, `dk̃` and maps them
//! back through that map's Jacobian (RoPE: the opposite rotation; PoPE: the chain rule through
//! softplus and the phase, which also gives `dδ`). TAPA's score is not a dot product and has its
//! own tile functions: `A_ij·cos(2π·|i−j|^α·P_ij)` with `A`, `P` two dot products.
//!
//! **Vectorisation.** Keys are stored transposed (`[dim, seq]`), so a tile of scores is `dim`
//! broadcast-multiply-adds over contiguous key rows, with no horizontal sums; probabilities use a
//! branch-free `exp` ([`exp_approx`], relative error < 3e-7, about 2 ulp) that vectorises. Each head's loop is
//! compiled three times (AVX-512, AVX2+FMA, baseline) and the best one the CPU supports is chosen
//! at run time, so the binary stays portable across cluster nodes.
//!
//! Layout: every tensor is row-major `[batch, heads, seq, head_dim]`; `lse` is `[batch, heads, seq]`.
//! Under the causal mask every query sees at least its own key, so no row is fully masked; a row
//! with no visible key would give zeros, never NaN.
//!
//! Equivalence with the reference attention ([`crate::model::causal_attention`], burn tensor ops
//! with autodiff) is tested below and in `lab/tests/fused_attention.rs`.

use rayon::prelude::*;

pub use super::map::KernelEncoding;
use super::map::{PairLayout, TapaPhase};

/// Key tile length (tokens).
pub const TILE: usize = 64;

/// Shape `[batch, heads, seq, head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape4 {
    /// Batch.
    pub batch: usize,
    /// Heads.
    pub heads: usize,
    /// Sequence length.
    pub seq: usize,
    /// Head dimension.
    pub head_dim: usize,
}

impl Shape4 {
    fn slice_len(&self) -> usize {
        self.seq * self.head_dim
    }
    fn n(&self) -> usize {
        self.batch * self.heads * self.slice_len()
    }
}

/// Gradients returned by [`flash_backward`].
#[derive(Clone, Debug, PartialEq)]
pub struct FlashGrads {
    /// `∂L/∂q`, like `q`.
    pub dq: Vec<f32>,
    /// `∂L/∂k`, like `k`.
    pub dk: Vec<f32>,
    /// `∂L/∂v`, like `v`.
    pub dv: Vec<f32>,
    /// PoPE only: `∂L/∂δ`, `[heads · head_dim]` (summed over batch and positions).
    pub ddelta: Option<Vec<f32>>,
}

// ---------------------------------------------------------------------------------------------
// Small vector helpers (inlined into each target-feature copy of the head loops).

/// `e^x` for `x ≤ 88`, branch-free so that loops over it vectorise: `x = k·ln2 + r` with
/// `|r| ≤ ln2/2`, `e^r` by its degree-6 Taylor polynomial (truncation `|r|^7/7! < 1.2e-7`
/// relative, plus f32 rounding: < 3e-7 overall, tested), `2^k` by writing the exponent bits. Inputs below −87 give ≈ 1e-38 instead of
/// denormals (a softmax weight that small is zero to f32 anyway).
#[inline(always)]
pub fn exp_approx(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5·2^23: adding and subtracting it rounds to an integer
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2E + ROUND;
    let k = shifted - ROUND;
    let r = x - k * LN2_HI - k * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // `k` as an integer from the bits of `shifted` (its mantissa holds `2^22 + k`): the same value
    // as `k as i32`, whose saturating conversion LLVM does lane by lane (a third of a GELU pass).
    let k_int = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    f32::from_bits(((k_int + 127) << 23) as u32) * p
}

#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `Σ a_i·b_i` in 16 independent lanes (a vectorisable order), the lanes then added in order,
/// then the remainder.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut total: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        total += x * y;
    }
    total
}

/// `y += Σ_t c[t] · x[(j0 + t)·w .. (j0 + t)·w + y.len()]` with `w = y.len()`: a weighted sum of
/// consecutive rows, four rows per pass over `y` (so the accumulation in `y` is not one long
/// dependency chain through memory).
#[inline(always)]
fn axpy_rows(y: &mut [f32], c: &[f32], x: &[f32], j0: usize) {
    let w = y.len();
    let mut chunks = c.chunks_exact(4);
    let mut j = j0;
    for c4 in &mut chunks {
        let (r0, r1) = (&x[j * w..(j + 1) * w], &x[(j + 1) * w..(j + 2) * w]);
        let (r2, r3) = (&x[(j + 2) * w..(j + 3) * w], &x[(j + 3) * w..(j + 4) * w]);
        for i in 0..w {
            y[i] += c4[0] * r0[i] + c4[1] * r1[i] + c4[2] * r2[i] + c4[3] * r3[i];
        }
        j += 4;
    }
    for &ct in chunks.remainder() {
        axpy(y, ct, &x[j * w..(j + 1) * w]);
        j += 1;
    }
}

/// Maximum of `s` with 16 independent lanes (a plain fold is a serial chain).
#[inline(always)]
fn max_lanes(s: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let chunks = s.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..16 {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    let mut m = rest.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for a in acc {
        m = m.max(a);
    }
    m
}

/// `s[t] = e^(s[t] − shift)` in place; returns the sum (16 independent lanes).
#[inline(always)]
fn exp_shift_sum(s: &mut [f32], shift: f32) -> f32 {
    let mut acc = [0.0f32; 16];
    let mut chunks = s.chunks_exact_mut(16);
    for c in &mut chunks {
        for l in 0..16 {
            c[l] = exp_approx(c[l] - shift);
            acc[l] += c[l];
        }
    }
    let mut total = 0.0f32;
    for x in chunks.into_remainder() {
        *x = exp_approx(*x - shift);
        total += *x;
    }
    total + acc.iter().sum::<f32>()
}

/// `[rows, cols]` → `[cols, rows]`.
fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

/// `s[t] += Σ_c a[c] · bt[c·stride + j0 + t]` for `t < s.len()`: a row of `a` against a tile of
/// transposed rows `bt`. A full tile is accumulated in a fixed-size local array (registers).
#[inline(always)]
fn tile_dot(s: &mut [f32], a: &[f32], bt: &[f32], stride: usize, j0: usize) {
    if s.len() == TILE {
        let mut acc = [0.0f32; TILE];
        acc.copy_from_slice(s);
        tile_dot_n(&mut acc, a, bt, stride, j0);
        s.copy_from_slice(&acc);
    } else {
        tile_dot_n(s, a, bt, stride, j0);
    }
}

#[inline(always)]
fn tile_dot_n(s: &mut [f32], a: &[f32], bt: &[f32], stride: usize, j0: usize) {
    let n = s.len();
    let row = |c: usize| &bt[c * stride + j0..c * stride + j0 + n];
    let mut chunks = a.chunks_exact(4);
    let mut c = 0;
    for a4 in &mut chunks {
        let (r0, r1, r2, r3) = (row(c), row(c + 1), row(c + 2), row(c + 3));
        for t in 0..n {
            s[t] += a4[0] * r0[t] + a4[1] * r1[t] + a4[2] * r2[t] + a4[3] * r3[t];
        }
        c += 4;
    }
    for &ac in chunks.remainder() {
        for (s, &b) in s.iter_mut().zip(row(c)) {
            *s += ac * b;
        }
        c += 1;
    }
}

/// `ln y` for normal `y > 0`, branch-free so that loops over it vectorise: `y = 2^e·m` with
/// `m ∈ [√½, √2)`, `ln m = 2 atanh s`, `s = (m−1)/(m+1)`, `|s| ≤ 0.172`, by its series to `s⁹`
/// (truncation `2|s|¹¹/11 < 2e-9`), plus f32 rounding (tested: < 2.5e-7 absolute on [1, 2]).
#[inline(always)]
pub fn ln_approx(y: f32) -> f32 {
    const SQRT_HALF_BITS: i32 = 0x3f35_04f3;
    let bits = y.to_bits() as i32;
    let e = (bits - SQRT_HALF_BITS) >> 23;
    let m = f32::from_bits((bits - (e << 23)) as u32);
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let series = 1.0 + s2 * (1.0 / 3.0 + s2 * (1.0 / 5.0 + s2 * (1.0 / 7.0 + s2 * (1.0 / 9.0))));
    e as f32 * std::f32::consts::LN_2 + 2.0 * s * series
}

/// `softplus(x) = ln(1 + eˣ) = max(x, 0) + ln(1 + e^−|x|)`, vectorisable (f32, [`exp_approx`],
/// [`ln_approx`]); `ln(1 + u)` is corrected by `(u − ((1 + u) − 1))/(1 + u)` so that it keeps
/// its relative precision for small `u` (very negative `x`, where softplus ≈ eˣ). Tested against
/// f64 to 1e-6 relative on [−30, 30]. PoPE's magnitude map (Gopalakrishnan et al. 2025, eq. 3).
#[inline(always)]
pub fn softplus_approx(x: f32) -> f32 {
    let u = exp_approx(-x.abs());
    let y = 1.0 + u;
    x.max(0.0) + ln_approx(y) + (u - (y - 1.0)) / y
}

/// `σ(x) = 1/(1 + e^−x)`, vectorisable (f32, [`exp_approx`]); the derivative of softplus.
#[inline(always)]
pub fn sigmoid_approx(x: f32) -> f32 {
    1.0 / (1.0 + exp_approx(-x))
}

// ---------------------------------------------------------------------------------------------
// Score functions of one head.

/// One head's score function, tile by tile.
trait HeadScore {
    /// `s[t] = score(i, j0 + t)` for `t < s.len()`.
    fn scores(&self, i: usize, j0: usize, s: &mut [f32]);
    /// Add the gradient of `Σ_t ds[t] · score(i, j0 + t)` to the score-space gradients of query
    /// `i` and keys `j0..j0 + ds.len()`.
    fn accumulate(&mut self, i: usize, j0: usize, ds: &[f32]);
}

/// Dot-product scores `q̃_i·k̃_j` (NoPE, RoPE, PoPE after their maps); `q̃` pre-scaled by `1/√d`.
struct DotScore {
    l: usize,
    e: usize,
    /// `q̃/√d`, `[l, e]`.
    qs: Vec<f32>,
    /// `k̃`, `[l, e]`.
    k: Vec<f32>,
    /// `k̃ᵀ`, `[e, l]`.
    kt: Vec<f32>,
    /// `∂/∂q̃` before the `1/√d` factor, `[l, e]`.
    dq: Vec<f32>,
    /// `∂/∂k̃`, `[l, e]`.
    dk: Vec<f32>,
}

impl DotScore {
    fn new(q: Vec<f32>, k: Vec<f32>, l: usize, e: usize, scale: f32, grads: bool) -> Self {
        let qs: Vec<f32> = q.iter().map(|x| x * scale).collect();
        let kt = transpose(&k, l, e);
        let (dq, dk) = if grads {
            (vec![0.0; l * e], vec![0.0; l * e])
        } else {
            (Vec::new(), Vec::new())
        };
        Self {
            l,
            e,
            qs,
            k,
            kt,
            dq,
            dk,
        }
    }
}

impl HeadScore for DotScore {
    #[inline(always)]
    fn scores(&self, i: usize, j0: usize, s: &mut [f32]) {
        s.fill(0.0);
        tile_dot(
            s,
            &self.qs[i * self.e..(i + 1) * self.e],
            &self.kt,
            self.l,
            j0,
        );
    }

    #[inline(always)]
    fn accumulate(&mut self, i: usize, j0: usize, ds: &[f32]) {
        let e = self.e;
        let qi = &self.qs[i * e..(i + 1) * e];
        axpy_rows(&mut self.dq[i * e..(i + 1) * e], ds, &self.k, j0);
        for (t, &g) in ds.iter().enumerate() {
            let j = j0 + t;
            axpy(&mut self.dk[j * e..(j + 1) * e], g, qi);
        }
    }
}

/// TAPA scores `A_ij · cos(2π·|i−j|^α·P_ij)` (Wang et al. 2025, eq. 3), with
/// `A = q_A·k_A/√a` and `P = q_P·k_P/√p` (quadratic) or `(Σq_P + Σk_P)/√p` (linear).
struct TapaScore {
    l: usize,
    a: usize,
    p: usize,
    linear: bool,
    /// `q_A/√a`, `[l, a]`; `k_A`, `[l, a]` and its transpose.
    qa: Vec<f32>,
    ka: Vec<f32>,
    kat: Vec<f32>,
    /// Quadratic: `q_P/√p`, `[l, p]`; `k_P`, `[l, p]` and its transpose.
    qp: Vec<f32>,
    kp: Vec<f32>,
    kpt: Vec<f32>,
    /// Linear: `Σ q_P/√p` and `Σ k_P/√p` per position.
    sq: Vec<f32>,
    sk: Vec<f32>,
    /// `2π·dist^α` for `dist = 0..l` (0 at distance 0).
    dist: Vec<f32>,
    /// Gradients w.r.t. the (pre-scaled) parts: `dqa` before `1/√a`, `dqp`/`dsq` before `1/√p`.
    dqa: Vec<f32>,
    dka: Vec<f32>,
    dqp: Vec<f32>,
    dkp: Vec<f32>,
    dsq: Vec<f32>,
    dsk: Vec<f32>,
    /// Scratch for one tile's `A` and `P`.
    amp: Vec<f32>,
    phase: Vec<f32>,
}

impl TapaScore {
    fn new(
        q: &[f32],
        k: &[f32],
        l: usize,
        d: usize,
        amp_dim: usize,
        alpha: f64,
        phase: TapaPhase,
        gain: f64,
    ) -> Self {
        let (a, p) = (amp_dim, d - amp_dim);
        let part = |x: &[f32], from: usize, width: usize, scale: f32| -> Vec<f32> {
            let mut out = Vec::with_capacity(l * width);
            for t in 0..l {
                out.extend(
                    x[t * d + from..t * d + from + width]
                        .iter()
                        .map(|v| v * scale),
                );
            }
            out
        };
        let (sa, sp) = (1.0 / (a as f32).sqrt(), 1.0 / (p as f32).sqrt());
        let qa = part(q, 0, a, sa);
        let ka = part(k, 0, a, 1.0);
        let kat = transpose(&ka, l, a);
        let linear = phase == TapaPhase::Linear;
        let (qp, kp, kpt, sq, sk) = if linear {
            let sum = |x: &[f32]| -> Vec<f32> {
                (0..l)
                    .map(|t| x[t * d + a..(t + 1) * d].iter().sum::<f32>() * sp)
                    .collect()
            };
            (Vec::new(), Vec::new(), Vec::new(), sum(q), sum(k))
        } else {
            let qp = part(q, a, p, sp);
            let kp = part(k, a, p, 1.0);
            let kpt = transpose(&kp, l, p);
            (qp, kp, kpt, Vec::new(), Vec::new())
        };
        // The phase gain rides on the distance table: forward and backward both read it.
        let two_pi = 2.0 * std::f64::consts::PI * gain;
        let dist = (0..l)
            .map(|n| {
                if n == 0 {
                    0.0
                } else {
                    (two_pi * (n as f64).powf(alpha)) as f32
                }
            })
            .collect();
        Self {
            l,
            a,
            p,
            linear,
            qa,
            ka,
            kat,
            qp,
            kp,
            kpt,
            sq,
            sk,
            dist,
            dqa: Vec::new(),
            dka: Vec::new(),
            dqp: Vec::new(),
            dkp: Vec::new(),
            dsq: Vec::new(),
            dsk: Vec::new(),
            amp: vec![0.0; TILE],
            phase: vec![0.0; TILE],
        }
    }

    fn with_grads(mut self) -> Self {
        let l = self.l;
        self.dqa = vec![0.0; l * self.a];
        self.dka = vec![0.0; l * self.a];
        if self.linear {
            self.dsq = vec![0.0; l];
            self.dsk = vec![0.0; l];
        } else {
            self.dqp = vec![0.0; l * self.p];
            self.dkp = vec![0.0; l * self.p];
        }
        self
    }

    /// Fills `amp[..n]` with `A` and `phase[..n]` with the cosine's argument `2π·D·P`.
    #[inline(always)]
    fn parts(&self, i: usize, j0: usize, n: usize, amp: &mut [f32], phase: &mut [f32]) {
        let (amp, phase) = (&mut amp[..n], &mut phase[..n]);
        amp.fill(0.0);
        tile_dot(
            amp,
            &self.qa[i * self.a..(i + 1) * self.a],
            &self.kat,
            self.l,
            j0,
        );
        if self.linear {
            for (t, x) in phase.iter_mut().enumerate() {
                *x = self.sq[i] + self.sk[j0 + t];
            }
        } else {
            phase.fill(0.0);
            tile_dot(
                phase,
                &self.qp[i * self.p..(i + 1) * self.p],
                &self.kpt,
                self.l,
                j0,
            );
        }
        for (t, x) in phase.iter_mut().enumerate() {
            *x *= self.dist[i - (j0 + t)];
        }
    }
}

impl HeadScore for TapaScore {
    #[inline(always)]
    fn scores(&self, i: usize, j0: usize, s: &mut [f32]) {
        let n = s.len();
        let mut phase = [0.0f32; TILE];
        self.parts(i, j0, n, s, &mut phase);
        for (s, &ph) in s.iter_mut().zip(&phase[..n]) {
            *s *= ph.cos();
        }
    }

    #[inline(always)]
    fn accumulate(&mut self, i: usize, j0: usize, ds: &[f32]) {
        let n = ds.len();
        let (mut amp, mut phase) = (
            std::mem::take(&mut self.amp),
            std::mem::take(&mut self.phase),
        );
        self.parts(i, j0, n, &mut amp, &mut phase);
        let (a, p) = (self.a, self.p);
        for t in 0..n {
            let j = j0 + t;
            let (c, s) = (phase[t].cos(), phase[t].sin());
            // s_ij = A·cos φ, φ = 2π·D·P: ∂s/∂A = cos φ, ∂s/∂P = −A·sin φ·2π·D.
            let g_amp = ds[t] * c;
            let g_p = -ds[t] * amp[t] * s * self.dist[i - j];
            axpy(
                &mut self.dqa[i * a..(i + 1) * a],
                g_amp,
                &self.ka[j * a..(j + 1) * a],
            );
            axpy(
                &mut self.dka[j * a..(j + 1) * a],
                g_amp,
                &self.qa[i * a..(i + 1) * a],
            );
            if self.linear {
                self.dsq[i] += g_p;
                self.dsk[j] += g_p;
            } else {
                axpy(
                    &mut self.dqp[i * p..(i + 1) * p],
                    g_p,
                    &self.kp[j * p..(j + 1) * p],
                );
                axpy(
                    &mut self.dkp[j * p..(j + 1) * p],
                    g_p,
                    &self.qp[i * p..(i + 1) * p],
                );
            }
        }
        self.amp = amp;
        self.phase = phase;
    }
}

// ---------------------------------------------------------------------------------------------
// The head loops, generic over the score, compiled once per instruction set.

/// Forward of one head: `o` `[l, d]` and `lse` `[l]`.
#[inline(always)]
fn head_forward_impl<S: HeadScore>(
    sc: &S,
    v: &[f32],
    l: usize,
    d: usize,
    o: &mut [f32],
    lse: &mut [f32],
) {
    let mut s = [0.0f32; TILE];
    for i in 0..l {
        let oi = &mut o[i * d..(i + 1) * d];
        oi.fill(0.0);
        let (mut m, mut sum) = (f32::NEG_INFINITY, 0.0f32);
        for j0 in (0..=i).step_by(TILE) {
            let n = (i + 1 - j0).min(TILE);
            let s = &mut s[..n];
            sc.scores(i, j0, s);
            let tile_max = max_lanes(s);
            let m_new = m.max(tile_max);
            let correction = if m == f32::NEG_INFINITY {
                0.0
            } else {
                (m - m_new).exp()
            };
            let tile_sum = exp_shift_sum(s, m_new);
            sum = sum * correction + tile_sum;
            if correction != 1.0 {
                for x in oi.iter_mut() {
                    *x *= correction;
                }
            }
            axpy_rows(oi, s, v, j0);
            m = m_new;
        }
        if sum > 0.0 && sum.is_finite() {
            let inv = 1.0 / sum;
            for x in oi.iter_mut() {
                *x *= inv;
            }
            lse[i] = m + sum.ln();
        } else {
            oi.fill(0.0);
            lse[i] = f32::NEG_INFINITY;
        }
    }
}

/// Backward of one head: score-space gradients go to `sc`, `dv` `[l, d]` is written.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn head_backward_impl<S: HeadScore>(
    sc: &mut S,
    vt: &[f32],
    out: &[f32],
    dout: &[f32],
    lse: &[f32],
    l: usize,
    d: usize,
    dv: &mut [f32],
) {
    let mut s = [0.0f32; TILE];
    let mut dp = [0.0f32; TILE];
    dv.fill(0.0);
    for i in 0..l {
        if lse[i] == f32::NEG_INFINITY {
            continue;
        }
        let doi = &dout[i * d..(i + 1) * d];
        // D_i = rowsum(dO ∘ O) (FlashAttention-2, Alg. 2 line 4).
        let delta_i = dot(doi, &out[i * d..(i + 1) * d]);
        for j0 in (0..=i).step_by(TILE) {
            let n = (i + 1 - j0).min(TILE);
            let (s, dp) = (&mut s[..n], &mut dp[..n]);
            sc.scores(i, j0, s);
            exp_shift_sum(s, lse[i]);
            // dP_ij = dO_i · V_j
            dp.fill(0.0);
            tile_dot(dp, doi, vt, l, j0);
            // dV_j += P_ij dO_i
            for (t, &p) in s.iter().enumerate() {
                axpy(&mut dv[(j0 + t) * d..(j0 + t + 1) * d], p, doi);
            }
            // dS_ij = P_ij (dP_ij − D_i)
            for (g, &p) in dp.iter_mut().zip(s.iter()) {
                *g = p * (*g - delta_i);
            }
            sc.accumulate(i, j0, dp);
        }
    }
}

macro_rules! multiversion {
    ($name:ident, $impl:ident, <$s:ident>, ($($arg:ident : $ty:ty),*)) => {
        #[allow(clippy::too_many_arguments)]
        fn $name<$s: HeadScore>($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn v4<$s: HeadScore>($($arg: $ty),*) { $impl($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn v3<$s: HeadScore>($($arg: $ty),*) { $impl($($arg),*) }
                if std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                {
                    // SAFETY: the CPU has the features `v4` is compiled for.
                    return unsafe { v4::<$s>($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the CPU has the features `v3` is compiled for.
                    return unsafe { v3::<$s>($($arg),*) };
                }
            }
            $impl($($arg),*)
        }
    };
}

multiversion!(head_forward, head_forward_impl, <S>, (sc: &S, v: &[f32], l: usize, d: usize, o: &mut [f32], lse: &mut [f32]));
multiversion!(head_backward, head_backward_impl, <S>, (sc: &mut S, vt: &[f32], out: &[f32], dout: &[f32], lse: &[f32], l: usize, d: usize, dv: &mut [f32]));

// ---------------------------------------------------------------------------------------------
// Maps between head vectors and score-space vectors.

/// Position tables shared by all heads of one call: `cos`/`sin` `[seq, width]` of `t·θ_i`
/// (computed in f64, stored in f32). RoPE: `width = d/2`, times the attention factor; PoPE:
/// `width = d`.
struct Tables {
    width: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Tables {
    fn new(enc: &KernelEncoding, seq: usize) -> Option<Self> {
        let (freqs, factor) = match enc {
            KernelEncoding::Rope {
                inv_freq,
                attention_factor,
                ..
            } => (inv_freq, *attention_factor),
            KernelEncoding::Pope { theta } => (theta, 1.0),
            _ => return None,
        };
        let width = freqs.len();
        let (mut cos, mut sin) = (
            Vec::with_capacity(seq * width),
            Vec::with_capacity(seq * width),
        );
        for t in 0..seq {
            for &th in freqs {
                let (s, c) = (t as f64 * th).sin_cos();
                cos.push((c * factor) as f32);
                sin.push((s * factor) as f32);
            }
        }
        Some(Self { width, cos, sin })
    }
}

/// Rotate one head's rows `x`: `[seq, d]` in place by `t·θ_i` (`transpose`: by `−t·θ_i`, the
/// transpose of the forward map, used for gradients), times the attention factor.
#[inline(always)]
fn rotate(
    x: &mut [f32],
    seq: usize,
    d: usize,
    layout: PairLayout,
    tables: &Tables,
    transpose: bool,
) {
    let (w, sign) = (tables.width, if transpose { -1.0f32 } else { 1.0 });
    for t in 0..seq {
        // Pair i = layout.pair_dims(i, 2w), written out per layout so that each loop vectorises.
        let row = &mut x[t * d..t * d + 2 * w];
        let (cos, sin) = (
            &tables.cos[t * w..(t + 1) * w],
            &tables.sin[t * w..(t + 1) * w],
        );
        match layout {
            PairLayout::Adjacent => {
                for ((p, &c), &s) in row.chunks_exact_mut(2).zip(cos).zip(sin) {
                    let (re, im, s) = (p[0], p[1], sign * s);
                    p[0] = re * c - im * s;
                    p[1] = re * s + im * c;
                }
            }
            PairLayout::RotateHalf => {
                let (re, im) = row.split_at_mut(w);
                for (((a, b), &c), &s) in re.iter_mut().zip(im.iter_mut()).zip(cos).zip(sin) {
                    let (x_re, x_im, s) = (*a, *b, sign * s);
                    *a = x_re * c - x_im * s;
                    *b = x_re * s + x_im * c;
                }
            }
        }
    }
}

/// Score-space vectors of one head's rows `x` `[seq, d]` → `[seq, e]`. `delta` (`[d]`, PoPE
/// keys only) shifts the phases: `cos(tθ + δ) = cos tθ cos δ − sin tθ sin δ`.
#[inline(always)]
fn to_score_space(
    x: &[f32],
    seq: usize,
    d: usize,
    enc: &KernelEncoding,
    tables: Option<&Tables>,
    delta: Option<&[f32]>,
) -> Vec<f32> {
    match (enc, tables) {
        (KernelEncoding::Pope { .. }, Some(tb)) => {
            let (cd, sd) = delta_trig(delta, d);
            let mut out = vec![0.0f32; seq * 2 * d];
            for (t, (o, x)) in out
                .chunks_exact_mut(2 * d)
                .zip(x.chunks_exact(d))
                .enumerate()
            {
                let (ct, st) = (&tb.cos[t * d..(t + 1) * d], &tb.sin[t * d..(t + 1) * d]);
                let (oc, os) = o.split_at_mut(d);
                for c in 0..d {
                    let mu = softplus_approx(x[c]);
                    oc[c] = mu * (ct[c] * cd[c] - st[c] * sd[c]);
                    os[c] = mu * (st[c] * cd[c] + ct[c] * sd[c]);
                }
            }
            out
        }
        (KernelEncoding::Rope { layout, .. }, Some(tb)) => {
            let mut out = x.to_vec();
            rotate(&mut out, seq, d, *layout, tb, false);
            out
        }
        _ => x.to_vec(),
    }
}

/// `(cos δ, sin δ)` per component (`(1, 0)` without δ).
fn delta_trig(delta: Option<&[f32]>, d: usize) -> (Vec<f32>, Vec<f32>) {
    match delta {
        Some(dl) => dl
            .iter()
            .map(|&x| ((x as f64).cos() as f32, (x as f64).sin() as f32))
            .unzip(),
        None => (vec![1.0; d], vec![0.0; d]),
    }
}

/// Pull score-space gradients `g` `[seq, e]` back to the head's rows `x` `[seq, d]`; adds `∂/∂δ`
/// to `ddelta` (`[d]`) for PoPE keys.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn from_score_space(
    g: Vec<f32>,
    x: &[f32],
    seq: usize,
    d: usize,
    enc: &KernelEncoding,
    tables: Option<&Tables>,
    delta: Option<&[f32]>,
    ddelta: Option<&mut [f32]>,
) -> Vec<f32> {
    match (enc, tables) {
        (KernelEncoding::Pope { .. }, Some(tb)) => {
            let (cd, sd) = delta_trig(delta, d);
            let mut out = vec![0.0f32; seq * d];
            let mut dd = vec![0.0f32; d];
            for (t, ((o, x), g)) in out
                .chunks_exact_mut(d)
                .zip(x.chunks_exact(d))
                .zip(g.chunks_exact(2 * d))
                .enumerate()
            {
                let (ct, st) = (&tb.cos[t * d..(t + 1) * d], &tb.sin[t * d..(t + 1) * d]);
                let (gc, gs) = g.split_at(d);
                for c in 0..d {
                    let co = ct[c] * cd[c] - st[c] * sd[c];
                    let si = st[c] * cd[c] + ct[c] * sd[c];
                    // q̃ = μ(cos φ, sin φ): ∂/∂μ = g_c cos φ + g_s sin φ; ∂/∂φ = μ(−g_c sin φ + g_s cos φ).
                    o[c] = (gc[c] * co + gs[c] * si) * sigmoid_approx(x[c]);
                    dd[c] += softplus_approx(x[c]) * (gs[c] * co - gc[c] * si);
                }
            }
            if let Some(acc) = ddelta {
                for (a, v) in acc.iter_mut().zip(dd) {
                    *a += v;
                }
            }
            out
        }
        (KernelEncoding::Rope { layout, .. }, Some(tb)) => {
            let mut out = g;
            rotate(&mut out, seq, d, *layout, tb, true);
            out
        }
        _ => g,
    }
}

fn check_inputs(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: Shape4,
    enc: &KernelEncoding,
    delta: Option<&[f32]>,
) {
    for (name, x) in [("q", q), ("k", k), ("v", v)] {
        assert_eq!(
            x.len(),
            shape.n(),
            "{name} must be [batch, heads, seq, head_dim] = {shape:?}"
        );
    }
    if let KernelEncoding::Pope { theta } = enc {
        assert_eq!(theta.len(), shape.head_dim, "PoPE theta must be [head_dim]");
        let delta = delta.expect("PoPE needs delta");
        assert_eq!(
            delta.len(),
            shape.heads * shape.head_dim,
            "PoPE delta must be [heads · head_dim]"
        );
    }
    if let KernelEncoding::Tapa { amp_dim, .. } = enc {
        assert!(
            *amp_dim >= 1 && *amp_dim < shape.head_dim,
            "TAPA amp_dim must be in 1..head_dim"
        );
    }
}

/// Forward: returns `(out, lse)`; `out` like `q`, `lse` `[batch, heads, seq]` (natural log).
///
/// `delta`: PoPE's phase bias `[heads · head_dim]` (radians); `None` for other encodings.
///
/// # Panics
/// If a length does not match `shape`, or PoPE is given no `delta`.
pub fn flash_forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    delta: Option<&[f32]>,
    shape: Shape4,
    enc: &KernelEncoding,
) -> (Vec<f32>, Vec<f32>) {
    check_inputs(q, k, v, shape, enc, delta);
    let (l, d, heads) = (shape.seq, shape.head_dim, shape.heads);
    let tables = Tables::new(enc, l);
    let mut out = vec![0.0f32; shape.n()];
    let mut lse = vec![0.0f32; shape.batch * heads * l];
    out.par_chunks_mut(l * d)
        .zip(lse.par_chunks_mut(l))
        .enumerate()
        .for_each(|(bh, (o, lse))| {
            let off = bh * l * d;
            let (qh, kh, vh) = (
                &q[off..off + l * d],
                &k[off..off + l * d],
                &v[off..off + l * d],
            );
            match enc {
                KernelEncoding::Tapa {
                    amp_dim,
                    alpha,
                    phase,
                    phase_gain,
                } => {
                    let sc = TapaScore::new(qh, kh, l, d, *amp_dim, *alpha, *phase, *phase_gain);
                    head_forward(&sc, vh, l, d, o, lse);
                }
                _ => {
                    let dh = delta.map(|dl| &dl[(bh % heads) * d..(bh % heads + 1) * d]);
                    let e = enc.score_dim(d);
                    let qt = to_score_space(qh, l, d, enc, tables.as_ref(), None);
                    let kt = to_score_space(kh, l, d, enc, tables.as_ref(), dh);
                    let sc = DotScore::new(qt, kt, l, e, 1.0 / (d as f32).sqrt(), false);
                    head_forward(&sc, vh, l, d, o, lse);
                }
            }
        });
    (out, lse)
}

/// One head's score-space gradients `dq̃`, `dk̃` `[l, e]` mapped back to the unrotated `dq`, `dk`
/// `[l, d]` (RoPE's inverse rotation, PoPE's magnitudes and δ, accumulated into `ddelta`); `back`
/// is `(q, k, l, d, encoding, tables, δ)` of the head. Shared by the flash and dense backwards.
#[allow(clippy::type_complexity)]
#[inline(always)]
fn score_grads_back(
    dqt: Vec<f32>,
    dkt: Vec<f32>,
    back: (
        &[f32],
        &[f32],
        usize,
        usize,
        &KernelEncoding,
        Option<&Tables>,
        Option<&[f32]>,
    ),
    dq: &mut [f32],
    dk: &mut [f32],
    ddelta: Option<&mut [f32]>,
) {
    let (qh, kh, l, d, enc, tables, dh) = back;
    dq.copy_from_slice(&from_score_space(dqt, qh, l, d, enc, tables, None, None));
    dk.copy_from_slice(&from_score_space(dkt, kh, l, d, enc, tables, dh, ddelta));
}

/// PoPE's dδ `[heads · d]`: the per-(batch, head) parts `[batch · heads, d]` summed over the batch.
fn sum_over_batch(per_bh: &[f32], heads: usize, d: usize) -> Vec<f32> {
    let mut total = vec![0.0f32; heads * d];
    for (bh, chunk) in per_bh.chunks(d).enumerate() {
        let h = bh % heads;
        for (t, &x) in total[h * d..(h + 1) * d].iter_mut().zip(chunk) {
            *t += x;
        }
    }
    total
}

/// Backward: given the forward's `out` and `lse` and the output gradient `dout` (all as returned
/// by / shaped like [`flash_forward`]), the gradients with respect to the kernel's inputs (the
/// unrotated q and k, and PoPE's δ).
///
/// # Panics
/// As [`flash_forward`].
#[allow(clippy::too_many_arguments)]
pub fn flash_backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    delta: Option<&[f32]>,
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
    shape: Shape4,
    enc: &KernelEncoding,
) -> FlashGrads {
    check_inputs(q, k, v, shape, enc, delta);
    let (l, d, heads) = (shape.seq, shape.head_dim, shape.heads);
    let is_pope = matches!(enc, KernelEncoding::Pope { .. });
    let tables = Tables::new(enc, l);
    let mut dq = vec![0.0f32; shape.n()];
    let mut dk = vec![0.0f32; shape.n()];
    let mut dv = vec![0.0f32; shape.n()];
    // PoPE's dδ per (batch, head) `[batch · heads, d]`, summed over the batch afterwards (unused
    // by the other encodings).
    let mut ddelta_bh = vec![0.0f32; shape.batch * heads * d];
    dq.par_chunks_mut(l * d)
        .zip(dk.par_chunks_mut(l * d))
        .zip(dv.par_chunks_mut(l * d))
        .zip(ddelta_bh.par_chunks_mut(d))
        .enumerate()
        .for_each(|(bh, (((dq, dk), dv), dd))| {
            let off = bh * l * d;
            let (qh, kh, vh) = (
                &q[off..off + l * d],
                &k[off..off + l * d],
                &v[off..off + l * d],
            );
            let (oh, doh) = (&out[off..off + l * d], &dout[off..off + l * d]);
            let lh = &lse[bh * l..(bh + 1) * l];
            let vt = transpose(vh, l, d);
            match enc {
                KernelEncoding::Tapa {
                    amp_dim,
                    alpha,
                    phase,
                    phase_gain,
                } => {
                    let mut sc =
                        TapaScore::new(qh, kh, l, d, *amp_dim, *alpha, *phase, *phase_gain)
                            .with_grads();
                    head_backward(&mut sc, &vt, oh, doh, lh, l, d, dv);
                    let (a, p) = (sc.a, sc.p);
                    let (sa, sp) = (1.0 / (a as f32).sqrt(), 1.0 / (p as f32).sqrt());
                    for t in 0..l {
                        for c in 0..a {
                            dq[t * d + c] = sc.dqa[t * a + c] * sa;
                            // k_A enters A as q_A/√a · k_A: dka already carries the 1/√a.
                            dk[t * d + c] = sc.dka[t * a + c];
                        }
                        for c in 0..p {
                            let (gq, gk) = if sc.linear {
                                (sc.dsq[t], sc.dsk[t])
                            } else {
                                (sc.dqp[t * p + c], sc.dkp[t * p + c])
                            };
                            dq[t * d + a + c] = gq * sp;
                            dk[t * d + a + c] = if sc.linear { gk * sp } else { gk };
                        }
                    }
                }
                _ => {
                    let dh = delta.map(|dl| &dl[(bh % heads) * d..(bh % heads + 1) * d]);
                    let e = enc.score_dim(d);
                    let scale = 1.0 / (d as f32).sqrt();
                    let qt = to_score_space(qh, l, d, enc, tables.as_ref(), None);
                    let kt = to_score_space(kh, l, d, enc, tables.as_ref(), dh);
                    let mut sc = DotScore::new(qt, kt, l, e, scale, true);
                    head_backward(&mut sc, &vt, oh, doh, lh, l, d, dv);
                    let dqt: Vec<f32> = sc.dq.iter().map(|x| x * scale).collect();
                    let dkt = std::mem::take(&mut sc.dk);
                    let dd = if is_pope { Some(dd) } else { None };
                    let back = (qh, kh, l, d, enc, tables.as_ref(), dh);
                    score_grads_back(dqt, dkt, back, dq, dk, dd);
                }
            }
        });
    let ddelta = is_pope.then(|| sum_over_batch(&ddelta_bh, heads, d));
    FlashGrads { dq, dk, dv, ddelta }
}

/// Longest sequence [`dense_forward`] and [`dense_backward`] materialise the `[seq, seq]` scores
/// for (4 MiB per head at 1024); longer ones go to the flash kernels.
pub const DENSE_MAX_SEQ: usize = 1024;

/// `[l, l]` probabilities of one head's causal softmax from its scaled score-space queries `qs`
/// and keys `k` (`[l, e]` each): `P_ij = exp(S_ij − lse_i)` for `j ≤ i`, 0 above the diagonal,
/// with `S = qs · kᵀ` through `gemm`. `lse` `[l]` is written when `write_lse`, else read.
#[inline(always)]
fn dense_probs(
    qs: &[f32],
    k: &[f32],
    l: usize,
    e: usize,
    lse: &mut [f32],
    write_lse: bool,
) -> Vec<f32> {
    use super::gemm::{Parallelism, gemm_new};
    let mut p = gemm_new(
        l,
        l,
        e,
        qs,
        (1, e as isize),
        k,
        (e as isize, 1),
        Parallelism::None,
    );
    for (i, row) in p.chunks_mut(l).enumerate() {
        let (live, masked) = row.split_at_mut(i + 1);
        masked.fill(0.0);
        if write_lse {
            let m = max_lanes(live);
            let sum = exp_shift_sum(live, m);
            lse[i] = m + sum.ln();
            let inv = 1.0 / sum;
            for x in live.iter_mut() {
                *x *= inv;
            }
        } else {
            exp_shift_sum(live, lse[i]);
        }
    }
    p
}

/// What the dense kernels know of one head besides its rows: `(seq, head_dim, encoding, position
/// tables, δ of the head)`.
type DenseHead<'a> = (
    usize,
    usize,
    &'a KernelEncoding,
    Option<&'a Tables>,
    Option<&'a [f32]>,
);

/// One head's scaled score-space queries `q̃/√d`, keys `k̃` (`[l, e]` each) and causal
/// probabilities `[l, l]` ([`dense_probs`]; `lse` written when `write_lse`, else read).
#[inline(always)]
fn dense_head_probs(
    q: &[f32],
    k: &[f32],
    head: DenseHead,
    lse: &mut [f32],
    write_lse: bool,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (l, d, enc, tables, dh) = head;
    let scale = 1.0 / (d as f32).sqrt();
    let mut qs = to_score_space(q, l, d, enc, tables, None);
    qs.iter_mut().for_each(|x| *x *= scale);
    let kt = to_score_space(k, l, d, enc, tables, dh);
    let p = dense_probs(&qs, &kt, l, enc.score_dim(d), lse, write_lse);
    (qs, kt, p)
}

/// [`dense_forward`] for one (batch, head): rows `q`, `k`, `v` `[l, d]` → `o` `[l, d]`, `lse` `[l]`.
#[inline(always)]
fn dense_head_forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    head: DenseHead,
    o: &mut [f32],
    lse: &mut [f32],
) {
    use super::gemm::{Parallelism, gemm_strided};
    let (l, d, ..) = head;
    let (_, _, p) = dense_head_probs(q, k, head, lse, true);
    gemm_strided(
        l,
        d,
        l,
        o,
        false,
        &p,
        (1, l as isize),
        v,
        (1, d as isize),
        Parallelism::None,
    );
}

/// [`dense_backward`] for one (batch, head): from the head's rows `q`, `k`, `v`, output `o`, its
/// gradient `dout` (`[l, d]` each) and `lse` `[l]`, writes `dq`, `dk`, `dv` and adds PoPE's
/// `∂/∂δ` to `dd`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn dense_head_backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    o: &[f32],
    dout: &[f32],
    lse: &[f32],
    head: DenseHead,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
    dd: Option<&mut [f32]>,
) {
    use super::gemm::{Parallelism, gemm_new, gemm_strided};
    let (l, d, enc, tables, dh) = head;
    let (e, scale, none) = (enc.score_dim(d), 1.0 / (d as f32).sqrt(), Parallelism::None);
    let (qs, kt, p) = dense_head_probs(q, k, head, &mut lse.to_vec(), false);
    // dV = Pᵀ dO
    gemm_strided(
        l,
        d,
        l,
        dv,
        false,
        &p,
        (l as isize, 1),
        dout,
        (1, d as isize),
        none,
    );
    // dS = P ∘ (dO Vᵀ − D), D_i = dO_i · O_i
    let mut ds = gemm_new(l, l, d, dout, (1, d as isize), v, (d as isize, 1), none);
    for (i, (row, prow)) in ds.chunks_mut(l).zip(p.chunks(l)).enumerate() {
        let di = dot(&dout[i * d..(i + 1) * d], &o[i * d..(i + 1) * d]);
        for (g, &pij) in row.iter_mut().zip(prow) {
            *g = pij * (*g - di);
        }
    }
    // dq̃ = dS k̃ · scale, dk̃ = dSᵀ (q̃ · scale)
    let mut dqt = gemm_new(l, e, l, &ds, (1, l as isize), &kt, (1, e as isize), none);
    dqt.iter_mut().for_each(|x| *x *= scale);
    let dkt = gemm_new(l, e, l, &ds, (l as isize, 1), &qs, (1, e as isize), none);
    score_grads_back(dqt, dkt, (q, k, l, d, enc, tables, dh), dq, dk, dd);
}

/// Causal attention like [`flash_forward`] (same inputs, outputs and maths), computed densely
/// for sequences up to [`DENSE_MAX_SEQ`]: per (batch, head) the scores `S = q̃ k̃ᵀ / √d` in the
/// encoding's score space are one `gemm` product, the causal softmax a pass over its rows, and
/// `O = P V` a second product. It trades the flash kernel's `O(seq)` memory for matrix products
/// at `gemm` speed (the score rows of a 128-token head fit in cache). TAPA, whose score is not a
/// dot product in a fixed space, and longer sequences go to [`flash_forward`]. Sums run in
/// another order than the flash kernel's, so results agree to round-off (tested).
///
/// # Panics
/// As [`flash_forward`].
pub fn dense_forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    delta: Option<&[f32]>,
    shape: Shape4,
    enc: &KernelEncoding,
) -> (Vec<f32>, Vec<f32>) {
    if matches!(enc, KernelEncoding::Tapa { .. }) || shape.seq > DENSE_MAX_SEQ {
        return flash_forward(q, k, v, delta, shape, enc);
    }
    check_inputs(q, k, v, shape, enc, delta);
    let (l, d, heads) = (shape.seq, shape.head_dim, shape.heads);
    let tables = Tables::new(enc, l);
    let mut out = vec![0.0f32; shape.n()];
    let mut lse = vec![0.0f32; shape.batch * heads * l];
    out.par_chunks_mut(l * d)
        .zip(lse.par_chunks_mut(l))
        .enumerate()
        .for_each(|(bh, (o, lse))| {
            let off = bh * l * d;
            let (qh, kh, vh) = (
                &q[off..off + l * d],
                &k[off..off + l * d],
                &v[off..off + l * d],
            );
            let dh = delta.map(|dl| &dl[(bh % heads) * d..(bh % heads + 1) * d]);
            let head = (l, d, enc, tables.as_ref(), dh);
            dispatch_simd!(dense_head_forward, (qh: &[f32], kh: &[f32], vh: &[f32], head: DenseHead, o: &mut [f32], lse: &mut [f32]));
        });
    (out, lse)
}

/// The backward of [`dense_forward`], like [`flash_backward`] (same inputs and outputs): the
/// probabilities are recomputed from `lse`, and `dP = dO Vᵀ`, `dV = Pᵀ dO`, `dq̃ = dS k̃ / √d`,
/// `dk̃ = dSᵀ q̃ / √d` with `dS = P ∘ (dP − rowsum(dO ∘ O))` (FlashAttention-2, Alg. 2) are `gemm`
/// products; the maps back from score space (RoPE's rotation, PoPE's δ) are the flash kernel's.
/// TAPA and sequences longer than [`DENSE_MAX_SEQ`] go to [`flash_backward`].
///
/// # Panics
/// As [`flash_forward`].
#[allow(clippy::too_many_arguments)]
pub fn dense_backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    delta: Option<&[f32]>,
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
    shape: Shape4,
    enc: &KernelEncoding,
) -> FlashGrads {
    if matches!(enc, KernelEncoding::Tapa { .. }) || shape.seq > DENSE_MAX_SEQ {
        return flash_backward(q, k, v, delta, out, lse, dout, shape, enc);
    }
    check_inputs(q, k, v, shape, enc, delta);
    let (l, d, heads) = (shape.seq, shape.head_dim, shape.heads);
    let is_pope = matches!(enc, KernelEncoding::Pope { .. });
    let tables = Tables::new(enc, l);
    let mut dq = vec![0.0f32; shape.n()];
    let mut dk = vec![0.0f32; shape.n()];
    let mut dv = vec![0.0f32; shape.n()];
    let mut ddelta_bh = vec![0.0f32; shape.batch * heads * d];
    dq.par_chunks_mut(l * d)
        .zip(dk.par_chunks_mut(l * d))
        .zip(dv.par_chunks_mut(l * d))
        .zip(ddelta_bh.par_chunks_mut(d))
        .enumerate()
        .for_each(|(bh, (((dq, dk), dv), dd))| {
            let off = bh * l * d;
            let (qh, kh, vh) = (
                &q[off..off + l * d],
                &k[off..off + l * d],
                &v[off..off + l * d],
            );
            let (oh, doh) = (&out[off..off + l * d], &dout[off..off + l * d]);
            let lh = &lse[bh * l..(bh + 1) * l];
            let dh = delta.map(|dl| &dl[(bh % heads) * d..(bh % heads + 1) * d]);
            let dd = if is_pope { Some(dd) } else { None };
            let head = (l, d, enc, tables.as_ref(), dh);
            dispatch_simd!(dense_head_backward, (qh: &[f32], kh: &[f32], vh: &[f32], oh: &[f32], doh: &[f32], lh: &[f32], head: DenseHead, dq: &mut [f32], dk: &mut [f32], dv: &mut [f32], dd: Option<&mut [f32]>));
        });
    let ddelta = is_pope.then(|| sum_over_batch(&ddelta_bh, heads, d));
    FlashGrads { dq, dk, dv, ddelta }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        Encoding, EncodingConfig, ModelConfig, PositionalAttention, TapaParams, causal_attention,
        causal_mask,
    };
    use burn::tensor::{Device, Tensor, TensorData};
    use rand::{Rng, SeedableRng};

    fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-scale..scale)).collect()
    }

    fn config(encoding: Encoding, heads: usize, d: usize) -> ModelConfig {
        ModelConfig::attention_only(
            EncodingConfig::for_kernel_checks(encoding, TapaPhase::Quadratic),
            heads,
            d,
        )
    }

    /// The kernel's encoding for a reference score function, δ on the host.
    fn kernel_encoding(pos: &PositionalAttention) -> (KernelEncoding, Option<Vec<f32>>) {
        let (enc, delta) = pos.kernel_encoding();
        (
            enc,
            delta.map(|d| d.into_data().try_to_vec::<f32>().unwrap()),
        )
    }

    /// Outputs and gradients (q, k, v, PoPE's δ) against the reference (burn tensor ops +
    /// autodiff) for sequence lengths below, at and not a multiple of the tile. Tolerance 2e-4
    /// absolute + 2e-3 relative: both sides are f32 with different summation orders over ≤ 70
    /// keys, and the kernel's `exp` has relative error < 3e-7.
    fn check(
        cfg: &ModelConfig,
        input_scale: f32,
        freqs: Option<&crate::model::scaling::ScaledFreqs>,
    ) {
        let (h, d) = (cfg.n_heads, cfg.head_dim());
        for &(b, l) in &[(1, 5), (2, 64), (1, 70)] {
            let shape = Shape4 {
                batch: b,
                heads: h,
                seq: l,
                head_dim: d,
            };
            let n = b * h * l * d;
            let (q, k) = (random(n, 1, input_scale), random(n, 2, input_scale));
            let (v, g) = (random(n, 3, 1.0), random(n, 4, 1.0));
            let device = Device::flex().autodiff();
            let mut pos = PositionalAttention::new(cfg, 7, &device);
            if let Some(f) = freqs {
                pos = pos.with_scaling(f);
            }
            let (enc, delta) = kernel_encoding(&pos);
            let t = |x: &[f32]| {
                Tensor::<4>::from_data(TensorData::new(x.to_vec(), [b, h, l, d]), &device)
                    .require_grad()
            };
            let (tq, tk, tv) = (t(&q), t(&k), t(&v));
            let tg = Tensor::<4>::from_data(TensorData::new(g.clone(), [b, h, l, d]), &device);
            let reference = causal_attention(
                &pos,
                tq.clone(),
                tk.clone(),
                tv.clone(),
                &causal_mask(l, &device),
            );
            let ref_out = reference.clone().into_data().try_to_vec::<f32>().unwrap();
            let grads = (reference * tg).sum().backward();
            // Both CPU kernels: flash and dense (TAPA's dense call is the flash kernel).
            type Fwd = fn(
                &[f32],
                &[f32],
                &[f32],
                Option<&[f32]>,
                Shape4,
                &KernelEncoding,
            ) -> (Vec<f32>, Vec<f32>);
            type Bwd = fn(
                &[f32],
                &[f32],
                &[f32],
                Option<&[f32]>,
                &[f32],
                &[f32],
                &[f32],
                Shape4,
                &KernelEncoding,
            ) -> FlashGrads;
            let kernels: [(&str, Fwd, Bwd); 2] = [
                ("flash", flash_forward, flash_backward),
                ("dense", dense_forward, dense_backward),
            ];
            for (kernel, forward, backward) in kernels {
                let (out, lse) = forward(&q, &k, &v, delta.as_deref(), shape, &enc);
                let what = format!(
                    "{kernel} {:?}/{:?} {shape:?}",
                    cfg.encoding, cfg.pair_layout
                );
                let close = |a: &[f32], r: &[f32], name: &str| {
                    assert_eq!(a.len(), r.len());
                    for (i, (x, y)) in a.iter().zip(r).enumerate() {
                        assert!(
                            (x - y).abs() <= 2e-4 + 2e-3 * y.abs(),
                            "{what} {name}[{i}]: fused {x}, reference {y}"
                        );
                    }
                };
                close(&out, &ref_out, "out");
                let fg = backward(&q, &k, &v, delta.as_deref(), &out, &lse, &g, shape, &enc);
                let grad = |x: &Tensor<4>| {
                    x.grad(&grads)
                        .unwrap()
                        .into_data()
                        .try_to_vec::<f32>()
                        .unwrap()
                };
                close(&fg.dq, &grad(&tq), "dq");
                close(&fg.dk, &grad(&tk), "dk");
                close(&fg.dv, &grad(&tv), "dv");
                match &pos {
                    PositionalAttention::Pope(p) => {
                        let r = p
                            .delta
                            .grad(&grads)
                            .unwrap()
                            .into_data()
                            .try_to_vec::<f32>()
                            .unwrap();
                        close(fg.ddelta.as_ref().expect("PoPE returns dδ"), &r, "ddelta");
                    }
                    _ => assert!(fg.ddelta.is_none()),
                }
            }
        }
    }

    #[test]
    fn nope_matches_reference() {
        check(&config(Encoding::Nope, 2, 8), 1.0, None);
    }

    #[test]
    fn rope_matches_reference_both_layouts_and_yarn_factor() {
        for layout in [PairLayout::Adjacent, PairLayout::RotateHalf] {
            let mut cfg = config(Encoding::Rope, 2, 16);
            cfg.pair_layout = layout;
            check(&cfg, 1.0, None);
        }
        // A YaRN-scaled model: other inverse frequencies and an attention factor ≠ 1.
        let freqs = crate::model::scaling::ScaledFreqs {
            inv_freq: (0..4).map(|i| 0.5f64.powi(i)).collect(),
            attention_factor: 1.1,
        };
        let cfg = config(Encoding::Rope, 1, 8);
        check(&cfg, 1.0, Some(&freqs));
        let device = Device::flex();
        let pos = PositionalAttention::new(&cfg, 0, &device).with_scaling(&freqs);
        let (enc, _) = kernel_encoding(&pos);
        assert_eq!(
            enc,
            KernelEncoding::Rope {
                inv_freq: vec![1.0, 0.5, 0.25, 0.125],
                layout: PairLayout::Adjacent,
                attention_factor: 1.1
            }
        );
    }

    #[test]
    fn pope_matches_reference_with_uniform_delta() {
        check(&config(Encoding::Pope, 2, 8), 1.0, None);
    }

    #[test]
    fn tapa_matches_reference_both_phases() {
        for phase in [TapaPhase::Quadratic, TapaPhase::Linear] {
            let mut cfg = config(Encoding::Tapa, 2, 8);
            cfg.encoding = EncodingConfig::Tapa(TapaParams {
                tapa_phase: phase,
                ..TapaParams::default()
            });
            // Inputs of order 0.5 keep TAPA's phase 2π·D·P of order a few radians.
            check(&cfg, 0.5, None);
        }
    }

    /// The phase gain (R59's H-lr) through the kernels' distance table, forward and backward,
    /// against the reference's `2π·D·g·P`.
    #[test]
    fn tapa_phase_gain_matches_reference() {
        for phase in [TapaPhase::Quadratic, TapaPhase::Linear] {
            let mut cfg = config(Encoding::Tapa, 2, 8);
            cfg.encoding = EncodingConfig::Tapa(TapaParams {
                tapa_phase: phase,
                tapa_phase_gain: 3.0,
                ..TapaParams::default()
            });
            check(&cfg, 0.3, None);
        }
    }

    /// lse is the log of the softmax normaliser: for one query over two equal keys it is
    /// `s + ln 2`, and the output is the mean of the two values.
    #[test]
    fn hand_computed_lse() {
        let shape = Shape4 {
            batch: 1,
            heads: 1,
            seq: 2,
            head_dim: 1,
        };
        // q = [0, 1], k = [3, 3] → row 1 scores both 3 (scale 1/√1).
        let (out, lse) = flash_forward(
            &[0.0, 1.0],
            &[3.0, 3.0],
            &[2.0, 4.0],
            None,
            shape,
            &KernelEncoding::Nope,
        );
        assert!((lse[0] - 0.0).abs() < 1e-6); // row 0 sees only key 0: score 0 → lse 0
        assert!((lse[1] - (3.0 + 2f32.ln())).abs() < 1e-6);
        assert_eq!(out[0], 2.0);
        assert!((out[1] - 3.0).abs() < 1e-6);
    }

    /// `ln_approx`, `softplus_approx`, `sigmoid_approx` against f64.
    #[test]
    fn log_softplus_sigmoid_approximations() {
        let mut worst_ln = 0.0f64;
        for i in 0..=10000 {
            let y = 1.0 + i as f64 / 10000.0;
            worst_ln = worst_ln.max((ln_approx(y as f32) as f64 - (y as f32 as f64).ln()).abs());
        }
        assert!(worst_ln < 2.5e-7, "ln worst absolute error {worst_ln}");
        for y in [1e-30f32, 1e-3, 0.5, 3.0, 1e20] {
            let rel =
                (ln_approx(y) as f64 - (y as f64).ln()).abs() / (y as f64).ln().abs().max(1.0);
            assert!(rel < 1e-6, "ln({y}): {rel}");
        }
        let (mut worst_sp, mut worst_sig) = (0.0f64, 0.0f64);
        for i in 0..=6000 {
            let x = -30.0 + 60.0 * i as f64 / 6000.0;
            let xf = x as f32 as f64;
            let sp = if xf > 30.0 { xf } else { xf.exp().ln_1p() };
            worst_sp = worst_sp.max(((softplus_approx(xf as f32) as f64 - sp) / sp).abs());
            let sig = 1.0 / (1.0 + (-xf).exp());
            worst_sig = worst_sig.max(((sigmoid_approx(xf as f32) as f64 - sig) / sig).abs());
        }
        assert!(worst_sp < 1e-6, "softplus worst relative error {worst_sp}");
        assert!(worst_sig < 1e-6, "sigmoid worst relative error {worst_sig}");
        assert!((softplus_approx(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
        assert_eq!(sigmoid_approx(0.0), 0.5);
    }

    /// `exp_approx` against f64 `exp` over the range a softmax uses, and its clamps.
    #[test]
    fn exp_approx_relative_error() {
        let mut worst = 0.0f64;
        for i in 0..=20000 {
            let x = -87.0 + 87.0 * i as f64 / 20000.0;
            let got = exp_approx(x as f32) as f64;
            let want = (x as f32 as f64).exp();
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp_approx(0.0), 1.0);
        assert!(exp_approx(-1000.0) < 1e-37);
        assert!(exp_approx(f32::NEG_INFINITY) < 1e-37);
    }

    /// The exponent taken from the bits of `x·log₂e + 1.5·2²³` is the integer `k as i32` gives,
    /// so `exp_approx` returns the same bits as with the float-to-int conversion (which does not
    /// vectorise), over every input range and at the clamps.
    #[test]
    fn exp_approx_exponent_from_bits_equals_the_conversion() {
        let by_conversion = |x: f32| -> f32 {
            let x = x.clamp(-87.0, 88.0);
            let k = (x * std::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
            let r = x - k * 0.693_145_75 - k * 1.428_606_8e-6;
            let p = 1.0
                + r * (1.0
                    + r * (0.5
                        + r * (1.0 / 6.0
                            + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
            f32::from_bits(((k as i32 + 127) << 23) as u32) * p
        };
        for i in 0..=400_000 {
            let x = -100.0 + 200.0 * i as f32 / 400_000.0;
            assert_eq!(
                exp_approx(x).to_bits(),
                by_conversion(x).to_bits(),
                "x = {x}"
            );
        }
        for x in [
            f32::NEG_INFINITY,
            f32::INFINITY,
            -87.0,
            88.0,
            -0.0,
            0.5,
            -0.5,
        ] {
            assert_eq!(
                exp_approx(x).to_bits(),
                by_conversion(x).to_bits(),
                "x = {x}"
            );
        }
    }
}
