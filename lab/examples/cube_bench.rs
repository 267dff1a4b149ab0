//! Times the CubeCL flash attention kernels (`lab::kernels::cube`), forward and forward+backward,
//! for every encoding at several sequence lengths. Prints one JSON object per line:
//! `{"impl":"cube","encoding":…,"dtype":"f32","batch":…,"heads":…,"seq":…,"head_dim":…,
//!   "fwd_ms":…,"fwd_bwd_ms":…}` (median over `--iters` timed runs after `--warmup` untimed ones,
//! each run synchronised with the device).
//!
//! `cargo run --release -p lab --features cuda --example cube_bench -- --device cuda`
//! (or `--features wgpu … --device wgpu`). Used by `bench/gpu.sh`.

#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
mod imp {
    use std::time::Instant;

    use burn::backend::ops::FloatTensorOps;
    use burn::backend::{Backend, Distribution, FloatDType, Shape};
    use burn_cubecl::tensor::CubeTensor;
    use burn_cubecl::{CubeBackend, CubeDevice};
    use lab::kernels::cube::{self, CubeAttentionParams, CubeEncoding, CubeStrategy};
    use lab::model::{PairLayout, TapaPhase, pope::pope_freqs, rope::inv_freq};

    struct Args {
        device: String,
        seqs: Vec<usize>,
        batch: usize,
        heads: usize,
        head_dim: usize,
        encodings: Vec<String>,
        strategies: Vec<String>,
        warmup: usize,
        iters: usize,
    }

    fn parse() -> Args {
        let mut a = Args {
            device: "cuda".into(),
            seqs: vec![1024, 4096, 16384],
            batch: 1,
            heads: 8,
            head_dim: 64,
            encodings: ["nope", "rope", "pope", "tapa", "tapa-linear"]
                .map(String::from)
                .to_vec(),
            strategies: vec!["tiled".into(), "rows".into()],
            warmup: 2,
            iters: 5,
        };
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut i = 0;
        while i < args.len() {
            let val = args.get(i + 1).cloned().unwrap_or_default();
            match args[i].as_str() {
                "--device" => a.device = val,
                "--seq" => a.seqs = val.split(',').map(|s| s.parse().expect("seq")).collect(),
                "--batch" => a.batch = val.parse().expect("batch"),
                "--heads" => a.heads = val.parse().expect("heads"),
                "--head-dim" => a.head_dim = val.parse().expect("head-dim"),
                "--encodings" => a.encodings = val.split(',').map(String::from).collect(),
                "--strategies" => a.strategies = val.split(',').map(String::from).collect(),
                "--warmup" => a.warmup = val.parse().expect("warmup"),
                "--iters" => a.iters = val.parse().expect("iters"),
                other => panic!("unknown argument {other}"),
            }
            i += 2;
        }
        a
    }

    fn device(name: &str) -> CubeDevice {
        match name {
            #[cfg(feature = "cuda-plain")]
            "cuda" => CubeDevice::Cuda(cubecl::device::CudaDevice::new(0)),
            #[cfg(feature = "wgpu")]
            "wgpu" => CubeDevice::Wgpu(cubecl::device::WgpuDevice::new(
                cubecl::device::WgpuDeviceKind::DefaultDevice,
            )),
            other => panic!("device {other} not compiled in (features: wgpu, cuda)"),
        }
    }

    fn random(shape: Vec<usize>, lo: f64, hi: f64, device: &CubeDevice) -> CubeTensor {
        CubeBackend::float_random(
            Shape::from(shape),
            Distribution::Uniform(lo, hi),
            device,
            FloatDType::F32,
        )
    }

    fn median_ms(mut f: impl FnMut(), warmup: usize, iters: usize, device: &CubeDevice) -> f64 {
        for _ in 0..warmup {
            f();
            CubeBackend::sync(device).expect("device sync");
        }
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            f();
            CubeBackend::sync(device).expect("device sync");
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        times[times.len() / 2]
    }

    pub fn main() {
        let a = parse();
        let dev = device(&a.device);
        let (b, h, d) = (a.batch, a.heads, a.head_dim);
        for &l in &a.seqs {
            let shape = vec![b, h, l, d];
            let q = random(shape.clone(), -1.0, 1.0, &dev);
            let k = random(shape.clone(), -1.0, 1.0, &dev);
            let v = random(shape.clone(), -1.0, 1.0, &dev);
            let g = random(shape.clone(), -1.0, 1.0, &dev);
            for enc_name in &a.encodings {
                let encoding = match enc_name.as_str() {
                    "nope" => CubeEncoding::Nope,
                    "rope" => CubeEncoding::Rope {
                        inv_freq: inv_freq(d, 10000.0),
                        layout: PairLayout::RotateHalf,
                        attention_factor: 1.0,
                    },
                    "pope" => CubeEncoding::Pope {
                        theta: pope_freqs(d, 10000.0),
                        delta: random(vec![h * d], -2.0 * std::f64::consts::PI, 0.0, &dev),
                    },
                    "tapa" | "tapa-linear" => CubeEncoding::Tapa {
                        amp_dim: d / 2,
                        alpha: 0.1,
                        phase: if enc_name == "tapa" {
                            TapaPhase::Quadratic
                        } else {
                            TapaPhase::Linear
                        },
                        phase_gain: 1.0,
                    },
                    other => panic!("unknown encoding {other}"),
                };
                for strategy_name in &a.strategies {
                    let strategy =
                        CubeStrategy::parse(strategy_name).unwrap_or_else(|e| panic!("{e}"));
                    let params = CubeAttentionParams {
                        encoding: encoding.clone(),
                        strategy,
                    };
                    let fwd_ms = median_ms(
                        || {
                            let _ = cube::forward(q.clone(), k.clone(), v.clone(), &params);
                        },
                        a.warmup,
                        a.iters,
                        &dev,
                    );
                    let fwd_bwd_ms = median_ms(
                        || {
                            let (out, lse) =
                                cube::forward(q.clone(), k.clone(), v.clone(), &params);
                            let _ = cube::backward(
                                q.clone(),
                                k.clone(),
                                v.clone(),
                                out,
                                lse,
                                g.clone(),
                                &params,
                            );
                        },
                        a.warmup,
                        a.iters,
                        &dev,
                    );
                    println!(
                        "{{\"impl\":\"cube\",\"encoding\":\"{enc_name}\",\"strategy\":\"{strategy_name}\",\"dtype\":\"f32\",\"batch\":{b},\"heads\":{h},\"seq\":{l},\"head_dim\":{d},\"fwd_ms\":{fwd_ms:.4},\"fwd_bwd_ms\":{fwd_bwd_ms:.4}}}"
                    );
                }
            }
        }
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
fn main() {
    imp::main();
}

#[cfg(not(any(feature = "wgpu", feature = "cuda-plain")))]
fn main() {
    eprintln!("cube_bench needs the `cuda` or `wgpu` feature");
    std::process::exit(2);
}
