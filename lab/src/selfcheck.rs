//! `lab selfcheck`: the fused attention kernels and whole training steps of one backend, checked
//! against burn's reference attention on the CPU, inside the one binary (issue 20: the GPU
//! machine runs only what is copied to it, and a second binary does not fit).
//!
//! Three groups of comparisons, all on seeded inputs:
//!
//! - **`extension`** (every backend): [`crate::kernels::positional_attention`] — the op the model
//!   calls, with its registered backward — on the backend's autodiff device against the reference
//!   [`causal_attention`] on `Device::flex().autodiff()`: output and the gradients of `q`, `k`,
//!   `v` (and PoPE's `δ`) of `L = Σ out ⊙ G` for a fixed random `G`, for every encoding case of
//!   [`KernelCase::ALL`] at every shape of [`SHAPES`]. On `cpu` this checks the Rust kernels of
//!   [`crate::kernels::cpu`]; on `wgpu` and `cuda` the CubeCL kernels of `kernels::cube`.
//! - **`kernel <strategy>`** (`wgpu`, `cuda`): the CubeCL forward and backward called directly with
//!   each launch layout (one unit per row; tiled with the automatic tile; 16-row tiles; the split
//!   key-side backward; the backward's own rows staged in shared memory; the tensor-core kernels,
//!   `cmma` and `cmma-wide`, emulated where the device has no tensor cores), so every code
//!   path of the kernels is reached whatever the autotuned choice.
//! - **`train-step`**: two whole training steps (forward, backward, clip, AdamW) of a small RoPE,
//!   PoPE, TAPA and NoPE model — losses and global gradient norms — on the backend (burn with the
//!   fused kernels; on `cpu` also the whole-step fast path of [`crate::fast`]) against burn's
//!   reference attention on flex.
//!
//! Tolerances ([`ATTENTION_TOL`], [`DELTA_TOL`], [`STEP_TOL`]): `|got − want| ≤ abs + rel·|want|`
//! elementwise. Both sides are f32; they differ in summation order (online softmax over ≤ 70 keys
//! vs a materialised softmax and matmuls), in where the angles are rounded (the reference builds
//! cos/sin tables in f64, the kernels compute `pos·θ` in f32: ≲ 1e-5 rad at positions < 70) and in
//! the transcendental functions (a few ulp). Each term is ≲ 1e-6 relative on values of order one;
//! summed over ≤ 70 keys and 32 dims the errors stay well below 1e-4 absolute. PoPE's `dδ` sums
//! `batch · seq` ≤ 140 per-position terms of order one, hence its looser absolute part; a training
//! step sums ~10⁴ terms in other orders, hence 1e-3 relative on the loss and gradient norm.

use std::time::Instant;

use burn::tensor::{Device, Gradients, Tensor, TensorData};
use rand::{Rng, SeedableRng};

use crate::config::RunConfig;
use crate::fast::{FastAdamW, FastModel};
use crate::model::{
    AttentionKernel, Encoding, EncodingConfig, ModelConfig, PRopeParams, PairLayout,
    PartialRopeParams, PositionalAttention, TapaParams, TapaPhase, causal_attention, causal_mask,
};
use crate::sweep::Backend;
use crate::train::{self, AdamW};

pub use crate::kernels::Tolerance;

/// Attention output and the gradients of `q`, `k`, `v` (module docs for the reason).
pub const ATTENTION_TOL: Tolerance = Tolerance {
    abs: 1e-4,
    rel: 1e-3,
};
/// PoPE's `dδ`, a sum over `batch · seq` positions.
pub const DELTA_TOL: Tolerance = Tolerance {
    abs: 1e-3,
    rel: 1e-3,
};
/// Groups `kernel cmma`, `kernel cmma-wide` where the tensor-core kernels ran (or were emulated
/// with the same operand precision): f16 operands (`q̃`, `k̃`, `v`, `dout`, the probabilities and
/// `dS` rounded to 11 significant bits, about 5e-4 relative each) with f32 accumulation.
pub const CMMA_TOL: Tolerance = Tolerance {
    abs: 5e-3,
    rel: 1e-2,
};
/// Loss and global gradient norm of a training step.
pub const STEP_TOL: Tolerance = Tolerance {
    abs: 0.0,
    rel: 1e-3,
};

/// Shapes `(batch, heads, seq, head_dim)` of the attention checks: seq not a multiple of any tile
/// (5, 33, 70; 70 spans a full and a partial 64-row block), head_dim 8 and 32 (32: the shape the
/// tensor-core forward takes, for every dot-product case and TAPA's quadratic phase, whose
/// amplitude part is then 16 wide; 33 rows fill three of `cmma-wide`'s four 16-row planes).
pub const SHAPES: [(usize, usize, usize, usize); 3] = [(2, 2, 5, 8), (2, 2, 33, 32), (2, 2, 70, 8)];

/// One comparison of a kernel's values against the reference's.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Check {
    /// `extension`, `kernel rows`, `kernel tiled`, `kernel tiled-16`, `kernel tiled-split`,
    /// `kernel tiled-staged`, `kernel cmma`, `kernel cmma-wide` or `train-step`.
    pub group: String,
    /// The encoding case (and, for the attention groups, the shape `b×h×l×d`).
    pub case: String,
    /// `out`, `dq`, `dk`, `dv`, `ddelta`, `loss[s]`, `grad_norm[s]`.
    pub quantity: String,
    /// Elements compared.
    pub n: usize,
    /// `max |got − want|` over the elements (∞ on a length mismatch or a non-finite value).
    pub max_abs_diff: f64,
    /// `max |got − want| / (abs + rel·|want|)`: ≤ 1 passes.
    pub worst_ratio: f64,
    /// The tolerance applied.
    pub tol: Tolerance,
    /// Every element finite and within tolerance.
    pub pass: bool,
}

/// Compare `got` with `want` elementwise under `tol`.
pub fn compare(
    group: &str,
    case: &str,
    quantity: &str,
    got: &[f32],
    want: &[f32],
    tol: Tolerance,
) -> Check {
    let (mut max_abs, mut worst) = (0.0f64, 0.0f64);
    if got.len() != want.len() {
        (max_abs, worst) = (f64::INFINITY, f64::INFINITY);
    }
    for (&x, &y) in got.iter().zip(want) {
        let (x, y) = (x as f64, y as f64);
        let err = if x.is_finite() {
            (x - y).abs()
        } else {
            f64::INFINITY
        };
        max_abs = max_abs.max(err);
        let bound = tol.abs + tol.rel * y.abs();
        let ratio = if bound > 0.0 {
            err / bound
        } else if err == 0.0 {
            0.0
        } else {
            f64::INFINITY
        };
        worst = worst.max(ratio);
    }
    Check {
        group: group.to_string(),
        case: case.to_string(),
        quantity: quantity.to_string(),
        n: want.len(),
        max_abs_diff: max_abs,
        worst_ratio: worst,
        tol,
        pass: worst <= 1.0,
    }
}

/// An encoding case of the attention checks, with the knobs a default config does not reach.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelCase {
    /// No positional encoding.
    Nope,
    /// RoPE with this pair layout; `yarn` interpolates the lower half of the frequencies by 4 and
    /// sets the attention factor 1.2 (a YaRN-like scaling).
    Rope {
        /// Pair layout.
        layout: PairLayout,
        /// The YaRN-like scaling.
        yarn: bool,
    },
    /// PoPE with δ drawn uniformly (so `dδ` is exercised away from δ = 0).
    Pope,
    /// TAPA with this phase and distance exponent.
    Tapa {
        /// Phase form.
        phase: TapaPhase,
        /// Distance exponent `tapa_alpha`.
        alpha: f64,
    },
    /// Partial rotary on the first `head_dim / 2` dims, this layout within them.
    Partial {
        /// Pair layout within the rotary dims.
        layout: PairLayout,
    },
    /// p-RoPE keeping the highest half of RoPE's frequencies.
    PRope,
}

impl KernelCase {
    /// Every case the checks run.
    pub const ALL: [KernelCase; 12] = [
        KernelCase::Nope,
        KernelCase::Rope {
            layout: PairLayout::Adjacent,
            yarn: false,
        },
        KernelCase::Rope {
            layout: PairLayout::RotateHalf,
            yarn: false,
        },
        KernelCase::Rope {
            layout: PairLayout::Adjacent,
            yarn: true,
        },
        KernelCase::Rope {
            layout: PairLayout::RotateHalf,
            yarn: true,
        },
        KernelCase::Partial {
            layout: PairLayout::RotateHalf,
        },
        KernelCase::Partial {
            layout: PairLayout::Adjacent,
        },
        KernelCase::PRope,
        KernelCase::Pope,
        KernelCase::Tapa {
            phase: TapaPhase::Quadratic,
            alpha: 0.1,
        },
        KernelCase::Tapa {
            phase: TapaPhase::Linear,
            alpha: 0.1,
        },
        KernelCase::Tapa {
            phase: TapaPhase::Quadratic,
            alpha: 0.5,
        },
    ];

    /// Short name for the report, e.g. `rope/rotate-half+yarn`, `tapa/linear α=0.1`.
    pub fn name(self) -> String {
        let layout = |l: PairLayout| match l {
            PairLayout::Adjacent => "adjacent",
            PairLayout::RotateHalf => "rotate-half",
        };
        match self {
            KernelCase::Nope => "nope".into(),
            KernelCase::Rope { layout: l, yarn } => {
                format!("rope/{}{}", layout(l), if yarn { "+yarn" } else { "" })
            }
            KernelCase::Pope => "pope δ uniform".into(),
            KernelCase::Tapa { phase, alpha } => {
                let p = match phase {
                    TapaPhase::Quadratic => "quadratic",
                    TapaPhase::Linear => "linear",
                };
                format!("tapa/{p} α={alpha}")
            }
            KernelCase::Partial { layout: l } => format!("partial-rope/{}", layout(l)),
            KernelCase::PRope => "p-rope p=0.5".into(),
        }
    }

    /// The reference encoding module for `heads` heads of `head_dim` dims, on `device`.
    pub fn positional(self, heads: usize, head_dim: usize, device: &Device) -> PositionalAttention {
        let encoding = match self {
            KernelCase::Nope => Encoding::Nope,
            KernelCase::Rope { .. } => Encoding::Rope,
            KernelCase::Pope => Encoding::Pope,
            KernelCase::Tapa { .. } => Encoding::Tapa,
            KernelCase::Partial { .. } => Encoding::PartialRope,
            KernelCase::PRope => Encoding::PRope,
        };
        let mut cfg = ModelConfig::attention_only(
            EncodingConfig::for_kernel_checks(encoding, TapaPhase::Quadratic),
            heads,
            head_dim,
        );
        match self {
            KernelCase::Rope { layout, .. } => cfg.pair_layout = layout,
            KernelCase::Partial { layout } => {
                cfg.pair_layout = layout;
                cfg.encoding = EncodingConfig::PartialRope(PartialRopeParams {
                    rotary_dim: head_dim / 2,
                });
            }
            KernelCase::PRope => cfg.encoding = EncodingConfig::PRope(PRopeParams { rope_p: 0.5 }),
            KernelCase::Tapa { phase, alpha } => {
                cfg.encoding = EncodingConfig::Tapa(TapaParams {
                    tapa_phase: phase,
                    tapa_alpha: alpha,
                    ..TapaParams::default()
                })
            }
            _ => {}
        }
        let mut pos = PositionalAttention::new(&cfg, 7, device);
        if let (KernelCase::Rope { yarn: true, .. }, PositionalAttention::Rope(r)) =
            (self, &mut pos)
        {
            let half = r.inv_freq.len();
            for (i, f) in r.inv_freq.iter_mut().enumerate() {
                if i >= half / 2 {
                    *f /= 4.0;
                }
            }
            r.attention_factor = 1.2;
        }
        pos
    }

    /// Seeded `q`, `k`, `v`, `G` of `n` elements each: uniform in ±1, TAPA's `q`, `k` in ±0.5 so
    /// its phase stays of order one.
    pub fn inputs(self, n: usize, seed: u64) -> [Vec<f32>; 4] {
        let qk = if matches!(self, KernelCase::Tapa { .. }) {
            0.5
        } else {
            1.0
        };
        let random = |s: u64, scale: f32| -> Vec<f32> {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(s);
            (0..n).map(|_| rng.random_range(-scale..scale)).collect()
        };
        [
            random(seed, qk),
            random(seed + 1, qk),
            random(seed + 2, 1.0),
            random(seed + 3, 1.0),
        ]
    }
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .try_to_vec::<f32>()
        .expect("f32 tensors throughout the checks")
}

fn grad_of<const D: usize>(t: &Tensor<D>, grads: &Gradients) -> Vec<f32> {
    values(t.grad(grads).expect("a leaf of the differentiated graph"))
}

/// The reference attention's output and gradients (`dδ` for PoPE) for one case and shape.
pub struct Reference {
    /// `[b, h, l, d]` output, flat.
    pub out: Vec<f32>,
    /// `dq`, `dk`, `dv`, flat like `out`.
    pub dqkv: [Vec<f32>; 3],
    /// PoPE's `dδ`, `[h · d]`.
    pub ddelta: Option<Vec<f32>>,
}

/// Run the reference [`causal_attention`] of `pos` (built on `Device::flex().autodiff()`) on
/// `q`, `k`, `v` of `shape`, and differentiate `Σ out ⊙ g`.
pub fn reference(pos: &PositionalAttention, qkvg: &[Vec<f32>; 4], shape: [usize; 4]) -> Reference {
    let device = Device::flex().autodiff();
    let leaf = |x: &[f32]| {
        Tensor::<4>::from_data(TensorData::new(x.to_vec(), shape), &device).require_grad()
    };
    let (q, k, v) = (leaf(&qkvg[0]), leaf(&qkvg[1]), leaf(&qkvg[2]));
    let g = Tensor::<4>::from_data(TensorData::new(qkvg[3].clone(), shape), &device);
    let out = causal_attention(
        pos,
        q.clone(),
        k.clone(),
        v.clone(),
        &causal_mask(shape[2], &device),
    );
    let out_values = values(out.clone());
    let grads = (out * g).sum().backward();
    let ddelta = match pos {
        PositionalAttention::Pope(p) => Some(grad_of(&p.delta.val(), &grads)),
        _ => None,
    };
    Reference {
        out: out_values,
        dqkv: [
            grad_of(&q, &grads),
            grad_of(&k, &grads),
            grad_of(&v, &grads),
        ],
        ddelta,
    }
}

/// The comparisons of one computed `(out, dq, dk, dv, dδ)` against the reference.
fn compare_all(
    group: &str,
    case: &str,
    got: (Vec<f32>, [Vec<f32>; 3], Option<Vec<f32>>),
    want: &Reference,
) -> Vec<Check> {
    compare_all_within(group, case, got, want, ATTENTION_TOL, DELTA_TOL)
}

/// [`compare_all`] under the given tolerances (attention outputs and gradients; `dδ`).
fn compare_all_within(
    group: &str,
    case: &str,
    got: (Vec<f32>, [Vec<f32>; 3], Option<Vec<f32>>),
    want: &Reference,
    attention_tol: Tolerance,
    delta_tol: Tolerance,
) -> Vec<Check> {
    let mut out = vec![compare(
        group,
        case,
        "out",
        &got.0,
        &want.out,
        attention_tol,
    )];
    for (i, name) in ["dq", "dk", "dv"].into_iter().enumerate() {
        out.push(compare(
            group,
            case,
            name,
            &got.1[i],
            &want.dqkv[i],
            attention_tol,
        ));
    }
    match (&got.2, &want.ddelta) {
        (Some(g), Some(w)) => out.push(compare(group, case, "ddelta", g, w, delta_tol)),
        (None, None) => {}
        // A δ gradient where none is expected, or none where PoPE needs one.
        (g, w) => out.push(compare(
            group,
            case,
            "ddelta",
            g.as_deref().unwrap_or(&[]),
            w.as_deref().unwrap_or(&[f32::NAN]),
            delta_tol,
        )),
    }
    out
}

/// One comparison point of the attention groups: an encoding case at a shape of [`SHAPES`], its
/// seeded inputs and the reference's values.
struct ReferenceCase {
    /// `<case> b×h×l×d`, the [`Check::case`] of its checks.
    name: String,
    shape: [usize; 4],
    pos: PositionalAttention,
    qkvg: [Vec<f32>; 4],
    want: Reference,
}

/// Every case of [`KernelCase::ALL`] at every shape of [`SHAPES`], inputs drawn with `seed`, the
/// reference computed on `Device::flex().autodiff()`.
fn reference_cases(seed: u64) -> Vec<ReferenceCase> {
    let ref_device = Device::flex().autodiff();
    let mut out = Vec::new();
    for case in KernelCase::ALL {
        for &(b, h, l, d) in &SHAPES {
            let shape = [b, h, l, d];
            let pos = case.positional(h, d, &ref_device);
            let qkvg = case.inputs(b * h * l * d, seed);
            let want = reference(&pos, &qkvg, shape);
            let name = format!("{} {b}×{h}×{l}×{d}", case.name());
            out.push(ReferenceCase {
                name,
                shape,
                pos,
                qkvg,
                want,
            });
        }
    }
    out
}

/// Group `extension`: the differentiable fused attention op on `device` (plain, not autodiff;
/// the check wraps it) against the reference, every case of [`KernelCase::ALL`] at every shape of
/// [`SHAPES`] (module docs).
pub fn extension_checks(device: &Device) -> Vec<Check> {
    let dev = device.clone().autodiff();
    let mut checks = Vec::new();
    for c in reference_cases(21) {
        let (shape, qkvg) = (c.shape, &c.qkvg);
        let hd = shape[1] * shape[3];
        let leaf = |x: &[f32]| {
            Tensor::<4>::from_data(TensorData::new(x.to_vec(), shape), &dev).require_grad()
        };
        let (q, k, v) = (leaf(&qkvg[0]), leaf(&qkvg[1]), leaf(&qkvg[2]));
        let (encoding, delta) = c.pos.kernel_encoding();
        let delta = delta
            .map(|t| Tensor::<1>::from_data(TensorData::new(values(t), [hd]), &dev).require_grad());
        let out = crate::kernels::positional_attention(
            q.clone(),
            k.clone(),
            v.clone(),
            delta.clone(),
            encoding,
        );
        let out_values = values(out.clone());
        let g = Tensor::<4>::from_data(TensorData::new(qkvg[3].clone(), shape), &dev);
        let grads = (out * g).sum().backward();
        let got = (
            out_values,
            [
                grad_of(&q, &grads),
                grad_of(&k, &grads),
                grad_of(&v, &grads),
            ],
            delta.map(|t| grad_of(&t, &grads)),
        );
        checks.extend(compare_all("extension", &c.name, got, &c.want));
    }
    checks
}

/// Groups `kernel rows`, `kernel tiled`, `kernel tiled-16`, `kernel tiled-split`,
/// `kernel tiled-staged`, `kernel cmma`, `kernel cmma-wide`
/// (their tensor-core kernels on tensor cores where the device has them, cases marked
/// `[tensor cores]`, and emulated where it has not ([`crate::kernels::cube::CmmaPath::Emulated`]:
/// lavapipe), cases marked `[tensor cores emulated]`, both checked within [`CMMA_TOL`]; shapes
/// the tensor-core kernels do not take run the tiled ones, within [`ATTENTION_TOL`]): the CubeCL
/// forward and backward called directly with each launch layout, on a `wgpu` or `cuda` `device`
/// (plain), every case at every shape (module docs).
#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
pub fn cube_kernel_checks(device: &Device) -> Vec<Check> {
    cube_kernel_checks_for(device, &KERNEL_LAYOUTS)
}

/// The launch layouts of the `kernel` groups, by the names `lab selfcheck --layouts` takes (the
/// group is `kernel <name>`).
pub const KERNEL_LAYOUTS: [&str; 7] = [
    "rows",
    "tiled",
    "tiled-16",
    "tiled-split",
    "tiled-staged",
    "cmma",
    "cmma-wide",
];

/// [`cube_kernel_checks`] for the layouts named in `layouts` only (names of [`KERNEL_LAYOUTS`];
/// others are ignored).
#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
pub fn cube_kernel_checks_for(device: &Device, layouts: &[&str]) -> Vec<Check> {
    use crate::kernels::cube::{self, CubeAttentionParams, CubeStrategy};

    let strategies = [
        ("kernel rows", CubeStrategy::Rows),
        ("kernel tiled", CubeStrategy::Tiled { tile: None }),
        ("kernel tiled-16", CubeStrategy::Tiled { tile: Some(16) }),
        (
            "kernel tiled-split",
            CubeStrategy::TiledSplit { tile: None },
        ),
        (
            "kernel tiled-staged",
            CubeStrategy::TiledStaged { tile: None },
        ),
        ("kernel cmma", CubeStrategy::Cmma { tile: None }),
        ("kernel cmma-wide", CubeStrategy::CmmaWide { tile: None }),
    ];
    let strategies: Vec<_> = strategies
        .into_iter()
        .filter(|(group, _)| layouts.contains(&group.trim_start_matches("kernel ")))
        .collect();
    let mut checks = Vec::new();
    for c in reference_cases(11) {
        let shape = c.shape;
        let (encoding, delta) = c.pos.kernel_encoding();
        let delta = delta.map(|t| cube::host_to_cube(&values(t), [shape[1] * shape[3]], device));
        for &(group, strategy) in &strategies {
            let mut params =
                CubeAttentionParams::from_kernel_encoding(encoding.clone(), delta.clone());
            params.strategy = strategy;
            let [q, k, v, g] = c
                .qkvg
                .each_ref()
                .map(|x| cube::host_to_cube(x, shape, device));
            // The tensor-core kernels (f16 operands) are checked at their own tolerance, and
            // their cases are marked so the output says where and how they ran.
            let path = cube::cmma_path_of(&q, &params);
            let (out, lse) = cube::forward(q.clone(), k.clone(), v.clone(), &params);
            let grads = cube::backward(q, k, v, out.clone(), lse, g, &params);
            let got = (
                cube::cube_to_host(out),
                [grads.dq, grads.dk, grads.dv].map(cube::cube_to_host),
                grads.ddelta.map(cube::cube_to_host),
            );
            if let Some(path) = path {
                let mark = match path {
                    cube::CmmaPath::TensorCores => "tensor cores",
                    cube::CmmaPath::Emulated => "tensor cores emulated",
                };
                let case = format!("{} [{mark}]", c.name);
                checks.extend(compare_all_within(
                    group, &case, got, &c.want, CMMA_TOL, CMMA_TOL,
                ));
            } else {
                checks.extend(compare_all(group, &c.name, got, &c.want));
            }
        }
    }
    checks
}

/// The small run of the training-step checks: a 2-layer d 32 model on the block task's copy
/// variant, batch 4, context 40 (not a multiple of the kernels' tiles).
pub fn step_check_config(encoding: &str) -> RunConfig {
    let json = serde_json::json!({
        "task": "block", "variant": "copy", "vocab_size": 16, "seq_len": 40, "block_len": 4,
        "noise": 0.0, "encoding": encoding, "rope_base": 10000.0, "pair_layout": "adjacent",
        "d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "steps": 2, "batch_size": 4,
        "lr": 0.003, "warmup_steps": 1, "min_lr_ratio": 0.1, "weight_decay": 0.1,
        "beta1": 0.9, "beta2": 0.95, "adam_eps": 1e-8, "grad_clip": 1.0, "eval_every": 2,
        "eval_batches": 1, "seed": 3
    });
    crate::config::from_flat_json(json).expect("the step-check config is valid")
}

/// `(loss, grad_norm)` of two training steps of `cfg`'s model through burn on `device`.
fn burn_steps(cfg: &RunConfig, device: &Device) -> Result<Vec<(f64, f64)>, String> {
    let ad = device.clone().autodiff();
    let mut model = cfg.model().init(cfg.seed, &ad);
    let mut opt = AdamW::new(cfg.beta1, cfg.beta2, cfg.adam_eps, cfg.weight_decay);
    let mut out = Vec::new();
    for step in 0..2 {
        let examples = cfg.train_batch(step).map_err(|e| e.to_string())?;
        let (next, r) = train::train_step(model, &mut opt, cfg, step, &examples, &ad);
        model = next;
        let r = r?;
        out.push((r.loss, r.grad_norm));
    }
    Ok(out)
}

/// `(loss, grad_norm)` of two training steps on the CPU fast path.
fn fast_steps(cfg: &RunConfig) -> Result<Vec<(f64, f64)>, String> {
    let model = cfg.model().init(cfg.seed, &Device::flex().autodiff());
    let mut fast = FastModel::from_burn(&model, &cfg.model());
    let mut opt = FastAdamW::new(cfg.beta1, cfg.beta2, cfg.adam_eps, cfg.weight_decay);
    let mut out = Vec::new();
    for step in 0..2 {
        let examples = cfg.train_batch(step).map_err(|e| e.to_string())?;
        let r = train::fast_train_step(&mut fast, &mut opt, cfg, step, &examples)?;
        out.push((r.loss, r.grad_norm));
    }
    Ok(out)
}

/// Group `train-step`: two training steps of RoPE, PoPE, TAPA and NoPE models on `backend`
/// (burn with the fused kernels; on `cpu` also the fast path) against burn's reference attention
/// on flex: losses and gradient norms within [`STEP_TOL`], and the second step's loss differs
/// from the first (the update happened).
///
/// # Errors
/// The backend's cargo feature is missing.
pub fn train_step_checks(backend: Backend) -> Result<Vec<Check>, crate::sweep::runner::SweepError> {
    let device = backend.device()?;
    let mut checks = Vec::new();
    for encoding in ["rope", "pope", "tapa", "nope"] {
        let mut cfg = step_check_config(encoding);
        cfg.attention = AttentionKernel::Reference;
        let want = burn_steps(&cfg, &Device::flex());
        let mut paths = Vec::new();
        cfg.attention = AttentionKernel::Fused;
        paths.push(("burn fused", burn_steps(&cfg, &device)));
        if backend == Backend::Cpu {
            cfg.attention = AttentionKernel::Fast;
            paths.push(("fast path", fast_steps(&cfg)));
        }
        for (path, got) in paths {
            let case = format!("{encoding} {path} vs reference");
            let (got, want) = match (got, &want) {
                (Ok(g), Ok(w)) => (g, w.clone()),
                // A diverged step on either side is a failed check, reported as non-finite.
                _ => (vec![(f64::NAN, f64::NAN); 2], vec![(1.0, 1.0); 2]),
            };
            for s in 0..2 {
                let (g, w) = (got[s], want[s]);
                for (quantity, g, w) in [("loss", g.0, w.0), ("grad_norm", g.1, w.1)] {
                    let quantity = format!("{quantity}[{s}]");
                    let (g, w) = ([g as f32], [w as f32]);
                    checks.push(compare("train-step", &case, &quantity, &g, &w, STEP_TOL));
                }
            }
            let moved = (got[1].0 - got[0].0).abs() > 1e-4;
            checks.push(Check {
                group: "train-step".into(),
                case,
                // Not a difference from the reference: pass/fail only.
                quantity: "loss[1] ≠ loss[0]".into(),
                n: 1,
                max_abs_diff: 0.0,
                worst_ratio: if moved { 0.0 } else { f64::INFINITY },
                tol: STEP_TOL,
                pass: moved,
            });
        }
    }
    Ok(checks)
}

/// Every check of one backend, with its wall time.
#[derive(Debug, serde::Serialize)]
pub struct SelfcheckReport {
    /// `cpu`, `wgpu` or `cuda`.
    pub backend: String,
    /// Every comparison, in run order.
    pub checks: Vec<Check>,
    /// Seconds the checks took.
    pub seconds: f64,
}

impl SelfcheckReport {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.pass)
    }

    /// One line per group and encoding case (the shapes and quantities pooled: count, worst
    /// `|diff|`, worst diff/tolerance), every failed comparison on its own line, then the verdict.
    pub fn text(&self) -> String {
        let mut rows: Vec<(String, String, usize, f64, f64, bool)> = Vec::new();
        for c in &self.checks {
            // Pool the shapes: the case name up to the shape (the last word with a `×`).
            let case = match c.case.rsplit_once(' ') {
                Some((head, tail)) if tail.contains('×') => head.to_string(),
                _ => c.case.clone(),
            };
            match rows.iter_mut().find(|r| r.0 == c.group && r.1 == case) {
                Some(r) => {
                    r.2 += 1;
                    r.3 = r.3.max(c.max_abs_diff);
                    r.4 = r.4.max(c.worst_ratio);
                    r.5 &= c.pass;
                }
                None => rows.push((
                    c.group.clone(),
                    case,
                    1,
                    c.max_abs_diff,
                    c.worst_ratio,
                    c.pass,
                )),
            }
        }
        let mut s = format!(
            "selfcheck on {}: {} comparisons against burn's reference attention on the CPU\n\
             {:<18} {:<36} {:>6} {:>11} {:>9}  result\n",
            self.backend,
            self.checks.len(),
            "group",
            "case",
            "checks",
            "max |diff|",
            "diff/tol"
        );
        for (group, case, n, diff, ratio, pass) in &rows {
            s += &format!(
                "{group:<18} {case:<36} {n:>6} {diff:>11.2e} {ratio:>9.3}  {}\n",
                if *pass { "pass" } else { "FAIL" }
            );
        }
        let failed: Vec<&Check> = self.checks.iter().filter(|c| !c.pass).collect();
        for c in &failed {
            s += &format!(
                "FAIL {} {} {}: max |diff| {:.3e}, {:.2}× the tolerance ({} + {}·|ref|)\n",
                c.group, c.case, c.quantity, c.max_abs_diff, c.worst_ratio, c.tol.abs, c.tol.rel
            );
        }
        s += &if failed.is_empty() && !self.checks.is_empty() {
            format!(
                "all {} checks passed on {} ({:.1} s)",
                self.checks.len(),
                self.backend,
                self.seconds
            )
        } else {
            format!(
                "{} of {} checks FAILED on {} ({:.1} s)",
                failed.len(),
                self.checks.len(),
                self.backend,
                self.seconds
            )
        };
        s
    }
}

/// Run every group that applies to `backend` (module docs): `extension` and `train-step`
/// everywhere, the direct `kernel` groups on `wgpu` and `cuda`. With `layouts` (names of
/// [`KERNEL_LAYOUTS`]), only the `kernel` groups of those layouts (`lab selfcheck --layouts`: the
/// layouts a GPU has not run yet, checked first in a short device session).
///
/// # Errors
/// The backend's cargo feature is missing (one line naming the feature and the backends built).
pub fn run(
    backend: Backend,
    layouts: Option<&[&str]>,
) -> Result<SelfcheckReport, crate::sweep::runner::SweepError> {
    let t0 = Instant::now();
    let device = backend.device()?;
    let mut checks = Vec::new();
    if let Some(layouts) = layouts {
        // One layout at a time, each announced when done: a run cut off by a time limit (a short
        // device session) still says which layouts passed.
        #[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
        for (i, layout) in layouts.iter().enumerate() {
            // A layout named twice is checked once.
            if layouts[..i].contains(layout) {
                continue;
            }
            let group = cube_kernel_checks_for(&device, &[layout]);
            announce(&format!("kernel {layout}"), &group, t0);
            checks.extend(group);
        }
        #[cfg(not(any(feature = "wgpu", feature = "cuda-plain")))]
        let _ = (&device, layouts);
        return Ok(SelfcheckReport {
            backend: backend.name().to_string(),
            checks,
            seconds: t0.elapsed().as_secs_f64(),
        });
    }
    let group = extension_checks(&device);
    announce("extension", &group, t0);
    checks.extend(group);
    #[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
    if backend != Backend::Cpu {
        for layout in KERNEL_LAYOUTS {
            let group = cube_kernel_checks_for(&device, &[layout]);
            announce(&format!("kernel {layout}"), &group, t0);
            checks.extend(group);
        }
    }
    let group = train_step_checks(backend)?;
    announce("train-step", &group, t0);
    checks.extend(group);
    Ok(SelfcheckReport {
        backend: backend.name().to_string(),
        checks,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// One line on stderr as a group of checks ends (`selfcheck: kernel cmma: 147 checks, 0
/// failed, 12.3 s`): the report itself is printed only at the end.
fn announce(group: &str, checks: &[Check], t0: Instant) {
    let failed = checks.iter().filter(|c| !c.pass).count();
    eprintln!(
        "selfcheck: {group}: {} checks, {failed} failed, {:.1} s",
        checks.len(),
        t0.elapsed().as_secs_f64()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_hand_computed() {
        let tol = Tolerance { abs: 0.1, rel: 0.5 };
        // |1.2 − 1| = 0.2 against 0.1 + 0.5 = 0.6: ratio 1/3; |3 − 2| = 1 against 1.1: 0.909.
        let c = compare("g", "c", "q", &[1.2, 3.0], &[1.0, 2.0], tol);
        assert!((c.max_abs_diff - 1.0).abs() < 1e-6);
        assert!(
            (c.worst_ratio - 1.0 / 1.1).abs() < 1e-6,
            "{}",
            c.worst_ratio
        );
        assert!(c.pass);
        // 0.7 off at 0 against 0.1: 7×, fails.
        let c = compare("g", "c", "q", &[0.7], &[0.0], tol);
        assert!(!c.pass && (c.worst_ratio - 7.0).abs() < 1e-5);
        // A non-finite value and a length mismatch fail.
        assert!(!compare("g", "c", "q", &[f32::NAN], &[0.0], tol).pass);
        assert!(!compare("g", "c", "q", &[0.0], &[0.0, 0.0], tol).pass);
        // Exact equality under a zero tolerance passes.
        let zero = Tolerance { abs: 0.0, rel: 0.0 };
        assert!(compare("g", "c", "q", &[0.0], &[0.0], zero).pass);
    }

    #[test]
    fn case_names_are_distinct() {
        let names: std::collections::HashSet<String> =
            KernelCase::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), KernelCase::ALL.len());
    }

    /// A perturbed kernel output is caught: the checks can fail.
    #[test]
    fn a_wrong_output_fails_the_check() {
        let device = Device::flex().autodiff();
        let case = KernelCase::Rope {
            layout: PairLayout::Adjacent,
            yarn: false,
        };
        let shape = [1, 2, 5, 8];
        let pos = case.positional(2, 8, &device);
        let qkvg = case.inputs(80, 3);
        let want = reference(&pos, &qkvg, shape);
        let mut out = want.out.clone();
        out[17] += 1e-3;
        let checks = compare_all("t", "c", (out, want.dqkv.clone(), None), &want);
        assert_eq!(checks.len(), 4);
        assert!(!checks[0].pass && checks[1..].iter().all(|c| c.pass));
        // PoPE's δ gradient missing is a failure too.
        let pope = KernelCase::Pope.positional(2, 8, &device);
        let want = reference(&pope, &qkvg, shape);
        let checks = compare_all("t", "c", (want.out.clone(), want.dqkv.clone(), None), &want);
        assert!(!checks.last().unwrap().pass);
    }

    /// The CPU selfcheck passes: the Rust kernels and the fast path agree with the reference.
    #[test]
    fn cpu_selfcheck_passes() {
        let report = run(Backend::Cpu, None).expect("cpu is always built");
        let text = report.text();
        assert!(report.passed(), "{text}");
        // 12 cases × 3 shapes × (out, dq, dk, dv) + PoPE's 3 dδ; 4 encodings × 2 paths × 5.
        assert_eq!(report.checks.len(), 12 * 3 * 4 + 3 + 4 * 2 * 5);
        assert!(text.contains("all 187 checks passed on cpu"), "{text}");
        assert_eq!(text.lines().count(), 2 + 12 + 8 + 1, "{text}");
    }
}
