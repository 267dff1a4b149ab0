//! Fused RMSNorm and GELU with hand-written backwards, as a burn backend extension (the next
//! largest costs of the CPU training step after attention: burn decomposes each into 5–10
//! element-wise tensor ops, each a pass over memory and an allocation, forward and backward).
//!
//! - RMSNorm (Zhang & Sennrich 2019, eq. 4): `y = x / √(mean(x²) + ε) · g` over the last axis.
//!   Backward, with `r = 1/√(mean(x²) + ε)` and `u = g ⊙ dy`:
//!   `dx = r·u − x·r³·(u·x)/d`, `dg = Σ_rows dy ⊙ x·r`.
//! - GELU (Hendrycks & Gimpel 2016), exact form `x·Φ(x)`, `Φ(x) = ½(1 + erf(x/√2))`.
//!   Backward: `Φ(x) + x·φ(x)`, `φ(x) = e^(−x²/2)/√(2π)`. `erf` by Abramowitz & Stegun 7.1.26
//!   (absolute error ≤ 1.5e-7) with the kernel's polynomial `exp`, so it vectorises.
//!
//! Tensors are f32, contiguous after conversion; work is split over rows with rayon.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Flex, backend_extension};
use burn::tensor::Tensor;
use rayon::prelude::*;

use super::cpu::{dot, exp_approx};
use super::fused::{flex, host};

/// RMSNorm's ε.
pub const RMS_EPS: f32 = 1e-6;

/// Elements per rayon task (smaller inputs run on one thread).
const CHUNK: usize = 16 * 1024;

/// `erf(|z|)` by Abramowitz & Stegun 7.1.26 from `az = |z|` and `e = e^(−z²)`:
/// `1 − (a₁t + … + a₅t⁵)·e`, `t = 1/(1 + p·az)` (absolute error ≤ 1.5e-7, plus f32 rounding).
/// The exponential is the caller's, so GELU's forward can share it with `φ`.
#[inline(always)]
fn erf_abs(az: f32, e: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152_1,
        1.061_405_4,
    ];
    let t = 1.0 / (1.0 + P * az);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    1.0 - poly * e
}

/// `erf(x)`, Abramowitz & Stegun 7.1.26 ([`erf_abs`] with the kernel's polynomial `exp`),
/// absolute error ≤ 1.5e-7 (plus f32 rounding).
#[inline(always)]
pub fn erf_approx(x: f32) -> f32 {
    let ax = x.abs();
    let y = erf_abs(ax, exp_approx(-ax * ax));
    if x < 0.0 { -y } else { y }
}

const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// `1/√(2π)`.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

#[inline(always)]
fn gelu_chunk(y: &mut [f32], x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = 0.5 * x * (1.0 + erf_approx(x * FRAC_1_SQRT_2));
    }
}

#[inline(always)]
fn gelu_grad_chunk(dx: &mut [f32], x: &[f32], dy: &[f32]) {
    for ((dx, &x), &dy) in dx.iter_mut().zip(x).zip(dy) {
        let cdf = 0.5 * (1.0 + erf_approx(x * FRAC_1_SQRT_2));
        let pdf = FRAC_1_SQRT_2PI * exp_approx(-0.5 * x * x);
        *dx = dy * (cdf + x * pdf);
    }
}

/// GELU and its derivative in one pass, sharing one exponential: with `e = e^(−x²/2)`,
/// `Φ(x) = ½(1 + erf(x/√2))` by [`erf_abs`] (`e^(−z²) = e` at `z = x/√2`) and `φ(x) = e/√(2π)`.
#[inline(always)]
fn gelu_and_grad_chunk(y: &mut [f32], g: &mut [f32], x: &[f32]) {
    for ((y, g), &x) in y.iter_mut().zip(g.iter_mut()).zip(x) {
        let e = exp_approx(-0.5 * x * x);
        let erf_abs = erf_abs((x * FRAC_1_SQRT_2).abs(), e);
        let erf = if x < 0.0 { -erf_abs } else { erf_abs };
        let cdf = 0.5 * (1.0 + erf);
        *y = x * cdf;
        *g = cdf + x * FRAC_1_SQRT_2PI * e;
    }
}

/// GELU forward that also returns its derivative `Φ(x) + x·φ(x)` (for a backward that is then
/// one multiply, `dx = dy ⊙ g`): `(y, g)`, each like `x`. One exponential per element instead
/// of the three of [`gelu_forward`] plus [`gelu_backward`]; equal to them within f32 round-off
/// (the exponential's argument is rounded differently; tested). Used by the fast path
/// ([`crate::fast`]); the burn path keeps its kernels, so its numbers do not move.
pub fn gelu_forward_with_grad(x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut y = vec![0.0f32; x.len()];
    let mut g = vec![0.0f32; x.len()];
    y.par_chunks_mut(CHUNK)
        .zip(g.par_chunks_mut(CHUNK))
        .zip(x.par_chunks(CHUNK))
        .for_each(|((y, g), x)| {
            dispatch_simd!(gelu_and_grad_chunk, (y: &mut [f32], g: &mut [f32], x: &[f32]))
        });
    (y, g)
}

/// GELU forward on a slice.
pub fn gelu_forward(x: &[f32]) -> Vec<f32> {
    let mut y = vec![0.0f32; x.len()];
    y.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(y, x)| dispatch_simd!(gelu_chunk, (y: &mut [f32], x: &[f32])));
    y
}

/// GELU backward: `dx = dy·(Φ(x) + x·φ(x))`.
pub fn gelu_backward(x: &[f32], dy: &[f32]) -> Vec<f32> {
    let mut dx = vec![0.0f32; x.len()];
    dx.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
        .for_each(|(dx, (x, dy))| {
            dispatch_simd!(gelu_grad_chunk, (dx: &mut [f32], x: &[f32], dy: &[f32]))
        });
    dx
}

/// `Σ_i a_i·b_i·c_i` in 16 independent lanes (so the loop vectorises; a plain sum is one serial
/// chain of adds), the lanes then added in order, then the remainder.
#[inline(always)]
fn dot3(a: &[f32], b: &[f32], c: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ca, cb, cc) = (a.chunks_exact(16), b.chunks_exact(16), c.chunks_exact(16));
    let (ra, rb, rc) = (ca.remainder(), cb.remainder(), cc.remainder());
    for ((x, y), z) in ca.zip(cb).zip(cc) {
        for l in 0..16 {
            acc[l] += x[l] * y[l] * z[l];
        }
    }
    let mut total: f32 = acc.iter().sum();
    for ((x, y), z) in ra.iter().zip(rb).zip(rc) {
        total += x * y * z;
    }
    total
}

/// RMSNorm forward of consecutive rows (`gain.len()` wide): `y`, and `r` one per row.
#[inline(always)]
fn rms_rows_forward(y: &mut [f32], r: &mut [f32], x: &[f32], gain: &[f32]) {
    let d = gain.len();
    for ((y, r), x) in y.chunks_mut(d).zip(r.iter_mut()).zip(x.chunks(d)) {
        let ms = dot(x, x) / d as f32;
        *r = 1.0 / (ms + RMS_EPS).sqrt();
        for ((y, &x), &g) in y.iter_mut().zip(x).zip(gain) {
            *y = x * *r * g;
        }
    }
}

/// RMSNorm backward of consecutive rows: writes `dx`, adds the rows' `∂/∂gain` to `dg`.
#[inline(always)]
fn rms_rows_backward(
    dx: &mut [f32],
    dg: &mut [f32],
    x: &[f32],
    dy: &[f32],
    r: &[f32],
    gain: &[f32],
) {
    let d = gain.len();
    for (((dx, x), dy), &r) in dx.chunks_mut(d).zip(x.chunks(d)).zip(dy.chunks(d)).zip(r) {
        let c = r * r * r * dot3(gain, dy, x) / d as f32;
        for i in 0..d {
            dx[i] = r * gain[i] * dy[i] - x[i] * c;
            dg[i] += dy[i] * x[i] * r;
        }
    }
}

/// RMSNorm forward over rows of length `d`: `(y, r)` with `r` `[rows]` the reciprocal RMS.
/// `mean(x²)` is summed in 16 lanes ([`dot`]), so it differs from a sequential sum by f32
/// round-off.
pub fn rms_norm_forward(x: &[f32], gain: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let d = gain.len();
    let rows = x.len() / d;
    let mut y = vec![0.0f32; x.len()];
    let mut r = vec![0.0f32; rows];
    let rows_per_task = (CHUNK / d).max(1);
    y.par_chunks_mut(rows_per_task * d)
        .zip(r.par_chunks_mut(rows_per_task))
        .zip(x.par_chunks(rows_per_task * d))
        .for_each(|((y, r), x)| {
            dispatch_simd!(rms_rows_forward, (y: &mut [f32], r: &mut [f32], x: &[f32], gain: &[f32]))
        });
    (y, r)
}

/// RMSNorm backward: `(dx, dgain)`. `dgain` is summed per task of `CHUNK / d` rows, then over
/// the tasks in row order: the same bits whatever the number of threads and however rayon splits
/// the work (its `reduce` combines partial sums in a tree whose shape follows the splits).
pub fn rms_norm_backward(x: &[f32], gain: &[f32], r: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let d = gain.len();
    let mut dx = vec![0.0f32; x.len()];
    let rows_per_task = (CHUNK / d).max(1);
    let partials: Vec<Vec<f32>> = dx
        .par_chunks_mut(rows_per_task * d)
        .zip(x.par_chunks(rows_per_task * d))
        .zip(dy.par_chunks(rows_per_task * d))
        .zip(r.par_chunks(rows_per_task))
        .map(|(((dx, x), dy), r)| {
            let mut dg = vec![0.0f32; d];
            let acc = &mut dg[..];
            dispatch_simd!(rms_rows_backward, (dx: &mut [f32], acc: &mut [f32], x: &[f32], dy: &[f32], r: &[f32], gain: &[f32]));
            dg
        })
        .collect();
    let mut dgain = vec![0.0f32; d];
    for part in &partials {
        for (a, b) in dgain.iter_mut().zip(part) {
            *a += b;
        }
    }
    (dx, dgain)
}

/// Backend extension: fused RMSNorm and GELU.
#[backend_extension(Autodiff, Flex, Cube: cfg(any(feature = "wgpu", feature = "cuda-plain")))]
pub trait FusedPointwiseBackend: Backend {
    /// GELU (exact form), any shape.
    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self>;
    /// RMSNorm over the last axis: `x` `[…, d]`, `gain` `[d]`.
    fn fused_rms_norm(x: FloatTensor<Self>, gain: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// Backend extension: the masked cross-entropy of each row in one kernel forward and one backward
/// (CubeCL devices only: `lab::kernels::cube::xent_forward`; on flex the loss stays burn's tensor
/// operations, whose arithmetic the CPU's golden values were made with, and calling this panics).
#[backend_extension(Autodiff, Cube: cfg(any(feature = "wgpu", feature = "cuda-plain")))]
pub trait FusedLossBackend: Backend {
    /// `logits` `[…, vocab]`; `targets` (f32 ids) and `mask` one value per row. Returns `(loss,
    /// correct)` per row, shaped as `targets`: `(logsumexp − picked logit)·mask`, differentiable
    /// in `logits`, and `[argmax = target]·mask`, not differentiable.
    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        mask: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

/// [`FusedLossBackend::fused_cross_entropy`] on tensors: `logits` `[batch, seq, vocab]`,
/// `targets` `[batch, seq]` as f32 ids, `mask` `[batch, seq]` → `(loss, correct)` `[batch, seq]`.
///
/// # Panics
/// On a device without the extension (flex).
pub fn cross_entropy_rows(
    logits: Tensor<3>,
    targets: Tensor<2>,
    mask: Tensor<2>,
) -> (Tensor<2>, Tensor<2>) {
    use burn::backend::Dispatch;
    let (loss, correct) = <Dispatch as FusedLossBackend>::fused_cross_entropy(
        logits.into_dispatch(),
        targets.into_dispatch(),
        mask.into_dispatch(),
    );
    (Tensor::from_dispatch(loss), Tensor::from_dispatch(correct))
}

fn like(values: Vec<f32>, t: &FlexTensor) -> FlexTensor {
    flex(values, t.layout().shape().as_slice())
}

impl FusedPointwiseBackend for Flex {
    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        like(gelu_forward(&host(&x)), &x)
    }

    fn fused_rms_norm(x: FloatTensor<Self>, gain: FloatTensor<Self>) -> FloatTensor<Self> {
        like(rms_norm_forward(&host(&x), &host(&gain)).0, &x)
    }
}

#[derive(Debug)]
struct GeluBackward;

impl Backward<Flex, 1> for GeluBackward {
    type State = FlexTensor;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let dy = grads.consume::<Flex>(&ops.node);
        if let Some(node) = node {
            let x = ops.state;
            grads.register::<Flex>(node.id, like(gelu_backward(&host(&x), &host(&dy)), &x));
        }
    }
}

#[derive(Debug)]
struct RmsNormBackward;

impl Backward<Flex, 2> for RmsNormBackward {
    /// `(x, gain, reciprocal RMS per row)`.
    type State = (FlexTensor, FlexTensor, Vec<f32>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_g] = ops.parents;
        let dy = grads.consume::<Flex>(&ops.node);
        let (x, gain, r) = ops.state;
        let (dx, dg) = rms_norm_backward(&host(&x), &host(&gain), &r, &host(&dy));
        if let Some(node) = node_x {
            grads.register::<Flex>(node.id, like(dx, &x));
        }
        if let Some(node) = node_g {
            grads.register::<Flex>(node.id, like(dg, &gain));
        }
    }
}

impl<C: CheckpointStrategy> FusedPointwiseBackend for Autodiff<Flex, C> {
    fn fused_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        match GeluBackward
            .prepare::<C>([x.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let xp = x.primitive().clone();
                let y = like(gelu_forward(&host(&xp)), &xp);
                prep.finish(xp, y)
            }
            OpsKind::UnTracked(prep) => {
                let xp = x.primitive();
                prep.finish(like(gelu_forward(&host(xp)), xp))
            }
        }
    }

    fn fused_rms_norm(x: FloatTensor<Self>, gain: FloatTensor<Self>) -> FloatTensor<Self> {
        match RmsNormBackward
            .prepare::<C>([x.node(), gain.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (xp, gp) = (x.primitive().clone(), gain.primitive().clone());
                let (y, r) = rms_norm_forward(&host(&xp), &host(&gp));
                let y = like(y, &xp);
                prep.finish((xp, gp, r), y)
            }
            OpsKind::UnTracked(prep) => {
                let xp = x.primitive();
                let (y, _) = rms_norm_forward(&host(xp), &host(gain.primitive()));
                prep.finish(like(y, xp))
            }
        }
    }
}

/// Fused GELU (exact form) of any float tensor; differentiable on flex autodiff.
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    use burn::backend::Dispatch;
    Tensor::from_dispatch(<Dispatch as FusedPointwiseBackend>::fused_gelu(
        x.into_dispatch(),
    ))
}

/// Fused RMSNorm over the last axis: `x` `[…, d]`, `gain` `[d]`, ε = [`RMS_EPS`].
pub fn rms_norm<const D: usize>(x: Tensor<D>, gain: Tensor<1>) -> Tensor<D> {
    use burn::backend::Dispatch;
    Tensor::from_dispatch(<Dispatch as FusedPointwiseBackend>::fused_rms_norm(
        x.into_dispatch(),
        gain.into_dispatch(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};
    use rand::{Rng, SeedableRng};

    fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-scale..scale)).collect()
    }

    fn close(a: &[f32], r: &[f32], tol_abs: f32, tol_rel: f32, what: &str) {
        assert_eq!(a.len(), r.len());
        for (i, (x, y)) in a.iter().zip(r).enumerate() {
            assert!(
                (x - y).abs() <= tol_abs + tol_rel * y.abs(),
                "{what}[{i}]: fused {x}, reference {y}"
            );
        }
    }

    /// RMSNorm's backward over many row tasks gives the same bits on one and two threads, run
    /// after run (its gain gradient is summed over the tasks in a fixed order), and its gain
    /// gradient equals the sum over rows computed directly in f64 to round-off.
    #[test]
    fn rms_norm_backward_is_the_same_on_any_thread_count() {
        let (rows, d) = (4096, 64); // 16 tasks of 256 rows
        let x: Vec<f32> = (0..rows * d)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let dy: Vec<f32> = (0..rows * d)
            .map(|i| ((i * 53 % 89) as f32 - 44.0) / 30.0)
            .collect();
        let gain: Vec<f32> = (0..d).map(|i| 0.5 + i as f32 / d as f32).collect();
        let (_, r) = rms_norm_forward(&x, &gain);
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| rms_norm_backward(&x, &gain, &r, &dy))
        };
        let one = on(1);
        for _ in 0..5 {
            assert_eq!(on(2), one);
        }
        for (i, &g) in one.1.iter().enumerate() {
            let want: f64 = (0..rows)
                .map(|t| dy[t * d + i] as f64 * x[t * d + i] as f64 * r[t] as f64)
                .sum();
            assert!(
                (g as f64 - want).abs() <= 1e-3 + 1e-5 * want.abs(),
                "dgain[{i}] {g} vs {want}"
            );
        }
    }

    /// The one-pass GELU and derivative agree with the separate kernels.
    #[test]
    fn gelu_with_grad_matches_forward_and_backward() {
        let x = random(40_000, 5, 6.0);
        let (y, g) = gelu_forward_with_grad(&x);
        close(&y, &gelu_forward(&x), 1e-6, 1e-6, "gelu");
        close(
            &g,
            &gelu_backward(&x, &vec![1.0; x.len()]),
            1e-6,
            1e-6,
            "gelu'",
        );
        // Hand values: GELU'(0) = ½, GELU(1) = Φ(1) = 0.841345, GELU'(−1) = Φ(−1) − φ(−1).
        let (y, g) = gelu_forward_with_grad(&[0.0, 1.0, -1.0]);
        assert!((g[0] - 0.5).abs() < 1e-7 && (y[1] - 0.841_344_7).abs() < 1e-6);
        assert!(
            (g[2] - (0.158_655_25 - 0.241_970_72)).abs() < 1e-6,
            "{}",
            g[2]
        );
    }

    /// erf against hand values (tables: erf(0.5) = 0.5204998778, erf(1) = 0.8427007929,
    /// erf(2) = 0.9953222650) and odd symmetry; max error over [−5, 5] against f64 libm-free
    /// series is checked through the GELU tests.
    #[test]
    fn erf_hand_values() {
        for (x, want) in [
            (0.0f32, 0.0f32),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (2.0, 0.995_322_3),
            (-1.0, -0.842_700_8),
        ] {
            assert!(
                (erf_approx(x) - want).abs() < 3e-7,
                "erf({x}) = {}",
                erf_approx(x)
            );
        }
    }

    /// Forward and gradients of fused GELU and RMSNorm equal burn's decomposed versions
    /// (`activation::gelu`, the model's reference RMSNorm) to 2e-6 absolute + 1e-5 relative
    /// (f32; the erf approximation's 1.5e-7 error), over odd sizes (not multiples of the chunk).
    #[test]
    fn match_burn_reference_with_gradients() {
        let device = Device::flex().autodiff();
        let (rows, d) = (3 * 1031, 24);
        let x = random(rows * d, 1, 3.0);
        let g = random(d, 2, 1.0);
        let dy = random(rows * d, 3, 1.0);
        let t = |v: &[f32], shape: [usize; 2]| {
            Tensor::<2>::from_data(TensorData::new(v.to_vec(), shape), &device).require_grad()
        };
        let tdy = Tensor::<2>::from_data(TensorData::new(dy.clone(), [rows, d]), &device);
        let vals = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
        let gvals = |t: Tensor<1>| t.into_data().try_to_vec::<f32>().unwrap();

        // GELU
        let (xa, xb) = (t(&x, [rows, d]), t(&x, [rows, d]));
        let fa = gelu(xa.clone());
        let fb = burn::tensor::activation::gelu(xb.clone());
        close(&vals(fa.clone()), &vals(fb.clone()), 2e-6, 1e-5, "gelu");
        let ga = (fa * tdy.clone()).sum().backward();
        let gb = (fb * tdy.clone()).sum().backward();
        close(
            &vals(xa.grad(&ga).unwrap()),
            &vals(xb.grad(&gb).unwrap()),
            2e-6,
            1e-5,
            "gelu dx",
        );

        // RMSNorm
        let (xa, xb) = (t(&x, [rows, d]), t(&x, [rows, d]));
        let gain_a =
            Tensor::<1>::from_data(TensorData::new(g.clone(), [d]), &device).require_grad();
        let gain_b =
            Tensor::<1>::from_data(TensorData::new(g.clone(), [d]), &device).require_grad();
        let fa = rms_norm(xa.clone(), gain_a.clone());
        let rms = (xb.clone().square().mean_dim(1) + RMS_EPS as f64).sqrt();
        let fb = xb.clone() / rms * gain_b.clone().unsqueeze::<2>();
        close(&vals(fa.clone()), &vals(fb.clone()), 2e-6, 1e-5, "rms_norm");
        let ga = (fa * tdy.clone()).sum().backward();
        let gb = (fb * tdy).sum().backward();
        close(
            &vals(xa.grad(&ga).unwrap()),
            &vals(xb.grad(&gb).unwrap()),
            2e-6,
            1e-5,
            "rms_norm dx",
        );
        // dgain sums 3093 rows: tolerance scales with the sum's magnitude.
        close(
            &gvals(gain_a.grad(&ga).unwrap()),
            &gvals(gain_b.grad(&gb).unwrap()),
            1e-3,
            1e-4,
            "rms_norm dgain",
        );
    }
}
