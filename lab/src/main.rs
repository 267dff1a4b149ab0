//! `lab` command line: parses, calls the library, prints. All logic lives in the `lab` library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use lab::config::RunConfig;
use lab::results::tables::RunMeta;
use lab::sweep::{self, Backend, SweepOptions};

/// A laboratory for the science of positional encodings in transformers.
///
/// Train small transformers with RoPE (or NoPE) on synthetic tasks of known dependency width,
/// measure which rotary frequencies they use, and fit the law θ* ∝ 1/W. Results are Parquet
/// tables under results/<sweep>/ (schemas in results/README.md).
#[derive(Parser)]
#[command(name = "lab", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a named sweep (sweeps/<NAME>.toml): train every run of the grid, write Parquet, fit the law.
    ///
    /// Finished runs are skipped, so re-running after a crash does only what is missing.
    #[command(
        after_help = "Examples:\n  lab sweep --list\n  lab sweep block-width --preset quick\n  lab sweep block-width --preset smoke --out /tmp/bw --jobs 2"
    )]
    Sweep {
        /// Sweep name (a file sweeps/<NAME>.toml) or a path to a sweep .toml file.
        #[arg(required_unless_present = "list")]
        name: Option<String>,
        /// List the available sweeps and their presets.
        #[arg(long)]
        list: bool,
        /// Preset: smoke (under 2 min), quick (≤ 20 min on 2 cores), full (GPU scale). Default: the file's default_preset.
        #[arg(long)]
        preset: Option<String>,
        /// Output folder [default: results/<NAME>].
        #[arg(long)]
        out: Option<PathBuf>,
        /// Runs at once (each a process; CPU threads are shared between them).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
        jobs: u16,
        /// Compute backend.
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
        /// Plain log lines instead of a progress bar.
        #[arg(long)]
        no_progress: bool,
    },
    /// Train one run from a config file and write its tables (used by `lab sweep` for each run).
    #[command(hide = true)]
    RunOne {
        /// Run config (JSON, as written by `lab sweep` into runs/<id>/config.json).
        #[arg(long)]
        config: PathBuf,
        /// Folder for the run's tables.
        #[arg(long)]
        out: PathBuf,
        /// Sweep name recorded in the tables.
        #[arg(long, default_value = "adhoc")]
        sweep: String,
        /// Preset name recorded in the tables.
        #[arg(long, default_value = "adhoc")]
        preset: String,
        /// Compute backend.
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Cmd::Sweep {
            name,
            list,
            preset,
            out,
            jobs,
            backend,
            no_progress,
        } => {
            let dir = sweep::sweeps_dir();
            if list {
                for n in sweep::list_sweeps(&dir) {
                    let spec = sweep::find_sweep(&n, &dir)?;
                    println!("{n}: {}", spec.description);
                    for (p, d) in spec.presets() {
                        let mark = if p == spec.default_preset {
                            " (default)"
                        } else {
                            ""
                        };
                        println!("    --preset {p}{mark}: {d}");
                    }
                }
                return Ok(ExitCode::SUCCESS);
            }
            let name = name.expect("clap requires a name without --list");
            let spec = sweep::find_sweep(&name, &dir)?;
            let preset = preset.unwrap_or_else(|| spec.default_preset.clone());
            let opts = SweepOptions {
                preset,
                out_dir: out.unwrap_or_else(|| PathBuf::from("results").join(&spec.name)),
                jobs: jobs as usize,
                backend,
                exe: std::env::current_exe().context("cannot find the lab executable")?,
                progress: !no_progress && std::io::IsTerminal::is_terminal(&std::io::stderr()),
            };
            let report = sweep::run_sweep(&spec, &opts)?;
            println!("\n{}", report.summary);
            println!(
                "{} runs ({} run now, {} already finished, {} failed) in {:.1} min; tables in {}",
                report.planned,
                report.ran,
                report.skipped,
                report.failed,
                report.wall_time_s / 60.0,
                opts.out_dir.display()
            );
            Ok(if report.failed > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        Cmd::RunOne {
            config,
            out,
            sweep: sweep_name,
            preset,
            backend,
        } => {
            let text = std::fs::read_to_string(&config)
                .with_context(|| format!("cannot read {}", config.display()))?;
            let cfg: RunConfig = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a run config", config.display()))?;
            if let Err(e) = cfg.validate() {
                bail!("{}: {e}", config.display());
            }
            let meta = RunMeta {
                sweep: sweep_name,
                preset,
                backend: backend.name().to_string(),
            };
            let every = (cfg.steps / 20).max(1);
            let outcome =
                sweep::runner::run_one(&cfg, &meta, &out, backend, &mut |step, steps, loss| {
                    if step % every == 0 || step == steps {
                        eprintln!("step {step}/{steps} train loss {loss:.4}");
                    }
                })?;
            eprintln!(
                "{:?} in {:.1} s ({:.1} ms/step)",
                outcome.status, outcome.wall_time_s, outcome.ms_per_step
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
