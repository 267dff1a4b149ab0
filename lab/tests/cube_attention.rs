//! CubeCL flash attention (`lab::kernels::cube`) against the reference attention.
//!
//! Run with `make test-wgpu` (`cargo test --release -p lab --features wgpu --test cube_attention`;
//! add `--features wgpu,fusion` for burn's fused CubeCL backend, the configuration `cuda` uses).
//! On a machine without a GPU, wgpu runs the kernels on Mesa's lavapipe (Vulkan on the CPU).
//!
//! Each case builds random `q`, `k`, `v` (uniform in ±1, TAPA's q/k in ±0.5 so its phase stays of
//! order one), runs the reference [`causal_attention`] with [`PositionalAttention::new`] on
//! `Device::flex().autodiff()` for the output and, through autodiff of `L = Σ out ⊙ G` with a fixed
//! random `G`, for `dq`, `dk`, `dv` (and PoPE's `dδ`); then the cube kernels on the wgpu device
//! with the same inputs and `dout = G`.
//!
//! Tolerance: `|cube − reference| ≤ 1e-4 + 1e-3·|reference|` for out, dq, dk, dv, and
//! `≤ 1e-3 + 1e-3·|reference|` for PoPE's `dδ`. Both sides are f32; they differ in summation
//! order (online softmax over ≤ 70 keys vs a materialised softmax and matmuls), in where the
//! angles are rounded (the reference builds cos/sin tables in f64 and rounds them, the kernels
//! compute `pos·θ` and its cos/sin in f32: at positions < 70 that is ≲ 1e-5 rad), and in the
//! transcendental functions (lavapipe's exp/cos/sin are accurate to a few ulp). Each term is
//! ≲ 1e-6 relative on values of order one; summed over ≤ 70 keys and 16 dims, errors stay well
//! below 1e-4 absolute. `dδ` sums `batch · seq` ≤ 140 per-position terms of order one, hence the
//! looser absolute part.

#![cfg(feature = "wgpu")]

use burn::backend::Cube;
use burn::tensor::{Device, DeviceKind, Tensor, TensorData};
use burn_cubecl::tensor::CubeTensor;
use lab::kernels::cube::{self, CubeAttentionParams, CubeEncoding, CubePrimitives, CubeStrategy};
use lab::model::{
    AttentionKernel, Encoding, EncodingConfig, ModelConfig, PRope, PRopeParams, PairLayout,
    PartialRope, PartialRopeParams, PositionalAttention, TapaParams, TapaPhase, causal_attention,
    causal_mask,
};
use rand::{Rng, SeedableRng};

/// Shapes `(batch, heads, seq, head_dim)`: seq not a multiple of any tile, head_dim 8 and 16.
const SHAPES: [(usize, usize, usize, usize); 3] = [(2, 2, 5, 8), (2, 2, 33, 16), (2, 2, 70, 8)];

/// Every kernel layout: one unit per row; tiled with the automatic tile (64 rows here, so seq 70
/// spans a full and a partial block); tiled with 16-row tiles (several full tiles, a partial one,
/// and blocks whose rows all lie past the diagonal tile).
const STRATEGIES: [CubeStrategy; 3] = [
    CubeStrategy::Rows,
    CubeStrategy::Tiled { tile: None },
    CubeStrategy::Tiled { tile: Some(16) },
];

fn wgpu() -> Device {
    Device::wgpu(DeviceKind::DefaultDevice)
}

fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

fn config(encoding: Encoding, heads: usize, d: usize) -> ModelConfig {
    ModelConfig {
        nope_every: 0,
        vocab_size: 8,
        d_model: heads * d,
        n_layers: 1,
        n_heads: heads,
        d_ff: 8,
        encoding: EncodingConfig::for_kernel_checks(encoding, TapaPhase::Quadratic),
        rope_base: 10000.0,
        pair_layout: PairLayout::Adjacent,
        attention: AttentionKernel::Reference,
    }
}

/// Host values → a device tensor of the kernels (through burn's `Cube` backend, fused or not).
fn to_cube<const N: usize>(v: &[f32], shape: [usize; N], device: &Device) -> CubeTensor {
    <Cube as CubePrimitives>::to_cube(
        Tensor::<N>::from_data(TensorData::new(v.to_vec(), shape), device)
            .try_into_primitive::<Cube>()
            .expect("a wgpu tensor is a Cube primitive"),
    )
}

fn from_cube(t: CubeTensor) -> Vec<f32> {
    let n = burn::backend::TensorMetadata::shape(&t).num_dims();
    let t = <Cube as CubePrimitives>::from_cube(t);
    let data = match n {
        1 => Tensor::<1>::from_primitive::<Cube>(t).try_into_data(),
        3 => Tensor::<3>::from_primitive::<Cube>(t).try_into_data(),
        4 => Tensor::<4>::from_primitive::<Cube>(t).try_into_data(),
        other => panic!("unexpected rank {other}"),
    };
    data.expect("kernel launch or read failed")
        .try_to_vec::<f32>()
        .unwrap()
}

fn grad_vec(t: &Tensor<4>, grads: &burn::tensor::Gradients) -> Vec<f32> {
    t.grad(grads)
        .expect("gradient")
        .try_into_data()
        .unwrap()
        .try_to_vec::<f32>()
        .unwrap()
}

fn assert_close(got: &[f32], want: &[f32], abs: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0.0f32);
    for (i, (x, y)) in got.iter().zip(want).enumerate() {
        assert!(x.is_finite(), "{what}[{i}] = {x} is not finite");
        let err = (x - y).abs();
        assert!(
            err <= abs + 1e-3 * y.abs(),
            "{what}[{i}]: cube {x}, reference {y} (|diff| {err})"
        );
        if err > worst.1 {
            worst = (i, err);
        }
    }
    eprintln!("{what}: max |diff| {:.2e} at {}", worst.1, worst.0);
}

/// Encoding variant under test, with the knobs the default config does not reach.
#[derive(Clone, Copy, Debug)]
enum Case {
    Nope,
    /// RoPE with this layout; `yarn` rescales half the frequencies and sets attention_factor 1.2.
    Rope {
        layout: PairLayout,
        yarn: bool,
    },
    Pope,
    Tapa {
        phase: TapaPhase,
        alpha: f64,
    },
    /// Partial rotary on the first `head_dim / 2` dims, this layout within them (dims past
    /// them pass through the kernel unchanged).
    Partial {
        layout: PairLayout,
    },
    /// p-RoPE keeping half of RoPE's frequencies (the other pairs at θ = 0).
    PRope,
}

fn check(case: Case) {
    let ref_device = Device::flex().autodiff();
    let dev = wgpu();
    for &(b, h, l, d) in &SHAPES {
        let encoding = match case {
            Case::Nope => Encoding::Nope,
            Case::Rope { .. } => Encoding::Rope,
            Case::Pope => Encoding::Pope,
            Case::Tapa { .. } => Encoding::Tapa,
            Case::Partial { .. } => Encoding::PartialRope,
            Case::PRope => Encoding::PRope,
        };
        let mut cfg = config(encoding, h, d);
        if let Case::Rope { layout, .. } | Case::Partial { layout } = case {
            cfg.pair_layout = layout;
        }
        cfg.encoding = match case {
            Case::Partial { .. } => {
                EncodingConfig::PartialRope(PartialRopeParams { rotary_dim: d / 2 })
            }
            Case::PRope => EncodingConfig::PRope(PRopeParams { rope_p: 0.5 }),
            Case::Tapa { phase, alpha } => EncodingConfig::Tapa(TapaParams {
                tapa_phase: phase,
                tapa_alpha: alpha,
                ..TapaParams::default()
            }),
            _ => cfg.encoding,
        };
        let mut pos = PositionalAttention::new(&cfg, 7, &ref_device);
        if let (Case::Rope { yarn: true, .. }, PositionalAttention::Rope(r)) = (case, &mut pos) {
            // A YaRN-like scaling: low frequencies interpolated by 4, the rest kept, factor 1.2.
            let half = r.inv_freq.len();
            for (i, f) in r.inv_freq.iter_mut().enumerate() {
                if i >= half / 2 {
                    *f /= 4.0;
                }
            }
            r.attention_factor = 1.2;
        }
        let n = b * h * l * d;
        let qk_scale = if matches!(case, Case::Tapa { .. }) {
            0.5
        } else {
            1.0
        };
        let (q, k, v, g) = (
            random(n, 11, qk_scale),
            random(n, 12, qk_scale),
            random(n, 13, 1.0),
            random(n, 14, 1.0),
        );
        let shape = [b, h, l, d];
        let leaf = |x: &[f32]| {
            Tensor::<4>::from_data(TensorData::new(x.to_vec(), shape), &ref_device).require_grad()
        };
        let (tq, tk, tv) = (leaf(&q), leaf(&k), leaf(&v));
        let tg = Tensor::<4>::from_data(TensorData::new(g.clone(), shape), &ref_device);
        let reference = causal_attention(
            &pos,
            tq.clone(),
            tk.clone(),
            tv.clone(),
            &causal_mask(l, &ref_device),
        );
        let ref_out = reference
            .clone()
            .try_into_data()
            .unwrap()
            .try_to_vec::<f32>()
            .unwrap();
        let grads = (reference * tg).sum().backward();

        let enc = match (&pos, case) {
            (PositionalAttention::Nope(_), _) => CubeEncoding::Nope,
            (PositionalAttention::Rope(r), _) => CubeEncoding::Rope {
                inv_freq: r.inv_freq.clone(),
                layout: r.layout,
                attention_factor: r.attention_factor,
            },
            (PositionalAttention::Pope(p), _) => {
                let delta = p
                    .delta
                    .val()
                    .try_into_data()
                    .unwrap()
                    .try_to_vec::<f32>()
                    .unwrap();
                CubeEncoding::Pope {
                    theta: p.theta.clone(),
                    delta: to_cube(&delta, [h * d], &dev),
                }
            }
            (PositionalAttention::Tapa(t), _) => CubeEncoding::Tapa {
                amp_dim: t.amp_dim,
                alpha: t.alpha,
                phase: t.phase,
            },
            (PositionalAttention::PartialRope(PartialRope { rope: r }), _)
            | (PositionalAttention::PRope(PRope { rope: r, .. }), _) => CubeEncoding::Rope {
                inv_freq: r.inv_freq.clone(),
                layout: r.layout,
                attention_factor: r.attention_factor,
            },
        };
        for strategy in STRATEGIES {
            let params = CubeAttentionParams {
                encoding: enc.clone(),
                strategy,
            };
            let what = format!("{case:?} {strategy:?} {shape:?}");
            let (cq, ck, cv) = (
                to_cube(&q, shape, &dev),
                to_cube(&k, shape, &dev),
                to_cube(&v, shape, &dev),
            );
            let (out, lse) = cube::forward(cq.clone(), ck.clone(), cv.clone(), &params);
            assert_close(
                &from_cube(out.clone()),
                &ref_out,
                1e-4,
                &format!("{what} out"),
            );
            let grads_cube =
                cube::backward(cq, ck, cv, out, lse, to_cube(&g, shape, &dev), &params);
            for (name, got, leaf) in [
                ("dq", grads_cube.dq, &tq),
                ("dk", grads_cube.dk, &tk),
                ("dv", grads_cube.dv, &tv),
            ] {
                assert_close(
                    &from_cube(got),
                    &grad_vec(leaf, &grads),
                    1e-4,
                    &format!("{what} {name}"),
                );
            }
            match (&pos, grads_cube.ddelta) {
                (PositionalAttention::Pope(p), Some(dd)) => {
                    let want = p
                        .delta
                        .val()
                        .grad(&grads)
                        .expect("δ gradient")
                        .try_into_data()
                        .unwrap()
                        .try_to_vec::<f32>()
                        .unwrap();
                    assert_close(&from_cube(dd), &want, 1e-3, &format!("{what} dδ"));
                }
                (PositionalAttention::Pope(_), None) => panic!("PoPE must return dδ"),
                (_, Some(_)) => panic!("only PoPE returns dδ"),
                _ => {}
            }
        }
    }
}

#[test]
fn cube_nope_matches_reference() {
    check(Case::Nope);
}

#[test]
fn cube_rope_adjacent_matches_reference() {
    check(Case::Rope {
        layout: PairLayout::Adjacent,
        yarn: false,
    });
}

#[test]
fn cube_rope_rotate_half_matches_reference() {
    check(Case::Rope {
        layout: PairLayout::RotateHalf,
        yarn: false,
    });
}

#[test]
fn cube_rope_yarn_factor_both_layouts() {
    check(Case::Rope {
        layout: PairLayout::Adjacent,
        yarn: true,
    });
    check(Case::Rope {
        layout: PairLayout::RotateHalf,
        yarn: true,
    });
}

#[test]
fn cube_partial_rotary_and_p_rope_match_reference() {
    check(Case::Partial {
        layout: PairLayout::RotateHalf,
    });
    check(Case::Partial {
        layout: PairLayout::Adjacent,
    });
    check(Case::PRope);
}

#[test]
fn cube_pope_uniform_delta_matches_reference() {
    check(Case::Pope);
}

#[test]
fn cube_tapa_quadratic_matches_reference() {
    check(Case::Tapa {
        phase: TapaPhase::Quadratic,
        alpha: 0.1,
    });
}

#[test]
fn cube_tapa_linear_matches_reference() {
    check(Case::Tapa {
        phase: TapaPhase::Linear,
        alpha: 0.1,
    });
}

/// A larger distance exponent makes the phase vary faster with |i−j|.
#[test]
fn cube_tapa_quadratic_alpha_half() {
    check(Case::Tapa {
        phase: TapaPhase::Quadratic,
        alpha: 0.5,
    });
}

/// Hand-computed case: one query over two equal keys gives `lse = s + ln 2` and the mean of the
/// two values; row 0 sees only key 0.
#[test]
fn cube_hand_computed_lse() {
    let dev = wgpu();
    let params = CubeAttentionParams::new(CubeEncoding::Nope);
    let shape = [1, 1, 2, 1];
    let (out, lse) = cube::forward(
        to_cube(&[0.0, 1.0], shape, &dev),
        to_cube(&[3.0, 3.0], shape, &dev),
        to_cube(&[2.0, 4.0], shape, &dev),
        &params,
    );
    let (out, lse) = (from_cube(out), from_cube(lse));
    assert!((lse[0] - 0.0).abs() < 1e-6, "lse[0] = {}", lse[0]);
    assert!(
        (lse[1] - (3.0 + 2f32.ln())).abs() < 1e-5,
        "lse[1] = {}",
        lse[1]
    );
    assert!((out[0] - 2.0).abs() < 1e-6);
    assert!((out[1] - 3.0).abs() < 1e-5);
}

/// The backend extension (`lab::kernels::positional_attention`) on a wgpu autodiff device runs the
/// cube kernels with their registered backward: output and gradients of q, k, v (and PoPE's δ)
/// equal the reference's. Same tolerances as above.
#[test]
fn cube_backend_extension_matches_reference() {
    let ref_device = Device::flex().autodiff();
    let dev = wgpu().autodiff();
    let (b, h, l, d) = (2, 2, 33, 8);
    let shape = [b, h, l, d];
    let n = b * h * l * d;
    for (encoding, phase) in [
        (Encoding::Nope, TapaPhase::Quadratic),
        (Encoding::Rope, TapaPhase::Quadratic),
        (Encoding::Pope, TapaPhase::Quadratic),
        (Encoding::Tapa, TapaPhase::Quadratic),
        (Encoding::Tapa, TapaPhase::Linear),
    ] {
        let mut cfg = config(encoding, h, d);
        cfg.pair_layout = PairLayout::RotateHalf;
        cfg.encoding = EncodingConfig::for_kernel_checks(encoding, phase);
        let pos = PositionalAttention::new(&cfg, 3, &ref_device);
        let scale = if encoding == Encoding::Tapa { 0.5 } else { 1.0 };
        let (q, k, v, g) = (
            random(n, 21, scale),
            random(n, 22, scale),
            random(n, 23, 1.0),
            random(n, 24, 1.0),
        );
        // Reference on flex.
        let leaf = |x: &[f32], device: &Device| {
            Tensor::<4>::from_data(TensorData::new(x.to_vec(), shape), device).require_grad()
        };
        let (rq, rk, rv) = (
            leaf(&q, &ref_device),
            leaf(&k, &ref_device),
            leaf(&v, &ref_device),
        );
        let reference = causal_attention(
            &pos,
            rq.clone(),
            rk.clone(),
            rv.clone(),
            &causal_mask(l, &ref_device),
        );
        let ref_out = reference.clone().into_data().try_to_vec::<f32>().unwrap();
        let rg = Tensor::<4>::from_data(TensorData::new(g.clone(), shape), &ref_device);
        let ref_grads = (reference * rg).sum().backward();
        // The extension on wgpu autodiff.
        let (encoding_k, delta) = pos.kernel_encoding();
        let delta_leaf = delta.map(|t| {
            let values = t.into_data().try_to_vec::<f32>().unwrap();
            Tensor::<1>::from_data(TensorData::new(values, [h * d]), &dev).require_grad()
        });
        let (cq, ck, cv) = (leaf(&q, &dev), leaf(&k, &dev), leaf(&v, &dev));
        let out = lab::kernels::positional_attention(
            cq.clone(),
            ck.clone(),
            cv.clone(),
            delta_leaf.clone(),
            encoding_k,
        );
        let what = format!("extension {encoding:?}/{phase:?}");
        let got = out
            .clone()
            .try_into_data()
            .expect("kernel launch or read failed")
            .try_to_vec::<f32>()
            .unwrap();
        assert_close(&got, &ref_out, 1e-4, &format!("{what} out"));
        let cg = Tensor::<4>::from_data(TensorData::new(g, shape), &dev);
        let grads = (out * cg).sum().backward();
        for (name, c, r) in [("dq", &cq, &rq), ("dk", &ck, &rk), ("dv", &cv, &rv)] {
            assert_close(
                &grad_vec(c, &grads),
                &grad_vec(r, &ref_grads),
                1e-4,
                &format!("{what} {name}"),
            );
        }
        if let (Some(dl), PositionalAttention::Pope(p)) = (&delta_leaf, &pos) {
            let got = dl
                .grad(&grads)
                .expect("δ gradient")
                .try_into_data()
                .unwrap()
                .try_to_vec::<f32>()
                .unwrap();
            let want = p
                .delta
                .val()
                .grad(&ref_grads)
                .unwrap()
                .into_data()
                .try_to_vec::<f32>()
                .unwrap();
            assert_close(&got, &want, 1e-3, &format!("{what} dδ"));
        }
    }
}

/// Two whole training steps (forward, backward, global-norm clip, AdamW) of a small RoPE model on
/// the wgpu device — the path `--backend cuda` takes: the CubeCL attention with its backward,
/// burn tensor ops for RMSNorm/GELU — give the same losses and gradient norms as on flex (the Rust
/// kernels). Tolerance 1e-3 relative: f32 with different summation orders over ~10⁴ terms.
#[test]
fn training_steps_on_wgpu_match_flex() {
    let spec = lab::sweep::find_sweep("block-width", &lab::sweep::sweeps_dir()).expect("sweep");
    let mut cfg = spec.expand("smoke").expect("preset").remove(0).config;
    cfg.seq_len = 40; // not a multiple of the kernels' tiles
    cfg.batch_size = 4;
    cfg.attention = AttentionKernel::Fused;
    let run = |device: Device| {
        let ad = device.autodiff();
        let mut model = cfg.model().init(cfg.seed, &ad);
        let mut opt = lab::train::AdamW::new(cfg.beta1, cfg.beta2, cfg.adam_eps, cfg.weight_decay);
        let mut out = Vec::new();
        for step in 0..2 {
            let examples = cfg.train_batch(step).expect("batch");
            let (next, r) = lab::train::train_step(model, &mut opt, &cfg, step, &examples, &ad);
            model = next;
            let r = r.expect("finite step");
            out.push((r.loss, r.grad_norm));
        }
        out
    };
    let (flex, cube) = (run(Device::flex()), run(wgpu()));
    for (step, ((lf, nf), (lc, nc))) in flex.iter().zip(&cube).enumerate() {
        assert!(
            (lf - lc).abs() <= 1e-3 * lf.abs(),
            "step {step} loss: flex {lf}, wgpu {lc}"
        );
        assert!(
            (nf - nc).abs() <= 1e-3 * nf.abs(),
            "step {step} grad norm: flex {nf}, wgpu {nc}"
        );
    }
    // The second step's loss differs from the first: the update happened on both devices.
    assert!((flex[1].0 - flex[0].0).abs() > 1e-4);
}
