//! Fused CPU attention (`lab::kernels::cpu`) vs the reference attention (burn tensor ops with
//! autodiff), causal, for every encoding, forward and forward + backward, seq ∈ {128, 512, 2048}.
//! Shape: batch 1, 4 heads, head_dim 32. Before timing, it prints the peak heap memory of one
//! forward + backward of each (a counting global allocator). Results go to docs/performance.md.
//!
//! `LAB_BENCH_SEQ=512 cargo bench -p lab --bench attention` restricts the lengths.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use lab::kernels::cpu::{KernelEncoding, Shape4, flash_backward, flash_forward};
use lab::model::{
    Encoding, EncodingConfig, ModelConfig, PositionalAttention, TapaPhase, causal_attention,
    causal_mask,
};

/// Global allocator that records the current and peak number of live heap bytes.
struct Counting;
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak extra heap bytes while `f` runs.
fn peak_bytes(f: impl FnOnce()) -> usize {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    f();
    PEAK.load(Ordering::Relaxed) - base
}

fn random(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(seed)) % 2000) as f32 / 2000.0 - 0.5
        })
        .collect()
}

const B: usize = 1;
const H: usize = 4;
const D: usize = 32;

struct Case {
    name: &'static str,
    l: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    enc: KernelEncoding,
    delta: Option<Vec<f32>>,
    pos: PositionalAttention,
    device: Device,
}

impl Case {
    fn new(encoding: Encoding, l: usize) -> Self {
        let n = B * H * l * D;
        let cfg = ModelConfig::attention_only(
            EncodingConfig::for_kernel_checks(encoding, TapaPhase::Quadratic),
            H,
            D,
        );
        let device = Device::flex().autodiff();
        let pos = PositionalAttention::new(&cfg, 0, &device);
        let (enc, delta) = pos.kernel_encoding();
        let delta = delta.map(|d| d.into_data().try_to_vec::<f32>().unwrap());
        Self {
            name: encoding.name(),
            l,
            q: random(n, 1),
            k: random(n, 2),
            v: random(n, 3),
            g: random(n, 4),
            enc,
            delta,
            pos,
            device,
        }
    }

    fn shape(&self) -> Shape4 {
        Shape4 {
            batch: B,
            heads: H,
            seq: self.l,
            head_dim: D,
        }
    }

    fn fused(&self, backward: bool) {
        let (out, lse) = flash_forward(
            &self.q,
            &self.k,
            &self.v,
            self.delta.as_deref(),
            self.shape(),
            &self.enc,
        );
        if backward {
            black_box(flash_backward(
                &self.q,
                &self.k,
                &self.v,
                self.delta.as_deref(),
                &out,
                &lse,
                &self.g,
                self.shape(),
                &self.enc,
            ));
        } else {
            black_box((out, lse));
        }
    }

    fn reference(&self, backward: bool) {
        let l = self.l;
        if !backward {
            // Forward only: the plain backend (no autodiff graph), as in evaluation.
            let device = self.device.clone().inner();
            let pos = self.pos.clone().valid();
            let t = |x: &Vec<f32>| {
                Tensor::<4>::from_data(TensorData::new(x.clone(), [B, H, l, D]), &device)
            };
            let out = causal_attention(
                &pos,
                t(&self.q),
                t(&self.k),
                t(&self.v),
                &causal_mask(l, &device),
            );
            black_box(out.into_data());
            return;
        }
        let device = &self.device;
        let t = |x: &Vec<f32>| {
            Tensor::<4>::from_data(TensorData::new(x.clone(), [B, H, l, D]), device).require_grad()
        };
        let (tq, tk, tv) = (t(&self.q), t(&self.k), t(&self.v));
        let mask = causal_mask(l, device);
        let out = causal_attention(&self.pos, tq.clone(), tk, tv, &mask);
        let tg = Tensor::<4>::from_data(TensorData::new(self.g.clone(), [B, H, l, D]), device);
        let grads = (out * tg).sum().backward();
        black_box(tq.grad(&grads).unwrap().into_data());
    }
}

fn lengths() -> Vec<usize> {
    match std::env::var("LAB_BENCH_SEQ") {
        Ok(s) => s
            .split(',')
            .map(|x| x.trim().parse().expect("LAB_BENCH_SEQ: lengths"))
            .collect(),
        Err(_) => vec![128, 512, 2048],
    }
}

const ENCODINGS: [Encoding; 4] = [
    Encoding::Nope,
    Encoding::Rope,
    Encoding::Pope,
    Encoding::Tapa,
];

fn bench(c: &mut Criterion) {
    eprintln!("peak heap, forward + backward (MiB): encoding seq fused reference");
    for encoding in ENCODINGS {
        for l in lengths() {
            let case = Case::new(encoding, l);
            let fused = peak_bytes(|| case.fused(true));
            let reference = peak_bytes(|| case.reference(true));
            eprintln!(
                "peak_mib {} {l} {:.2} {:.2}",
                case.name,
                fused as f64 / (1 << 20) as f64,
                reference as f64 / (1 << 20) as f64
            );
        }
    }
    for (group_name, backward) in [("attention_fwd", false), ("attention_fwd_bwd", true)] {
        let mut group = c.benchmark_group(group_name);
        group.sample_size(10);
        for encoding in ENCODINGS {
            for l in lengths() {
                let case = Case::new(encoding, l);
                group.throughput(Throughput::Elements((B * H * l) as u64));
                group.bench_with_input(
                    BenchmarkId::new(format!("fused/{}", case.name), l),
                    &l,
                    |bn, _| bn.iter(|| case.fused(backward)),
                );
                group.bench_with_input(
                    BenchmarkId::new(format!("reference/{}", case.name), l),
                    &l,
                    |bn, _| bn.iter(|| case.reference(backward)),
                );
            }
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
