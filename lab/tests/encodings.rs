//! The encodings added as one file each (`model/p_rope.rs`, `model/partial_rope.rs`) and the
//! hybrid NoPE layers: their maths pinned by hand-computed values and invariants, their probe
//! view, and their config checks.

use burn::tensor::{Device, Tensor, TensorData};
use lab::config::RunConfig;
use lab::model::p_rope::{kept_pairs, p_rope_inv_freq};
use lab::model::{
    AttentionKernel, Encoding, EncodingConfig, ModelConfig, PRopeParams, PairLayout,
    PartialRopeParams, PositionalAttention, PositionalEncoding, Rope, SpectrumMap,
};
use rand::{Rng, SeedableRng};

fn model_config(encoding: Encoding, head_dim: usize, rope_base: f64) -> ModelConfig {
    ModelConfig {
        vocab_size: 8,
        d_model: head_dim,
        n_layers: 4,
        n_heads: 1,
        d_ff: 8,
        encoding: encoding.into(),
        rope_base,
        pair_layout: PairLayout::Adjacent,
        attention: AttentionKernel::Reference,
        nope_every: 0,
        canon_len: 0,
    }
}

fn random(shape: [usize; 4], seed: u64) -> (Vec<f32>, Tensor<4>) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let v: Vec<f32> = (0..shape.iter().product())
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let t = Tensor::from_data(TensorData::new(v.clone(), shape), &Device::flex());
    (v, t)
}

fn values(t: Tensor<4>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

#[test]
fn p_rope_keeps_the_highest_fraction_of_frequencies() {
    // d = 8, base 10⁴: θ = 10⁴^(−2i/8) = 1, 0.1, 0.01, 0.001; p = 0.5 keeps the first two.
    assert_eq!(kept_pairs(8, 0.5), 2);
    let f = p_rope_inv_freq(8, 1e4, 0.5);
    assert!(
        (f[0] - 1.0).abs() < 1e-15 && (f[1] - 0.1).abs() < 1e-15,
        "{f:?}"
    );
    assert_eq!(&f[2..], &[0.0, 0.0]);
    // 0.75 of 16 pairs is 12 despite 0.75·16 rounding in binary; p = 1 is RoPE.
    assert_eq!(kept_pairs(32, 0.75), 12);
    assert_eq!(kept_pairs(32, 1.0 / 16.0), 1);
    assert_eq!(kept_pairs(32, 0.01), 0);
    assert_eq!(
        p_rope_inv_freq(32, 500.0, 1.0),
        lab::model::rope::inv_freq(32, 500.0)
    );
}

/// p-RoPE(d = 8, base 10⁴, p = ½) and partial rotary(r = 4, base 10²) rotate dims 0..4 by the
/// same θ = (1, 0.1) (adjacent pairs) and leave dims 4..8 alone, through two different code
/// paths (θ = 0 pairs vs pass-through dims): their scores agree, and the unrotated dims add a
/// position-free dot product.
#[test]
fn p_rope_and_partial_rotary_agree_where_they_coincide() {
    let device = Device::flex();
    let mut p = model_config(Encoding::PRope, 8, 1e4);
    p.encoding = EncodingConfig::PRope(PRopeParams { rope_p: 0.5 });
    let mut r = model_config(Encoding::PartialRope, 8, 100.0);
    r.encoding = EncodingConfig::PartialRope(PartialRopeParams { rotary_dim: 4 });
    let (_, q) = random([2, 1, 9, 8], 1);
    let (_, k) = random([2, 1, 9, 8], 2);
    let sp = values(PositionalAttention::new(&p, 0, &device).scores(q.clone(), k.clone()));
    let sr = values(PositionalAttention::new(&r, 0, &device).scores(q.clone(), k.clone()));
    for (a, b) in sp.iter().zip(&sr) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
    // Split by hand: RoPE(θ = 1, 0.1) on dims 0..4 plus plain q·k on dims 4..8, over √8.
    let rot = Rope::with_inv_freq(4, vec![1.0, 0.1], PairLayout::Adjacent);
    let (q4, k4) = (q.clone().narrow(3, 0, 4), k.clone().narrow(3, 0, 4));
    let rotated = rot.scores(q4, k4) * 2.0 / 8f64.sqrt(); // rescale 1/√4 → 1/√8
    let plain = q.narrow(3, 4, 4).matmul(k.narrow(3, 4, 4).swap_dims(2, 3)) / 8f64.sqrt();
    for (a, b) in sp.iter().zip(values(rotated + plain)) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

/// Partial rotary leaves dims r..d bit-identical; in the GPT-NeoX convention (rotate-half
/// within r) pair 0 is dims (0, r/2): e₀ at position t becomes (cos t, …, sin t at r/2).
#[test]
fn partial_rotary_passes_dims_through_and_pairs_within_the_rotated_part() {
    let (r, d, seq) = (6, 10, 5);
    let rope = Rope::with_inv_freq(
        d,
        lab::model::rope::inv_freq(r, 100.0),
        PairLayout::RotateHalf,
    );
    assert_eq!(rope.pair_dims(), vec![(0, 3), (1, 4), (2, 5)]);
    let (x, xt) = random([1, 2, seq, d], 3);
    let y = values(rope.rotate(xt));
    for (i, (a, b)) in x.iter().zip(&y).enumerate() {
        if i % d >= r {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "pass-through dim {} changed",
                i % d
            );
        }
    }
    let mut e0 = vec![0.0f32; seq * d];
    for t in 0..seq {
        e0[t * d] = 1.0;
    }
    let e0 = Tensor::<4>::from_data(TensorData::new(e0, [1, 1, seq, d]), &Device::flex());
    let y = values(rope.rotate(e0));
    for t in 0..seq {
        let row = &y[t * d..(t + 1) * d];
        assert!((row[0] - (t as f32).cos()).abs() < 1e-6, "t={t}: {row:?}");
        assert!((row[3] - (t as f32).sin()).abs() < 1e-6, "t={t}: {row:?}");
        assert!(
            row.iter()
                .enumerate()
                .all(|(c, v)| c == 0 || c == 3 || *v == 0.0)
        );
    }
    // GPT-J convention: adjacent pairs within r.
    let gptj = Rope::with_inv_freq(d, vec![1.0, 0.5, 0.25], PairLayout::Adjacent);
    assert_eq!(gptj.pair_dims(), vec![(0, 1), (2, 3), (4, 5)]);
}

/// The probe reads only the rotated pairs: p-RoPE's m pairs with their θ, partial rotary's
/// r/2 pairs with θ over r.
#[test]
fn the_probe_ignores_unrotated_dims() {
    let mut p = model_config(Encoding::PRope, 8, 1e4);
    p.encoding = EncodingConfig::PRope(PRopeParams { rope_p: 0.5 });
    let s = Encoding::PRope.spectrum(&p);
    assert_eq!(
        s.map,
        SpectrumMap::Pairs {
            dims: vec![(0, 1), (2, 3)]
        }
    );
    assert_eq!(s.freqs.len(), 2);
    let mut r = model_config(Encoding::PartialRope, 8, 100.0);
    r.encoding = EncodingConfig::PartialRope(PartialRopeParams { rotary_dim: 4 });
    r.pair_layout = PairLayout::RotateHalf;
    let s = Encoding::PartialRope.spectrum(&r);
    assert_eq!(
        s.map,
        SpectrumMap::Pairs {
            dims: vec![(0, 2), (1, 3)]
        }
    );
    assert!((s.freqs[1] - 0.1).abs() < 1e-15, "{:?}", s.freqs);
    // The energy of one head: q = k = e₆ (a pass-through dim) carries no channel energy.
    let mut x = vec![0.0f32; 3 * 8];
    for t in 0..3 {
        x[t * 8 + 6] = 1.0;
    }
    assert_eq!(
        lab::probe::head_energy_sums(&s.map, &x, &x, 3, 8),
        vec![0.0, 0.0]
    );
}

#[test]
fn hybrid_layers_put_nope_on_every_kth_layer() {
    let mut c = model_config(Encoding::Rope, 8, 1e4);
    c.nope_every = 2;
    let layers: Vec<Encoding> = (0..4).map(|l| c.layer_encoding(l)).collect();
    assert_eq!(
        layers,
        [
            Encoding::Rope,
            Encoding::Nope,
            Encoding::Rope,
            Encoding::Nope
        ]
    );
    let model = c.init(0, &Device::flex());
    let built: Vec<Encoding> = model
        .blocks
        .iter()
        .map(|b| b.positional.encoding())
        .collect();
    assert_eq!(built, layers);
    c.nope_every = 0;
    assert!((0..4).all(|l| c.layer_encoding(l) == Encoding::Rope));
}

#[test]
fn names_round_trip_and_unknown_names_list_the_registry() {
    for &e in Encoding::ALL {
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(json, format!("\"{}\"", e.name()));
        assert_eq!(serde_json::from_str::<Encoding>(&json).unwrap(), e);
    }
    // The registry's names are the types' NAME.
    assert_eq!(<lab::model::PRope as PositionalEncoding>::NAME, "p-rope");
    let names: Vec<&str> = Encoding::ALL
        .iter()
        .map(|e| {
            EncodingConfig::from(*e).flat()["encoding"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .map(|n| Encoding::from_name(&n).unwrap().name())
        .collect();
    assert_eq!(names, Encoding::NAMES);
    assert_eq!(
        [
            <lab::model::Nope as PositionalEncoding>::NAME,
            <lab::model::Rope as PositionalEncoding>::NAME,
            <lab::model::Pope as PositionalEncoding>::NAME,
            <lab::model::Tapa as PositionalEncoding>::NAME,
            <lab::model::PRope as PositionalEncoding>::NAME,
            <lab::model::PartialRope as PositionalEncoding>::NAME,
        ],
        Encoding::NAMES
    );
    let err = serde_json::from_str::<Encoding>("\"prope\"")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("expected one of") && err.contains("`p-rope`"),
        "{err}"
    );
}

fn run_config(extra: serde_json::Value) -> RunConfig {
    try_run_config(extra).unwrap()
}

fn try_run_config(extra: serde_json::Value) -> Result<RunConfig, String> {
    let mut v = serde_json::json!({
        "task": "block", "variant": "copy", "vocab_size": 16, "seq_len": 32, "block_len": 4,
        "noise": 0.0, "encoding": "rope", "rope_base": 100.0, "pair_layout": "adjacent",
        "d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32, "steps": 6, "batch_size": 4,
        "lr": 0.01, "warmup_steps": 1, "min_lr_ratio": 0.1, "weight_decay": 0.1, "beta1": 0.9,
        "beta2": 0.95, "adam_eps": 1e-8, "grad_clip": 1.0, "eval_every": 3, "eval_batches": 1,
        "seed": 0
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    lab::config::from_flat_json(v)
}

#[test]
fn bad_encoding_options_name_the_field_and_range() {
    let err = |extra| match try_run_config(extra) {
        Ok(c) => c.validate().unwrap_err().to_string(),
        Err(e) => e,
    };
    // head_dim 8: 4 pairs.
    assert_eq!(
        err(serde_json::json!({"encoding": "p-rope", "rope_p": 0.2})),
        "rope_p = 0.2 is out of range: must be in [1/4, 1] (keep at least one of the 4 rotary pairs)"
    );
    assert_eq!(
        err(serde_json::json!({"encoding": "p-rope", "rope_p": 1.5})),
        "rope_p = 1.5 is out of range: must be in [1/4, 1] (keep at least one of the 4 rotary pairs)"
    );
    // An option of another encoding would be silently ignored: refused by name.
    assert_eq!(
        err(serde_json::json!({"rope_p": 0.5})),
        "rope_p: a parameter of encoding p-rope, not of this run's encoding rope; remove it, or set it only for runs with encoding = \"p-rope\" (in their [[arms]])"
    );
    assert_eq!(
        err(serde_json::json!({"encoding": "pope", "rotary_dim": 4})),
        "rotary_dim: a parameter of encoding partial-rope, not of this run's encoding pope; remove it, or set it only for runs with encoding = \"partial-rope\" (in their [[arms]])"
    );
    assert_eq!(
        err(serde_json::json!({"encoding": "partial-rope", "rotary_dim": 5})),
        "rotary_dim = 5 is out of range: must be 0 (all of head_dim) or an even number in 2..=8"
    );
    assert_eq!(
        err(serde_json::json!({"nope_every": 3})),
        "nope_every = 3 is out of range: must be in 0..=2"
    );
    // A run's config holds only its own encoding's parameters; nope_every is serialised only
    // when set.
    let plain = run_config(serde_json::json!({}));
    assert!(!plain.canonical_json().contains("rope_p"));
    assert!(
        plain
            .canonical_json()
            .contains(r#""encoding":{"kind":"rope"}"#)
    );
    let p = run_config(serde_json::json!({"encoding": "p-rope", "rope_p": 0.5}));
    assert!(
        p.canonical_json()
            .contains(r#""encoding":{"kind":"p-rope","rope_p":0.5}"#)
    );
    assert!(!plain.canonical_json().contains("nope_every"));
    let hybrid = run_config(serde_json::json!({"nope_every": 2}));
    hybrid.validate().unwrap();
    assert_ne!(plain.run_id(), hybrid.run_id());
}
