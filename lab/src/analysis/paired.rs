//! Paired comparisons of encodings over seeds (docs/analysis-rules.md R58; SCIENCE.md §9).
//!
//! Runs are compared within one **setting**: the config without the encoding and its
//! parameters, the seed, `lr` and the selection's axes (which may differ per encoding). In a
//! setting, encoding `B` is compared with the reference `A` (`rope` if present, else the first
//! encoding in plan order) on the seeds both have: `d_s = m(B, s) − m(A, s)`, its mean `d̄`
//! and the 95 % interval `d̄ ± t_{0.975, n−1} · sd(d) / √n` (Student's t over the `n ≥ 2`
//! paired seeds). The difference is **within noise** when the interval covers 0. The seeds a
//! difference of size `|d̄|` needs at 80 % power are the smallest `n` with
//! `n ≥ ((t_{0.975,n−1} + t_{0.8,n−1}) · sd / |d̄|)²`.

use std::collections::BTreeMap;

use statrs::distribution::{ContinuousCDF, StudentsT};

use super::select::{flatten_config, group_by_rest, is_axis};

/// The `q` quantile of Student's t with `df` degrees of freedom (`df ≥ 1`, `q ∈ (0, 1)`).
pub fn t_quantile(q: f64, df: f64) -> f64 {
    StudentsT::new(0.0, 1.0, df).expect("df > 0").inverse_cdf(q)
}

/// One paired difference `B − A` of a metric over seeds.
#[derive(Clone, Debug, PartialEq)]
pub struct PairedDiff {
    /// Seeds both encodings have, ascending.
    pub seeds: Vec<i64>,
    /// Mean of `A`'s metric over those seeds.
    pub mean_a: f64,
    /// Mean difference `d̄`.
    pub mean: f64,
    /// Sample standard deviation of the differences (`None` with one seed).
    pub sd: Option<f64>,
    /// 95 % interval `(lo, hi)` (`None` with one seed).
    pub interval: Option<(f64, f64)>,
}

impl PairedDiff {
    /// `d_s = b[s] − a[s]` over the seeds of both maps.
    pub fn of(a: &BTreeMap<i64, f64>, b: &BTreeMap<i64, f64>) -> Option<Self> {
        let seeds: Vec<i64> = a.keys().filter(|s| b.contains_key(s)).copied().collect();
        if seeds.is_empty() {
            return None;
        }
        let n = seeds.len() as f64;
        let d: Vec<f64> = seeds.iter().map(|s| b[s] - a[s]).collect();
        let mean = d.iter().sum::<f64>() / n;
        let mean_a = seeds.iter().map(|s| a[s]).sum::<f64>() / n;
        let (sd, interval) = if seeds.len() > 1 {
            let sd = (d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
            let half = t_quantile(0.975, n - 1.0) * sd / n.sqrt();
            (Some(sd), Some((mean - half, mean + half)))
        } else {
            (None, None)
        };
        Some(Self {
            seeds,
            mean_a,
            mean,
            sd,
            interval,
        })
    }

    /// Whether the interval covers 0 (`None` with one seed: no interval).
    pub fn within_noise(&self) -> Option<bool> {
        self.interval.map(|(lo, hi)| lo <= 0.0 && 0.0 <= hi)
    }

    /// Seeds a difference of this size needs at 80 % power and 95 % two-sided confidence, for
    /// the measured sd (`None` with one seed, a zero difference or a zero sd).
    pub fn seeds_needed(&self) -> Option<usize> {
        let sd = self.sd?;
        let delta = self.mean.abs();
        if delta == 0.0 || sd == 0.0 || !sd.is_finite() {
            return None;
        }
        (2..=100_000usize).find(|&n| {
            let df = n as f64 - 1.0;
            let need = ((t_quantile(0.975, df) + t_quantile(0.8, df)) * sd / delta).powi(2);
            n as f64 >= need
        })
    }
}

/// One finished, selected run as the comparison sees it.
#[derive(Clone, Debug)]
pub struct RunMetrics {
    /// The run's config, flattened ([`flatten_config`]).
    pub fields: BTreeMap<String, String>,
    /// Encoding name.
    pub encoding: String,
    /// Seed.
    pub seed: i64,
    /// `(metric name, value)`: test NLL (`final_eval_loss`), accuracy (`final_eval_accuracy`,
    /// or iGSM's `answer_accuracy`).
    pub metrics: Vec<(&'static str, Option<f64>)>,
}

impl RunMetrics {
    /// From a run's config JSON and its metrics.
    pub fn new(
        config: &serde_json::Value,
        metrics: Vec<(&'static str, Option<f64>)>,
    ) -> Option<Self> {
        let fields = flatten_config(config);
        let encoding = fields.get("encoding.kind")?.trim_matches('"').to_string();
        let seed = fields.get("seed")?.parse().ok()?;
        Some(Self {
            fields,
            encoding,
            seed,
            metrics,
        })
    }
}

/// Whether flat key `k` is left out of the pairing key (R58): the encoding and its parameters,
/// the seed, `lr`, the selection's axes.
fn unpaired(k: &str, select_over: &[String]) -> bool {
    k.starts_with("encoding.") || k == "seed" || k == "lr" || is_axis(k, select_over)
}

/// The summary's paired section: per setting and metric, every encoding against the
/// reference; empty when no setting has two encodings.
pub fn summary_lines(runs: &[RunMetrics], select_over: &[String]) -> String {
    let fields: Vec<&BTreeMap<String, String>> = runs.iter().map(|r| &r.fields).collect();
    let groups = group_by_rest(&fields, &|k| unpaired(k, select_over));
    let mut s = String::new();
    for (label, members) in groups {
        let mut encodings: Vec<&str> = Vec::new();
        for &i in &members {
            if !encodings.contains(&runs[i].encoding.as_str()) {
                encodings.push(&runs[i].encoding);
            }
        }
        if encodings.len() < 2 {
            continue;
        }
        let reference = if encodings.contains(&"rope") {
            "rope"
        } else {
            encodings[0]
        };
        let metric_names: Vec<&'static str> =
            runs[members[0]].metrics.iter().map(|(n, _)| *n).collect();
        for (mi, name) in metric_names.iter().enumerate() {
            let per_enc = |enc: &str| -> BTreeMap<i64, f64> {
                members
                    .iter()
                    .map(|&i| &runs[i])
                    .filter(|r| r.encoding == enc)
                    .filter_map(|r| r.metrics.get(mi).and_then(|m| m.1).map(|v| (r.seed, v)))
                    .collect()
            };
            let a = per_enc(reference);
            for enc in encodings.iter().filter(|e| **e != reference) {
                let Some(d) = PairedDiff::of(&a, &per_enc(enc)) else {
                    continue;
                };
                if s.is_empty() {
                    s.push_str("\nPaired differences over seeds (B − A, the same seeds; 95 % t interval; docs/analysis-rules.md R58)\n");
                }
                let setting = if label.is_empty() { "all" } else { &label };
                let rel = if d.mean_a != 0.0 {
                    format!(" ({:+.1} %)", 100.0 * d.mean / d.mean_a)
                } else {
                    String::new()
                };
                let tail = match (d.interval, d.within_noise()) {
                    (Some((lo, hi)), Some(noise)) => format!(
                        " [{lo:+.4}, {hi:+.4}], n = {}: {}{}",
                        d.seeds.len(),
                        if noise {
                            "within noise".to_string()
                        } else if d.mean < 0.0 {
                            format!("{enc} lower")
                        } else {
                            format!("{enc} higher")
                        },
                        d.seeds_needed()
                            .map(|n| format!("; this size needs {n} seeds at 80 % power"))
                            .unwrap_or_default()
                    ),
                    _ => " (1 seed: no interval)".to_string(),
                };
                s.push_str(&format!(
                    "  {setting}  {name}: {enc} − {reference} = {:+.4}{rel}{tail}\n",
                    d.mean
                ));
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_quantiles_match_the_tables() {
        // Student's t tables: t_{0.975, 2} = 4.303, t_{0.975, 10} = 2.228, t_{0.8, 2} = 1.061.
        assert!((t_quantile(0.975, 2.0) - 4.3027).abs() < 1e-3);
        assert!((t_quantile(0.975, 10.0) - 2.2281).abs() < 1e-3);
        assert!((t_quantile(0.8, 2.0) - 1.0607).abs() < 1e-3);
    }

    #[test]
    fn a_paired_interval_by_hand() {
        // d = 0.1, 0.2, 0.3: mean 0.2, sd 0.1, half-width 4.3027 · 0.1 / √3 = 0.24841.
        let a = BTreeMap::from([(0, 1.0), (1, 2.0), (2, 3.0), (7, 9.0)]);
        let b = BTreeMap::from([(0, 1.1), (1, 2.2), (2, 3.3)]);
        let d = PairedDiff::of(&a, &b).unwrap();
        assert_eq!(d.seeds, vec![0, 1, 2]);
        assert!((d.mean - 0.2).abs() < 1e-12);
        assert!((d.sd.unwrap() - 0.1).abs() < 1e-12);
        let (lo, hi) = d.interval.unwrap();
        assert!((lo - (0.2 - 0.248414)).abs() < 1e-5, "{lo}");
        assert!((hi - (0.2 + 0.248414)).abs() < 1e-5, "{hi}");
        assert_eq!(d.within_noise(), Some(true));
        // (t.975 + t.8)·sd/δ squared: at n = 4, (3.182 + 0.978)·0.5 = 2.08 → 4.33 > 4; at
        // n = 5, (2.776 + 0.941)·0.5 = 1.86 → 3.45 ≤ 5.
        assert_eq!(d.seeds_needed(), Some(5));
        // A clear difference is not within noise; one seed has no interval.
        let b = BTreeMap::from([(0, 2.0), (1, 3.01), (2, 3.99)]);
        assert_eq!(PairedDiff::of(&a, &b).unwrap().within_noise(), Some(false));
        let one = PairedDiff::of(&a, &BTreeMap::from([(0, 1.5)])).unwrap();
        assert_eq!((one.interval, one.within_noise()), (None, None));
        assert!(PairedDiff::of(&a, &BTreeMap::from([(5, 1.0)])).is_none());
    }

    #[test]
    fn encodings_are_paired_within_a_setting_whatever_their_lr() {
        let run = |enc: &str, corpus: &str, seed: i64, lr: f64, loss: f64| {
            RunMetrics::new(
                &serde_json::json!({"encoding": {"kind": enc}, "task": {"corpus": corpus},
                                     "seed": seed, "lr": lr}),
                vec![("test NLL", Some(loss))],
            )
            .unwrap()
        };
        let runs = vec![
            run("rope", "ecoli", 0, 0.003, 1.30),
            run("rope", "ecoli", 1, 0.003, 1.32),
            run("pope", "ecoli", 0, 0.01, 1.20),
            run("pope", "ecoli", 1, 0.01, 1.23),
            run("rope", "chorales", 0, 0.003, 0.60),
        ];
        let text = summary_lines(&runs, &[]);
        // d = −0.10, −0.09: mean −0.095, sd 0.00707, half 12.706 · 0.00707 / √2 = 0.0635.
        assert!(
            text.contains("  corpus=ecoli  test NLL: pope − rope = -0.0950 (-7.3 %) [-0.1585, -0.0315], n = 2: pope lower"),
            "{text}"
        );
        assert!(!text.contains("chorales"), "one encoding only: {text}");
    }
}
