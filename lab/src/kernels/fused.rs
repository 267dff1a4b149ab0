//! The fused positional attention as a burn backend extension, with a hand-written backward
//! registered for autodiff (burn 0.22's backend-extension pattern: a `#[backend_extension]`
//! trait implemented for each backend and for `Autodiff<B>`).
//!
//! [`positional_attention`] is the entry point the model calls: causal attention with the
//! encoding applied inside the kernel, on tensors `[batch, heads, seq, head_dim]`. On flex it runs
//! [`super::cpu`]'s flash kernels; under autodiff the forward saves its inputs, the output and the
//! log-sum-exp, and the backward calls [`super::cpu::flash_backward`], so no `seq × seq` matrix is
//! kept for the backward either.
//!
//! Tensors must be f32 (the lab's float type); other dtypes panic with a message naming it.

use std::borrow::Cow;

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Flex, backend_extension};
use burn::tensor::{Tensor, TensorData};

use super::cpu::{KernelEncoding, Shape4, flash_backward, flash_forward};

/// Backend extension: fused causal attention with the encoding inside the kernel.
// `Cube`: the CubeCL kernels of `super::cube` (features `wgpu`, `cuda`), on burn's CubeCL backend
// with or without fusion.
#[backend_extension(Autodiff, Flex, Cube: cfg(any(feature = "wgpu", feature = "cuda-plain")))]
pub trait FusedAttentionBackend: Backend {
    /// `q`, `k`, `v`: `[batch, heads, seq, head_dim]` → `[batch, heads, seq, head_dim]`.
    /// `encoding` must not be PoPE (use [`FusedAttentionBackend::fused_pope_attention`]).
    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        encoding: KernelEncoding,
    ) -> FloatTensor<Self>;

    /// PoPE: as [`FusedAttentionBackend::fused_attention`] with the phase bias `delta`
    /// `[heads · head_dim]` (radians, differentiable) and `theta` `[head_dim]` (rad/token).
    fn fused_pope_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        delta: FloatTensor<Self>,
        theta: Vec<f64>,
    ) -> FloatTensor<Self>;
}

/// Contiguous f32 view of a flex tensor (borrowed when already contiguous). Shared by the fused
/// kernels of this module and [`super::pointwise`].
pub(crate) fn host(t: &FlexTensor) -> Cow<'_, [f32]> {
    assert_eq!(
        t.dtype(),
        burn::tensor::DType::F32,
        "fused kernels need f32 tensors, got {:?}",
        t.dtype()
    );
    match t.as_slice::<f32>() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(
            t.to_contiguous()
                .as_slice::<f32>()
                .expect("contiguous")
                .to_vec(),
        ),
    }
}

fn shape4(t: &FlexTensor) -> Shape4 {
    let dims = t.layout().shape();
    assert_eq!(
        dims.len(),
        4,
        "fused attention needs [batch, heads, seq, head_dim], got {dims:?}"
    );
    Shape4 {
        batch: dims[0],
        heads: dims[1],
        seq: dims[2],
        head_dim: dims[3],
    }
}

pub(crate) fn flex(values: Vec<f32>, dims: &[usize]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, dims.to_vec()))
}

fn dims(s: Shape4) -> [usize; 4] {
    [s.batch, s.heads, s.seq, s.head_dim]
}

/// Forward on flex: `(out, lse)`.
fn forward_flex(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    delta: Option<&FlexTensor>,
    encoding: &KernelEncoding,
) -> (Vec<f32>, Vec<f32>, Shape4) {
    let shape = shape4(q);
    assert_eq!(shape, shape4(k), "q and k shapes differ");
    assert_eq!(shape, shape4(v), "q and v shapes differ");
    let delta = delta.map(host);
    let (out, lse) = flash_forward(
        &host(q),
        &host(k),
        &host(v),
        delta.as_deref(),
        shape,
        encoding,
    );
    (out, lse, shape)
}

impl FusedAttentionBackend for Flex {
    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        encoding: KernelEncoding,
    ) -> FloatTensor<Self> {
        let (out, _, shape) = forward_flex(&q, &k, &v, None, &encoding);
        flex(out, &dims(shape))
    }

    fn fused_pope_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        delta: FloatTensor<Self>,
        theta: Vec<f64>,
    ) -> FloatTensor<Self> {
        let encoding = KernelEncoding::Pope { theta };
        let (out, _, shape) = forward_flex(&q, &k, &v, Some(&delta), &encoding);
        flex(out, &dims(shape))
    }
}

/// What the backward needs: the inputs and the output (shared, not copied) and the log-sum-exp.
#[derive(Clone, Debug)]
struct Saved {
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    delta: Option<FlexTensor>,
    out: FlexTensor,
    lse: Vec<f32>,
    shape: Shape4,
    encoding: KernelEncoding,
}

impl Saved {
    /// Forward on flex, keeping what the backward needs. Returns `(out, saved)`.
    fn forward(
        q: FlexTensor,
        k: FlexTensor,
        v: FlexTensor,
        delta: Option<FlexTensor>,
        encoding: KernelEncoding,
    ) -> (FlexTensor, Self) {
        let (out, lse, shape) = forward_flex(&q, &k, &v, delta.as_ref(), &encoding);
        let out = flex(out, &dims(shape));
        let saved = Self {
            q,
            k,
            v,
            delta,
            out: out.clone(),
            lse,
            shape,
            encoding,
        };
        (out, saved)
    }

    /// Run the backward for `dout` and register the gradients of the parents `ids`
    /// (`[q, k, v]`, plus δ for PoPE).
    fn register(&self, ids: &[Option<NodeId>], dout: &FlexTensor, grads: &mut Gradients) {
        let delta = self.delta.as_ref().map(host);
        let g = flash_backward(
            &host(&self.q),
            &host(&self.k),
            &host(&self.v),
            delta.as_deref(),
            &host(&self.out),
            &self.lse,
            &host(dout),
            self.shape,
            &self.encoding,
        );
        let d = dims(self.shape);
        for (id, grad) in ids.iter().zip([g.dq, g.dk, g.dv]) {
            if let Some(id) = id {
                grads.register::<Flex>(*id, flex(grad, &d));
            }
        }
        if let Some(Some(id)) = ids.get(3) {
            let dd = g.ddelta.expect("PoPE backward returns dδ");
            let n = dd.len();
            grads.register::<Flex>(*id, flex(dd, &[n]));
        }
    }
}

/// The registered backward of the flex attention (`N` = 3 parents q, k, v, or 4 with PoPE's δ).
#[derive(Debug)]
struct FusedBackward;

impl<const N: usize> Backward<Flex, N> for FusedBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let ids = ops.parents.map(|p| p.map(|n| n.id));
        let dout = grads.consume::<Flex>(&ops.node);
        ops.state.register(&ids, &dout, grads);
    }
}

/// Autodiff attention on flex: `inputs` are `[q, k, v]`, or `[q, k, v, δ]` for PoPE.
fn autodiff_flex<C: CheckpointStrategy, const N: usize>(
    inputs: [FloatTensor<Autodiff<Flex, C>>; N],
    encoding: KernelEncoding,
) -> FloatTensor<Autodiff<Flex, C>> {
    let nodes = inputs.each_ref().map(|t| t.node());
    let [q, k, v] = [0, 1, 2].map(|i| inputs[i].primitive());
    let delta = inputs.get(3).map(|t| t.primitive());
    match FusedBackward.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (out, saved) =
                Saved::forward(q.clone(), k.clone(), v.clone(), delta.cloned(), encoding);
            prep.finish(saved, out)
        }
        OpsKind::UnTracked(prep) => {
            let (out, _, shape) = forward_flex(q, k, v, delta, &encoding);
            prep.finish(flex(out, &dims(shape)))
        }
    }
}

impl<C: CheckpointStrategy> FusedAttentionBackend for Autodiff<Flex, C> {
    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        encoding: KernelEncoding,
    ) -> FloatTensor<Self> {
        autodiff_flex::<C, 3>([q, k, v], encoding)
    }

    fn fused_pope_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        delta: FloatTensor<Self>,
        theta: Vec<f64>,
    ) -> FloatTensor<Self> {
        autodiff_flex::<C, 4>([q, k, v, delta], KernelEncoding::Pope { theta })
    }
}

/// Fused causal attention for any encoding: `q`, `k`, `v` `[batch, heads, seq, head_dim]` →
/// `[batch, heads, seq, head_dim]`. `delta`: PoPE's phase bias `[heads · head_dim]` (required
/// for PoPE, ignored otherwise). Differentiable on `Device::flex().autodiff()`, and with the
/// `wgpu` / `cuda` features on their devices (plain or autodiff; the CubeCL kernels of
/// `kernels::cube`).
///
/// # Panics
/// On another backend, on non-f32 tensors, or PoPE without `delta`.
pub fn positional_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    delta: Option<Tensor<1>>,
    encoding: KernelEncoding,
) -> Tensor<4> {
    use burn::backend::Dispatch;
    let out = match encoding {
        KernelEncoding::Pope { theta } => {
            <Dispatch as FusedAttentionBackend>::fused_pope_attention(
                q.into_dispatch(),
                k.into_dispatch(),
                v.into_dispatch(),
                delta.expect("PoPE attention needs delta").into_dispatch(),
                theta,
            )
        }
        other => <Dispatch as FusedAttentionBackend>::fused_attention(
            q.into_dispatch(),
            k.into_dispatch(),
            v.into_dispatch(),
            other,
        ),
    };
    Tensor::from_dispatch(out)
}
