//! End to end: `lab sweep block-width --preset smoke` into a temporary folder, then the same
//! command again (every run skipped), then every table checked with Python Polars.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn lab() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lab"));
    c.env("LAB_SWEEPS_DIR", repo_root().join("sweeps"));
    c
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lab-it-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn smoke_sweep_end_to_end_and_resume() {
    let out = tmp("smoke");
    let run = |expect_ran: &str| {
        let o = lab()
            .args([
                "sweep",
                "block-width",
                "--preset",
                "smoke",
                "--no-progress",
                "--out",
            ])
            .arg(&out)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
        assert!(
            stdout.contains(expect_ran),
            "expected `{expect_ran}` in:\n{stdout}"
        );
        stdout.to_string()
    };
    // smoke grid: B ∈ {4, 16} × {copy, recall} × (rope seeds 0,1 + nope seed 0) = 12 runs.
    let first = run("12 runs (12 run now, 0 already finished, 0 failed)");
    assert!(first.contains("rope/copy"), "{first}");
    assert!(first.contains("rope/recall"), "{first}");
    let second = run("12 runs (0 run now, 12 already finished, 0 failed)");
    // Same tables → same fit lines.
    let fit_lines = |s: &str| {
        s.lines()
            .filter(|l| l.contains(" β = "))
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(fit_lines(&first), fit_lines(&second));
    for t in ["runs", "curves", "spectrum", "fit"] {
        assert!(
            out.join(format!("{t}.parquet")).is_file(),
            "{t}.parquet missing"
        );
    }
    let py = Command::new("python3")
        .arg(repo_root().join("lab/tests/check_tables.py"))
        .arg(&out)
        .output()
        .expect("python3 is needed for the Polars check");
    assert!(
        py.status.success(),
        "Polars check failed:\n{}{}",
        String::from_utf8_lossy(&py.stdout),
        String::from_utf8_lossy(&py.stderr)
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn unknown_sweep_lists_the_sweeps() {
    let o = lab().args(["sweep", "no-such-sweep"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("unknown sweep `no-such-sweep`; available sweeps:"),
        "{err}"
    );
    assert!(err.contains("block-width"), "{err}");
}

#[test]
fn unknown_preset_is_one_line() {
    let o = lab()
        .args(["sweep", "block-width", "--preset", "huge"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("unknown preset `huge`; available presets: full, quick, smoke"),
        "{err}"
    );
}

#[test]
fn bad_value_in_sweep_file_names_field_and_range() {
    let dir = tmp("badval");
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(repo_root().join("sweeps/block-width.toml")).unwrap();
    let bad = text.replace("block_len = [4, 8, 16, 32, 64]", "block_len = [4, 500]");
    let path = dir.join("bad.toml");
    std::fs::write(&path, bad).unwrap();
    let o = lab()
        .args(["sweep"])
        .arg(&path)
        .args(["--preset", "quick"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("block_len = 500 is out of range"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn list_shows_presets() {
    let o = lab().args(["sweep", "--list"]).output().unwrap();
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("block-width:"), "{s}");
    assert!(s.contains("--preset quick (default)"), "{s}");
}
