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

/// `lab plot SWEEP` on a smoke sweep's tables writes every figure of that sweep, PNG and SVG.
fn check_plot(sweep: &str, out: &Path) {
    let figs = out.join("figures");
    let o = lab()
        .args(["plot", sweep, "--results"])
        .arg(out)
        .arg("--out")
        .arg(&figs)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "lab plot {sweep}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (_, names) = lab::plot::SWEEP_FIGURES
        .iter()
        .find(|(n, _)| *n == sweep)
        .unwrap();
    let printed = String::from_utf8_lossy(&o.stdout);
    for name in *names {
        for ext in ["png", "svg"] {
            let f = figs.join(format!("{name}.{ext}"));
            let len = std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0);
            assert!(len > 2000, "{sweep}: {} missing or empty", f.display());
            assert!(printed.contains(&f.display().to_string()), "{printed}");
        }
    }
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
    // smoke grid: B ∈ {4, 16} × {copy, recall} × (rope seeds 0,1 + nope seed 0 + pope seeds 0,1)
    // = 20 runs.
    let first = run("20 runs (20 run now, 0 already finished, 0 failed)");
    for group in ["rope/copy", "rope/recall", "pope/copy", "pope/recall"] {
        assert!(first.contains(group), "no {group} fit in:\n{first}");
    }
    // Issue 51, item 5 (R57): 2 widths, 2 seeds, models that did not learn: no verdict (it
    // printed "pope/recall: the law holds (β = 0.804, R² = 0.975)").
    let line = first.lines().find(|l| l.starts_with("Verdict")).unwrap();
    let verdict = line.split_once("R57): ").unwrap().1;
    assert!(
        !verdict.contains("the law holds") && !verdict.contains("not reproduced"),
        "{line}"
    );
    assert_eq!(
        verdict.matches(": no verdict: 2 width(s) over 4×").count(),
        4,
        "{verdict}"
    );
    let second = run("20 runs (0 run now, 20 already finished, 0 failed)");
    // Same tables → same fit lines.
    let fit_lines = |s: &str| {
        s.lines()
            .filter(|l| l.contains(" β = "))
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(fit_lines(&first), fit_lines(&second));
    for t in ["runs", "curves", "spectrum", "layers", "fit"] {
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
    check_plot("block-width", &out);
    check_provenance_dry_run_report_compare(&out, &first);
    check_eval_round_trip(&out);
    let _ = std::fs::remove_dir_all(&out);
}

/// What the two sweeps above left for provenance (two invocations, the summary), and the
/// commands that read a finished folder: `--dry-run` (with and without an override), `lab
/// report` (a self-contained page with every figure and run) and `lab compare` (a folder against
/// itself: every Δβ is zero).
fn check_provenance_dry_run_report_compare(out: &Path, first_stdout: &str) {
    use lab::sweep::provenance;
    let inv = provenance::read(out);
    assert_eq!(inv.len(), 2, "one record per invocation");
    assert_eq!((inv[0].ran, inv[0].skipped), (20, 0));
    assert_eq!((inv[1].ran, inv[1].skipped), (0, 20));
    assert!(
        inv[0].command.contains("--preset smoke"),
        "{}",
        inv[0].command
    );
    assert!(inv[1].ended_unix_s >= inv[1].started_unix_s);
    let summary = std::fs::read_to_string(out.join(provenance::SUMMARY_FILE)).unwrap();
    assert!(
        first_stdout.contains(summary.trim()),
        "summary.txt is what was printed"
    );

    let run = |args: &[&str]| {
        let o = lab().args(args).output().unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let dir = out.to_str().unwrap();
    let dry = run(&[
        "sweep",
        "block-width",
        "--preset",
        "smoke",
        "--out",
        dir,
        "--dry-run",
    ]);
    assert!(dry.contains("20 runs: 20 done, 0 failed"), "{dry}");
    assert!(dry.contains("nothing to train"), "{dry}");
    let dry = run(&[
        "sweep",
        "block-width",
        "--preset",
        "smoke",
        "--out",
        dir,
        "--dry-run",
        "--set",
        "steps=80",
        "--set",
        "block_len=[8]",
    ]);
    assert!(
        dry.contains("--set steps=80") && dry.contains("block_len = [8]"),
        "{dry}"
    );
    assert!(dry.contains("10 runs: 0 done, 0 failed"), "{dry}");
    // Twice the steps of the finished runs at 8 tokens per block instead of 4 and 16: the
    // estimate is in minutes and comes from the 20 finished runs.
    assert!(
        dry.contains("estimated ") && dry.contains("over 20 finished runs"),
        "{dry}"
    );
    assert!(
        !out.join("runs").read_dir().unwrap().any(|e| {
            let id = e.unwrap().file_name();
            !Path::new(out)
                .join("runs")
                .join(&id)
                .join("runs.parquet")
                .is_file()
        }),
        "a dry run trains nothing"
    );

    let report = out.join("report.html");
    let printed = run(&["report", "block-width", "--results", dir]);
    assert!(printed.contains("3 figure(s) inlined"), "{printed}");
    let html = std::fs::read_to_string(&report).unwrap();
    for stem in ["spectrum-heatmap", "theta-eff-vs-width", "ablation"] {
        let at = html
            .find(&format!("<figure id=\"fig-{stem}\""))
            .expect(stem);
        assert!(html[at..].starts_with(&format!(
            "<figure id=\"fig-{stem}\" class=\"lab-figure\"><svg"
        )));
    }
    // Self-contained: no external script, style, image or link.
    for bad in ["src=\"http", "href=\"http", "<link", "@import", "url(http"] {
        assert!(!html.contains(bad), "the page loads `{bad}`");
    }
    let runs_table = &html[html.find("<table class=\"runs sortable\">").unwrap()..];
    let runs_table = &runs_table[..runs_table.find("</table>").unwrap()];
    assert_eq!(runs_table.matches("<tr>").count(), 21, "header + 20 runs");
    for group in ["rope/copy", "rope/recall", "pope/copy", "pope/recall"] {
        assert!(
            html.contains(&format!("<li>{group} (all pooling): β = ")),
            "{group}"
        );
    }
    assert!(html.contains("Provenance") && html.contains("2 invocation(s)"));

    let cmp = run(&["compare", dir, dir]);
    let deltas: Vec<&str> = cmp
        .lines()
        .filter(|l| l.starts_with("rope ") || l.starts_with("pope "))
        .filter(|l| l.contains(" [")) // fit rows
        .collect();
    assert_eq!(deltas.len(), 8, "{cmp}"); // 4 groups × 2 width sources
    assert!(deltas.iter().all(|l| l.contains("+0.000")), "{cmp}");
}

/// `lab eval` on a finished run at its training length reproduces the run's final evaluation
/// (checkpoint round trip); at twice the length with PI it writes an `evals` row.
fn check_eval_round_trip(out: &Path) {
    use lab::results::{column, read_parquet};
    let (_, batches) = read_parquet(&out.join("runs.parquet")).unwrap();
    let b = &batches[0];
    let ids = column::strings(b, "run_id");
    let encs = column::strings(b, "encoding");
    let i = (0..b.num_rows())
        .find(|&i| encs[i].as_deref() == Some("rope"))
        .unwrap();
    let id = ids[i].clone().unwrap();
    let final_loss = column::floats(b, "final_eval_loss")[i].unwrap();
    let seq_len = column::ints(b, "seq_len")[i].unwrap();
    let run_dir = out.join("runs").join(&id);
    let eval = |extra: &[&str]| -> serde_json::Value {
        let o = lab()
            .arg("eval")
            .arg(&run_dir)
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let same = eval(&["--seq-len", &seq_len.to_string()]);
    let loss = same["loss"].as_f64().unwrap();
    assert!(
        (loss - final_loss).abs() < 1e-5,
        "eval {loss} vs run {final_loss}"
    );
    let longer = eval(&[
        "--seq-len",
        &(2 * seq_len).to_string(),
        "--scaling",
        "linear",
        "--factor",
        "2",
    ]);
    assert_eq!(longer["seq_len"].as_u64().unwrap() as i64, 2 * seq_len);
    assert!(longer["loss"].as_f64().unwrap().is_finite());
    let (_, evals) = read_parquet(&out.join("evals.parquet")).unwrap();
    let names: Vec<Option<String>> = evals
        .iter()
        .flat_map(|b| column::strings(b, "eval_name"))
        .collect();
    let adhoc = names
        .iter()
        .filter(|n| n.as_deref() == Some("adhoc"))
        .count();
    assert_eq!(adhoc, 2);
    // The sweep's causal check: every RoPE run has an unablated and a law-band evaluation, and
    // ablating the law band is recorded with its pairs.
    let mut law = 0;
    for b in &evals {
        let (enc, band, pairs, name) = (
            column::strings(b, "encoding"),
            column::strings(b, "ablate_band"),
            column::strings(b, "ablated_pairs"),
            column::strings(b, "eval_name"),
        );
        for i in 0..b.num_rows() {
            if band[i].as_deref() == Some("law") {
                assert_eq!(enc[i].as_deref(), Some("rope"));
                assert_eq!(name[i].as_deref(), Some("ablation"));
                assert_eq!(pairs[i].as_deref().unwrap().split(',').count(), 2);
                law += 1;
            }
        }
    }
    let rope_runs = encs.iter().filter(|e| e.as_deref() == Some("rope")).count();
    assert_eq!(law, rope_runs, "one law-band ablation per RoPE run");
}

#[test]
fn rope_freqs_prints_json() {
    let o = lab()
        .args([
            "rope",
            "freqs",
            "--head-dim",
            "8",
            "--base",
            "10000",
            "--scaling",
            "linear",
            "--factor",
            "2",
        ])
        .output()
        .unwrap();
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let f: Vec<f64> = v["inv_freq"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(f.len(), 4);
    assert!((f[1] - 0.05).abs() < 1e-12);
    assert_eq!(v["attention_factor"].as_f64(), Some(1.0));
}

#[test]
fn gen_prints_json_lines_for_every_task() {
    for task in ["block", "indirect"] {
        let o = lab()
            .args(["gen", task, "--n", "3", "--seed", "2"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8_lossy(&o.stdout);
        assert_eq!(text.lines().count(), 3);
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["task"], task);
            assert!(v["input"].is_array() && v["target"].is_array() && v["mask"].is_array());
        }
    }
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
    assert!(err.starts_with("error: --preset huge: "), "{err}");
    assert!(
        err.contains(
            "block-width.toml has no preset `huge`; available presets: copy-1layer, fixed300, full, long, member, member-9seeds, member-confirm, member-long, member-replicate, p-rope, pope, pope-3seeds, quick, quick-burn, quick-replicates, quick-seeds345, quick-seeds678, recall-2000, recall-context, recall-long, smoke, tune, window, window-long"
        ),
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

#[test]
fn bench_train_step_prints_the_model_shape() {
    let o = lab()
        .args([
            "bench",
            "train-step",
            "--preset",
            "smoke",
            "--threads",
            "1",
            "--steps",
            "3",
            "--warmup",
            "1",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // The smoke preset's model (sweeps/block-width.toml).
    assert_eq!(v["d_model"], 32);
    assert_eq!(v["n_layers"], 1);
    assert_eq!(v["seq_len"], 64);
    assert_eq!(v["batch"], 8);
    assert_eq!(v["threads"], 1);
    assert_eq!(v["steps"], 3);
    assert!(v["ms_per_step"].as_f64().unwrap() > 0.0);
    let tps = v["tokens_per_s"].as_f64().unwrap();
    let expect = 8.0 * 64.0 / (v["ms_per_step"].as_f64().unwrap() / 1e3);
    assert!((tps - expect).abs() < 1e-6 * expect);
    assert!(v["first_step_ms"].as_f64().unwrap() > 0.0);
    // One stderr line per step as it ends, warm-up first: 1 + 3 steps.
    let err = String::from_utf8_lossy(&o.stderr);
    let steps: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("train-step: step "))
        .collect();
    assert_eq!(steps.len(), 4, "{err}");
    assert!(
        steps[0].starts_with("train-step: step 1/4 (warm-up) "),
        "{err}"
    );
    assert!(
        steps[1].starts_with("train-step: step 2/4 (timed) "),
        "{err}"
    );
    assert!(steps[3].ends_with(" ms"), "{err}");
}

/// `lab bench attention`: one JSON line per (seq, encoding), in that order, with the shape asked
/// for; an unknown encoding is one line naming the allowed ones.
#[test]
fn bench_attention_prints_one_line_per_case() {
    let o = lab()
        .args([
            "bench",
            "attention",
            "--seq",
            "8,16",
            "--heads",
            "2",
            "--head-dim",
            "8",
            "--encodings",
            "rope,pope",
            "--warmup",
            "0",
            "--iters",
            "1",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let cases: Vec<(String, u64)> = lines
        .iter()
        .map(|v| {
            (
                v["encoding"].as_str().unwrap().to_string(),
                v["seq"].as_u64().unwrap(),
            )
        })
        .collect();
    let want = [("rope", 8), ("pope", 8), ("rope", 16), ("pope", 16)];
    assert_eq!(cases, want.map(|(e, l)| (e.to_string(), l)));
    for v in &lines {
        assert_eq!(
            (
                v["batch"].as_u64(),
                v["heads"].as_u64(),
                v["head_dim"].as_u64()
            ),
            (Some(1), Some(2), Some(8))
        );
        assert_eq!(v["backend"], "cpu");
        assert_eq!(v["strategy"], "op");
        assert!(v["fwd_ms"].as_f64().unwrap() > 0.0 && v["fwd_bwd_ms"].as_f64().unwrap() > 0.0);
    }
    // A CubeCL layout on the CPU, and an unknown encoding, are refused in one line before any timing.
    refused_in_one_line(
        &[
            "bench",
            "attention",
            "--strategy",
            "tiled-split",
            "--iters",
            "1",
        ],
        "--strategy tiled-split: a layout of the CubeCL kernels, for --backend wgpu or cuda",
    );
    refused_in_one_line(
        &["bench", "attention", "--encodings", "alibi", "--iters", "1"],
        "unknown encoding `alibi` (allowed: nope, rope, pope, tapa, tapa-linear)",
    );
}

/// `lab args` fails with exactly one stderr line, which contains `message`.
fn refused_in_one_line(args: &[&str], message: &str) {
    let o = lab().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} succeeded");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(message), "{stderr}");
}

/// `lab selfcheck` on the CPU: every check passes, exit status 0, the summary line last.
#[test]
fn selfcheck_cpu_passes() {
    let o = lab().args(["selfcheck"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let last = stdout.trim_end().lines().last().unwrap();
    assert!(last.starts_with("all 187 checks passed on cpu"), "{last}");
    // Each group is announced on stderr as it ends (a run cut off by a limit keeps them).
    let stderr = String::from_utf8_lossy(&o.stderr);
    for line in [
        "selfcheck: extension: 147 checks, 0 failed",
        "selfcheck: train-step: 40 checks, 0 failed",
    ] {
        assert!(stderr.contains(line), "{line} not in {stderr}");
    }
}

/// A sweep with `[[evals]]` (pi-self-similarity, smoke): every run is evaluated at the listed
/// lengths and scalings after training; rows land in `evals.parquet`, scalings change the RoPE
/// numbers, and a re-run skips everything (evaluations included).
#[test]
fn sweep_evals_after_training() {
    use lab::results::{column, read_parquet};
    let out = tmp("pi");
    let run = || {
        let o = lab()
            .args([
                "sweep",
                "pi-self-similarity",
                "--preset",
                "smoke",
                "--no-progress",
                "--out",
            ])
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    run();
    let (_, batches) = read_parquet(&out.join("evals.parquet")).unwrap();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    // RoPE block runs (copy, recall): dilated 1 + 4 + 4, fixed 4 + 4 = 17 each; PoPE block runs:
    // 3 + 2 = 5; the RoPE iGSM run: fixed only (dilated is for block tasks), 4 + 4.
    assert_eq!(rows, 2 * 17 + 2 * 5 + 8);
    let mut loss = std::collections::BTreeMap::new();
    for b in &batches {
        let task = column::strings(b, "task");
        let (name, enc, var, scaling) = (
            column::strings(b, "eval_name"),
            column::strings(b, "encoding"),
            column::strings(b, "variant"),
            column::strings(b, "scaling"),
        );
        let (len, bl, l) = (
            column::ints(b, "seq_len"),
            column::ints(b, "block_len"),
            column::floats(b, "loss"),
        );
        for i in 0..b.num_rows() {
            if task[i].as_deref() == Some("igsm") {
                assert_eq!(name[i].as_deref(), Some("fixed"));
                continue;
            }
            let key = (
                name[i].clone().unwrap(),
                enc[i].clone().unwrap(),
                var[i].clone().unwrap(),
                scaling[i].clone().unwrap(),
                len[i].unwrap(),
            );
            if key.0 == "dilated" {
                assert_eq!(
                    bl[i].unwrap() * 32,
                    8 * len[i].unwrap(),
                    "block_len dilates"
                );
            } else {
                assert_eq!(bl[i], Some(8), "fixed keeps block_len");
            }
            assert!(loss.insert(key, l[i].unwrap()).is_none(), "duplicate row");
        }
    }
    let get = |s: &str| {
        loss[&(
            "fixed".into(),
            "rope".into(),
            "recall".into(),
            s.into(),
            128,
        )]
    };
    assert_ne!(
        get("none"),
        get("linear"),
        "PI must change the RoPE model's loss"
    );
    let again = run();
    assert!(again.contains("0 to run"), "{again}");
    check_plot("pi-self-similarity", &out);
    let _ = std::fs::remove_dir_all(&out);
}

/// The issue-5 sweeps (and indirect indexing) run end to end at their smoke presets: every run
/// finishes, the iGSM runs record `ops`, length-extrapolation writes 1×/2×/4×/8× evaluations
/// for every encoding, and `lab plot` draws each sweep's figures.
#[test]
fn igsm_and_length_extrapolation_smoke_sweeps() {
    use lab::results::{column, read_parquet};
    for (sweep, runs, evals) in [
        ("igsm-ops", 4, 0),
        ("length-extrapolation", 3, 1 + 3 * 3 + 4 + 4),
        ("indirect-indexing", 4, 0),
    ] {
        let out = tmp(sweep);
        let o = lab()
            .args([
                "sweep",
                sweep,
                "--preset",
                "smoke",
                "--no-progress",
                "--out",
            ])
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{sweep}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let (_, b) = read_parquet(&out.join("runs.parquet")).unwrap();
        let status: Vec<_> = b
            .iter()
            .flat_map(|b| column::strings(b, "status"))
            .collect();
        assert_eq!(status.len(), runs, "{sweep}");
        assert!(
            status.iter().all(|s| s.as_deref() == Some("done")),
            "{sweep}: {status:?}"
        );
        if evals > 0 {
            let (_, e) = read_parquet(&out.join("evals.parquet")).unwrap();
            // RoPE: 1× once, then 3 scalings at 2×, 4×, 8×; PoPE and TAPA: once per length.
            assert_eq!(
                e.iter().map(|b| b.num_rows()).sum::<usize>(),
                evals,
                "{sweep}"
            );
        } else if sweep == "igsm-ops" {
            let ops: Vec<_> = b.iter().flat_map(|b| column::ints(b, "ops")).collect();
            assert_eq!(ops.iter().filter(|o| **o == Some(2)).count(), 2);
        }
        check_plot(sweep, &out);
        let _ = std::fs::remove_dir_all(&out);
    }
}
