//! Reference attention for every encoding: finite-difference gradient checks of q, k, v (and
//! PoPE's δ), the causal mask, and PoPE's δ range under training.
//!
//! Gradients come from burn's autodiff on the flex backend (f32). Finite differences are central,
//! `(L(x+h) − L(x−h)) / 2h` with `h = 1e-2` on inputs of order 1, for the scalar loss
//! `L = Σ out ⊙ R` with a fixed random `R`: truncation error O(h²) ≈ 1e-4 relative, f32 rounding
//! ≈ 1e-7·|L|/h ≈ 1e-5·|L|. Tolerance: |autodiff − fd| ≤ 2e-3 + 2e-2·|fd|.

use burn::module::{Module, Param};
use burn::tensor::{Device, Int, Tensor, TensorData};
use lab::config::RunConfig;
use lab::model::{
    Encoding, EncodingConfig, ModelConfig, PairLayout, PositionalAttention, TapaPhase,
    causal_attention, causal_mask,
};
use rand::{Rng, SeedableRng};

const B: usize = 1;
const H: usize = 2;
const L: usize = 5;
const D: usize = 8;

fn model_config(encoding: Encoding, phase: TapaPhase) -> ModelConfig {
    ModelConfig {
        nope_every: 0,
        canon_len: 0,
        vocab_size: 12,
        d_model: H * D,
        n_layers: 1,
        n_heads: H,
        d_ff: 16,
        encoding: EncodingConfig::for_kernel_checks(encoding, phase),
        rope_base: 100.0,
        pair_layout: PairLayout::RotateHalf,
        attention: lab::model::AttentionKernel::Reference,
    }
}

fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

fn loss(
    pos: &PositionalAttention,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    r: &[f32],
    device: &Device,
) -> f64 {
    let t = |x: &[f32]| Tensor::<4>::from_data(TensorData::new(x.to_vec(), [B, H, L, D]), device);
    let out = causal_attention(pos, t(q), t(k), t(v), &causal_mask(L, device));
    (out * t(r)).sum().into_scalar::<f32>() as f64
}

fn check(encoding: Encoding, phase: TapaPhase) {
    let device = Device::flex().autodiff();
    let cfg = model_config(encoding, phase);
    let pos = PositionalAttention::new(&cfg, 4, &device);
    let n = B * H * L * D;
    // TAPA's phase is 2π·|m−n|^α·q_P·k_P/√(d_P): keep it of order 1 so h = 1e-2 resolves the cosine.
    let scale = if encoding == Encoding::Tapa { 0.5 } else { 1.0 };
    let (q, k, v, r) = (
        random(n, 1, scale),
        random(n, 2, scale),
        random(n, 3, 1.0),
        random(n, 4, 1.0),
    );
    let leaf = |x: &[f32]| {
        Tensor::<4>::from_data(TensorData::new(x.to_vec(), [B, H, L, D]), &device).require_grad()
    };
    let (tq, tk, tv) = (leaf(&q), leaf(&k), leaf(&v));
    let rr = Tensor::<4>::from_data(TensorData::new(r.clone(), [B, H, L, D]), &device);
    let out = causal_attention(
        &pos,
        tq.clone(),
        tk.clone(),
        tv.clone(),
        &causal_mask(L, &device),
    );
    let grads = (out * rr).sum().backward();
    let plain = device.clone().inner();
    let pos_plain = pos.valid();
    let h = 1e-2f32;
    for (name, tensor, which) in [("q", &tq, 0), ("k", &tk, 1), ("v", &tv, 2)] {
        let g = tensor
            .grad(&grads)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for idx in [0, 7, 13, 22, 31, 40, 55, 63, 79] {
            let mut plus = [q.clone(), k.clone(), v.clone()];
            let mut minus = [q.clone(), k.clone(), v.clone()];
            plus[which][idx] += h;
            minus[which][idx] -= h;
            let fd = (loss(&pos_plain, &plus[0], &plus[1], &plus[2], &r, &plain)
                - loss(&pos_plain, &minus[0], &minus[1], &minus[2], &r, &plain))
                / (2.0 * h as f64);
            let ad = g[idx] as f64;
            assert!(
                (ad - fd).abs() <= 2e-3 + 2e-2 * fd.abs(),
                "{encoding:?}/{phase:?} d/d{name}[{idx}]: autodiff {ad}, finite difference {fd}"
            );
        }
    }
    if let PositionalAttention::Pope(p) = &pos {
        let g = p
            .delta
            .val()
            .grad(&grads)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let delta = p.delta.val().into_data().try_to_vec::<f32>().unwrap();
        for idx in 0..H * D {
            let shifted = |sign: f32| {
                let mut dl = delta.clone();
                dl[idx] += sign * h;
                let mut pp = match pos_plain.clone() {
                    PositionalAttention::Pope(pp) => pp,
                    _ => unreachable!(),
                };
                pp.delta = Param::from_data(TensorData::new(dl, [H * D]), &plain);
                loss(&PositionalAttention::Pope(pp), &q, &k, &v, &r, &plain)
            };
            let fd = (shifted(1.0) - shifted(-1.0)) / (2.0 * h as f64);
            let ad = g[idx] as f64;
            assert!(
                (ad - fd).abs() <= 2e-3 + 2e-2 * fd.abs(),
                "PoPE d/dδ[{idx}]: autodiff {ad}, finite difference {fd}"
            );
        }
    }
}

#[test]
fn gradients_nope() {
    check(Encoding::Nope, TapaPhase::Quadratic);
}

#[test]
fn gradients_rope() {
    check(Encoding::Rope, TapaPhase::Quadratic);
}

#[test]
fn gradients_pope_including_delta() {
    check(Encoding::Pope, TapaPhase::Quadratic);
}

#[test]
fn gradients_tapa_quadratic_and_linear() {
    check(Encoding::Tapa, TapaPhase::Quadratic);
    check(Encoding::Tapa, TapaPhase::Linear);
}

/// The mask hides exactly the keys after the query.
#[test]
fn causal_mask_is_strictly_upper() {
    let m = causal_mask(3, &Device::flex())
        .into_data()
        .try_to_vec::<bool>()
        .unwrap();
    assert_eq!(
        m,
        vec![false, true, true, false, false, true, false, false, false]
    );
}

/// Changing tokens after position t never changes the logits at positions ≤ t.
#[test]
fn causal_mask_holds_for_every_encoding() {
    let device = Device::flex();
    for encoding in [
        Encoding::Nope,
        Encoding::Rope,
        Encoding::Pope,
        Encoding::Tapa,
    ] {
        let mut cfg = model_config(encoding, TapaPhase::Quadratic);
        cfg.n_layers = 2;
        let model = cfg.init(3, &device);
        let a: Vec<i64> = vec![1, 5, 2, 7, 3, 9, 4, 0];
        let mut b = a.clone();
        b[5] = 11;
        b[7] = 6;
        let run = |toks: &Vec<i64>| {
            let t = Tensor::<2, Int>::from_data(TensorData::new(toks.clone(), [1, 8]), &device);
            model.forward(t).into_data().try_to_vec::<f32>().unwrap()
        };
        let (la, lb) = (run(&a), run(&b));
        let v = cfg.vocab_size;
        assert_eq!(
            la[..5 * v],
            lb[..5 * v],
            "{encoding:?}: positions 0..5 changed"
        );
        assert_ne!(
            la[5 * v..],
            lb[5 * v..],
            "{encoding:?}: later positions should change"
        );
    }
}

/// PoPE's δ stays in [−2π, 0] after optimiser steps with a large learning rate.
#[test]
fn pope_delta_stays_in_range_after_training() {
    let cfg: RunConfig = lab::config::from_flat_json(serde_json::json!({
        "task": "block", "variant": "copy", "vocab_size": 16, "seq_len": 16, "block_len": 4,
        "noise": 0.0, "encoding": "pope", "rope_base": 100.0, "pair_layout": "adjacent",
        "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "steps": 8, "batch_size": 4,
        "lr": 0.5, "warmup_steps": 0, "min_lr_ratio": 1.0, "weight_decay": 0.0, "beta1": 0.9,
        "beta2": 0.95, "adam_eps": 1e-8, "grad_clip": 0.0, "eval_every": 8, "eval_batches": 1,
        "seed": 0, "pope_delta_init": "uniform"
    }))
    .unwrap();
    cfg.validate().unwrap();
    let (out, model) = lab::train::train(&cfg, &Device::flex(), &mut |_| {});
    assert_eq!(out.status, lab::train::RunStatus::Done);
    let mut moved = false;
    for block in &model.blocks {
        let PositionalAttention::Pope(p) = &block.positional else {
            panic!("PoPE expected")
        };
        let d = p.delta.val().into_data().try_to_vec::<f32>().unwrap();
        for &x in &d {
            assert!(
                (-2.0 * std::f32::consts::PI..=0.0).contains(&x),
                "δ = {x} out of range"
            );
            moved |= x == 0.0 || x == -2.0 * std::f32::consts::PI;
        }
    }
    // With lr 0.5 some δ hit a bound: the projection was exercised.
    assert!(
        moved,
        "no δ reached a bound; the test does not exercise the clamp"
    );
}

/// The canon layer (`canon_len`): a causal depthwise convolution with its residual, by hand.
/// `h` = [[1, 2], [3, 4], [5, 6]] (one sequence, 3 positions, 2 channels), `w` = [[0.5, −1],
/// [2, 0.25]]: `out_t = h_t + w_0 ⊙ h_t + w_1 ⊙ h_{t−1}` → [[1.5, 0], [6.5, 0.5], [13.5, 1]].
/// Its gradient against the weights is `∂/∂w_j Σ out ⊙ R = Σ_t R_t ⊙ h_{t−j}`.
#[test]
fn canon_conv_is_causal_and_depthwise() {
    let device = Device::flex().autodiff();
    let h = Tensor::<3>::from_data(
        TensorData::new(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [1, 3, 2]),
        &device,
    );
    let w = Tensor::<2>::from_data(
        TensorData::new(vec![0.5f32, -1.0, 2.0, 0.25], [2, 2]),
        &device,
    )
    .require_grad();
    let out = lab::model::canon_conv(h, w.clone());
    let got = out.clone().into_data().try_to_vec::<f32>().unwrap();
    assert_eq!(got, vec![1.5, 0.0, 6.5, 0.5, 13.5, 1.0]);
    // R = [[1, 0], [0, 1], [1, 1]]: ∂/∂w_0 = Σ_t R_t ⊙ h_t = [1 + 5, 4 + 6] = [6, 10];
    // ∂/∂w_1 = Σ_t R_t ⊙ h_{t−1} = [0·1 + 1·3, 1·2 + 1·4] = [3, 6].
    let r = Tensor::<3>::from_data(
        TensorData::new(vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], [1, 3, 2]),
        &device,
    );
    let grads = (out * r).sum().backward();
    let g = w
        .grad(&grads)
        .unwrap()
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    assert_eq!(g, vec![6.0, 10.0, 3.0, 6.0]);
}

/// A model with canon layers starts as the same model without them (zero weights, the other
/// weights from the same seed's stream), and a run with them trains: the loss falls and the
/// canon weights move.
#[test]
fn canon_layers_start_at_zero_and_learn() {
    let device = Device::flex();
    let mut cfg: RunConfig = lab::config::from_flat_json(serde_json::json!({
        "task": "block", "variant": "copy", "vocab_size": 16, "seq_len": 32, "block_len": 4,
        "noise": 0.0, "encoding": "rope", "rope_base": 100.0, "pair_layout": "adjacent",
        "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "steps": 30, "batch_size": 8,
        "lr": 0.01, "warmup_steps": 0, "min_lr_ratio": 1.0, "weight_decay": 0.0, "beta1": 0.9,
        "beta2": 0.95, "adam_eps": 1e-8, "grad_clip": 1.0, "eval_every": 30, "eval_batches": 1,
        "seed": 3, "attention": "fused"
    }))
    .unwrap();
    let plain = cfg.model().init(3, &device);
    cfg.canon_len = 3;
    cfg.validate().unwrap();
    let canon = cfg.model().init(3, &device);
    let tokens = Tensor::<2, Int>::from_data(
        TensorData::new(
            (0..32).map(|i| (i * 5 % 16) as i64).collect::<Vec<_>>(),
            [1, 32],
        ),
        &device,
    );
    let a = plain
        .forward(tokens.clone())
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    let b = canon
        .forward(tokens)
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    assert_eq!(a, b);
    let (out, model) = lab::train::train(&cfg, &device, &mut |_| {});
    assert_eq!(out.status, lab::train::RunStatus::Done);
    let evals: Vec<_> = out.curves.iter().filter(|c| c.split == "eval").collect();
    let (first, last) = (evals[0], evals[evals.len() - 1]);
    assert!(
        last.loss < first.loss,
        "loss {} → {}",
        first.loss,
        last.loss
    );
    let w = model.blocks[0].canon.as_ref().expect("canon weights").val();
    assert_eq!(w.dims(), [3, 16]);
    let moved: f32 = w.abs().max().into_scalar();
    assert!(moved > 1e-3, "canon weights still at zero ({moved})");
    // The fast path has them too (tests/fast_path.rs checks its gradients).
    cfg.attention = lab::model::AttentionKernel::Fast;
    cfg.validate().unwrap();
}
