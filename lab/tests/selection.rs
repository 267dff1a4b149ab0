//! Selection on validation as a sweep feature (issue 52, docs/analysis-rules.md R58): a sweep
//! file's `[select]` keeps, per encoding × seed, the run of the lowest validation loss; the
//! folder's tables, fits and summary use those runs; `runs.parquet` marks `selected`.

mod common;

use std::path::Path;

use common::*;
use lab::results::{column, read_parquet};

/// A block-task sweep small enough for a test: 2 encodings × 3 learning rates × 2 seeds.
const SWEEP: &str = r#"
description = "selection check"
default_preset = "tiny"
[base]
task = "block"
variant = "recall"
vocab_size = 16
seq_len = 32
block_len = 4
noise = 0.0
encoding = "rope"
rope_base = 10000.0
pair_layout = "adjacent"
d_model = 16
n_layers = 1
n_heads = 2
d_ff = 32
steps = 20
batch_size = 8
lr = 0.003
warmup_steps = 2
min_lr_ratio = 0.1
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
adam_eps = 1e-8
grad_clip = 1.0
eval_every = 10
eval_batches = 2
seed = 0
[grid]
encoding = ["rope", "pope"]
lr = [0.001, 0.01, 0.1]
seed = [0, 1]
[select]
over = ["lr"]
[presets.tiny]
description = "tiny"
"#;

fn sweeps_with(dir: &Path, text: &str) -> std::path::PathBuf {
    let sweeps = dir.join("sweeps");
    std::fs::create_dir_all(&sweeps).unwrap();
    std::fs::write(sweeps.join("sel.toml"), text).unwrap();
    sweeps
}

#[test]
fn the_selected_run_of_each_group_has_the_lowest_validation_loss() {
    let dir = tmp("selection");
    let sweeps = sweeps_with(&dir, SWEEP);
    let out = dir.join("out");
    let o = lab()
        .env("LAB_SWEEPS_DIR", &sweeps)
        .args(["sweep", "sel", "--no-progress", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    let (_, b) = read_parquet(&out.join("runs.parquet")).unwrap();
    let b = &b[0];
    assert_eq!(b.num_rows(), 12, "every run of the plan is in runs.parquet");
    let (enc, seed, lr) = (
        column::strings(b, "encoding"),
        column::ints(b, "seed"),
        column::floats(b, "lr"),
    );
    let (val, test, sel) = (
        column::floats(b, "val_loss"),
        column::floats(b, "final_eval_loss"),
        column::bools(b, "selected"),
    );
    let mut chosen = 0;
    for i in 0..12 {
        let v = val[i].expect("every finished run has a validation loss");
        // Validation and test are other data: the losses differ.
        assert_ne!(Some(v), test[i]);
        let group: Vec<usize> = (0..12)
            .filter(|&j| enc[j] == enc[i] && seed[j] == seed[i])
            .collect();
        assert_eq!(group.len(), 3);
        let best = group
            .iter()
            .copied()
            .min_by(|&x, &y| val[x].partial_cmp(&val[y]).unwrap())
            .unwrap();
        assert_eq!(
            sel[i],
            Some(i == best),
            "{:?} {:?} lr {:?}",
            enc[i],
            seed[i],
            lr[i]
        );
        chosen += usize::from(i == best);
    }
    assert_eq!(chosen, 4);
    // The other tables hold the selected runs only.
    let (_, c) = read_parquet(&out.join("curves.parquet")).unwrap();
    let ids: std::collections::BTreeSet<_> = c
        .iter()
        .flat_map(|b| column::strings(b, "run_id"))
        .collect();
    assert_eq!(ids.len(), 4);
    assert!(
        stdout.contains("Selection on validation (over lr by val_loss"),
        "{stdout}"
    );
    assert!(
        stdout.contains("test NLL: pope − rope = "),
        "paired differences: {stdout}"
    );
    // The selection figure's data: one setting, a curve per encoding over the 3 learning rates,
    // each point pooling the 2 seeds' validation losses.
    let plan = lab::results::plan::read(&out).expect("plan.json");
    let sel = plan.select.clone().expect("the plan records its selection");
    let cands = lab::analysis::select::candidates(&out, &plan.run_ids, &sel).unwrap();
    let panels = lab::plot::data::selection_curves(&lab::analysis::select::choose(&sel, &cands));
    assert_eq!(panels.len(), 1);
    assert_eq!(panels[0].0, "all");
    let curves = &panels[0].1;
    assert_eq!(curves.len(), 2);
    for c in curves {
        let xs: Vec<f64> = c.points.iter().map(|p| p.0).collect();
        assert_eq!(xs, vec![0.001, 0.01, 0.1], "{}", c.label);
        assert!(c.points.iter().all(|p| p.1.values.len() == 2));
    }
    // `lab report` says what it kept and inlines the selection figure.
    let o = lab()
        .env("LAB_SWEEPS_DIR", &sweeps)
        .args(["report", "sel", "--results"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{:?}", text(&o));
    let page = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        page.contains("Selected on validation (over lr by val_loss, docs/analysis-rules.md R58): 4 of the plan's 12 runs"),
        "report"
    );
    assert!(out.join("figures/selection.svg").is_file());
    assert!(
        page.contains("Selection on validation"),
        "figure caption or title"
    );
    // `lab compare` says it compares selected runs.
    let o = lab()
        .env("LAB_SWEEPS_DIR", &sweeps)
        .arg("compare")
        .arg(&out)
        .arg(&out)
        .output()
        .unwrap();
    let (cmp, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        cmp.contains("(selected on validation: 4 of 12 runs)"),
        "{cmp}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_selection_with_nothing_to_choose_is_refused() {
    let dir = tmp("selection-bad");
    for (change, expected) in [
        (
            ("lr = [0.001, 0.01, 0.1]", "lr = [0.001]"),
            "[select]: over: `lr` takes 1 value(s) in preset tiny (0.001); a selection needs an axis with at least 2",
        ),
        (
            ("over = [\"lr\"]", "over = [\"lrr\"]"),
            "[select]: over: `lrr` is not a config field; did you mean `lr`?",
        ),
    ] {
        let sweeps = sweeps_with(&dir, &SWEEP.replace(change.0, change.1));
        let o = lab()
            .env("LAB_SWEEPS_DIR", &sweeps)
            .args(["sweep", "sel", "--dry-run"])
            .output()
            .unwrap();
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(expected), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
