//! CubeCL flash attention (`lab::kernels::cube`) against the reference attention.
//!
//! Run with `make test-wgpu` (`cargo test --release -p lab --features wgpu,cuda-source --test
//! cube_attention`; `--features wgpu,fusion` for burn's fused CubeCL backend, the configuration
//! `cuda` uses). With `cuda-source`, the kernels' CUDA C++ for an sm 90 GPU is generated too.
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
