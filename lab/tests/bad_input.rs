//! Bad input to `lab sweep` (issue 8): each case gives one clear `error:` line, exit code 2,
//! and leaves the output folder as it was (not created, or its results intact).

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// block-width.toml with `from` replaced by `to`, written to `dir/name`.
fn edited_sweep(dir: &Path, name: &str, from: &str, to: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let text = std::fs::read_to_string(repo_root().join("sweeps/block-width.toml")).unwrap();
    assert!(text.contains(from), "block-width.toml has no `{from}`");
    let path = dir.join(name);
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    path
}

/// Line (1-based) of block-width.toml holding `needle`.
fn line_of(needle: &str) -> usize {
    let text = std::fs::read_to_string(repo_root().join("sweeps/block-width.toml")).unwrap();
    text.lines().position(|l| l.contains(needle)).unwrap() + 1
}

/// Run `lab sweep FILE --preset P --out OUT`, expect exit 2 and exactly one stderr line;
/// returns it. OUT must not be created.
fn one_line_error(file: &Path, preset: &str, out: &Path) -> String {
    one_line_error_with(file, preset, out, &[])
}

/// [`one_line_error`] with `extra` arguments after the others.
fn one_line_error_with(file: &Path, preset: &str, out: &Path, extra: &[&str]) -> String {
    let o = lab()
        .arg("sweep")
        .arg(file)
        .args(["--preset", preset, "--no-progress", "--out"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{stdout}\n{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(!out.exists(), "the output folder was created");
    eprintln!("{}", stderr.trim_end());
    stderr.trim_end().to_string()
}

#[test]
fn malformed_toml_reports_file_line_and_column() {
    let dir = tmp("syntax");
    // An unclosed array: the parser notices at the start of the next line.
    let f = edited_sweep(
        &dir,
        "bad.toml",
        "block_len = [4, 8, 16, 32, 64]",
        "block_len = [4, 8, 16, 32, 64",
    );
    let line = line_of("block_len = [4, 8, 16, 32, 64]") + 1;
    let err = one_line_error(&f, "smoke", &dir.join("out"));
    assert_eq!(
        err,
        format!(
            "error: {}:{line}:1: missing comma between array elements, expected `,`",
            f.display()
        )
    );
    // A key given twice.
    let f = edited_sweep(
        &dir,
        "bad2.toml",
        "steps = 300\n",
        "steps = 300\nsteps = 20\n",
    );
    let line = line_of("steps = 300") + 1;
    let err = one_line_error(&f, "smoke", &dir.join("out"));
    assert_eq!(
        err,
        format!("error: {}:{line}:1: duplicate key", f.display())
    );
}

#[test]
fn unknown_key_suggests_the_closest_valid_key() {
    let dir = tmp("unknown-key");
    let f = edited_sweep(&dir, "bad.toml", "block_len = 8\n", "blok_len = 8\n");
    let err = one_line_error(&f, "smoke", &dir.join("out"));
    assert_eq!(
        err,
        format!(
            "error: {}: unknown key `blok_len` in [base]; did you mean `block_len`?",
            f.display()
        )
    );
    // A misspelt section.
    let f = edited_sweep(&dir, "bad2.toml", "[grid]", "[gird]");
    let line = line_of("[grid]");
    let err = one_line_error(&f, "smoke", &dir.join("out"));
    assert_eq!(
        err,
        format!(
            "error: {}:{line}:2: unknown field `gird`, expected one of `description`, `claim`, `default_preset`, `base`, `grid`, `arms`, `presets`, `evals`, `select`; did you mean `grid`?",
            f.display()
        )
    );
    // A misspelt value (of a field no preset overrides).
    let f = edited_sweep(
        &dir,
        "bad3.toml",
        "pair_layout = \"adjacent\"",
        "pair_layout = \"adjacnt\"",
    );
    let err = one_line_error(&f, "smoke", &dir.join("out"));
    assert_eq!(
        err,
        format!(
            "error: {}: preset smoke, block_len = 4, variant = copy, encoding = rope, seed = 0: pair_layout: unknown variant `adjacnt`, expected `adjacent` or `rotate-half`; did you mean `adjacent`?",
            f.display()
        )
    );
}

#[test]
fn out_of_range_values_name_the_field_and_range() {
    let dir = tmp("range");
    let f = edited_sweep(&dir, "bad.toml", "noise = 0.0", "noise = 1.5");
    let err = one_line_error(&f, "smoke", &dir.join("out"));
    assert_eq!(
        err,
        format!(
            "error: {}: preset smoke, block_len = 4, variant = copy, encoding = rope, seed = 0: noise = 1.5 is out of range: must be in 0.0..=1.0",
            f.display()
        )
    );
    let f = edited_sweep(&dir, "bad2.toml", "lr = 0.003", "lr = -0.003");
    let err = one_line_error(&f, "smoke", &dir.join("out"));
    assert!(
        err.ends_with("lr = -0.003 is out of range: must be in (0, 10]"),
        "{err}"
    );
}

#[test]
fn empty_grid_is_an_error() {
    let dir = tmp("empty");
    let f = edited_sweep(
        &dir,
        "bad.toml",
        "grid = { block_len = [4, 16] }",
        "grid = { block_len = [] }",
    );
    let err = one_line_error(&f, "smoke", &dir.join("out"));
    assert_eq!(
        err,
        format!(
            "error: {}: preset `smoke` has an empty grid (an axis with no values)",
            f.display()
        )
    );
}

#[test]
fn unwritable_output_folder() {
    let dir = tmp("unwritable");
    std::fs::create_dir_all(&dir).unwrap();
    // A path through a regular file.
    std::fs::write(dir.join("file"), b"x").unwrap();
    let out = dir.join("file").join("out");
    let o = smoke(&out, &[]);
    let (_, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: cannot create the output folder {}: Not a directory (os error 20)",
            out.display()
        )
    );
    assert_eq!(std::fs::read(dir.join("file")).unwrap(), b"x");
    // A read-only file system (root ignores permission bits, so a read-only mount).
    let ro = dir.join("ro");
    std::fs::create_dir_all(&ro).unwrap();
    let Some(_mount) = Mount::tmpfs(&ro, "size=1m,ro") else {
        eprintln!("skipped the read-only case: cannot mount a tmpfs here");
        return;
    };
    let out = ro.join("out");
    let o = smoke(&out, &[]);
    let (_, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: cannot create the output folder {}: Read-only file system (os error 30)",
            out.display()
        )
    );
    eprintln!("{}", stderr.trim_end());
}

/// A tmpfs mounted for a test, unmounted on drop.
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(at: &Path, options: &str) -> Option<Mount> {
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(at)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Mount(at.to_path_buf()))
    }

    fn remount(&self, options: &str) {
        let s = std::process::Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(s.success());
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// The disk fills up in the middle of a sweep (a 512 KiB tmpfs): the sweep stops with one
/// error line naming the run and the cause, records nothing as failed, leaves every Parquet
/// file readable; with space again the same command finishes, equal to an uninterrupted sweep.
#[test]
fn full_disk_mid_sweep() {
    let dir = tmp("full");
    std::fs::create_dir_all(&dir).unwrap();
    let Some(mount) = Mount::tmpfs(&dir, "size=512k") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let out = dir.join("out");
    let o = smoke(&out, &[]);
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{stdout}\n{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert_eq!(stderr.lines().last(), Some(errors[0]));
    assert!(
        errors[0].contains("No space left on device"),
        "{}",
        errors[0]
    );
    eprintln!("{}", errors[0]);
    let finished = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("runs.parquet").is_file())
        .count();
    assert!(finished > 0 && finished < 20, "{finished} runs finished");
    check_all_parquet(&out);
    // Nothing recorded as failed because of the disk.
    let status = lab()
        .args(["status", "block-width", "--preset", "smoke", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let (s, _) = text(&status);
    assert!(
        s.contains(&format!(
            "20 runs: {finished} done, 0 running, 0 failed, {} missing",
            20 - finished
        )),
        "{s}"
    );
    mount.remount("size=64m");
    let o = smoke(&out, &[]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!(
            "20 runs ({} run now, {finished} already finished, 0 failed)",
            20 - finished
        )),
        "{stdout}"
    );
    assert_eq!(temporaries(&out), Vec::<PathBuf>::new());
    assert_same_results(reference(), &out);
    drop(mount);
}

#[test]
fn missing_data_corpus_is_one_line_before_any_run() {
    let dir = tmp("no-corpus");
    let empty = dir.join("empty-data");
    std::fs::create_dir_all(&empty).unwrap();
    let out = dir.join("out");
    let o = lab()
        .env("LAB_DATA_DIR", &empty)
        .args([
            "sweep",
            "real-sequences",
            "--preset",
            "smoke",
            "--no-progress",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{stdout}\n{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("corpus"), "{stderr}");
    assert!(stderr.contains("make data"), "{stderr}");
    assert!(!out.join("runs").exists(), "a run was started: {stderr}");
    eprintln!("{}", stderr.trim_end());
}

#[test]
fn training_only_options_are_refused_for_an_mi_sweep() {
    let out = tmp("mi-options").join("out");
    for (args, opt) in [
        (&["--shard", "1/2"][..], "--shard"),
        (&["--jobs", "2"][..], "--jobs"),
        (&["--retry-failed"][..], "--retry-failed"),
    ] {
        let line = one_line_error_with(Path::new("mi-profiles"), "smoke", &out, args);
        assert!(
            line.starts_with(&format!(
                "error: {opt} does not apply to mi-profiles: it is an MI sweep"
            )),
            "{line}"
        );
    }
}

/// `lab rope freqs`: a negative factor reaches the range check (not clap's "unexpected
/// argument"), and `--seq-len` is `--scaling-seq-len` under the name the issue gave it.
#[test]
fn rope_freqs_negative_factor_and_seq_len_alias() {
    let o = lab()
        .args([
            "rope",
            "freqs",
            "--head-dim",
            "8",
            "--scaling",
            "linear",
            "--factor",
            "-2",
        ])
        .output()
        .unwrap();
    let (_, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr.trim_end(),
        "error: --factor -2 is out of range: must be a number in (0, 65536]"
    );
    let freqs = |flag: &str| {
        let o = lab()
            .args(["rope", "freqs", "--head-dim", "8", "--scaling", "dynamic"])
            .args(["--factor", "2", "--original-max-len", "2048", flag, "8192"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o).1);
        text(&o).0
    };
    let (a, b) = (freqs("--seq-len"), freqs("--scaling-seq-len"));
    assert_eq!(a, b);
    // Dynamic NTK at L = 4·L₀ with s = 2 changes the base, so θ_1 differs from plain RoPE's 0.1.
    assert!(!a.contains("\"inv_freq\":[1.0,0.1,"), "{a}");
    let help = text(&lab().arg("--help").output().unwrap()).0;
    assert!(help.contains("PoPE, TAPA, p-RoPE"), "{help}");
    assert!(!help.contains("RoPE (or NoPE)"), "{help}");
}

/// A value of the wrong type names its field (issue 16), in a sweep file as on `lab gen`.
#[test]
fn type_errors_name_the_field() {
    let dir = tmp("types");
    let f = edited_sweep(&dir, "steps.toml", "steps = 300\n", "steps = \"four\"\n");
    let err = one_line_error(&f, "fixed300", &dir.join("out"));
    assert!(
        err.ends_with("steps: invalid type: string \"four\", expected usize"),
        "{err}"
    );
    let o = lab()
        .args(["gen", "block", "--param", "noise=lots", "--n", "1"])
        .output()
        .unwrap();
    let (_, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr.trim_end(),
        "error: --param noise: invalid type: string \"lots\", expected f64"
    );
}

/// An `[[evals]]` length beyond a run's bound, or a `set` of a field an evaluation cannot
/// change, is refused when the sweep is planned, before anything trains (issue 16).
#[test]
fn evals_are_checked_at_plan_time() {
    let dir = tmp("evals-plan");
    let f = edited_sweep(
        &dir,
        "long.toml",
        "length_factors = [1]",
        "length_factors = [1, 1000000]",
    );
    let err = one_line_error(&f, "fixed300", &dir.join("out"));
    assert!(
        err.ends_with(
            "[[evals]] `ablation`: length factor 1000000 gives seq_len = 128000000 for this run; must be in 1..=512 (seq_len·s ≤ 65536)"
        ),
        "{err}"
    );
    let f = edited_sweep(
        &dir,
        "set.toml",
        "ablate = [\"law\", \"far\"]",
        "ablate = [\"law\", \"far\"]\nset = { d_model = 32 }",
    );
    let err = one_line_error(&f, "fixed300", &dir.join("out"));
    assert!(
        err.contains("[[evals]] `ablation`: `d_model` cannot change at evaluation"),
        "{err}"
    );
}

/// A task has its own parameters (issue 15): a parameter of another task in a sweep file, or in
/// an `[[evals]]` entry that applies to the run, is refused by name before anything trains.
#[test]
fn another_tasks_parameter_is_refused_by_name() {
    let dir = tmp("task-params");
    let f = edited_sweep(&dir, "ops.toml", "noise = 0.0", "noise = 0.0\nops = 3");
    let err = one_line_error(&f, "fixed300", &dir.join("out"));
    assert!(
        err.ends_with(
            "ops: a parameter of task igsm, not of this run's task block; remove it, or set it only for runs with task = \"igsm\" (in their [[arms]])"
        ),
        "{err}"
    );
    let f = edited_sweep(
        &dir,
        "evals-ops.toml",
        "ablate = [\"law\", \"far\"]",
        "ablate = [\"law\", \"far\"]\nset = { ops = 3 }",
    );
    let err = one_line_error(&f, "fixed300", &dir.join("out"));
    assert!(
        err.ends_with(
            "[[evals]] `ablation`: `ops` is a parameter of task igsm, not of this run's task block; restrict the entry with tasks = [\"igsm\"]"
        ),
        "{err}"
    );
    assert!(!dir.join("out").exists());
}

/// `lab eval --set` refuses what the trained model fixes, by name, instead of recording an
/// evaluation as if the change had been applied (issue 16).
#[test]
fn eval_set_refuses_fields_the_model_fixes() {
    let text = std::fs::read_to_string(repo_root().join("sweeps/block-width.toml")).unwrap();
    let spec =
        lab::sweep::SweepSpec::parse(std::path::Path::new("block-width.toml"), &text).unwrap();
    let cfg = spec.expand("smoke").unwrap().remove(0).config;
    for key in [
        "d_model=64",
        "n_heads=4",
        "vocab_size=1000",
        "encoding=\"nope\"",
        "n_layers=3",
    ] {
        let err = lab::eval::apply_overrides(&cfg, &[key.to_string()])
            .unwrap_err()
            .to_string();
        let field = key.split('=').next().unwrap();
        assert!(
            err.starts_with(&format!(
                "--set {key}: `{field}` is fixed by the trained model and cannot change at evaluation"
            )),
            "{err}"
        );
    }
    let ok = lab::eval::apply_overrides(&cfg, &["block_len=8".to_string()]).unwrap();
    assert_eq!(ok.task.block().unwrap().block_len, 8);
}

/// `lab mi --task` without --max-lag profiles every lag of the task's examples (it failed with
/// the corpus default of 256 before, issue 16).
#[test]
fn mi_task_default_max_lag_fits_the_task() {
    let o = lab()
        .args([
            "mi",
            "--task",
            "block",
            "--param",
            "block_len=4",
            "--n-examples",
            "200",
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    // block's default seq_len is 32: lags 1..=31, one CSV row each after the header.
    assert_eq!(stdout.lines().count(), 1 + 31, "{stdout}");
}

/// A negative number for a count is a value error naming the option, on one line, not clap's
/// "unexpected argument" (issue 16).
#[test]
fn negative_counts_name_the_option() {
    for (args, opt) in [
        (vec!["gen", "block", "--n", "-1"], "--n <N>"),
        (vec!["eval", "x", "--seq-len", "-5"], "--seq-len <SEQ_LEN>"),
        (
            vec!["bench", "train-step", "--threads", "-2"],
            "--threads <THREADS>",
        ),
    ] {
        let o = lab().args(&args).output().unwrap();
        let (_, stderr) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with(&format!(
                "error: invalid value '{}' for '{opt}'",
                args[args.len() - 1]
            )),
            "{args:?}: {stderr}"
        );
    }
}

/// clap's multi-line errors reach the user as one line that keeps what they name: a missing
/// required argument is named (before, the line ended at "were not provided:").
#[test]
fn missing_required_argument_is_named() {
    let o = lab().args(["eval", "some-run"]).output().unwrap();
    let (_, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "error: the following required arguments were not provided: --seq-len <SEQ_LEN> (lab --help for usage)"
    );
}

/// `lab bench attention`: sizes whose product no device holds, and `--strategy library` on the
/// CPU, are refused in one line naming the options (before: an allocation abort with a stack
/// trace; a message calling `library` a kernel layout).
#[test]
fn bench_attention_refuses_impossible_sizes_and_library_on_cpu() {
    for (args, want) in [
        (
            vec![
                "bench",
                "attention",
                "--seq",
                "1048576",
                "--batch",
                "4096",
                "--heads",
                "1024",
                "--head-dim",
                "256",
            ],
            "error: --batch × --heads × --seq × --head-dim = 1125899906842624 elements per tensor at seq 1048576: at most 2^30",
        ),
        (
            vec!["bench", "attention", "--strategy", "library", "--seq", "64"],
            "error: --strategy library: CubeCL's library attention runs on --backend wgpu or cuda",
        ),
    ] {
        let o = lab().args(&args).output().unwrap();
        let (_, stderr) = text(&o);
        assert!(!o.status.success(), "{args:?}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with(want), "{args:?}: {stderr}");
    }
}

/// `lab sweep --dry-run` refuses a backend this build lacks, as the real run does (before, it
/// listed the runs "to train" and exited 0).
#[cfg(not(feature = "cuda-plain"))]
#[test]
fn dry_run_refuses_a_backend_the_build_lacks() {
    let out = std::env::temp_dir().join(format!("lab-dry-cuda-{}", std::process::id()));
    let o = lab()
        .args([
            "sweep",
            "block-width",
            "--backend",
            "cuda",
            "--dry-run",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let (_, stderr) = text(&o);
    assert!(!o.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: backend = cuda needs the cargo feature `cuda`"),
        "{stderr}"
    );
}
