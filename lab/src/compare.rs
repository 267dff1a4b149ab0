//! `lab compare DIR_A DIR_B`: two results folders side by side — the law's fits (`fit.parquet`)
//! matched on (encoding, variant, group, pooling, width source), and headline metrics of the
//! finished runs (`runs.parquet`) per (task or variant, encoding): runs, mean accuracy, loss,
//! θ_eff of the positional layer, steps trained, run time. For two presets of one sweep, or the
//! same sweep before and after a change.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::plot::PlotError;
use crate::plot::data::Table;

/// Errors of `lab compare`.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// A folder has no tables.
    #[error(
        "{0} has neither runs.parquet nor fit.parquet: pass a sweep's results folder (e.g. results/block-width)"
    )]
    NoTables(String),
    /// Reading a table.
    #[error(transparent)]
    Table(#[from] PlotError),
}

/// Key of a fit row and its `(β, β low, β high, c, R², n)`.
type FitMap = BTreeMap<(String, String, String, String, String), (f64, f64, f64, f64, f64, i64)>;

fn read_fits(dir: &Path) -> Result<FitMap, CompareError> {
    let path = dir.join("fit.parquet");
    let mut out = FitMap::new();
    if !path.is_file() {
        return Ok(out);
    }
    let t = Table::read(&path)?;
    if t.rows() == 0 {
        return Ok(out);
    }
    let s = |c: &str| t.strs(c);
    let f = |c: &str| t.f64s(c);
    let (enc, var, group, pool, src) = (
        s("encoding")?,
        s("variant")?,
        s("group")?,
        s("pooling")?,
        s("width_source")?,
    );
    let (b, lo, hi, c, r2) = (
        f("beta")?,
        f("beta_ci_low")?,
        f("beta_ci_high")?,
        f("c")?,
        f("r2")?,
    );
    let n = t.i64s("n")?;
    let g = |v: &[Option<f64>], i: usize| v[i].unwrap_or(f64::NAN);
    let txt = |v: &[Option<String>], i: usize| v[i].clone().unwrap_or_default();
    for i in 0..t.rows() {
        out.insert(
            (
                txt(&enc, i),
                txt(&var, i),
                txt(&group, i),
                txt(&pool, i),
                txt(&src, i),
            ),
            (
                g(&b, i),
                g(&lo, i),
                g(&hi, i),
                g(&c, i),
                g(&r2, i),
                n[i].unwrap_or(0),
            ),
        );
    }
    Ok(out)
}

/// Per (task or variant, encoding): `[runs, accuracy, loss, θ_eff positional, steps, run s]`,
/// means over the finished runs (runs and seconds summed).
type Metrics = BTreeMap<(String, String), [f64; 6]>;

fn read_metrics(dir: &Path) -> Result<Metrics, CompareError> {
    let path = dir.join("runs.parquet");
    let mut out = Metrics::new();
    if !path.is_file() {
        return Ok(out);
    }
    let t = Table::read_selected(&path)?;
    let n = t.rows();
    let strs = |c: &str| -> Result<Vec<Option<String>>, PlotError> {
        if t.has(c) {
            t.strs(c)
        } else {
            Ok(vec![None; n])
        }
    };
    let floats = |c: &str| -> Result<Vec<Option<f64>>, PlotError> {
        if t.has(c) {
            t.f64s(c)
        } else {
            Ok(vec![None; n])
        }
    };
    let (status, task, variant, enc) = (
        strs("status")?,
        strs("task")?,
        strs("variant")?,
        strs("encoding")?,
    );
    let (acc, ans, loss, theta, wall) = (
        floats("final_eval_accuracy")?,
        floats("answer_accuracy")?,
        floats("final_eval_loss")?,
        floats("effective_freq_positional")?,
        floats("wall_time_s")?,
    );
    let steps = if t.has("steps_done") {
        t.i64s("steps_done")?
    } else {
        vec![None; n]
    };
    let mut sums: BTreeMap<(String, String), ([f64; 6], [usize; 6])> = BTreeMap::new();
    for i in 0..n {
        if status[i].as_deref() != Some("done") {
            continue;
        }
        let what = variant[i]
            .clone()
            .or_else(|| task[i].clone())
            .unwrap_or_default();
        let e = sums
            .entry((what, enc[i].clone().unwrap_or_default()))
            .or_insert(([0.0; 6], [0; 6]));
        let vals = [
            Some(1.0),
            ans[i].or(acc[i]),
            loss[i],
            theta[i],
            steps[i].map(|s| s as f64),
            wall[i],
        ];
        for (k, v) in vals.into_iter().enumerate() {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                e.0[k] += v;
                e.1[k] += 1;
            }
        }
    }
    for (k, (s, c)) in sums {
        let mean = |j: usize| {
            if c[j] > 0 {
                s[j] / c[j] as f64
            } else {
                f64::NAN
            }
        };
        out.insert(k, [s[0], mean(1), mean(2), mean(3), mean(4), s[5]]);
    }
    Ok(out)
}

fn num(v: f64, digits: usize) -> String {
    if v.is_nan() {
        "–".to_string()
    } else {
        format!("{v:.digits$}")
    }
}

/// ` (selected on validation: k of n runs)` when the folder's run table marks a selection
/// (docs/analysis-rules.md R58), else empty.
fn selection_note(dir: &Path) -> String {
    let Ok(t) = Table::read(&dir.join("runs.parquet")) else {
        return String::new();
    };
    let Ok(kept) = Table::read_selected(&dir.join("runs.parquet")) else {
        return String::new();
    };
    if kept.rows() == t.rows() {
        return String::new();
    }
    format!(
        " (selected on validation: {} of {} runs)",
        kept.rows(),
        t.rows()
    )
}

/// The comparison of results folders `a` and `b` as printable tables (fits, then metrics); a
/// row present in only one folder shows `–` on the other side.
///
/// # Errors
/// A folder with neither table, a table that cannot be read.
pub fn compare_text(a: &Path, b: &Path) -> Result<String, CompareError> {
    for d in [a, b] {
        if !d.join("runs.parquet").is_file() && !d.join("fit.parquet").is_file() {
            return Err(CompareError::NoTables(d.display().to_string()));
        }
    }
    let (fa, fb) = (read_fits(a)?, read_fits(b)?);
    let mut s = format!(
        "A = {}{}\nB = {}{}\n",
        a.display(),
        selection_note(a),
        b.display(),
        selection_note(b)
    );
    if !fa.is_empty() || !fb.is_empty() {
        s.push_str("\nfits (ln θ_eff = ln c − β ln W; the law: β = 1, c = π)\n");
        let _ = writeln!(
            s,
            "{:<6} {:<8} {:<12} {:<10} {:<9} {:>24} {:>24} {:>7} {:>13} {:>13} {:>9}",
            "enc",
            "variant",
            "pooling",
            "W from",
            "group",
            "β A [CI]",
            "β B [CI]",
            "Δβ",
            "c A / B",
            "R² A / B",
            "n A / B"
        );
        let keys: std::collections::BTreeSet<_> = fa.keys().chain(fb.keys()).cloned().collect();
        let mut keys: Vec<_> = keys.into_iter().collect();
        keys.sort_by_key(|k| (k.3 != "positional", k.4 != "dep_width", k.clone()));
        for k in keys {
            let (x, y) = (fa.get(&k), fb.get(&k));
            let beta = |f: Option<&(f64, f64, f64, f64, f64, i64)>| {
                f.map_or("–".into(), |f| {
                    format!("{:.3} [{:.3}, {:.3}]", f.0, f.1, f.2)
                })
            };
            let pair = |g: &dyn Fn(&(f64, f64, f64, f64, f64, i64)) -> String| {
                format!("{} / {}", x.map_or("–".into(), g), y.map_or("–".into(), g))
            };
            let d = match (x, y) {
                (Some(x), Some(y)) => format!("{:+.3}", y.0 - x.0),
                _ => "–".into(),
            };
            let _ = writeln!(
                s,
                "{:<6} {:<8} {:<12} {:<10} {:<9} {:>24} {:>24} {:>7} {:>13} {:>13} {:>9}",
                k.0,
                k.1,
                k.3,
                k.4,
                if k.2.is_empty() || k.2 == format!("{}/{}", k.0, k.1) {
                    "–"
                } else {
                    &k.2
                },
                beta(x),
                beta(y),
                d,
                pair(&|f| format!("{:.2}", f.3)),
                pair(&|f| format!("{:.2}", f.4)),
                pair(&|f| f.5.to_string()),
            );
        }
    }
    let (ma, mb) = (read_metrics(a)?, read_metrics(b)?);
    if !ma.is_empty() || !mb.is_empty() {
        s.push_str("\nfinished runs (means over runs; accuracy is the answer accuracy where the task has one)\n");
        let _ = writeln!(
            s,
            "{:<10} {:<8} {:>9} {:>15} {:>15} {:>17} {:>13} {:>15}",
            "task",
            "enc",
            "runs A/B",
            "acc A / B",
            "loss A / B",
            "θ_eff pos A / B",
            "steps A / B",
            "run min A / B"
        );
        let keys: std::collections::BTreeSet<_> = ma.keys().chain(mb.keys()).cloned().collect();
        for k in keys {
            let (x, y) = (ma.get(&k), mb.get(&k));
            let pair = |j: usize, d: usize, scale: f64| {
                format!(
                    "{} / {}",
                    x.map_or("–".into(), |m| num(m[j] / scale, d)),
                    y.map_or("–".into(), |m| num(m[j] / scale, d))
                )
            };
            let _ = writeln!(
                s,
                "{:<10} {:<8} {:>9} {:>15} {:>15} {:>17} {:>13} {:>15}",
                k.0,
                k.1,
                pair(0, 0, 1.0),
                pair(1, 3, 1.0),
                pair(2, 3, 1.0),
                pair(3, 4, 1.0),
                pair(4, 0, 1.0),
                pair(5, 1, 60.0),
            );
        }
    }
    Ok(s.trim_end().to_string())
}
