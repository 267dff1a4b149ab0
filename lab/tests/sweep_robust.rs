//! Sweeps that survive crashes and run in pieces (issue 8), on the block-width smoke preset
//! (20 runs, a few seconds): determinism, SIGKILL-and-resume, shards merged, divergence with
//! `--retry-failed`, `lab status`, `--emit-slurm`.

mod common;

use std::collections::HashSet;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use common::*;
use lab::results::{column, read_parquet};
use rand::{Rng, SeedableRng};

/// The same sweep run twice from scratch gives identical values in every table.
#[test]
fn same_sweep_twice_gives_identical_tables() {
    let again = tmp("again");
    let o = smoke(&again, &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert_same_results(reference(), &again);
    let _ = std::fs::remove_dir_all(&again);
}

fn kill_group(pgid: u32) {
    let s = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .status()
        .unwrap();
    assert!(s.success());
}

/// Start the sweep, SIGKILL its whole process group (the sweep and its run processes) at
/// random moments, several times; after each kill every Parquet file is readable and
/// `lab status` shows nothing running. A final start finishes the sweep: every run exactly
/// once in `runs`, no temporary left, values equal to the uninterrupted sweep's.
#[test]
fn sigkill_at_random_moments_then_resume() {
    let reference = reference();
    let out = tmp("killed");
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let (mut kills, mut temporaries_seen, mut parquet_checked) = (0, 0, 0);
    let mut delays = Vec::new();
    for _ in 0..6 {
        let mut child = lab()
            .args(["sweep", "block-width", "--preset", "smoke", "--no-progress"])
            .arg("--out")
            .arg(&out)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        let delay = rng.random_range(150..700);
        std::thread::sleep(Duration::from_millis(delay));
        if child.try_wait().unwrap().is_some() {
            break; // finished before the kill
        }
        kill_group(child.id());
        child.wait().unwrap();
        kills += 1;
        delays.push(delay);
        // Let the kernel finish killing the group's run processes (under load a SIGKILLed run
        // process can take more than 100 ms to go): poll `lab status` for up to 5 s.
        std::thread::sleep(Duration::from_millis(100));
        temporaries_seen += temporaries(&out).len();
        parquet_checked += check_all_parquet(&out);
        let mut stdout = String::new();
        for _ in 0..50 {
            let o = lab()
                .args(["status", "block-width", "--preset", "smoke", "--out"])
                .arg(&out)
                .output()
                .unwrap();
            assert!(o.status.success());
            stdout = text(&o).0;
            if stdout.contains(", 0 running, ") {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(stdout.contains(", 0 running, 0 failed, "), "{stdout}");
    }
    assert!(
        kills >= 3,
        "only {kills} kills landed before the sweep finished"
    );
    // Temporaries a killed writer could leave, planted to be sure the next start cleans them.
    std::fs::write(out.join(".runs.parquet.tmp-4242"), b"partial").unwrap();
    std::fs::create_dir_all(out.join("runs/.deadbeef.tmp-4242/evals")).unwrap();
    let some_run = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("runs.parquet").is_file())
        .expect("a run finished before the kills");
    std::fs::write(some_run.join(".curves.parquet.tmp-4242"), b"partial").unwrap();

    let o = smoke(&out, &[]);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("0 failed)"), "{stdout}");
    assert_eq!(temporaries(&out), Vec::<std::path::PathBuf>::new());
    let ids = run_ids(&out);
    let unique: HashSet<&String> = ids.iter().collect();
    let duplicates = ids.len() - unique.len();
    assert_eq!((ids.len(), duplicates), (20, 0));
    check_all_parquet(&out);
    assert_same_results(reference, &out);
    eprintln!(
        "kill-and-resume: {kills} SIGKILLs of the process group at {delays:?} ms after start, \
         {temporaries_seen} temporaries seen after kills (cleaned), {parquet_checked} Parquet \
         reads after kills all good; final: {} runs in runs.parquet, {duplicates} duplicates, \
         values equal to the uninterrupted sweep",
        ids.len()
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// Three shards (one with two jobs at once) merged equal the unsharded sweep; merging again
/// copies nothing (every run is a duplicate).
#[test]
fn shards_merged_equal_the_unsharded_sweep() {
    let reference = reference();
    let base = tmp("shards");
    let mut counts = Vec::new();
    for (i, extra) in [(1, "--jobs=2"), (2, "--jobs=1"), (3, "--jobs=1")] {
        let dir = base.join(format!("shard-{i}"));
        let o = smoke(&dir, &["--shard", &format!("{i}/3"), extra]);
        assert!(o.status.success(), "{:?}", text(&o));
        counts.push(run_ids(&dir).len());
    }
    // 20 runs round-robin over 3 shards.
    assert_eq!(counts, vec![7, 7, 6]);
    let merged = base.join("merged");
    let merge = || {
        let o = lab()
            .arg("merge")
            .args((1..=3).map(|i| base.join(format!("shard-{i}"))))
            .arg("--out")
            .arg(&merged)
            .output()
            .unwrap();
        let (stdout, stderr) = text(&o);
        assert!(o.status.success(), "{stdout}\n{stderr}");
        stdout
    };
    let first = merge();
    assert!(
        first.contains("20 finished runs found, 20 copied, 0 duplicates skipped; 20 runs in total"),
        "{first}"
    );
    let again = merge();
    assert!(
        again.contains("20 finished runs found, 0 copied, 20 duplicates skipped; 20 runs in total"),
        "{again}"
    );
    let ids = run_ids(&merged);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 20);
    assert_same_results(reference, &merged);
    let _ = std::fs::remove_dir_all(&base);
}

/// A sweep file: block-width with a `diverge` preset of three runs: one healthy, one whose
/// weights blow up (lr · weight_decay = 100: non-finite loss), one stopped by `max_grad_norm`.
fn diverging_sweep(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mut text = std::fs::read_to_string(repo_root().join("sweeps/block-width.toml")).unwrap();
    text.push_str(
        r#"
[presets.diverge]
description = "one healthy run, one blowing up, one with exploding gradients"
base = { seq_len = 64, d_model = 32, n_heads = 2, n_layers = 1, d_ff = 64, steps = 40, batch_size = 8, warmup_steps = 4, eval_every = 20, eval_batches = 2 }
grid = { block_len = [4], variant = ["copy"] }
arms = [{ seed = [0] }, { seed = [1], lr = [10.0], weight_decay = [10.0], max_grad_norm = [0.0] }, { seed = [2], max_grad_norm = [1e-9] }]
"#,
    );
    let path = dir.join("diverge.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Diverging runs are recorded `failed` with the step and reason, the sweep goes on (exit 1),
/// `lab status` lists them, and `--retry-failed` reruns only those.
#[test]
fn divergence_is_recorded_and_retry_failed_reruns_only_those() {
    let dir = tmp("diverge");
    let file = diverging_sweep(&dir);
    let out = dir.join("out");
    let sweep = |extra: &[&str]| {
        lab()
            .arg("sweep")
            .arg(&file)
            .args(["--preset", "diverge", "--no-progress", "--out"])
            .arg(&out)
            .args(extra)
            .output()
            .unwrap()
    };
    let o = sweep(&[]);
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("3 runs (3 run now, 0 already finished, 2 failed)"),
        "{stdout}"
    );
    let (_, b) = read_parquet(&out.join("runs.parquet")).unwrap();
    let b = &b[0];
    let (seed, status, step, reason) = (
        column::ints(b, "seed"),
        column::strings(b, "status"),
        column::ints(b, "fail_step"),
        column::strings(b, "fail_reason"),
    );
    let mut by_seed: Vec<_> = (0..b.num_rows())
        .map(|i| {
            (
                seed[i].unwrap(),
                status[i].clone().unwrap(),
                step[i],
                reason[i].clone(),
            )
        })
        .collect();
    by_seed.sort_by_key(|r| r.0);
    assert_eq!(by_seed[0].1, "done");
    assert_eq!(
        (by_seed[1].1.as_str(), by_seed[2].1.as_str()),
        ("failed", "failed")
    );
    let blowup_step = by_seed[1].2.unwrap();
    assert!((1..40).contains(&blowup_step), "{by_seed:?}");
    assert!(
        by_seed[1].3.as_deref().unwrap().starts_with("non-finite"),
        "{by_seed:?}"
    );
    assert_eq!(by_seed[2].2, Some(0));
    assert!(
        by_seed[2]
            .3
            .as_deref()
            .unwrap()
            .starts_with("exploding gradients: norm "),
        "{by_seed:?}"
    );
    eprintln!("divergence: {by_seed:?}");

    let status = lab()
        .arg("status")
        .arg(&file)
        .args(["--preset", "diverge", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let (s, _) = text(&status);
    assert!(
        s.contains("3 runs: 1 done, 0 running, 2 failed, 0 missing"),
        "{s}"
    );
    assert!(
        s.contains(&format!("failed    at step {blowup_step}: non-finite")),
        "{s}"
    );
    assert!(
        s.contains("failed    at step 0: exploding gradients"),
        "{s}"
    );

    let healthy = std::fs::read_dir(out.join("runs"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("runs.parquet"))
        .find(|p| {
            let (_, b) = read_parquet(p).unwrap();
            column::strings(&b[0], "status")[0].as_deref() == Some("done")
        })
        .unwrap();
    let before = std::fs::metadata(&healthy).unwrap().modified().unwrap();
    let o = sweep(&["--retry-failed"]);
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("3 runs, 1 already finished (2 failed run(s) reset for a retry), 2 to run"),
        "{stderr}"
    );
    assert!(
        stdout.contains("3 runs (2 run now, 1 already finished, 2 failed)"),
        "{stdout}"
    );
    // The healthy run was not touched; the failures are deterministic.
    assert_eq!(
        std::fs::metadata(&healthy).unwrap().modified().unwrap(),
        before
    );
    let (_, b) = read_parquet(&out.join("runs.parquet")).unwrap();
    assert_eq!(b[0].num_rows(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `lab status` of a sweep never run: every run missing; `--shard` narrows the list.
#[test]
fn status_of_an_empty_folder_lists_missing_runs() {
    let out = tmp("status-empty");
    let o = lab()
        .args(["status", "block-width", "--preset", "smoke", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let (s, _) = text(&o);
    assert!(o.status.success());
    assert!(
        s.contains("20 runs: 0 done, 0 running, 0 failed, 20 missing"),
        "{s}"
    );
    assert_eq!(s.lines().filter(|l| l.ends_with(']')).count(), 20);
    let o = lab()
        .args([
            "status",
            "block-width",
            "--preset",
            "smoke",
            "--shard",
            "3/3",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let (s, _) = text(&o);
    assert!(
        s.contains("6 runs: 0 done, 0 running, 0 failed, 6 missing"),
        "{s}"
    );
    assert!(!out.exists(), "status must not create the folder");
}

/// `--emit-slurm` writes the job-array script (one task per shard, resources from the flags)
/// and runs nothing.
#[test]
fn emit_slurm_writes_the_job_array() {
    let dir = tmp("emit");
    let out = dir.join("bw");
    let file = dir.join("bw.sbatch");
    std::fs::create_dir_all(&dir).unwrap();
    let o = lab()
        .args(["sweep", "block-width", "--preset", "quick", "--emit-slurm"])
        .arg(&file)
        .args([
            "--slurm-shards",
            "8",
            "--slurm-cpus",
            "4",
            "--slurm-mem",
            "8G",
            "--slurm-time",
            "00:30:00",
            "--slurm-partition",
            "short",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let (_, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("8 array task(s) over 34 runs"), "{stderr}");
    let script = std::fs::read_to_string(&file).unwrap();
    for line in [
        "#SBATCH --array=1-8",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --mem=8G",
        "#SBATCH --time=00:30:00",
        "#SBATCH --partition=short",
        "N_SHARDS=8",
    ] {
        assert!(
            script.lines().any(|l| l == line),
            "no `{line}` in:\n{script}"
        );
    }
    let sweep_file = repo_root().join("sweeps/block-width.toml");
    let sweep_file = std::path::absolute(&sweep_file).unwrap();
    assert!(
        script.contains(&format!(
            "sweep {} --preset quick --shard",
            sweep_file.display()
        )),
        "{script}"
    );
    assert!(out.is_dir(), "the log folder exists for sbatch");
    assert!(!out.join("runs").exists(), "nothing ran");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ctrl-C (SIGINT to the sweep process) stops the sweep with one line saying how far it got
/// and how to resume, exit status 1 (issue 16); the same command then finishes the rest.
#[test]
fn ctrl_c_says_how_far_it_got_and_how_to_resume() {
    let out = tmp("ctrl-c");
    let child = lab()
        .args([
            "sweep",
            "block-width",
            "--preset",
            "smoke",
            "--no-progress",
            "--jobs",
            "1",
        ])
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    // Wait for the first finished run, then interrupt the sweep process only.
    let t0 = std::time::Instant::now();
    while std::fs::read_dir(out.join("runs"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().join("runs.parquet").is_file())
                .count()
        })
        .unwrap_or(0)
        == 0
    {
        assert!(t0.elapsed() < Duration::from_secs(120), "no run finished");
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(s.success());
    let o = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("interrupted: "))
        .unwrap_or_else(|| panic!("no interruption line in:\n{stdout}"));
    let done: usize = line["interrupted: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1..20).contains(&done)
            && line.ends_with(" of 20 runs done; run the same command to resume"),
        "{line}"
    );
    let o = smoke(&out, &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(
        text(&o).0.contains(&format!("{done} already finished")),
        "{}",
        text(&o).0
    );
    let _ = std::fs::remove_dir_all(&out);
}
