//! Generator and checker throughput of the iGSM task: problems per second for `sample`,
//! `example` (sample + render + encode) and `check` (parse and re-derive a rendered text).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tasks::Split;
use tasks::igsm::{self, IgsmConfig};

fn bench_igsm(c: &mut Criterion) {
    let mut group = c.benchmark_group("igsm");
    for ops in [2usize, 5, 10] {
        let cfg = IgsmConfig {
            ops,
            ..IgsmConfig::default()
        };
        let batch = 64usize;
        group.throughput(Throughput::Elements(batch as u64));
        for split in [Split::Train, Split::Eval] {
            let mut index0 = 0u64;
            group.bench_function(
                format!("example/ops={ops}/{split:?}/batch={batch}").to_lowercase(),
                |b| {
                    b.iter(|| {
                        let out = cfg.batch(black_box(7), split, index0, batch).unwrap();
                        index0 += batch as u64;
                        black_box(out)
                    })
                },
            );
        }
        let texts: Vec<String> = (0..batch as u64)
            .map(|i| igsm::render(&cfg.sample(7, Split::Train, i).unwrap()))
            .collect();
        group.bench_function(format!("check/ops={ops}/batch={batch}"), |b| {
            b.iter(|| {
                for t in &texts {
                    black_box(igsm::check(black_box(t)).unwrap());
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_igsm);
criterion_main!(benches);
