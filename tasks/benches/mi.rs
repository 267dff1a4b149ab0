//! MI profile of a 5 MB corpus at 1024 lags (issue 6's goal: under 10 s on the 2-core machine).
//!
//! The corpus is the Shakespeare text at byte granularity (4.96 MB) when `data/shakespeare.txt`
//! exists (`make data`), otherwise a synthetic 5 MB byte stream with a text-like vocabulary (an
//! order-1 Markov chain over 80 symbols), which costs the same: one pass over the pairs per lag
//! into a dense count table. Threads: rayon's default pool (all cores; set RAYON_NUM_THREADS).

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tasks::mi::{MiConfig, profile_stream};

const BYTES: usize = 5_000_000;

fn corpus() -> (Vec<u32>, &'static str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/shakespeare.txt");
    // the converted text is 4.96 MB: use all of it (up to 5 MB)
    if let Ok(text) = std::fs::read(&path)
        && text.len() >= 4_500_000
    {
        let n = text.len().min(BYTES);
        return (text[..n].iter().map(|&b| b as u32).collect(), "shakespeare");
    }
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut s = 0u32;
    let x = (0..BYTES)
        .map(|_| {
            s = if rng.random::<f64>() < 0.5 {
                (s * 7 + 3) % 80
            } else {
                rng.random_range(0..80)
            };
            s
        })
        .collect();
    (x, "synthetic")
}

fn bench_mi(c: &mut Criterion) {
    let (x, name) = corpus();
    let cfg = MiConfig {
        max_lag: 1024,
        ..MiConfig::default()
    };
    let mut group = c.benchmark_group("mi");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(60));
    group.throughput(Throughput::Elements((x.len() * cfg.max_lag) as u64));
    group.bench_function(format!("{name}/5MB/1024-lags"), |b| {
        b.iter(|| black_box(profile_stream(black_box(&x), &cfg).unwrap()))
    });
    group.finish();
}

criterion_group!(benches, bench_mi);
criterion_main!(benches);
