//! The whole-step CPU path (`lab::fast`) against burn's model and autodiff (the oracle): loss,
//! logits and every parameter's gradient, for every encoding the kernels know, on two shapes.
//!
//! Tolerance: |fast − burn| ≤ 2e-5 + 2e-3·|burn| per element. Both sides run the same flash
//! kernel and slice kernels; they differ in the order of the matrix products' sums (gemm called
//! directly vs through burn) and of the loss's reductions, f32 round-off of order 1e-6 relative.

use burn::module::Param;
use burn::tensor::{Device, Int, Tensor, TensorData};
use lab::fast::{BlockWeights, FastModel};
use lab::model::{
    AttentionKernel, Encoding, EncodingConfig, ModelConfig, PRopeParams, PairLayout,
    PartialRopeParams, PositionalAttention, TapaPhase, Transformer, masked_cross_entropy,
};
use rand::{Rng, SeedableRng};

fn config(encoding: EncodingConfig, layout: PairLayout, nope_every: usize) -> ModelConfig {
    ModelConfig {
        vocab_size: 13,
        d_model: 32,
        n_layers: 2,
        n_heads: 2,
        d_ff: 40,
        encoding,
        rope_base: 100.0,
        pair_layout: layout,
        attention: AttentionKernel::Fused,
        nope_every,
        canon_len: 0,
    }
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

fn close(fast: &[f32], burn: &[f32], what: &str) {
    assert_eq!(fast.len(), burn.len(), "{what}: lengths");
    for (i, (x, y)) in fast.iter().zip(burn).enumerate() {
        assert!(
            (x - y).abs() <= 2e-5 + 2e-3 * y.abs(),
            "{what}[{i}]: fast {x}, burn {y}"
        );
    }
}

fn grad<const D: usize>(p: &Param<Tensor<D>>, g: &burn::tensor::Gradients) -> Vec<f32> {
    values(p.val().grad(g).expect("a gradient"))
}

fn check(what: &str, cfg: &ModelConfig, batch: usize, seq: usize) {
    let device = Device::flex().autodiff();
    let mut model: Transformer = cfg.init(5, &device);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
    // Canon layers start at zero; seeded weights so their input gradient is exercised too.
    for b in &mut model.blocks {
        if b.canon.is_some() {
            let w: Vec<f32> = (0..cfg.canon_len * cfg.d_model)
                .map(|_| rng.random_range(-0.5..0.5))
                .collect();
            b.canon = Some(Param::from_tensor(
                Tensor::from_data(TensorData::new(w, [cfg.canon_len, cfg.d_model]), &device)
                    .require_grad(),
            ));
        }
    }
    let n = batch * seq;
    let v = cfg.vocab_size;
    let tokens: Vec<usize> = (0..n).map(|_| rng.random_range(0..v)).collect();
    let targets: Vec<usize> = (0..n).map(|_| rng.random_range(0..v)).collect();
    // Score about two thirds of the positions (the loss is a mean over scored positions).
    let mask: Vec<f32> = (0..n).map(|i| f32::from(i % 3 != 0)).collect();

    let fast = FastModel::from_burn(&model, cfg);
    let out = fast.forward_backward(&tokens, &targets, &mask, batch, seq);

    let ids = |x: &[usize]| {
        Tensor::<2, Int>::from_data(
            TensorData::new(
                x.iter().map(|&t| t as i64).collect::<Vec<_>>(),
                [batch, seq],
            ),
            &device,
        )
    };
    let logits = model.forward(ids(&tokens));
    let m = Tensor::<2>::from_data(TensorData::new(mask.clone(), [batch, seq]), &device);
    let n_scored = mask.iter().filter(|&&x| x > 0.0).count();
    let (loss, correct) = masked_cross_entropy(logits.clone(), ids(&targets), m, n_scored);
    let burn_loss = values(loss.clone())[0] as f64;
    let burn_correct = values(correct)[0] as usize;
    let g = loss.backward();

    assert!(
        (out.loss - burn_loss).abs() <= 1e-5 * burn_loss.abs().max(1.0),
        "{what}: loss fast {} burn {burn_loss}",
        out.loss
    );
    assert_eq!(out.correct, burn_correct, "{what}: correct");
    close(&out.logits, &values(logits), &format!("{what} logits"));
    let gr = &out.grads;
    close(
        &gr.token_embedding,
        &grad(&model.token_embedding, &g),
        &format!("{what} d/dembedding"),
    );
    close(
        &gr.final_norm,
        &grad(&model.final_norm, &g),
        &format!("{what} d/dfinal_norm"),
    );
    close(
        &gr.lm_head,
        &grad(&model.lm_head, &g),
        &format!("{what} d/dlm_head"),
    );
    for (l, (fb, bb)) in gr.blocks.iter().zip(&model.blocks).enumerate() {
        match (&bb.canon, &fb.canon) {
            (Some(w), Some(dw)) => close(dw, &grad(w, &g), &format!("{what} d/dblocks[{l}].canon")),
            (None, None) => {}
            _ => panic!("{what}: canon layer on one side only"),
        }
        let BlockWeights {
            attn_norm,
            wq,
            wk,
            wv,
            wo,
            mlp_norm,
            w_in,
            w_out,
            delta,
            ..
        } = fb;
        for (name, f, b) in [
            ("attn_norm", attn_norm, grad(&bb.attn_norm, &g)),
            ("wq", wq, grad(&bb.wq, &g)),
            ("wk", wk, grad(&bb.wk, &g)),
            ("wv", wv, grad(&bb.wv, &g)),
            ("wo", wo, grad(&bb.wo, &g)),
            ("mlp_norm", mlp_norm, grad(&bb.mlp_norm, &g)),
            ("w_in", w_in, grad(&bb.w_in, &g)),
            ("w_out", w_out, grad(&bb.w_out, &g)),
        ] {
            close(f, &b, &format!("{what} d/dblocks[{l}].{name}"));
        }
        match (&bb.positional, delta) {
            (PositionalAttention::Pope(p), Some(dd)) => close(
                dd,
                &grad(&p.delta, &g),
                &format!("{what} d/dblocks[{l}].delta"),
            ),
            (PositionalAttention::Pope(_), None) => panic!("{what}: PoPE without dδ"),
            (_, d) => assert!(d.is_none(), "{what}: dδ for a non-PoPE layer"),
        }
    }
}

/// Every parameter of `fast` within |Δ| ≤ 1e-4 + 1e-3·|reference| of `reference`'s (training
/// steps amplify round-off a little through AdamW's 1/√v̂).
fn close_params(fast: &FastModel, reference: &FastModel, what: &str) {
    for (i, ((f, _), (r, _))) in fast.params().iter().zip(reference.params()).enumerate() {
        assert_eq!(f.len(), r.len(), "{what}: parameter {i} length");
        for (j, (x, y)) in f.iter().zip(r.iter()).enumerate() {
            assert!(
                (x - y).abs() <= 1e-4 + 1e-3 * y.abs(),
                "{what}: parameter {i}[{j}]: fast {x}, reference {y}"
            );
        }
    }
}

/// A small block-task run (copy, B = 4, d = 32, 2 layers, 12 steps, evaluated every 6).
fn small_run() -> serde_json::Value {
    serde_json::json!({
        "task": "block", "variant": "copy", "vocab_size": 16, "seq_len": 32, "block_len": 4,
        "noise": 0.0, "encoding": "rope", "rope_base": 10000.0, "pair_layout": "adjacent",
        "d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "steps": 12, "batch_size": 4,
        "lr": 0.003, "warmup_steps": 2, "min_lr_ratio": 0.1, "weight_decay": 0.1,
        "beta1": 0.9, "beta2": 0.95, "adam_eps": 1e-8, "grad_clip": 1.0, "eval_every": 6,
        "eval_batches": 1, "seed": 2
    })
}

#[test]
fn fast_path_matches_burn_for_every_encoding() {
    let mut cases: Vec<(&str, ModelConfig)> = vec![
        (
            "nope",
            config(Encoding::Nope.into(), PairLayout::Adjacent, 0),
        ),
        (
            "rope adjacent",
            config(Encoding::Rope.into(), PairLayout::Adjacent, 0),
        ),
        (
            "rope rotate-half",
            config(Encoding::Rope.into(), PairLayout::RotateHalf, 0),
        ),
        (
            "pope uniform δ",
            config(
                EncodingConfig::for_kernel_checks(Encoding::Pope, TapaPhase::Quadratic),
                PairLayout::Adjacent,
                0,
            ),
        ),
        (
            "tapa quadratic",
            config(
                EncodingConfig::for_kernel_checks(Encoding::Tapa, TapaPhase::Quadratic),
                PairLayout::Adjacent,
                0,
            ),
        ),
        (
            "tapa linear",
            config(
                EncodingConfig::for_kernel_checks(Encoding::Tapa, TapaPhase::Linear),
                PairLayout::Adjacent,
                0,
            ),
        ),
        (
            "p-rope 0.5",
            config(
                EncodingConfig::PRope(PRopeParams { rope_p: 0.5 }),
                PairLayout::RotateHalf,
                0,
            ),
        ),
        (
            "partial-rope 8",
            config(
                EncodingConfig::PartialRope(PartialRopeParams { rotary_dim: 8 }),
                PairLayout::RotateHalf,
                0,
            ),
        ),
        (
            "rope, NoPE every 2nd layer",
            config(Encoding::Rope.into(), PairLayout::Adjacent, 2),
        ),
    ];
    let mut canon = config(Encoding::Rope.into(), PairLayout::Adjacent, 0);
    canon.canon_len = 3;
    cases.push(("rope, canon layers of width 3", canon));
    for (what, cfg) in &cases {
        check(what, cfg, 2, 9);
    }
    // A longer context (more than one 64-token key tile of the kernel) and one sequence.
    check("rope L = 70", &cases[1].1, 1, 70);
    check("pope L = 70", &cases[3].1, 1, 70);
}

/// The same inputs give the same bits (the fast path's own determinism at a fixed thread count).
#[test]
fn fast_path_is_deterministic() {
    let cfg = config(Encoding::Rope.into(), PairLayout::Adjacent, 0);
    let model: Transformer = cfg.init(1, &Device::flex());
    let fast = FastModel::from_burn(&model, &cfg);
    let tokens: Vec<usize> = (0..64).map(|i| (i * 7) % 13).collect();
    let targets: Vec<usize> = (0..64).map(|i| (i * 5 + 1) % 13).collect();
    let mask = vec![1.0f32; 64];
    let a = fast.forward_backward(&tokens, &targets, &mask, 2, 32);
    let b = fast.forward_backward(&tokens, &targets, &mask, 2, 32);
    assert_eq!(a.loss.to_bits(), b.loss.to_bits());
    assert_eq!(a.grads, b.grads);
    assert!(
        a.loss > 1.0 && a.loss < 5.0,
        "loss {} near ln 13 = 2.56 at init",
        a.loss
    );
}

/// The batch's two halves are fixed by the batch size, not by the threads: one and two rayon
/// threads give the same bits (odd batch: halves of 2 and 1 sequences), and the halves' sum is
/// the whole batch's gradient (against one sequence at a time, summed by hand, to round-off).
#[test]
fn fast_path_gives_the_same_bits_on_one_and_two_threads() {
    let cfg = config(Encoding::Rope.into(), PairLayout::Adjacent, 0);
    let model: Transformer = cfg.init(3, &Device::flex());
    let fast = FastModel::from_burn(&model, &cfg);
    let (batch, seq) = (3, 24);
    let tokens: Vec<usize> = (0..batch * seq).map(|i| (i * 7 + 3) % 13).collect();
    let targets: Vec<usize> = (0..batch * seq).map(|i| (i * 5 + 1) % 13).collect();
    let mask: Vec<f32> = (0..batch * seq)
        .map(|i| (i % 3 != 0) as u8 as f32)
        .collect();
    let on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| fast.forward_backward(&tokens, &targets, &mask, batch, seq))
    };
    let (one, two) = (on(1), on(2));
    assert_eq!(one.loss.to_bits(), two.loss.to_bits());
    assert_eq!(one.grads, two.grads);
    assert_eq!(one.logits, two.logits);
    // Each sequence alone (a batch of 1 is one pass), its gradient weighted by its share of the
    // scored positions: the sum is the batch's gradient.
    let n_scored: f32 = mask.iter().sum();
    let mut summed = vec![0.0f64; one.grads.params().iter().map(|(g, _)| g.len()).sum()];
    let mut loss = 0.0f64;
    for b in 0..batch {
        let rows = b * seq..(b + 1) * seq;
        let m = &mask[rows.clone()];
        let share = m.iter().sum::<f32>() / n_scored;
        let out = fast.forward_backward(&tokens[rows.clone()], &targets[rows.clone()], m, 1, seq);
        loss += out.loss * share as f64;
        for (s, &g) in summed
            .iter_mut()
            .zip(out.grads.params().iter().flat_map(|(g, _)| g.iter()))
        {
            *s += (g * share) as f64;
        }
    }
    assert!(
        (loss - one.loss).abs() < 1e-6 * one.loss,
        "{loss} vs {}",
        one.loss
    );
    let whole: Vec<f32> = one
        .grads
        .params()
        .iter()
        .flat_map(|(g, _)| g.to_vec())
        .collect();
    for (i, (&s, &w)) in summed.iter().zip(&whole).enumerate() {
        assert!(
            (s - w as f64).abs() <= 1e-6 + 1e-4 * (w as f64).abs(),
            "gradient element {i}: by sequence {s}, batch {w}"
        );
    }
}

/// Right-padded sequences (scored up to a length, then nothing, as iGSM's solutions): the
/// trimmed pass (`forward_backward_trimmed`: each sequence cut after its last scored position,
/// groups of 4 by length) gives the padded pass's loss, accuracy and gradients to round-off,
/// with canon layers (which look back, never ahead); the same bits on one and two threads; and
/// when every position is scored it is the padded pass itself, bit for bit.
#[test]
fn trimmed_pass_matches_the_padded_pass() {
    let mut cfg = config(Encoding::Rope.into(), PairLayout::Adjacent, 0);
    cfg.canon_len = 3;
    let mut model: Transformer = cfg.init(4, &Device::flex());
    for b in &mut model.blocks {
        let w: Vec<f32> = (0..3 * cfg.d_model)
            .map(|i| ((i % 7) as f32 - 3.0) * 0.1)
            .collect();
        b.canon = Some(Param::from_data(
            TensorData::new(w, [3, cfg.d_model]),
            &Device::flex(),
        ));
    }
    let fast = FastModel::from_burn(&model, &cfg);
    // 11 sequences (groups of 4, 4 and 3), scored from position 2 up to a length in 5..=40; one
    // sequence scores nothing.
    let (batch, seq) = (11, 40);
    let lens = [40, 5, 17, 33, 9, 0, 26, 12, 38, 21, 7];
    let tokens: Vec<usize> = (0..batch * seq).map(|i| (i * 7 + 3) % 13).collect();
    let targets: Vec<usize> = (0..batch * seq).map(|i| (i * 5 + 1) % 13).collect();
    let mask: Vec<f32> = (0..batch * seq)
        .map(|i| f32::from((2..lens[i / seq]).contains(&(i % seq))))
        .collect();
    let padded = fast.forward_backward(&tokens, &targets, &mask, batch, seq);
    let trimmed = fast.forward_backward_trimmed(&tokens, &targets, &mask, batch, seq);
    assert!(
        (trimmed.loss - padded.loss).abs() <= 1e-6 * padded.loss,
        "loss {} vs {}",
        trimmed.loss,
        padded.loss
    );
    assert_eq!(trimmed.correct, padded.correct);
    assert!(trimmed.logits.is_empty());
    let (t, p) = (trimmed.grads.params(), padded.grads.params());
    assert_eq!(t.len(), p.len());
    for (i, ((a, _), (b, _))) in t.iter().zip(&p).enumerate() {
        close(a, b, &format!("trimmed gradient {i}"));
    }
    let on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| fast.forward_backward_trimmed(&tokens, &targets, &mask, batch, seq))
    };
    let (one, two) = (on(1), on(2));
    assert_eq!(one.loss.to_bits(), two.loss.to_bits());
    assert_eq!(one.grads, two.grads);
    // Nothing scored: the padded pass (zero loss and gradients), no panic.
    let none = vec![0.0f32; batch * seq];
    let z = fast.forward_backward_trimmed(&tokens, &targets, &none, batch, seq);
    assert_eq!(z.loss, 0.0);
    assert!(
        z.grads
            .params()
            .iter()
            .all(|(g, _)| g.iter().all(|&x| x == 0.0))
    );
    // Every position scored: nothing to trim, the padded pass's bits and logits.
    let full = vec![1.0f32; batch * seq];
    let a = fast.forward_backward(&tokens, &targets, &full, batch, seq);
    let b = fast.forward_backward_trimmed(&tokens, &targets, &full, batch, seq);
    assert_eq!(a.loss.to_bits(), b.loss.to_bits());
    assert_eq!(a.grads, b.grads);
    assert_eq!(a.logits, b.logits);
}

/// Ten training steps of the block-width quick model's shape (smaller: d = 32) through the fast
/// path and through burn (`lab::train::train_step`) from the same initial weights and batches:
/// the same losses and gradient norms step by step, and the same final parameters. AdamW divides
/// by √v̂, so per-element round-off differences grow a little over the steps; the tolerance is
/// |Δ| ≤ 1e-4 + 1e-3·|burn| on the parameters, 1e-4 relative on the losses.
#[test]
fn ten_training_steps_match_burn() {
    for encoding in [
        EncodingConfig::from(Encoding::Rope),
        EncodingConfig::for_kernel_checks(Encoding::Pope, TapaPhase::Quadratic),
    ] {
        let mut v = small_run();
        v["variant"] = "recall".into();
        v["block_len"] = 8.into();
        v["steps"] = 10.into();
        v["eval_every"] = 10.into();
        v["seed"] = 3.into();
        let mut cfg = lab::config::from_flat_json(v).unwrap();
        cfg.encoding = encoding;
        cfg.validate().unwrap();
        steps_match_burn(&cfg);
    }
}

/// The same on iGSM with canon layers: right-padded problems of 1..3 operations (the fast step
/// trims each after its solution, `forward_backward_trimmed`) and a canon layer of width 4.
#[test]
fn ten_igsm_steps_with_canon_layers_match_burn() {
    let mut v = small_run();
    for key in ["variant", "block_len", "noise"] {
        v.as_object_mut().unwrap().remove(key);
    }
    v["task"] = "igsm".into();
    v["vocab_size"] = 72.into();
    v["ops"] = 3.into();
    v["min_ops"] = 1.into();
    v["distractors"] = 0.into();
    v["seq_len"] = 112.into();
    v["batch_size"] = 12.into();
    v["canon_len"] = 4.into();
    v["attention"] = "fast".into();
    v["steps"] = 10.into();
    v["eval_every"] = 10.into();
    let cfg = lab::config::from_flat_json(v).unwrap();
    cfg.validate().unwrap();
    steps_match_burn(&cfg);
}

/// Train `cfg` for its steps through the fast path and through burn from the same initial weights
/// and batches; compare step by step and at the end.
fn steps_match_burn(cfg: &lab::config::RunConfig) {
    let device = Device::flex().autodiff();
    let mcfg = cfg.model();
    let mut model = mcfg.init(cfg.seed, &device);
    let mut fast = FastModel::from_burn(&model, &mcfg);
    let mut opt = lab::train::AdamW::new(cfg.beta1, cfg.beta2, cfg.adam_eps, cfg.weight_decay);
    let mut fopt = lab::fast::FastAdamW::new(cfg.beta1, cfg.beta2, cfg.adam_eps, cfg.weight_decay);
    for step in 0..cfg.steps {
        let ex = cfg.train_batch(step).unwrap();
        let (next, r) = lab::train::train_step(model, &mut opt, cfg, step, &ex, &device);
        model = next;
        let r = r.unwrap();
        let f = lab::train::fast_train_step(&mut fast, &mut fopt, cfg, step, &ex).unwrap();
        let what = format!("{} step {step}", cfg.encoding.name());
        assert!(
            (f.loss - r.loss).abs() <= 1e-4 * r.loss,
            "{what}: loss {} vs {}",
            f.loss,
            r.loss
        );
        assert!(
            (f.grad_norm - r.grad_norm).abs() <= 1e-4 * r.grad_norm,
            "{what}: grad norm {} vs {}",
            f.grad_norm,
            r.grad_norm
        );
        assert_eq!(
            (f.correct, f.n_scored, f.lr),
            (r.correct, r.n_scored, r.lr),
            "{what}"
        );
    }
    let after = FastModel::from_burn(&model, &mcfg);
    close_params(
        &fast,
        &after,
        &format!("{} after {} steps", cfg.encoding.name(), cfg.steps),
    );
}

/// A run with `attention = "fast"` trains on the fast path and evaluates through burn: its
/// curves (train and held-out loss, accuracy, θ_eff) and its final weights match the same run
/// with the fused kernels (tolerances as in `ten_training_steps_match_burn`; θ_eff 1e-3 relative).
#[test]
fn a_fast_run_matches_the_fused_run() {
    let base = small_run();
    let run = |attention: &str| {
        let mut v = base.clone();
        v["attention"] = attention.into();
        let cfg = lab::config::from_flat_json(v).unwrap();
        cfg.validate().unwrap();
        let (out, model) = lab::train::train(&cfg, &Device::flex(), &mut |_| {});
        assert_eq!(out.status, lab::train::RunStatus::Done);
        (out, FastModel::from_burn(&model, &cfg.model()))
    };
    let (fused, wf) = run("fused");
    let (fast, wq) = run("fast");
    assert_eq!(fused.curves.len(), fast.curves.len());
    // The two paths sum the products in different orders: some loss differs in its last bits,
    // which shows the fast run did take the fast path.
    assert!(
        fast.curves
            .iter()
            .zip(&fused.curves)
            .any(|(a, b)| a.loss.to_bits() != b.loss.to_bits()),
        "the fast run's curves are bit-identical to the fused run's"
    );
    for (a, b) in fast.curves.iter().zip(&fused.curves) {
        assert_eq!((a.step, a.split), (b.step, b.split));
        assert!(
            (a.loss - b.loss).abs() <= 1e-4 * b.loss.max(1e-3),
            "{a:?} vs {b:?}"
        );
        assert!((a.accuracy - b.accuracy).abs() <= 1e-9, "{a:?} vs {b:?}");
        if let (Some(x), Some(y)) = (a.effective_freq, b.effective_freq) {
            assert!(
                (x - y).abs() <= 1e-3 * y,
                "θ_eff {x} vs {y} at step {}",
                a.step
            );
        }
    }
    close_params(&wq, &wf, "a fast run's final weights");
}
