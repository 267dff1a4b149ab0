//! Flash-style causal attention on the CPU, forward and backward, for NoPE and RoPE
//! (Dao et al. 2022, *FlashAttention*, Alg. 1; Dao 2023, *FlashAttention-2*, Alg. 1–2).
//!
//! Plain Rust on `f32` slices, parallel over `batch × heads` with rayon. The score matrix is never
//! stored: keys are visited in tiles of [`TILE`] with an online softmax (running max `m`, running
//! sum `l`), and the forward saves only the output and the log-sum-exp `lse = m + ln l` per query
//! row, from which the backward recomputes the probabilities tile by tile. Memory is O(L·d) per
//! head. RoPE is applied inside the kernel: q and k are rotated by position on entry, and the
//! gradients are rotated back (the rotation is orthogonal, so its transpose is the rotation by
//! the opposite angle).
//!
//! Layout: every tensor is row-major `[batch, heads, seq, head_dim]`; `lse` is `[batch, heads, seq]`.
//! A query row with no visible key (impossible under a causal mask, since the diagonal is always
//! visible) would produce zeros, never NaN.
//!
//! This is the numerical core; wiring it into burn as a backend extension with a registered
//! backward is the next step of issue 4. Equivalence with the reference attention
//! ([`crate::model::causal_attention`]) is tested below.

use rayon::prelude::*;

use crate::model::PairLayout;

/// Key/query tile length (tokens).
pub const TILE: usize = 32;

/// The positional part handled inside the kernel.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelEncoding {
    /// Plain `q·k/√d`.
    Nope,
    /// RoPE with these inverse frequencies `[d/2]` (any scaling's) and pair layout.
    Rope {
        /// `θ_i`, radians per token.
        inv_freq: Vec<f64>,
        /// Pair layout.
        layout: PairLayout,
        /// Multiplier of the cos/sin tables (YaRN's attention factor; 1 otherwise).
        attention_factor: f64,
    },
}

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

/// Rotate one head's rows `x`: `[seq, d]` in place by `sign · t · θ_i` (sign −1 undoes it).
fn rotate(x: &mut [f32], seq: usize, d: usize, enc: &KernelEncoding, sign: f64) {
    let KernelEncoding::Rope {
        inv_freq,
        layout,
        attention_factor,
    } = enc
    else {
        return;
    };
    for t in 0..seq {
        let row = &mut x[t * d..(t + 1) * d];
        for (i, &theta) in inv_freq.iter().enumerate() {
            let (a, b) = layout.pair_dims(i, d);
            let ang = sign * t as f64 * theta;
            let (c, s) = (ang.cos() * attention_factor, ang.sin() * attention_factor);
            let (re, im) = (row[a] as f64, row[b] as f64);
            row[a] = (re * c - im * s) as f32;
            row[b] = (re * s + im * c) as f32;
        }
    }
}

/// A rotated copy of one head's rows (`[seq, d]`); a plain copy for NoPE.
fn rotated(x: &[f32], seq: usize, d: usize, enc: &KernelEncoding) -> Vec<f32> {
    let mut out = x.to_vec();
    rotate(&mut out, seq, d, enc, 1.0);
    out
}

/// Dot product with 8 independent accumulators, so the compiler can vectorise it (a plain
/// `.sum()` is a serial chain: f32 addition is not reassociated).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut total: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        total += x * y;
    }
    total
}

/// Forward: returns `(out, lse)`; `out` like `q`, `lse` `[batch, heads, seq]`.
pub fn flash_forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: Shape4,
    enc: &KernelEncoding,
) -> (Vec<f32>, Vec<f32>) {
    assert_eq!(
        q.len(),
        shape.n(),
        "q must be [batch, heads, seq, head_dim]"
    );
    assert_eq!(
        k.len(),
        shape.n(),
        "k must be [batch, heads, seq, head_dim]"
    );
    assert_eq!(
        v.len(),
        shape.n(),
        "v must be [batch, heads, seq, head_dim]"
    );
    let (l, d) = (shape.seq, shape.head_dim);
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0.0f32; shape.n()];
    let mut lse = vec![0.0f32; shape.batch * shape.heads * l];
    out.par_chunks_mut(l * d)
        .zip(lse.par_chunks_mut(l))
        .enumerate()
        .for_each(|(bh, (o, lse))| {
            let off = bh * l * d;
            let qs = rotated(&q[off..off + l * d], l, d, enc);
            let ks = rotated(&k[off..off + l * d], l, d, enc);
            let vs = &v[off..off + l * d];
            let mut s = vec![0.0f32; TILE];
            for i in 0..l {
                let qi = &qs[i * d..(i + 1) * d];
                let oi = &mut o[i * d..(i + 1) * d];
                let (mut m, mut sum) = (f32::NEG_INFINITY, 0.0f32);
                for j0 in (0..=i).step_by(TILE) {
                    let j1 = (j0 + TILE).min(i + 1);
                    let mut tile_max = f32::NEG_INFINITY;
                    for j in j0..j1 {
                        let x = dot(qi, &ks[j * d..(j + 1) * d]) * scale;
                        s[j - j0] = x;
                        tile_max = tile_max.max(x);
                    }
                    let m_new = m.max(tile_max);
                    let correction = if m == f32::NEG_INFINITY {
                        0.0
                    } else {
                        (m - m_new).exp()
                    };
                    sum *= correction;
                    for x in oi.iter_mut() {
                        *x *= correction;
                    }
                    for j in j0..j1 {
                        let p = (s[j - j0] - m_new).exp();
                        sum += p;
                        for (x, &vv) in oi.iter_mut().zip(&vs[j * d..(j + 1) * d]) {
                            *x += p * vv;
                        }
                    }
                    m = m_new;
                }
                if sum > 0.0 {
                    for x in oi.iter_mut() {
                        *x /= sum;
                    }
                    lse[i] = m + sum.ln();
                } else {
                    lse[i] = f32::NEG_INFINITY;
                }
            }
        });
    (out, lse)
}

/// Backward: given the forward's `out` and `lse` and the output gradient `dout`, returns
/// `(dq, dk, dv)` with respect to the *unrotated* inputs.
#[allow(clippy::too_many_arguments)]
pub fn flash_backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
    shape: Shape4,
    enc: &KernelEncoding,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (l, d) = (shape.seq, shape.head_dim);
    let scale = 1.0 / (d as f32).sqrt();
    let mut dq = vec![0.0f32; shape.n()];
    let mut dk = vec![0.0f32; shape.n()];
    let mut dv = vec![0.0f32; shape.n()];
    dq.par_chunks_mut(l * d)
        .zip(dk.par_chunks_mut(l * d))
        .zip(dv.par_chunks_mut(l * d))
        .enumerate()
        .for_each(|(bh, ((dq, dk), dv))| {
            let off = bh * l * d;
            let qs = rotated(&q[off..off + l * d], l, d, enc);
            let ks = rotated(&k[off..off + l * d], l, d, enc);
            let vs = &v[off..off + l * d];
            let os = &out[off..off + l * d];
            let dos = &dout[off..off + l * d];
            let lses = &lse[bh * l..(bh + 1) * l];
            // D_i = rowsum(dO ∘ O) (FlashAttention-2, Alg. 2 line 4).
            let delta: Vec<f32> = (0..l)
                .map(|i| dot(&dos[i * d..(i + 1) * d], &os[i * d..(i + 1) * d]))
                .collect();
            for i in 0..l {
                if lses[i] == f32::NEG_INFINITY {
                    continue;
                }
                let qi = &qs[i * d..(i + 1) * d];
                let doi = &dos[i * d..(i + 1) * d];
                for j in 0..=i {
                    let kj = &ks[j * d..(j + 1) * d];
                    let p = (dot(qi, kj) * scale - lses[i]).exp();
                    // dV_j += P_ij dO_i
                    for (x, &g) in dv[j * d..(j + 1) * d].iter_mut().zip(doi) {
                        *x += p * g;
                    }
                    // dS_ij = P_ij (dO_i·V_j − D_i)
                    let ds = p * (dot(doi, &vs[j * d..(j + 1) * d]) - delta[i]) * scale;
                    for (x, &kk) in dq[i * d..(i + 1) * d].iter_mut().zip(kj) {
                        *x += ds * kk;
                    }
                    for (x, &qq) in dk[j * d..(j + 1) * d].iter_mut().zip(qi) {
                        *x += ds * qq;
                    }
                }
            }
            rotate(dq, l, d, enc, -1.0);
            rotate(dk, l, d, enc, -1.0);
        });
    (dq, dk, dv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ModelConfig, PositionalAttention, causal_attention, causal_mask};
    use burn::tensor::{Device, Tensor, TensorData};
    use rand::{Rng, SeedableRng};

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    fn config(encoding: crate::model::Encoding, heads: usize, d: usize) -> ModelConfig {
        ModelConfig {
            vocab_size: 8,
            d_model: heads * d,
            n_layers: 1,
            n_heads: heads,
            d_ff: 8,
            encoding,
            rope_base: 10000.0,
            pair_layout: PairLayout::Adjacent,
            pope_delta_init: crate::model::DeltaInit::Zero,
            tapa_rho: 0.5,
            tapa_alpha: 0.1,
            tapa_phase: crate::model::TapaPhase::Quadratic,
        }
    }

    /// Outputs and gradients against the reference (burn tensor ops + autodiff) for sequence
    /// lengths below, at and not a multiple of the tile. Tolerance 1e-4 absolute + 1e-3
    /// relative: both sides are f32 with different summation orders over ≤ 70 keys.
    fn check(encoding: crate::model::Encoding, layout: PairLayout) {
        for &(b, h, l, d) in &[(1, 1, 5, 4), (2, 2, 32, 8), (1, 2, 70, 16)] {
            let shape = Shape4 {
                batch: b,
                heads: h,
                seq: l,
                head_dim: d,
            };
            let n = b * h * l * d;
            let (q, k, v, g) = (random(n, 1), random(n, 2), random(n, 3), random(n, 4));
            let mut cfg = config(encoding, h, d);
            cfg.pair_layout = layout;
            let device = Device::flex().autodiff();
            let pos = PositionalAttention::new(&cfg, 0, &device);
            let enc = match encoding {
                crate::model::Encoding::Rope => KernelEncoding::Rope {
                    inv_freq: crate::model::rope::inv_freq(d, 10000.0),
                    layout,
                    attention_factor: 1.0,
                },
                _ => KernelEncoding::Nope,
            };
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
            let (out, lse) = flash_forward(&q, &k, &v, shape, &enc);
            let close = |a: &[f32], r: &[f32], what: &str| {
                for (i, (x, y)) in a.iter().zip(r).enumerate() {
                    assert!(
                        (x - y).abs() <= 1e-4 + 1e-3 * y.abs(),
                        "{encoding:?} {layout:?} {shape:?} {what}[{i}]: fused {x}, reference {y}"
                    );
                }
            };
            close(&out, &ref_out, "out");
            let (dq, dk, dv) = flash_backward(&q, &k, &v, &out, &lse, &g, shape, &enc);
            for (name, fused, tensor) in [("dq", &dq, &tq), ("dk", &dk, &tk), ("dv", &dv, &tv)] {
                let r = tensor
                    .grad(&grads)
                    .unwrap()
                    .into_data()
                    .try_to_vec::<f32>()
                    .unwrap();
                close(fused, &r, name);
            }
        }
    }

    #[test]
    fn nope_matches_reference() {
        check(crate::model::Encoding::Nope, PairLayout::Adjacent);
    }

    #[test]
    fn rope_matches_reference_both_layouts() {
        check(crate::model::Encoding::Rope, PairLayout::Adjacent);
        check(crate::model::Encoding::Rope, PairLayout::RotateHalf);
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
            shape,
            &KernelEncoding::Nope,
        );
        assert!((lse[0] - 0.0).abs() < 1e-6); // row 0 sees only key 0: score 0 → lse 0
        assert!((lse[1] - (3.0 + 2f32.ln())).abs() < 1e-6);
        assert_eq!(out[0], 2.0);
        assert!((out[1] - 3.0).abs() < 1e-6);
    }
}
