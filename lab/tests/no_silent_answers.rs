//! No silent wrong answers (issue 51): a folder's tables describe one plan, a flag with no
//! effect is refused, a value that would overflow is refused, `lab status` reads the plan that
//! ran, the lab root resolves sweeps and results together, and large or long work says so.
//! Each test failed on the lab before the fix (518b1d9), as its doc says.

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// A tiny plan of block-width (RoPE copy, 3 steps each: seconds); the tests add the widths,
/// the seeds and (once) the encoding.
const TINY: &[&str] = &[
    "--preset",
    "smoke",
    "--no-progress",
    "--set",
    "steps=3",
    "--set",
    "warmup_steps=0",
    "--set",
    "eval_every=3",
    "--set",
    "variant=copy",
];

fn sweep(out: &Path, extra: &[&str]) -> (String, String) {
    let o = lab()
        .args(["sweep", "block-width"])
        .args(TINY)
        .args(extra)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

/// `lab ARGS`: (exit code, stdout, stderr).
fn lab_out(args: &[&str]) -> (Option<i32>, String, String) {
    let o = lab().args(args).output().unwrap();
    let (a, b) = text(&o);
    (o.status.code(), a, b)
}

/// The one `error:` line of a refused command (exit 2).
fn refused(args: &[&str]) -> String {
    let (code, stdout, stderr) = lab_out(args);
    assert_eq!(code, Some(2), "lab {args:?}: {stdout}\n{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    stderr.trim_end().to_string()
}

fn runs_rows(dir: &Path) -> usize {
    run_ids(dir).len()
}

/// Item 2. Before: the second sweep's folder tables held 40 runs labelled with one preset, the
/// fit the last 20, `lab compare` averaged all 40. Now: the tables, `plan.json`, `lab status`
/// and `lab merge` describe the second plan, and the summary names the runs left out.
#[test]
fn a_folder_describes_one_plan() {
    let out = tmp("one-plan");
    let two = ["--set", "encoding=rope", "--set", "seed=[0,1]"];
    sweep(&out, &[&two[..], &["--set", "block_len=[4,16]"]].concat());
    assert_eq!(runs_rows(&out), 4);
    let (second, log) = sweep(&out, &[&two[..], &["--set", "block_len=[8,32]"]].concat());
    assert_eq!(runs_rows(&out), 4, "the tables hold the second plan only");
    assert!(
        second.contains("holds 4 more finished run(s) of other plans"),
        "{second}"
    );
    assert!(
        log.contains("4 finished run(s) in this folder belong to other plans (the last one here: preset smoke"),
        "{log}"
    );
    let plan = lab::results::plan::read(&out).unwrap();
    assert_eq!(plan.preset, "smoke");
    assert!(plan.sets.contains(&"block_len=[8,32]".to_string()));
    assert_eq!(plan.run_ids.len(), 4);
    let mut ids = run_ids(&out);
    ids.sort();
    let mut planned = plan.run_ids.clone();
    planned.sort();
    assert_eq!(ids, planned);
    // The fit and `lab compare` see the same 4 runs.
    let (_, b) = lab::results::read_parquet(&out.join("fit.parquet")).unwrap();
    let n: Vec<Option<i64>> = b
        .iter()
        .flat_map(|b| lab::results::column::ints(b, "n"))
        .collect();
    assert!(n.iter().all(|n| n.is_some_and(|n| n <= 4)), "{n:?}");
    // `lab status` with no --preset/--set reads the recorded plan (item 7).
    let (code, status, _) = lab_out(&["status", "block-width", "--out", out.to_str().unwrap()]);
    assert_eq!(code, Some(0));
    assert!(
        status.contains("4 runs: 4 done, 0 running, 0 failed, 0 missing"),
        "{status}"
    );
    assert!(status.contains("the plan the folder records"), "{status}");
    assert!(status.contains("4 more finished run(s)"), "{status}");
    // `lab merge` of the folder keeps its plan.
    let merged = tmp("one-plan-merged");
    let (code, m, e) = lab_out(&[
        "merge",
        out.to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{m}\n{e}");
    assert_eq!(runs_rows(&merged), 4);
    assert!(m.contains("1 other plan(s)"), "{m}");
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&merged);
}

/// Item 7. Before: `lab status` took no `--set` and reported a finished overridden sweep as
/// 0 done, 20 missing.
#[test]
fn status_takes_the_overrides_of_the_sweep() {
    let out = tmp("status-set");
    let extra = [
        "--set",
        "encoding=rope",
        "--set",
        "seed=[0,1]",
        "--set",
        "block_len=[4,16]",
    ];
    sweep(&out, &extra);
    let o = out.to_str().unwrap();
    let mut args = vec!["status", "block-width", "--out", o];
    args.extend_from_slice(&TINY[..2]);
    args.extend_from_slice(&TINY[3..]);
    args.extend(extra);
    let (code, status, err) = lab_out(&args);
    assert_eq!(code, Some(0), "{err}");
    assert!(status.contains("4 runs: 4 done"), "{status}");
    // Without the overrides, but naming the preset: the preset's own plan, none of it done.
    let (_, status, _) = lab_out(&["status", "block-width", "--out", o, "--preset", "smoke"]);
    assert!(status.contains("20 runs: 0 done"), "{status}");
    assert!(status.contains("4 more finished run(s)"), "{status}");
    let _ = std::fs::remove_dir_all(&out);
}

/// Item 3. Before, each of these ran (or recorded) as if the flag had applied.
#[test]
fn flags_without_effect_are_refused() {
    let out = tmp("no-effect");
    sweep(
        &out,
        &[
            "--set",
            "encoding=rope",
            "--set",
            "block_len=4",
            "--set",
            "seed=0",
        ],
    );
    let run = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .next()
        .unwrap();
    let run = run.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["eval", run, "--seq-len", "64", "--factor", "2"],
            "error: --factor 2 has no effect with --scaling none (the default)",
        ),
        (
            &["eval", run, "--seq-len", "64", "--beta-fast", "16"],
            "error: --beta-fast 16 has no effect with --scaling none",
        ),
        (
            &[
                "eval",
                run,
                "--seq-len",
                "64",
                "--scaling",
                "linear",
                "--beta-fast",
                "16",
            ],
            "error: --beta-fast 16 has no effect with --scaling linear: only --scaling yarn reads it",
        ),
        (
            &["rope", "freqs", "--head-dim", "8", "--factor", "2"],
            "error: --factor 2 has no effect with --scaling none",
        ),
        (
            &["rope", "freqs", "--head-dim", "8", "--seq-len", "4096"],
            "error: --seq-len 4096 has no effect with --scaling none",
        ),
        (
            &["sweep", "block-width", "--slurm-time", "01:00:00"],
            "--emit-slurm",
        ),
        (
            &[
                "sweep",
                "block-width",
                "--emit-slurm",
                "/tmp/x.sh",
                "--shard",
                "1/2",
            ],
            "'--emit-slurm <FILE>' cannot be used with '--shard <I/N>'",
        ),
        (
            &[
                "sweep",
                "block-width",
                "--preset",
                "smoke",
                "--set",
                "base.steps=5",
                "--dry-run",
            ],
            "error: --set base.steps=5 has no effect: preset smoke sets steps itself",
        ),
        (
            &[
                "sweep",
                "block-width",
                "--preset",
                "smoke",
                "--set",
                "presets.quick.base.steps=5",
                "--dry-run",
            ],
            "error: --set presets.quick.base.steps=5 has no effect: it changes preset quick, but this sweep runs preset smoke",
        ),
        (
            &[
                "sweep",
                "block-width",
                "--preset",
                "smoke",
                "--set",
                "grid.block_len=[8]",
                "--dry-run",
            ],
            "error: --set grid.block_len=[8] has no effect: preset smoke has its own axis block_len",
        ),
        (
            &[
                "sweep",
                "block-width",
                "--preset",
                "smoke",
                "--set",
                "steps=5",
                "--set",
                "steps=6",
                "--dry-run",
            ],
            "error: --set steps=5 has no effect: a later --set steps=… replaces it",
        ),
        (
            &[
                "sweep",
                "block-width",
                "--preset",
                "smoke",
                "--set",
                "presets.smoke.jobs=2",
                "--jobs",
                "1",
                "--dry-run",
            ],
            "error: --set presets.smoke.jobs=2 has no effect: --jobs replaces it",
        ),
    ];
    for (args, expected) in cases {
        let line = refused(args);
        assert!(
            line.contains(expected),
            "lab {args:?}:\n{line}\nexpected: {expected}"
        );
    }
    // Item 4 on a run: an out-of-range value is named once, as typed (the message is the whole
    // line: before, `lab eval` repeated it under the field's name).
    assert_eq!(
        refused(&[
            "eval",
            run,
            "--seq-len",
            "64",
            "--scaling",
            "ntk",
            "--factor",
            "1e308"
        ]),
        "error: --factor 1e308 is out of range: must be a number in (0, 65536]"
    );
    // What does take effect still runs: the preset's own key, and a plain override.
    for set in ["presets.smoke.base.steps=5", "steps=5"] {
        let (code, _, err) = lab_out(&[
            "sweep",
            "block-width",
            "--preset",
            "smoke",
            "--set",
            set,
            "--dry-run",
        ]);
        assert_eq!(code, Some(0), "{set}: {err}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// Item 3: a NoPE (or PoPE) run has no rotary frequencies to scale. Before, `lab eval` recorded
/// `scaling = linear, factor = 2` for it.
#[test]
fn a_scaling_of_a_run_without_rope_is_refused() {
    let out = tmp("nope-scaling");
    let o = lab()
        .args(["sweep", "block-width"])
        .args(TINY)
        .args([
            "--set",
            "encoding=nope",
            "--set",
            "block_len=4",
            "--set",
            "seed=0",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{:?}", text(&o));
    let run = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let evals = || files(&run.join("evals")).len();
    let before = evals();
    let line = refused(&[
        "eval",
        run.to_str().unwrap(),
        "--seq-len",
        "128",
        "--scaling",
        "linear",
        "--factor",
        "2",
    ]);
    assert!(
        line.starts_with("error: --scaling linear has no effect on this run: its encoding is nope"),
        "{line}"
    );
    assert_eq!(evals(), before, "no evaluation was recorded");
    let _ = std::fs::remove_dir_all(&out);
}

/// Item 4. Before: `--factor 1e308` with NTK gave inv_freq = [1, 0, 0, 0]; `--beta-fast inf`
/// was taken; `--slurm-time banana` was written into `#SBATCH`.
#[test]
fn values_that_would_overflow_are_refused() {
    for (args, expected) in [
        (
            vec![
                "rope",
                "freqs",
                "--head-dim",
                "8",
                "--scaling",
                "ntk",
                "--factor",
                "1e308",
            ],
            "error: --factor 1e308 is out of range: must be a number in (0, 65536]",
        ),
        (
            vec![
                "rope",
                "freqs",
                "--head-dim",
                "8",
                "--scaling",
                "yarn",
                "--beta-fast",
                "inf",
            ],
            "error: --beta-fast inf is out of range",
        ),
        (
            vec!["rope", "freqs", "--head-dim", "8", "--base", "1e300"],
            "error: --base 1e300 is out of range: must be a number in (1, 1e12]",
        ),
        (
            vec![
                "sweep",
                "block-width",
                "--emit-slurm",
                "/tmp/lab-x.sh",
                "--slurm-time",
                "banana",
            ],
            "`banana` is not a Slurm time limit",
        ),
        (
            vec![
                "sweep",
                "block-width",
                "--emit-slurm",
                "/tmp/lab-x.sh",
                "--slurm-mem",
                "lots",
            ],
            "`lots` is not a Slurm memory size",
        ),
    ] {
        let line = refused(&args);
        assert!(line.contains(expected), "lab {args:?}:\n{line}");
    }
    assert!(!Path::new("/tmp/lab-x.sh").exists());
}

/// Item 8. Before: run from a folder without `./sweeps`, the binary read the sweep files of its
/// source tree but wrote results into the working directory (`cd lab/docs && lab status
/// block-width`: "34 missing" for a finished sweep). Now both resolve from the lab root, and
/// the commands say which they use.
#[test]
fn sweeps_and_results_resolve_from_one_root() {
    let inside = repo_root().join("lab").join("src");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_lab"))
        .env_remove("LAB_SWEEPS_DIR")
        .env_remove("LAB_DATA_DIR")
        .current_dir(&inside)
        .args(["sweep", "block-width", "--preset", "smoke", "--dry-run"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    let root = repo_root().canonicalize().unwrap();
    let first = stdout.lines().next().unwrap();
    assert_eq!(
        first,
        format!(
            "sweep file: {} · results: {}",
            root.join("sweeps/block-width.toml").display(),
            root.join("results/block-width").display()
        )
    );
    // A project folder with its own sweeps/: its sweep files and its results.
    let project = tmp("own-root");
    std::fs::create_dir_all(project.join("sweeps")).unwrap();
    std::fs::copy(
        repo_root().join("sweeps/block-width.toml"),
        project.join("sweeps/mine.toml"),
    )
    .unwrap();
    let deep = project.join("notes").join("today");
    std::fs::create_dir_all(&deep).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_lab"))
        .env_remove("LAB_SWEEPS_DIR")
        .current_dir(&deep)
        .args(["status", "mine", "--preset", "smoke"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    let p = project.canonicalize().unwrap();
    assert!(
        stdout.starts_with(&format!(
            "sweep file: {} · results: {}",
            p.join("sweeps/mine.toml").display(),
            p.join("results/mine").display()
        )),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&project);
}

/// Item 9. Before: a 100,000-run grid started at once. Now above 1000 runs to train (or 24 h by
/// the estimate) a non-interactive `lab sweep` is refused unless `--yes` is given; the dry run
/// still shows it.
#[test]
fn a_large_sweep_asks_first() {
    let out = tmp("large");
    let seeds = format!(
        "seed=[{}]",
        (0..1001)
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let o = out.to_str().unwrap();
    let args = [
        "sweep",
        "block-width",
        "--preset",
        "smoke",
        "--set",
        "encoding=rope",
        "--set",
        "variant=copy",
        "--set",
        "block_len=4",
        "--set",
        &seeds,
        "--out",
        o,
    ];
    let line = refused(&args);
    assert!(
        line.starts_with("error: this sweep is large: 1001 runs to train")
            && line.contains("add --yes"),
        "{line}"
    );
    assert!(!out.exists(), "nothing started");
    let mut dry = args.to_vec();
    dry.push("--dry-run");
    let (code, text, _) = lab_out(&dry);
    assert_eq!(code, Some(0));
    assert!(text.contains("1001 runs: 0 done"), "{text}");
}

/// Item 9: a long evaluation reports its progress (here every forward pass:
/// `LAB_PROGRESS_EVERY_S=0`), in chunks of at most 2^15 tokens.
#[test]
fn a_long_evaluation_reports_progress() {
    let out = tmp("progress");
    sweep(
        &out,
        &[
            "--set",
            "encoding=rope",
            "--set",
            "block_len=4",
            "--set",
            "seed=0",
        ],
    );
    let run: PathBuf = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let o = lab()
        .env("LAB_PROGRESS_EVERY_S", "0")
        .args(["eval", run.to_str().unwrap(), "--seq-len", "8192"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    // smoke: eval_batches 2 × batch_size 8 = 16 examples, 4 per pass at 8192 tokens.
    for done in [4, 8, 12, 16] {
        assert!(
            stderr.contains(&format!("eval at seq_len 8192: {done}/16 examples")),
            "{stderr}"
        );
    }
    assert!(stdout.contains("\"seq_len\":8192"), "{stdout}");
    let _ = std::fs::remove_dir_all(&out);
}
