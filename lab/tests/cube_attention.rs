//! CubeCL flash attention (`lab::kernels::cube`) against the reference attention.
//!
//! Run with `make test-wgpu` (`cargo test --release -p lab --features wgpu,cuda-source,fusion
//! --test cube_attention`: burn's fused CubeCL backend, the configuration `cuda` uses;
//! `make test-wgpu-plain` without `fusion`). With `cuda-source`, the kernels' CUDA C++ for an sm 90
//! GPU is generated too.
//! On a machine without a GPU, wgpu runs the kernels on Mesa's lavapipe (Vulkan on the CPU).
//!
//! The equivalence checks are `lab selfcheck --backend wgpu` (`lab::selfcheck`: the cases,
//! shapes, launch layouts, training steps and tolerances, with their reasons, are documented
//! there), run here group by group so a failure names its group; plus a hand-computed case.

#![cfg(feature = "wgpu")]

use burn::tensor::{Device, DeviceKind};
use lab::kernels::cube::{self, CubeAttentionParams, CubeEncoding, cube_to_host, host_to_cube};
use lab::selfcheck::{self, Check};
use lab::sweep::Backend;

fn wgpu() -> Device {
    Device::wgpu(DeviceKind::DefaultDevice)
}

/// Every check passes; the report is printed either way.
fn assert_all_pass(checks: Vec<Check>, expected: usize, what: &str) {
    let report = selfcheck::SelfcheckReport {
        backend: format!("wgpu ({what})"),
        checks,
        seconds: 0.0,
    };
    let text = report.text();
    eprintln!("{text}");
    assert_eq!(report.checks.len(), expected, "{what}: number of checks");
    assert!(report.passed(), "{text}");
}

/// The differentiable op (`lab::kernels::positional_attention`) on wgpu autodiff: every encoding
/// case at every shape, output and gradients (PoPE's δ too).
#[test]
fn cube_backend_extension_matches_reference() {
    assert_all_pass(
        selfcheck::extension_checks(&wgpu()),
        12 * 3 * 4 + 3,
        "extension",
    );
}

/// The kernels called directly with each launch layout (rows; tiled, automatic tile; 16-row
/// tiles; tiled with the key-side backward split into a `dv` and a `dk` launch; tiled with the
/// backward's own rows staged in shared memory (16-row tiles on lavapipe's 32 KiB); `cmma` and
/// `cmma-wide`, whose tensor-core kernel lavapipe, without cooperative matrices, runs emulated):
/// every encoding case at every shape. The emulated tensor-core kernels ran exactly where their
/// shapes fit: head_dim 32, the nine dot-product cases and TAPA's three (amplitude part 16
/// wide), not head_dim 8.
#[test]
fn cube_kernels_match_reference_for_every_strategy() {
    let checks = selfcheck::cube_kernel_checks(&wgpu());
    for group in ["kernel cmma", "kernel cmma-wide"] {
        let emulated: std::collections::BTreeSet<&str> = checks
            .iter()
            .filter(|c| c.group == group && c.case.ends_with("[tensor cores emulated]"))
            .map(|c| c.case.as_str())
            .collect();
        assert_eq!(emulated.len(), 12, "{group}: {emulated:?}");
        assert!(
            emulated.iter().all(|c| c.contains("×33×32")),
            "{group}: {emulated:?}"
        );
        let marked = checks
            .iter()
            .filter(|c| c.group == group && c.case.contains("[tensor cores"))
            .count();
        assert_eq!(marked, 12 * 4 + 1, "{group}: out, dq, dk, dv and PoPE's dδ");
    }
    assert_all_pass(checks, 7 * (12 * 3 * 4 + 3), "kernels");
}

/// Two whole training steps on wgpu (CubeCL attention with its backward, burn ops elsewhere) give
/// the losses and gradient norms of burn's reference attention on flex, for RoPE, PoPE, TAPA and
/// NoPE, and the update happens.
#[test]
fn training_steps_on_wgpu_match_the_reference() {
    assert_all_pass(
        selfcheck::train_step_checks(Backend::Wgpu).expect("wgpu is built"),
        4 * 5,
        "train-step",
    );
}

/// Hand-computed case: one query over two equal keys gives `lse = s + ln 2` and the mean of the
/// two values; row 0 sees only key 0.
#[test]
fn cube_hand_computed_lse() {
    let dev = wgpu();
    let params = CubeAttentionParams::new(CubeEncoding::Nope);
    let shape = [1, 1, 2, 1];
    let (out, lse) = cube::forward(
        host_to_cube(&[0.0, 1.0], shape, &dev),
        host_to_cube(&[3.0, 3.0], shape, &dev),
        host_to_cube(&[2.0, 4.0], shape, &dev),
        &params,
    );
    let out = cube_to_host(out);
    let lse = cube_to_host(lse);
    assert!((lse[0] - 0.0).abs() < 1e-6, "lse[0] = {}", lse[0]);
    assert!(
        (lse[1] - (3.0 + 2f32.ln())).abs() < 1e-5,
        "lse[1] = {}",
        lse[1]
    );
    assert!((out[0] - 2.0).abs() < 1e-6);
    assert!((out[1] - 3.0).abs() < 1e-5);
}

/// The model's heads, split from `[batch, seq, heads, head_dim]` by `swap_dims(1, 2)` without a
/// copy ("token-major"), give the same forward and backward as contiguous heads, for every
/// encoding kind and layout, and `out`, `dq`, `dk`, `dv` come back in that layout (so merging the
/// heads again needs no copy): RoPE's and PoPE's first kernel reads them in place, NoPE's and
/// TAPA's are copied into rows by one launch.
#[test]
fn token_major_heads_match_contiguous_heads() {
    use burn::backend::ops::FloatTensorOps;
    use burn_cubecl::CubeBackend;
    use lab::kernels::map::{PairLayout, TapaPhase};
    let dev = wgpu();
    let [b, h, l, d] = [2usize, 3, 7, 8];
    let n = b * h * l * d;
    // Logical [b, h, l, d] values, and the same stored [b, l, h, d].
    let value = |seed: f32, i: usize| (seed * (i as f32 + 1.0)).sin();
    let at = |bi: usize, hi: usize, li: usize, di: usize| ((bi * h + hi) * l + li) * d + di;
    let token_major_of = |x: &[f32]| {
        let mut t = vec![0.0f32; n];
        for bi in 0..b {
            for li in 0..l {
                for hi in 0..h {
                    for di in 0..d {
                        t[((bi * l + li) * h + hi) * d + di] = x[at(bi, hi, li, di)];
                    }
                }
            }
        }
        t
    };
    let [q, k, v, dout] =
        [0.37f32, 0.61, 0.83, 1.19].map(|s| (0..n).map(|i| value(s, i)).collect::<Vec<f32>>());
    let contiguous = |x: &[f32]| host_to_cube(x, [b, h, l, d], &dev);
    let token_major = |x: &[f32]| {
        CubeBackend::float_swap_dims(host_to_cube(&token_major_of(x), [b, l, h, d], &dev), 1, 2)
    };
    let delta: Vec<f32> = (0..h * d).map(|i| -0.4 * value(1.7, i).abs()).collect();
    let encodings = || {
        [
            ("nope", CubeEncoding::Nope),
            (
                "rope",
                CubeEncoding::Rope {
                    inv_freq: vec![1.0, 0.3, 0.1],
                    layout: PairLayout::Adjacent,
                    attention_factor: 1.0,
                },
            ),
            (
                "rope-half",
                CubeEncoding::Rope {
                    inv_freq: vec![1.0, 0.5, 0.25, 0.125],
                    layout: PairLayout::RotateHalf,
                    attention_factor: 1.1,
                },
            ),
            (
                "tapa",
                CubeEncoding::Tapa {
                    amp_dim: 4,
                    alpha: 0.1,
                    phase: TapaPhase::Quadratic,
                    phase_gain: 1.0,
                },
            ),
            (
                "tapa-linear",
                CubeEncoding::Tapa {
                    amp_dim: 3,
                    alpha: 0.2,
                    phase: TapaPhase::Linear,
                    phase_gain: 1.0,
                },
            ),
            (
                "pope",
                CubeEncoding::Pope {
                    theta: (0..d).map(|c| 0.8f64.powi(c as i32)).collect(),
                    delta: host_to_cube(&delta, [h * d], &dev),
                },
            ),
        ]
    };
    let max_diff = |a: Vec<f32>, b: Vec<f32>| {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    };
    for strategy in ["rows", "tiled", "tiled-split", "cmma"] {
        for (name, encoding) in encodings() {
            let mut params = CubeAttentionParams::new(encoding);
            params.strategy = cube::CubeStrategy::parse(strategy).unwrap();
            let what = format!("{name}, {strategy}");
            type Heads<'a> = &'a dyn Fn(&[f32]) -> burn_cubecl::tensor::CubeTensor;
            // Forward and backward with q, k, v laid out by `heads`, dout by `dout_heads`: every
            // output on the host, and whether each is stored contiguously.
            let run = |heads: Heads, dout_heads: Heads| {
                let (qt, kt, vt) = (heads(&q), heads(&k), heads(&v));
                let (out, lse) = cube::forward(qt.clone(), kt.clone(), vt.clone(), &params);
                let g = cube::backward(
                    qt,
                    kt,
                    vt,
                    out.clone(),
                    lse.clone(),
                    dout_heads(&dout),
                    &params,
                );
                let mut parts = vec![("out", out), ("lse", lse), ("dq", g.dq), ("dk", g.dk)];
                parts.push(("dv", g.dv));
                parts.extend(g.ddelta.map(|t| ("dδ", t)));
                parts
                    .into_iter()
                    .map(|(part, t)| (part, t.is_contiguous(), cube_to_host(t)))
                    .collect::<Vec<_>>()
            };
            let reference = run(&contiguous, &contiguous);
            assert_eq!(reference.len(), if name == "pope" { 6 } else { 5 });
            assert!(reference.iter().all(|(_, contiguous, _)| *contiguous));
            // Not all zero: the comparisons compare something.
            assert!(
                reference[2].2.iter().any(|x| x.abs() > 1e-3),
                "{what}: dq ≈ 0"
            );
            for (layout, dout_heads) in [
                ("token-major", &token_major as Heads),
                ("mixed", &contiguous),
            ] {
                for ((part, contiguous, got), (_, _, want)) in
                    run(&token_major, dout_heads).into_iter().zip(&reference)
                {
                    let layout_kept = part != "lse" && part != "dδ";
                    assert_eq!(
                        contiguous, !layout_kept,
                        "{what}, {layout}: {part}'s layout"
                    );
                    let diff = max_diff(got, want.clone());
                    assert!(
                        diff <= 1e-6,
                        "{what}, {layout}: max |{part} − contiguous heads'| = {diff}"
                    );
                }
            }
        }
    }
}

/// The fused masked cross-entropy on wgpu (`model::masked_cross_entropy_for` with the fused
/// kernels: `xent_fwd`, `xent_bwd`) gives burn's tensor-operation loss, correct count and logit
/// gradient (`model::masked_cross_entropy`), and the loss and count a direct f64 computation gives;
/// the reference kernel and `LAB_POINTWISE=ops` keep burn's operations. Rows with a tie for the
/// maximum test the first-maximum rule of burn's `argmax`.
#[test]
fn fused_cross_entropy_matches_the_tensor_ops() {
    use burn::tensor::{Int, Tensor, TensorData};
    use lab::model::{AttentionKernel, masked_cross_entropy, masked_cross_entropy_for};
    let dev = wgpu().autodiff();
    let (b, l, v) = (3usize, 5usize, 7usize);
    let mut logits: Vec<f32> = (0..b * l * v)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) / 4.0)
        .collect();
    // Row 4: logits 2 and 5 tie at the maximum.
    logits[4 * v + 2] = 9.0;
    logits[4 * v + 5] = 9.0;
    let targets: Vec<i64> = (0..b * l).map(|i| (i * 5 % v) as i64).collect();
    let mut targets = targets;
    targets[4] = 2;
    let mask: Vec<f32> = (0..b * l)
        .map(|i| if i % 4 == 3 { 0.0 } else { 1.0 })
        .collect();
    let n = mask.iter().filter(|&&m| m > 0.0).count();
    let scalar = |t: Tensor<1>| t.into_data().try_to_vec::<f32>().unwrap()[0];
    let run = |fused: bool| {
        let x =
            Tensor::<3>::from_data(TensorData::new(logits.clone(), [b, l, v]), &dev).require_grad();
        let t = Tensor::<2, Int>::from_data(TensorData::new(targets.clone(), [b, l]), &dev);
        let m = Tensor::<2>::from_data(TensorData::new(mask.clone(), [b, l]), &dev);
        let (loss, correct) = if fused {
            masked_cross_entropy_for(AttentionKernel::Fused, x.clone(), t, m, n)
        } else {
            masked_cross_entropy(x.clone(), t, m, n)
        };
        let grads = (loss.clone() * 3.0).backward();
        let dx = x
            .grad(&grads)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        (scalar(loss), scalar(correct), dx)
    };
    let (loss_f, correct_f, dx_f) = run(true);
    let (loss_o, correct_o, dx_o) = run(false);
    // Direct: mean over scored rows of logsumexp − picked; argmax the first maximum.
    let (mut want_loss, mut want_correct) = (0.0f64, 0.0f64);
    for r in (0..b * l).filter(|&r| mask[r] > 0.0) {
        let row = &logits[r * v..(r + 1) * v];
        let m = row.iter().fold(f32::MIN, |a, &x| a.max(x)) as f64;
        let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
        want_loss += lse - row[targets[r] as usize] as f64;
        let arg = (0..v).find(|&c| row[c] as f64 == m).unwrap();
        want_correct += f64::from(arg == targets[r] as usize);
    }
    want_loss /= n as f64;
    assert!(
        want_correct >= 2.0,
        "the case scores some correct rows: {want_correct}"
    );
    assert!(
        (loss_f as f64 - want_loss).abs() < 1e-5,
        "fused {loss_f} vs {want_loss}"
    );
    assert!(
        (loss_o as f64 - want_loss).abs() < 1e-5,
        "ops {loss_o} vs {want_loss}"
    );
    assert_eq!(correct_f as f64, want_correct);
    assert_eq!(correct_o as f64, want_correct);
    assert_eq!(dx_f.len(), dx_o.len());
    for (i, (a, o)) in dx_f.iter().zip(&dx_o).enumerate() {
        assert!((a - o).abs() <= 1e-6, "dlogits[{i}]: fused {a}, ops {o}");
        if mask[i / v] == 0.0 {
            assert_eq!(*a, 0.0, "dlogits[{i}] of an unscored row");
        }
    }
    // The reference kernel keeps burn's operations: the same value, not the kernel's.
    let x = Tensor::<3>::from_data(TensorData::new(logits.clone(), [b, l, v]), &dev);
    let t = Tensor::<2, Int>::from_data(TensorData::new(targets.clone(), [b, l]), &dev);
    let m = Tensor::<2>::from_data(TensorData::new(mask.clone(), [b, l]), &dev);
    let (loss_r, _) = masked_cross_entropy_for(AttentionKernel::Reference, x, t, m, n);
    assert_eq!(scalar(loss_r).to_bits(), loss_o.to_bits());
}

/// The CUDA C++ of every kernel, for an H100/H200 (sm 90), generated without a GPU (feature
/// `cuda-source`; `lab bench cuda-source`, `make cuda-ptxas` compiles it further with NVRTC):
/// every encoding and layout at head_dim 64 compiles; the `cmma` layouts emit `wmma` tensor-core
/// code, forward and backward, for every encoding (TAPA's amplitude part; its quadratic phase's
/// product too); `tiled-split` launches two key-side kernels where `tiled` launches one.
#[cfg(feature = "cuda-source")]
#[test]
fn cuda_sources_for_sm90_cover_every_kernel() {
    use lab::kernels::cuda_source;
    let encodings = ["nope", "rope", "pope", "tapa", "tapa-linear"];
    let named: Vec<cuda_source::NamedEncoding> = encodings
        .iter()
        .map(|&name| {
            let (encoding, delta) = lab::bench::bench_encoding(name, 8, 64).unwrap();
            (name.to_string(), encoding, delta)
        })
        .collect();
    let sources = cuda_source::attention_sources(&wgpu(), 90, 8, 64, &named).unwrap();
    let used_by = |label: &str| -> Vec<&cuda_source::KernelSource> {
        sources
            .iter()
            .filter(|k| k.uses.iter().any(|u| u == label))
            .collect()
    };
    for enc in encodings {
        for strategy in lab::kernels::CUBE_STRATEGIES {
            let label = format!("{enc}/{strategy}");
            let kernels = used_by(&label);
            let names: Vec<&str> = kernels.iter().map(|k| k.kernel).collect();
            let count = |name: &str| names.iter().filter(|n| **n == name).count();
            let cmma = strategy.starts_with("cmma");
            assert_eq!(
                count("attn_fwd_cmma"),
                usize::from(cmma),
                "{label}: {names:?}"
            );
            // The tensor-core backward: where the tensor-core forward runs.
            let cmma_bwd = cmma;
            assert_eq!(
                count("attn_bwd_dq_cmma"),
                usize::from(cmma_bwd),
                "{label}: {names:?}"
            );
            assert_eq!(
                count("attn_bwd_dkdv_cmma"),
                usize::from(cmma_bwd),
                "{label}: {names:?}"
            );
            let dkdv = if strategy == "rows" {
                "attn_bwd_dkdv"
            } else {
                "attn_bwd_dkdv_tiled"
            };
            let splits = match strategy {
                "tiled-split" => 2,
                _ if cmma_bwd => 0,
                _ => 1,
            };
            assert_eq!(count(dkdv), splits, "{label}: {names:?}");
            assert_eq!(count("row_dot"), 1, "{label}: {names:?}");
            for k in &kernels {
                assert!(
                    k.source.contains(&format!(" {}(", k.entry)),
                    "{label}: entry {} is not a function of the source",
                    k.entry
                );
                assert!(
                    k.source.contains(&format!(
                        "__global__ void __launch_bounds__({})",
                        k.cube_dim[0]
                    )),
                    "{label}: {} is not a launch-bounded CUDA kernel",
                    k.entry
                );
                if k.kernel.ends_with("_cmma") {
                    assert!(
                        k.source.contains("wmma::mma_sync"),
                        "{label}: no wmma in {}",
                        k.entry
                    );
                    assert!(
                        k.source.contains("half"),
                        "{label}: no f16 operands in {}",
                        k.entry
                    );
                }
            }
        }
    }
    // The shared memory the layouts' plane counts are chosen by is what cubecl-cpp declares.
    for k in &sources {
        let enc = k.uses[0].split('/').next().unwrap();
        let w = if enc == "pope" { 128 } else { 64 };
        let tapa = enc.starts_with("tapa").then_some(enc == "tapa-linear");
        let planes = k.cube_dim[0] as usize / 32;
        let expected = match k.kernel {
            "attn_fwd_cmma" => cube::cmma_fwd_shared_bytes(w, 64, tapa, planes),
            "attn_bwd_dq_cmma" => cube::cmma_bwd_shared_bytes(w, 64, tapa, planes).0,
            "attn_bwd_dkdv_cmma" => cube::cmma_bwd_shared_bytes(w, 64, tapa, planes).1,
            _ => continue,
        };
        assert_eq!(k.shared_bytes, expected, "{} {:?}", k.kernel, k.uses);
    }
    // Every kernel is listed once: the entry names (type + comptime hash) are distinct.
    let mut entries: Vec<&str> = sources.iter().map(|k| k.entry.as_str()).collect();
    entries.sort_unstable();
    entries.dedup();
    assert_eq!(entries.len(), sources.len());
}

/// `lab selfcheck --layouts`: only the named layouts' kernel groups run (the extension and
/// training-step groups do not).
#[test]
fn selfcheck_layouts_run_only_those_kernel_groups() {
    let report = selfcheck::run(Backend::Wgpu, Some(&["tiled-staged", "cmma"])).unwrap();
    let groups: std::collections::BTreeSet<&str> =
        report.checks.iter().map(|c| c.group.as_str()).collect();
    assert_eq!(
        groups.into_iter().collect::<Vec<_>>(),
        ["kernel cmma", "kernel tiled-staged"]
    );
    assert_eq!(report.checks.len(), 2 * (12 * 3 * 4 + 3));
    assert!(report.passed(), "{}", report.text());
}

/// The host C++ compiler of the `cuda_host` checks (`CXX`, default `c++`).
#[cfg(feature = "cuda-source")]
fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".to_string())
}

/// The device selfcheck's tolerances for the same kernels, as `cuda_host` takes them.
#[cfg(feature = "cuda-source")]
fn host_tols() -> lab::kernels::cuda_host::HostTolerances {
    lab::kernels::cuda_host::HostTolerances {
        wmma: selfcheck::CMMA_TOL,
        f32: selfcheck::ATTENTION_TOL,
    }
}

/// The CUDA C++ of every launch of the layouts no GPU has run yet (the tensor-core `cmma`,
/// `cmma-wide`, and `tiled-staged`, `tiled-split`), for every encoding, run on the host
/// (`lab::kernels::cuda_host`) from the same inputs as the same launch on lavapipe, matches it;
/// the tensor-core kernels' `wmma` calls among them (30: three kernels, two layouts, five
/// encodings), `cmma-wide`'s backward with the four planes CUDA takes where lavapipe takes two.
#[cfg(feature = "cuda-source")]
#[test]
fn cuda_sources_run_on_the_host_match_wgpu() {
    use lab::kernels::cuda_host;
    let encodings: Vec<_> = ["nope", "rope", "pope", "tapa", "tapa-linear"]
        .iter()
        .map(|&name| {
            let (encoding, delta) = lab::bench::bench_encoding(name, 2, 32).unwrap();
            (name.to_string(), encoding, delta)
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("lab-cuda-host-{}", std::process::id()));
    let checks = cuda_host::check_on_host(
        &wgpu(),
        90,
        [1, 2, 33, 32],
        &encodings,
        &["cmma", "cmma-wide", "tiled-staged", "tiled-split"],
        0,
        &dir,
        &cxx(),
        host_tols(),
        |_| {},
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| !c.passed())
        .map(|c| format!("{} {}: {:?}", c.label, c.kernel, c.error))
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
    let wmma: Vec<_> = checks.iter().filter(|c| c.wmma).collect();
    assert_eq!(wmma.len(), 30);
    assert!(wmma.iter().all(|c| c.kernel.ends_with("_cmma")));
    let worst = checks.iter().map(|c| c.max_abs).fold(0.0f32, f32::max);
    assert!(worst > 0.0 && worst < 1e-4, "max |diff| {worst}");
    let wide_bwd = checks
        .iter()
        .filter(|c| c.label == "nope/cmma-wide" && c.kernel == "attn_bwd_dq_cmma")
        .collect::<Vec<_>>();
    assert_eq!(wide_bwd.len(), 1);
    assert_eq!(wide_bwd[0].cuda_config.1, [128, 1, 1]);
    assert_eq!(wide_bwd[0].wgpu_config.map(|c| c.1), Some([64, 1, 1]));
}

/// A hand-written kernel in cubecl-cpp's form: `A Aᵀ` on `wmma` for the 16 × 16 f16 tile `A` of
/// buffer 0 into buffer 1, with a pointer offset (`scalars_u32[0]` halves) and a fault
/// (`scalars_u32[1]`: 1, lanes 16–31 skip a load; 2, threads 16–31 skip the barrier).
#[cfg(feature = "cuda-source")]
const WMMA_KERNEL: &str = r#"typedef unsigned int uint32_t;
#include <mma.h>
#include <cuda_fp16.h>
struct info_st {
uint32_t scalars_u32[2];uint32_t static_meta[2];
};
extern "C" __global__ void __launch_bounds__(32)  aat_1(float const* const __restrict__ v1, float * const __restrict__ v2, __grid_constant__ info_st const info) {
extern __shared__ __align__(32) char smem[];
__half *a = reinterpret_cast<__half *>(&smem[0]);
uint32_t const off = info.scalars_u32[0];
uint32_t const fault = info.scalars_u32[1];
for (uint32_t e = threadIdx.x; e < 256; e += 32) { a[e] = __half(v1[e]); }
if (!(fault == 2 && threadIdx.x >= 16)) { __syncthreads(); }
nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __half, nvcuda::wmma::row_major> fa;
nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __half, nvcuda::wmma::col_major> fb;
nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> fc;
nvcuda::wmma::fill_fragment(fc, 0.0f);
nvcuda::wmma::load_matrix_sync(fa, a + off, 16);
if (!(fault == 1 && threadIdx.x >= 16)) { nvcuda::wmma::load_matrix_sync(fb, a, 16); }
nvcuda::wmma::mma_sync(fc, fa, fb, fc);
nvcuda::wmma::store_matrix_sync(v2, fc, 16, nvcuda::wmma::mem_row_major);
}
"#;

/// The host's `wmma` model computes `A Aᵀ` from f16 operands (row-major `A`, column-major `B`
/// read from the same tile) as hand-computed here, and the harness refuses a misaligned
/// pointer, lanes of a warp making different calls and threads reaching different barriers.
#[cfg(feature = "cuda-source")]
#[test]
fn cuda_host_models_wmma_and_refuses_broken_launches() {
    use half::f16;
    use lab::kernels::cuda_host::{self, ArgKind, TeedLaunch};
    use lab::kernels::cuda_source::KernelSource;
    let a: Vec<f32> = (0..256)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
        .collect();
    let h: Vec<f32> = a.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
    let aat: Vec<f32> = (0..256)
        .map(|e| {
            (0..16)
                .map(|k| h[e / 16 * 16 + k] * h[e % 16 * 16 + k])
                .sum()
        })
        .collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let source = KernelSource {
        kernel: "aat",
        entry: "aat_1".into(),
        cube_dim: [32, 1, 1],
        shared_bytes: 512,
        uses: vec![],
        source: WMMA_KERNEL.into(),
    };
    let dir = std::env::temp_dir().join(format!("lab-cuda-host-wmma-{}", std::process::id()));
    let run = |off: u32, fault: u32| {
        let launch = TeedLaunch {
            kernel: "aat",
            count: [1, 1, 1],
            cube_dim: [32, 1, 1],
            args: vec![
                ArgKind::Buffer,
                ArgKind::Buffer,
                ArgKind::U32(off),
                ArgKind::U32(fault),
            ],
            before: vec![bytes(&a), bytes(&[0.0; 256])],
            after: vec![bytes(&a), bytes(&aat)],
        };
        cuda_host::check_source(
            &dir,
            &cxx(),
            "test",
            &source,
            &launch,
            [1, 1, 1],
            host_tols(),
        )
        .unwrap()
    };
    let ok = run(0, 0);
    assert!(ok.passed(), "{:?}", ok.error);
    assert!(ok.wmma && ok.max_abs < 1e-5, "{}", ok.max_abs);
    let misaligned = run(2, 0).error.unwrap();
    assert!(
        misaligned.contains(
            "load_matrix_sync: pointer at shared memory + 4 bytes is not 256-bit aligned"
        ),
        "{misaligned}"
    );
    let diverged = run(0, 1).error.unwrap();
    assert!(
        diverged.contains("lane 16 of warp 0 made 4 wmma calls, lane 0 5"),
        "{diverged}"
    );
    let barrier = run(0, 2).error.unwrap();
    assert!(
        barrier.contains("thread 16 reached 0 barriers, thread 0 1"),
        "{barrier}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The launch's info struct: runtime scalars by type in argument order, then the buffers'
/// lengths, as cubecl's launcher packs them; the epilogue passes every buffer and defines the
/// kernel's shared memory; the comparison applies the tolerance per value.
#[cfg(feature = "cuda-source")]
#[test]
fn cuda_host_info_epilogue_and_comparison() {
    use lab::kernels::cuda_host::{ArgKind, compare, epilogue, info_bytes};
    use lab::kernels::cuda_source::KernelSource;
    const SOURCE: &str = "struct info_st {\n    float scalars_f32[2];\nuint32_t scalars_u32[2];uint32_t static_meta[4];\n};\n\
extern \"C\" __global__ void __launch_bounds__(32)  k_1(float const* const __restrict__ v1, float * const __restrict__ v5, __grid_constant__ info_st const info_v9) {\n\
extern __shared__ __align__(32) char v77[];uint32_t const v3 = 0;\n}\n";
    let args = [
        ArgKind::Buffer,
        ArgKind::U32(33),
        ArgKind::F32(0.5),
        ArgKind::Buffer,
        ArgKind::F32(-2.0),
    ];
    let words: Vec<u32> = info_bytes(SOURCE, &args, &[64, 128])
        .unwrap()
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(
        words,
        [0.5f32.to_bits(), (-2.0f32).to_bits(), 33, 0, 64, 128, 0, 0]
    );
    let too_many = [ArgKind::U32(1), ArgKind::U32(2), ArgKind::U32(3)];
    let err = info_bytes(SOURCE, &too_many, &[]).unwrap_err();
    assert!(err.contains("scalars_u32[2] cannot hold 3"), "{err}");

    let mut source = KernelSource {
        kernel: "k",
        entry: "k_1".into(),
        cube_dim: [32, 1, 1],
        shared_bytes: 640,
        uses: vec![],
        source: SOURCE.into(),
    };
    let e = epilogue(&source).unwrap();
    assert!(e.contains("alignas(128) char v77[640];"), "{e}");
    assert!(
        e.contains("k_1(lab_any{b[0]}, lab_any{b[1]}, info);"),
        "{e}"
    );
    assert!(e.contains("lab_shared() { return v77; }"), "{e}");
    source.source = SOURCE.replace("extern __shared__ __align__(32) char v77[];", "");
    let e = epilogue(&source).unwrap();
    assert!(e.contains("lab_shared() { return nullptr; }"), "{e}");
    assert!(e.contains("lab_shared_size() { return 0; }"), "{e}");

    let f = |v: &[f32]| vec![v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()];
    let tol = selfcheck::Tolerance {
        abs: 1e-3,
        rel: 0.0,
    };
    let (max_abs, worst, err) = compare(&f(&[1.0, 2.0]), &f(&[1.0005, 2.0]), tol);
    assert!((max_abs - 5e-4).abs() < 1e-6, "{max_abs}");
    assert!((worst - 0.5).abs() < 1e-3 && err.is_none(), "{worst}");
    let (_, worst, err) = compare(&f(&[1.0, 2.0]), &f(&[1.0, 2.002]), tol);
    assert!(worst > 1.9 && err.unwrap().contains("buffer 0[1]"));
    // Bit-identical NaNs (memory neither side wrote) agree; a NaN on one side does not.
    let nan = f32::from_bits(0xffff_ffff);
    assert!(compare(&f(&[nan]), &f(&[nan]), tol).2.is_none());
    assert!(compare(&f(&[1.0]), &f(&[nan]), tol).2.is_some());
}

/// CubeCL's own library attention on the lab's transformed rows (`cube::library_forward`, the
/// reference row of `lab bench attention --strategy library`; on lavapipe burn-cubecl's unfused
/// fallback, f16 inputs) matches the lab's f32 forward for NoPE, RoPE and PoPE within f16 input
/// rounding (`CMMA_TOL` at |out| ≤ 1: 1.5e-2); TAPA is refused in one line.
#[test]
fn library_forward_matches_the_lab_forward() {
    for enc in ["nope", "rope", "pope"] {
        let r = lab::bench::bench_library_attention(&wgpu(), "wgpu", enc, [1, 2, 33, 32], 0, 1)
            .unwrap();
        let diff = r.out_max_diff.unwrap();
        assert!(
            diff > 0.0 && diff < 1.5e-2,
            "{enc}: max |out - tiled| {diff}"
        );
        assert!(r.fwd_ms > 0.0 && r.fwd_bwd_ms.is_nan() && r.strategy == "library");
    }
    let err = lab::bench::bench_library_attention(&wgpu(), "wgpu", "tapa", [1, 2, 33, 32], 0, 1)
        .unwrap_err();
    assert!(err.contains("not a dot product"), "{err}");
}

/// `lab bench train-step --preset smoke --backend wgpu` with the environment `env`, not run yet.
fn smoke_step_command(env: &[(&str, &str)]) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_lab"));
    cmd.args([
        "bench",
        "train-step",
        "--preset",
        "smoke",
        "--backend",
        "wgpu",
    ])
    .envs(env.iter().copied());
    cmd
}

/// [`smoke_step_command`] with 2 profiled steps, as its own process (the launch observer is
/// process-wide): its JSON.
fn profiled_smoke_step(env: &[(&str, &str)]) -> serde_json::Value {
    let out = smoke_step_command(env)
        .args([
            "--steps",
            "1",
            "--warmup",
            "1",
            "--profile-steps",
            "2",
            "--threads",
            "1",
        ])
        .output()
        .expect("lab runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

/// `lab bench train-step --profile-steps`: the launches of two profiled steps of the block-width
/// smoke model (RoPE, 1 layer), counted by kernel and timed on the device, then two steps under
/// CubeCL's dry run for the host's time. The launch observer is
/// process-wide, so the benchmark runs as its own process (this file's other tests launch kernels
/// at the same time). The lab's own kernels are counted exactly: per layer and step one tiled
/// forward, one `dq` and one key-side backward kernel, one `RowDot` (the backward's `Σ dout·out`
/// per row) and three rotation launches (q and k forward, again in the backward, and dq and dk
/// rotated back, each pair in one launch), and no copy: the heads are split and merged in place
/// (`kernels::cube::kernel_qk`).
#[test]
fn training_step_launches_are_counted_and_timed() {
    let j = profiled_smoke_step(&[]);
    assert_eq!(
        j["fusion"].is_null(),
        !cfg!(feature = "fusion"),
        "{}",
        j["fusion"]
    );
    assert_eq!(j["encoding"], "rope");
    assert_eq!(j["profile_steps"], 2);
    let layers = j["n_layers"].as_f64().unwrap();
    let kinds = j["launch_kinds"].as_array().unwrap();
    let per_step = |k: &str| {
        kinds
            .iter()
            .find(|e| e["kernel"] == k)
            .map_or(0.0, |e| e["per_step"].as_f64().unwrap())
    };
    assert_eq!(per_step("AttnFwdTiled"), layers, "{kinds:?}");
    assert_eq!(per_step("AttnBwdDqTiled"), layers);
    assert_eq!(per_step("AttnBwdDkdvTiled"), layers);
    assert_eq!(per_step("RowDot"), layers);
    assert_eq!(per_step("RopeRotate"), 3.0 * layers);
    assert_eq!(per_step("CopyKernel"), 0.0, "{kinds:?}");
    // The gradient norm: one partial-sum kernel per 24 parameters (embedding, head, final gain,
    // and eight per block: two gains and six matrices).
    assert_eq!(
        per_step("SqSumPartials"),
        ((3.0 + 8.0 * layers) / 24.0).ceil()
    );
    // Read once at the step's end: the partials added and the clip factor made on the device.
    assert_eq!(j["step_reads"], "once");
    assert_eq!(per_step("StepStats"), 1.0);
    // AdamW: one fused update per parameter.
    assert_eq!(j["adamw"], "fused");
    assert_eq!(per_step("AdamwUpdate"), 3.0 + 8.0 * layers);
    // RMSNorm (two per block and the final one) and GELU (one per block), forward and backward.
    assert_eq!(j["pointwise"], "fused");
    assert_eq!(per_step("RmsNormFwd"), 2.0 * layers + 1.0);
    assert_eq!(per_step("RmsNormBwd"), 2.0 * layers + 1.0);
    assert_eq!(per_step("GeluFwd"), layers);
    assert_eq!(per_step("GeluBwd"), layers);
    // The masked cross-entropy: one kernel each way.
    assert_eq!(per_step("XentFwd"), 1.0);
    assert_eq!(per_step("XentBwd"), 1.0);
    let launches = j["launches_per_step"].as_f64().unwrap();
    let summed: f64 = kinds.iter().map(|e| e["per_step"].as_f64().unwrap()).sum();
    assert!((launches - summed).abs() < 1e-9, "{launches} vs {summed}");
    assert!(launches > 10.0 * layers, "{launches} launches per step");
    let ms = j["device_ms_per_step"]
        .as_f64()
        .expect("every launch timed");
    assert!(ms > 0.0 && ms.is_finite(), "device ms {ms}");
    assert!(j["device_timing"].is_string());
    let host = j["host_ms_per_step"]
        .as_f64()
        .expect("the dry-run steps ran");
    assert!(host > 0.0 && host.is_finite(), "host ms {host}");
    // The CPU backend has no CubeCL launches: the flag is refused in one line.
    let cpu = std::process::Command::new(env!("CARGO_BIN_EXE_lab"))
        .args([
            "bench",
            "train-step",
            "--preset",
            "smoke",
            "--profile-steps",
            "2",
        ])
        .output()
        .expect("lab runs");
    let err = String::from_utf8_lossy(&cpu.stderr);
    assert!(
        !cpu.status.success() && err.contains("--profile-steps"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// burn's fusion as the lab sets it (`lab::kernels::fusion_config`): one block per stretch
/// launches fewer kernels per step than burn's default search width (5), whose ordering repair
/// ran whole stretches unfused — measured with burn's own RMSNorm, GELU and loss
/// (`LAB_POINTWISE=ops`), the stretches that fusion orders; with the lab's kernels (the default)
/// the two widths launch the same; the attention drained the stream or not
/// (`LAB_FUSION_ATTENTION`), the lab's own kernels are the same; a bad value is refused in one
/// line.
#[cfg(feature = "fusion")]
#[test]
fn fusion_settings_fuse_more_of_the_step() {
    use lab::kernels::fusion_config::with_max_blocks;
    let config = with_max_blocks(burn::BurnConfig::default(), 3);
    assert_eq!(config.fusion().beam_search.max_blocks, 3);
    let default = burn::BurnConfig::default();
    assert_eq!(default.fusion().beam_search.max_blocks, 5, "burn's default");
    assert_eq!(
        config.fusion().growth_patience,
        default.fusion().growth_patience
    );

    let launches = |j: &serde_json::Value| j["launches_per_step"].as_f64().unwrap();
    let lab_kernels = |j: &serde_json::Value| {
        let mut k: Vec<(String, f64)> = j["launch_kinds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["kernel"].as_str().unwrap().to_string(),
                    e["per_step"].as_f64().unwrap(),
                )
            })
            .filter(|(name, _)| {
                name.starts_with("Attn") || name == "RowDot" || name == "RopeRotate"
            })
            .collect();
        k.sort_by(|a, b| a.0.cmp(&b.0));
        k
    };
    let lab_default = profiled_smoke_step(&[]);
    let blocks5 = profiled_smoke_step(&[("LAB_FUSION_MAX_BLOCKS", "5")]);
    let eager = profiled_smoke_step(&[("LAB_FUSION_ATTENTION", "eager")]);
    let ops = profiled_smoke_step(&[("LAB_POINTWISE", "ops")]);
    let ops_blocks5 =
        profiled_smoke_step(&[("LAB_POINTWISE", "ops"), ("LAB_FUSION_MAX_BLOCKS", "5")]);
    assert!(
        launches(&ops) < launches(&ops_blocks5),
        "burn's operations, max_blocks 1: {} launches per step, 5: {}",
        launches(&ops),
        launches(&ops_blocks5)
    );
    assert_eq!(
        launches(&lab_default),
        launches(&blocks5),
        "the lab's kernels, max_blocks 1 and 5"
    );
    assert_eq!(lab_default["fusion"]["max_blocks"], 1);
    assert_eq!(lab_default["fusion"]["attention"], "lazy");
    assert_eq!(blocks5["fusion"]["max_blocks"], 5);
    assert_eq!(eager["fusion"]["attention"], "eager");
    assert_eq!(lab_kernels(&lab_default), lab_kernels(&eager));
    assert_eq!(lab_kernels(&lab_default), lab_kernels(&blocks5));
    assert!(
        lab_kernels(&lab_default).len() >= 4,
        "{:?}",
        lab_kernels(&lab_default)
    );

    let bad = smoke_step_command(&[("LAB_FUSION_MAX_BLOCKS", "0")])
        .output()
        .expect("lab runs");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("LAB_FUSION_MAX_BLOCKS"))
        .unwrap_or("");
    assert!(line.contains("from 1 to 64"), "{err}");
}

/// `LAB_STEP_READS`: `each` brings back the step that reads the loss, the gradient norm and the
/// correct count as it goes (the norm's partials summed on the host: no `StepStats` kernel, the
/// same partial-sum launches and attention kernels); the JSON says which ran; a bad value is
/// refused in one line.
#[test]
fn step_reads_once_or_each() {
    let per_step = |j: &serde_json::Value, k: &str| {
        j["launch_kinds"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kernel"] == k)
            .map_or(0.0, |e| e["per_step"].as_f64().unwrap())
    };
    let once = profiled_smoke_step(&[]);
    let each = profiled_smoke_step(&[("LAB_STEP_READS", "each")]);
    assert_eq!(once["step_reads"], "once");
    assert_eq!(each["step_reads"], "each");
    assert_eq!(per_step(&once, "StepStats"), 1.0);
    assert_eq!(per_step(&each, "StepStats"), 0.0);
    for k in [
        "SqSumPartials",
        "AttnFwdTiled",
        "AttnBwdDkdvTiled",
        "RopeRotate",
    ] {
        assert_eq!(per_step(&once, k), per_step(&each, k), "{k}");
    }
    let bad = smoke_step_command(&[("LAB_STEP_READS", "twice")])
        .output()
        .expect("lab runs");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success(), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("LAB_STEP_READS = `twice`") && err.contains("once (the default) or each"),
        "{err}"
    );
}

/// 30 tensors of 1 to 291 elements (more than one `sq_sum_partials` launch takes), element `i` of
/// tensor `k` being `((i + 3k) mod 11)·scale − offset`, and their sum of squares in f64.
fn thirty_tensors(scale: f32, offset: f32) -> (Vec<Vec<f32>>, f64) {
    let ts: Vec<Vec<f32>> = (0..30)
        .map(|k| {
            (0..1 + k * 10)
                .map(|i| ((i + 3 * k) % 11) as f32 * scale - offset)
                .collect()
        })
        .collect();
    let sq = ts
        .iter()
        .flatten()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum();
    (ts, sq)
}

/// The gradient norm's sum of squares on the device (`cube::sum_of_squares`) against a direct
/// f64 sum: tensors shorter than, equal to and longer than a unit's 256 elements, a partial last
/// stride, a matrix; and the same bits twice; no tensors give 0; 30 tensors (two launches); a view
/// into a larger buffer.
#[test]
fn sum_of_squares_matches_a_direct_sum() {
    let d = wgpu();
    let mut want = 0.0f64;
    let mut host = Vec::new();
    for (k, shape) in [
        [1usize, 1],
        [1, 255],
        [1, 256],
        [1, 257],
        [17, 31],
        [1, 3 * 256 + 5],
    ]
    .into_iter()
    .enumerate()
    {
        let n = shape[0] * shape[1];
        let v: Vec<f32> = (0..n)
            .map(|i| ((i * 7 + k * 13) % 23) as f32 * 0.125 - 1.3)
            .collect();
        want += v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>();
        host.push((v, shape));
    }
    let run = || {
        cube::sum_of_squares(
            host.iter()
                .map(|(v, shape)| host_to_cube(v, *shape, &d))
                .collect(),
        )
    };
    let got = run();
    assert!((got - want).abs() <= 1e-6 * want, "{got} vs {want}");
    assert_eq!(got.to_bits(), run().to_bits());
    assert_eq!(cube::sum_of_squares(Vec::new()), 0.0);
    // More tensors than one launch takes (24): 30 tensors of 1 to 291 elements, in two launches.
    let (many, want) = thirty_tensors(1.0, 5.0);
    let got = cube::sum_of_squares(
        many.iter()
            .map(|v| host_to_cube(v, [v.len()], &d))
            .collect(),
    );
    assert!((got - want).abs() <= 1e-6 * want, "{got} vs {want}");
    // A view into a larger buffer (rows 1..3 of 4, burn-cubecl's slice: the same buffer at an
    // offset): only its own elements count.
    let big: Vec<f32> = (0..512).map(|i| (i % 7) as f32 - 3.0).collect();
    let view = burn_cubecl::kernel::slice(host_to_cube(&big, [4, 128], &d), &[1..3, 0..128]);
    let want: f64 = big[128..384]
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum();
    let got = cube::sum_of_squares(vec![view]);
    assert!((got - want).abs() <= 1e-6 * want, "{got} vs {want}");
}

/// The gradient norm's kernel (`sq_sum_partials`, launched by `cube::sum_of_squares`) compiles to
/// CUDA C++ for an sm 90 GPU (captured, not launched: the read afterwards returns whatever the
/// unwritten buffer holds).
#[cfg(feature = "cuda-source")]
#[test]
fn gradient_norm_kernel_compiles_for_sm90() {
    use lab::kernels::cuda_source;
    let t = host_to_cube(&[1.0f32; 300], [300], &wgpu());
    let (_, kernels) = cuda_source::capture(90, || cube::sum_of_squares(vec![t]));
    assert_eq!(kernels.len(), 1);
    let kernels = kernels.into_iter().map(|(n, _, k)| (n, k)).collect();
    let sources = cuda_source::compile(kernels, 90, "gradient norm").unwrap();
    assert_eq!(sources[0].kernel, "sq_sum_partials");
    assert!(
        sources[0].source.contains("__global__"),
        "{}",
        sources[0].source
    );
    // The training step's statistics: the partial sums, then the one-cube `step_stats`.
    let d = wgpu();
    let [g, loss, correct] =
        [&[1.0f32; 300][..], &[2.0], &[3.0]].map(|v| host_to_cube(v, [v.len()], &d));
    let (_, kernels) = cuda_source::capture(90, || cube::step_stats(vec![g], loss, correct, 1.0));
    let names: Vec<&str> = kernels.iter().map(|(n, _, _)| &**n).collect();
    assert_eq!(names, ["sq_sum_partials", "step_stats"]);
    let kernels = kernels.into_iter().map(|(n, _, k)| (n, k)).collect();
    let sources = cuda_source::compile(kernels, 90, "step statistics").unwrap();
    assert!(sources[1].source.contains("__global__"));
    // Everything a step launches besides the attention (`lab bench cuda-source`, `make
    // cuda-ptxas`): AdamW's update compiled twice, without moments (first step) and with them;
    // then the attention's kernels on the model's token-major heads.
    let sources = cuda_source::training_sources(&d, 90).unwrap();
    let names: Vec<&str> = sources.iter().map(|k| &*k.kernel).collect();
    assert_eq!(
        names,
        [
            "sq_sum_partials",
            "step_stats",
            "adamw_update",
            "adamw_update",
            "rms_norm_fwd",
            "rms_norm_bwd",
            "gelu_fwd",
            "gelu_bwd",
            "xent_fwd",
            "xent_bwd",
            // RoPE on token-major heads: the rotation reads them (and copies v, then dout), the
            // forward writes `out` back in their layout, `row_dot` reads it there, the inverse
            // rotation writes dq, dk and copies dv into it.
            "rope_rotate",
            "attn_fwd_tiled",
            "rope_rotate",
            "row_dot",
            "attn_bwd_dq_tiled",
            "attn_bwd_dkdv_tiled",
            "rope_rotate",
            // NoPE: `copy_rows` in, the same kernels, `copy_rows` out.
            "copy_rows",
            "attn_fwd_tiled",
            "copy_rows",
            "row_dot",
            "attn_bwd_dq_tiled",
            "attn_bwd_dkdv_tiled",
            "copy_rows"
        ]
    );
    assert_ne!(sources[2].entry, sources[3].entry);
    // The inverse rotation (rows in, token-major out) is another kernel than the forward's.
    assert_ne!(sources[10].entry, sources[16].entry);
}

/// A training step's statistics on the device (`cube::step_stats`) against a direct
/// computation: the loss and correct count copied, the sum of squares of 30 gradients (two
/// partial-sum launches, then one cube adding the partials) within f32 rounding of an f64 sum,
/// and the clip factor `min(1, c/(√Σ + 1e-6))` — acting (c 0.5), off (c 0) and above the norm
/// (c 1e9); without gradients Σ is 0 and the factor 1.
#[test]
fn step_stats_match_a_direct_computation() {
    let d = wgpu();
    let (grads, want) = thirty_tensors(0.5, 2.5);
    let upload = |v: &[f32]| host_to_cube(v, [v.len()], &d);
    for max_norm in [0.5f32, 0.0, 1e9] {
        let s = cube::step_stats(
            grads.iter().map(|g| upload(g)).collect(),
            upload(&[2.5]),
            upload(&[7.0]),
            max_norm,
        );
        let (stats, clip) = (cube_to_host(s.stats), cube_to_host(s.clip));
        assert_eq!(stats[..2], [2.5, 7.0]);
        assert!(
            (f64::from(stats[2]) - want).abs() <= 1e-6 * want,
            "{} vs {want}",
            stats[2]
        );
        let want_clip = if max_norm > 0.0 {
            (f64::from(max_norm) / (want.sqrt() + 1e-6)).min(1.0)
        } else {
            1.0
        };
        assert!(
            (f64::from(clip[0]) - want_clip).abs() <= 1e-6 * want_clip,
            "c {max_norm}: {} vs {want_clip}",
            clip[0]
        );
    }
    assert!(want.sqrt() > 0.5 / 0.9, "the 0.5 case clips");
    let s = cube::step_stats(Vec::new(), upload(&[1.0]), upload(&[0.0]), 1.0);
    assert_eq!(cube_to_host(s.stats), [1.0, 0.0, 0.0]);
    assert_eq!(cube_to_host(s.clip), [1.0]);
}

/// All of a module's float parameters, flattened in visiting order.
fn parameters<M: burn::module::Module>(m: &M) -> Vec<f32> {
    struct Flat(Vec<f32>);
    impl burn::module::ModuleVisitor for Flat {
        fn visit_float<const D: usize>(
            &mut self,
            param: &burn::module::Param<burn::tensor::Tensor<D>>,
        ) {
            self.0
                .extend(param.val().into_data().try_to_vec::<f32>().unwrap());
        }
    }
    let mut flat = Flat(Vec::new());
    m.visit(&mut flat);
    flat.0
}

/// A matrix (decayed by AdamW) and a vector (not decayed): the parameters of the optimiser tests.
#[derive(burn::module::Module, Debug)]
struct Toy {
    w: burn::module::Param<burn::tensor::Tensor<2>>,
    b: burn::module::Param<burn::tensor::Tensor<1>>,
}

/// The clip factor on the device: AdamW scaled by a `[1]` device tensor
/// (`train::GradScale::Device`: read by the fused update, reshaped to each parameter's rank for
/// the tensor ops) updates a rank-2 and a rank-1 parameter exactly as with the same factor from
/// the host, and differently from an unscaled step (ε = 1 makes the update depend on the
/// gradient's scale, which plain Adam's does not), with either update.
#[test]
fn device_clip_factor_updates_as_the_host_one() {
    use burn::module::Param;
    use burn::optim::GradientsParams;
    use burn::tensor::{Tensor, TensorData};
    use lab::train::{AdamW, GradScale};
    let d = wgpu();
    let ad = d.clone().autodiff();
    for kernel in [lab::train::AdamWKernel::Fused, lab::train::AdamWKernel::Ops] {
        let step = |scale: GradScale| {
            let toy = Toy {
                w: Param::from_data(TensorData::new(vec![1.0f32, -2.0], [1, 2]), &ad),
                b: Param::from_data(TensorData::new(vec![0.5f32, -0.25], [2]), &ad),
            };
            let c = Tensor::<2>::from_data(TensorData::new(vec![3.0f32, 4.0], [1, 2]), &ad);
            let loss = (toy.w.val() * c).sum() + toy.b.val().square().sum();
            let grads = GradientsParams::from_grads(loss.backward(), &toy);
            let mut opt = AdamW::new(0.9, 0.95, 1.0, 0.1).with_kernel(kernel);
            parameters(&opt.step(toy, 0.01, grads, scale))
        };
        let host = step(GradScale::Host(0.3));
        let device = step(GradScale::Device(Tensor::from_data(
            TensorData::new(vec![0.3f32], [1]),
            &d,
        )));
        let unscaled = step(GradScale::Host(1.0));
        for ((h, g), u) in host.iter().zip(&device).zip(&unscaled) {
            assert!((h - g).abs() <= 1e-7, "{host:?} vs {device:?}");
            assert!((h - u).abs() > 1e-3, "{host:?} vs unscaled {unscaled:?}");
        }
    }
}

/// `LAB_ADAMW` and `LAB_POINTWISE`: `ops` brings back burn's tensor operations for the update and
/// for RMSNorm, GELU and the loss (no `AdamwUpdate`, `RmsNorm*`, `Gelu*` or `Xent*` launch; the attention kernels
/// and the gradient norm's the same); the JSON says which ran; a bad value of either is refused
/// in one line.
#[test]
fn adamw_and_pointwise_fused_or_ops() {
    let per_step = |j: &serde_json::Value, k: &str| {
        j["launch_kinds"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kernel"] == k)
            .map_or(0.0, |e| e["per_step"].as_f64().unwrap())
    };
    let ops = profiled_smoke_step(&[("LAB_ADAMW", "ops"), ("LAB_POINTWISE", "ops")]);
    assert_eq!(ops["adamw"], "ops");
    assert_eq!(ops["pointwise"], "ops");
    for k in [
        "AdamwUpdate",
        "RmsNormFwd",
        "RmsNormBwd",
        "GeluFwd",
        "GeluBwd",
        "XentFwd",
        "XentBwd",
    ] {
        assert_eq!(per_step(&ops, k), 0.0, "{k}");
    }
    assert_eq!(per_step(&ops, "StepStats"), 1.0);
    assert_eq!(
        per_step(&ops, "AttnFwdTiled"),
        ops["n_layers"].as_f64().unwrap()
    );
    for (var, value, allowed) in [
        ("LAB_ADAMW", "foreach", "fused (the default) or ops"),
        ("LAB_POINTWISE", "flex", "fused (the default) or ops"),
    ] {
        let bad = smoke_step_command(&[(var, value)])
            .output()
            .expect("lab runs");
        let err = String::from_utf8_lossy(&bad.stderr);
        assert!(!bad.status.success(), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("{var} = `{value}`")) && err.contains(allowed),
            "{err}"
        );
    }
}

/// The CubeCL RMSNorm and GELU against the CPU's kernels (`lab::kernels::pointwise`, the same
/// formulas) on seeded inputs — forward, `dx` and RMSNorm's `dgain` (a column sum over 37 rows) —
/// and through burn's autodiff on wgpu (the dispatch extension the model calls): RMSNorm, GELU and
/// the two chained, outputs against the model's tensor-op versions (burn's `gelu`,
/// `model::rms_norm`) and input gradients against the CPU kernels'.
#[test]
fn cube_rms_norm_and_gelu_match_the_cpu_kernels() {
    use burn::module::Param;
    use burn::tensor::{Tensor, TensorData};
    use lab::kernels::pointwise;
    let d = wgpu();
    let (rows, width) = (37usize, 24usize);
    let mut state = 12345u64;
    let mut uniform = |scale: f32| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    };
    let x: Vec<f32> = (0..rows * width).map(|_| uniform(3.0)).collect();
    let gain: Vec<f32> = (0..width).map(|_| 1.0 + uniform(0.5)).collect();
    let dy: Vec<f32> = (0..rows * width).map(|_| uniform(1.0)).collect();
    let close = |got: &[f32], want: &[f32], tol: f32, what: &str| {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!(
                (a - b).abs() <= tol * (1.0 + b.abs()),
                "{what}[{i}]: {a} vs {b}"
            );
        }
    };
    let up = |v: &[f32]| host_to_cube(v, [rows, width], &d);
    let up_gain = || host_to_cube(&gain, [width], &d);
    // RMSNorm, the kernels called directly.
    let (y, inv) = cube::rms_norm_forward(up(&x), up_gain());
    let (want_y, want_r) = pointwise::rms_norm_forward(&x, &gain);
    let inv_host = cube_to_host(inv.clone());
    close(&cube_to_host(y), &want_y, 1e-5, "rms y");
    close(&inv_host, &want_r, 1e-5, "rms inv");
    let (dx, dg) = cube::rms_norm_backward(up(&x), up_gain(), inv, up(&dy));
    let (want_dx, want_dg) = pointwise::rms_norm_backward(&x, &gain, &want_r, &dy);
    close(&cube_to_host(dx), &want_dx, 1e-5, "rms dx");
    close(&cube_to_host(dg), &want_dg, 1e-5, "rms dgain");
    // GELU.
    let gy = cube::gelu_forward(up(&x));
    close(
        &cube_to_host(gy),
        &pointwise::gelu_forward(&x),
        1e-5,
        "gelu y",
    );
    let gdx = cube::gelu_backward(up(&x), up(&dy));
    close(
        &cube_to_host(gdx),
        &pointwise::gelu_backward(&x, &dy),
        1e-5,
        "gelu dx",
    );
    // Through autodiff, against burn's tensor operations: RMSNorm, GELU, and the two chained.
    let ad = d.clone().autodiff();
    let grads_of = |which: &str, fused: bool| {
        let xt = Tensor::<3>::from_data(TensorData::new(x.clone(), [1, rows, width]), &ad)
            .require_grad();
        let g = Param::from_data(TensorData::new(gain.clone(), [width]), &ad);
        let up_dy = Tensor::<3>::from_data(TensorData::new(dy.clone(), [1, rows, width]), &ad);
        let rms = |t: Tensor<3>| {
            if fused {
                pointwise::rms_norm(t, g.val())
            } else {
                lab::model::rms_norm(t, &g)
            }
        };
        let gelu = |t: Tensor<3>| {
            if fused {
                pointwise::gelu(t)
            } else {
                burn::tensor::activation::gelu(t)
            }
        };
        let y = match which {
            "rms" => rms(xt.clone()),
            "gelu" => gelu(xt.clone()),
            _ => gelu(rms(xt.clone())),
        };
        let loss = (y.clone() * up_dy).sum();
        let mut grads = loss.backward();
        let dx = xt.grad_remove(&mut grads).expect("x has a gradient");
        let values = |t: Tensor<3>| t.into_data().try_to_vec::<f32>().unwrap();
        (values(y.inner()), values(dx))
    };
    // The input gradients the CPU kernels give (exact GELU derivative, `Φ + x·φ`).
    let want_gelu_dx = pointwise::gelu_backward(&x, &dy);
    let (h, r) = pointwise::rms_norm_forward(&x, &gain);
    let want_both_dx =
        pointwise::rms_norm_backward(&x, &gain, &r, &pointwise::gelu_backward(&h, &dy)).0;
    for (which, want_dx) in [
        ("rms", want_dx.clone()),
        ("gelu", want_gelu_dx),
        ("both", want_both_dx),
    ] {
        let (fy, fdx) = grads_of(which, true);
        let (ry, rdx) = grads_of(which, false);
        close(&fy, &ry, 1e-5, &format!("autodiff {which} y"));
        close(&fdx, &want_dx, 1e-5, &format!("autodiff {which} dx"));
        if which == "rms" {
            close(&rdx, &want_dx, 1e-5, "burn's rms dx");
        }
        // burn 0.22's `gelu` on CubeCL differentiates the tanh approximation (its dx here is
        // within 2 % of the exact one, not 1e-5): only RMSNorm's is compared with burn's.
        for (a, b) in rdx.iter().zip(&fdx) {
            assert!(
                (a - b).abs() <= 0.02 * (1.0 + b.abs()),
                "{which}: {a} vs {b}"
            );
        }
    }
}

/// The fused AdamW kernel against burn's tensor operations on the same device: three steps of a
/// toy model with a decayed matrix and an undecayed vector (the first step without moments, then
/// with), the gradients scaled by a host factor or by a device `[1]` tensor; every parameter
/// within 1e-6 of the other path after each step, and the update itself non-trivial.
#[test]
fn fused_adamw_matches_the_tensor_ops() {
    use burn::module::Param;
    use burn::optim::GradientsParams;
    use burn::tensor::{Tensor, TensorData};
    use lab::train::{AdamW, AdamWKernel, GradScale};
    let d = wgpu();
    let ad = d.clone().autodiff();
    let run = |kernel: AdamWKernel, device_scale: bool| {
        let mut toy = Toy {
            w: Param::from_data(
                TensorData::new(vec![1.0f32, -2.0, 0.5, 3.0, -0.75, 0.25], [2, 3]),
                &ad,
            ),
            b: Param::from_data(TensorData::new(vec![0.5f32, -0.25, 1.5], [3]), &ad),
        };
        let mut opt = AdamW::new(0.9, 0.95, 1e-8, 0.1).with_kernel(kernel);
        let c = Tensor::<2>::from_data(
            TensorData::new(vec![3.0f32, 4.0, -1.0, 0.5, 2.0, -2.5], [2, 3]),
            &ad,
        );
        let mut after = Vec::new();
        for step in 0..3 {
            let loss = (toy.w.val() * c.clone()).sum()
                + (toy.w.val().square().sum_dim(0).squeeze_dim::<1>(0) * toy.b.val()).sum()
                + toy.b.val().square().sum();
            let grads = GradientsParams::from_grads(loss.backward(), &toy);
            let s = 0.3 + 0.2 * step as f32;
            let scale = if device_scale {
                GradScale::Device(Tensor::from_data(TensorData::new(vec![s], [1]), &d))
            } else {
                GradScale::Host(s as f64)
            };
            toy = opt.step(toy, 0.01 * (step + 1) as f64, grads, scale);
            after.push(parameters(&toy));
        }
        after
    };
    let start = [1.0f32, -2.0, 0.5, 3.0, -0.75, 0.25, 0.5, -0.25, 1.5];
    for device_scale in [false, true] {
        let fused = run(AdamWKernel::Fused, device_scale);
        let ops = run(AdamWKernel::Ops, device_scale);
        for (step, (f, o)) in fused.iter().zip(&ops).enumerate() {
            for (i, (a, b)) in f.iter().zip(o).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-6,
                    "device scale {device_scale}, step {step}, parameter {i}: fused {a} vs ops {b}"
                );
            }
        }
        // Adam's first steps move each parameter by about the learning rate.
        for (i, (a, s)) in fused[0].iter().zip(start).enumerate() {
            assert!(
                (a - s).abs() > 5e-3,
                "parameter {i} did not move: {a} vs {s}"
            );
        }
    }
}

/// A training step on wgpu that trips the exploding-gradient check (its first gradient norm,
/// about 2.16, above `max_grad_norm` 0.5) reports it with the norm read at the step's end, and
/// returns the model from before the step although the update was already issued.
#[test]
fn failed_device_step_returns_the_model_before_it() {
    let mut cfg = selfcheck::step_check_config("rope");
    cfg.attention = lab::model::AttentionKernel::Fused;
    cfg.max_grad_norm = 0.5;
    let ad = wgpu().autodiff();
    let model = cfg.model().init(cfg.seed, &ad);
    let before = parameters(&model);
    let mut opt = lab::train::AdamW::new(cfg.beta1, cfg.beta2, cfg.adam_eps, cfg.weight_decay);
    let examples = cfg.train_batch(0).unwrap();
    let (model, r) = lab::train::train_step(model, &mut opt, &cfg, 0, &examples, &ad);
    let err = r.err().expect("the step fails");
    assert!(err.starts_with("exploding gradients: norm 2.1"), "{err}");
    assert_eq!(parameters(&model), before);
}
