//! Generator throughput of the needle task, in tokens/s (input tokens produced per second).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tasks::Split;
use tasks::needle::{Haystack, NeedleConfig};

fn bench_needle(c: &mut Criterion) {
    let mut group = c.benchmark_group("needle");
    for haystack in [Haystack::Noise, Haystack::Pairs] {
        for seq_len in [256usize, 4096] {
            let batch = 16usize;
            let cfg = NeedleConfig {
                seq_len,
                haystack,
                ..NeedleConfig::default()
            };
            group.throughput(Throughput::Elements((seq_len * batch) as u64));
            let name = format!("{haystack:?}/seq_len={seq_len}/batch={batch}").to_lowercase();
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

criterion_group!(benches, bench_needle);
criterion_main!(benches);
