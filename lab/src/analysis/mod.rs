//! The frequency law θ* ∝ 1/W (Wu, Liu, Jadbabaie 2026, arXiv 2607.07678; SCIENCE.md §5):
//! ordinary least squares of `ln θ_eff = ln c − β ln W`, with bootstrap intervals over seeds.
//!
//! The reference is `θ* = π/W` (`β = 1`, `c = π`): the highest frequency whose unambiguous
//! field `θ·r ∈ [0, π]` still covers the dependency width. Paper 3 reports `c ≈ 3.02`.

pub mod bands;
pub mod paired;
pub mod select;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What tells a run's fit group apart besides its encoding and variant: the settings a sweep may
/// vary (sweeps/base-vs-width.toml) and the encoding options a run sets. The sweep's `fit` table
/// and the law figure label groups from it the same way ([`setting_labels`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunSetting {
    /// RoPE base.
    pub rope_base: f64,
    /// Training context length, tokens.
    pub seq_len: i64,
    /// RoPE pair layout.
    pub pair_layout: String,
    /// p-RoPE's `rope_p`, when the run sets it.
    pub rope_p: Option<f64>,
    /// Partial rotary's `rotary_dim`, when the run sets it.
    pub rotary_dim: Option<i64>,
    /// Hybrid layers' `nope_every`, when the run sets it.
    pub nope_every: Option<i64>,
    /// Transformer layers (0 when the table does not say).
    pub n_layers: i64,
}

/// The setting part of each run's group label: ` base=…`, ` L=…`, the pair layout and
/// ` layers=…` when the runs take more than one value of it (runs of models of different depth are
/// never fitted together), then the encoding options the run sets (` rope_p=…`,
/// ` rotary_dim=…`, ` nope_every=…`); empty when nothing applies. E.g. `rope/copy` +
/// ` base=100 L=512`.
pub fn setting_labels(settings: &[RunSetting]) -> Vec<String> {
    let varies = |f: &dyn Fn(&RunSetting) -> String| {
        let values: std::collections::BTreeSet<String> = settings.iter().map(f).collect();
        values.len() > 1
    };
    let by_base = varies(&|r| format!("{}", r.rope_base));
    let by_len = varies(&|r| r.seq_len.to_string());
    let by_layout = varies(&|r| r.pair_layout.clone());
    let by_layers = varies(&|r| r.n_layers.to_string());
    settings
        .iter()
        .map(|r| {
            let mut s = String::new();
            if by_base {
                s.push_str(&format!(" base={}", r.rope_base));
            }
            if by_len {
                s.push_str(&format!(" L={}", r.seq_len));
            }
            if by_layout {
                s.push_str(&format!(" {}", r.pair_layout));
            }
            if by_layers {
                s.push_str(&format!(" layers={}", r.n_layers));
            }
            let options = [
                r.rope_p.map(|v| format!(" rope_p={v}")),
                r.rotary_dim.map(|v| format!(" rotary_dim={v}")),
                r.nope_every.map(|v| format!(" nope_every={v}")),
            ];
            s.extend(options.into_iter().flatten());
            s
        })
        .collect()
}

/// One run's contribution to a fit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FitPoint {
    /// Dependency width `W` in tokens.
    pub width: f64,
    /// Effective frequency θ_eff in radians per token.
    pub theta: f64,
    /// Seed of the run (the bootstrap resamples seeds).
    pub seed: u64,
}

/// OLS fit of `ln θ = ln c − β ln W`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogLogFit {
    /// Exponent β (1 for the π/W law).
    pub beta: f64,
    /// Constant c in radians (π for the π/W law).
    pub c: f64,
    /// Coefficient of determination of the log-log regression.
    pub r2: f64,
}

/// The fit plus 95 % bootstrap percentile intervals.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LawFit {
    /// Point estimate on all runs.
    pub fit: LogLogFit,
    /// 2.5 % and 97.5 % percentiles of β over bootstrap replicates.
    pub beta_ci: (f64, f64),
    /// Same for c.
    pub c_ci: (f64, f64),
    /// Number of runs.
    pub n: usize,
    /// Number of distinct seeds.
    pub n_seeds: usize,
    /// Bootstrap replicates used (degenerate replicates with < 2 distinct widths are redrawn).
    pub n_boot: usize,
    /// `seeds` when whole seeds were resampled (≥ 2 seeds), `runs` when single runs were.
    pub resample: &'static str,
}

/// OLS on `(ln W, ln θ)`. `None` with fewer than two distinct widths or a non-positive value.
pub fn fit_loglog(points: &[FitPoint]) -> Option<LogLogFit> {
    if points
        .iter()
        .any(|p| !(p.width > 0.0 && p.theta > 0.0 && p.theta.is_finite()))
    {
        return None;
    }
    let n = points.len() as f64;
    let xs: Vec<f64> = points.iter().map(|p| p.width.ln()).collect();
    let ys: Vec<f64> = points.iter().map(|p| p.theta.ln()).collect();
    let mx = xs.iter().sum::<f64>() / n;
    let my = ys.iter().sum::<f64>() / n;
    let sxx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
    if sxx <= 1e-12 {
        return None;
    }
    let sxy: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let slope = sxy / sxx;
    let intercept = my - slope * mx;
    let ss_res: f64 = xs
        .iter()
        .zip(&ys)
        .map(|(x, y)| (y - intercept - slope * x).powi(2))
        .sum();
    let ss_tot: f64 = ys.iter().map(|y| (y - my).powi(2)).sum();
    let r2 = if ss_tot > 0.0 {
        1.0 - ss_res / ss_tot
    } else {
        1.0
    };
    Some(LogLogFit {
        beta: -slope,
        c: intercept.exp(),
        r2,
    })
}

/// Fit with a bootstrap: with ≥ 2 seeds, whole seeds are resampled with replacement (each
/// replicate keeps every run of a drawn seed: a cluster bootstrap, since runs sharing a seed
/// share data); with one seed, runs are resampled. Percentile intervals, `n_boot` replicates,
/// deterministic given `rng_seed`.
pub fn fit_law(points: &[FitPoint], n_boot: usize, rng_seed: u64) -> Option<LawFit> {
    let fit = fit_loglog(points)?;
    let mut seeds: Vec<u64> = points.iter().map(|p| p.seed).collect();
    seeds.sort_unstable();
    seeds.dedup();
    let replicates = bootstrap_fits(points, n_boot, rng_seed);
    let mut betas: Vec<f64> = replicates.iter().map(|f| f.beta).collect();
    let mut cs: Vec<f64> = replicates.iter().map(|f| f.c).collect();
    Some(LawFit {
        fit,
        beta_ci: percentile_interval(&mut betas),
        c_ci: percentile_interval(&mut cs),
        n: points.len(),
        n_seeds: seeds.len(),
        n_boot: betas.len(),
        resample: if seeds.len() >= 2 { "seeds" } else { "runs" },
    })
}

/// The bootstrap replicates behind [`fit_law`]'s intervals (same resampling, same order for the
/// same `rng_seed`): up to `n_boot` fits, degenerate draws (< 2 distinct widths) redrawn, at most
/// `20 · n_boot` draws. `lab plot` uses them for the pointwise band around the fitted line.
pub fn bootstrap_fits(points: &[FitPoint], n_boot: usize, rng_seed: u64) -> Vec<LogLogFit> {
    let mut seeds: Vec<u64> = points.iter().map(|p| p.seed).collect();
    seeds.sort_unstable();
    seeds.dedup();
    let mut rng = ChaCha8Rng::seed_from_u64(rng_seed);
    let by_seed = seeds.len() >= 2;
    let mut fits = Vec::with_capacity(n_boot);
    let mut attempts = 0;
    while fits.len() < n_boot && attempts < n_boot * 20 {
        attempts += 1;
        let sample: Vec<FitPoint> = if by_seed {
            (0..seeds.len())
                .flat_map(|_| {
                    let s = seeds[rng.random_range(0..seeds.len())];
                    points.iter().filter(move |p| p.seed == s).copied()
                })
                .collect()
        } else {
            (0..points.len())
                .map(|_| points[rng.random_range(0..points.len())])
                .collect()
        };
        if let Some(f) = fit_loglog(&sample) {
            fits.push(f);
        }
    }
    fits
}

/// `(q2.5, q97.5)` by linear interpolation between order statistics; NaN when empty.
pub fn percentile_interval(xs: &mut [f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    (quantile_sorted(xs, 0.025), quantile_sorted(xs, 0.975))
}

/// Quantile `q ∈ [0, 1]` of sorted data, linear interpolation (NumPy's default).
pub fn quantile_sorted(xs: &[f64], q: f64) -> f64 {
    let pos = q * (xs.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    xs[lo] + (xs[hi] - xs[lo]) * (pos - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setting_labels_name_what_varies_and_the_options() {
        let base = RunSetting {
            rope_base: 100.0,
            seq_len: 128,
            pair_layout: "adjacent".into(),
            ..RunSetting::default()
        };
        let other = RunSetting {
            rope_base: 1e6,
            rope_p: Some(0.25),
            ..base.clone()
        };
        assert_eq!(
            setting_labels(&[base.clone(), other]),
            [" base=100", " base=1000000 rope_p=0.25"]
        );
        assert_eq!(setting_labels(&[base.clone(), base.clone()]), ["", ""]);
        let shallow = RunSetting {
            n_layers: 1,
            ..base.clone()
        };
        let deep = RunSetting {
            n_layers: 2,
            ..base
        };
        assert_eq!(setting_labels(&[shallow, deep]), [" layers=1", " layers=2"]);
    }

    #[test]
    fn exact_law_is_recovered() {
        let pts: Vec<FitPoint> = [4.0, 8.0, 16.0, 32.0]
            .iter()
            .map(|&w| FitPoint {
                width: w,
                theta: std::f64::consts::PI / w,
                seed: 0,
            })
            .collect();
        let f = fit_loglog(&pts).unwrap();
        assert!((f.beta - 1.0).abs() < 1e-12);
        assert!((f.c - std::f64::consts::PI).abs() < 1e-12);
        assert!((f.r2 - 1.0).abs() < 1e-12);
    }

    #[test]
    fn hand_computed_regression() {
        // Points (ln W, ln θ) = (0, 0), (1, −2), (2, −2): mean x = 1, mean y = −4/3,
        // Sxx = 2, Sxy = (−1)(4/3) + 0 + (1)(−2/3) = −2 → slope −1 (β = 1), intercept −1/3.
        let e = std::f64::consts::E;
        let pts =
            [(1.0, 1.0), (e, (-2.0f64).exp()), (e * e, (-2.0f64).exp())].map(|(w, t)| FitPoint {
                width: w,
                theta: t,
                seed: 0,
            });
        let f = fit_loglog(&pts).unwrap();
        assert!((f.beta - 1.0).abs() < 1e-12);
        assert!((f.c - (-1.0f64 / 3.0).exp()).abs() < 1e-12);
        // residuals: 1/3, −2/3, 1/3 → SSres = 2/3; SStot = 16/9+4/9+4/9 = 24/9 → R² = 0.75.
        assert!((f.r2 - 0.75).abs() < 1e-12);
    }

    #[test]
    fn degenerate_inputs_give_none() {
        let p = FitPoint {
            width: 8.0,
            theta: 0.3,
            seed: 0,
        };
        assert!(fit_loglog(&[p, p]).is_none());
        assert!(
            fit_loglog(&[
                p,
                FitPoint {
                    width: 16.0,
                    theta: 0.0,
                    seed: 0
                }
            ])
            .is_none()
        );
    }

    /// Seeded statistical check: noisy data around θ = 3/W; the bootstrap interval is
    /// reproducible and covers the truth.
    #[test]
    fn bootstrap_interval_covers_truth() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut pts = Vec::new();
        for seed in 0..5u64 {
            for w in [4.0, 8.0, 16.0, 32.0, 64.0] {
                let noise: f64 = rng.random_range(-0.1..0.1);
                pts.push(FitPoint {
                    width: w,
                    theta: 3.0 / w * noise.exp(),
                    seed,
                });
            }
        }
        let a = fit_law(&pts, 500, 42).unwrap();
        let b = fit_law(&pts, 500, 42).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.resample, "seeds");
        assert_eq!(a.n_boot, 500);
        assert!(a.beta_ci.0 < 1.0 && 1.0 < a.beta_ci.1, "{:?}", a.beta_ci);
        assert!(a.c_ci.0 < 3.0 && 3.0 < a.c_ci.1, "{:?}", a.c_ci);
        assert!(a.beta_ci.1 - a.beta_ci.0 < 0.1);
    }

    #[test]
    fn quantiles_interpolate() {
        let xs = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(quantile_sorted(&xs, 0.5), 3.0);
        assert_eq!(quantile_sorted(&xs, 0.25), 2.0);
        assert!((quantile_sorted(&xs, 0.1) - 1.4).abs() < 1e-12);
    }
}
