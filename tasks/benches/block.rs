//! Generator throughput of the block tasks, in tokens/s (input tokens produced per second).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tasks::Split;
use tasks::block::{BlockConfig, BlockVariant};

fn bench_block(c: &mut Criterion) {
    let mut group = c.benchmark_group("block");
    for variant in [BlockVariant::Copy, BlockVariant::Recall] {
        for seq_len in [128usize, 1024] {
            let batch = 16usize;
            let cfg = BlockConfig {
                variant,
                vocab_size: 256,
                seq_len,
                block_len: 16,
                noise: 0.1,
            };
            group.throughput(Throughput::Elements((seq_len * batch) as u64));
            let name = format!("{variant:?}/seq_len={seq_len}/batch={batch}").to_lowercase();
            let mut index0 = 0u64;
            group.bench_function(name, |b| {
                b.iter(|| {
                    let out = cfg
                        .batch(black_box(7), Split::Train, index0, batch)
                        .unwrap();
                    index0 += batch as u64;
                    black_box(out)
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_block);
criterion_main!(benches);
