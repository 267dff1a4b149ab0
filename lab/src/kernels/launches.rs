//! Every CubeCL kernel a pass launches, counted by name and timed on the device ([`observe`]), and
//! a pass with every launch dropped, for the host's time alone ([`dry_run`])
//! (`lab bench train-step --backend wgpu|cuda --profile-steps N`: `launches_per_step`,
//! `device_ms_per_step`, `host_ms_per_step`).
//!
//! A training step of the lab's small models on a GPU is a few hundred launches of kernels that
//! each run for microseconds, so whether it keeps up with PyTorch eager is decided by how many
//! kernels it launches and what each launch costs the host, not by any kernel's arithmetic
//! (docs/performance.md, "Launches per training step"). This module answers both from inside the
//! binary, through CubeCL's launch observer (`cubecl::logging::LaunchObserver`, called on the
//! issuing thread before each launch is submitted): the launches of a pass by kernel name, and,
//! with [`TimingRequest::Deferred`], each launch's device time, read only once the pass is over
//! so the kernels still run back to back. The sum of those times against the pass's wall time
//! says whether the device or the host sets the step's pace.

#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
use std::collections::HashMap;
#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
use std::sync::{Arc, Mutex};

#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
use cubecl::logging::{LaunchObservation, LaunchObserver, ProfileDuration, TimingRequest};

/// What [`observe`] saw of a pass.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LaunchProfile {
    /// Kernel launches issued during the pass.
    pub launches: usize,
    /// Launches per kernel, named by [`short_kernel_name`] (the kernel's Rust type), most
    /// frequent first, ties by name.
    pub by_kernel: Vec<(String, usize)>,
    /// Sum of the launches' device times in ms, when timing was asked for and every launch
    /// carried a measurement; `None` otherwise.
    pub device_ms: Option<f64>,
    /// How the times were taken: `"device"` (the device's own timestamps: CUDA events,
    /// wgpu timestamp queries) or `"system"` (host wall time around a blocking submit, which
    /// includes the submit; wgpu falls back to it when its query budget is spent); `"mixed"`
    /// when both occurred; `None` without timing.
    pub timing: Option<&'static str>,
}

#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
#[derive(Default)]
struct Recorder {
    timing: bool,
    counts: Mutex<HashMap<&'static str, usize>>,
    profiles: Mutex<Vec<ProfileDuration>>,
    timed_ms: Mutex<Vec<(f64, bool)>>,
}

#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
impl LaunchObserver for Recorder {
    fn launched(&self, kernel: &'static str) {
        *self
            .counts
            .lock()
            .expect("launch counter poisoned")
            .entry(kernel)
            .or_default() += 1;
    }

    fn timing(&self) -> TimingRequest {
        if self.timing {
            TimingRequest::Deferred
        } else {
            TimingRequest::None
        }
    }

    fn profiled(&self, _kernel: &'static str, profile: ProfileDuration) {
        self.profiles
            .lock()
            .expect("launch profiles poisoned")
            .push(profile);
    }

    fn timed(
        &self,
        _kernel: &'static str,
        duration: cubecl::logging::Duration,
        method: cubecl::logging::TimingMethod,
    ) {
        let device = matches!(method, cubecl::logging::TimingMethod::Device);
        self.timed_ms
            .lock()
            .expect("launch timings poisoned")
            .push((duration.as_secs_f64() * 1e3, device));
    }
}

/// A kernel's name as CubeCL's launch observer gives it (the kernel's Rust type path) shortened
/// to the type's own name, e.g. `lab::kernels::cube::kernels::attn_fwd_tiled::AttnFwdTiled` →
/// `AttnFwdTiled`, `cubek_matmul::…::MatmulEntry<cubek_matmul::…, …>` → `MatmulEntry`; burn's
/// generic element-wise kernels keep the operation their first type argument names:
/// `burn_cubecl::kernel::binary::kernel_binop::KernelBinop<burn_cubecl::kernel::binary::MulOp>`
/// → `KernelBinop<MulOp>`.
pub fn short_kernel_name(name: &str) -> String {
    let (path, generics) = match name.find('<') {
        Some(i) => (&name[..i], Some(&name[i + 1..])),
        None => (name, None),
    };
    let kernel = path.rsplit("::").next().unwrap_or(path);
    const GENERIC: [&str; 7] = [
        "KernelBinop",
        "KernelScalarBinop",
        "KernelCmp",
        "KernelScalarCmp",
        "UnaryFloat",
        "CumulativeKernel",
        "SelectAssignKernel",
    ];
    match generics {
        Some(args) if GENERIC.contains(&kernel) => {
            // The first argument's last path segment: `…::MulOp>` → `MulOp`.
            let first = args.strip_suffix('>').unwrap_or(args);
            let op = first.rsplit("::").next().unwrap_or(first);
            let op = op.split([',', '>', '<']).next().unwrap_or(op).trim();
            format!("{kernel}<{op}>")
        }
        _ => kernel.to_string(),
    }
}

/// Run `pass` with every CubeCL kernel launch of the process observed; with `timing`, each launch
/// is also timed (CubeCL's `TimingRequest::Deferred`: nothing waits during the pass; the
/// measurements are read after it, which waits for the device). Launches are attributed by time,
/// process-wide, so `pass` should start with nothing of its own in flight and end with a sync.
/// `None` in a build without a CubeCL backend (features `wgpu`, `cuda`).
#[cfg(not(any(feature = "wgpu", feature = "cuda-plain")))]
pub fn observe<R>(_timing: bool, pass: impl FnOnce() -> R) -> (R, Option<LaunchProfile>) {
    (pass(), None)
}

/// Run `pass` with every CubeCL kernel launch of the process observed; with `timing`, each launch
/// is also timed (CubeCL's `TimingRequest::Deferred`: nothing waits during the pass; the
/// measurements are read after it, which waits for the device). Launches are attributed by time,
/// process-wide, so `pass` should start with nothing of its own in flight and end with a sync.
#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
pub fn observe<R>(timing: bool, pass: impl FnOnce() -> R) -> (R, Option<LaunchProfile>) {
    let recorder = Arc::new(Recorder {
        timing,
        ..Recorder::default()
    });
    let out = {
        let _watching = LaunchObservation::new(recorder.clone());
        pass()
    };
    let counts = std::mem::take(&mut *recorder.counts.lock().expect("launch counter poisoned"));
    let mut merged: HashMap<String, usize> = HashMap::new();
    for (name, n) in counts {
        *merged.entry(short_kernel_name(name)).or_default() += n;
    }
    let launches = merged.values().sum();
    let mut by_kernel: Vec<(String, usize)> = merged.into_iter().collect();
    by_kernel.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let (device_ms, method) = if timing {
        read_times(&recorder)
    } else {
        (None, None)
    };
    (
        out,
        Some(LaunchProfile {
            launches,
            by_kernel,
            device_ms,
            timing: method,
        }),
    )
}

/// Run `pass` under CubeCL's dry run (`cubecl::dry_run::DryRun`, process-wide while `pass`
/// runs): every kernel launch is prepared and compiled if new, then dropped before the device;
/// buffers keep whatever they held, so values read back mean nothing. `Some(pass())` on a CubeCL
/// build; `None` without one (`pass` is not run).
#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
pub fn dry_run<R>(pass: impl FnOnce() -> R) -> Option<R> {
    let _dry = cubecl::dry_run::DryRun::new();
    Some(pass())
}

/// Without a CubeCL backend there is nothing to dry-run: `None`, and `pass` is not run.
#[cfg(not(any(feature = "wgpu", feature = "cuda-plain")))]
pub fn dry_run<R>(_pass: impl FnOnce() -> R) -> Option<R> {
    None
}

/// Resolve the deferred measurements and add the ones delivered already read; `None` if any
/// launch carried none (a refused profile, a window the device reported empty).
#[cfg(any(feature = "wgpu", feature = "cuda-plain"))]
fn read_times(recorder: &Recorder) -> (Option<f64>, Option<&'static str>) {
    let profiles = std::mem::take(&mut *recorder.profiles.lock().expect("profiles poisoned"));
    let timed = std::mem::take(&mut *recorder.timed_ms.lock().expect("timings poisoned"));
    let mut total = 0.0;
    let (mut device, mut system) = (false, false);
    for (ms, on_device) in timed {
        total += ms;
        if on_device {
            device = true;
        } else {
            system = true;
        }
    }
    for p in profiles {
        match p.timing_method() {
            cubecl::logging::TimingMethod::Device => device = true,
            cubecl::logging::TimingMethod::System => system = true,
        }
        match cubecl::future::block_on(p.resolve()) {
            Some(ticks) => total += ticks.duration().as_secs_f64() * 1e3,
            None => return (None, None),
        }
    }
    let method = match (device, system) {
        (true, false) => Some("device"),
        (false, true) => Some("system"),
        (true, true) => Some("mixed"),
        (false, false) => None,
    };
    (method.map(|_| total), method)
}

#[cfg(test)]
mod tests {
    use super::short_kernel_name;

    #[test]
    fn kernel_names_keep_the_type_and_the_operation() {
        assert_eq!(
            short_kernel_name("lab::kernels::cube::kernels::attn_fwd_tiled::AttnFwdTiled"),
            "AttnFwdTiled"
        );
        assert_eq!(
            short_kernel_name(
                "cubek_matmul::multi_level::MatmulEntry<cubek_matmul::multi_level::args::TensorArgs, cubecl_core::DynamicScalar<cubek_matmul::__Lhs>>"
            ),
            "MatmulEntry"
        );
        assert_eq!(
            short_kernel_name(
                "burn_cubecl::kernel::binary::kernel_binop::KernelBinop<burn_cubecl::kernel::binary::MulOp>"
            ),
            "KernelBinop<MulOp>"
        );
        assert_eq!(
            short_kernel_name(
                "burn_cubecl::kernel::unary_float::unary_float::UnaryFloat<burn_cubecl::ops::tensor::<impl burn_backend::FloatTensorOps<burn_cubecl::backend::CubeBackend> for burn_cubecl::backend::CubeBackend>::float_powf_scalar_impl::Powf>"
            ),
            "UnaryFloat<Powf>"
        );
        assert_eq!(
            short_kernel_name(
                "cubek_reduce::launch::base::reduce_kernel::ReduceKernel<cubek_reduce::components::args::TensorArgs>"
            ),
            "ReduceKernel"
        );
        assert_eq!(short_kernel_name("plain"), "plain");
    }
}
