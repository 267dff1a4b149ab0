//! Fused CPU attention (`lab::kernels::cpu`) vs the reference attention (burn tensor ops with
//! autodiff), forward + backward, causal, NoPE and RoPE, seq ∈ {128, 512, 2048}.
//! Shape: batch 1, 4 heads, head_dim 32. Results go to docs/performance.md.

use std::hint::black_box;

use burn::tensor::{Device, Tensor, TensorData};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use lab::kernels::cpu::{KernelEncoding, Shape4, flash_backward, flash_forward};
use lab::model::{
    DeltaInit, Encoding, ModelConfig, PairLayout, PositionalAttention, TapaPhase, causal_attention,
    causal_mask,
};

fn random(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(seed)) % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let (b, h, d) = (1usize, 4usize, 32usize);
    let mut group = c.benchmark_group("attention_fwd_bwd");
    group.sample_size(10);
    for encoding in [Encoding::Nope, Encoding::Rope] {
        for l in [128usize, 512, 2048] {
            let n = b * h * l * d;
            let (q, k, v, g) = (random(n, 1), random(n, 2), random(n, 3), random(n, 4));
            let shape = Shape4 {
                batch: b,
                heads: h,
                seq: l,
                head_dim: d,
            };
            let enc = match encoding {
                Encoding::Rope => KernelEncoding::Rope {
                    inv_freq: lab::model::rope::inv_freq(d, 10000.0),
                    layout: PairLayout::Adjacent,
                    attention_factor: 1.0,
                },
                _ => KernelEncoding::Nope,
            };
            group.throughput(Throughput::Elements((b * h * l) as u64));
            let name = format!("{encoding:?}").to_lowercase();
            group.bench_with_input(BenchmarkId::new(format!("fused/{name}"), l), &l, |bn, _| {
                bn.iter(|| {
                    let (out, lse) = flash_forward(&q, &k, &v, shape, &enc);
                    black_box(flash_backward(&q, &k, &v, &out, &lse, &g, shape, &enc))
                })
            });
            let cfg = ModelConfig {
                vocab_size: 8,
                d_model: h * d,
                n_layers: 1,
                n_heads: h,
                d_ff: 8,
                encoding,
                rope_base: 10000.0,
                pair_layout: PairLayout::Adjacent,
                pope_delta_init: DeltaInit::Zero,
                tapa_rho: 0.5,
                tapa_alpha: 0.1,
                tapa_phase: TapaPhase::Quadratic,
            };
            let device = Device::flex().autodiff();
            let pos = PositionalAttention::new(&cfg, 0, &device);
            let mask = causal_mask(l, &device);
            group.bench_with_input(
                BenchmarkId::new(format!("reference/{name}"), l),
                &l,
                |bn, _| {
                    bn.iter(|| {
                        let t = |x: &Vec<f32>| {
                            Tensor::<4>::from_data(
                                TensorData::new(x.clone(), [b, h, l, d]),
                                &device,
                            )
                            .require_grad()
                        };
                        let (tq, tk, tv) = (t(&q), t(&k), t(&v));
                        let tg = Tensor::<4>::from_data(
                            TensorData::new(g.clone(), [b, h, l, d]),
                            &device,
                        );
                        let out = causal_attention(&pos, tq.clone(), tk.clone(), tv.clone(), &mask);
                        let grads = (out * tg).sum().backward();
                        black_box(tq.grad(&grads).unwrap().into_data())
                    })
                },
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
