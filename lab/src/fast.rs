//! The whole-step CPU path (issue 17, first part): the lab's transformer forward and backward by
//! hand over flat `f32` buffers, so a training step makes no burn tensor op and no autodiff graph;
//! its only layout copies are q, k, v (and their gradients) to and from the attention kernel's
//! head layout.
//!
//! - Matrix products go straight to the `gemm` crate (the one burn's flex backend calls), with
//!   transposes expressed as strides.
//! - Attention is the lab's dense CPU kernel ([`crate::kernels::cpu::dense_forward`] /
//!   [`dense_backward`]: scores as `gemm` products for sequences up to 1024, the flash kernel
//!   beyond and for TAPA) with each layer's [`KernelEncoding`], so every encoding the kernels
//!   know (NoPE, RoPE in both layouts and any scaling, PoPE with δ, TAPA in both phases, p-RoPE,
//!   partial rotary, hybrid NoPE layers) runs here unchanged.
//! - RMSNorm and GELU are the slice kernels of [`crate::kernels::pointwise`]; GELU's forward
//!   also returns its derivative ([`gelu_forward_with_grad`]: one exponential per element), so
//!   its backward is one multiply.
//!
//! The maths is the burn model's ([`crate::model::Transformer`], pre-norm, no biases, untied
//! head) and its loss ([`crate::model::masked_cross_entropy`]: mean over the scored positions);
//! `tests/fast_path.rs` checks the loss, the logits and every parameter's gradient against burn's
//! autodiff. [`FastAdamW`] is the burn path's AdamW over the flat buffers;
//! [`crate::train::fast_train_step`] is one whole step (clip, AdamW, PoPE's δ projection), and a
//! run with `attention = "fast"` trains through it ([`crate::train::train`]), its evaluations,
//! probes and checkpoint going through the burn model refreshed by [`FastModel::write_into`];
//! `lab bench train-step --attention fast` times it.
//!
//! Layouts: activations are row-major `[tokens, width]` with `tokens = batch · seq` (sequence
//! `b`'s position `t` is row `b·seq + t`); attention inputs `[batch, heads, seq, head_dim]`.

use burn::module::Param;
use burn::tensor::{Device, TensorData};

use crate::kernels::cpu::{Shape4, dense_backward, dense_forward};
use crate::kernels::gemm::{matmul, matmul_nt, matmul_nt_acc, matmul_tn_into};
use crate::kernels::map::KernelEncoding;
use crate::kernels::pointwise::{gelu_forward_with_grad, rms_norm_backward, rms_norm_forward};
use crate::model::pope::{DELTA_MAX, DELTA_MIN};
use crate::model::{ModelConfig, PositionalAttention, Transformer};

/// One transformer block's weights, row-major (`w` maps `[·, rows] → [·, cols]` as `x·w`).
#[derive(Clone, Debug, PartialEq)]
pub struct BlockWeights {
    /// Attention RMSNorm gain `[d]`.
    pub attn_norm: Vec<f32>,
    /// Canon layer `[canon_len, d]` ([`crate::model::Block::canon`]: the normalised input `h`
    /// becomes `h_t + Σ_j w_j ⊙ h_{t−j}` within each sequence before q, k, v), `None` without one.
    pub canon: Option<Vec<f32>>,
    /// `[d, d]` each.
    pub wq: Vec<f32>,
    /// See `wq`.
    pub wk: Vec<f32>,
    /// See `wq`.
    pub wv: Vec<f32>,
    /// Attention output projection `[d, d]`.
    pub wo: Vec<f32>,
    /// MLP RMSNorm gain `[d]`.
    pub mlp_norm: Vec<f32>,
    /// `[d, d_ff]`.
    pub w_in: Vec<f32>,
    /// `[d_ff, d]`.
    pub w_out: Vec<f32>,
    /// PoPE's phase bias δ `[heads · head_dim]`, radians (other encodings: `None`).
    pub delta: Option<Vec<f32>>,
    /// The layer's encoding as the kernels see it.
    pub encoding: KernelEncoding,
}

/// The model's weights as flat buffers, in the burn model's layout.
#[derive(Clone, Debug, PartialEq)]
pub struct FastModel {
    /// Shape and encoding.
    pub config: ModelConfig,
    /// Token embedding `[vocab, d]`.
    pub token_embedding: Vec<f32>,
    /// The blocks.
    pub blocks: Vec<BlockWeights>,
    /// Final RMSNorm gain `[d]`.
    pub final_norm: Vec<f32>,
    /// Output head `[d, vocab]`.
    pub lm_head: Vec<f32>,
}

/// Gradients of every parameter, shaped like [`FastModel`]'s buffers (`encoding` unused).
pub type FastGrads = FastModel;

/// What one forward and backward pass returns.
#[derive(Clone, Debug)]
pub struct StepOutput {
    /// Mean cross-entropy over the scored positions, nats.
    pub loss: f64,
    /// Scored positions whose argmax is the target.
    pub correct: usize,
    /// Logits `[tokens, vocab]`.
    pub logits: Vec<f32>,
    /// `∂loss/∂θ` for every parameter.
    pub grads: FastGrads,
}

fn host(t: burn::tensor::Tensor<1>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 data")
}

fn host2(t: burn::tensor::Tensor<2>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 data")
}

impl FastModel {
    /// The weights of a burn model (any device: they are copied to the host).
    pub fn from_burn(model: &Transformer, config: &ModelConfig) -> Self {
        let blocks = model
            .blocks
            .iter()
            .map(|b| {
                let (encoding, delta) = b.positional.kernel_encoding();
                BlockWeights {
                    attn_norm: host(b.attn_norm.val()),
                    canon: b.canon.as_ref().map(|w| host2(w.val())),
                    wq: host2(b.wq.val()),
                    wk: host2(b.wk.val()),
                    wv: host2(b.wv.val()),
                    wo: host2(b.wo.val()),
                    mlp_norm: host(b.mlp_norm.val()),
                    w_in: host2(b.w_in.val()),
                    w_out: host2(b.w_out.val()),
                    delta: delta.map(host),
                    encoding,
                }
            })
            .collect();
        FastModel {
            config: config.clone(),
            token_embedding: host2(model.token_embedding.val()),
            blocks,
            final_norm: host(model.final_norm.val()),
            lm_head: host2(model.lm_head.val()),
        }
    }

    /// Write these weights into `model` (same shapes; on `device`), for evaluation, probes and
    /// checkpoints through burn.
    pub fn write_into(&self, mut model: Transformer, device: &Device) -> Transformer {
        let (d, f, v) = (
            self.config.d_model,
            self.config.d_ff,
            self.config.vocab_size,
        );
        let p2 = |x: &[f32], shape: [usize; 2]| -> Param<burn::tensor::Tensor<2>> {
            Param::from_data(TensorData::new(x.to_vec(), shape), device)
        };
        let p1 = |x: &[f32]| -> Param<burn::tensor::Tensor<1>> {
            Param::from_data(TensorData::new(x.to_vec(), [x.len()]), device)
        };
        model.token_embedding = p2(&self.token_embedding, [v, d]);
        for (b, w) in model.blocks.iter_mut().zip(&self.blocks) {
            b.attn_norm = p1(&w.attn_norm);
            if let Some(c) = &w.canon {
                b.canon = Some(p2(c, [c.len() / d, d]));
            }
            b.wq = p2(&w.wq, [d, d]);
            b.wk = p2(&w.wk, [d, d]);
            b.wv = p2(&w.wv, [d, d]);
            b.wo = p2(&w.wo, [d, d]);
            b.mlp_norm = p1(&w.mlp_norm);
            b.w_in = p2(&w.w_in, [d, f]);
            b.w_out = p2(&w.w_out, [f, d]);
            if let (PositionalAttention::Pope(p), Some(delta)) = (&mut b.positional, &w.delta) {
                p.delta = p1(delta);
            }
        }
        model.final_norm = p1(&self.final_norm);
        model.lm_head = p2(&self.lm_head, [d, v]);
        model
    }

    /// Every parameter buffer in a fixed order, with whether it is a matrix (AdamW decays
    /// matrices only, as [`crate::train::AdamW`] does for tensors of rank ≥ 2; a canon layer's
    /// `[canon_len, d]` is one).
    pub fn params(&self) -> Vec<(&[f32], bool)> {
        let mut out: Vec<(&[f32], bool)> = vec![(&self.token_embedding, true)];
        for b in &self.blocks {
            if let Some(c) = &b.canon {
                out.push((c, true));
            }
            out.extend([
                (&b.attn_norm[..], false),
                (&b.wq[..], true),
                (&b.wk[..], true),
                (&b.wv[..], true),
                (&b.wo[..], true),
                (&b.mlp_norm[..], false),
                (&b.w_in[..], true),
                (&b.w_out[..], true),
            ]);
            if let Some(d) = &b.delta {
                out.push((d, false));
            }
        }
        out.push((&self.final_norm, false));
        out.push((&self.lm_head, true));
        out
    }

    /// [`FastModel::params`], mutable.
    pub fn params_mut(&mut self) -> Vec<(&mut [f32], bool)> {
        let mut out: Vec<(&mut [f32], bool)> = vec![(&mut self.token_embedding, true)];
        for b in &mut self.blocks {
            if let Some(c) = &mut b.canon {
                out.push((c, true));
            }
            out.extend([
                (&mut b.attn_norm[..], false),
                (&mut b.wq[..], true),
                (&mut b.wk[..], true),
                (&mut b.wv[..], true),
                (&mut b.wo[..], true),
                (&mut b.mlp_norm[..], false),
                (&mut b.w_in[..], true),
                (&mut b.w_out[..], true),
            ]);
            if let Some(d) = &mut b.delta {
                out.push((d, false));
            }
        }
        out.push((&mut self.final_norm, false));
        out.push((&mut self.lm_head, true));
        out
    }

    /// Keep PoPE's δ in `[−2π, 0]` (as [`crate::model::Pope::clamp_delta`]).
    pub fn project(&mut self) {
        for b in &mut self.blocks {
            if let Some(d) = &mut b.delta {
                for x in d.iter_mut() {
                    *x = x.clamp(DELTA_MIN as f32, DELTA_MAX as f32);
                }
            }
        }
    }

    /// A zero buffer of every parameter's shape.
    fn zeros_like(&self) -> FastGrads {
        let z = |v: &Vec<f32>| vec![0.0f32; v.len()];
        FastModel {
            config: self.config.clone(),
            token_embedding: z(&self.token_embedding),
            blocks: self
                .blocks
                .iter()
                .map(|b| BlockWeights {
                    attn_norm: z(&b.attn_norm),
                    canon: b.canon.as_ref().map(z),
                    wq: z(&b.wq),
                    wk: z(&b.wk),
                    wv: z(&b.wv),
                    wo: z(&b.wo),
                    mlp_norm: z(&b.mlp_norm),
                    w_in: z(&b.w_in),
                    w_out: z(&b.w_out),
                    delta: b.delta.as_ref().map(z),
                    encoding: b.encoding.clone(),
                })
                .collect(),
            final_norm: z(&self.final_norm),
            lm_head: z(&self.lm_head),
        }
    }

    /// Loss, logits and gradients of one batch: `tokens`, `targets` `[batch · seq]` (ids below
    /// `vocab_size`), `mask` `[batch · seq]` (1 = scored), `batch` sequences of `seq` tokens.
    ///
    /// The batch is processed as two halves (the first `⌈batch/2⌉` sequences, then the rest) on
    /// two rayon tasks, and the halves' gradients are summed, first plus second: on two threads
    /// each half runs without waiting for the other, and the numbers do not depend on how many
    /// threads there are (the split is fixed by `batch` alone).
    ///
    /// # Panics
    /// If a length does not match `batch · seq` or an id is out of the vocabulary.
    pub fn forward_backward(
        &self,
        tokens: &[usize],
        targets: &[usize],
        mask: &[f32],
        batch: usize,
        seq: usize,
    ) -> StepOutput {
        let n = batch * seq;
        assert!(tokens.len() == n && targets.len() == n && mask.len() == n);
        let n_scored = mask.iter().sum::<f32>().max(1.0);
        let pass = |rows: std::ops::Range<usize>, sequences: usize| {
            let (t, y, m) = (&tokens[rows.clone()], &targets[rows.clone()], &mask[rows]);
            self.half_pass(t, y, m, sequences, seq, n_scored)
        };
        if batch < 2 {
            let mut out = pass(0..n, batch);
            out.loss /= n_scored as f64;
            return out;
        }
        let first = batch.div_ceil(2);
        let cut = first * seq;
        let (mut a, b) = rayon::join(|| pass(0..cut, first), || pass(cut..n, batch - first));
        for ((ga, _), (gb, _)) in a.grads.params_mut().into_iter().zip(b.grads.params()) {
            add_into(ga, gb);
        }
        a.logits.extend_from_slice(&b.logits);
        StepOutput {
            loss: (a.loss + b.loss) / n_scored as f64,
            correct: a.correct + b.correct,
            logits: a.logits,
            grads: a.grads,
        }
    }

    /// [`FastModel::forward_backward`]'s loss and gradients with each sequence cut after its last
    /// scored position, for right-padded tasks (iGSM: a problem and its solution, then `PAD`).
    ///
    /// Attention is causal and every other layer acts on one position, so positions after a
    /// sequence's last scored one change neither its loss nor any gradient: they are dropped.
    /// The sequences are sorted by that length (ties by index) and cut into groups of
    /// [`TRIM_GROUP`]; each group is one pass padded to its longest member, so a batch that
    /// mixes short and long problems costs the sum of the groups' lengths instead of `batch ·
    /// seq`. The groups are dealt to two rayon tasks (longest first, each to the task with less
    /// work so far) and their gradients summed in that fixed order, so the bits depend on the
    /// batch alone, not on the number of threads. Same maths as the padded pass; the sums run in
    /// another order (f32 round-off; `tests/fast_path.rs` checks them against each other).
    ///
    /// When trimming would save less than a tenth of the positions (tasks whose every position
    /// is scored), or nothing is scored, this is [`FastModel::forward_backward`] itself, logits
    /// included; otherwise
    /// `logits` is empty.
    ///
    /// # Panics
    /// As [`FastModel::forward_backward`].
    pub fn forward_backward_trimmed(
        &self,
        tokens: &[usize],
        targets: &[usize],
        mask: &[f32],
        batch: usize,
        seq: usize,
    ) -> StepOutput {
        let n = batch * seq;
        assert!(tokens.len() == n && targets.len() == n && mask.len() == n);
        let groups = trim_plan(mask, batch, seq);
        let kept: usize = groups.iter().map(|g| g.rows.len() * g.len).sum();
        // Nothing scored (no group) or little to save: the padded pass.
        if groups.is_empty() || kept * 10 > n * 9 {
            return self.forward_backward(tokens, targets, mask, batch, seq);
        }
        let n_scored = mask.iter().sum::<f32>().max(1.0);
        // Deal the groups, longest first, to the task with less work so far.
        let (mut first, mut second) = (Vec::new(), Vec::new());
        let (mut w1, mut w2) = (0usize, 0usize);
        for g in groups.iter().rev() {
            let w = g.rows.len() * g.len;
            if w1 <= w2 {
                first.push(g);
                w1 += w;
            } else {
                second.push(g);
                w2 += w;
            }
        }
        let run = |part: &[&TrimGroup]| -> Option<StepOutput> {
            let mut acc: Option<StepOutput> = None;
            for g in part {
                let (mut t, mut y, mut m) = (Vec::new(), Vec::new(), Vec::new());
                for &b in &g.rows {
                    let r = b * seq..b * seq + g.len;
                    t.extend_from_slice(&tokens[r.clone()]);
                    y.extend_from_slice(&targets[r.clone()]);
                    m.extend_from_slice(&mask[r]);
                }
                let out = self.half_pass(&t, &y, &m, g.rows.len(), g.len, n_scored);
                acc = Some(match acc {
                    None => out,
                    Some(mut a) => {
                        merge_into(&mut a, &out);
                        a
                    }
                });
            }
            acc
        };
        let (a, b) = rayon::join(|| run(&first), || run(&second));
        let mut out = match (a, b) {
            (Some(mut a), Some(b)) => {
                merge_into(&mut a, &b);
                a
            }
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => unreachable!("the groups are not empty"),
        };
        out.logits = Vec::new();
        out.loss /= n_scored as f64;
        out
    }

    /// [`FastModel::forward_backward`] of `batch` sequences, with every gradient over the whole
    /// batch's `n_scored` positions; `loss` is the *sum* of the scored positions' losses.
    fn half_pass(
        &self,
        tokens: &[usize],
        targets: &[usize],
        mask: &[f32],
        batch: usize,
        seq: usize,
        n_scored: f32,
    ) -> StepOutput {
        let cfg = &self.config;
        let (d, f, v) = (cfg.d_model, cfg.d_ff, cfg.vocab_size);
        let (heads, hd) = (cfg.n_heads, cfg.head_dim());
        let n = batch * seq;
        let shape = Shape4 {
            batch,
            heads,
            seq,
            head_dim: hd,
        };

        // Forward, keeping what the backward needs.
        struct Saved {
            x: Vec<f32>,
            r1: Vec<f32>,
            // The normalised input before the canon layer (only with one).
            hn: Option<Vec<f32>>,
            // The input of wq, wk, wv.
            h1: Vec<f32>,
            q: Vec<f32>,
            k: Vec<f32>,
            v: Vec<f32>,
            o: Vec<f32>,
            lse: Vec<f32>,
            o_rows: Vec<f32>,
            x1: Vec<f32>,
            r2: Vec<f32>,
            h2: Vec<f32>,
            gelu_grad: Vec<f32>,
            a: Vec<f32>,
        }
        let mut x = vec![0.0f32; n * d];
        for (row, &t) in x.chunks_mut(d).zip(tokens) {
            row.copy_from_slice(&self.token_embedding[t * d..(t + 1) * d]);
        }
        let mut saved = Vec::with_capacity(self.blocks.len());
        for b in &self.blocks {
            let (h1, r1) = rms_norm_forward(&x, &b.attn_norm);
            let (h1, hn) = match &b.canon {
                Some(w) => (canon_forward(&h1, w, batch, seq, d), Some(h1)),
                None => (h1, None),
            };
            let q = to_heads(&matmul(&h1, &b.wq, n, d, d), shape);
            let k = to_heads(&matmul(&h1, &b.wk, n, d, d), shape);
            let vv = to_heads(&matmul(&h1, &b.wv, n, d, d), shape);
            let (o, lse) = dense_forward(&q, &k, &vv, b.delta.as_deref(), shape, &b.encoding);
            let o_rows = from_heads(&o, shape);
            let mut x1 = matmul(&o_rows, &b.wo, n, d, d);
            add_into(&mut x1, &x);
            let (h2, r2) = rms_norm_forward(&x1, &b.mlp_norm);
            let u = matmul(&h2, &b.w_in, n, d, f);
            let (a, gelu_grad) = gelu_forward_with_grad(&u);
            let mut x2 = matmul(&a, &b.w_out, n, f, d);
            add_into(&mut x2, &x1);
            saved.push(Saved {
                x: std::mem::replace(&mut x, x2),
                r1,
                hn,
                h1,
                q,
                k,
                v: vv,
                o,
                lse,
                o_rows,
                x1,
                r2,
                h2,
                gelu_grad,
                a,
            });
        }
        let (hf, rf) = rms_norm_forward(&x, &self.final_norm);
        let logits = matmul(&hf, &self.lm_head, n, d, v);

        // Loss and its gradient: softmax − one-hot on scored rows, over the number scored.
        let mut dlogits = vec![0.0f32; n * v];
        let (mut loss, mut correct) = (0.0f64, 0usize);
        for ((lg, dl), (&t, &m)) in logits
            .chunks(v)
            .zip(dlogits.chunks_mut(v))
            .zip(targets.iter().zip(mask))
        {
            let max = lg.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = lg.iter().map(|&z| ((z - max) as f64).exp()).sum();
            let log_z = max as f64 + sum.ln();
            if m != 0.0 {
                loss -= m as f64 * (lg[t] as f64 - log_z);
                let arg = lg
                    .iter()
                    .enumerate()
                    .fold(
                        (0, f32::NEG_INFINITY),
                        |acc, (i, &z)| {
                            if z > acc.1 { (i, z) } else { acc }
                        },
                    )
                    .0;
                correct += usize::from(arg == t);
                let scale = m / n_scored;
                for (g, &z) in dl.iter_mut().zip(lg) {
                    *g = (((z as f64) - log_z).exp() as f32) * scale;
                }
                dl[t] -= scale;
            }
        }

        // Backward.
        let mut grads = self.zeros_like();
        matmul_tn_into(&hf, &dlogits, n, d, v, &mut grads.lm_head);
        let dhf = matmul_nt(&dlogits, &self.lm_head, n, v, d);
        let (mut dx, dgf) = rms_norm_backward(&x, &self.final_norm, &rf, &dhf);
        grads.final_norm = dgf;
        for (l, b) in self.blocks.iter().enumerate().rev() {
            let s = &saved[l];
            let g = &mut grads.blocks[l];
            // x2 = x1 + gelu(rms(x1)·w_in)·w_out
            matmul_tn_into(&s.a, &dx, n, f, d, &mut g.w_out);
            let da = matmul_nt(&dx, &b.w_out, n, d, f);
            let du: Vec<f32> = da.iter().zip(&s.gelu_grad).map(|(d, g)| d * g).collect();
            matmul_tn_into(&s.h2, &du, n, d, f, &mut g.w_in);
            let dh2 = matmul_nt(&du, &b.w_in, n, f, d);
            let (dx1n, dg2) = rms_norm_backward(&s.x1, &b.mlp_norm, &s.r2, &dh2);
            g.mlp_norm = dg2;
            let mut dx1 = dx;
            add_into(&mut dx1, &dx1n);
            // x1 = x + attention(rms(x))·wo
            matmul_tn_into(&s.o_rows, &dx1, n, d, d, &mut g.wo);
            let do_rows = matmul_nt(&dx1, &b.wo, n, d, d);
            let fg = dense_backward(
                &s.q,
                &s.k,
                &s.v,
                b.delta.as_deref(),
                &s.o,
                &s.lse,
                &to_heads(&do_rows, shape),
                shape,
                &b.encoding,
            );
            g.delta = fg.ddelta;
            let (dq, dk, dv) = (
                from_heads(&fg.dq, shape),
                from_heads(&fg.dk, shape),
                from_heads(&fg.dv, shape),
            );
            matmul_tn_into(&s.h1, &dq, n, d, d, &mut g.wq);
            matmul_tn_into(&s.h1, &dk, n, d, d, &mut g.wk);
            matmul_tn_into(&s.h1, &dv, n, d, d, &mut g.wv);
            let mut dh1 = matmul_nt(&dq, &b.wq, n, d, d);
            matmul_nt_acc(&dk, &b.wk, n, d, d, &mut dh1);
            matmul_nt_acc(&dv, &b.wv, n, d, d, &mut dh1);
            if let (Some(w), Some(hn)) = (&b.canon, &s.hn) {
                let (dh, dw) = canon_backward(hn, w, &dh1, batch, seq, d);
                dh1 = dh;
                g.canon = Some(dw);
            }
            let (dxn, dg1) = rms_norm_backward(&s.x, &b.attn_norm, &s.r1, &dh1);
            g.attn_norm = dg1;
            add_into(&mut dx1, &dxn);
            dx = dx1;
        }
        for (row, &t) in dx.chunks(d).zip(tokens) {
            add_into(&mut grads.token_embedding[t * d..(t + 1) * d], row);
        }
        StepOutput {
            loss,
            correct,
            logits,
            grads,
        }
    }
}

/// AdamW over a [`FastModel`]'s buffers, with [`crate::train::AdamW`]'s semantics (PyTorch's:
/// bias-corrected moments, decoupled weight decay on matrices only, `eps` added to `√v̂`).
#[derive(Clone, Debug)]
pub struct FastAdamW {
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    step: i32,
    /// First and second moments, in [`FastModel::params`] order.
    moments: Vec<(Vec<f32>, Vec<f32>)>,
}

impl FastAdamW {
    /// A fresh optimiser.
    pub fn new(beta1: f64, beta2: f64, eps: f64, weight_decay: f64) -> Self {
        FastAdamW {
            beta1,
            beta2,
            eps,
            weight_decay,
            step: 0,
            moments: Vec::new(),
        }
    }

    /// One update of `model` at learning rate `lr` from `grads`, every gradient scaled by
    /// `grad_scale` first (the clip factor).
    pub fn step(&mut self, model: &mut FastModel, grads: &FastGrads, lr: f64, grad_scale: f64) {
        self.step += 1;
        let grads = grads.params();
        let mut params = model.params_mut();
        if self.moments.is_empty() {
            self.moments = grads
                .iter()
                .map(|(g, _)| (vec![0.0f32; g.len()], vec![0.0f32; g.len()]))
                .collect();
        }
        let (b1, b2) = (self.beta1 as f32, self.beta2 as f32);
        let bias1 = (1.0 - self.beta1.powi(self.step)) as f32;
        let bias2 = (1.0 - self.beta2.powi(self.step)) as f32;
        let (eps, lr32, scale) = (self.eps as f32, lr as f32, grad_scale as f32);
        for (((x, is_matrix), (g, _)), (m, v)) in
            params.iter_mut().zip(&grads).zip(self.moments.iter_mut())
        {
            let keep = 1.0 - (lr * if *is_matrix { self.weight_decay } else { 0.0 }) as f32;
            for (((x, &g), m), v) in x
                .iter_mut()
                .zip(g.iter())
                .zip(m.iter_mut())
                .zip(v.iter_mut())
            {
                let g = g * scale;
                *m = *m * b1 + g * (1.0 - b1);
                *v = *v * b2 + g * g * (1.0 - b2);
                let update = (*m / bias1) / ((*v / bias2).sqrt() + eps);
                *x = *x * keep - update * lr32;
            }
        }
    }
}

/// Global L2 norm of every gradient (summed in f64).
pub fn global_grad_norm(grads: &FastGrads) -> f64 {
    grads
        .params()
        .iter()
        .flat_map(|(g, _)| g.iter())
        .map(|&x| (x as f64) * (x as f64))
        .sum::<f64>()
        .sqrt()
}

/// Sequences per group of [`FastModel::forward_backward_trimmed`]: small enough that a batch of
/// 32 mixing four problem sizes pads each group to about its own size, large enough for the
/// matrix products to stay efficient (`lab bench train-step`; docs/performance.md).
pub const TRIM_GROUP: usize = 4;

/// One group of [`FastModel::forward_backward_trimmed`]: sequence indices and the length they
/// are cut to.
#[derive(Clone, Debug, PartialEq)]
struct TrimGroup {
    rows: Vec<usize>,
    len: usize,
}

/// The groups of [`FastModel::forward_backward_trimmed`]: sequences with a scored position,
/// sorted by their last scored position + 1 (ties by index), cut into [`TRIM_GROUP`]s, each
/// group's `len` its longest member's.
fn trim_plan(mask: &[f32], batch: usize, seq: usize) -> Vec<TrimGroup> {
    let mut lens: Vec<(usize, usize)> = (0..batch)
        .filter_map(|b| {
            let m = &mask[b * seq..(b + 1) * seq];
            m.iter().rposition(|&x| x != 0.0).map(|t| (t + 1, b))
        })
        .collect();
    lens.sort_unstable();
    lens.chunks(TRIM_GROUP)
        .map(|c| TrimGroup {
            rows: c.iter().map(|&(_, b)| b).collect(),
            len: c.iter().map(|&(l, _)| l).max().unwrap_or(0),
        })
        .collect()
}

/// `acc += x` for the loss sum, the count of correct positions and every gradient.
fn merge_into(acc: &mut StepOutput, x: &StepOutput) {
    acc.loss += x.loss;
    acc.correct += x.correct;
    for ((ga, _), (gb, _)) in acc.grads.params_mut().into_iter().zip(x.grads.params()) {
        add_into(ga, gb);
    }
}

/// The canon layer's forward ([`crate::model::canon_conv`]): `h` `[batch · seq, d]` rows,
/// `w` `[len, d]` → `out_t = h_t + Σ_{j < len, j ≤ t} w_j ⊙ h_{t−j}` within each sequence.
fn canon_forward(h: &[f32], w: &[f32], batch: usize, seq: usize, d: usize) -> Vec<f32> {
    let len = w.len() / d;
    let mut out = h.to_vec();
    for b in 0..batch {
        for t in 0..seq {
            let row = (b * seq + t) * d;
            for j in 0..len.min(t + 1) {
                let (src, wj) = (&h[row - j * d..][..d], &w[j * d..][..d]);
                for ((o, &x), &c) in out[row..row + d].iter_mut().zip(src).zip(wj) {
                    *o += c * x;
                }
            }
        }
    }
    out
}

/// The canon layer's backward: from `dout` (`[batch · seq, d]`), `(dh, dw)` with
/// `dh_s = dout_s + Σ_{j < len, s + j < seq} w_j ⊙ dout_{s+j}` and
/// `dw_j = Σ_{b, t ≥ j} dout_t ⊙ h_{t−j}`.
fn canon_backward(
    h: &[f32],
    w: &[f32],
    dout: &[f32],
    batch: usize,
    seq: usize,
    d: usize,
) -> (Vec<f32>, Vec<f32>) {
    let len = w.len() / d;
    let mut dh = dout.to_vec();
    let mut dw = vec![0.0f32; w.len()];
    for b in 0..batch {
        for t in 0..seq {
            let row = (b * seq + t) * d;
            let g = &dout[row..row + d];
            for j in 0..len.min(t + 1) {
                let src = row - j * d;
                let wj = &w[j * d..][..d];
                for ((x, &gi), &c) in dh[src..src + d].iter_mut().zip(g).zip(wj) {
                    *x += c * gi;
                }
                for ((a, &gi), &x) in dw[j * d..][..d].iter_mut().zip(g).zip(&h[src..src + d]) {
                    *a += gi * x;
                }
            }
        }
    }
    (dh, dw)
}

fn add_into(acc: &mut [f32], x: &[f32]) {
    for (a, &b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

/// `[tokens, heads·head_dim]` (row `b·seq + t`) → `[batch, heads, seq, head_dim]`, written in
/// output order (no zero-fill first).
fn to_heads(x: &[f32], s: Shape4) -> Vec<f32> {
    let (d, hd) = (s.heads * s.head_dim, s.head_dim);
    let mut out = Vec::with_capacity(x.len());
    for b in 0..s.batch {
        for h in 0..s.heads {
            for t in 0..s.seq {
                let src = (b * s.seq + t) * d + h * hd;
                out.extend_from_slice(&x[src..src + hd]);
            }
        }
    }
    out
}

/// Inverse of [`to_heads`].
fn from_heads(x: &[f32], s: Shape4) -> Vec<f32> {
    let hd = s.head_dim;
    let mut out = Vec::with_capacity(x.len());
    for b in 0..s.batch {
        for t in 0..s.seq {
            for h in 0..s.heads {
                let src = ((b * s.heads + h) * s.seq + t) * hd;
                out.extend_from_slice(&x[src..src + hd]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_layout_round_trips() {
        let s = Shape4 {
            batch: 2,
            heads: 3,
            seq: 4,
            head_dim: 2,
        };
        let x: Vec<f32> = (0..48).map(|i| i as f32).collect();
        let h = to_heads(&x, s);
        // Batch 1, head 2, position 3: row 7, dims 4..6.
        assert_eq!(&h[((3 + 2) * 4 + 3) * 2..][..2], &[46.0, 47.0]);
        assert_eq!(from_heads(&h, s), x);
    }
}
