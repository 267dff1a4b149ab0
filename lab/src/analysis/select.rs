//! Selection on validation (docs/analysis-rules.md R58; SCIENCE.md §9 "each encoding at its
//! best"): a sweep or preset declares `[select] over = ["lr"], by = "val_loss"`, and for every
//! combination of the other settings the finished run with the best validation metric is the
//! *selected* one; the folder's tables, fits, figures, report and compare use the selected runs
//! only, and `runs.parquet` marks each run's `selected`.
//!
//! A **group** is the set of runs whose configs agree on every field but the selection's axes
//! (so one group per encoding × task setting × seed × other axis). Within a group the run with
//! the lowest `val_loss` (or highest `val_accuracy`) wins; a failed run is the worst candidate;
//! a tie keeps the first in the plan's order. A group with a run not finished, or finished
//! without the metric (runs older than the validation split), selects nothing and says why.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// What a validation metric is, and which way is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SelectBy {
    /// `val_loss` (nats per scored token on the validation split): lowest wins.
    ValLoss,
    /// `val_accuracy` (token accuracy on the validation split): highest wins.
    ValAccuracy,
}

impl SelectBy {
    /// The `runs.parquet` column it reads.
    pub fn column(self) -> &'static str {
        match self {
            SelectBy::ValLoss => "val_loss",
            SelectBy::ValAccuracy => "val_accuracy",
        }
    }

    /// Whether `a` is strictly better than `b`.
    fn better(self, a: f64, b: f64) -> bool {
        match self {
            SelectBy::ValLoss => a < b,
            SelectBy::ValAccuracy => a > b,
        }
    }
}

fn default_by() -> SelectBy {
    SelectBy::ValLoss
}

/// A sweep's or preset's `[select]` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selection {
    /// The axes chosen on (config field names, e.g. `lr`); each must vary in the plan.
    pub over: Vec<String>,
    /// The validation metric (default `val_loss`).
    #[serde(default = "default_by")]
    pub by: SelectBy,
}

impl Selection {
    /// `over lr by val_loss`.
    pub fn describe(&self) -> String {
        format!("over {} by {}", self.over.join(", "), self.by.column())
    }
}

/// One planned run as a candidate of a selection.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Run id.
    pub id: String,
    /// Its config flattened to `(key, value)` pairs (`encoding.kind`, `task.corpus`, `lr`, …;
    /// [`flatten_config`]).
    pub fields: BTreeMap<String, String>,
    /// `None`: not finished; `Some(None)`: failed, or finished without the metric;
    /// `Some(Some(m))`: finished with metric `m`.
    pub metric: Option<Option<f64>>,
    /// Whether it finished with status `failed`.
    pub failed: bool,
}

/// What one group chose.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// The settings the group's runs share, as `key=value` words that tell groups apart.
    pub label: String,
    /// Per candidate in plan order: its values of the selection's axes (`lr=0.003`), its metric
    /// (`None`: failed or missing), its id.
    pub candidates: Vec<(String, Option<f64>, String)>,
    /// The selected run's id, or why none is.
    pub chosen: Result<String, String>,
    /// Axes whose chosen value is the lowest or highest tried in the group (the grid may need
    /// widening, R58).
    pub at_edge: Vec<String>,
}

/// A config as flat `key → value` text: nested tables joined with `.` (`encoding.kind`,
/// `encoding.tapa_rho`, `task.corpus`), values as compact JSON.
pub fn flatten_config(value: &serde_json::Value) -> BTreeMap<String, String> {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, x, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk("", value, &mut out);
    out
}

/// The last segment of a flat key (`encoding.tapa_rho` → `tapa_rho`), except that
/// `encoding.kind` and `task.kind` are named `encoding` and `task`.
fn short(key: &str) -> &str {
    match key {
        "encoding.kind" => "encoding",
        "task.kind" => "task",
        k => k.rsplit('.').next().unwrap_or(k),
    }
}

/// Whether flat key `key` is one of `axes` (matched on its last segment, so `tapa_rho` names
/// `encoding.tapa_rho`).
pub fn is_axis(key: &str, axes: &[String]) -> bool {
    axes.iter().any(|a| a == key || a == short(key))
}

/// Group `items` (flat fields each) by their fields outside `drop`; returns, per group in
/// order of first appearance, its label (the `key=value` words that differ between groups)
/// and the indices of its items.
pub fn group_by_rest(
    items: &[&BTreeMap<String, String>],
    drop: &dyn Fn(&str) -> bool,
) -> Vec<(String, Vec<usize>)> {
    let key_of = |f: &BTreeMap<String, String>| -> Vec<(String, String)> {
        f.iter()
            .filter(|(k, _)| !drop(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let mut order: Vec<Vec<(String, String)>> = Vec::new();
    let mut members: Vec<Vec<usize>> = Vec::new();
    for (i, f) in items.iter().enumerate() {
        let k = key_of(f);
        match order.iter().position(|o| *o == k) {
            Some(g) => members[g].push(i),
            None => {
                order.push(k);
                members.push(vec![i]);
            }
        }
    }
    // The keys whose values differ between groups make the labels: over the union of every
    // group's keys, since a config leaves some keys out at their defaults (TAPA's phase scale
    // and gain), and a key absent from one group but set in another tells them apart. An
    // encoding's own parameter (`encoding.<name>`) is compared between groups of the same
    // encoding only: RoPE has no `pope_delta_init`, and that does not set it apart from PoPE.
    fn value<'a>(o: &'a [(String, String)], k: &str) -> Option<&'a str> {
        o.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str())
    }
    let mut all_keys: Vec<&String> = order
        .iter()
        .flat_map(|o| o.iter().map(|(k, _)| k))
        .collect();
    all_keys.sort();
    all_keys.dedup();
    let varying: Vec<&String> = all_keys
        .into_iter()
        .filter(|k| {
            let own = k.starts_with("encoding.") && k.as_str() != "encoding.kind";
            order.iter().enumerate().any(|(i, a)| {
                order[i + 1..].iter().any(|b| {
                    (!own || value(a, "encoding.kind") == value(b, "encoding.kind"))
                        && value(a, k) != value(b, k)
                })
            })
        })
        .collect();
    order
        .iter()
        .zip(members)
        .map(|(o, m)| {
            let label = varying
                .iter()
                .filter_map(|k| o.iter().find(|(x, _)| x == *k))
                .map(|(k, v)| format!("{}={}", short(k), v.trim_matches('"')))
                .collect::<Vec<_>>()
                .join(" ");
            (label, m)
        })
        .collect()
}

/// Choose within each group of `cands` (in plan order) by `sel` (R58).
pub fn choose(sel: &Selection, cands: &[Candidate]) -> Vec<Choice> {
    let fields: Vec<&BTreeMap<String, String>> = cands.iter().map(|c| &c.fields).collect();
    let groups = group_by_rest(&fields, &|k| is_axis(k, &sel.over));
    groups
        .into_iter()
        .map(|(label, members)| {
            let axis_values = |c: &Candidate| -> Vec<(String, String)> {
                c.fields
                    .iter()
                    .filter(|(k, _)| is_axis(k, &sel.over))
                    .map(|(k, v)| (short(k).to_string(), v.trim_matches('"').to_string()))
                    .collect()
            };
            let words = |c: &Candidate| {
                axis_values(c)
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let rows: Vec<(String, Option<f64>, String)> = members
                .iter()
                .map(|&i| (words(&cands[i]), cands[i].metric.flatten(), cands[i].id.clone()))
                .collect();
            let unfinished: Vec<&Candidate> = members
                .iter()
                .map(|&i| &cands[i])
                .filter(|c| c.metric.is_none())
                .collect();
            let without: Vec<&Candidate> = members
                .iter()
                .map(|&i| &cands[i])
                .filter(|c| !c.failed && c.metric == Some(None))
                .collect();
            let chosen = if let Some(c) = unfinished.first() {
                Err(format!(
                    "{} of its {} run(s) not finished (e.g. {} {})",
                    unfinished.len(),
                    members.len(),
                    c.id,
                    words(c)
                ))
            } else if let Some(c) = without.first() {
                Err(format!(
                    "run {} ({}) has no {} (finished before the validation split existed): run it again in a new folder",
                    c.id,
                    words(c),
                    sel.by.column()
                ))
            } else {
                let mut best: Option<(usize, f64)> = None;
                for &i in &members {
                    if let Some(Some(m)) = cands[i].metric
                        && m.is_finite()
                        && best.is_none_or(|(_, b)| sel.by.better(m, b))
                    {
                        best = Some((i, m));
                    }
                }
                best.map(|(i, _)| cands[i].id.clone())
                    .ok_or_else(|| format!("every one of its {} run(s) failed", members.len()))
            };
            let mut at_edge = Vec::new();
            if let Ok(id) = &chosen {
                let winner = members.iter().map(|&i| &cands[i]).find(|c| &c.id == id);
                if let Some(w) = winner {
                    for (axis, value) in axis_values(w) {
                        let tried: Vec<f64> = members
                            .iter()
                            .filter_map(|&i| {
                                axis_values(&cands[i])
                                    .into_iter()
                                    .find(|(k, _)| *k == axis)
                                    .and_then(|(_, v)| v.parse::<f64>().ok())
                            })
                            .collect();
                        let (Ok(v), true) = (value.parse::<f64>(), tried.len() > 1) else {
                            continue;
                        };
                        let lo = tried.iter().cloned().fold(f64::INFINITY, f64::min);
                        let hi = tried.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        if lo < hi && (v == lo || v == hi) {
                            at_edge.push(format!(
                                "{axis}={value} is the {} tried",
                                if v == lo { "lowest" } else { "highest" }
                            ));
                        }
                    }
                }
            }
            Choice {
                label,
                candidates: rows,
                chosen,
                at_edge,
            }
        })
        .collect()
}

/// The candidates of `ids` (plan order) in `out_dir`: each run's `config.json` and, when
/// finished, its `runs.parquet` (status and the metric `sel.by`). A run without a
/// `config.json` (never started) is unfinished with no fields but its id.
pub fn candidates(
    out_dir: &Path,
    ids: &[String],
    sel: &Selection,
) -> Result<Vec<Candidate>, crate::store::ResultsError> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let dir = out_dir.join("runs").join(id);
        let fields = std::fs::read_to_string(dir.join("config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .map(|v| flatten_config(&v))
            .unwrap_or_else(|| BTreeMap::from([("run_id".to_string(), id.clone())]));
        let runs = dir.join("runs.parquet");
        let (metric, failed) = if runs.is_file() {
            let (_, batches) = crate::store::read_parquet(&runs)?;
            let b = batches.first();
            let status = b
                .and_then(|b| crate::store::column::strings(b, "status").first().cloned())
                .flatten();
            let m = b
                .and_then(|b| {
                    crate::store::column::floats(b, sel.by.column())
                        .first()
                        .copied()
                })
                .flatten();
            let failed = status.as_deref() != Some("done");
            (Some(if failed { None } else { m }), failed)
        } else {
            (None, false)
        };
        out.push(Candidate {
            id: id.clone(),
            fields,
            metric,
            failed,
        });
    }
    Ok(out)
}

/// The summary's selection section: per group, each candidate's validation metric with the
/// chosen one marked `*`, and the groups that chose nothing or chose at an edge.
pub fn summary_lines(sel: &Selection, choices: &[Choice]) -> String {
    let mut s = format!(
        "\nSelection on validation ({}; docs/analysis-rules.md R58): the tables, fits and figures use the selected runs (* below); the numbers they report are test numbers\n",
        sel.describe()
    );
    for c in choices {
        let cells = c
            .candidates
            .iter()
            .map(|(words, m, id)| {
                let mark = if c.chosen.as_ref().is_ok_and(|x| x == id) {
                    "*"
                } else {
                    ""
                };
                match m {
                    Some(m) => format!("{words}: {m:.4}{mark}"),
                    None => format!("{words}: –"),
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        let label = if c.label.is_empty() { "all" } else { &c.label };
        s.push_str(&format!("  {label}: {cells}"));
        match &c.chosen {
            Err(why) => s.push_str(&format!("  (no selection: {why})")),
            Ok(_) if !c.at_edge.is_empty() => s.push_str(&format!(
                "  (at the edge: {}; widen the grid)",
                c.at_edge.join(", ")
            )),
            Ok(_) => {}
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: &str, enc: &str, seed: u32, lr: f64, m: Option<Option<f64>>) -> Candidate {
        let v = serde_json::json!({"encoding": {"kind": enc}, "seed": seed, "lr": lr, "steps": 10});
        Candidate {
            id: id.to_string(),
            fields: flatten_config(&v),
            metric: m,
            failed: m == Some(None),
        }
    }

    fn lr() -> Selection {
        Selection {
            over: vec!["lr".into()],
            by: SelectBy::ValLoss,
        }
    }

    #[test]
    fn the_lowest_validation_loss_of_each_group_wins() {
        let c = vec![
            cand("a", "rope", 0, 0.001, Some(Some(0.70))),
            cand("b", "rope", 0, 0.003, Some(Some(0.60))),
            cand("c", "rope", 0, 0.01, Some(Some(0.65))),
            cand("d", "tapa", 0, 0.001, Some(Some(0.90))),
            cand("e", "tapa", 0, 0.003, Some(Some(0.99))),
            // Diverged: the worst candidate, not a blocker.
            cand("f", "tapa", 0, 0.01, Some(None)),
        ];
        let ch = choose(&lr(), &c);
        assert_eq!(ch.len(), 2);
        assert_eq!(ch[0].label, "encoding=rope");
        assert_eq!(ch[0].chosen, Ok("b".to_string()));
        assert!(ch[0].at_edge.is_empty());
        assert_eq!(ch[1].chosen, Ok("d".to_string()));
        assert_eq!(
            ch[1].at_edge,
            vec!["lr=0.001 is the lowest tried".to_string()]
        );
        let text = summary_lines(&lr(), &ch);
        assert!(
            text.contains("  encoding=tapa: lr=0.001: 0.9000*, lr=0.003: 0.9900, lr=0.01: –  (at the edge: lr=0.001 is the lowest tried; widen the grid)"),
            "{text}"
        );
        // By accuracy the highest wins; a tie keeps the first in plan order.
        let acc = Selection {
            by: SelectBy::ValAccuracy,
            ..lr()
        };
        let c = vec![
            cand("a", "rope", 0, 0.001, Some(Some(0.5))),
            cand("b", "rope", 0, 0.003, Some(Some(0.8))),
            cand("c", "rope", 0, 0.01, Some(Some(0.8))),
        ];
        assert_eq!(choose(&acc, &c)[0].chosen, Ok("b".to_string()));
    }

    #[test]
    fn seeds_are_their_own_groups_and_incomplete_groups_choose_nothing() {
        let c = vec![
            cand("a", "rope", 0, 0.001, Some(Some(0.7))),
            cand("b", "rope", 0, 0.003, Some(Some(0.6))),
            cand("c", "rope", 1, 0.001, Some(Some(0.5))),
            cand("d", "rope", 1, 0.003, None),
        ];
        let ch = choose(&lr(), &c);
        assert_eq!(ch.len(), 2);
        assert_eq!(ch[0].label, "seed=0");
        assert_eq!(ch[0].chosen, Ok("b".to_string()));
        assert_eq!(
            ch[1].chosen,
            Err("1 of its 2 run(s) not finished (e.g. d lr=0.003)".to_string())
        );
        // A finished run without the metric (an older run) blocks its group, named.
        let mut old = cand("e", "rope", 1, 0.003, Some(None));
        old.failed = false;
        let ch = choose(&lr(), &[c[2].clone(), old]);
        assert_eq!(
            ch[0].chosen,
            Err("run e (lr=0.003) has no val_loss (finished before the validation split existed): run it again in a new folder".to_string())
        );
    }

    /// A key the first group leaves out (a parameter at its default, not serialised) still
    /// labels the groups that set it (before: the labels read only the first group's keys, and
    /// R59's three TAPA groups at ρ = 0.5, α = 0.1 all printed alike).
    #[test]
    fn a_key_absent_from_the_first_group_still_labels() {
        let mk = |id: &str, rho: f64, init_scale: Option<f64>| {
            let mut v =
                serde_json::json!({"encoding": {"kind": "tapa", "tapa_rho": rho}, "lr": 0.001});
            if let Some(s) = init_scale {
                v["encoding"]["tapa_phase_init_scale"] = serde_json::json!(s);
            }
            Candidate {
                id: id.to_string(),
                fields: flatten_config(&v),
                metric: Some(Some(1.0)),
                failed: false,
            }
        };
        let c = vec![
            mk("a", 0.25, None),
            mk("b", 0.5, Some(10.0)),
            mk("c", 0.5, Some(100.0)),
        ];
        let labels: Vec<String> = choose(&lr(), &c).into_iter().map(|ch| ch.label).collect();
        assert_eq!(
            labels,
            vec![
                "tapa_rho=0.25".to_string(),
                "tapa_phase_init_scale=10.0 tapa_rho=0.5".to_string(),
                "tapa_phase_init_scale=100.0 tapa_rho=0.5".to_string(),
            ]
        );
        // Another encoding's groups lack TAPA's keys: that alone labels nothing.
        let rope = |id: &str, lr: f64| Candidate {
            id: id.to_string(),
            fields: flatten_config(&serde_json::json!({"encoding": {"kind": "rope"}, "lr": lr})),
            metric: Some(Some(1.0)),
            failed: false,
        };
        let c = vec![rope("r", 0.001), mk("b", 0.5, Some(10.0))];
        let labels: Vec<String> = choose(&lr(), &c).into_iter().map(|ch| ch.label).collect();
        assert_eq!(
            labels,
            vec!["encoding=rope".to_string(), "encoding=tapa".to_string()]
        );
    }

    #[test]
    fn nested_parameters_are_axes_by_their_name() {
        let v = serde_json::json!({"encoding": {"kind": "tapa", "tapa_rho": 0.5}, "lr": 0.1});
        let f = flatten_config(&v);
        assert_eq!(f.get("encoding.tapa_rho").map(String::as_str), Some("0.5"));
        assert_eq!(f.get("encoding.kind").map(String::as_str), Some("\"tapa\""));
        assert!(is_axis("encoding.tapa_rho", &["tapa_rho".to_string()]));
        assert!(!is_axis("encoding.kind", &["tapa_rho".to_string()]));
        assert!(is_axis("encoding.kind", &["encoding".to_string()]));
    }
}
