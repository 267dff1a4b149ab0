//! The CUDA C++ of the lab's kernels, run on the CPU against the same kernels on `wgpu`
//! (feature `cuda-source`; `lab bench cuda-host`, `make test-wgpu`).
//!
//! [`super::cuda_source`] produces the CUDA C++ NVRTC compiles on an NVIDIA GPU; NVRTC and
//! `ptxas` accept it (`make cuda-ptxas`), but whether it computes the right numbers only a GPU
//! said, and for the tensor-core kernels (`wmma`) no GPU has yet. This module runs that text on
//! the CPU: the attention forward and backward run on a `wgpu` device (lavapipe) with every
//! launch of the lab's kernels *teed* — launched there and recorded with its buffers before and
//! after, its runtime scalars and its cube count — then captured for CUDA with the same inputs;
//! each captured kernel is compiled by the host's C++ compiler with `cuda_host/cuda_host.h`
//! (CUDA's built-ins for one OS thread per CUDA thread, `__syncthreads()` a barrier, `__half`
//! the compiler's `_Float16`, `nvcuda::wmma` modelled on the CUDA C++ Programming Guide's warp
//! matrix functions, with their preconditions checked) and `cuda_host/harness.cpp`, run on the
//! recorded inputs, and its buffers compared with the `wgpu` launch's.
//!
//! On lavapipe the tensor-core layouts run emulated ([`super::cube::CmmaPath::Emulated`]: the
//! same kernels with each `cmma` product computed by the plane's units from the same f16
//! operands); their CUDA C++ calls `wmma`. So the comparison checks what the emulation cannot:
//! the `wmma` calls as cubecl-cpp writes them (fragment kinds and layouts, pointers, strides,
//! alignment, all 32 lanes of a warp making the same calls), and every line of the generated
//! text around them. What it cannot check: the hardware's own fragment layout and timing, and
//! races the host's thread schedule does not happen to expose.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::Command;

use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::BufferArg;

use super::Tolerance;
use super::cuda_source::{self, KernelSource, NamedEncoding};

/// The host's view of CUDA (force-included before each kernel's source).
const CUDA_HOST_H: &str = include_str!("cuda_host/cuda_host.h");
/// The program that runs one kernel from a launch file.
const HARNESS_CPP: &str = include_str!("cuda_host/harness.cpp");

/// The tolerances of [`check_on_host`]: for the tensor-core kernels (their CUDA C++ calls
/// `wmma`) and for the others. `lab bench cuda-host` and the tests pass the device selfcheck's
/// for the same kernels (`lab::selfcheck::CMMA_TOL`, `ATTENTION_TOL`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostTolerances {
    /// Kernels calling `wmma` (f16 operands).
    pub wmma: Tolerance,
    /// The f32 kernels.
    pub f32: Tolerance,
}

/// A runtime argument of a kernel launch as the tee records it.
#[derive(Clone, Debug, PartialEq)]
pub enum ArgKind {
    /// A buffer (its contents are read from the tensor `arg` noted).
    Buffer,
    /// A runtime `f32` scalar.
    F32(f32),
    /// A runtime `u32` scalar.
    U32(u32),
    /// A comptime value (part of the kernel, not of the launch).
    Comptime,
}

/// How a launch site's argument enters the recorded launch.
pub trait TeeArg {
    /// The argument's kind (and value, for a runtime scalar).
    fn kind(&self) -> ArgKind;
}
impl TeeArg for BufferArg {
    fn kind(&self) -> ArgKind {
        ArgKind::Buffer
    }
}
impl TeeArg for f32 {
    fn kind(&self) -> ArgKind {
        ArgKind::F32(*self)
    }
}
impl TeeArg for u32 {
    fn kind(&self) -> ArgKind {
        ArgKind::U32(*self)
    }
}
impl TeeArg for usize {
    fn kind(&self) -> ArgKind {
        ArgKind::Comptime
    }
}
impl TeeArg for bool {
    fn kind(&self) -> ArgKind {
        ArgKind::Comptime
    }
}

/// One launch recorded by [`tee`].
#[derive(Clone, Debug)]
pub struct TeedLaunch {
    /// The lab's kernel.
    pub kernel: &'static str,
    /// Cube count `[x, y, z]`.
    pub count: [u32; 3],
    /// Units per cube `[x, y, z]`.
    pub cube_dim: [u32; 3],
    /// The runtime arguments in order (buffers and scalars; comptime values dropped).
    pub args: Vec<ArgKind>,
    /// Each buffer's bytes before the launch, in argument order.
    pub before: Vec<Vec<u8>>,
    /// Each buffer's bytes after it.
    pub after: Vec<Vec<u8>>,
}

struct Tee {
    noted: Vec<CubeTensor>,
    launches: Vec<TeedLaunch>,
}

thread_local! {
    static TEE: RefCell<Option<Tee>> = const { RefCell::new(None) };
}

/// Whether [`tee`] runs on this thread.
pub(crate) fn teeing() -> bool {
    TEE.with_borrow(|t| t.is_some())
}

/// While teeing: remember a tensor a launch site passes as a buffer argument (in order).
pub(crate) fn note_buffer(t: &CubeTensor) {
    TEE.with_borrow_mut(|tee| {
        if let Some(tee) = tee.as_mut() {
            tee.noted.push(t.clone());
        }
    });
}

fn take_noted() -> Vec<CubeTensor> {
    TEE.with_borrow_mut(|tee| {
        tee.as_mut()
            .map(|t| std::mem::take(&mut t.noted))
            .unwrap_or_default()
    })
}

fn read_bytes(t: &CubeTensor) -> Vec<u8> {
    t.client
        .read_one(t.handle.clone())
        .expect("reading a teed buffer back")
        .to_vec()
}

/// The launch site's half of a teed launch: the buffers the argument list noted are read, the
/// kernel launched (`launch`, which notes them again: discarded), the buffers read again.
pub(crate) fn launch_teed(
    kernel: &'static str,
    count: [u32; 3],
    cube_dim: [u32; 3],
    kinds: Vec<ArgKind>,
    launch: impl FnOnce(),
) {
    let buffers = take_noted();
    let expected = kinds.iter().filter(|k| **k == ArgKind::Buffer).count();
    assert_eq!(
        buffers.len(),
        expected,
        "cuda_host: {kernel}'s argument list noted {} buffers for {expected} buffer arguments",
        buffers.len()
    );
    let before = buffers.iter().map(read_bytes).collect();
    launch();
    take_noted();
    let after = buffers.iter().map(read_bytes).collect();
    let args = kinds
        .into_iter()
        .filter(|k| *k != ArgKind::Comptime)
        .collect();
    let record = TeedLaunch {
        kernel,
        count,
        cube_dim,
        args,
        before,
        after,
    };
    TEE.with_borrow_mut(|tee| {
        if let Some(tee) = tee.as_mut() {
            tee.launches.push(record);
        }
    });
}

/// Run `f` with every launch of the lab's kernels on this thread launched as usual and recorded
/// ([`TeedLaunch`]); returns `f`'s value and the launches in order. Ends when `f` returns or
/// panics.
///
/// # Panics
/// When called inside another tee or a [`cuda_source::capture`].
pub fn tee<T>(f: impl FnOnce() -> T) -> (T, Vec<TeedLaunch>) {
    struct End;
    impl Drop for End {
        fn drop(&mut self) {
            TEE.with_borrow_mut(|t| *t = None);
        }
    }
    assert!(
        cuda_source::capturing().is_none(),
        "cuda_host::tee inside a capture"
    );
    TEE.with_borrow_mut(|t| {
        assert!(t.is_none(), "cuda_host::tee is not reentrant");
        *t = Some(Tee {
            noted: Vec::new(),
            launches: Vec::new(),
        });
    });
    let end = End;
    let value = f();
    let launches = TEE.with_borrow_mut(|t| t.take().map(|t| t.launches).unwrap_or_default());
    drop(end);
    (value, launches)
}

/// One kernel launch run from its CUDA C++ on the host, against the `wgpu` launch.
#[derive(Clone, Debug)]
pub struct HostCheck {
    /// `encoding/layout` of the attention call.
    pub label: String,
    /// The lab's kernel.
    pub kernel: &'static str,
    /// The CUDA entry point.
    pub entry: String,
    /// Whether the source calls `nvcuda::wmma` (the tensor-core kernels).
    pub wmma: bool,
    /// Largest |host − wgpu| over the buffers the kernel writes (0 when it writes nothing
    /// different).
    pub max_abs: f32,
    /// Largest |host − wgpu| / (abs + rel·|wgpu|) of the tolerance.
    pub worst_ratio: f32,
    /// The tolerance applied (of [`HostTolerances`], by `wmma`).
    pub tol: Tolerance,
    /// The CUDA launch's cube count and cube dim (what the host ran).
    pub cuda_config: ([u32; 3], [u32; 3]),
    /// The `wgpu` launch's, where they differ (the two devices chose different tilings for
    /// the same kernel, e.g. `tiled-staged`'s rows per tile from the shared memory: the buffers
    /// the kernel writes are the same quantities, compared within the same tolerance).
    pub wgpu_config: Option<([u32; 3], [u32; 3])>,
    /// What went wrong, if anything: a compile or harness error (one line), or the first value
    /// outside the tolerance.
    pub error: Option<String>,
}

impl HostCheck {
    /// Whether the host run matched.
    pub fn passed(&self) -> bool {
        self.error.is_none()
    }
}

/// The attention forward and backward of each of `encodings` under each of `layouts`, on
/// seeded inputs of `shape` `[batch, heads, seq, head_dim]`: every lab kernel launch run on
/// `device` (`wgpu`) and from its CUDA C++ for compute capability `sm` on the host, compared
/// buffer by buffer. `dir` receives the sources, the compiled programs and the launch files;
/// `cxx` is the host C++ compiler (C++20, `_Float16`: g++ ≥ 12 or clang ≥ 15); `tols` the
/// tolerances. `progress` gets each check as it ends.
///
/// # Errors
/// The directory cannot be written, the harness does not compile, a layout name is unknown, or
/// the `wgpu` and CUDA launch sequences of one call name different kernels (where only the
/// tiling differs, the host runs CUDA's: [`HostCheck::wgpu_config`]). A kernel that does not compile or run, or whose
/// outputs differ, is a failed [`HostCheck`], not an error.
#[allow(clippy::too_many_arguments)]
pub fn check_on_host(
    device: &burn::tensor::Device,
    sm: u32,
    shape: [usize; 4],
    encodings: &[NamedEncoding],
    layouts: &[&str],
    seed: u64,
    dir: &Path,
    cxx: &str,
    tols: HostTolerances,
    mut progress: impl FnMut(&HostCheck),
) -> Result<Vec<HostCheck>, String> {
    use super::cube::{self, CubeAttentionParams, CubeStrategy};
    use rand::{Rng, SeedableRng};
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create the folder {}: {e}", dir.display()))?;
    // A previous run's launch and output files would mix with this run's.
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if (name.starts_with("launch-") || name.starts_with("out-")) && name.ends_with(".bin") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    let harness = build_harness(dir, cxx)?;
    let [_, heads, _, head_dim] = shape;
    let n: usize = shape.iter().product();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut draw = || -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect() };
    let inputs = [draw(), draw(), draw(), draw()];
    let mut checks = Vec::new();
    let mut built: Vec<(String, Result<PathBuf, String>)> = Vec::new();
    for (name, encoding, delta) in encodings {
        for layout in layouts {
            let label = format!("{name}/{layout}");
            let strategy = CubeStrategy::parse(layout)?;
            let delta = delta
                .as_ref()
                .map(|d| cube::host_to_cube(d, [heads * head_dim], device));
            let mut params = CubeAttentionParams::from_kernel_encoding(encoding.clone(), delta);
            params.strategy = strategy;
            let [q, k, v, g] = [0, 1, 2, 3].map(|i| cube::host_to_cube(&inputs[i], shape, device));
            // The same call twice: launched and recorded on `device`, then captured for CUDA.
            let attend = || {
                let (out, lse) = cube::forward(q.clone(), k.clone(), v.clone(), &params);
                let _ = cube::backward(
                    q.clone(),
                    k.clone(),
                    v.clone(),
                    out,
                    lse,
                    g.clone(),
                    &params,
                );
            };
            let ((), teed) = tee(attend);
            let ((), captured) = cuda_source::capture(sm, attend);
            let counts: Vec<[u32; 3]> = captured.iter().map(|c| c.1).collect();
            let sources = cuda_source::compile(
                captured.into_iter().map(|(n, _, k)| (n, k)).collect(),
                sm,
                &label,
            )?;
            if teed.len() != sources.len() {
                return Err(format!(
                    "{label}: {} kernel launches on wgpu, {} captured for CUDA",
                    teed.len(),
                    sources.len()
                ));
            }
            for ((launch, source), count) in teed.iter().zip(&sources).zip(&counts) {
                if launch.kernel != source.kernel {
                    return Err(format!(
                        "{label}: wgpu launched {}, CUDA would launch {} (the launch sequences differ)",
                        launch.kernel, source.kernel
                    ));
                }
                let program = match built.iter().find(|(e, _)| *e == source.entry) {
                    Some((_, p)) => p.clone(),
                    None => {
                        let p = build_kernel(dir, source, cxx, &harness);
                        built.push((source.entry.clone(), p.clone()));
                        p
                    }
                };
                let check = run_one(
                    dir,
                    &label,
                    launch,
                    source,
                    *count,
                    program,
                    checks.len(),
                    tols,
                );
                progress(&check);
                checks.push(check);
            }
        }
    }
    Ok(checks)
}

/// One kernel source run on the host from a recorded launch (its buffers before, its runtime
/// scalars) with `count` cubes of `source.cube_dim`, compared with `launch.after`: the step
/// [`check_on_host`] takes for each launch, for a source of any origin (the tests' hand-written
/// kernels). `dir` and `cxx` as there; the harness is compiled again.
///
/// # Errors
/// The directory cannot be written or the harness does not compile.
pub fn check_source(
    dir: &Path,
    cxx: &str,
    label: &str,
    source: &KernelSource,
    launch: &TeedLaunch,
    count: [u32; 3],
    tols: HostTolerances,
) -> Result<HostCheck, String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create the folder {}: {e}", dir.display()))?;
    let harness = build_harness(dir, cxx)?;
    let program = build_kernel(dir, source, cxx, &harness);
    Ok(run_one(dir, label, launch, source, count, program, 0, tols))
}

/// Compile the harness once per directory (`dir/harness.o`) and prove the toolchain: a probe
/// program built from `cuda_host.h` and the harness must link and run (a C compiler that cannot
/// link C++, a compiler without `_Float16`, fail here in one line, not as every kernel failing).
fn build_harness(dir: &Path, cxx: &str) -> Result<PathBuf, String> {
    for (file, text) in [
        ("cuda_host.h", CUDA_HOST_H),
        ("harness.cpp", HARNESS_CPP),
        // The sources' own includes: everything they need is in cuda_host.h.
        ("mma.h", "#pragma once\n"),
        ("cuda_fp16.h", "#pragma once\n"),
        ("probe.cu", PROBE_CU),
    ] {
        let path = dir.join(file);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let object = dir.join("harness.o");
    compile_cmd(
        Command::new(cxx)
            .args(["-std=c++20", "-O1", "-c"])
            .arg(dir.join("harness.cpp"))
            .arg("-o")
            .arg(&object),
        cxx,
        "compiling the harness",
    )?;
    let probe = dir.join("probe");
    compile_cmd(
        &mut host_program(cxx, dir, &dir.join("probe.cu"), &object, &probe),
        cxx,
        "linking a probe kernel with the harness",
    )?;
    // No launch file: the probe must start and refuse its arguments (exit status 2).
    let ran = Command::new(&probe)
        .output()
        .map_err(|e| format!("{}: {e}", probe.display()))?;
    if ran.status.code() != Some(2) {
        return Err(format!(
            "CXX={cxx}: the probe program built from the harness exited with {}",
            ran.status
        ));
    }
    Ok(object)
}

/// A kernel translation unit with nothing in it but the epilogue's symbols (the toolchain
/// probe of [`build_harness`]).
const PROBE_CU: &str = "extern \"C\" void lab_entry(void **, const void *) {}\n\
extern \"C\" unsigned lab_info_size() { return sizeof(__half); }\n\
extern \"C\" char *lab_shared() { return nullptr; }\n\
extern \"C\" unsigned lab_shared_size() { return 0; }\n";

/// The command compiling kernel source `cu` (with `cuda_host.h` force-included) and linking it
/// with the harness object into `program`.
fn host_program(cxx: &str, dir: &Path, cu: &Path, harness: &Path, program: &Path) -> Command {
    let mut cmd = Command::new(cxx);
    cmd.args(["-std=c++20", "-O1", "-pthread", "-include"])
        .arg(dir.join("cuda_host.h"))
        .arg("-I")
        .arg(dir)
        .args(["-x", "c++"])
        .arg(cu)
        .args(["-x", "none"])
        .arg(harness)
        .arg("-o")
        .arg(program);
    cmd
}

fn compile_cmd(cmd: &mut Command, cxx: &str, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| {
        format!("CXX={cxx}: {e} (set CXX to a C++20 compiler with _Float16: g++ 12 or later)")
    })?;
    if out.status.success() {
        Ok(())
    } else {
        let text = String::from_utf8_lossy(&out.stderr);
        let first = text
            .lines()
            .find(|l| l.contains("error"))
            .or_else(|| text.lines().find(|l| !l.trim().is_empty()))
            .unwrap_or("no output");
        Err(format!("CXX={cxx}: {what} failed: {first}"))
    }
}

/// The epilogue appended to a kernel's source: its dynamic shared memory and `lab_entry`.
///
/// # Errors
/// A signature or info struct this module does not recognise.
pub fn epilogue(source: &KernelSource) -> Result<String, String> {
    let params = signature_params(&source.source, &source.entry)?;
    let buffers = params.iter().filter(|p| p.contains('*')).count();
    if params.len() != buffers + 1 || !params.last().is_some_and(|p| p.contains("info_st")) {
        return Err(format!(
            "{}: expected buffer parameters then one info_st, found {params:?}",
            source.entry
        ));
    }
    let call: Vec<String> = (0..buffers)
        .map(|i| format!("lab_any{{b[{i}]}}"))
        .chain(std::iter::once("info".to_string()))
        .collect();
    let (shared_def, shared_ptr) = match shared_name(&source.source) {
        Some(name) => (
            format!(
                "alignas(128) char {name}[{}];\n",
                source.shared_bytes.max(1)
            ),
            (name, source.shared_bytes),
        ),
        None => (String::new(), ("nullptr".to_string(), 0)),
    };
    Ok(format!(
        "\n// ---- cuda_host epilogue ----\n{shared_def}\
struct lab_any {{ void *p; template <class T> operator T *() const {{ return (T *)p; }} }};\n\
extern \"C\" void lab_entry(void **b, const void *raw) {{\n\
    info_st info;\n    __builtin_memcpy(&info, raw, sizeof info);\n    {}({});\n}}\n\
extern \"C\" unsigned lab_info_size() {{ return sizeof(info_st); }}\n\
extern \"C\" char *lab_shared() {{ return {}; }}\n\
extern \"C\" unsigned lab_shared_size() {{ return {}; }}\n",
        source.entry,
        call.join(", "),
        shared_ptr.0,
        shared_ptr.1
    ))
}

/// The parameter declarations of the `__global__` function `entry`.
fn signature_params(source: &str, entry: &str) -> Result<Vec<String>, String> {
    let at = source
        .find(&format!("{entry}("))
        .ok_or_else(|| format!("{entry}: not found in its source"))?;
    let rest = &source[at + entry.len() + 1..];
    let end = rest
        .find(") {")
        .ok_or_else(|| format!("{entry}: unterminated parameter list"))?;
    Ok(rest[..end]
        .split(',')
        .map(|p| p.trim().to_string())
        .collect())
}

/// The name of the kernel's `extern __shared__` array, if it has one.
fn shared_name(source: &str) -> Option<String> {
    let at = source.find("extern __shared__")?;
    let rest = &source[at..];
    let end = rest.find("[]")?;
    let name: String = rest[..end]
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then(|| name.chars().rev().collect())
}

/// The `info_st` fields of a source in order: `(type, name, count)`.
fn info_fields(source: &str) -> Result<Vec<(String, String, usize)>, String> {
    let at = source
        .find("struct info_st {")
        .ok_or("no info_st struct in the source")?;
    let body = &source[at + "struct info_st {".len()..];
    let body = &body[..body.find("};").ok_or("unterminated info_st")?];
    body.split(';')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (ty, rest) = f
                .split_once(' ')
                .ok_or_else(|| format!("info_st field {f:?}"))?;
            let (name, count) = rest
                .trim()
                .trim_end_matches(']')
                .split_once('[')
                .ok_or_else(|| format!("info_st field {f:?}"))?;
            let count = count.parse().map_err(|_| format!("info_st field {f:?}"))?;
            Ok((ty.to_string(), name.to_string(), count))
        })
        .collect()
}

/// The info struct's bytes for a launch: `scalars_f32` and `scalars_u32` take the launch's
/// runtime scalars of that type in argument order (as cubecl's launcher packs them),
/// `static_meta` the buffers' lengths in elements, in order (zeros where unused).
pub fn info_bytes(
    source: &str,
    args: &[ArgKind],
    buffer_lens: &[usize],
) -> Result<Vec<u8>, String> {
    let f32s: Vec<u32> = args
        .iter()
        .filter_map(|a| match a {
            ArgKind::F32(x) => Some(x.to_bits()),
            _ => None,
        })
        .collect();
    let u32s: Vec<u32> = args
        .iter()
        .filter_map(|a| match a {
            ArgKind::U32(x) => Some(*x),
            _ => None,
        })
        .collect();
    let lens: Vec<u32> = buffer_lens.iter().map(|&n| n as u32).collect();
    let mut out = Vec::new();
    for (ty, name, count) in info_fields(source)? {
        let values = match (ty.as_str(), name.as_str()) {
            ("float", "scalars_f32") => &f32s,
            ("uint32_t", "scalars_u32") => &u32s,
            ("uint32_t", "static_meta") => &lens,
            _ => {
                return Err(format!(
                    "info_st field {ty} {name}[{count}] is not known here"
                ));
            }
        };
        if values.len() > count {
            return Err(format!(
                "info_st {name}[{count}] cannot hold {} values",
                values.len()
            ));
        }
        for i in 0..count {
            out.extend_from_slice(&values.get(i).copied().unwrap_or(0).to_le_bytes());
        }
    }
    Ok(out)
}

/// Compile one kernel's source with the epilogue into a program; `Err` is one line.
fn build_kernel(
    dir: &Path,
    source: &KernelSource,
    cxx: &str,
    harness: &Path,
) -> Result<PathBuf, String> {
    let text = format!("{}{}", source.source, epilogue(source)?);
    let cu = dir.join(format!("{}.cu", source.entry));
    std::fs::write(&cu, text).map_err(|e| format!("{}: {e}", cu.display()))?;
    let program = dir.join(&source.entry);
    compile_cmd(
        &mut host_program(cxx, dir, &cu, harness, &program),
        cxx,
        &format!("compiling {}", source.entry),
    )?;
    Ok(program)
}

/// The launch file `harness.cpp` reads (its header comment): `launch`'s buffers before it ran,
/// with `count` cubes of `cube_dim` units (the CUDA configuration) and the info struct `info`.
pub fn launch_file(
    launch: &TeedLaunch,
    count: [u32; 3],
    cube_dim: [u32; 3],
    info: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    for x in [0x4842_414c_u32, 1]
        .into_iter()
        .chain(count)
        .chain(cube_dim)
        .chain([launch.before.len() as u32])
    {
        out.extend_from_slice(&x.to_le_bytes());
    }
    for b in &launch.before {
        out.extend_from_slice(&(b.len() as u64).to_le_bytes());
        out.extend_from_slice(b);
    }
    out.extend_from_slice(&(info.len() as u32).to_le_bytes());
    out.extend_from_slice(info);
    out
}

/// The buffers of a harness output file.
fn read_output(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], String> {
        let s = data
            .get(at..at + n)
            .ok_or_else(|| format!("{}: truncated", path.display()))?;
        at += n;
        Ok(s)
    };
    let count = u32::from_le_bytes(take(4)?.try_into().unwrap()) as usize;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let n = u64::from_le_bytes(take(8)?.try_into().unwrap()) as usize;
        out.push(take(n)?.to_vec());
    }
    Ok(out)
}

/// Compare the host's buffers with the `wgpu` launch's as f32 values: `(max |Δ|, worst Δ/tol,
/// first failure)`. Bit-identical values (NaN patterns of untouched memory included) agree.
pub fn compare(
    expected: &[Vec<u8>],
    actual: &[Vec<u8>],
    tol: Tolerance,
) -> (f32, f32, Option<String>) {
    let mut max_abs = 0.0f32;
    let mut worst = 0.0f32;
    let mut first = None;
    if expected.len() != actual.len() {
        return (
            f32::NAN,
            f32::NAN,
            Some(format!(
                "{} buffers back, {} expected",
                actual.len(),
                expected.len()
            )),
        );
    }
    for (b, (e, a)) in expected.iter().zip(actual).enumerate() {
        if e.len() != a.len() {
            first.get_or_insert(format!(
                "buffer {b}: {} bytes back, {} expected",
                a.len(),
                e.len()
            ));
            continue;
        }
        for (i, (e, a)) in e.chunks_exact(4).zip(a.chunks_exact(4)).enumerate() {
            if e == a {
                continue;
            }
            let e = f32::from_le_bytes(e.try_into().unwrap());
            let a = f32::from_le_bytes(a.try_into().unwrap());
            let diff = (a - e).abs();
            let ratio = diff / (tol.abs as f32 + tol.rel as f32 * e.abs());
            if diff.is_nan() || ratio > 1.0 {
                first.get_or_insert(format!("buffer {b}[{i}]: host {a}, wgpu {e}"));
            }
            if diff.is_nan() {
                max_abs = f32::NAN;
                worst = f32::NAN;
            } else if !max_abs.is_nan() {
                max_abs = max_abs.max(diff);
                worst = worst.max(ratio);
            }
        }
    }
    (max_abs, worst, first)
}

#[allow(clippy::too_many_arguments)]
fn run_one(
    dir: &Path,
    label: &str,
    launch: &TeedLaunch,
    source: &KernelSource,
    count: [u32; 3],
    program: Result<PathBuf, String>,
    index: usize,
    tols: HostTolerances,
) -> HostCheck {
    let wmma = source.source.contains("nvcuda::wmma::mma_sync");
    let tol = if wmma { tols.wmma } else { tols.f32 };
    let mut check = HostCheck {
        label: label.to_string(),
        kernel: launch.kernel,
        entry: source.entry.clone(),
        wmma,
        max_abs: 0.0,
        worst_ratio: 0.0,
        tol,
        wgpu_config: (launch.count != count || launch.cube_dim != source.cube_dim)
            .then_some((launch.count, launch.cube_dim)),
        cuda_config: (count, source.cube_dim),
        error: None,
    };
    let result = (|| -> Result<(f32, f32, Option<String>), String> {
        let program = program?;
        let lens: Vec<usize> = launch.before.iter().map(|b| b.len() / 4).collect();
        let info = info_bytes(&source.source, &launch.args, &lens)?;
        let input = dir.join(format!("launch-{index:03}.bin"));
        let output = dir.join(format!("out-{index:03}.bin"));
        std::fs::write(&input, launch_file(launch, count, source.cube_dim, &info))
            .map_err(|e| format!("{}: {e}", input.display()))?;
        let run = Command::new(&program)
            .arg(&input)
            .arg(&output)
            .output()
            .map_err(|e| format!("{}: {e}", program.display()))?;
        if !run.status.success() {
            let text = String::from_utf8_lossy(&run.stderr);
            return Err(match text.lines().find(|l| !l.trim().is_empty()) {
                Some(line) => line.to_string(),
                None => format!("{} exited with {}", program.display(), run.status),
            });
        }
        let actual = read_output(&output)?;
        Ok(compare(&launch.after, &actual, tol))
    })();
    match result {
        Ok((max_abs, worst, first)) => {
            check.max_abs = max_abs;
            check.worst_ratio = worst;
            check.error = first;
        }
        Err(e) => check.error = Some(e),
    }
    check
}
