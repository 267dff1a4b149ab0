//! `lab` command line: parses ([`cli`]), calls the library, prints. All logic lives in the `lab`
//! library.

mod cli;

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use cli::*;
use lab::results::tables::RunMeta;
use lab::sweep::commands::{self as cmds, RunOneExit};
use lab::sweep::{self, SweepOptions};

fn main() -> ExitCode {
    cli::init_process();
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(line) => {
            eprintln!("error: {line}");
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", cli::error_line(&e));
            ExitCode::from(2)
        }
    }
}

fn ok(success: bool) -> ExitCode {
    if success {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
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
            cluster,
        } => {
            let dir = sweep::sweeps_dir();
            if list {
                // A closed pipe (`| head`) is not an error.
                let _ = write!(std::io::stdout(), "{}", cmds::list_text(&dir)?);
                return Ok(ExitCode::SUCCESS);
            }
            let name = name.expect("clap requires a name without --list");
            let mi_path = cmds::sweep_path(&name, &dir);
            if lab::mi::is_mi_sweep(&mi_path) {
                let given = cluster.training_only_options(jobs.is_some(), backend);
                lab::mi::check_mi_sweep_options(&name, &given)?;
                let (text, success) = lab::mi::run_mi_sweep_file(&mi_path, preset, out)?;
                println!("{text}");
                return Ok(ok(success));
            }
            let mut spec = sweep::find_sweep(&name, &dir)?;
            spec.set(&cluster.set)?;
            let preset = preset.unwrap_or_else(|| spec.default_preset.clone());
            spec.check_sets_take_effect(&preset, jobs.is_some())?;
            let jobs = jobs.map(usize::from).or_else(|| spec.preset_jobs(&preset));
            let out_dir = out.unwrap_or_else(|| sweep::spec::default_results_dir(&spec.name));
            let opts = SweepOptions {
                preset,
                out_dir,
                jobs: jobs.unwrap_or(1),
                backend,
                exe: std::env::current_exe()
                    .map_err(|e| anyhow::anyhow!("cannot find the lab executable: {e}"))?,
                progress: !no_progress && std::io::IsTerminal::is_terminal(&std::io::stderr()),
                shard: cluster.shard,
                retry_failed: cluster.retry_failed,
            };
            if cluster.dry_run {
                println!("{}", cmds::dry_run_text(&spec, &opts)?);
                return Ok(ExitCode::SUCCESS);
            }
            if let Some(file) = &cluster.emit_slurm {
                let slurm = cluster.slurm_options(opts.jobs, opts.backend);
                eprintln!("{}", cmds::emit_slurm(&spec, &opts, file, &slurm)?);
                return Ok(ExitCode::SUCCESS);
            }
            if !cluster.yes {
                cmds::confirm_size(&spec, &opts)?;
            }
            let report = sweep::run_sweep(&spec, &opts)?;
            println!("\n{}", report.summary);
            println!("{}", report.closing_lines(&opts.out_dir));
            Ok(ok(report.failed == 0
                && report.interrupted == 0
                && !report.stopped_by_signal))
        }
        Cmd::Plot {
            sweep: name,
            results,
            out,
        } => {
            let results = results.unwrap_or_else(|| sweep::spec::default_results_dir(&name));
            let out = out.unwrap_or_else(|| results.join("figures"));
            let figures = lab::plot::plot_sweep(&name, &results, &out)?;
            eprintln!("{}", lab::paths::where_line(None, &results));
            for f in figures {
                println!("{}", f.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Report {
            sweep: name,
            results,
            out,
        } => {
            let results = results.unwrap_or_else(|| sweep::spec::default_results_dir(&name));
            let out = out.unwrap_or_else(|| results.join("report.html"));
            let w = lab::report::write_report(&name, &results, &out, &sweep::sweeps_dir())?;
            eprintln!("{}", lab::paths::where_line(None, &results));
            println!("{}", w.text());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Compare { a, b } => {
            println!("{}", lab::compare::compare_text(&a, &b)?);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench { command } => {
            println!("{}", command.run()?);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Selfcheck { backend, layouts } => {
            if layouts.is_some() && backend == lab::sweep::Backend::Cpu {
                anyhow::bail!(
                    "--layouts: the kernel layouts are CubeCL's, for --backend wgpu or cuda"
                );
            }
            let layouts: Option<Vec<&str>> = layouts
                .as_ref()
                .map(|l| l.iter().map(String::as_str).collect());
            let report = lab::selfcheck::run(backend, layouts.as_deref())?;
            println!("{}", report.text());
            Ok(ok(report.passed()))
        }
        Cmd::Status {
            name,
            preset,
            set,
            out,
            shard,
        } => {
            let text = cmds::status_text(&name, &sweep::sweeps_dir(), preset, &set, out, shard)?;
            // A closed pipe (`| head`) is not an error.
            let _ = writeln!(std::io::stdout(), "{text}");
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Merge { dirs, out } => {
            let r = sweep::status::merge_dirs(&dirs, &out)?;
            println!("\n{}", r.summary);
            println!("{}", r.closing_line(dirs.len(), &out));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Gen {
            task,
            params,
            n,
            seed,
            split,
        } => {
            let split = match split {
                SplitArg::Train => lab::tasks::Split::Train,
                SplitArg::Eval => lab::tasks::Split::Eval,
                SplitArg::Val => lab::tasks::Split::Val,
            };
            for line in lab::generate::gen_lines(&task, &params, n as usize, seed, split)? {
                println!("{line}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Rope { command } => {
            println!("{}", command.run()?);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Eval {
            checkpoint,
            seq_len,
            scaling,
            overrides,
            ablate_pairs,
            backend,
        } => {
            let scaling = scaling.to_scaling(0)?;
            let req = lab::eval::EvalRequest::adhoc(seq_len, scaling, overrides, ablate_pairs);
            let out = lab::eval::eval_checkpoint(&checkpoint, &req, &backend.device()?)?;
            println!("{}", out.json(&req));
            Ok(ExitCode::SUCCESS)
        }
        Cmd::NeedleAttention {
            checkpoint,
            seq_len,
            n,
        } => {
            for line in lab::needle::needle_attention_command(&checkpoint, seq_len, n)? {
                println!("{line}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Mi(args) => {
            let (req, dir) = args.request()?;
            let (summary, output) = lab::mi::profile_command(&req, dir.as_deref())?;
            eprint!("{summary}");
            print!("{output}");
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Recommend(args) => {
            print!("{}", args.run()?);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Data {
            command:
                DataCmd::Fetch {
                    corpus,
                    data_dir,
                    force,
                },
        } => {
            let names: Vec<String> = if corpus.is_empty() {
                let all = lab::tasks::corpus::CORPORA.iter();
                all.map(|c| c.name.to_string()).collect()
            } else {
                corpus
            };
            let data_dir = data_dir.unwrap_or_else(lab::paths::data_dir);
            for n in &names {
                println!("{}", lab::tasks::corpus::fetch(&data_dir, n, force)?);
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::RunOne {
            config,
            out,
            sweep: sweep_name,
            preset,
            backend,
            evals,
        } => {
            let meta = RunMeta {
                sweep: sweep_name,
                preset,
                backend: backend.name().to_string(),
            };
            match cmds::run_one_files(&config, &out, &meta, backend, evals.as_deref())? {
                RunOneExit::Finished(line) => {
                    eprintln!("{line}");
                    Ok(ExitCode::SUCCESS)
                }
                // The sweep tells a storage failure from a failed run by this exit code.
                RunOneExit::CannotWrite(line) => {
                    eprintln!("{line}");
                    Ok(ExitCode::from(sweep::runner::EXIT_CANNOT_WRITE))
                }
            }
        }
    }
}
