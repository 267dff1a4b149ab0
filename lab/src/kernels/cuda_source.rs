//! The CUDA C++ of the lab's CubeCL attention kernels, generated on a machine without a GPU
//! (feature `cuda-source`; `lab bench cuda-source`, `make cuda-ptxas`).
//!
//! On an NVIDIA GPU, cubecl-cuda turns each kernel launch into CUDA C++ with cubecl-cpp's
//! compiler and hands it to NVRTC. This module produces the same text here: the attention forward
//! and backward ([`super::cube::forward`], [`super::cube::backward`]) run on a `wgpu` device
//! (lavapipe) while every launch of the lab's kernels is *captured* instead of launched — the
//! kernel, its comptime configuration and its cube dimensions exactly as the launch site built
//! them — and each captured kernel is compiled for a CUDA device of compute capability `sm`.
//! Nothing runs on the wgpu device but the buffer allocations and burn's own small kernels
//! (layout copies, PoPE's `dδ` sums); those are not the lab's and are not captured.
//!
//! What is compiled for is an NVIDIA device as cubecl-cuda 0.11.3 describes one to its compiler
//! (its `CudaRuntime` set-up for `sm ≥ 90`): 32-unit planes (warps), the `f16 × f16 → f32`
//! 16×16×16 `wmma` form among its `cmma` configurations (so [`super::cube::CubeStrategy::Cmma`]
//! takes the tensor-core kernel, as on the H200), fast math, grid constants, clusters, 227 KiB of
//! shared memory per block. Those properties are set here as cubecl-cuda sets them, not read from
//! a device; the compiler is the same one the device runs before NVRTC (the first H200 run,
//! docs/performance.md "GPU", compiled its output there).
//! `scripts/cuda-ptxas.sh` compiles it with NVRTC and `ptxas` from PyPI's CUDA wheels, with
//! cubecl-cuda's own NVRTC options, for each kernel's registers, spills and shared memory.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cubecl::ir::features::Plane;
use cubecl::ir::{
    DeviceIdentity, DeviceProperties, HardwareProperties, MemoryDeviceProperties, MmaProperties,
    TargetProperties, VectorSize,
};
use cubecl::{Compiler, CubeKernel, define_kernel};
use cubecl_cpp::cuda::arch::CudaArchitecture;
use cubecl_cpp::cuda::mma::CudaCmmaCompiler;
use cubecl_cpp::cuda::mma::manual::contiguous_elements_cuda;
use cubecl_cpp::shared::{CompilationOptions, CppCompiler, CppSupportedFeatures};
use cubecl_cpp::target::Cuda;

/// A kernel launch recorded while capturing: the kernel's name, its cube count `[x, y, z]` and
/// the kernel itself.
pub type Captured = (&'static str, [u32; 3], Box<dyn CubeKernel>);

struct Capture {
    props: Arc<DeviceProperties>,
    target: Arc<TargetProperties>,
    kernels: Vec<Captured>,
}

thread_local! {
    static CAPTURE: RefCell<Option<Capture>> = const { RefCell::new(None) };
}

/// While [`capture`] runs on this thread: the CUDA device's properties the launch sites build
/// their kernels against (instead of launching them).
pub(crate) fn capturing() -> Option<(Arc<DeviceProperties>, Arc<TargetProperties>)> {
    CAPTURE.with_borrow(|c| c.as_ref().map(|c| (c.props.clone(), c.target.clone())))
}

/// Record a kernel a launch site built while capturing (a no-op otherwise).
pub(crate) fn record(name: &'static str, count: [u32; 3], kernel: Box<dyn CubeKernel>) {
    CAPTURE.with_borrow_mut(|c| {
        if let Some(c) = c.as_mut() {
            c.kernels.push((name, count, kernel));
        }
    });
}

/// A static cube count as `[x, y, z]`.
///
/// # Panics
/// On a dynamic count (read from a device buffer: none of the lab's launches uses one).
pub(crate) fn count_of(count: &cubecl::CubeCount) -> [u32; 3] {
    match count {
        cubecl::CubeCount::Static(x, y, z) => [*x, *y, *z],
        cubecl::CubeCount::Dynamic(_) => panic!("a dynamic cube count cannot be recorded"),
    }
}

/// Run `f` with every launch of the lab's kernels on this thread captured for a CUDA device of
/// compute capability `sm` (e.g. 90 for the H100/H200) instead of launched; returns `f`'s value
/// and the kernels in launch order. The capture ends when `f` returns or panics.
///
/// # Panics
/// When called inside another capture.
pub fn capture<T>(sm: u32, f: impl FnOnce() -> T) -> (T, Vec<Captured>) {
    struct End;
    impl Drop for End {
        fn drop(&mut self) {
            CAPTURE.with_borrow_mut(|c| *c = None);
        }
    }
    CAPTURE.with_borrow_mut(|c| {
        assert!(c.is_none(), "cuda_source::capture is not reentrant");
        *c = Some(Capture {
            props: Arc::new(device_properties(sm)),
            target: Arc::new(target_properties()),
            kernels: Vec::new(),
        });
    });
    let end = End;
    let value = f();
    let kernels = CAPTURE.with_borrow_mut(|c| c.take().map(|c| c.kernels).unwrap_or_default());
    drop(end);
    (value, kernels)
}

/// The properties cubecl-cuda reports for a device of compute capability `sm` (with tensor
/// cores), as far as the lab's kernels and cubecl-cpp's compiler read them: the supported
/// element types, the `cmma` (`wmma`) configurations of that architecture, 32-unit planes with
/// plane operations, 227 KiB of shared memory per block (sm 90), 1024 units per cube.
pub fn device_properties(sm: u32) -> DeviceProperties {
    let arch = CudaArchitecture {
        version: sm,
        tensor_cores: sm >= 70,
    };
    let cmma = CudaCmmaCompiler::Cpp.supported_cmma_combinations(&arch);
    let hardware = HardwareProperties {
        load_width: 128,
        vector_register_count: None,
        plane_size_min: 32,
        plane_size_max: 32,
        max_bindings: 1024,
        max_shared_memory_size: if sm >= 90 { 227 * 1024 } else { 48 * 1024 },
        max_cube_count: (i32::MAX as u32, 65535, 65535),
        max_units_per_cube: 1024,
        max_cube_dim: (1024, 1024, 64),
        num_streaming_multiprocessors: Some(132),
        num_tensor_cores: None,
        min_tensor_cores_dim: (!cmma.is_empty()).then_some(8),
        num_cpu_cores: None,
        last_level_cache_size: None,
        max_vector_size: VectorSize::MAX,
        cube_mma_reserved_shared_memory: 0,
    };
    let mut props = DeviceProperties::new(
        Default::default(),
        MemoryDeviceProperties::new(1 << 30, 512),
        hardware,
        cubecl::profile::TimingMethod::Device,
        DeviceIdentity {
            name: format!("NVIDIA sm_{sm} (compiled for, not present)"),
            fingerprint: format!("ptx_sm{sm}"),
            physical: None,
        },
    );
    cubecl_cpp::register_supported_types(&mut props);
    props.features.alignment = true;
    props.features.plane.insert(Plane::Ops);
    props.features.plane.insert(Plane::Sync);
    props.features.plane.insert(Plane::NonUniformControlFlow);
    cubecl_cpp::shared::register_wmma_features(cmma, &mut props);
    props
}

/// The register layout of NVIDIA's `mma` fragments, as cubecl-cuda states it.
pub fn target_properties() -> TargetProperties {
    use cubecl::cmma::MatrixLayout;
    TargetProperties {
        mma: MmaProperties {
            register_size_bits: 32,
            const_plane_size: 32,
            register_layout_a: MatrixLayout::RowMajor,
            register_layout_b: MatrixLayout::ColMajor,
            register_layout_acc: MatrixLayout::RowMajor,
            register_duplication_a: 1,
            register_duplication_b: 1,
            register_duplication_acc: 1,
            contiguous_elements: cubecl::ir::ContiguousElements::new(contiguous_elements_cuda),
        },
    }
}

/// cubecl-cpp's options for a device of compute capability `sm`, as cubecl-cuda sets them with
/// CUDA 13: 32-unit warps, fast math, `dp4a`, grid constants (`__grid_constant__` launch
/// parameters), fast `tanh`, and on `sm ≥ 90` clusters and `elect.sync`.
pub fn compilation_options(sm: u32) -> CompilationOptions {
    CompilationOptions {
        warp_size: 32,
        supports_features: CppSupportedFeatures {
            grid_constants: sm >= 70,
            clusters: sm >= 90,
            fast_math: true,
            fast_tanh: sm >= 75,
            elect_sync: sm >= 90,
            dp4a: sm >= 61,
        },
        ..Default::default()
    }
}

/// One kernel as CUDA C++: what `lab bench cuda-source` writes, one file per distinct source.
#[derive(Clone, Debug)]
pub struct KernelSource {
    /// The lab's kernel (`attn_fwd_cmma`, `attn_bwd_dkdv_tiled`, …).
    pub kernel: &'static str,
    /// The `extern "C" __global__` function's name in `source`.
    pub entry: String,
    /// Units per cube (threads per block), `[x, y, z]`.
    pub cube_dim: [u32; 3],
    /// Static shared memory the compiler counted, bytes.
    pub shared_bytes: usize,
    /// Every `encoding/strategy` whose call launched this kernel, in order.
    pub uses: Vec<String>,
    /// The CUDA C++ translation unit NVRTC compiles.
    pub source: String,
}

/// Compile captured kernels to CUDA C++ for compute capability `sm`, labelling each with `label`.
///
/// # Errors
/// A kernel whose expansion or compilation fails: one line naming it and cubecl's reason.
pub fn compile(
    kernels: Vec<(&'static str, Box<dyn CubeKernel>)>,
    sm: u32,
    label: &str,
) -> Result<Vec<KernelSource>, String> {
    let options = compilation_options(sm);
    kernels
        .into_iter()
        .map(|(name, kernel)| {
            let definition = define_kernel(&*kernel)
                .map_err(|e| format!("{name} ({label}): expansion failed: {e}"))?;
            let cube_dim = definition.settings.cube_dim;
            let compiled = CppCompiler::<Cuda>::default()
                .compile(definition, &options)
                .map_err(|e| format!("{name} ({label}): CUDA C++ compilation failed: {e}"))?;
            let entry = entry_name(&compiled.source).unwrap_or_else(|| name.to_string());
            Ok(KernelSource {
                kernel: name,
                entry,
                cube_dim: [cube_dim.x, cube_dim.y, cube_dim.z],
                shared_bytes: compiled.shared_memory_size,
                uses: vec![label.to_string()],
                source: compiled.source,
            })
        })
        .collect()
}

/// The name of the first `__global__` function in a CUDA translation unit (after
/// `void` and an optional `__launch_bounds__(…)`).
fn entry_name(source: &str) -> Option<String> {
    let mut rest = source[source.find("__global__")? + "__global__".len()..].trim_start();
    rest = rest.strip_prefix("void")?.trim_start();
    if let Some(r) = rest.strip_prefix("__launch_bounds__") {
        rest = r[r.find(')')? + 1..].trim_start();
    }
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// An encoding to capture: its name (for `uses`), the CPU kernels' description of it and, for
/// PoPE, the phase bias δ `[heads · head_dim]` (`bench_encoding` of the `bench` module builds these as
/// `lab bench attention` does).
pub type NamedEncoding = (String, super::cpu::KernelEncoding, Option<Vec<f32>>);

/// The CUDA C++ of every kernel the attention forward and backward launch for each of
/// `encodings` under each layout of [`super::CUBE_STRATEGIES`], at `heads` × `head_dim`, for compute
/// capability `sm`; a kernel launched by several calls is listed once ([`merge`]; `uses` lists
/// every `encoding/strategy`). `device` is a `wgpu` device: the calls allocate their buffers
/// there and launch nothing of the lab's. The sequence length is a runtime argument of every
/// kernel, so the sources hold for any `seq` (32 is used).
///
/// # Errors
/// A kernel that fails to expand or compile: one line naming it.
pub fn attention_sources(
    device: &burn::tensor::Device,
    sm: u32,
    heads: usize,
    head_dim: usize,
    encodings: &[NamedEncoding],
) -> Result<Vec<KernelSource>, String> {
    use super::cube::{self, CubeAttentionParams, CubeStrategy};
    let shape = [1, heads, 32, head_dim];
    let zeros = vec![0.0f32; shape.iter().product()];
    let mut all = Vec::new();
    for (name, encoding, delta) in encodings {
        for strategy_name in super::CUBE_STRATEGIES {
            let delta = delta
                .as_ref()
                .map(|d| cube::host_to_cube(d, [heads * head_dim], device));
            let mut params = CubeAttentionParams::from_kernel_encoding(encoding.clone(), delta);
            params.strategy = CubeStrategy::parse(strategy_name)?;
            let [q, k, v, g] = [(); 4].map(|_| cube::host_to_cube(&zeros, shape, device));
            let ((), kernels) = capture(sm, || {
                let (out, lse) = cube::forward(q.clone(), k.clone(), v.clone(), &params);
                let _ = cube::backward(q, k, v, out, lse, g, &params);
            });
            let kernels = kernels.into_iter().map(|(n, _, k)| (n, k)).collect();
            merge(
                &mut all,
                compile(kernels, sm, &format!("{name}/{strategy_name}"))?,
            );
        }
    }
    Ok(all)
}

/// The CUDA C++ of the kernels a training step on a CubeCL device launches besides the
/// attention's ([`super::cube::step_stats`]: the gradients' partial sums of squares,
/// `sq_sum_partials`, the one-cube `step_stats`, AdamW's `adamw_update` with and without
/// moments, RMSNorm's, GELU's and the masked cross-entropy's forward and backward), and the
/// attention's kernels as the model's heads reach them (token-major, `cube::kernel_qk`: RoPE's
/// rotation reading them in place, NoPE's `copy_rows`, the output and gradients written back in
/// their layout; two heads of 64, the tiled layout), for compute capability `sm`; `uses` is
/// `train/step`. `device` is a `wgpu` device (buffers only; nothing is launched).
///
/// # Errors
/// A kernel that fails to expand or compile: one line naming it.
pub fn training_sources(
    device: &burn::tensor::Device,
    sm: u32,
) -> Result<Vec<KernelSource>, String> {
    use super::cube;
    let grad = cube::host_to_cube(&[0.0f32; 300], [300], device);
    let [loss, correct] = [(); 2].map(|_| cube::host_to_cube(&[0.0f32], [1], device));
    let (_, mut kernels) = capture(sm, || {
        cube::step_stats(vec![grad.clone()], loss.clone(), correct, 1.0)
    });
    // AdamW's update, first step (no moments) and later (with them), the clip factor on the device.
    let hyper = cube::AdamWHyper::new(0.9, 0.95, 1e-8, 2, 1e-3, 0.1);
    for moments in [None, Some((grad.clone(), grad.clone()))] {
        let scale = cube::UpdateScale::Device(loss.clone());
        let (_, more) = capture(sm, || {
            cube::adamw_update(grad.clone(), grad.clone(), moments, scale, &hyper)
        });
        kernels.extend(more);
    }
    // RMSNorm and GELU, forward and backward (rows of 30).
    let x = cube::host_to_cube(&[0.0f32; 300], [10, 30], device);
    let gain = cube::host_to_cube(&[1.0f32; 30], [30], device);
    let (_, more) = capture(sm, || {
        let (_, inv) = cube::rms_norm_forward(x.clone(), gain.clone());
        cube::rms_norm_backward(x.clone(), gain.clone(), inv, x.clone());
        cube::gelu_forward(x.clone());
        cube::gelu_backward(x.clone(), x.clone());
        // The loss over the same 10 rows (vocabulary 30).
        let rows = cube::host_to_cube(&[0.0f32; 10], [10], device);
        cube::xent_forward(x.clone(), rows.clone(), rows.clone());
        cube::xent_backward(x.clone(), rows.clone(), rows.clone(), rows.clone());
    });
    kernels.extend(more);
    // The attention on token-major heads: [batch 1, seq 4, heads 2, head_dim 64] split by a swap.
    let heads = || {
        use burn::backend::ops::FloatTensorOps;
        let t = cube::host_to_cube(&[0.0f32; 512], [1, 4, 2, 64], device);
        burn_cubecl::CubeBackend::float_swap_dims(t, 1, 2)
    };
    let rope = cube::CubeEncoding::Rope {
        inv_freq: (0..32).map(|i| 10000f64.powf(-(i as f64) / 32.0)).collect(),
        layout: super::map::PairLayout::Adjacent,
        attention_factor: 1.0,
    };
    for encoding in [rope, cube::CubeEncoding::Nope] {
        let mut params = cube::CubeAttentionParams::new(encoding);
        params.strategy = cube::CubeStrategy::Tiled { tile: None };
        let (_, more) = capture(sm, || {
            let (out, lse) = cube::forward(heads(), heads(), heads(), &params);
            cube::backward(heads(), heads(), heads(), out, lse, heads(), &params);
        });
        kernels.extend(more);
    }
    let kernels = kernels.into_iter().map(|(n, _, k)| (n, k)).collect();
    compile(kernels, sm, "train/step")
}

/// Add `more` to `all`, merging a kernel already present into its entry's `uses`. Kernels are the
/// same when their entry names are: cubecl names each kernel after its type and a hash of its
/// comptime configuration (the `dv` and `dk` launches of `tiled-split` differ), while the text
/// of one kernel can differ between compilations in the numbering of its variables.
pub fn merge(all: &mut Vec<KernelSource>, more: Vec<KernelSource>) {
    for k in more {
        match all.iter_mut().find(|a| a.entry == k.entry) {
            Some(a) => {
                for u in k.uses {
                    if !a.uses.contains(&u) {
                        a.uses.push(u);
                    }
                }
            }
            None => all.push(k),
        }
    }
}

/// Write each source to `dir/NN-<kernel>.cu` and an index `dir/kernels.tsv` (file, kernel, entry,
/// cube_dim, shared_bytes, uses); returns the index's path.
///
/// # Errors
/// The directory cannot be created or a file written: one line with the path.
pub fn write_sources(dir: &Path, sources: &[KernelSource]) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut index = String::from("file\tkernel\tentry\tcube_dim\tshared_bytes\tuses\n");
    for (i, k) in sources.iter().enumerate() {
        let file = format!("{i:02}-{}.cu", k.kernel);
        let path = dir.join(&file);
        std::fs::write(&path, &k.source).map_err(|e| format!("{}: {e}", path.display()))?;
        index.push_str(&format!(
            "{file}\t{}\t{}\t{}x{}x{}\t{}\t{}\n",
            k.kernel,
            k.entry,
            k.cube_dim[0],
            k.cube_dim[1],
            k.cube_dim[2],
            k.shared_bytes,
            k.uses.join(",")
        ));
    }
    let path = dir.join("kernels.tsv");
    std::fs::write(&path, index).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_name_is_the_global_function() {
        let src = "typedef int x;\nextern \"C\" __global__ void attn_fwd_f32(const float* q) {}\n";
        assert_eq!(entry_name(src).as_deref(), Some("attn_fwd_f32"));
        let src =
            "extern \"C\" __global__ void __launch_bounds__(64)  pope_prep_ed20176b(float* v1) {";
        assert_eq!(entry_name(src).as_deref(), Some("pope_prep_ed20176b"));
        assert_eq!(entry_name("no kernel here"), None);
    }

    /// sm 90 advertises the f16×f16→f32 16×16×16 form the tensor-core forward needs and 32-unit
    /// planes; sm 61 (no tensor cores) does not.
    #[test]
    fn sm90_has_the_cmma_form_of_the_tensor_core_forward() {
        assert!(crate::kernels::cube::cmma_supported_by(&device_properties(
            90
        )));
        assert!(!crate::kernels::cube::cmma_supported_by(
            &device_properties(61)
        ));
    }

    #[test]
    fn merge_joins_launches_of_one_kernel() {
        let k = |entry: &str, label: &str| KernelSource {
            kernel: "k",
            entry: entry.into(),
            cube_dim: [32, 1, 1],
            shared_bytes: 0,
            uses: vec![label.into()],
            source: format!("{entry} {label}"),
        };
        let mut all = vec![k("k_1", "nope/tiled")];
        merge(
            &mut all,
            vec![
                k("k_1", "rope/tiled"),
                k("k_2", "pope/tiled"),
                k("k_1", "rope/tiled"),
            ],
        );
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].uses, ["nope/tiled", "rope/tiled"]);
        assert_eq!(all[1].uses, ["pope/tiled"]);
    }
}
