//! Running a sweep: plan, skip finished runs, run the rest as child processes (`lab run-one`),
//! merge the per-run tables, fit the law, summarise.
//!
//! Layout of a sweep's output folder (`results/<sweep>/` by default):
//! ```text
//! runs.parquet  curves.parquet  spectrum.parquet  fit.parquet     merged tables
//! runs/<run_id>/{config.json, log.txt, model.safetensors, curves.parquet, spectrum.parquet, runs.parquet}
//! ```
//! A run is finished when `runs/<run_id>/runs.parquet` exists: it is written last, atomically,
//! so a killed run leaves no such file and is redone on the next start. Each run is its own
//! process: burn's process-global state (RNG, thread pool) cannot leak from one run into
//! another, a crash fails one run and not the sweep, and `--jobs N` runs N at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use super::spec::{EvalSpec, PlannedRun, SpecError, SweepSpec};
use crate::analysis::bands;
use crate::config::RunConfig;
use crate::eval::EvalRequest;
use crate::model::scaling::{RopeScaling, ScalingKind};
use crate::results::tables::{
    FitRow, RunMeta, curves_table, fit_table, layers_table, runs_row, spectrum_table,
};
use crate::results::{self, ResultsError, column};
use crate::train::{self, RunStatus, TrainOutcome};

/// Where a sweep runs.
///
/// `wgpu` and `cuda` exist in every build so that `--backend cuda` on a CPU-only build gets a clear
/// error instead of an unknown value; they need the cargo features of the same names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// burn-flex on the CPU (SIMD, rayon), with the Rust fused kernels (`kernels::cpu`,
    /// `kernels::pointwise`).
    Cpu,
    /// burn's CubeCL backend on wgpu (Vulkan; Mesa lavapipe runs it on the CPU), with the CubeCL
    /// attention kernels (`kernels::cube`). Needs the cargo feature `wgpu`.
    Wgpu,
    /// burn's CubeCL backend on CUDA device 0, with fusion, autotune and the CubeCL attention
    /// kernels. Needs the cargo feature `cuda` (or `cuda-plain`: the same without burn's fusion).
    Cuda,
}

impl Backend {
    /// Name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Wgpu => "wgpu",
            Backend::Cuda => "cuda",
        }
    }

    /// The burn device (not autodiff; training wraps it).
    ///
    /// # Errors
    /// [`SweepError::Backend`] when the backend's cargo feature was not compiled in, (`cuda`)
    /// when the machine has no CUDA driver library to load, or (`wgpu`, `cuda`) when
    /// `LAB_KERNEL_CACHE` holds a value [`crate::kernels::kernel_cache::CacheSetting::parse`]
    /// refuses, or `LAB_FUSION_MAX_BLOCKS` one [`crate::kernels::fusion_config::parse_max_blocks`]
    /// refuses, or `LAB_STEP_READS` one [`crate::train::StepReads::parse`] refuses, or `LAB_ADAMW`
    /// one [`crate::train::AdamWKernel::parse`] refuses, or `LAB_POINTWISE` one
    /// [`crate::kernels::PointwiseKernel::parse`] refuses. On `wgpu` and
    /// `cuda` it first installs CubeCL's configuration with the kernel cache
    /// ([`crate::kernels::kernel_cache::configure`]) and burn's with the fusion search's
    /// `max_blocks` ([`crate::kernels::fusion_config::configure`]), and fixes when a training
    /// step reads back ([`crate::train::configure_step_reads`]), how AdamW updates
    /// ([`crate::train::configure_adamw`]) and how RMSNorm and GELU run
    /// ([`crate::kernels::configure_pointwise`]).
    pub fn device(self) -> Result<burn::tensor::Device, SweepError> {
        match self {
            Backend::Cpu => Ok(burn::tensor::Device::flex()),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => {
                crate::kernels::kernel_cache::configure().map_err(SweepError::Backend)?;
                crate::kernels::fusion_config::configure().map_err(SweepError::Backend)?;
                crate::train::configure_step_reads().map_err(SweepError::Backend)?;
                crate::train::configure_adamw().map_err(SweepError::Backend)?;
                crate::kernels::configure_pointwise().map_err(SweepError::Backend)?;
                Ok(burn::tensor::Device::wgpu(
                    burn::tensor::DeviceKind::DefaultDevice,
                ))
            }
            #[cfg(feature = "cuda-plain")]
            Backend::Cuda => {
                cuda_driver_loadable()?;
                crate::kernels::kernel_cache::configure().map_err(SweepError::Backend)?;
                crate::kernels::fusion_config::configure().map_err(SweepError::Backend)?;
                crate::train::configure_step_reads().map_err(SweepError::Backend)?;
                crate::train::configure_adamw().map_err(SweepError::Backend)?;
                crate::kernels::configure_pointwise().map_err(SweepError::Backend)?;
                Ok(burn::tensor::Device::cuda(0))
            }
            #[allow(unreachable_patterns)]
            other => Err(other.not_built()),
        }
    }

    /// [`SweepError::Backend`] when this build lacks the backend's cargo feature (what
    /// [`Backend::device`] refuses first; `lab sweep --dry-run` checks it too).
    ///
    /// # Errors
    /// The one line naming the feature and the backends this build has.
    pub fn ensure_built(self) -> Result<(), SweepError> {
        if Backend::available().contains(&self.name()) {
            Ok(())
        } else {
            Err(self.not_built())
        }
    }

    fn not_built(self) -> SweepError {
        SweepError::Backend(format!(
            "backend = {} needs the cargo feature `{}`: rebuild with `cargo build --release --features {}` \
             (allowed in this build: {})",
            self.name(),
            self.name(),
            self.name(),
            Backend::available().join(", ")
        ))
    }

    /// Names of the backends compiled into this build.
    pub fn available() -> Vec<&'static str> {
        let mut names = vec!["cpu"];
        if cfg!(feature = "wgpu") {
            names.push("wgpu");
        }
        if cfg!(feature = "cuda-plain") {
            names.push("cuda");
        }
        names
    }
}

/// Whether the NVIDIA driver library (`libcuda.so.1`, else `libcuda.so`) can be loaded: cudarc
/// loads it on CubeCL's device thread and panics there when it is missing, which the caller sees as
/// a stack trace, so `--backend cuda` checks first and fails with one line.
#[cfg(all(feature = "cuda-plain", unix))]
fn cuda_driver_loadable() -> Result<(), SweepError> {
    for name in [c"libcuda.so.1", c"libcuda.so"] {
        // SAFETY: dlopen/dlclose with a valid C string; the handle is closed right away and no
        // symbol is used (loading the driver library runs no code of ours).
        unsafe {
            let handle = libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
            if !handle.is_null() {
                libc::dlclose(handle);
                return Ok(());
            }
        }
    }
    Err(SweepError::Backend(
        "backend = cuda: no NVIDIA driver here (libcuda.so.1 cannot be loaded); use --backend cpu, \
         or run on a machine with an NVIDIA GPU and its driver"
            .into(),
    ))
}

#[cfg(all(feature = "cuda-plain", not(unix)))]
fn cuda_driver_loadable() -> Result<(), SweepError> {
    Ok(())
}

/// Errors of the sweep runner.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The sweep file or its expansion.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// Reading or writing tables.
    #[error(transparent)]
    Results(#[from] ResultsError),
    /// Saving a checkpoint.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// An MI sweep file (`lab sweep --list` reads them too).
    #[error(transparent)]
    Mi(#[from] crate::mi::MiError),
    /// An evaluation after training.
    #[error("evaluation: {0}")]
    Eval(String),
    /// A backend that is not compiled into this build.
    #[error("{0}")]
    Backend(String),
    /// A run's data cannot be produced (e.g. a missing corpus), found before any run starts,
    /// or a run could not write its results (the sweep stopped).
    #[error("{0}")]
    Data(String),
    /// Another `lab sweep` holds the output folder.
    #[error("{0}")]
    Busy(String),
    /// Other I/O, with context.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// Exit code of `lab run-one` when the run's results cannot be written (disk full, folder gone):
/// the sweep stops and records nothing for that run, instead of marking it `failed`.
pub const EXIT_CANNOT_WRITE: u8 = 3;

impl SweepError {
    /// Whether this is a failure to read or write files (storage), not of the run itself.
    pub fn is_storage(&self) -> bool {
        matches!(
            self,
            SweepError::Results(_) | SweepError::Checkpoint(_) | SweepError::Io { .. }
        )
    }
}

/// The last line of a run's log that starts with `error:` (what its process died of).
fn last_error_line(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .rev()
        .find(|l| l.starts_with("error:"))
        .map(|l| l.trim_start_matches("error:").trim().to_string())
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> SweepError {
    let context = context.into();
    move |source| SweepError::Io { context, source }
}

/// Options of [`run_sweep`].
#[derive(Clone, Debug)]
pub struct SweepOptions {
    /// Preset to expand.
    pub preset: String,
    /// Output folder.
    pub out_dir: PathBuf,
    /// Runs at once (child processes).
    pub jobs: usize,
    /// Backend.
    pub backend: Backend,
    /// The `lab` executable used for child runs.
    pub exe: PathBuf,
    /// Show a progress bar (else plain lines).
    pub progress: bool,
    /// Run only this slice of the grid (see [`super::cluster::Shard`]).
    pub shard: Option<super::cluster::Shard>,
    /// Rerun the runs recorded as `failed` (their tables are removed first).
    pub retry_failed: bool,
}

/// What a sweep did.
#[derive(Clone, Debug)]
pub struct SweepReport {
    /// Runs in the grid.
    pub planned: usize,
    /// Runs already finished before this start.
    pub skipped: usize,
    /// Runs done now.
    pub ran: usize,
    /// Runs of the grid whose status is `failed`.
    pub failed: usize,
    /// Runs whose process was killed by a signal (not recorded: redone on the next start).
    pub interrupted: usize,
    /// Runs of the grid finished (done or failed) in the output folder at the end.
    pub finished: usize,
    /// Whether the sweep itself was stopped by Ctrl-C or SIGTERM.
    pub stopped_by_signal: bool,
    /// Failed runs reset by `retry_failed`.
    pub retried: usize,
    /// Wall time of this invocation, seconds.
    pub wall_time_s: f64,
    /// Law fits for this preset.
    pub fits: Vec<FitRow>,
    /// Printable summary (table + fits).
    pub summary: String,
}

/// Ctrl-C and SIGTERM during `lab sweep`: a flag the scheduling loop reads (the handler only
/// stores it, which is async-signal-safe), and forwarding to run processes.
mod interrupt {
    use std::sync::atomic::{AtomicBool, Ordering};

    static REQUESTED: AtomicBool = AtomicBool::new(false);

    extern "C" fn on_signal(_: libc::c_int) {
        REQUESTED.store(true, Ordering::SeqCst);
    }

    /// Route SIGINT and SIGTERM to the flag (from now on, for this process).
    pub fn install() {
        // SAFETY: `on_signal` only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
            libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        }
    }

    /// Whether a stop was asked for.
    pub fn requested() -> bool {
        REQUESTED.load(Ordering::SeqCst)
    }

    /// Send SIGINT to run process `pid` (a no-op if it is already gone).
    pub fn forward(pid: u32) {
        // SAFETY: kill(2) with a child's pid; errors (already exited) are ignored.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGINT);
        }
    }
}

/// Folder of one run's tables.
pub fn run_dir(out_dir: &Path, run_id: &str) -> PathBuf {
    out_dir.join("runs").join(run_id)
}

/// Whether a run's tables are complete.
pub fn is_finished(out_dir: &Path, run_id: &str) -> bool {
    run_dir(out_dir, run_id).join("runs.parquet").is_file()
}

/// Train one run in this process, run its `evals`, and write its tables into `dir`
/// (`runs.parquet` last, so a run killed during its evaluations is redone whole).
pub fn run_one(
    cfg: &RunConfig,
    meta: &RunMeta,
    dir: &Path,
    backend: Backend,
    evals: &[EvalSpec],
    progress: &mut dyn FnMut(&train::Progress),
) -> Result<TrainOutcome, SweepError> {
    std::fs::create_dir_all(dir).map_err(io(format!("cannot create {}", dir.display())))?;
    results::clean_temporaries(dir);
    let device = backend.device()?;
    // `lab status` and a resumed sweep see this process working on the run.
    super::status::write_marker(dir, std::process::id()).map_err(io(format!(
        "cannot write {}",
        dir.join(super::status::MARKER).display()
    )))?;
    let (mut out, model) = train::train(cfg, &device, progress);
    crate::checkpoint::save(&model, cfg, dir)?;
    if cfg.task.kind() == crate::config::TaskKind::Igsm && out.status == RunStatus::Done {
        let n = (cfg.eval_batches * cfg.batch_size).min(256);
        let t0 = Instant::now();
        let held_out = crate::decode::ProblemSet::HeldOut;
        let g = crate::decode::igsm_generation(&model, cfg, &device, n, held_out);
        eprintln!(
            "greedy decoding of {n} held-out problems: answer accuracy {:.3}, valid solutions {:.3} ({:.1} s)",
            g.answer_accuracy,
            g.solution_valid,
            t0.elapsed().as_secs_f64()
        );
        out.answer_accuracy = Some(g.answer_accuracy);
        out.solution_valid = Some(g.solution_valid);
        let by_role = crate::decode::igsm_accuracy_by_role(&model, cfg, &device, n, held_out);
        eprintln!(
            "teacher-forced accuracy by part of the solution: {}",
            crate::decode::describe_roles(&by_role)
        );
        out.solution_role_accuracy =
            Some(by_role.map(|(scored, right)| right as f64 / scored as f64));
        // The same measures on new problems of training structures: in-distribution or not.
        let seen = crate::decode::ProblemSet::TrainStructures;
        let g = crate::decode::igsm_generation(&model, cfg, &device, n, seen);
        let by_role = crate::decode::igsm_accuracy_by_role(&model, cfg, &device, n, seen);
        let (scored, right) = by_role[crate::decode::SolutionRole::Definition as usize];
        eprintln!(
            "on {n} new problems of training structures: answer accuracy {:.3}, teacher-forced: {}",
            g.answer_accuracy,
            crate::decode::describe_roles(&by_role)
        );
        out.answer_accuracy_train_structures = Some(g.answer_accuracy);
        out.acc_tf_definition_train_structures = Some(right as f64 / scored as f64);
    }
    if cfg.task.kind() == crate::config::TaskKind::Indirect && out.status == RunStatus::Done {
        let n = (cfg.eval_batches * cfg.batch_size).clamp(256, 1024);
        let a = crate::indirect::accuracy_by_shift(&model, cfg, &device, n);
        eprintln!(
            "held-out accuracy by shift ({n} examples): {}",
            a.describe()
        );
        out.acc_shift0 = a.shift0();
        out.acc_shift_nonzero = a.nonzero();
        let (n, shares) = crate::indirect::final_token_attention(&model, cfg, &device, 256);
        if n > 0 {
            results::write_batch(
                &dir.join("attention.parquet"),
                &results::tables::attention_table(cfg, n, &shares),
            )?;
        }
    }
    // The MI width of the run's own data (R4): block tasks, and iGSM's solutions (issue 19).
    if matches!(
        cfg.task.kind(),
        crate::config::TaskKind::Block | crate::config::TaskKind::Igsm
    ) {
        out.dep_width_mi = cfg.data_width_mi();
    }
    if out.status == RunStatus::Done && !evals.is_empty() {
        run_evals(cfg, dir, backend, evals)?;
    }
    results::write_batch(&dir.join("curves.parquet"), &curves_table(cfg, &out))?;
    results::write_batch(&dir.join("spectrum.parquet"), &spectrum_table(cfg, &out))?;
    results::write_batch(&dir.join("layers.parquet"), &layers_table(cfg, &out))?;
    results::write_batch(&dir.join("runs.parquet"), &runs_row(cfg, meta, &out))?;
    super::status::clear_marker(dir);
    Ok(out)
}

/// The evaluation requests of `evals` for a run of `cfg`: every length factor × scaling (RoPE
/// runs; other encodings once per length, as trained; at factor 1 only `none`), with
/// `scale_params` multiplied by the factor and `set` applied.
pub fn eval_requests(cfg: &RunConfig, evals: &[EvalSpec]) -> Vec<EvalRequest> {
    let mut out = Vec::new();
    for e in evals
        .iter()
        .filter(|e| e.tasks.is_empty() || e.tasks.contains(&cfg.task.kind()))
    {
        for &s in &e.length_factors {
            let mut overrides: Vec<String> = e
                .scale_params
                .iter()
                .filter_map(|k| {
                    let v = cfg.flat().get(k)?.as_u64()?;
                    Some(format!("{k}={}", v * s as u64))
                })
                .collect();
            overrides.extend(e.set.iter().map(|(k, v)| format!("{k}={v}")));
            // At s = 1 every scaling is the identity: evaluate once.
            let scalings: Vec<ScalingKind> = if cfg.encoding.rope_scalable() && s > 1 {
                e.scalings.clone()
            } else {
                vec![ScalingKind::None]
            };
            for kind in scalings {
                out.push(EvalRequest {
                    seq_len: cfg.seq_len * s,
                    scaling: RopeScaling {
                        kind,
                        factor: s as f64,
                        original_max_len: cfg.seq_len,
                        ..RopeScaling::default()
                    },
                    overrides: overrides.clone(),
                    name: e.name.clone(),
                    ablate: None,
                });
            }
            if !cfg.encoding.rope_scalable() {
                continue;
            }
            let theta = cfg.freq_grid();
            for &band in &e.ablate {
                let Some(pairs) =
                    bands::band_pairs(band, &theta, cfg.dep_width() as f64, cfg.seq_len)
                else {
                    continue;
                };
                out.push(EvalRequest {
                    seq_len: cfg.seq_len * s,
                    scaling: RopeScaling {
                        factor: s as f64,
                        original_max_len: cfg.seq_len,
                        ..RopeScaling::default()
                    },
                    overrides: overrides.clone(),
                    name: e.name.clone(),
                    ablate: Some(crate::eval::Ablation {
                        band: band.name().to_string(),
                        pairs,
                    }),
                });
            }
        }
    }
    out
}

fn run_evals(
    cfg: &RunConfig,
    dir: &Path,
    backend: Backend,
    evals: &[EvalSpec],
) -> Result<(), SweepError> {
    let device = backend.device()?;
    let (train_cfg, model) = crate::checkpoint::load(dir, &device)?;
    for req in eval_requests(cfg, evals) {
        let (out, scaling) = crate::eval::eval_model(&train_cfg, model.clone(), &req, &device)
            .map_err(|e| SweepError::Eval(e.to_string()))?;
        crate::eval::write_eval(dir, &train_cfg, &out, &scaling, &req.name)
            .map_err(|e| SweepError::Eval(e.to_string()))?;
        eprintln!(
            "eval {} ×{} {}{}: loss {:.4}, acc {:.4}",
            req.name,
            req.seq_len / cfg.seq_len,
            req.scaling.kind.name(),
            req.ablate
                .as_ref()
                .map(|a| {
                    let pairs: Vec<String> = a.pairs.iter().map(|p| p.to_string()).collect();
                    format!(", ablated {} band (pairs {})", a.band, pairs.join(", "))
                })
                .unwrap_or_default(),
            out.loss,
            out.accuracy
        );
    }
    Ok(())
}

/// Record a run whose process died without writing its tables (panic, kill, OOM).
fn record_crash(
    cfg: &RunConfig,
    meta: &RunMeta,
    dir: &Path,
    reason: String,
) -> Result<(), SweepError> {
    let out = TrainOutcome {
        status: RunStatus::Failed { step: 0, reason },
        curves: vec![],
        spectra: vec![],
        initial: None,
        last: None,
        wall_time_s: 0.0,
        ms_per_step: 0.0,
        tokens_per_s: 0.0,
        probe_ms: 0.0,
        answer_accuracy: None,
        solution_valid: None,
        solution_role_accuracy: None,
        answer_accuracy_train_structures: None,
        acc_tf_definition_train_structures: None,
        acc_shift0: None,
        acc_shift_nonzero: None,
        val: None,
        converged_step: None,
        dep_width_mi: None,
        attention_lags: None,
    };
    results::write_batch(&dir.join("curves.parquet"), &curves_table(cfg, &out))?;
    results::write_batch(&dir.join("spectrum.parquet"), &spectrum_table(cfg, &out))?;
    results::write_batch(&dir.join("layers.parquet"), &layers_table(cfg, &out))?;
    results::write_batch(&dir.join("runs.parquet"), &runs_row(cfg, meta, &out))?;
    Ok(())
}

struct Running {
    child: Child,
    run: PlannedRun,
    id: String,
    started: Instant,
}

/// Run a sweep (see module docs). Finished runs are skipped; the merged tables, the fit and the
/// summary cover every finished run of the preset's grid (of the shard, with `opts.shard`).
///
/// Crash safety: the output folder is locked against a second `lab sweep` (an advisory lock
/// that dies with the process); temporaries of killed writers are removed on start; a run
/// whose process is killed by a signal is not recorded (redone on the next start), one that
/// exits with an error is recorded `failed`; a run still held by a live `lab run-one` from an
/// earlier, killed sweep is waited for instead of being started twice.
pub fn run_sweep(spec: &SweepSpec, opts: &SweepOptions) -> Result<SweepReport, SweepError> {
    // A backend missing from this build fails here, once, not in every child run.
    opts.backend.device()?;
    let start = Instant::now();
    let started = std::time::SystemTime::now();
    let mut plan = spec.expand(&opts.preset)?;
    let select = spec.selection(&opts.preset, &plan)?;
    let whole_ids: Vec<String> = plan.iter().map(|r| r.config.run_id()).collect();
    if let Some(shard) = opts.shard {
        plan = shard.select(plan);
    }
    let out_dir = &opts.out_dir;
    std::fs::create_dir_all(out_dir.join("runs")).map_err(io(format!(
        "cannot create the output folder {}",
        out_dir.display()
    )))?;
    let _lock = lock_out_dir(out_dir)?;
    // The folder's plan from now on: its tables, fit, figures and `lab status` describe it.
    let folder_plan = crate::results::plan::FolderPlan {
        sweep: spec.name.clone(),
        preset: opts.preset.clone(),
        sets: spec.sets().to_vec(),
        shard: opts.shard.map(|s| s.to_string()),
        plan_id: crate::results::plan::FolderPlan::id_of(&spec.name, &whole_ids),
        run_ids: plan.iter().map(|r| r.config.run_id()).collect(),
        select,
    };
    let earlier_plan = crate::results::plan::read(out_dir);
    crate::results::plan::write(out_dir, &folder_plan).map_err(io(format!(
        "cannot write {} in {}",
        crate::results::plan::PLAN_FILE,
        out_dir.display()
    )))?;
    results::clean_temporaries(out_dir);
    results::clean_temporaries(&out_dir.join("runs"));
    // Finished runs too: a killed `lab eval` or crash record leaves temporaries there.
    for e in std::fs::read_dir(out_dir.join("runs"))
        .into_iter()
        .flatten()
        .flatten()
    {
        results::clean_temporaries(&e.path());
        results::clean_temporaries(&e.path().join("evals"));
    }
    let meta = RunMeta {
        sweep: spec.name.clone(),
        preset: opts.preset.clone(),
        backend: opts.backend.name().to_string(),
    };
    let mut retried = 0;
    if opts.retry_failed {
        for r in &plan {
            let id = r.config.run_id();
            if matches!(
                super::status::run_state(out_dir, &id),
                super::status::RunState::Failed { .. }
            ) {
                let dir = run_dir(out_dir, &id);
                for t in ["runs", "curves", "spectrum"] {
                    let _ = std::fs::remove_file(dir.join(format!("{t}.parquet")));
                }
                let _ = std::fs::remove_dir_all(dir.join("evals"));
                retried += 1;
            }
        }
    }
    let todo: Vec<PlannedRun> = plan
        .iter()
        .filter(|r| !is_finished(out_dir, &r.config.run_id()))
        .cloned()
        .collect();
    preflight(&todo)?;
    let skipped = plan.len() - todo.len();
    let jobs = opts.jobs.max(1);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let threads = (cores / jobs).max(1);

    let bar = if opts.progress {
        let b = ProgressBar::new(todo.len() as u64);
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} runs (ETA {eta_precise}) {msg}",
            )
            .expect("valid template"),
        );
        b.enable_steady_tick(Duration::from_millis(500));
        b
    } else {
        ProgressBar::hidden()
    };
    let say = |line: String| {
        if opts.progress {
            bar.println(line);
        } else {
            eprintln!("{line}");
        }
    };
    say(crate::paths::where_line(Some(&spec.path), out_dir));
    say(format!(
        "sweep {} (preset {}{}): {} runs, {} already finished{}, {} to run with {} job(s) × {} thread(s) → {}",
        spec.name,
        opts.preset,
        opts.shard
            .map(|s| format!(", shard {s}"))
            .unwrap_or_default(),
        plan.len(),
        skipped,
        if retried > 0 {
            format!(" ({retried} failed run(s) reset for a retry)")
        } else {
            String::new()
        },
        todo.len(),
        jobs,
        threads,
        out_dir.display()
    ));
    for set in spec.sets() {
        say(format!("  --set {set}"));
    }
    say(format!("  grid: {}", super::spec::describe_plan(&plan)));
    let others = crate::results::plan::other_finished(out_dir, &folder_plan.run_ids);
    if !others.is_empty() {
        say(format!(
            "  note: {} finished run(s) in this folder belong to other plans{}; they are kept but left out of its tables, fits and figures",
            others.len(),
            earlier_plan
                .filter(|p| p.plan_id != folder_plan.plan_id || p.run_ids != folder_plan.run_ids)
                .map(|p| format!(" (the last one here: {})", p.describe()))
                .unwrap_or_default()
        ));
    }
    if jobs > cores {
        say(format!(
            "note: --jobs {jobs} > {cores} cores: runs share cores (1 thread each)"
        ));
    }
    if opts.backend != Backend::Cpu
        && todo
            .iter()
            .any(|r| r.config.attention == crate::model::AttentionKernel::Fast)
    {
        say(format!(
            "note: attention = \"fast\" is the CPU's whole-step path; on {} these runs train through burn with the fused CubeCL kernels",
            opts.backend.name()
        ));
    }

    // Runs still held by a live process of an earlier (killed) sweep: wait for them.
    let mut foreign: Vec<(PlannedRun, String, u32)> = Vec::new();
    let mut queue_runs = Vec::new();
    for run in todo {
        let id = run.config.run_id();
        match super::status::live_marker(&run_dir(out_dir, &id)) {
            Some(m) if m.host == super::status::host_name() => {
                say(format!(
                    "  … {}: still running in process {} (from an earlier start): waiting for it",
                    run.label(),
                    m.pid
                ));
                foreign.push((run, id, m.pid));
            }
            _ => queue_runs.push(run),
        }
    }
    let mut queue = std::collections::VecDeque::from(queue_runs);
    let mut running: Vec<Running> = Vec::new();
    let mut ran = 0;
    let mut interrupted = 0;
    let mut storage_failure: Option<String> = None;
    let mut stopping = false;
    interrupt::install();
    loop {
        if interrupt::requested() && !stopping {
            // Ctrl-C (or SIGTERM): start nothing more, stop the runs in flight (their processes
            // get the signal too when it came from the terminal), then report and exit 1.
            stopping = true;
            queue.clear();
            foreign.clear();
            for r in &running {
                interrupt::forward(r.child.id());
            }
            say(
                "  interrupted: stopping the runs in flight (they are redone on the next start)"
                    .to_string(),
            );
        }
        while running.len() < jobs {
            let Some(run) = queue.pop_front() else { break };
            running.push(spawn_run(spec, opts, &run, threads)?);
            bar.set_message(run.label());
        }
        if running.is_empty() && foreign.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut i = 0;
        while i < foreign.len() {
            let dir = run_dir(out_dir, &foreign[i].1);
            if super::status::live_marker(&dir).is_some_and(|m| m.pid == foreign[i].2) {
                i += 1;
                continue;
            }
            let (run, id, _) = foreign.swap_remove(i);
            if is_finished(out_dir, &id) {
                ran += 1;
                bar.inc(1);
            } else {
                queue.push_back(run);
            }
        }
        let mut i = 0;
        while i < running.len() {
            let status = running[i]
                .child
                .try_wait()
                .map_err(io("cannot wait for a run process"))?;
            let Some(status) = status else {
                i += 1;
                continue;
            };
            let r = running.swap_remove(i);
            let dir = run_dir(out_dir, &r.id);
            super::status::clear_marker(&dir);
            if !dir.join("runs.parquet").is_file() {
                use std::os::unix::process::ExitStatusExt;
                if status.code() == Some(EXIT_CANNOT_WRITE as i32) {
                    // Storage, not the run: start nothing more, record nothing for it.
                    queue.clear();
                    storage_failure.get_or_insert_with(|| {
                        format!(
                            "run {} ({}) could not write its results: {}; nothing was recorded for it and finished runs are intact: free space or fix {} and run the sweep again",
                            r.id,
                            r.run.label(),
                            last_error_line(&dir.join("log.txt"))
                                .unwrap_or_else(|| format!("its process exited ({status})")),
                            out_dir.display()
                        )
                    });
                    continue;
                }
                if let Some(sig) = status.signal() {
                    // Killed from outside (Ctrl-C, kill, OOM killer, preemption): not the
                    // run's fault; leave it missing so the next start redoes it.
                    interrupted += 1;
                    say(format!(
                        "  ! {}: run process killed by signal {sig}; not recorded, redone on the next start",
                        r.run.label()
                    ));
                    continue;
                }
                record_crash(
                    &r.run.config,
                    &meta,
                    &dir,
                    format!(
                        "run process exited ({status}) without results; see {}",
                        dir.join("log.txt").display()
                    ),
                )?;
            }
            ran += 1;
            bar.inc(1);
            say(finished_line(&dir, &r, r.started.elapsed().as_secs_f64()));
        }
    }
    bar.finish_and_clear();
    if let Some(message) = storage_failure {
        return Err(SweepError::Data(message));
    }

    let ids: Vec<String> = plan.iter().map(|r| r.config.run_id()).collect();
    let (fits, summary, failed) = collect(spec, &opts.preset, out_dir, &ids)?;
    let finished = ids.iter().filter(|id| is_finished(out_dir, id)).count();
    use super::provenance::{self, Invocation};
    let inv = Invocation {
        sweep: spec.name.clone(),
        preset: opts.preset.clone(),
        sets: spec.sets().to_vec(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        lab_version: env!("CARGO_PKG_VERSION").to_string(),
        git_commit: provenance::git_commit(&spec.path),
        host: super::status::host_name(),
        cpu_model: provenance::cpu_model(),
        cores,
        jobs,
        threads_per_run: threads,
        backend: opts.backend.name().to_string(),
        started_unix_s: provenance::unix_seconds(started),
        ended_unix_s: provenance::unix_seconds(std::time::SystemTime::now()),
        wall_time_s: start.elapsed().as_secs_f64(),
        planned: plan.len(),
        ran,
        skipped,
        failed,
    };
    provenance::record(out_dir, inv, &summary).map_err(io(format!(
        "cannot write {} in {}",
        provenance::PROVENANCE_FILE,
        out_dir.display()
    )))?;
    Ok(SweepReport {
        planned: plan.len(),
        skipped,
        ran,
        failed,
        finished,
        stopped_by_signal: stopping,
        interrupted,
        retried,
        wall_time_s: start.elapsed().as_secs_f64(),
        fits,
        summary,
    })
}

/// Take the output folder's advisory lock (`.sweep.lock`), held until the returned file is
/// dropped or the process dies.
fn lock_out_dir(out_dir: &Path) -> Result<std::fs::File, SweepError> {
    let path = out_dir.join(".sweep.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io(format!("cannot create {}", path.display())))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(SweepError::Busy(format!(
            "another `lab sweep` is writing to {}; wait for it to finish or choose another --out",
            out_dir.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(SweepError::Io {
            context: format!("cannot lock {}", path.display()),
            source: e,
        }),
    }
}

/// Check, before any run starts, that every task of `runs` can produce its data (one training
/// example of the first run of each distinct task config): a missing corpus is one error line
/// now, not a failure in every run.
fn preflight(runs: &[PlannedRun]) -> Result<(), SweepError> {
    let mut seen = std::collections::HashSet::new();
    for r in runs {
        let key = format!("{:?}", r.config.task());
        if !seen.insert(key) {
            continue;
        }
        if let Err(e) = r
            .config
            .task()
            .batch(r.config.seed, tasks::Split::Train, 0, 1)
        {
            return Err(SweepError::Data(format!(
                "{} task ({}): {e}",
                r.config.task.kind().name(),
                r.label()
            )));
        }
    }
    Ok(())
}

/// Start the process of one run (`lab run-one`), with its config, log and marker in its folder.
fn spawn_run(
    spec: &SweepSpec,
    opts: &SweepOptions,
    run: &PlannedRun,
    threads: usize,
) -> Result<Running, SweepError> {
    let id = run.config.run_id();
    let dir = run_dir(&opts.out_dir, &id);
    std::fs::create_dir_all(&dir).map_err(io(format!("cannot create {}", dir.display())))?;
    results::clean_temporaries(&dir);
    results::clean_temporaries(&dir.join("evals"));
    let config_path = dir.join("config.json");
    results::write_file_atomic(
        &config_path,
        serde_json::to_string_pretty(&run.config)
            .unwrap()
            .as_bytes(),
    )
    .map_err(io(format!("cannot write {}", config_path.display())))?;
    let evals_path = dir.join("evals.json");
    if !run.evals.is_empty() {
        results::write_file_atomic(
            &evals_path,
            serde_json::to_string_pretty(&run.evals).unwrap().as_bytes(),
        )
        .map_err(io(format!("cannot write {}", evals_path.display())))?;
    }
    let log = std::fs::File::create(dir.join("log.txt")).map_err(io(format!(
        "cannot write {}",
        dir.join("log.txt").display()
    )))?;
    let mut cmd = Command::new(&opts.exe);
    cmd.arg("run-one");
    if !run.evals.is_empty() {
        cmd.arg("--evals").arg(&evals_path);
    }
    let child = cmd
        .arg("--config")
        .arg(&config_path)
        .arg("--out")
        .arg(&dir)
        .arg("--sweep")
        .arg(&spec.name)
        .arg("--preset")
        .arg(&opts.preset)
        .arg("--backend")
        .arg(opts.backend.name())
        .env("RAYON_NUM_THREADS", threads.to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(io("cannot open the run log"))?)
        .stderr(log)
        .spawn()
        .map_err(io(format!("cannot start {}", opts.exe.display())))?;
    Ok(Running {
        child,
        run: run.clone(),
        id,
        started: Instant::now(),
    })
}

fn finished_line(dir: &Path, r: &Running, secs: f64) -> String {
    let label = r.run.label();
    let Ok((_, batches)) = results::read_parquet(&dir.join("runs.parquet")) else {
        return format!("  ? {label}: unreadable results");
    };
    let b = &batches[0];
    let status = column::strings(b, "status")[0].clone().unwrap_or_default();
    if status != "done" {
        let reason = column::strings(b, "fail_reason")[0]
            .clone()
            .unwrap_or_default();
        return format!("  ✗ {label}: failed: {reason}");
    }
    let acc = column::floats(b, "final_eval_accuracy")[0].unwrap_or(f64::NAN);
    let loss = column::floats(b, "final_eval_loss")[0].unwrap_or(f64::NAN);
    let theta = column::floats(b, "effective_freq")[0].unwrap_or(f64::NAN);
    // TAPA's probe centroid is no θ_eff (docs/analysis-rules.md R59).
    let theta = if column::strings(b, "encoding")[0].as_deref() == Some("tapa") {
        String::new()
    } else {
        format!(", θ_eff {theta:.4} rad/token")
    };
    let ms = column::floats(b, "ms_per_step")[0].unwrap_or(f64::NAN);
    let answer = column::floats(b, "answer_accuracy")[0]
        .map(|a| format!(", generated-answer acc {a:.3}"))
        .unwrap_or_default();
    format!(
        "  ✓ {label}: eval loss {loss:.3}, acc {acc:.3}{answer}{theta} ({secs:.0} s, {ms:.0} ms/step)"
    )
}

/// Merge the tables of the finished runs among `ids` (the folder's plan; other runs in the
/// folder are left out and named in a note), fit the law over them, write `fit.parquet`, and
/// build the summary text. Returns `(fits, summary, failed count)`.
pub fn collect(
    spec: &SweepSpec,
    preset: &str,
    out_dir: &Path,
    ids: &[String],
) -> Result<(Vec<FitRow>, String, usize), SweepError> {
    collect_named(&spec.name, preset, out_dir, ids)
}

/// [`collect`] for the sweep named `sweep_name` (e.g. read from a `runs` table by `lab merge`).
pub fn collect_named(
    sweep_name: &str,
    preset: &str,
    out_dir: &Path,
    ids: &[String],
) -> Result<(Vec<FitRow>, String, usize), SweepError> {
    let mut parts: BTreeMap<&str, Vec<PathBuf>> = BTreeMap::new();
    // The plan's finished runs only: other plans' runs in the folder stay out of the tables.
    let own: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
    let mut run_dirs: Vec<PathBuf> = std::fs::read_dir(out_dir.join("runs"))
        .map_err(io(format!(
            "cannot list {}",
            out_dir.join("runs").display()
        )))?
        .flatten()
        .filter(|e| own.contains(e.file_name().to_string_lossy().as_ref()))
        .map(|e| e.path())
        .filter(|p| p.join("runs.parquet").is_file())
        .collect();
    run_dirs.sort();
    // The selection on validation (R58) the folder's plan declares: the tables other than
    // `runs` (which keeps every run of the plan and marks `selected`), the fits and the summary
    // use the selected runs only.
    let selection = crate::results::plan::read(out_dir).and_then(|p| p.select);
    let choices = match &selection {
        Some(sel) => {
            let cands = crate::analysis::select::candidates(out_dir, ids, sel)?;
            Some(crate::analysis::select::choose(sel, &cands))
        }
        None => None,
    };
    let selected: Option<std::collections::HashSet<String>> = choices.as_ref().map(|cs| {
        cs.iter()
            .filter_map(|c| c.chosen.as_ref().ok().cloned())
            .collect()
    });
    let analysed: Vec<PathBuf> = run_dirs
        .iter()
        .filter(|d| {
            selected.as_ref().is_none_or(|s| {
                d.file_name()
                    .is_some_and(|n| s.contains(n.to_string_lossy().as_ref()))
            })
        })
        .cloned()
        .collect();
    // `layers` is absent from runs of lab versions before it existed; `attention` exists only for
    // indirect-indexing runs.
    for table in ["runs", "curves", "spectrum", "layers", "attention"] {
        let dirs = if table == "runs" {
            &run_dirs
        } else {
            &analysed
        };
        let files: Vec<PathBuf> = dirs
            .iter()
            .map(|d| d.join(format!("{table}.parquet")))
            .filter(|f| matches!(table, "runs" | "curves" | "spectrum") || f.is_file())
            .collect();
        if !files.is_empty() {
            parts.insert(table, files);
        }
    }
    let eval_files = crate::eval::eval_files(&analysed);
    if !eval_files.is_empty() {
        parts.insert("evals", eval_files);
    }
    for (table, files) in &parts {
        results::merge_tables(files, &out_dir.join(format!("{table}.parquet")))?;
    }
    let runs_table = out_dir.join("runs.parquet");
    if runs_table.is_file() {
        results::mark_selected(&runs_table, selected.as_ref())?;
    }
    // A table none of the plan's runs has (e.g. `attention`, `evals`) must not linger from
    // another plan's runs.
    for table in ["runs", "curves", "spectrum", "layers", "attention", "evals"] {
        if !parts.contains_key(table) {
            let _ = std::fs::remove_file(out_dir.join(format!("{table}.parquet")));
        }
    }

    let analysed_ids: Vec<String> = match &selected {
        Some(s) => ids.iter().filter(|id| s.contains(*id)).cloned().collect(),
        None => ids.to_vec(),
    };
    let all_records = super::law::read_records(out_dir, ids)?;
    let failed = all_records.iter().filter(|r| r.status != "done").count();
    let records: Vec<&super::law::RunRecord> = all_records
        .iter()
        .filter(|r| analysed_ids.contains(&r.id))
        .collect();
    let done: Vec<&super::law::RunRecord> =
        records.into_iter().filter(|r| r.status == "done").collect();
    let fits = super::law::fits(sweep_name, preset, &done);
    results::write_batch(&out_dir.join("fit.parquet"), &fit_table(&fits))?;
    let mut summary = super::law::summary_text(&done, &fits, failed);
    if let (Some(sel), Some(cs)) = (&selection, &choices) {
        summary.push_str(&crate::analysis::select::summary_lines(sel, cs));
    }
    let over = selection
        .as_ref()
        .map(|s| s.over.clone())
        .unwrap_or_default();
    summary.push_str(&crate::analysis::paired::summary_lines(
        &paired_inputs(out_dir, &done),
        &over,
    ));
    summary.push_str(&crate::results::plan::others_note(out_dir, ids));
    Ok((fits, summary, failed))
}

/// The paired comparison's view of the finished, analysed runs: each run's config and its test
/// metrics (held-out NLL; accuracy, or iGSM's greedy answers).
fn paired_inputs(
    out_dir: &Path,
    done: &[&super::law::RunRecord],
) -> Vec<crate::analysis::paired::RunMetrics> {
    done.iter()
        .filter_map(|r| {
            let dir = run_dir(out_dir, &r.id);
            let config: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).ok()?)
                    .ok()?;
            crate::analysis::paired::RunMetrics::new(
                &config,
                vec![("test NLL", r.loss), ("test accuracy", r.acc)],
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Encoding;

    fn spec(toml_text: &str) -> Vec<EvalSpec> {
        #[derive(serde::Deserialize)]
        struct F {
            evals: Vec<EvalSpec>,
        }
        toml::from_str::<F>(toml_text).unwrap().evals
    }

    #[test]
    fn backends_missing_from_the_build_are_a_one_line_error() {
        assert!(Backend::Cpu.device().is_ok());
        assert_eq!(Backend::available()[0], "cpu");
        if !cfg!(feature = "cuda-plain") {
            let msg = Backend::Cuda.device().unwrap_err().to_string();
            assert!(
                msg.starts_with("backend = cuda needs the cargo feature `cuda`"),
                "{msg}"
            );
            assert!(!msg.contains('\n'), "{msg}");
        }
        if !cfg!(feature = "wgpu") {
            let msg = Backend::Wgpu.device().unwrap_err().to_string();
            assert!(msg.contains("--features wgpu"), "{msg}");
        }
    }

    #[test]
    fn eval_requests_expand_factors_scalings_and_dilation() {
        let evals = spec(
            r#"
            [[evals]]
            name = "dilated"
            length_factors = [1, 2, 4]
            scalings = ["none", "linear", "yarn"]
            scale_params = ["block_len"]
            [[evals]]
            name = "fixed"
            length_factors = [2]
            set = { noise = 0.25 }
            "#,
        );
        let mut cfg = crate::config::tests::tiny();
        cfg.encoding = Encoding::Rope.into();
        cfg.seq_len = 16;
        let reqs = eval_requests(&cfg, &evals);
        // dilated: 1 (s = 1) + 3 + 3; fixed: 1 (default scaling none).
        assert_eq!(reqs.len(), 8);
        let r = &reqs[5];
        assert_eq!((r.name.as_str(), r.seq_len), ("dilated", 64));
        assert_eq!(r.scaling.kind, ScalingKind::Linear);
        assert_eq!(r.scaling.factor, 4.0);
        assert_eq!(r.scaling.original_max_len, 16);
        assert_eq!(r.overrides, vec!["block_len=16".to_string()]);
        let last = &reqs[7];
        assert_eq!((last.name.as_str(), last.seq_len), ("fixed", 32));
        assert_eq!(last.overrides, vec!["noise=0.25".to_string()]);
        // A task filter that excludes the run.
        let mut only_indirect = evals.clone();
        only_indirect[0].tasks = vec![crate::config::TaskKind::Indirect];
        assert_eq!(eval_requests(&cfg, &only_indirect).len(), 1);
        // Other encodings: once per length, unscaled.
        cfg.encoding = Encoding::Pope.into();
        let reqs = eval_requests(&cfg, &evals);
        assert_eq!(reqs.len(), 4);
        assert!(reqs.iter().all(|r| r.scaling.kind == ScalingKind::None));
    }
}
