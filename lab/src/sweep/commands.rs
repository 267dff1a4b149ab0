//! What the `lab` subcommands around sweeps do, as library functions the binary calls
//! (`lab sweep --list`, `lab sweep --emit-slurm`, `lab status`, `lab bench train-step`,
//! `lab run-one`): the binary parses arguments and prints what these return.

use std::path::{Path, PathBuf};

use super::cluster::{Shard, SlurmOptions, slurm_script};
use super::runner::{Backend, SweepError, SweepOptions, SweepReport};
use super::spec::{EvalSpec, SweepSpec, find_sweep, list_sweeps};
use crate::config::RunConfig;
use crate::model::AttentionKernel;
use crate::results::tables::RunMeta;
use crate::train::Progress;

fn io(context: String) -> impl FnOnce(std::io::Error) -> SweepError {
    move |source| SweepError::Io { context, source }
}

/// `lab sweep --list`: every sweep file in `dir` (training and MI sweeps), its description and
/// presets, the default marked.
///
/// # Errors
/// A sweep file that does not parse.
pub fn list_text(dir: &Path) -> Result<String, SweepError> {
    let mut out = String::new();
    for n in list_sweeps(dir) {
        let path = dir.join(format!("{n}.toml"));
        let (description, presets, default) = if crate::mi::is_mi_sweep(&path) {
            let spec = crate::mi::MiSweep::load(&path)?;
            (
                spec.description.clone(),
                spec.presets(),
                spec.default_preset,
            )
        } else {
            let spec = find_sweep(&n, dir)?;
            (
                spec.description.clone(),
                spec.presets(),
                spec.default_preset,
            )
        };
        out.push_str(&format!("{n}: {description}\n"));
        for (p, d) in presets {
            let mark = if p == default { " (default)" } else { "" };
            out.push_str(&format!("    --preset {p}{mark}: {d}\n"));
        }
    }
    Ok(out)
}

/// The sweep file `name` names: `name` itself when it ends in `.toml`, else `dir/<name>.toml`.
pub fn sweep_path(name: &str, dir: &Path) -> PathBuf {
    if name.ends_with(".toml") {
        PathBuf::from(name)
    } else {
        dir.join(format!("{name}.toml"))
    }
}

/// `lab sweep --emit-slurm FILE`: validate the grid now (not on the cluster), write the job-array
/// script to `file` (atomically) and create the output folder Slurm writes its logs into.
/// Returns the line telling the user how to submit and merge.
///
/// # Errors
/// A grid that does not expand, an unwritable file or folder.
pub fn emit_slurm(
    spec: &SweepSpec,
    opts: &SweepOptions,
    file: &Path,
    slurm: &SlurmOptions,
) -> Result<String, SweepError> {
    let runs = spec.expand(&opts.preset)?.len();
    let abs =
        |p: &Path| std::path::absolute(p).map_err(io(format!("cannot resolve {}", p.display())));
    let script = slurm_script(
        &spec.name,
        &abs(&spec.path)?,
        &opts.preset,
        spec.sets(),
        &abs(&opts.out_dir)?,
        &opts.exe,
        slurm,
    );
    crate::results::write_file_atomic(file, script.as_bytes())
        .map_err(io(format!("cannot write {}", file.display())))?;
    // Slurm does not create the folder of --output: make it now.
    std::fs::create_dir_all(&opts.out_dir).map_err(io(format!(
        "cannot create the output folder {}",
        opts.out_dir.display()
    )))?;
    Ok(format!(
        "wrote {}: {} array task(s) over {runs} runs; submit with `sbatch {}`, then `lab merge {}/shard-* --out {}`",
        file.display(),
        slurm.shards,
        file.display(),
        opts.out_dir.display(),
        opts.out_dir.display()
    ))
}

/// Seconds per training token of one finished run, and the share of its step cap it trained:
/// `(wall_time_s / (steps_done · batch_size · seq_len), steps_done / steps)`, read from its
/// `runs/<id>/runs.parquet` (`None` for a failed run or one without these columns).
fn step_cost(out_dir: &Path, id: &str) -> Option<(f64, f64)> {
    let path = super::runner::run_dir(out_dir, id).join("runs.parquet");
    let (_, batches) = crate::results::read_parquet(&path).ok()?;
    let b = batches.first()?;
    use crate::results::column::{floats, ints, strings};
    if strings(b, "status").first()?.as_deref() != Some("done") {
        return None;
    }
    let wall = (*floats(b, "wall_time_s").first()?)?;
    let done = (*ints(b, "steps_done").first()?)? as f64;
    let cap = (*ints(b, "steps").first()?)? as f64;
    let tokens = (*ints(b, "batch_size").first()?)? as f64 * (*ints(b, "seq_len").first()?)? as f64;
    (done > 0.0 && cap > 0.0 && tokens > 0.0).then(|| (wall / (done * tokens), done / cap))
}

/// `lab sweep NAME --dry-run`: what `lab sweep` would do with these options, training nothing:
/// the overrides, the resolved grid, every run with its state (`done`, `failed`, `to train`,
/// `running` elsewhere), the counts, and an estimated wall time for the runs to train.
///
/// The estimate: each run to train costs `steps · f · batch_size · seq_len · t` seconds, where
/// `t` is the mean wall time per training token and `f` the mean share of the step cap trained
/// (spectrum stops end early) over the finished runs of the plan (else of every finished run
/// in the folder), divided by the runs at once (`jobs`). Without finished runs there is no
/// estimate, and the text says so.
///
/// # Errors
/// A grid that does not expand; a backend this build lacks ([`super::Backend::ensure_built`]).
pub fn dry_run_text(spec: &SweepSpec, opts: &SweepOptions) -> Result<String, SweepError> {
    use super::status::{RunState, run_state};
    opts.backend.ensure_built()?;
    let mut plan = spec.expand(&opts.preset)?;
    if let Some(shard) = opts.shard {
        plan = shard.select(plan);
    }
    let out = &opts.out_dir;
    let mut s = format!(
        "{}\ndry run: sweep {} (preset {}{}) into {}\n",
        crate::paths::where_line(Some(&spec.path), &opts.out_dir),
        spec.name,
        opts.preset,
        opts.shard
            .map(|x| format!(", shard {x}"))
            .unwrap_or_default(),
        out.display()
    );
    for set in spec.sets() {
        s.push_str(&format!("  --set {set}\n"));
    }
    s.push_str(&format!("  grid: {}\n", super::spec::describe_plan(&plan)));
    let (mut done, mut failed, mut running, mut todo) = (0, 0, 0, Vec::new());
    let mut lines = String::new();
    for r in &plan {
        let id = r.config.run_id();
        let state = match run_state(out, &id) {
            RunState::Done => {
                done += 1;
                "done    "
            }
            RunState::Failed { .. } if !opts.retry_failed => {
                failed += 1;
                "failed  "
            }
            RunState::Running(_) => {
                running += 1;
                "running "
            }
            RunState::Failed { .. } | RunState::Missing => {
                todo.push(r);
                "to train"
            }
        };
        let label = r.label();
        lines.push_str(&format!(
            "  {state}  {id}  {label}  (steps ≤ {})\n",
            r.config.steps
        ));
    }
    s.push_str(&lines);
    s.push_str(&format!(
        "{} runs: {done} done, {failed} failed (kept; --retry-failed reruns them), {running} running elsewhere, {} to train with {} job(s)\n",
        plan.len(),
        todo.len(),
        opts.jobs.max(1)
    ));
    if todo.is_empty() {
        s.push_str("nothing to train");
    } else {
        match CostEstimate::of(&plan, out) {
            None => s.push_str("no estimate: no finished run in the folder to time steps from"),
            Some(c) => {
                let secs = c.seconds(&todo, opts.jobs);
                s.push_str(&format!(
                    "estimated {:.1} min for the {} runs to train ({:.1} µs per training token and {:.0} % of the step cap, means over {} {}; at the full cap {:.1} min)",
                    secs / 60.0,
                    todo.len(),
                    c.per_token * 1e6,
                    c.frac * 100.0,
                    c.runs,
                    c.source,
                    secs / c.frac / 60.0
                ));
            }
        }
    }
    Ok(s)
}

/// What the finished runs of a folder say a training token costs (the dry run's estimate).
struct CostEstimate {
    /// Mean wall time per training token, seconds.
    per_token: f64,
    /// Mean share of the step cap trained (spectrum stops end early).
    frac: f64,
    /// Finished runs the means are over.
    runs: usize,
    /// Which runs: the plan's, else the folder's.
    source: &'static str,
}

impl CostEstimate {
    /// From the finished runs of `plan` in `out`, else from every finished run in `out`;
    /// `None` without any.
    fn of(plan: &[super::spec::PlannedRun], out: &Path) -> Option<Self> {
        let mut costs: Vec<(f64, f64)> = plan
            .iter()
            .filter_map(|r| step_cost(out, &r.config.run_id()))
            .collect();
        let mut source = "finished runs of this plan";
        if costs.is_empty() {
            source = "finished runs in the folder (other settings)";
            costs = std::fs::read_dir(out.join("runs"))
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| step_cost(out, &e.file_name().to_string_lossy()))
                .collect();
        }
        if costs.is_empty() {
            return None;
        }
        let n = costs.len() as f64;
        Some(CostEstimate {
            per_token: costs.iter().map(|c| c.0).sum::<f64>() / n,
            frac: costs.iter().map(|c| c.1).sum::<f64>() / n,
            runs: costs.len(),
            source,
        })
    }

    /// Estimated wall seconds of `todo` with `jobs` runs at once.
    fn seconds(&self, todo: &[&super::spec::PlannedRun], jobs: usize) -> f64 {
        todo.iter()
            .map(|r| {
                r.config.steps as f64
                    * self.frac
                    * r.config.batch_size as f64
                    * r.config.seq_len as f64
                    * self.per_token
            })
            .sum::<f64>()
            / jobs.max(1) as f64
    }
}

/// Runs to train above which `lab sweep` asks before it starts ([`confirm_size`]).
pub const CONFIRM_RUNS: usize = 1000;
/// Estimated hours above which `lab sweep` asks before it starts ([`confirm_size`]).
pub const CONFIRM_HOURS: f64 = 24.0;

/// Before a large sweep starts (issue 51, item 9): more than [`CONFIRM_RUNS`] runs to train, or
/// more than [`CONFIRM_HOURS`] by the dry run's estimate. On a terminal the user is asked
/// (`y` starts it); elsewhere (a script, a batch job) the sweep is refused unless `--yes` was
/// given (the caller skips this then). Small sweeps pass silently.
///
/// # Errors
/// A grid that does not expand; a large sweep not confirmed, in one line with its size and
/// estimate and what to do.
pub fn confirm_size(spec: &SweepSpec, opts: &SweepOptions) -> Result<(), SweepError> {
    use std::io::IsTerminal;
    let mut plan = spec.expand(&opts.preset)?;
    if let Some(shard) = opts.shard {
        plan = shard.select(plan);
    }
    let todo: Vec<&super::spec::PlannedRun> = plan
        .iter()
        .filter(|r| !super::runner::is_finished(&opts.out_dir, &r.config.run_id()))
        .collect();
    let hours =
        CostEstimate::of(&plan, &opts.out_dir).map(|c| c.seconds(&todo, opts.jobs) / 3600.0);
    let large = todo.len() > CONFIRM_RUNS || hours.is_some_and(|h| h > CONFIRM_HOURS);
    if !large {
        return Ok(());
    }
    let size = format!(
        "{} runs to train{}",
        todo.len(),
        match hours {
            Some(h) => format!(", about {h:.1} hours by the dry run's estimate"),
            None => " (no estimate yet: no finished run in the folder)".to_string(),
        }
    );
    if std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
        eprint!(
            "lab sweep {} (preset {}): {size}. Start it? [y/N] ",
            spec.name, opts.preset
        );
        let mut answer = String::new();
        let _ = std::io::stdin().read_line(&mut answer);
        if matches!(answer.trim(), "y" | "Y" | "yes") {
            return Ok(());
        }
        return Err(SweepError::Data(format!("not started ({size})")));
    }
    Err(SweepError::Data(format!(
        "this sweep is large: {size} (more than {CONFIRM_RUNS} runs or {CONFIRM_HOURS} hours asks first); add --yes to start it, or --dry-run to see the plan"
    )))
}

impl SweepReport {
    /// The lines `lab sweep` prints after the summary: counts, wall time, where the tables are,
    /// and how to finish interrupted runs.
    pub fn closing_lines(&self, out_dir: &Path) -> String {
        let mut s = format!(
            "{} runs ({} run now, {} already finished, {} failed) in {:.1} min; tables in {}",
            self.planned,
            self.ran,
            self.skipped,
            self.failed,
            self.wall_time_s / 60.0,
            out_dir.display()
        );
        if self.stopped_by_signal {
            s.push_str(&format!(
                "\ninterrupted: {} of {} runs done; run the same command to resume",
                self.finished, self.planned
            ));
        } else if self.interrupted > 0 {
            s.push_str(&format!(
                "\n{} run(s) interrupted by a signal: run the same command again to finish them",
                self.interrupted
            ));
        }
        s
    }
}

/// `lab status`: the state of every run of a plan of sweep `name` in `out` (default
/// `results/<name>` under the lab root, [`super::spec::lab_root`]), as one printable report.
///
/// The plan: `preset` (default: the file's) with the `--set` overrides `sets` and the slice
/// `shard`; when none of the three is given and the folder records a plan of this sweep
/// (`plan.json`, [`crate::results::plan`]), that plan — so a sweep run with `--set` reads as it ran. The
/// report ends with the number of finished runs in the folder outside the plan, if any.
///
/// # Errors
/// An unknown sweep, a bad override or shard, or a grid that does not expand.
pub fn status_text(
    name: &str,
    dir: &Path,
    preset: Option<String>,
    sets: &[String],
    out: Option<PathBuf>,
    shard: Option<Shard>,
) -> Result<String, SweepError> {
    let mut spec = find_sweep(name, dir)?;
    let out = out.unwrap_or_else(|| super::spec::default_results_dir(&spec.name));
    let recorded = crate::results::plan::read(&out).filter(|p| p.sweep == spec.name);
    let (preset, shard, from_folder) = match recorded {
        Some(p) if preset.is_none() && sets.is_empty() && shard.is_none() => {
            spec.set(&p.sets)?;
            let shard = p
                .shard
                .as_deref()
                .map(|s| s.parse::<Shard>())
                .transpose()
                .map_err(|e| {
                    SweepError::Data(format!(
                        "{}: shard: {e}",
                        out.join(crate::results::plan::PLAN_FILE).display()
                    ))
                })?;
            (p.preset.clone(), shard, true)
        }
        _ => {
            spec.set(sets)?;
            let preset = preset.unwrap_or_else(|| spec.default_preset.clone());
            (preset, shard, false)
        }
    };
    let mut plan = spec.expand(&preset)?;
    if let Some(s) = shard {
        plan = s.select(plan);
    }
    let runs: Vec<(String, String)> = plan
        .iter()
        .map(|r| (r.config.run_id(), r.label()))
        .collect();
    let report = super::status::status(&out, &runs);
    let mut what = format!("preset {preset}");
    for set in spec.sets() {
        what.push_str(&format!(" --set {set}"));
    }
    if let Some(s) = shard {
        what.push_str(&format!(" --shard {s}"));
    }
    if from_folder {
        what.push_str(", the plan the folder records");
    }
    let ids: Vec<String> = runs.iter().map(|(id, _)| id.clone()).collect();
    let others = crate::results::plan::other_finished(&out, &ids);
    let mut text = format!(
        "{}\nsweep {} ({what}) in {}: {}",
        crate::paths::where_line(Some(&spec.path), &out),
        spec.name,
        out.display(),
        report.text().trim_end()
    );
    if !out.is_dir() {
        text.push_str(&format!(
            "\n{} does not exist yet: no run of this plan has started there",
            out.display()
        ));
    }
    if !others.is_empty() {
        text.push_str(&format!(
            "\n{} more finished run(s) in {} are not in this plan (other presets or --set values)",
            others.len(),
            out.join("runs").display()
        ));
    }
    Ok(text)
}

/// `lab bench train-step`: time the training step of the first run of `sweep`'s `preset` with
/// `attention`, on `threads` CPU threads (the global rayon pool), and describe it as one JSON
/// object (`ms_per_step` median, `tokens_per_s`, and the model shape and optimiser so the same
/// model can be rebuilt elsewhere; bench/torch_baseline.py reads it). On a CubeCL backend with
/// `profile_steps > 0`, also the kernel launches of that many more steps: `launches_per_step`,
/// `device_ms_per_step` (the launches' device times summed, `null` when a launch carried no
/// measurement), `device_timing`, `launch_kinds` (`[{kernel, per_step}]`, most frequent first)
/// and `host_ms_per_step` (the median of that many steps more under CubeCL's dry run: the host's
/// work alone; [`crate::train::StepBench::host_ms_per_step`]). On `wgpu` and `cuda`, `fusion`:
/// `{max_blocks, attention}` as [`crate::kernels::fusion_config::settings`] gives them (`null`
/// without burn's fusion), and `step_reads` (`once` or `each`: [`crate::train::step_reads`]).
///
/// # Errors
/// An unknown sweep or preset, a backend missing from the build, a rayon pool already set.
pub fn bench_train_step_json(
    sweep: &str,
    preset: &str,
    attention: AttentionKernel,
    threads: usize,
    warmup: usize,
    steps: usize,
    profile_steps: usize,
    backend: Backend,
) -> Result<serde_json::Value, SweepError> {
    let fast = attention == AttentionKernel::Fast;
    if fast && backend != Backend::Cpu {
        return Err(SweepError::Backend(
            "--attention fast: the whole-step fast path runs on the CPU only (--backend cpu)"
                .into(),
        ));
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .map_err(|e| SweepError::Backend(format!("cannot set the thread count: {e}")))?;
    let spec = find_sweep(sweep, &super::sweeps_dir())?;
    let mut cfg = spec
        .expand(preset)?
        .into_iter()
        .next()
        .expect("expand returns at least one run")
        .config;
    cfg.attention = attention;
    let total = warmup + steps;
    let b = crate::train::bench_train_step(
        &cfg,
        warmup,
        steps,
        profile_steps,
        &backend.device()?,
        &mut |s, ms| {
            let kind = if s < warmup { "warm-up" } else { "timed" };
            eprintln!("train-step: step {}/{total} ({kind}) {ms:.1} ms", s + 1);
        },
    );
    let mut json = serde_json::json!({
        "path": if fast { "fast" } else { "burn" },
        "ms_per_step": b.ms_per_step, "tokens_per_s": b.tokens_per_s,
        "first_step_ms": b.first_step_ms,
        "steps": b.steps, "warmup": warmup, "threads": threads,
        "d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
        "d_ff": cfg.d_ff, "seq_len": cfg.seq_len, "batch": cfg.batch_size,
        "vocab": cfg.vocab_size, "encoding": cfg.encoding.name(), "pair_layout": cfg.pair_layout,
        "rope_base": cfg.rope_base, "mlp": "gelu", "norm": "rmsnorm",
        "attention": cfg.attention.name(), "backend": backend.name(),
        "lr": cfg.lr, "beta1": cfg.beta1, "beta2": cfg.beta2, "adam_eps": cfg.adam_eps,
        "weight_decay": cfg.weight_decay, "grad_clip": cfg.grad_clip,
    });
    if backend != Backend::Cpu {
        // burn's fusion as this run had it (`LAB_FUSION_MAX_BLOCKS`, `LAB_FUSION_ATTENTION`).
        json["fusion"] = match crate::kernels::fusion_config::settings() {
            Some((max_blocks, mode)) => {
                serde_json::json!({"max_blocks": max_blocks, "attention": mode.name()})
            }
            None => serde_json::Value::Null,
        };
        json["step_reads"] = crate::train::step_reads().name().into();
        json["adamw"] = crate::train::adamw_kernel().name().into();
        json["pointwise"] = crate::kernels::pointwise_kernel().name().into();
    }
    if let Some(l) = &b.launches {
        let per = |n: f64| n / b.profile_steps as f64;
        json["profile_steps"] = b.profile_steps.into();
        json["launches_per_step"] = per(l.launches as f64).into();
        json["device_ms_per_step"] = l.device_ms.map(per).into();
        json["device_timing"] = l.timing.into();
        json["host_ms_per_step"] = b.host_ms_per_step.into();
        json["launch_kinds"] = l
            .by_kernel
            .iter()
            .map(|(k, n)| serde_json::json!({"kernel": k, "per_step": per(*n as f64)}))
            .collect::<Vec<_>>()
            .into();
    }
    Ok(json)
}

/// What `lab run-one` ended with.
#[derive(Debug)]
pub enum RunOneExit {
    /// The run trained (done, or recorded as failed); the line to print.
    Finished(String),
    /// Its results could not be written: the error line; exit with
    /// [`EXIT_CANNOT_WRITE`](super::runner::EXIT_CANNOT_WRITE) so the sweep stops.
    CannotWrite(String),
}

/// `lab run-one`: train the run whose config is the JSON file `config` (as `lab sweep` writes
/// it), write its tables into `out`, then run the evaluations listed in the JSON file `evals`.
/// Progress goes to stderr twenty times over the run.
///
/// # Errors
/// An unreadable or invalid config or evals file; a run that cannot start.
pub fn run_one_files(
    config: &Path,
    out: &Path,
    meta: &RunMeta,
    backend: Backend,
    evals: Option<&Path>,
) -> Result<RunOneExit, SweepError> {
    let read =
        |p: &Path| std::fs::read_to_string(p).map_err(io(format!("cannot read {}", p.display())));
    let evals: Vec<EvalSpec> = match evals {
        Some(p) => serde_json::from_str(&read(p)?).map_err(|e| {
            SweepError::Data(format!("{} is not a list of evals: {e}", p.display()))
        })?,
        None => Vec::new(),
    };
    let cfg = RunConfig::from_json(&read(config)?)
        .map_err(|e| SweepError::Data(format!("{} is not a run config: {e}", config.display())))?;
    cfg.validate()
        .map_err(|e| SweepError::Data(format!("{}: {e}", config.display())))?;
    let every = (cfg.steps / 20).max(1);
    // TAPA's probe centroid is no θ_eff (docs/analysis-rules.md R59).
    let tapa = cfg.encoding.kind() == crate::model::Encoding::Tapa;
    let outcome =
        match super::runner::run_one(&cfg, meta, out, backend, &evals, &mut |p| match *p {
            Progress::Step {
                step,
                steps,
                train_loss,
            } if step % every == 0 || step == steps => {
                eprintln!("step {step}/{steps} train loss {train_loss:.4}");
            }
            Progress::Step { .. } => {}
            Progress::Eval {
                step,
                steps,
                loss,
                accuracy,
                effective_freq,
                answer_accuracy,
            } => {
                let answers = answer_accuracy
                    .map(|a| format!(", greedy answers {:.1} %", 100.0 * a))
                    .unwrap_or_default();
                let theta = if tapa {
                    String::new()
                } else {
                    format!(", θ_eff {effective_freq:.4} rad/token")
                };
                eprintln!(
                    "eval at step {step}/{steps}: held-out loss {loss:.4}, accuracy {accuracy:.4}\
                     {theta}{answers}"
                );
            }
        }) {
            Ok(o) => o,
            Err(e) if e.is_storage() => return Ok(RunOneExit::CannotWrite(format!("error: {e}"))),
            Err(e) => return Err(e),
        };
    let status = match &outcome.status {
        crate::train::RunStatus::Done => "done".to_string(),
        crate::train::RunStatus::Failed { step, reason } => {
            format!("failed at step {step} ({reason})")
        }
    };
    Ok(RunOneExit::Finished(format!(
        "{status} in {:.1} s ({:.1} ms/step)",
        outcome.wall_time_s, outcome.ms_per_step
    )))
}
