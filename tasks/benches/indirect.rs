//! Generator throughput of the indirect-indexing task, in tokens/s (input tokens produced per
//! second).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tasks::Split;
use tasks::indirect::IndirectConfig;

fn bench_indirect(c: &mut Criterion) {
    let mut group = c.benchmark_group("indirect");
    let cfg = IndirectConfig::default();
    for batch in [16usize, 256] {
        group.throughput(Throughput::Elements((cfg.seq_len * batch) as u64));
        let mut index0 = 0u64;
        group.bench_function(
            format!("default/seq_len={}/batch={batch}", cfg.seq_len),
            |b| {
                b.iter(|| {
                    let out = cfg
                        .batch(black_box(7), Split::Train, index0, batch)
                        .unwrap();
                    index0 += batch as u64;
                    black_box(out)
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench_indirect);
criterion_main!(benches);
