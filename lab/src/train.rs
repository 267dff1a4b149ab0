//! The training loop (custom; no burn-train `Learner`).
//!
//! - AdamW with PyTorch semantics (`torch.optim.AdamW`, Loshchilov & Hutter 2019, Alg. 2):
//!   decoupled decay `p ← p − lr·λ·p` applied to matrices only (rank ≥ 2: embeddings,
//!   projections, head), bias-corrected moments, `ε` added outside the square root.
//!   burn's own AdamW defaults differ (ε = 1e-5, decay on every tensor; DESIGN.md).
//! - Learning rate: linear warm-up over `warmup_steps`, then cosine decay to `min_lr_ratio·lr`.
//! - Gradient clipping by the *global* norm over all parameters (`torch.nn.utils.clip_grad_norm_`:
//!   scale `min(1, c/(‖g‖+1e-6))`), not burn's per-tensor `Norm`.
//! - Evaluation on the held-out stream with the non-autodiff model (`Module::valid`), at step 0,
//!   every `eval_every` steps and at the end; each evaluation also runs the frequency probe.
//! - A non-finite loss or gradient norm, or a gradient norm above `max_grad_norm` (exploding
//!   gradients), stops the run with status `failed`, step and reason.

use std::collections::HashMap;
use std::time::Instant;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Int, Tensor, TensorData};
use tasks::{Example, Split};

use crate::config::{RunConfig, StopRule};
use crate::fast::{FastAdamW, FastModel};
use crate::model::{AttentionKernel, Transformer, masked_cross_entropy_for};
use crate::probe;

/// Learning rate at 0-based `step`: linear warm-up to `lr` over `warmup_steps` (reaching `lr`
/// at step `warmup_steps − 1`), then half-cosine from `lr` down to `min_lr_ratio·lr` at the
/// last step.
pub fn lr_at(step: usize, cfg: &RunConfig) -> f64 {
    if step < cfg.warmup_steps {
        return cfg.lr * (step + 1) as f64 / cfg.warmup_steps as f64;
    }
    let decay_steps = (cfg.steps - cfg.warmup_steps).max(1) as f64;
    let progress = ((step - cfg.warmup_steps) as f64 / decay_steps).min(1.0);
    let min_lr = cfg.lr * cfg.min_lr_ratio;
    min_lr + (cfg.lr - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
}

/// AdamW state (PyTorch semantics; see module docs).
pub struct AdamW {
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    step: i32,
    /// First and second moments per parameter, each `(Tensor<D>, Tensor<D>)` in the parameter's
    /// own shape (boxed because parameters differ in rank): no reshape between the parameter,
    /// its gradient and its moments, so burn's fusion can fuse more of each update on the CubeCL
    /// backends (a reshape ends a fused block: 28 launches fewer per quick-model step on
    /// lavapipe; docs/performance.md, "Launches per training step").
    moments: HashMap<ParamId, Box<dyn std::any::Any>>,
    /// How the update runs on a CubeCL device; `None`: the process's [`adamw_kernel`].
    kernel: Option<AdamWKernel>,
}

impl AdamW {
    /// A fresh optimiser.
    pub fn new(beta1: f64, beta2: f64, eps: f64, weight_decay: f64) -> Self {
        Self {
            beta1,
            beta2,
            eps,
            weight_decay,
            step: 0,
            moments: HashMap::new(),
            kernel: None,
        }
    }

    /// This optimiser with its update on CubeCL devices fixed to `kernel`, whatever `LAB_ADAMW`
    /// says (to compare the two in one process).
    pub fn with_kernel(mut self, kernel: AdamWKernel) -> Self {
        self.kernel = Some(kernel);
        self
    }

    /// How this optimiser updates on a CubeCL device.
    pub fn kernel(&self) -> AdamWKernel {
        self.kernel.unwrap_or_else(adamw_kernel)
    }

    /// One update of every parameter of `model` that has a gradient in `grads`, at learning rate
    /// `lr`, after scaling every gradient by `grad_scale` (the global-norm clip factor: an `f64`
    /// known on the host, or a [`GradScale::Device`] tensor). On a CubeCL device each parameter's
    /// update is one `adamw_update` kernel unless [`AdamW::kernel`] is [`AdamWKernel::Ops`]
    /// (burn's tensor operations, as on flex).
    pub fn step<M: Module>(
        &mut self,
        model: M,
        lr: f64,
        grads: GradientsParams,
        grad_scale: impl Into<GradScale>,
    ) -> M {
        self.step += 1;
        let grad_scale = match grad_scale.into() {
            GradScale::Host(s) => Scale::Host(s),
            // The fused update takes the `[1]` factor as it is.
            #[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
            GradScale::Device(s) if self.kernel() == AdamWKernel::Fused => Scale::Flat(Box::new(s)),
            // Reshaped to every rank once, before the updates: a reshape inside the stretch of
            // element-wise updates would end burn's fused blocks there.
            GradScale::Device(s) => Scale::Device(Box::new(std::array::from_fn(|r| match r {
                0 => s.clone().into_dispatch(),
                1 => s.clone().reshape([1; 2]).into_dispatch(),
                2 => s.clone().reshape([1; 3]).into_dispatch(),
                _ => s.clone().reshape([1; 4]).into_dispatch(),
            }))),
        };
        let mut mapper = AdamWMapper {
            opt: self,
            grads,
            lr,
            grad_scale,
        };
        model.map(&mut mapper)
    }
}

/// What every gradient is multiplied by before an AdamW update (the global-norm clip factor).
// One value per step, moved once: a tensor handle's size does not matter here.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum GradScale {
    /// A factor known on the host.
    Host(f64),
    /// A `[1]` tensor on the gradients' device, computed there from the gradients
    /// ([`step_stats_on_device`]): the update is issued without reading anything back.
    Device(Tensor<1>),
}

impl From<f64> for GradScale {
    fn from(s: f64) -> Self {
        GradScale::Host(s)
    }
}

/// [`GradScale`] as the updates use it: a device factor as rank-1 to rank-4 `[1, …]` tensors
/// (the lab's parameters have rank 1 or 2).
enum Scale {
    Host(f64),
    Device(Box<[burn::backend::tensor::FloatTensor<burn::backend::Dispatch>; 4]>),
    /// The `[1]` device factor for the fused update ([`AdamWKernel::Fused`]).
    #[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
    Flat(Box<Tensor<1>>),
}

struct AdamWMapper<'a> {
    opt: &'a mut AdamW,
    grads: GradientsParams,
    lr: f64,
    grad_scale: Scale,
}

impl ModuleMapper for AdamWMapper<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(grad) = self.grads.remove::<D>(id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let opt = &mut *self.opt;
        let x = tensor.inner();
        let moments = opt.moments.remove(&id).map(|b| {
            *b.downcast::<(Tensor<D>, Tensor<D>)>()
                .expect("a parameter keeps its rank")
        });
        let decay = if D >= 2 { opt.weight_decay } else { 0.0 };
        #[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
        if opt.kernel() == AdamWKernel::Fused && !crate::kernels::is_flex(&x.device()) {
            let hyper = crate::kernels::cube::AdamWHyper::new(
                opt.beta1, opt.beta2, opt.eps, opt.step, self.lr, decay,
            );
            let (x, m, v) = cube_adamw(x, grad, moments, &self.grad_scale, &hyper);
            opt.moments.insert(id, Box::new((m, v)));
            return Param::from_mapped_value(id, Tensor::from_inner(x).require_grad(), mapper);
        }
        let g = match &self.grad_scale {
            Scale::Host(scale) => grad * *scale,
            Scale::Device(by_rank) => grad * Tensor::<D>::from_dispatch(by_rank[D - 1].clone()),
            #[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
            Scale::Flat(s) => grad * (**s).clone().reshape([1; D]),
        };
        let (m, v) = match moments {
            Some((m, v)) => (
                m * opt.beta1 + g.clone() * (1.0 - opt.beta1),
                v * opt.beta2 + g.square() * (1.0 - opt.beta2),
            ),
            None => (
                g.clone() * (1.0 - opt.beta1),
                g.square() * (1.0 - opt.beta2),
            ),
        };
        let bias1 = 1.0 - opt.beta1.powi(opt.step);
        let bias2 = 1.0 - opt.beta2.powi(opt.step);
        let update = (m.clone() / bias1) / ((v.clone() / bias2).sqrt() + opt.eps);
        let x = x * (1.0 - self.lr * decay) - update * self.lr;
        opt.moments.insert(id, Box::new((m, v)));
        Param::from_mapped_value(id, Tensor::from_inner(x).require_grad(), mapper)
    }
}

/// One AdamW update on a CubeCL device by the fused kernel ([`crate::kernels::cube::adamw_update`]):
/// `(x', m', v')` from the parameter `x`, its gradient, its moments (`None` on the first step) and
/// the gradients' scale.
#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
fn cube_adamw<const D: usize>(
    x: Tensor<D>,
    grad: Tensor<D>,
    moments: Option<(Tensor<D>, Tensor<D>)>,
    scale: &Scale,
    hyper: &crate::kernels::cube::AdamWHyper,
) -> (Tensor<D>, Tensor<D>, Tensor<D>) {
    use crate::kernels::cube::{CubePrimitives, UpdateScale};
    type C = burn::backend::Cube;
    fn prim<const R: usize>(t: Tensor<R>) -> burn::backend::tensor::FloatTensor<C> {
        t.try_into_primitive::<C>()
            .expect("a wgpu or cuda tensor is a Cube primitive")
    }
    let scale = match scale {
        Scale::Host(s) => UpdateScale::Host(*s as f32),
        Scale::Flat(s) => UpdateScale::Device(prim((**s).clone())),
        Scale::Device(by_rank) => {
            UpdateScale::Device(prim(Tensor::<1>::from_dispatch(by_rank[0].clone())))
        }
    };
    let [x, m, v] = <C as CubePrimitives>::adamw_update(
        prim(x),
        prim(grad),
        moments.map(|(m, v)| (prim(m), prim(v))),
        scale,
        hyper,
    )
    .map(Tensor::<D>::from_primitive::<C>);
    (x, m, v)
}

/// How AdamW updates the parameters on a CubeCL device (`wgpu`, `cuda`; `LAB_ADAMW`; flex always
/// uses the tensor operations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdamWKernel {
    /// One `adamw_update` kernel per parameter ([`crate::kernels::cube::adamw_update`]; the
    /// default).
    Fused,
    /// Burn's tensor operations, sixteen per parameter, fused as burn's fusion finds (the lab's
    /// update until 2026-12-06; kept to compare on a GPU).
    Ops,
}

static ADAMW: crate::kernels::Switch<AdamWKernel> = crate::kernels::Switch::new(
    "LAB_ADAMW",
    [("fused", AdamWKernel::Fused), ("ops", AdamWKernel::Ops)],
);

impl AdamWKernel {
    /// Parse the value of `LAB_ADAMW` (`None` when unset: `Fused`).
    ///
    /// # Errors
    /// Anything but `fused` or `ops`: one line naming the variable and the values allowed.
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        ADAMW.parse(value)
    }

    /// `fused` or `ops`, as `LAB_ADAMW` spells it.
    pub fn name(self) -> &'static str {
        ADAMW.name(self)
    }
}

/// Fix [`adamw_kernel`] from `LAB_ADAMW` for this process; later calls change nothing.
/// `Backend::device` calls it for `wgpu` and `cuda`.
///
/// # Errors
/// A value [`AdamWKernel::parse`] refuses.
pub fn configure_adamw() -> Result<AdamWKernel, String> {
    ADAMW.configure()
}

/// The [`AdamWKernel`] that [`configure_adamw`] fixed (`Fused` when it was never called).
pub fn adamw_kernel() -> AdamWKernel {
    ADAMW.get()
}

/// Global L2 norm of every gradient in `grads` that belongs to `model`: on flex through burn's
/// `square().sum()` per gradient, summed in f32; on a CubeCL device (`wgpu`, `cuda`) one
/// partial-sum kernel per 24 gradients and an f64 sum on the host
/// ([`crate::kernels::cube::sum_of_squares`]). The training step calls it on flex and with
/// `LAB_STEP_READS=each`; otherwise a CubeCL step keeps the norm on the device
/// ([`step_stats_on_device`]).
pub fn global_grad_norm<M: Module>(model: &M, grads: &GradientsParams) -> f64 {
    struct NormVisitor<'a> {
        grads: &'a GradientsParams,
        total: Option<Tensor<1>>,
        /// On a CubeCL device: the gradients, for one partial-sum kernel each.
        #[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
        cube: Vec<burn_cubecl::tensor::CubeTensor>,
    }
    impl ModuleVisitor for NormVisitor<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.grads.get::<D>(param.id) {
                #[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
                if !crate::kernels::is_flex(&g.device()) {
                    self.cube.push(crate::kernels::cube::tensor_to_cube(g));
                    return;
                }
                let s = g.square().sum();
                self.total = Some(match self.total.take() {
                    Some(t) => t + s,
                    None => s,
                });
            }
        }
    }
    let mut v = NormVisitor {
        grads,
        total: None,
        #[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
        cube: Vec::new(),
    };
    model.visit(&mut v);
    #[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
    if !v.cube.is_empty() {
        return crate::kernels::cube::sum_of_squares(v.cube).sqrt();
    }
    v.total
        .map(|t| (t.into_scalar::<f32>() as f64).sqrt())
        .unwrap_or(0.0)
}

/// A training step's statistics on a CubeCL device (`wgpu`, `cuda`), nothing read back:
/// `stats` `[3]`, `[loss, correct, ‖g‖²]` — `loss` and `correct` (`[1]` each, on the inner
/// device) and the squared global L2 norm of every gradient in `grads` that belongs to `model` —
/// and `clip` `[1]`, the clip factor `min(1, grad_clip/(‖g‖ + 1e-6))` (1 for `grad_clip ≤ 0`),
/// in f32 ([`crate::kernels::cube::step_stats`]: two launches; with burn's fusion one lazy
/// operation in the stream).
///
/// # Panics
/// If a tensor is not on a CubeCL device.
#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
pub fn step_stats_on_device<M: Module>(
    model: &M,
    grads: &GradientsParams,
    loss: Tensor<1>,
    correct: Tensor<1>,
    grad_clip: f64,
) -> crate::kernels::cube::StepStats<Tensor<1>> {
    use crate::kernels::cube::CubePrimitives;
    type C = burn::backend::Cube;
    fn prim<const D: usize>(t: Tensor<D>) -> burn::backend::tensor::FloatTensor<C> {
        t.try_into_primitive::<C>()
            .expect("a wgpu or cuda tensor is a Cube primitive")
    }
    struct Collect<'a> {
        grads: &'a GradientsParams,
        prims: Vec<burn::backend::tensor::FloatTensor<C>>,
    }
    impl ModuleVisitor for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.grads.get::<D>(param.id) {
                self.prims.push(prim(g));
            }
        }
    }
    let mut v = Collect {
        grads,
        prims: Vec::new(),
    };
    model.visit(&mut v);
    let s = <C as CubePrimitives>::step_stats(v.prims, prim(loss), prim(correct), grad_clip as f32);
    crate::kernels::cube::StepStats {
        stats: Tensor::<1>::from_primitive::<C>(s.stats),
        clip: Tensor::<1>::from_primitive::<C>(s.clip),
    }
}

/// PyTorch's clip factor `min(1, max_norm/(norm + 1e-6))`; 1 when clipping is off.
pub fn clip_factor(norm: f64, max_norm: f64) -> f64 {
    if max_norm <= 0.0 {
        1.0
    } else {
        (max_norm / (norm + 1e-6)).min(1.0)
    }
}

/// A batch as tensors: inputs `[batch, seq]` ids, targets `[batch, seq]` ids, mask `[batch, seq]`.
pub struct Batch {
    /// Input token ids.
    pub inputs: Tensor<2, Int>,
    /// Target token ids.
    pub targets: Tensor<2, Int>,
    /// 1.0 where scored.
    pub mask: Tensor<2>,
    /// Number of scored positions.
    pub n_scored: usize,
}

/// Stack examples (all of length `seq`) into tensors on `device`.
pub fn to_batch(examples: &[Example], device: &Device) -> Batch {
    let (b, l) = (examples.len(), examples[0].input.len());
    let (inputs, targets, mask) = flat_batch(examples);
    let ids = |x: Vec<usize>| -> Vec<i64> { x.into_iter().map(|t| t as i64).collect() };
    let (inputs, targets) = (ids(inputs), ids(targets));
    let n_scored = mask.iter().filter(|&&m| m > 0.0).count();
    Batch {
        inputs: Tensor::from_data(TensorData::new(inputs, [b, l]), device),
        targets: Tensor::from_data(TensorData::new(targets, [b, l]), device),
        mask: Tensor::from_data(TensorData::new(mask, [b, l]), device),
        n_scored,
    }
}

/// A batch as flat host vectors `[batch · seq]`: input ids, target ids, mask (1.0 where scored).
pub fn flat_batch(examples: &[Example]) -> (Vec<usize>, Vec<usize>, Vec<f32>) {
    let n = examples.len() * examples.first().map_or(0, |e| e.input.len());
    let (mut inputs, mut targets, mut mask) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for ex in examples {
        inputs.extend(ex.input.iter().map(|&x| x as usize));
        targets.extend(ex.target.iter().map(|&x| x as usize));
        mask.extend(ex.mask.iter().map(|&m| if m { 1.0f32 } else { 0.0 }));
    }
    (inputs, targets, mask)
}

/// One point of a learning curve.
#[derive(Clone, Debug, PartialEq)]
pub struct CurvePoint {
    /// Optimiser steps taken before this measurement.
    pub step: usize,
    /// `train` (the step's own batch), `eval` (held-out stream) or `answers` (greedy answers on
    /// held-out problems of another size, `answer_ops`; iGSM with `answer_curve_min_ops > 0`).
    pub split: &'static str,
    /// Mean cross-entropy on scored positions, nats.
    pub loss: f64,
    /// Fraction of scored positions predicted exactly (argmax).
    pub accuracy: f64,
    /// Learning rate used at this step (train) or the next one (eval).
    pub lr: f64,
    /// Global gradient norm before clipping (train rows).
    pub grad_norm: Option<f64>,
    /// Run-level θ_eff at this evaluation (eval rows).
    pub effective_freq: Option<f64>,
    /// Standard deviation of θ_eff over evaluation batches (eval rows).
    pub effective_freq_batch_sd: Option<f64>,
    /// Entropy of the pooled spectrum, nats (eval rows).
    pub spectrum_entropy: Option<f64>,
    /// Argmax frequency of the pooled spectrum (eval rows).
    pub argmax_freq: Option<f64>,
    /// iGSM runs with `answer_curve > 0`: answer accuracy of greedy-decoded solutions of the first
    /// `answer_curve` held-out problems (eval rows after step 0; `split = "answers"` rows).
    pub answer_accuracy: Option<f64>,
    /// Operations of the problems `answer_accuracy` was decoded on: the run's `ops` on eval rows,
    /// `answer_curve_min_ops..ops` on `split = "answers"` rows; `None` where there is no answer.
    pub answer_ops: Option<usize>,
}

/// Spectrum of one layer/head at one evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadSpectrum {
    /// Step of the evaluation.
    pub step: usize,
    /// Layer index (0 = bottom).
    pub layer: usize,
    /// Head index.
    pub head: usize,
    /// Energy per pair `E_i` (mean over batches and causal pairs).
    pub energy: Vec<f64>,
}

/// Result of an evaluation.
#[derive(Clone, Debug)]
pub struct Evaluation {
    /// Mean loss on scored positions, nats.
    pub loss: f64,
    /// Accuracy on scored positions.
    pub accuracy: f64,
    /// Pooled spectrum summary.
    pub summary: probe::SpectrumSummary,
    /// Std of θ_eff over evaluation batches.
    pub effective_freq_batch_sd: f64,
    /// `energy[layer][head][pair]`, averaged over batches.
    pub energy: Vec<Vec<Vec<f64>>>,
    /// Wall time spent in the probe (copying q/k to the host and the energy sums), ms.
    pub probe_ms: f64,
    /// Wall time of the whole evaluation, ms.
    pub eval_ms: f64,
}

/// Evaluate `model` (any device; it is switched to the non-autodiff view) on the held-out
/// batches of `cfg`, with the frequency probe.
pub fn evaluate(model: &Transformer, cfg: &RunConfig, device: &Device) -> Evaluation {
    evaluate_with_progress(model, cfg, device, &mut |_, _| {})
}

/// Tokens of one forward pass of [`evaluate_with_progress`] (2^15): a batch whose
/// `batch_size · seq_len` is larger goes through the model in chunks of examples, so a long
/// context reports progress between them and holds less in memory at once. Contexts within it
/// (every training evaluation of the lab's presets) run in one pass, as before.
pub const EVAL_CHUNK_TOKENS: usize = 1 << 15;

/// [`evaluate`], calling `progress(examples done, examples in all)` after each forward pass
/// (one per batch, or per chunk of [`EVAL_CHUNK_TOKENS`] tokens at long contexts).
///
/// A batch split into chunks sums its loss, accuracy and probe energies over the chunks in
/// example order, so the batch's numbers are those of one pass up to the rounding of the
/// chunks' own forward passes (a matrix product over fewer rows may round otherwise).
pub fn evaluate_with_progress(
    model: &Transformer,
    cfg: &RunConfig,
    device: &Device,
    progress: &mut dyn FnMut(usize, usize),
) -> Evaluation {
    let start = Instant::now();
    let model = model.valid();
    let task = cfg.task();
    let spectrum = cfg.spectrum();
    let theta = spectrum.freqs;
    let eval_device = device.clone().inner();
    let (mut loss_sum, mut correct, mut scored) = (0.0f64, 0.0f64, 0usize);
    let mut energy_sum: Vec<Vec<Vec<f64>>> = Vec::new();
    let mut batch_theta = Vec::with_capacity(cfg.eval_batches);
    let mut probe_ms = 0.0;
    let chunk = (EVAL_CHUNK_TOKENS / cfg.seq_len.max(1)).clamp(1, cfg.batch_size.max(1));
    let total = cfg.eval_batches * cfg.batch_size;
    for i in 0..cfg.eval_batches {
        let examples = task
            .batch(
                cfg.seed,
                Split::Eval,
                (i * cfg.batch_size) as u64,
                cfg.batch_size,
            )
            .expect("config validated");
        // This batch's energy sums over its real pairs, and their number.
        let mut batch_sums: Vec<Vec<Vec<f64>>> = Vec::new();
        let mut batch_pairs = 0usize;
        for (c, part) in examples.chunks(chunk).enumerate() {
            let real = task.real_positions(part);
            let batch = to_batch(part, &eval_device);
            let (logits, qk) = model.forward_with_qk(batch.inputs.clone());
            let (loss, ok) = masked_cross_entropy_for(
                model.kernel,
                logits,
                batch.targets,
                batch.mask,
                batch.n_scored,
            );
            loss_sum += loss.into_scalar::<f32>() as f64 * batch.n_scored as f64;
            correct += ok.into_scalar::<f32>() as f64;
            scored += batch.n_scored;
            let t0 = Instant::now();
            let layers: Vec<(Vec<f32>, Vec<f32>)> = qk
                .into_iter()
                .map(|l| {
                    (
                        l.q.into_data().try_to_vec::<f32>().expect("f32 q"),
                        l.k.into_data().try_to_vec::<f32>().expect("f32 k"),
                    )
                })
                .collect();
            let (sums, pairs) = probe::layer_head_energy_sums(
                &layers,
                part.len(),
                cfg.n_heads,
                cfg.seq_len,
                cfg.head_dim(),
                &spectrum.map,
                real.as_deref(),
            );
            batch_pairs += pairs;
            if batch_sums.is_empty() {
                batch_sums = sums;
            } else {
                add_energies(&mut batch_sums, sums);
            }
            probe_ms += t0.elapsed().as_secs_f64() * 1e3;
            progress(i * cfg.batch_size + (c * chunk + part.len()), total);
        }
        let energy = probe::divide_energy(batch_sums, batch_pairs);
        batch_theta.push(probe::effective_freq(
            &probe::pooled_spectrum(&energy),
            &theta,
        ));
        if energy_sum.is_empty() {
            energy_sum = energy;
        } else {
            add_energies(&mut energy_sum, energy);
        }
    }
    let n = cfg.eval_batches as f64;
    for l in energy_sum.iter_mut() {
        for h in l.iter_mut() {
            for e in h.iter_mut() {
                *e /= n;
            }
        }
    }
    let summary = probe::summarise(&probe::pooled_spectrum(&energy_sum), &theta);
    let mean_theta = batch_theta.iter().sum::<f64>() / n;
    let sd = if batch_theta.len() > 1 {
        (batch_theta
            .iter()
            .map(|t| (t - mean_theta).powi(2))
            .sum::<f64>()
            / (n - 1.0))
            .sqrt()
    } else {
        0.0
    };
    Evaluation {
        loss: loss_sum / scored.max(1) as f64,
        accuracy: correct / scored.max(1) as f64,
        summary,
        effective_freq_batch_sd: sd,
        energy: energy_sum,
        probe_ms,
        eval_ms: start.elapsed().as_secs_f64() * 1e3,
    }
}

/// Mean loss (nats per scored token) and token accuracy of `model` on `cfg.eval_batches`
/// batches of `cfg.batch_size` examples of `split` (from example 0), without the frequency
/// probe: the validation metrics a selection chooses on (`split = Val`, docs/analysis-rules.md
/// R58). Chunked like [`evaluate_with_progress`] at long contexts.
pub fn split_loss(
    model: &Transformer,
    cfg: &RunConfig,
    device: &Device,
    split: Split,
) -> Result<(f64, f64), tasks::TaskError> {
    let model = model.valid();
    let task = cfg.task();
    let eval_device = device.clone().inner();
    let (mut loss_sum, mut correct, mut scored) = (0.0f64, 0.0f64, 0usize);
    let chunk = (EVAL_CHUNK_TOKENS / cfg.seq_len.max(1)).clamp(1, cfg.batch_size.max(1));
    for i in 0..cfg.eval_batches {
        let examples = task.batch(cfg.seed, split, (i * cfg.batch_size) as u64, cfg.batch_size)?;
        for part in examples.chunks(chunk) {
            let batch = to_batch(part, &eval_device);
            let logits = model.forward(batch.inputs.clone());
            let (loss, ok) = masked_cross_entropy_for(
                model.kernel,
                logits,
                batch.targets,
                batch.mask,
                batch.n_scored,
            );
            loss_sum += loss.into_scalar::<f32>() as f64 * batch.n_scored as f64;
            correct += ok.into_scalar::<f32>() as f64;
            scored += batch.n_scored;
        }
    }
    Ok((
        loss_sum / scored.max(1) as f64,
        correct / scored.max(1) as f64,
    ))
}

/// `acc[l][h][i] += e[l][h][i]`.
fn add_energies(acc: &mut [Vec<Vec<f64>>], e: Vec<Vec<Vec<f64>>>) {
    for (acc_l, e_l) in acc.iter_mut().zip(e) {
        for (acc_h, e_h) in acc_l.iter_mut().zip(e_l) {
            for (a, x) in acc_h.iter_mut().zip(e_h) {
                *a += x;
            }
        }
    }
}

/// What one optimiser step measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepResult {
    /// Mean loss on the batch's scored positions, nats.
    pub loss: f64,
    /// Correct argmax predictions on scored positions.
    pub correct: f64,
    /// Scored positions in the batch.
    pub n_scored: usize,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used.
    pub lr: f64,
}

/// One training step (forward, backward, global-norm clip, AdamW, projection of constrained
/// parameters) on `examples`, on the autodiff device `device`. A non-finite loss or gradient
/// norm, or a gradient norm above `cfg.max_grad_norm` (when > 0), returns `Err(reason)` and the
/// model unchanged.
pub fn train_step(
    model: Transformer,
    opt: &mut AdamW,
    cfg: &RunConfig,
    step: usize,
    examples: &[Example],
    device: &Device,
) -> (Transformer, Result<StepResult, String>) {
    step_with_checks(model, opt, cfg, step, examples, device, true)
}

/// [`train_step`]; with `checks` off, nothing depends on a value read back (the reads happen all
/// the same): no divergence check, and a non-finite clip factor taken as 1. That is the step
/// [`bench_train_step`] times under CubeCL's dry run, where every read returns whatever the
/// unwritten buffers hold.
fn step_with_checks(
    model: Transformer,
    opt: &mut AdamW,
    cfg: &RunConfig,
    step: usize,
    examples: &[Example],
    device: &Device,
    checks: bool,
) -> (Transformer, Result<StepResult, String>) {
    let batch = to_batch(examples, device);
    let logits = model.forward(batch.inputs);
    let (loss, correct) = masked_cross_entropy_for(
        model.kernel,
        logits,
        batch.targets,
        batch.mask,
        batch.n_scored,
    );
    #[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
    if step_reads() == StepReads::Once && !crate::kernels::is_flex(device) {
        let loss = ScoredLoss {
            loss,
            correct,
            n_scored: batch.n_scored,
        };
        return cube_step(model, opt, cfg, step, loss, checks);
    }
    let loss_value = loss.clone().into_scalar::<f32>() as f64;
    if checks && !loss_value.is_finite() {
        return (
            model,
            Err(format!("non-finite training loss ({loss_value})")),
        );
    }
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let norm = global_grad_norm(&model, &grads);
    if checks && !norm.is_finite() {
        return (model, Err(format!("non-finite gradient norm ({norm})")));
    }
    if checks && cfg.max_grad_norm > 0.0 && norm > cfg.max_grad_norm {
        return (
            model,
            Err(format!(
                "exploding gradients: norm {norm:.4e} > max_grad_norm = {:e}",
                cfg.max_grad_norm
            )),
        );
    }
    let lr = lr_at(step, cfg);
    let clip = match clip_factor(norm, cfg.grad_clip) {
        c if c.is_finite() => c,
        _ => 1.0,
    };
    let model = opt.step(model, lr, grads, clip).project();
    let result = StepResult {
        loss: loss_value,
        correct: correct.into_scalar::<f32>() as f64,
        n_scored: batch.n_scored,
        grad_norm: norm,
        lr,
    };
    (model, Ok(result))
}

/// When a training step on a CubeCL device (`wgpu`, `cuda`) reads its statistics back
/// (`LAB_STEP_READS`; flex always reads as it goes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepReads {
    /// Once, at the end, after every kernel of the step was issued, the clip factor computed on
    /// the device (the default; `cube_step`).
    Once,
    /// As it goes: the loss before the backward, the gradient norm before the update (its clip
    /// factor computed on the host), the correct count at the end — three waits for the device
    /// per step (the lab's path until 2026-12-05; kept to compare on a GPU).
    Each,
}

static STEP_READS: crate::kernels::Switch<StepReads> = crate::kernels::Switch::new(
    "LAB_STEP_READS",
    [("once", StepReads::Once), ("each", StepReads::Each)],
);

impl StepReads {
    /// Parse the value of `LAB_STEP_READS` (`None` when unset: `Once`).
    ///
    /// # Errors
    /// Anything but `once` or `each`: one line naming the variable and the values allowed.
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        STEP_READS.parse(value)
    }

    /// `once` or `each`, as `LAB_STEP_READS` spells it.
    pub fn name(self) -> &'static str {
        STEP_READS.name(self)
    }
}

/// Fix [`step_reads`] from `LAB_STEP_READS` for this process; later calls change nothing.
/// `Backend::device` calls it for `wgpu` and `cuda`.
///
/// # Errors
/// A value [`StepReads::parse`] refuses.
pub fn configure_step_reads() -> Result<StepReads, String> {
    STEP_READS.configure()
}

/// The [`StepReads`] that [`configure_step_reads`] fixed (`Once` when it was never called).
pub fn step_reads() -> StepReads {
    STEP_READS.get()
}

/// A batch's loss as [`masked_cross_entropy_for`] gives it, not yet read back.
#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
struct ScoredLoss {
    /// `[1]`, on the autodiff device.
    loss: Tensor<1>,
    /// Correct predictions among the scored positions, `[1]`.
    correct: Tensor<1>,
    /// Scored positions.
    n_scored: usize,
}

/// The rest of [`step_with_checks`] on a CubeCL device (`wgpu`, `cuda`): every kernel of the step
/// is issued before anything is read back — the backward, the squared gradient norm and the clip
/// factor `min(1, c/(‖g‖ + 1e-6))` on the device ([`step_stats_on_device`]), AdamW with that
/// factor ([`GradScale::Device`]) — and then the loss, the correct count and the squared norm
/// come back in one read, as PyTorch's loop does (`clip_grad_norm_` on the device,
/// one `loss.item()`). On flex the step reads the loss, then the norm, then the count as it
/// goes (a read there costs nothing, and the CPU's numbers stay as they were); here each read
/// waited for the device. What burn's fusion stream holds is submitted after the loss and after
/// the statistics ([`crate::kernels::cube::submit_pending`]: the kernels queued, no wait), so the
/// device works on one part while the host records the next (docs/performance.md, "One read per
/// step"). The norm and the factor are f32 here (f64 on the host before). On a failed check the
/// model returned is the one before the step; the optimiser's moments have taken it (the run
/// stops there). `LAB_STEP_READS=each` ([`StepReads`]) keeps the reading step instead.
#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
fn cube_step(
    model: Transformer,
    opt: &mut AdamW,
    cfg: &RunConfig,
    step: usize,
    scored: ScoredLoss,
    checks: bool,
) -> (Transformer, Result<StepResult, String>) {
    let ScoredLoss {
        loss,
        correct,
        n_scored,
    } = scored;
    // The forward and the loss go to the device now, while the host records the backward.
    crate::kernels::cube::submit_pending(&loss.clone().inner());
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let s = step_stats_on_device(&model, &grads, loss.inner(), correct.inner(), cfg.grad_clip);
    // The backward and the statistics too, while the host records the update.
    crate::kernels::cube::submit_pending(&s.clip);
    let scale = if cfg.grad_clip > 0.0 {
        GradScale::Device(s.clip)
    } else {
        GradScale::Host(1.0)
    };
    let lr = lr_at(step, cfg);
    let before = checks.then(|| model.clone());
    let model = opt.step(model, lr, grads, scale).project();
    let read = s
        .stats
        .into_data()
        .try_to_vec::<f32>()
        .expect("f32 step statistics");
    let (loss_value, correct, norm) = (read[0] as f64, read[1] as f64, (read[2] as f64).sqrt());
    if let Some(before) = before {
        let failed = if !loss_value.is_finite() {
            Some(format!("non-finite training loss ({loss_value})"))
        } else if !norm.is_finite() {
            Some(format!("non-finite gradient norm ({norm})"))
        } else if cfg.max_grad_norm > 0.0 && norm > cfg.max_grad_norm {
            Some(format!(
                "exploding gradients: norm {norm:.4e} > max_grad_norm = {:e}",
                cfg.max_grad_norm
            ))
        } else {
            None
        };
        if let Some(reason) = failed {
            return (before, Err(reason));
        }
    }
    let result = StepResult {
        loss: loss_value,
        correct,
        n_scored,
        grad_norm: norm,
        lr,
    };
    (model, Ok(result))
}

/// Median wall time of training steps, measured after `warmup` untimed steps.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StepBench {
    /// Median ms per step (forward, backward, AdamW; data generation excluded).
    pub ms_per_step: f64,
    /// Training tokens per second at the median step time.
    pub tokens_per_s: f64,
    /// Timed steps.
    pub steps: usize,
    /// Wall ms of the very first step (warm-up or timed): on CubeCL backends it holds the
    /// kernels' just-in-time compilation and autotuning, which the median leaves out.
    pub first_step_ms: f64,
    /// On a CubeCL backend with `profile_steps > 0`: the kernel launches of that many more steps
    /// after the timed ones, each timed on the device ([`crate::kernels::launches`]); `None`
    /// otherwise.
    pub launches: Option<crate::kernels::launches::LaunchProfile>,
    /// The steps [`launches`](Self::launches) covers (0 without it).
    pub profile_steps: usize,
    /// On a CubeCL backend with `profile_steps > 0`: the median wall ms of that many more steps
    /// run under CubeCL's dry run (`cubecl::dry_run::DryRun`: every launch is prepared, compiled
    /// if new, and dropped before the device), i.e. the step's host work alone — burn's
    /// autodiff, fusion and CubeCL's client — without the device's work and without the
    /// server's encoding of each dispatch (so a lower bound of the host's share). `None`
    /// otherwise, or if those steps failed.
    pub host_ms_per_step: Option<f64>,
}

/// Time `steps` training steps of `cfg`'s model after `warmup` steps (batches pre-generated):
/// through burn on `device`, or on the whole-step fast path when `cfg.attention` is `fast` and
/// `device` is the CPU (flex). `progress(step, ms)` is called after every step, warm-up
/// included (`step` counts from 0 over `warmup + steps`), so a caller can show where a slow
/// first step goes before the median is known. On a CubeCL backend, `profile_steps` more steps
/// then run with every kernel launch counted and timed ([`StepBench::launches`]; they are not in
/// the median, since timing each launch adds host work); `progress` is not called for them.
pub fn bench_train_step(
    cfg: &RunConfig,
    warmup: usize,
    steps: usize,
    profile_steps: usize,
    device: &Device,
    progress: &mut dyn FnMut(usize, f64),
) -> StepBench {
    let profile_steps = if crate::kernels::is_flex(device) {
        0
    } else {
        profile_steps
    };
    let batches: Vec<Vec<Example>> = (0..warmup + steps + 2 * profile_steps)
        .map(|s| cfg.train_batch(s).expect("config validated"))
        .collect();
    let mut times = Vec::with_capacity(steps);
    let mut first_step_ms = f64::NAN;
    let mut timed = |s: usize, run: &mut dyn FnMut()| {
        let t0 = Instant::now();
        run();
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        if s == 0 {
            first_step_ms = ms;
        }
        if s >= warmup {
            times.push(ms);
        }
        progress(s, ms);
    };
    let ad_device = device.clone().autodiff();
    let model = cfg.model().init(cfg.seed, &ad_device);
    let mut launches = None;
    let mut host_ms_per_step = None;
    if cfg.attention == AttentionKernel::Fast && crate::kernels::is_flex(device) {
        let mut fast = FastModel::from_burn(&model, &cfg.model());
        let mut opt = FastAdamW::new(cfg.beta1, cfg.beta2, cfg.adam_eps, cfg.weight_decay);
        for (s, examples) in batches.iter().enumerate() {
            timed(s, &mut || {
                fast_train_step(&mut fast, &mut opt, cfg, s, examples)
                    .expect("benchmark step diverged");
            });
        }
    } else {
        let mut model = Some(model);
        let mut opt = AdamW::new(cfg.beta1, cfg.beta2, cfg.adam_eps, cfg.weight_decay);
        let mut step = |s: usize, checks: bool| {
            let m = model.take().expect("a model between steps");
            let (next, r) = step_with_checks(m, &mut opt, cfg, s, &batches[s], &ad_device, checks);
            model = Some(next);
            r.expect("benchmark step diverged");
        };
        for s in 0..warmup + steps {
            timed(s, &mut || step(s, true));
        }
        if profile_steps > 0 {
            // Every launch of the timed steps issued and finished first (burn's fusion holds
            // operations until something reads a tensor), so the pass holds exactly its own.
            let _ = device.sync();
            // A failure here (a device error while timing) loses only the launch profile: the
            // timing above is already taken.
            let profiled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::kernels::launches::observe(true, || {
                    for s in warmup + steps..warmup + steps + profile_steps {
                        step(s, true);
                    }
                    let _ = device.sync();
                })
            }));
            launches = match profiled {
                Ok(((), profile)) => profile,
                Err(_) => {
                    eprintln!("train-step: the profiled steps failed; no launch profile");
                    None
                }
            };
            // Then the host's share alone: the same steps with every launch dropped. Last, since
            // the model's values are garbage afterwards (its buffers were never written).
            let start = warmup + steps + profile_steps;
            let dry = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::kernels::launches::dry_run(|| {
                    let mut ms: Vec<f64> = (start..start + profile_steps)
                        .map(|s| {
                            let t0 = Instant::now();
                            step(s, false);
                            let _ = device.sync();
                            t0.elapsed().as_secs_f64() * 1e3
                        })
                        .collect();
                    median(&mut ms)
                })
            }));
            host_ms_per_step = match dry {
                Ok(ms) => ms,
                Err(_) => {
                    eprintln!("train-step: the dry-run steps failed; no host time");
                    None
                }
            };
        }
    }
    let ms = median(&mut times);
    StepBench {
        ms_per_step: ms,
        tokens_per_s: (cfg.batch_size * cfg.seq_len) as f64 / (ms / 1e3),
        steps,
        first_step_ms,
        profile_steps: if launches.is_some() { profile_steps } else { 0 },
        launches,
        host_ms_per_step,
    }
}

/// One training step on the fast path ([`crate::fast`]), with [`train_step`]'s rules: forward and
/// backward, the divergence checks (non-finite loss or gradient norm, `max_grad_norm`), the
/// global-norm clip at `grad_clip`, AdamW at `lr_at(step)`, PoPE's δ projection.
///
/// # Errors
/// The reason in words when the step diverged (the model is then unchanged).
pub fn fast_train_step(
    model: &mut FastModel,
    opt: &mut FastAdamW,
    cfg: &RunConfig,
    step: usize,
    examples: &[Example],
) -> Result<StepResult, String> {
    let (batch, seq) = (examples.len(), examples[0].input.len());
    let (tokens, targets, mask) = flat_batch(examples);
    // The whole pass on one of rayon's workers: the kernels' parallel loops then split work
    // among the workers instead of each being sent to the pool from outside and waited for
    // (a futex sleep and wake per loop).
    // Right-padded tasks (iGSM) drop what follows each sequence's last scored position
    // ([`FastModel::forward_backward_trimmed`]); the others run the whole batch.
    let out =
        rayon::scope(|_| model.forward_backward_trimmed(&tokens, &targets, &mask, batch, seq));
    if !out.loss.is_finite() {
        return Err(format!("non-finite training loss ({})", out.loss));
    }
    let norm = crate::fast::global_grad_norm(&out.grads);
    if !norm.is_finite() {
        return Err(format!("non-finite gradient norm ({norm})"));
    }
    if cfg.max_grad_norm > 0.0 && norm > cfg.max_grad_norm {
        return Err(format!(
            "exploding gradients: norm {norm:.4e} > max_grad_norm = {:e}",
            cfg.max_grad_norm
        ));
    }
    let lr = lr_at(step, cfg);
    opt.step(model, &out.grads, lr, clip_factor(norm, cfg.grad_clip));
    model.project();
    Ok(StepResult {
        loss: out.loss,
        correct: out.correct as f64,
        n_scored: mask.iter().filter(|&&m| m > 0.0).count(),
        grad_norm: norm,
        lr,
    })
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum RunStatus {
    /// All steps done.
    Done,
    /// Stopped early.
    Failed {
        /// Step at which it stopped.
        step: usize,
        /// Why, in words.
        reason: String,
    },
}

/// Everything a training run produces.
#[derive(Clone, Debug)]
pub struct TrainOutcome {
    /// Final status.
    pub status: RunStatus,
    /// Train rows (every step) and eval rows (every evaluation).
    pub curves: Vec<CurvePoint>,
    /// Per-head spectra at every evaluation.
    pub spectra: Vec<HeadSpectrum>,
    /// Evaluation at step 0.
    pub initial: Option<Evaluation>,
    /// Last evaluation.
    pub last: Option<Evaluation>,
    /// Wall time of the whole run, seconds.
    pub wall_time_s: f64,
    /// Median wall time of a training step (forward, backward, update), ms.
    pub ms_per_step: f64,
    /// Training tokens per second over the training steps.
    pub tokens_per_s: f64,
    /// Mean probe time per evaluation, ms.
    pub probe_ms: f64,
    /// iGSM only: answer accuracy of greedy-decoded solutions (set by the sweep runner, see
    /// [`crate::decode`]).
    pub answer_accuracy: Option<f64>,
    /// iGSM only: share of greedy-decoded solutions that pass the checker.
    pub solution_valid: Option<f64>,
    /// iGSM only: teacher-forced accuracy on the solution's characters by
    /// [`crate::decode::SolutionRole`] (in `SolutionRole::ALL` order; `NaN` for a role with no
    /// character), set by the sweep runner.
    pub solution_role_accuracy: Option<[f64; 8]>,
    /// iGSM only: answer accuracy of greedy-decoded solutions of unseen problems of *training*
    /// structures ([`crate::decode::ProblemSet::TrainStructures`]), beside `answer_accuracy` on
    /// held-out structures.
    pub answer_accuracy_train_structures: Option<f64>,
    /// iGSM only: teacher-forced accuracy on the definitions (copied from the problem) of the same
    /// training-structure problems.
    pub acc_tf_definition_train_structures: Option<f64>,
    /// Indirect indexing only: held-out accuracy on examples with shift `k = 0` (the answer is the
    /// query letter; set by the sweep runner, see [`crate::indirect`]).
    pub acc_shift0: Option<f64>,
    /// Indirect indexing only: held-out accuracy on examples with `k ≠ 0`.
    pub acc_shift_nonzero: Option<f64>,
    /// Validation loss (nats per scored token) and token accuracy of the final model on
    /// [`tasks::Split::Val`] ([`split_loss`]; `eval_batches` batches), what a selection chooses on
    /// (docs/analysis-rules.md R58); `None` for a failed run.
    pub val: Option<(f64, f64)>,
    /// `stop = "spectrum"`: the step at which every layer's θ_eff had converged and training
    /// stopped (docs/analysis-rules.md, R3); `None` when the cap `steps` was reached or the rule
    /// is `steps`.
    pub converged_step: Option<usize>,
    /// Block task: the dependency width of the run's training data from its MI profile
    /// (docs/analysis-rules.md, R4; set by the sweep runner); `None` when nothing is significant.
    pub dep_width_mi: Option<usize>,
    /// What each layer attends to at the end: `[layer][lag]`, the mean attention weight at lag
    /// `Δ = t − s` over the scored queries of up to 16 held-out sequences and over heads (each
    /// layer's profile sums to 1; see [`attention_lag_profiles`]). `None` for a failed run or a
    /// context longer than [`ATTENTION_PROBE_MAX_SEQ`].
    pub attention_lags: Option<Vec<Vec<f64>>>,
}

/// Longest context for which [`attention_lag_profiles`] runs (it materialises `seq × seq` weights
/// per head); longer runs get no profile.
pub const ATTENTION_PROBE_MAX_SEQ: usize = 1024;

/// Most held-out sequences [`attention_lag_profiles`] averages over.
pub const ATTENTION_PROBE_EXAMPLES: usize = 16;

/// Each layer's attention lag profile (`[layer][lag]`, sums to 1 per layer): the mean attention
/// weight at lag `Δ = t − s` over the scored query positions of the first
/// `min(batch_size, ATTENTION_PROBE_EXAMPLES)` held-out sequences of `cfg` and over heads
/// ([`probe::attention_lag_sums`]). One layer's weights are held at a time. `None` when
/// `seq_len > ATTENTION_PROBE_MAX_SEQ`.
pub fn attention_lag_profiles(
    model: &Transformer,
    cfg: &RunConfig,
    device: &Device,
) -> Option<Vec<Vec<f64>>> {
    if cfg.seq_len > ATTENTION_PROBE_MAX_SEQ {
        return None;
    }
    let model = model.valid();
    let eval_device = device.clone().inner();
    let n_examples = cfg.batch_size.min(ATTENTION_PROBE_EXAMPLES);
    let examples = cfg
        .task()
        .batch(cfg.seed, Split::Eval, 0, n_examples)
        .expect("config validated");
    let batch = to_batch(&examples, &eval_device);
    let seq = cfg.seq_len;
    let (_, qk) = model.forward_with_qk(batch.inputs);
    let queries: Vec<Vec<usize>> = examples
        .iter()
        .map(|ex| (0..seq).filter(|&t| ex.mask[t]).collect())
        .collect();
    let profiles = qk
        .into_iter()
        .enumerate()
        .map(|(layer, crate::model::LayerQk { q, k })| {
            let w = model
                .attention_probs(layer, q, k)
                .into_data()
                .try_to_vec::<f32>()
                .expect("f32 weights");
            let mut sums = vec![0.0f64; seq];
            let mut n = 0usize;
            for (b, queries) in queries.iter().enumerate() {
                for h in 0..cfg.n_heads {
                    let off = (b * cfg.n_heads + h) * seq * seq;
                    let s = probe::attention_lag_sums(&w[off..off + seq * seq], seq, queries);
                    for (a, x) in sums.iter_mut().zip(s) {
                        *a += x;
                    }
                    n += queries.len();
                }
            }
            sums.iter().map(|x| x / n.max(1) as f64).collect()
        })
        .collect();
    Some(profiles)
}

/// Whether the spectrum has converged (docs/analysis-rules.md, R3): `history[e][l]` is θ_eff of
/// layer `l` at evaluation `e` (oldest first). True when there are at least `window + 1`
/// evaluations and, for every layer, `max − min` of `ln θ_eff` over the last `window + 1` of them
/// is at most `tol`.
pub fn spectrum_converged(history: &[Vec<f64>], window: usize, tol: f64) -> bool {
    if history.len() < window + 1 {
        return false;
    }
    let recent = &history[history.len() - window - 1..];
    let n_layers = recent[0].len();
    (0..n_layers).all(|l| {
        let logs = recent.iter().map(|e| e[l].ln());
        let (lo, hi) = logs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
        hi - lo <= tol
    })
}

/// θ_eff of each layer's spectrum ([`probe::layer_spectra`]) on the grid `theta`.
pub fn layer_effective_freqs(energy: &[Vec<Vec<f64>>], theta: &[f64]) -> Vec<f64> {
    probe::layer_spectra(energy)
        .iter()
        .map(|p| probe::effective_freq(p, theta))
        .collect()
}

/// What [`train`] reports while it runs: once after every optimiser step, and once more after
/// every evaluation (every `eval_every` steps and at the last step).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Progress {
    /// An optimiser step finished.
    Step {
        /// The step just done, 1-based.
        step: usize,
        /// The run's `steps`.
        steps: usize,
        /// Its mean training loss, nats per scored token.
        train_loss: f64,
    },
    /// The held-out evaluation after step `step`.
    Eval {
        /// The step it follows, 1-based.
        step: usize,
        /// The run's `steps`.
        steps: usize,
        /// Mean held-out loss on `eval_batches` batches, nats per scored token.
        loss: f64,
        /// Held-out token accuracy on the same batches.
        accuracy: f64,
        /// θ_eff of the whole model on the same batches, rad/token (SCIENCE.md §3).
        effective_freq: f64,
        /// iGSM runs with `answer_curve > 0`: greedy answer accuracy on that many held-out
        /// problems; `None` otherwise.
        answer_accuracy: Option<f64>,
    },
}

/// Train a model for `cfg` on `device` (an autodiff device is made from it). `progress` is
/// called after every step and every evaluation ([`Progress`]). Returns the outcome and the
/// final model (as of the last completed step).
pub fn train(
    cfg: &RunConfig,
    device: &Device,
    progress: &mut dyn FnMut(&Progress),
) -> (TrainOutcome, Transformer) {
    let start = Instant::now();
    let ad_device = device.clone().autodiff();
    let mut model = cfg.model().init(cfg.seed, &ad_device);
    let mut opt = AdamW::new(cfg.beta1, cfg.beta2, cfg.adam_eps, cfg.weight_decay);
    // `attention = "fast"` on the CPU: the steps run on the fast path's buffers, and `model` is
    // refreshed from them before each evaluation and at the end (crate::fast).
    let mut fast = (cfg.attention == AttentionKernel::Fast && crate::kernels::is_flex(device))
        .then(|| {
            let mcfg = cfg.model();
            (
                FastModel::from_burn(&model, &mcfg),
                FastAdamW::new(cfg.beta1, cfg.beta2, cfg.adam_eps, cfg.weight_decay),
            )
        });
    let mut curves = Vec::new();
    let mut spectra = Vec::new();
    let mut step_ms = Vec::with_capacity(cfg.steps);
    let mut probe_ms = Vec::new();
    let mut status = RunStatus::Done;

    let mut record_eval = |step: usize, ev: &Evaluation, curves: &mut Vec<CurvePoint>| {
        curves.push(CurvePoint {
            step,
            split: "eval",
            loss: ev.loss,
            accuracy: ev.accuracy,
            lr: lr_at(step.min(cfg.steps - 1), cfg),
            grad_norm: None,
            effective_freq: Some(ev.summary.effective_freq),
            effective_freq_batch_sd: Some(ev.effective_freq_batch_sd),
            spectrum_entropy: Some(ev.summary.entropy),
            argmax_freq: Some(ev.summary.argmax_freq),
            answer_accuracy: None,
            answer_ops: None,
        });
        for (layer, heads) in ev.energy.iter().enumerate() {
            for (head, e) in heads.iter().enumerate() {
                spectra.push(HeadSpectrum {
                    step,
                    layer,
                    head,
                    energy: e.clone(),
                });
            }
        }
        probe_ms.push(ev.probe_ms);
    };

    let initial = evaluate(&model, cfg, device);
    record_eval(0, &initial, &mut curves);
    let theta = cfg.freq_grid();
    let mut layer_history = vec![layer_effective_freqs(&initial.energy, &theta)];
    let mut converged_step = None;
    let mut last = None;
    for step in 0..cfg.steps {
        let t0 = Instant::now();
        let examples = cfg.train_batch(step).expect("config validated");
        let result = match &mut fast {
            Some((fm, fopt)) => fast_train_step(fm, fopt, cfg, step, &examples),
            None => {
                let (next, result) = train_step(model, &mut opt, cfg, step, &examples, &ad_device);
                model = next;
                result
            }
        };
        let r = match result {
            Ok(r) => r,
            Err(reason) => {
                status = RunStatus::Failed { step, reason };
                break;
            }
        };
        step_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        let loss_value = r.loss;
        curves.push(CurvePoint {
            step: step + 1,
            split: "train",
            loss: r.loss,
            accuracy: r.correct / r.n_scored.max(1) as f64,
            lr: r.lr,
            grad_norm: Some(r.grad_norm),
            effective_freq: None,
            effective_freq_batch_sd: None,
            spectrum_entropy: None,
            argmax_freq: None,
            answer_accuracy: None,
            answer_ops: None,
        });
        progress(&Progress::Step {
            step: step + 1,
            steps: cfg.steps,
            train_loss: loss_value,
        });
        let done = step + 1;
        if done % cfg.eval_every == 0 || done == cfg.steps {
            if let Some((fm, _)) = &fast {
                model = fm.write_into(model, &ad_device);
            }
            let ev = evaluate(&model, cfg, device);
            record_eval(done, &ev, &mut curves);
            let mut answer_accuracy = None;
            if cfg.answer_curve > 0 && cfg.task.kind() == crate::config::TaskKind::Igsm {
                let held_out = crate::decode::ProblemSet::HeldOut;
                let g =
                    crate::decode::igsm_generation(&model, cfg, device, cfg.answer_curve, held_out);
                answer_accuracy = Some(g.answer_accuracy);
                if let Some(point) = curves.last_mut() {
                    point.answer_accuracy = answer_accuracy;
                    point.answer_ops = igsm_ops(cfg);
                }
                curves.extend(smaller_answer_points(&model, cfg, device, done));
            }
            progress(&Progress::Eval {
                step: done,
                steps: cfg.steps,
                loss: ev.loss,
                accuracy: ev.accuracy,
                effective_freq: ev.summary.effective_freq,
                answer_accuracy,
            });
            layer_history.push(layer_effective_freqs(&ev.energy, &theta));
            last = Some(ev);
            if cfg.stop == StopRule::Spectrum
                && done >= cfg.min_steps
                && done < cfg.steps
                && spectrum_converged(&layer_history, cfg.stop_window, cfg.stop_tol)
            {
                converged_step = Some(done);
                break;
            }
        }
    }
    if let Some((fm, _)) = &fast {
        model = fm.write_into(model, &ad_device);
    }
    let train_s: f64 = step_ms.iter().sum::<f64>() / 1e3;
    let tokens = (step_ms.len() * cfg.batch_size * cfg.seq_len) as f64;
    let attention_lags = if status == RunStatus::Done {
        attention_lag_profiles(&model, cfg, device)
    } else {
        None
    };
    let val = if status == RunStatus::Done {
        split_loss(&model, cfg, device, Split::Val).ok()
    } else {
        None
    };
    let outcome = TrainOutcome {
        status,
        curves,
        spectra,
        initial: Some(initial),
        last,
        wall_time_s: start.elapsed().as_secs_f64(),
        ms_per_step: median(&mut step_ms),
        tokens_per_s: if train_s > 0.0 { tokens / train_s } else { 0.0 },
        probe_ms: probe_ms.iter().sum::<f64>() / probe_ms.len().max(1) as f64,
        answer_accuracy: None,
        solution_valid: None,
        solution_role_accuracy: None,
        answer_accuracy_train_structures: None,
        acc_tf_definition_train_structures: None,
        acc_shift0: None,
        acc_shift_nonzero: None,
        val,
        converged_step,
        dep_width_mi: None,
        attention_lags,
    };
    (outcome, model)
}

/// The `ops` of an iGSM run (`None` for other tasks).
fn igsm_ops(cfg: &RunConfig) -> Option<usize> {
    match &cfg.task {
        crate::config::TaskConfig::Igsm(p) => Some(p.ops),
        _ => None,
    }
}

/// `cfg` with its iGSM problems of exactly `ops` operations (no training mixture); other tasks
/// unchanged.
fn with_igsm_ops(cfg: &RunConfig, ops: usize) -> RunConfig {
    let mut c = cfg.clone();
    if let crate::config::TaskConfig::Igsm(p) = &mut c.task {
        p.ops = ops;
        p.min_ops = None;
    }
    c
}

/// The `split = "answers"` curve points of one evaluation after step `step`: greedy answer
/// accuracy on `answer_curve` held-out problems of each size `answer_curve_min_ops..ops`
/// (issue 19: learning curves of answer accuracy per `ops`, here of one model), for a run with
/// `answer_curve > 0` (the caller's condition). Empty unless `answer_curve_min_ops > 0`. `loss`
/// is NaN on these rows (no loss is computed); `accuracy` repeats the answer accuracy.
fn smaller_answer_points(
    model: &Transformer,
    cfg: &RunConfig,
    device: &Device,
    step: usize,
) -> Vec<CurvePoint> {
    let Some(ops) = igsm_ops(cfg) else {
        return Vec::new();
    };
    if cfg.answer_curve_min_ops == 0 {
        return Vec::new();
    }
    (cfg.answer_curve_min_ops..ops)
        .map(|o| {
            let g = crate::decode::igsm_generation(
                model,
                &with_igsm_ops(cfg, o),
                device,
                cfg.answer_curve,
                crate::decode::ProblemSet::HeldOut,
            );
            CurvePoint {
                step,
                split: "answers",
                loss: f64::NAN,
                accuracy: g.answer_accuracy,
                lr: lr_at(step.min(cfg.steps - 1), cfg),
                grad_norm: None,
                effective_freq: None,
                effective_freq_batch_sd: None,
                spectrum_entropy: None,
                argmax_freq: None,
                answer_accuracy: Some(g.answer_accuracy),
                answer_ops: Some(o),
            }
        })
        .collect()
}

/// Median of `xs` (0 when empty).
pub fn median(xs: &mut [f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::tiny;
    use crate::config::{TaskConfig, TaskGen};

    /// Issue 51, item 1: the same right-padded problems at two context lengths (more padding at
    /// the longer one) give the same loss, accuracy and θ_eff, for every encoding with a
    /// spectrum: the probe counts real pairs only. Before, θ_eff moved with the padding.
    #[test]
    fn theta_eff_does_not_depend_on_padding() {
        for (task, enc) in [
            ("igsm", crate::model::Encoding::Rope),
            ("igsm", crate::model::Encoding::Pope),
            ("igsm", crate::model::Encoding::Tapa),
            ("indirect", crate::model::Encoding::Rope),
        ] {
            let mut cfg = tiny();
            cfg.task = match task {
                "igsm" => TaskConfig::Igsm(tasks::igsm::IgsmParams {
                    ops: 2,
                    distractors: 0,
                    ..Default::default()
                }),
                _ => TaskConfig::Indirect(Default::default()),
            };
            cfg.vocab_size = cfg.task().vocab_needed().unwrap();
            cfg.encoding = enc.into();
            cfg.d_model = 32;
            cfg.n_heads = 2;
            let generator = cfg.task.generator(cfg.vocab_size, 1 << 12);
            let needed = match generator {
                TaskGen::Igsm(c) => c.min_seq_len(),
                _ => 48,
            };
            cfg.seq_len = needed;
            let device = Device::flex();
            let model = cfg.model().init(cfg.seed, &device);
            let short = evaluate(&model, &cfg, &device);
            let mut long_cfg = cfg.clone();
            long_cfg.seq_len = needed * 3;
            let long = evaluate(&model, &long_cfg, &device);
            let rel = |a: f64, b: f64| (a - b).abs() / a.abs().max(1e-30);
            assert!(rel(short.loss, long.loss) < 1e-5, "{task} {enc:?}: loss");
            assert_eq!(short.accuracy, long.accuracy, "{task} {enc:?}");
            assert!(
                rel(short.summary.effective_freq, long.summary.effective_freq) < 1e-5,
                "{task} {enc:?}: θ_eff {} at seq_len {needed} vs {} at {}",
                short.summary.effective_freq,
                long.summary.effective_freq,
                needed * 3
            );
        }
    }

    #[test]
    fn schedule_warms_up_then_decays_to_floor() {
        let mut c = tiny();
        c.steps = 10;
        c.warmup_steps = 2;
        c.lr = 1.0;
        c.min_lr_ratio = 0.1;
        assert!((lr_at(0, &c) - 0.5).abs() < 1e-12);
        assert!((lr_at(1, &c) - 1.0).abs() < 1e-12);
        assert!((lr_at(2, &c) - 1.0).abs() < 1e-12);
        // Halfway through the decay: 0.1 + 0.9·0.5 = 0.55.
        assert!((lr_at(6, &c) - 0.55).abs() < 1e-12);
        assert!((lr_at(10, &c) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn clip_factor_matches_pytorch() {
        assert_eq!(clip_factor(0.5, 1.0), 1.0);
        assert!((clip_factor(4.0, 1.0) - 1.0 / (4.0 + 1e-6)).abs() < 1e-15);
        assert_eq!(clip_factor(1e9, 0.0), 1.0);
    }

    /// `LAB_ADAMW`: unset or blank is `fused`; `fused` and `ops` by name; anything else refused
    /// in one line naming the variable and the values.
    #[test]
    fn parse_lab_adamw() {
        assert_eq!(AdamWKernel::parse(None), Ok(AdamWKernel::Fused));
        assert_eq!(AdamWKernel::parse(Some(" ")), Ok(AdamWKernel::Fused));
        assert_eq!(AdamWKernel::parse(Some("fused")), Ok(AdamWKernel::Fused));
        assert_eq!(AdamWKernel::parse(Some("ops")), Ok(AdamWKernel::Ops));
        assert_eq!(AdamWKernel::Ops.name(), "ops");
        let err = AdamWKernel::parse(Some("foreach")).unwrap_err();
        assert_eq!(
            err,
            "LAB_ADAMW = `foreach`: allowed values are fused (the default) or ops"
        );
        // A fixed kernel wins over the process's setting.
        let opt = AdamW::new(0.9, 0.95, 1e-8, 0.0).with_kernel(AdamWKernel::Ops);
        assert_eq!(opt.kernel(), AdamWKernel::Ops);
    }

    /// `LAB_STEP_READS`: unset or empty is `once`; `once` and `each` by name; anything else
    /// refused in one line naming the variable and the values.
    #[test]
    fn parse_lab_step_reads() {
        assert_eq!(StepReads::parse(None), Ok(StepReads::Once));
        assert_eq!(StepReads::parse(Some(" ")), Ok(StepReads::Once));
        assert_eq!(StepReads::parse(Some("once")), Ok(StepReads::Once));
        assert_eq!(StepReads::parse(Some("each")), Ok(StepReads::Each));
        assert_eq!(StepReads::Each.name(), "each");
        for bad in ["Once", "twice", "1"] {
            let err = StepReads::parse(Some(bad)).unwrap_err();
            assert_eq!(
                err,
                format!("LAB_STEP_READS = `{bad}`: allowed values are once (the default) or each")
            );
        }
    }

    /// One AdamW step on a hand-computed case: a [1, 2] matrix and a [2] vector.
    #[test]
    fn adamw_step_matches_hand_computation() {
        #[derive(Module, Debug)]
        struct Toy {
            w: Param<Tensor<2>>,
            b: Param<Tensor<1>>,
        }
        let device = Device::flex().autodiff();
        let toy = Toy {
            w: Param::from_data(TensorData::new(vec![1.0f32, -2.0], [1, 2]), &device),
            b: Param::from_data(TensorData::new(vec![0.5f32, 0.5], [2]), &device),
        };
        // loss = sum(w ⊙ [3, 4]) + sum(b ⊙ b)  → dL/dw = [3, 4], dL/db = 2b = [1, 1].
        let c = Tensor::<2>::from_data(TensorData::new(vec![3.0f32, 4.0], [1, 2]), &device);
        let loss = (toy.w.val() * c).sum() + toy.b.val().square().sum();
        let grads = GradientsParams::from_grads(loss.backward(), &toy);
        // Global norm sqrt(9 + 16 + 1 + 1) = sqrt(27).
        let norm = global_grad_norm(&toy, &grads);
        assert!((norm - 27f64.sqrt()).abs() < 1e-5);
        let mut opt = AdamW::new(0.9, 0.95, 1e-8, 0.1);
        let lr = 0.01;
        let toy = opt.step(toy, lr, grads, 1.0);
        // First step: m̂ = g, v̂ = g², update = g/(|g| + ε) ≈ sign(g).
        // w ← w(1 − lr·0.1) − lr·sign(g);  b (vector) is not decayed.
        let w = toy.w.val().into_data().try_to_vec::<f32>().unwrap();
        let b = toy.b.val().into_data().try_to_vec::<f32>().unwrap();
        assert!((w[0] - (1.0 * (1.0 - 0.001) - 0.01)).abs() < 1e-6, "{w:?}");
        assert!((w[1] - (-2.0 * (1.0 - 0.001) - 0.01)).abs() < 1e-6, "{w:?}");
        assert!((b[0] - (0.5 - 0.01)).abs() < 1e-6, "{b:?}");
        assert!(toy.w.val().is_require_grad());
    }

    /// `answer_curve_min_ops`: every evaluation after step 0 carries the run's own `ops` on its
    /// eval row and one `answers` row per smaller size, in order; the last ones equal a fresh
    /// decoding of the final model at that size (same problems, same weights).
    #[test]
    fn answer_curves_per_ops_on_one_model() {
        let mut c = tiny();
        c.task = crate::config::TaskConfig::Igsm(tasks::igsm::IgsmParams {
            ops: 4,
            distractors: 0,
            min_ops: Some(1),
            ..Default::default()
        });
        c.vocab_size = 72;
        c.seq_len = 144;
        c.steps = 4;
        c.eval_every = 2;
        c.answer_curve = 3;
        c.answer_curve_min_ops = 2;
        c.validate().unwrap();
        let device = Device::flex();
        let (out, model) = train(&c, &device, &mut |_| {});
        assert_eq!(out.status, RunStatus::Done);
        let evals: Vec<(usize, Option<usize>)> = out
            .curves
            .iter()
            .filter(|p| p.split == "eval")
            .map(|p| (p.step, p.answer_ops))
            .collect();
        assert_eq!(evals, vec![(0, None), (2, Some(4)), (4, Some(4))]);
        let answers: Vec<(usize, Option<usize>)> = out
            .curves
            .iter()
            .filter(|p| p.split == "answers")
            .map(|p| (p.step, p.answer_ops))
            .collect();
        assert_eq!(
            answers,
            vec![(2, Some(2)), (2, Some(3)), (4, Some(2)), (4, Some(3))]
        );
        for p in out
            .curves
            .iter()
            .filter(|p| p.split == "answers" && p.step == 4)
        {
            let o = p.answer_ops.unwrap();
            let g = crate::decode::igsm_generation(
                &model,
                &with_igsm_ops(&c, o),
                &device,
                3,
                crate::decode::ProblemSet::HeldOut,
            );
            assert_eq!(p.answer_accuracy, Some(g.answer_accuracy));
            assert_eq!(p.accuracy, g.answer_accuracy);
            assert!(p.loss.is_nan());
        }
        // Problems of the smaller size: exactly `o` operations, no mixture.
        let small = with_igsm_ops(&c, 2);
        let crate::config::TaskConfig::Igsm(p) = &small.task else {
            unreachable!()
        };
        assert_eq!((p.ops, p.min_ops), (2, None));
        // Without it: no answers rows.
        c.answer_curve_min_ops = 0;
        let (out, _) = train(&c, &device, &mut |_| {});
        assert!(out.curves.iter().all(|p| p.split != "answers"));
    }

    #[test]
    fn tiny_run_learns_and_probes() {
        let mut c = tiny();
        c.steps = 30;
        c.eval_every = 15;
        c.lr = 1e-2;
        c.warmup_steps = 3;
        let mut reports = Vec::new();
        let (out, _) = train(&c, &Device::flex(), &mut |p| reports.push(*p));
        assert_eq!(out.status, RunStatus::Done);
        let first = out.curves.iter().find(|p| p.split == "train").unwrap().loss;
        // Untrained: loss ≈ ln(vocab) = ln 16 ≈ 2.77.
        assert!((first - 16f64.ln()).abs() < 0.3, "first loss {first}");
        let evals: Vec<_> = out.curves.iter().filter(|p| p.split == "eval").collect();
        assert_eq!(
            evals.iter().map(|p| p.step).collect::<Vec<_>>(),
            vec![0, 15, 30]
        );
        // Progress: one report per step in order, then one per evaluation after the initial
        // one, carrying the same numbers as the curves.
        let steps: Vec<(usize, usize)> = reports
            .iter()
            .filter_map(|p| match *p {
                Progress::Step { step, steps, .. } => Some((step, steps)),
                _ => None,
            })
            .collect();
        assert_eq!(steps, (1..=30).map(|s| (s, 30)).collect::<Vec<_>>());
        let eval_reports: Vec<(usize, f64, f64)> = reports
            .iter()
            .filter_map(|p| match *p {
                Progress::Eval {
                    step,
                    loss,
                    accuracy,
                    answer_accuracy: None,
                    ..
                } => Some((step, loss, accuracy)),
                _ => None,
            })
            .collect();
        let expected: Vec<(usize, f64, f64)> = evals[1..]
            .iter()
            .map(|p| (p.step, p.loss, p.accuracy))
            .collect();
        assert_eq!(eval_reports, expected);
        let at = |p: &Progress| match *p {
            Progress::Step { step, .. } | Progress::Eval { step, .. } => step,
        };
        let eval_15 = reports
            .iter()
            .position(|p| matches!(p, Progress::Eval { step: 15, .. }));
        assert_eq!(
            eval_15.map(|i| at(&reports[i - 1])),
            Some(15),
            "evaluation follows its step"
        );
        // 3 evaluations × 1 layer × 2 heads.
        assert_eq!(out.spectra.len(), 6);
        assert_eq!(out.spectra[0].energy.len(), 4);
        let last = out.last.unwrap();
        assert!(last.loss < out.initial.unwrap().loss);
        // One lag profile per layer over seq_len lags, a distribution over lags.
        let lags = out.attention_lags.unwrap();
        assert_eq!((lags.len(), lags[0].len()), (1, c.seq_len));
        assert!((lags[0].iter().sum::<f64>() - 1.0).abs() < 1e-5, "{lags:?}");
        assert!(lags[0].iter().all(|&x| x >= 0.0));
    }

    /// Contexts longer than the probe's limit get no attention profile (no `seq × seq` weights).
    #[test]
    fn attention_profile_skips_long_contexts() {
        let mut c = tiny();
        c.seq_len = ATTENTION_PROBE_MAX_SEQ + 1;
        let model = c.model().init(c.seed, &Device::flex());
        assert!(attention_lag_profiles(&model, &c, &Device::flex()).is_none());
    }

    #[test]
    fn convergence_needs_every_layer_still_over_the_window() {
        // Two layers; layer 1 still moves by 10 % until the fourth evaluation.
        let h = vec![
            vec![1.0, 0.5],
            vec![0.5, 0.4],
            vec![0.51, 0.3],
            vec![0.505, 0.33],
            vec![0.5, 0.32],
            vec![0.502, 0.321],
        ];
        // window 2 = last 3 evaluations; tol 0.05 in ln units.
        assert!(!spectrum_converged(&h[..3], 2, 0.05));
        assert!(!spectrum_converged(&h[..4], 2, 0.05)); // layer 1: ln(0.33/0.3) = 0.095
        assert!(spectrum_converged(&h[..6], 2, 0.05)); // ln(0.33/0.32) = 0.031
        assert!(!spectrum_converged(&h[..6], 5, 0.05)); // the window reaches the first steps
        assert!(!spectrum_converged(&[], 0, 1.0));
    }

    /// `stop = "spectrum"` with a loose tolerance stops at the first evaluation allowed by
    /// `min_steps` and the window, records it, and its last evaluation is that step's.
    #[test]
    fn spectrum_stop_records_the_converged_step() {
        let mut c = tiny();
        c.steps = 40;
        c.eval_every = 5;
        c.stop = StopRule::Spectrum;
        c.min_steps = 12;
        c.stop_window = 2;
        c.stop_tol = 10.0;
        let (out, _) = train(&c, &Device::flex(), &mut |_| {});
        assert_eq!(out.status, RunStatus::Done);
        assert_eq!(out.converged_step, Some(15));
        let steps: Vec<usize> = out
            .curves
            .iter()
            .filter(|p| p.split == "eval")
            .map(|p| p.step)
            .collect();
        assert_eq!(steps, vec![0, 5, 10, 15]);
        assert_eq!(out.curves.iter().filter(|p| p.split == "train").count(), 15);
        // A tolerance no spectrum meets runs to the cap.
        c.stop_tol = 1e-12;
        let (out, _) = train(&c, &Device::flex(), &mut |_| {});
        assert_eq!(out.converged_step, None);
        assert_eq!(out.curves.last().unwrap().step, 40);
    }

    #[test]
    fn same_seed_same_numbers() {
        let mut c = tiny();
        c.steps = 5;
        let (a, _) = train(&c, &Device::flex(), &mut |_| {});
        let (b, _) = train(&c, &Device::flex(), &mut |_| {});
        let la: Vec<f64> = a.curves.iter().map(|p| p.loss).collect();
        let lb: Vec<f64> = b.curves.iter().map(|p| p.loss).collect();
        assert_eq!(la, lb);
        assert_eq!(a.spectra, b.spectra);
    }

    /// A gradient norm above `max_grad_norm` stops the run at that step as failed, with the
    /// norm in the reason; the curves hold only the steps before it.
    #[test]
    fn exploding_gradient_norm_fails_the_run() {
        let mut c = tiny();
        c.steps = 10;
        c.max_grad_norm = 1e-9;
        let (out, _) = train(&c, &Device::flex(), &mut |_| {});
        let RunStatus::Failed { step, reason } = &out.status else {
            panic!("expected a failed run, got {:?}", out.status);
        };
        assert_eq!(*step, 0);
        assert!(
            reason.starts_with("exploding gradients: norm ")
                && reason.ends_with("> max_grad_norm = 1e-9"),
            "{reason}"
        );
        assert!(out.curves.iter().all(|p| p.split == "eval" && p.step == 0));
    }

    /// Decoupled weight decay with `lr · weight_decay = 100` multiplies every matrix by −99 per
    /// step: the logits overflow f32 within ~20 steps and the run stops on a non-finite value
    /// (loss or gradient norm) at the step where it first appears.
    #[test]
    fn diverging_run_stops_on_non_finite_values() {
        let mut c = tiny();
        c.steps = 60;
        c.eval_every = 60;
        c.lr = 10.0;
        c.weight_decay = 10.0;
        c.max_grad_norm = 0.0;
        let (out, _) = train(&c, &Device::flex(), &mut |_| {});
        let RunStatus::Failed { step, reason } = &out.status else {
            panic!("expected a failed run, got {:?}", out.status);
        };
        assert!(reason.starts_with("non-finite"), "{reason}");
        assert!((5..40).contains(step), "failed at step {step}: {reason}");
        let train_rows = out.curves.iter().filter(|p| p.split == "train").count();
        assert_eq!(train_rows, *step, "one train row per completed step");
        assert!(out.curves.iter().all(|p| p.loss.is_finite()));
    }
}
