//! Helpers shared by the sweep integration tests: run the `lab` binary, compare result
//! tables by value, list temporaries.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use arrow_schema::DataType;
use lab::results::{column, read_parquet};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn lab() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lab"));
    c.env("LAB_SWEEPS_DIR", repo_root().join("sweeps"));
    c
}

/// A fresh (removed) temporary path for this test process.
pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lab-rb-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

pub fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `lab sweep block-width --preset smoke --no-progress --out OUT` plus `extra` arguments.
pub fn smoke(out: &Path, extra: &[&str]) -> Output {
    lab()
        .args(["sweep", "block-width", "--preset", "smoke", "--no-progress"])
        .args(extra)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

/// An uninterrupted smoke sweep of block-width, run once per test binary.
pub fn reference() -> &'static Path {
    static REF: OnceLock<PathBuf> = OnceLock::new();
    REF.get_or_init(|| {
        let out = tmp("reference");
        let o = smoke(&out, &[]);
        let (stdout, stderr) = text(&o);
        assert!(o.status.success(), "{stdout}\n{stderr}");
        assert!(
            stdout.contains("20 runs (20 run now, 0 already finished, 0 failed)"),
            "{stdout}"
        );
        out
    })
}

/// Columns that measure time, not results.
pub const TIMING: &[&str] = &["wall_time_s", "ms_per_step", "tokens_per_s", "probe_ms"];

/// Every row of `dir/<table>.parquet` as a `column=value` string (timing columns left out;
/// floats by their exact bits), sorted.
pub fn rows(dir: &Path, table: &str) -> Vec<String> {
    let (schema, batches) = read_parquet(&dir.join(format!("{table}.parquet")))
        .unwrap_or_else(|e| panic!("{table}: {e}"));
    let mut out = Vec::new();
    for b in &batches {
        let mut cols: Vec<Vec<String>> = Vec::new();
        for f in schema.fields() {
            if TIMING.contains(&f.name().as_str()) {
                continue;
            }
            let name = f.name();
            let vals: Vec<String> = match f.data_type() {
                DataType::Utf8 => column::strings(b, name)
                    .into_iter()
                    .map(|v| format!("{name}={v:?}"))
                    .collect(),
                DataType::Int64 => column::ints(b, name)
                    .into_iter()
                    .map(|v| format!("{name}={v:?}"))
                    .collect(),
                DataType::Float64 => column::floats(b, name)
                    .into_iter()
                    .map(|v| format!("{name}={:?}", v.map(f64::to_bits)))
                    .collect(),
                // schema_version (int32) and booleans: equal by construction here.
                _ => vec![String::new(); b.num_rows()],
            };
            cols.push(vals);
        }
        for i in 0..b.num_rows() {
            out.push(
                cols.iter()
                    .map(|c| c[i].as_str())
                    .collect::<Vec<_>>()
                    .join(";"),
            );
        }
    }
    out.sort();
    out
}

/// Assert that two results folders hold the same values in `runs`, `curves`, `spectrum` and
/// `fit` (timings excluded).
pub fn assert_same_results(a: &Path, b: &Path) {
    for table in ["runs", "curves", "spectrum", "fit"] {
        let (ra, rb) = (rows(a, table), rows(b, table));
        assert_eq!(ra.len(), rb.len(), "{table}: row counts differ");
        if let Some(i) = (0..ra.len()).find(|&i| ra[i] != rb[i]) {
            panic!(
                "{table}: row {i} differs between {} and {}:\n{}\n{}",
                a.display(),
                b.display(),
                ra[i],
                rb[i]
            );
        }
    }
}

/// Every file under `dir` (recursively).
pub fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.push(p.clone());
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Temporaries (`.*.tmp-*` files or folders) under `dir`.
pub fn temporaries(dir: &Path) -> Vec<PathBuf> {
    files(dir)
        .into_iter()
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with('.') && n.contains(".tmp-")
        })
        .collect()
}

/// Read every (non-temporary) Parquet file under `dir`; returns how many, panics on a bad one.
pub fn check_all_parquet(dir: &Path) -> usize {
    let mut n = 0;
    for p in files(dir) {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".parquet") && !name.starts_with('.') {
            read_parquet(&p).unwrap_or_else(|e| panic!("unreadable {}: {e}", p.display()));
            n += 1;
        }
    }
    n
}

/// Run ids in `dir/runs.parquet`, in file order.
pub fn run_ids(dir: &Path) -> Vec<String> {
    let (_, b) = read_parquet(&dir.join("runs.parquet")).unwrap();
    b.iter()
        .flat_map(|b| column::strings(b, "run_id"))
        .map(|s| s.unwrap())
        .collect()
}

/// Run `cmd` (stdin and stdout closed, stderr captured) in the repository root until it exits
/// or `bound` passes (then it is killed and the code is `None`), polling every `poll`.
/// Returns (exit code, stderr, wall time).
pub fn run_bounded(
    mut cmd: Command,
    bound: std::time::Duration,
    poll: std::time::Duration,
) -> (Option<i32>, String, std::time::Duration) {
    use std::io::Read;
    use std::process::Stdio;
    let t0 = std::time::Instant::now();
    let mut child = cmd
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if t0.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(poll);
    };
    let elapsed = t0.elapsed();
    (code, reader.join().unwrap(), elapsed)
}
