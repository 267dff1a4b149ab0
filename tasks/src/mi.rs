//! Mutual-information profiles: what the data needs (SCIENCE.md section 4).
//!
//! For a token sequence `x` and a lag `r`, `I(r) = I(x_t ; x_{t+r})` is estimated from the joint
//! counts of the `n_r = N − r` pairs `(x_t, x_{t+r})`, for `r = 1..=R`, in **nats**.
//!
//! ```
//! use tasks::mi::{MiConfig, profile_stream};
//! // a period-2 sequence: x_{t+r} is a function of x_t at every lag
//! let x: Vec<u32> = (0..1000).map(|t| (t % 2) as u32).collect();
//! let p = profile_stream(&x, &MiConfig { max_lag: 4, ..MiConfig::default() })?;
//! assert!((p.plug_in[0] - std::f64::consts::LN_2).abs() < 1e-5); // 500 vs 499 ones: not exactly ln 2
//! assert!(p.significant.iter().all(|&s| s));
//! # Ok::<(), tasks::TaskError>(())
//! ```
//!
//! # Estimators
//!
//! With `c_i` the counts of one table (marginal of `x_t`, marginal of `x_{t+r}`, or joint) over
//! `n` pairs, `m` its number of non-empty cells, and `I = H(X) + H(Y) − H(X, Y)`:
//! - **plug-in**: `H = ln n − (1/n) Σ c_i ln c_i`;
//! - **Miller–Madow** (Miller 1955): `H_MM = H_plug-in + (m − 1)/(2n)`, so
//!   `I_MM = I_plug-in + (m_x + m_y − m_xy − 1)/(2n)` (the default);
//! - **Grassberger** (Grassberger 2003, arXiv physics/0307138, eq. 35):
//!   `H_G = ln n − (1/n) Σ c_i G(c_i)` with
//!   `G(c) = ψ(c) + ½ (−1)^c (ψ((c+1)/2) − ψ(c/2))` (ψ = digamma; `G(1) = −γ − ln 2`,
//!   `G(2) = 2 − γ − ln 2`, `G(2k+1) = G(2k)`, `G(2k+2) = G(2k) + 2/(2k+1)`).
//!
//! # Shuffled baseline and significance
//!
//! The sequence is permuted uniformly at random (`n_shuffles` seeded permutations) and the
//! estimators are evaluated at the lags `1..=shuffle_lags` of each permuted copy. For a permuted
//! sequence every lag has the same null distribution, up to the number of pairs: under
//! independence `2 n I_plug-in` is asymptotically χ² with `(m_x − 1)(m_y − 1)` degrees of
//! freedom whatever the lag (the G-test), so the null samples are pooled in units of `2 n_r I`
//! and converted back with each lag's own `n_r`. A scaled χ² `a·χ²_ν` is fitted to the pooled
//! plug-in statistic by its mean and variance, and the band's upper edge is its quantile at
//! `1 − α / R` (a Bonferroni bound over the `R` lags tested), so that on independent data the
//! chance of *any* lag being called significant is about `α`. A lag is **significant** when its
//! plug-in statistic exceeds that edge; the edge is reported in the configured estimator's units
//! (shifted by the lag's own bias correction), so `significant ⇔ mutual_info > shuffle_hi`. The
//! reported baseline mean is the configured estimator's mean over the shuffles.
//!
//! # Width, decay and collapse
//!
//! The null is that of an i.i.d. sequence. For a strongly autocorrelated sequence the sampling
//! noise of `I(r)` at lags beyond its true decay is larger than the i.i.d. null's (Bartlett's
//! formula: the variance of a sample autocorrelation grows by `Σ_k ρ(k)²`-type terms, e.g.
//! ×4.6 for an AR(1) with ρ = 0.8), and correlated across neighbouring lags, so isolated runs of
//! far lags can pass the band; [`MiProfile::max_significant_lag`] is then an upper bound, while
//! the width `W` (at least 10 % of the peak) is not affected.
//!
//! - [`MiProfile::max_significant_lag`]: the largest significant lag (`None` if none is).
//! - [`MiProfile::dep_width`] `W`: with `I_max` the largest estimate among significant lags,
//!   start at the first significant lag `r₀` whose estimate is at least `½ I_max` and walk up
//!   while the lags stay significant and at least `width_frac · I_max` (default 0.1); `W` is the
//!   last lag of that run. For a profile that decays from lag 1 this is the lag where it falls
//!   below 10 % of its peak; for the block `copy` task (a single peak at `B`, nothing at
//!   `B ± 1`) it is `B` even though the periodic copies also carry information at `2B, 3B, …`;
//!   for `recall` (a plateau on `2..=B`) it is `B`.
//! - [`fit_decay`]: least squares of `ln I(r)` on `ln r` (power law `I ∝ r^(−α)`) and on `r`
//!   (exponential `I ∝ e^(−r/ℓ)`) over the first contiguous run of significant lags
//!   ([`main_run`]; isolated later lags are left out), where `I > 0`; the model with the larger
//!   R² (in `ln I`) is reported.
//! - [`collapse_error`]: the self-similarity check across granularities (see its docs).
//!
//! # Cost
//!
//! One pass over the `n_r` pairs per lag, lags in parallel with rayon. Vocabularies of at most
//! [`DENSE_MAX_VOCAB`] symbols use a dense `V × V` count table (fits in L2 for bytes); larger ones
//! an open-addressing hash table of the pairs.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use statrs::distribution::{ContinuousCDF, Normal};

use crate::{Example, TaskError};

/// Largest vocabulary (distinct symbols after remapping) counted with a dense `V × V` table.
pub const DENSE_MAX_VOCAB: usize = 2048;

/// Vocabularies up to this size count stream pairs into 4 interleaved copies of the dense table
/// (breaks the store-to-load dependency on repeated cells; 4 × 128² cells fit in L2).
const INTERLEAVE_MAX_VOCAB: usize = 128;

/// Which entropy estimator the mutual information is built from (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Estimator {
    /// Maximum-likelihood (plug-in) entropies.
    PlugIn,
    /// Plug-in plus the Miller–Madow bias correction `(m − 1)/(2n)`.
    MillerMadow,
    /// Grassberger's (2003) digamma-based estimator.
    Grassberger,
}

impl Estimator {
    /// The name used in tables and on the command line: `plug-in`, `miller-madow`, `grassberger`.
    pub fn name(self) -> &'static str {
        match self {
            Estimator::PlugIn => "plug-in",
            Estimator::MillerMadow => "miller-madow",
            Estimator::Grassberger => "grassberger",
        }
    }

    /// Parse [`Estimator::name`].
    ///
    /// # Errors
    /// [`TaskError::Invalid`] on `estimator` for any other string.
    pub fn parse(s: &str) -> Result<Self, TaskError> {
        match s {
            "plug-in" => Ok(Estimator::PlugIn),
            "miller-madow" => Ok(Estimator::MillerMadow),
            "grassberger" => Ok(Estimator::Grassberger),
            _ => Err(TaskError::Invalid {
                field: "estimator",
                message: format!("`{s}` is not one of plug-in, miller-madow, grassberger"),
            }),
        }
    }
}

/// Settings of an MI profile.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MiConfig {
    /// Largest lag `R` (tokens); lags `1..=R` are estimated. At least 1 and below the number of
    /// tokens.
    pub max_lag: usize,
    /// Entropy estimator (default Miller–Madow).
    pub estimator: Estimator,
    /// Number of seeded permutations for the shuffled baseline (default 8; at least 1).
    pub n_shuffles: usize,
    /// Lags `1..=shuffle_lags` evaluated on each permuted copy (default 4; at least 1).
    pub shuffle_lags: usize,
    /// Family-wise false-positive rate of the significance test over the `R` lags (default 0.01),
    /// in `(0, 1)`.
    pub alpha: f64,
    /// Fraction of the peak MI that bounds the dependency width `W` (default 0.1), in `(0, 1)`.
    pub width_frac: f64,
    /// Seed of the permutations.
    pub seed: u64,
}

impl Default for MiConfig {
    fn default() -> Self {
        MiConfig {
            max_lag: 64,
            estimator: Estimator::MillerMadow,
            n_shuffles: 8,
            shuffle_lags: 4,
            alpha: 0.01,
            width_frac: 0.1,
            seed: 0,
        }
    }
}

impl MiConfig {
    /// Check the fields against a sequence of `n_tokens` tokens.
    ///
    /// # Errors
    /// [`TaskError::OutOfRange`] naming the first bad field.
    pub fn validate(&self, n_tokens: usize) -> Result<(), TaskError> {
        if self.max_lag < 1 || self.max_lag >= n_tokens.max(1) {
            return Err(TaskError::out_of_range(
                "max_lag",
                self.max_lag,
                format!("1..={} (number of tokens − 1)", n_tokens.saturating_sub(1)),
            ));
        }
        if self.n_shuffles < 1 {
            return Err(TaskError::out_of_range(
                "n_shuffles",
                self.n_shuffles,
                "1..",
            ));
        }
        if self.shuffle_lags < 1 || self.shuffle_lags > self.max_lag {
            return Err(TaskError::out_of_range(
                "shuffle_lags",
                self.shuffle_lags,
                format!("1..={} (max_lag)", self.max_lag),
            ));
        }
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            return Err(TaskError::out_of_range("alpha", self.alpha, "(0, 1)"));
        }
        if !(self.width_frac > 0.0 && self.width_frac < 1.0) {
            return Err(TaskError::out_of_range(
                "width_frac",
                self.width_frac,
                "(0, 1)",
            ));
        }
        Ok(())
    }

    /// The band's tail probability `α / max_lag` expressed as `z = Φ⁻¹(1 − α / max_lag)`.
    pub fn band_z(&self) -> f64 {
        let normal = Normal::standard();
        normal.inverse_cdf(1.0 - self.alpha / self.max_lag as f64)
    }
}

/// Which decay law fits a profile better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecayModel {
    /// `I(r) ∝ r^(−α)`.
    Power,
    /// `I(r) ∝ e^(−r/ℓ)`.
    Exp,
    /// Fewer than 3 usable lags: no fit.
    None,
}

impl DecayModel {
    /// `power`, `exp` or `none`.
    pub fn name(self) -> &'static str {
        match self {
            DecayModel::Power => "power",
            DecayModel::Exp => "exp",
            DecayModel::None => "none",
        }
    }
}

/// JSON writes non-finite floats as `null`; read them back as NaN.
fn f64_or_nan<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(<Option<f64> as serde::Deserialize>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Result of [`fit_decay`].
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DecayFit {
    /// The model with the larger R² (`None` with fewer than 3 points).
    pub model: DecayModel,
    /// Power-law exponent α of `I ∝ r^(−α)` (NaN without a fit).
    #[serde(deserialize_with = "f64_or_nan")]
    pub exponent: f64,
    /// Exponential decay length ℓ of `I ∝ e^(−r/ℓ)`, tokens (NaN without a fit; infinite if the
    /// fitted slope is not negative).
    #[serde(deserialize_with = "f64_or_nan")]
    pub length: f64,
    /// R² of the power-law fit in `ln I`.
    #[serde(deserialize_with = "f64_or_nan")]
    pub r2_power: f64,
    /// R² of the exponential fit in `ln I`.
    #[serde(deserialize_with = "f64_or_nan")]
    pub r2_exp: f64,
    /// Number of lags in the fit.
    pub n_points: usize,
}

/// An MI profile `I(r)`, `r = 1..=max_lag` (index `r − 1`), with its baseline and summary.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MiProfile {
    /// Estimator used for [`MiProfile::mutual_info`].
    pub estimator: Estimator,
    /// Number of distinct symbols in the data.
    pub vocab_size: usize,
    /// Number of tokens (stream) or scored targets (examples).
    pub n_tokens: usize,
    /// Lags `1..=max_lag`.
    pub lags: Vec<usize>,
    /// Pairs counted at each lag.
    pub n_pairs: Vec<u64>,
    /// Corrected estimate (the configured estimator), nats.
    pub mutual_info: Vec<f64>,
    /// Plug-in estimate, nats.
    pub plug_in: Vec<f64>,
    /// Mean of the shuffled baseline at each lag, nats.
    pub shuffle_mean: Vec<f64>,
    /// Upper edge of the shuffled band at each lag (quantile `1 − α/R` of the fitted null), nats.
    pub shuffle_hi: Vec<f64>,
    /// `mutual_info > shuffle_hi`.
    pub significant: Vec<bool>,
    /// Largest significant lag.
    pub max_significant_lag: Option<usize>,
    /// Dependency width `W` (see the [module docs](self)).
    pub dep_width: Option<usize>,
    /// Power law vs exponential fit over the significant lags.
    pub decay: DecayFit,
    /// The band's tail probability `α/R` as a standard-normal `z = Φ⁻¹(1 − α/R)`.
    pub band_z: f64,
}

/// Per-lag count summary: everything the estimators need.
#[derive(Clone, Copy, Debug, Default)]
struct LagStats {
    n: u64,
    /// (Σ c ln c, Σ c G(c), m) for X, Y and XY.
    x: TableStats,
    y: TableStats,
    xy: TableStats,
}

#[derive(Clone, Copy, Debug, Default)]
struct TableStats {
    c_ln_c: f64,
    c_g_c: f64,
    m: u64,
}

impl TableStats {
    fn add(&mut self, c: u32, grassberger: bool) {
        if c > 0 {
            let cf = c as f64;
            self.c_ln_c += cf * cf.ln();
            if grassberger {
                self.c_g_c += cf * grassberger_g(c as u64);
            }
            self.m += 1;
        }
    }
}

impl LagStats {
    fn plug_in(&self) -> f64 {
        let n = self.n as f64;
        let h = |t: &TableStats| n.ln() - t.c_ln_c / n;
        h(&self.x) + h(&self.y) - h(&self.xy)
    }

    fn estimate(&self, est: Estimator) -> f64 {
        let n = self.n as f64;
        match est {
            Estimator::PlugIn => self.plug_in(),
            Estimator::MillerMadow => {
                self.plug_in()
                    + (self.x.m as f64 + self.y.m as f64 - self.xy.m as f64 - 1.0) / (2.0 * n)
            }
            Estimator::Grassberger => {
                let h = |t: &TableStats| n.ln() - t.c_g_c / n;
                h(&self.x) + h(&self.y) - h(&self.xy)
            }
        }
    }
}

/// Grassberger's `G(c) = ψ(c) + ½ (−1)^c (ψ((c+1)/2) − ψ(c/2))` (Grassberger 2003, eq. 35).
pub fn grassberger_g(c: u64) -> f64 {
    use statrs::function::gamma::digamma;
    let cf = c as f64;
    let sign = if c.is_multiple_of(2) { 1.0 } else { -1.0 };
    digamma(cf) + 0.5 * sign * (digamma((cf + 1.0) / 2.0) - digamma(cf / 2.0))
}

/// Closed-form `I(r)` (nats) of the stationary two-state Markov chain that flips its state with
/// probability `p` at each step: `x_{t+r} = x_t` with probability `q = (1 + (1 − 2p)^r)/2`
/// (the correlation of the ±1 chain is `(1 − 2p)^r`), so `I(r) = ln 2 + q ln q + (1 − q) ln(1 − q)`.
pub fn markov_two_state_mi(p: f64, r: usize) -> f64 {
    let q = 0.5 * (1.0 + (1.0 - 2.0 * p).powi(r as i32));
    let xlx = |v: f64| if v > 0.0 { v * v.ln() } else { 0.0 };
    std::f64::consts::LN_2 + xlx(q) + xlx(1.0 - q)
}

/// Remap token ids to dense ids `0..V` (in order of first appearance); returns `(ids, V)`.
pub fn densify(tokens: &[u32]) -> (Vec<u32>, usize) {
    let mut map = std::collections::HashMap::<u32, u32>::new();
    let ids = tokens
        .iter()
        .map(|&t| {
            let next = map.len() as u32;
            *map.entry(t).or_insert(next)
        })
        .collect();
    (ids, map.len())
}

/// A reusable joint-count table: dense `V × V` or open addressing.
enum Counter {
    Dense {
        v: usize,
        cells: Vec<u32>,
    },
    Hash {
        keys: Vec<u64>,
        counts: Vec<u32>,
        mask: usize,
    },
}

impl Counter {
    fn new(v: usize, max_pairs: usize) -> Self {
        if v <= DENSE_MAX_VOCAB {
            let copies = if v <= INTERLEAVE_MAX_VOCAB { 4 } else { 1 };
            Counter::Dense {
                v,
                cells: vec![0; copies * v * v],
            }
        } else {
            let cap = (2 * max_pairs.min(v.saturating_mul(v)))
                .next_power_of_two()
                .max(16);
            Counter::Hash {
                keys: vec![0; cap],
                counts: vec![0; cap],
                mask: cap - 1,
            }
        }
    }

    /// Count the pairs `(a[i], b[i])` and return the joint table's stats, leaving the table empty.
    fn joint(&mut self, pairs: impl Iterator<Item = (u32, u32)>, grassberger: bool) -> TableStats {
        let mut st = TableStats::default();
        match self {
            Counter::Dense { v, cells } => {
                let v = *v;
                for (a, b) in pairs {
                    cells[a as usize * v + b as usize] += 1;
                }
                for c in cells[..v * v].iter_mut() {
                    st.add(*c, grassberger);
                    *c = 0;
                }
            }
            Counter::Hash { keys, counts, mask } => {
                let mask = *mask;
                for (a, b) in pairs {
                    let key = ((a as u64) << 32 | b as u64) + 1;
                    let mut i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) as usize & mask;
                    loop {
                        let k = keys[i];
                        if k == key {
                            counts[i] += 1;
                            break;
                        }
                        if k == 0 {
                            keys[i] = key;
                            counts[i] = 1;
                            break;
                        }
                        i = (i + 1) & mask;
                    }
                }
                for (k, c) in keys.iter_mut().zip(counts.iter_mut()) {
                    if *k != 0 {
                        st.add(*c, grassberger);
                        *k = 0;
                        *c = 0;
                    }
                }
            }
        }
        st
    }
}

impl Counter {
    /// [`Counter::joint`] of the pairs `(a[i], b[i])`, with the dense table's interleaved copies
    /// when it has them.
    fn joint_slices(&mut self, a: &[u32], b: &[u32], grassberger: bool) -> TableStats {
        match self {
            Counter::Dense { v, cells } if cells.len() == 4 * *v * *v => {
                let v = *v;
                let vv = v * v;
                let (c01, c23) = cells.split_at_mut(2 * vv);
                let (c0, c1) = c01.split_at_mut(vv);
                let (c2, c3) = c23.split_at_mut(vv);
                let n = a.len().min(b.len());
                let n4 = n - n % 4;
                for (ac, bc) in a[..n4].chunks_exact(4).zip(b[..n4].chunks_exact(4)) {
                    c0[ac[0] as usize * v + bc[0] as usize] += 1;
                    c1[ac[1] as usize * v + bc[1] as usize] += 1;
                    c2[ac[2] as usize * v + bc[2] as usize] += 1;
                    c3[ac[3] as usize * v + bc[3] as usize] += 1;
                }
                for i in n4..n {
                    c0[a[i] as usize * v + b[i] as usize] += 1;
                }
                let mut st = TableStats::default();
                for i in 0..vv {
                    st.add(c0[i] + c1[i] + c2[i] + c3[i], grassberger);
                    c0[i] = 0;
                    c1[i] = 0;
                    c2[i] = 0;
                    c3[i] = 0;
                }
                st
            }
            _ => self.joint(a.iter().copied().zip(b.iter().copied()), grassberger),
        }
    }
}

fn marginal_stats(counts: &[u32], grassberger: bool) -> TableStats {
    let mut st = TableStats::default();
    for &c in counts {
        st.add(c, grassberger);
    }
    st
}

/// Per-lag statistics of a dense stream `x` (ids `< v`) at lags `lags`, in parallel.
fn stream_lag_stats(x: &[u32], v: usize, lags: &[usize], grassberger: bool) -> Vec<LagStats> {
    let mut full = vec![0u32; v];
    for &t in x {
        full[t as usize] += 1;
    }
    let n_tok = x.len();
    lags.par_iter()
        .map_init(
            || (Counter::new(v, n_tok), vec![0u32; v]),
            |(counter, marg), &r| {
                let n = n_tok - r;
                // X = x[0..n]: all tokens but the last r; Y = x[r..]: all but the first r.
                marg.copy_from_slice(&full);
                for &t in &x[n..] {
                    marg[t as usize] -= 1;
                }
                let sx = marginal_stats(marg, grassberger);
                marg.copy_from_slice(&full);
                for &t in &x[..r] {
                    marg[t as usize] -= 1;
                }
                let sy = marginal_stats(marg, grassberger);
                let sxy = counter.joint_slices(&x[..n], &x[r..], grassberger);
                LagStats {
                    n: n as u64,
                    x: sx,
                    y: sy,
                    xy: sxy,
                }
            },
        )
        .collect()
}

/// Null samples of one shuffled copy at one lag, in units of `2 n I`: the plug-in statistic
/// and the configured estimator.
#[derive(Clone, Copy, Debug)]
struct NullSample {
    plug_in: f64,
    estimate: f64,
}

impl NullSample {
    fn of(s: &LagStats, est: Estimator) -> Self {
        let two_n = 2.0 * s.n as f64;
        NullSample {
            plug_in: two_n * s.plug_in(),
            estimate: two_n * s.estimate(est),
        }
    }
}

/// Upper quantile `1 − tail` of the pooled null of `2 n I_plug-in`, by fitting a scaled χ²
/// (`a·χ²_ν`, moments matched: `ν = 2 mean² / var`, `a = var / (2 mean)`). Under independence
/// `2 n I_plug-in` is asymptotically χ² with `(m_x − 1)(m_y − 1)` degrees of freedom (the
/// G-test); the scale `a` absorbs dependence between pairs.
fn null_quantile(samples: &[NullSample], tail: f64) -> f64 {
    use statrs::distribution::ChiSquared;
    let k = samples.len() as f64;
    let mean = samples.iter().map(|s| s.plug_in).sum::<f64>() / k;
    let var = if samples.len() > 1 {
        samples
            .iter()
            .map(|s| (s.plug_in - mean).powi(2))
            .sum::<f64>()
            / (k - 1.0)
    } else {
        0.0
    };
    if !(mean > 0.0 && var > 0.0) {
        return mean.max(0.0);
    }
    let nu = 2.0 * mean * mean / var;
    let a = var / (2.0 * mean);
    match ChiSquared::new(nu) {
        Ok(chi) => a * chi.inverse_cdf(1.0 - tail),
        Err(_) => mean,
    }
}

fn finish(
    cfg: &MiConfig,
    vocab_size: usize,
    n_tokens: usize,
    stats: &[LagStats],
    null: &[NullSample],
) -> MiProfile {
    let lags: Vec<usize> = (1..=cfg.max_lag).collect();
    let n_pairs: Vec<u64> = stats.iter().map(|s| s.n).collect();
    let mutual_info: Vec<f64> = stats.iter().map(|s| s.estimate(cfg.estimator)).collect();
    let plug_in: Vec<f64> = stats.iter().map(|s| s.plug_in()).collect();
    let z = cfg.band_z();
    let hi_2n = null_quantile(null, cfg.alpha / cfg.max_lag as f64);
    let mean_2n = null.iter().map(|s| s.estimate).sum::<f64>() / null.len().max(1) as f64;
    let shuffle_mean: Vec<f64> = n_pairs
        .iter()
        .map(|&n| mean_2n / (2.0 * n as f64))
        .collect();
    // the test is on the plug-in statistic; the edge is shifted by each lag's own correction so
    // that `mutual_info > shuffle_hi` ⇔ `plug_in > hi`
    let shuffle_hi: Vec<f64> = n_pairs
        .iter()
        .zip(mutual_info.iter().zip(&plug_in))
        .map(|(&n, (i, p))| hi_2n / (2.0 * n as f64) + (i - p))
        .collect();
    let significant: Vec<bool> = mutual_info
        .iter()
        .zip(&shuffle_hi)
        .map(|(i, hi)| i > hi)
        .collect();
    let max_significant_lag = significant.iter().rposition(|&s| s).map(|i| i + 1);
    let dep_width = dependency_width(&mutual_info, &significant, cfg.width_frac);
    let run = main_run(&significant);
    let (fl, fi): (Vec<f64>, Vec<f64>) = lags[run.clone()]
        .iter()
        .zip(&mutual_info[run])
        .filter(|(_, i)| **i > 0.0)
        .map(|(&r, &i)| (r as f64, i))
        .unzip();
    let decay = fit_decay(&fl, &fi);
    MiProfile {
        estimator: cfg.estimator,
        vocab_size,
        n_tokens,
        lags,
        n_pairs,
        mutual_info,
        plug_in,
        shuffle_mean,
        shuffle_hi,
        significant,
        max_significant_lag,
        dep_width,
        decay,
        band_z: z,
    }
}

/// Index range (`r − 1`) of the first contiguous run of significant lags (empty if none).
pub fn main_run(significant: &[bool]) -> std::ops::Range<usize> {
    match significant.iter().position(|&s| s) {
        None => 0..0,
        Some(a) => {
            let len = significant[a..].iter().take_while(|&&s| s).count();
            a..a + len
        }
    }
}

/// Dependency width `W` from a profile (index `r − 1`); see the [module docs](self).
pub fn dependency_width(
    mutual_info: &[f64],
    significant: &[bool],
    width_frac: f64,
) -> Option<usize> {
    let peak = mutual_info
        .iter()
        .zip(significant)
        .filter(|(_, s)| **s)
        .map(|(i, _)| *i)
        .fold(f64::NEG_INFINITY, f64::max);
    if !peak.is_finite() || peak <= 0.0 {
        return None;
    }
    let start = (0..mutual_info.len()).find(|&i| significant[i] && mutual_info[i] >= 0.5 * peak)?;
    let mut end = start;
    while end + 1 < mutual_info.len()
        && significant[end + 1]
        && mutual_info[end + 1] >= width_frac * peak
    {
        end += 1;
    }
    Some(end + 1)
}

/// MI profile of a token stream `tokens` (any ids; remapped internally).
///
/// Pairs `(x_t, x_{t+r})`, `t = 0..N−r`. Deterministic for a fixed `cfg.seed`.
///
/// # Errors
/// [`TaskError`] from [`MiConfig::validate`].
pub fn profile_stream(tokens: &[u32], cfg: &MiConfig) -> Result<MiProfile, TaskError> {
    cfg.validate(tokens.len())?;
    let (x, v) = densify(tokens);
    let g = cfg.estimator == Estimator::Grassberger;
    let lags: Vec<usize> = (1..=cfg.max_lag).collect();
    let stats = stream_lag_stats(&x, v, &lags, g);
    let null_lags: Vec<usize> = (1..=cfg.shuffle_lags).collect();
    let mut null = Vec::with_capacity(cfg.n_shuffles * cfg.shuffle_lags);
    for k in 0..cfg.n_shuffles {
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        rng.set_stream(k as u64);
        let mut xs = x.clone();
        xs.shuffle(&mut rng);
        for s in stream_lag_stats(&xs, v, &null_lags, g) {
            null.push(NullSample::of(&s, cfg.estimator));
        }
    }
    Ok(finish(cfg, v, tokens.len(), &stats, &null))
}

/// MI profile of a task, seen the way the model sees it: at lag `r`, the pairs
/// `(input[t + 1 − r], target[t])` over every scored position `t` (mask true) of every example
/// with `t + 1 − r ≥ 0`. For next-token targets (`target[t] = x[t+1]`) lag `r` is the distance
/// in the underlying sequence, as in [`profile_stream`]; for tasks whose targets are not the next
/// token (block `recall`) this is where the dependency lives (see `tasks::block`).
///
/// The shuffled baseline pairs each example's targets with the inputs of another example (one
/// seeded permutation of the examples per shuffle), which breaks every input–target dependence
/// but keeps the dependence *between pairs* inside a sequence: in a periodic sequence (block
/// `copy`) the same pair repeats every period, which inflates the estimator's variance, and a
/// baseline built from independently shuffled tokens would call such lags significant. If the
/// examples differ in length, the input tokens are shuffled across all examples and positions.
///
/// # Errors
/// [`TaskError`] from [`MiConfig::validate`] (against the examples' length), or
/// [`TaskError::Invalid`] on `examples` if they are empty or have no scored position.
pub fn profile_examples(examples: &[Example], cfg: &MiConfig) -> Result<MiProfile, TaskError> {
    let seq_len = examples.iter().map(|e| e.input.len()).max().unwrap_or(0);
    // Lags within one example (input and target stream): at most its length.
    if cfg.max_lag < 1 || cfg.max_lag > seq_len {
        return Err(TaskError::out_of_range(
            "max_lag",
            cfg.max_lag,
            format!("1..={seq_len} (the examples' seq_len)"),
        ));
    }
    cfg.validate(seq_len + 1)?;
    let scored: usize = examples.iter().map(|e| e.n_scored()).sum();
    if scored == 0 {
        return Err(TaskError::Invalid {
            field: "examples",
            message: "no scored position to pair with".into(),
        });
    }
    // one dense id space for inputs and targets
    let mut all: Vec<u32> = Vec::new();
    for e in examples {
        all.extend_from_slice(&e.input);
        all.extend_from_slice(&e.target);
    }
    let (ids, v) = densify(&all);
    let mut inputs: Vec<&[u32]> = Vec::with_capacity(examples.len());
    let mut targets: Vec<&[u32]> = Vec::with_capacity(examples.len());
    let mut off = 0;
    for e in examples {
        let l = e.input.len();
        inputs.push(&ids[off..off + l]);
        targets.push(&ids[off + l..off + 2 * l]);
        off += 2 * l;
    }
    let masks: Vec<&[bool]> = examples.iter().map(|e| e.mask.as_slice()).collect();
    let (targets, masks): (&[&[u32]], &[&[bool]]) = (&targets, &masks);
    let g = cfg.estimator == Estimator::Grassberger;
    let lag_stats = |inputs: &[&[u32]], lags: &[usize]| -> Vec<LagStats> {
        lags.par_iter()
            .map_init(
                || (Counter::new(v, scored), vec![0u32; v], vec![0u32; v]),
                |(counter, mx, my), &r| {
                    mx.fill(0);
                    my.fill(0);
                    let mut n = 0u64;
                    let pairs = || {
                        (0..inputs.len()).flat_map(move |e| {
                            let (inp, tgt, m) = (inputs[e], targets[e], masks[e]);
                            (r.saturating_sub(1)..tgt.len())
                                .filter(move |&t| m[t])
                                .map(move |t| (inp[t + 1 - r], tgt[t]))
                        })
                    };
                    for (a, b) in pairs() {
                        mx[a as usize] += 1;
                        my[b as usize] += 1;
                        n += 1;
                    }
                    let sxy = counter.joint(pairs(), g);
                    LagStats {
                        n,
                        x: marginal_stats(mx, g),
                        y: marginal_stats(my, g),
                        xy: sxy,
                    }
                },
            )
            .collect()
    };
    let lags: Vec<usize> = (1..=cfg.max_lag).collect();
    let stats = lag_stats(&inputs, &lags);
    if let Some(r) = stats.iter().position(|s| s.n == 0) {
        return Err(TaskError::out_of_range(
            "max_lag",
            cfg.max_lag,
            format!(
                "1..={r} (no scored target has an input {} tokens back)",
                r + 1
            ),
        ));
    }
    let null_lags: Vec<usize> = (1..=cfg.shuffle_lags).collect();
    let mut null = Vec::with_capacity(cfg.n_shuffles * cfg.shuffle_lags);
    let flat_inputs: Vec<u32> = inputs.iter().flat_map(|s| s.iter().copied()).collect();
    let same_len = inputs.iter().all(|s| s.len() == seq_len);
    for k in 0..cfg.n_shuffles {
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        rng.set_stream(k as u64);
        let mut shuffled = flat_inputs.clone();
        let mut views: Vec<&[u32]> = Vec::with_capacity(inputs.len());
        if same_len {
            let mut order: Vec<usize> = (0..inputs.len()).collect();
            order.shuffle(&mut rng);
            views.extend(order.iter().map(|&e| inputs[e]));
        } else {
            shuffled.shuffle(&mut rng);
            let mut off = 0;
            for inp in &inputs {
                views.push(&shuffled[off..off + inp.len()]);
                off += inp.len();
            }
        }
        for s in lag_stats(&views, &null_lags) {
            null.push(NullSample::of(&s, cfg.estimator));
        }
    }
    Ok(finish(cfg, v, scored, &stats, &null))
}

/// Least-squares fits of `ln I` on `ln r` (power law) and on `r` (exponential) over the points
/// `(lags[i], mutual_info[i])` with `mutual_info[i] > 0`; the better R² wins (ties: power).
pub fn fit_decay(lags: &[f64], mutual_info: &[f64]) -> DecayFit {
    let pts: Vec<(f64, f64)> = lags
        .iter()
        .zip(mutual_info)
        .filter(|(_, i)| **i > 0.0 && i.is_finite())
        .map(|(&r, &i)| (r, i.ln()))
        .collect();
    if pts.len() < 3 {
        return DecayFit {
            model: DecayModel::None,
            exponent: f64::NAN,
            length: f64::NAN,
            r2_power: f64::NAN,
            r2_exp: f64::NAN,
            n_points: pts.len(),
        };
    }
    let ys: Vec<f64> = pts.iter().map(|p| p.1).collect();
    let (slope_p, r2_p) = ols(&pts.iter().map(|p| p.0.ln()).collect::<Vec<_>>(), &ys);
    let (slope_e, r2_e) = ols(&pts.iter().map(|p| p.0).collect::<Vec<_>>(), &ys);
    DecayFit {
        model: if r2_p >= r2_e {
            DecayModel::Power
        } else {
            DecayModel::Exp
        },
        exponent: -slope_p,
        length: if slope_e < 0.0 {
            -1.0 / slope_e
        } else {
            f64::INFINITY
        },
        r2_power: r2_p,
        r2_exp: r2_e,
        n_points: pts.len(),
    }
}

/// Ordinary least squares `y = a + b x`; returns `(b, R²)` (R² = 1 when `y` is constant and fit).
fn ols(x: &[f64], y: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let mx = x.iter().sum::<f64>() / n;
    let my = y.iter().sum::<f64>() / n;
    let sxx: f64 = x.iter().map(|v| (v - mx).powi(2)).sum();
    let sxy: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let syy: f64 = y.iter().map(|v| (v - my).powi(2)).sum();
    if sxx == 0.0 {
        return (f64::NAN, f64::NAN);
    }
    let b = sxy / sxx;
    let r2 = if syy == 0.0 {
        1.0
    } else {
        (sxy * sxy) / (sxx * syy)
    };
    (b, r2)
}

/// One granularity's profile for [`collapse_error`]: lags (tokens), MI (nats), significance and
/// the mean number of characters per token.
#[derive(Clone, Copy, Debug)]
pub struct CurveRef<'a> {
    /// Lags in tokens, ascending.
    pub lags: &'a [usize],
    /// MI at each lag, nats.
    pub mutual_info: &'a [f64],
    /// Whether each lag is significant (only significant lags with `I > 0` are used).
    pub significant: &'a [bool],
    /// Mean characters per token of this granularity (the lag rescaling).
    pub chars_per_token: f64,
}

/// Number of log-spaced points on which [`collapse_error`] compares curves.
pub const COLLAPSE_GRID: usize = 32;

/// Self-similarity check across granularities of one corpus (SCIENCE.md section 4).
///
/// Each curve is put on the character scale `ℓ = r · chars_per_token`, and `ln I` is linearly
/// interpolated in `ln ℓ` on [`COLLAPSE_GRID`] log-spaced points of the range of `ℓ` that every
/// curve covers (its first contiguous run of significant lags, [`main_run`], where `I > 0`). Each curve is centred
/// by its own mean over the grid (so only the *shape* is compared: nats per token differ between
/// granularities by construction), and the error of a curve is the root-mean-square distance, in
/// `ln I`, between its centred values and the mean of all centred curves. A value near 0 means
/// the profiles collapse onto one curve after rescaling.
///
/// Returns one value per curve, or `None` for all if fewer than two curves have ≥ 2 usable
/// points or the common range is empty.
pub fn collapse_error(curves: &[CurveRef<'_>]) -> Vec<Option<f64>> {
    let pts: Vec<Vec<(f64, f64)>> = curves
        .iter()
        .map(|c| {
            let run = main_run(c.significant);
            c.lags[run.clone()]
                .iter()
                .zip(&c.mutual_info[run])
                .filter(|(_, i)| **i > 0.0)
                .map(|(&r, &i)| ((r as f64 * c.chars_per_token).ln(), i.ln()))
                .collect()
        })
        .collect();
    let none = vec![None; curves.len()];
    if pts.len() < 2 || pts.iter().any(|p| p.len() < 2) {
        return none;
    }
    let lo = pts.iter().map(|p| p[0].0).fold(f64::NEG_INFINITY, f64::max);
    let hi = pts
        .iter()
        .map(|p| p[p.len() - 1].0)
        .fold(f64::INFINITY, f64::min);
    if lo >= hi {
        return none;
    }
    let grid: Vec<f64> = (0..COLLAPSE_GRID)
        .map(|k| lo + (hi - lo) * k as f64 / (COLLAPSE_GRID - 1) as f64)
        .collect();
    let centred: Vec<Vec<f64>> = pts
        .iter()
        .map(|p| {
            let vals: Vec<f64> = grid.iter().map(|&g| interp(p, g)).collect();
            let m = vals.iter().sum::<f64>() / vals.len() as f64;
            vals.into_iter().map(|v| v - m).collect()
        })
        .collect();
    let k = centred.len() as f64;
    let consensus: Vec<f64> = (0..grid.len())
        .map(|j| centred.iter().map(|c| c[j]).sum::<f64>() / k)
        .collect();
    centred
        .iter()
        .map(|c| {
            let mse = c
                .iter()
                .zip(&consensus)
                .map(|(a, b)| (a - b).powi(2))
                .sum::<f64>()
                / grid.len() as f64;
            Some(mse.sqrt())
        })
        .collect()
}

/// Piecewise-linear interpolation of sorted points `(x, y)` at `x0` (clamped to the ends).
fn interp(p: &[(f64, f64)], x0: f64) -> f64 {
    if x0 <= p[0].0 {
        return p[0].1;
    }
    for w in p.windows(2) {
        if x0 <= w[1].0 {
            let t = (x0 - w[0].0) / (w[1].0 - w[0].0);
            return w[0].1 + t * (w[1].1 - w[0].1);
        }
    }
    p[p.len() - 1].1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Split;
    use crate::block::{BlockConfig, BlockVariant};
    use rand::Rng;

    fn markov(p: f64, n: usize, seed: u64) -> Vec<u32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut s = 0u32;
        (0..n)
            .map(|_| {
                if rng.random::<f64>() < p {
                    s ^= 1;
                }
                s
            })
            .collect()
    }

    #[test]
    fn grassberger_g_matches_recurrence() {
        let gamma = 0.577_215_664_901_532_9_f64;
        let ln2 = std::f64::consts::LN_2;
        assert!((grassberger_g(1) - (-gamma - ln2)).abs() < 1e-10);
        assert!((grassberger_g(2) - (2.0 - gamma - ln2)).abs() < 1e-10);
        let mut g = grassberger_g(2);
        for k in 1..200u64 {
            assert!(
                (grassberger_g(2 * k + 1) - g).abs() < 1e-9,
                "G({})",
                2 * k + 1
            );
            g += 2.0 / (2 * k + 1) as f64;
            assert!(
                (grassberger_g(2 * k + 2) - g).abs() < 1e-9,
                "G({})",
                2 * k + 2
            );
        }
    }

    #[test]
    fn hand_computed_small_table() {
        // x = [0,0,1,1]: lag 1 pairs (0,0),(0,1),(1,1): X = {0:2,1:1}, Y = {0:1,1:2}, XY 3 cells.
        let st = stream_lag_stats(&[0, 0, 1, 1], 2, &[1], false)[0];
        let h = |c: &[f64]| {
            let n: f64 = c.iter().sum();
            -c.iter().map(|v| v / n * (v / n).ln()).sum::<f64>()
        };
        let want = h(&[2.0, 1.0]) + h(&[1.0, 2.0]) - h(&[1.0, 1.0, 1.0]);
        assert!((st.plug_in() - want).abs() < 1e-12);
        let mm = want + (2.0 + 2.0 - 3.0 - 1.0) / 6.0;
        assert!((st.estimate(Estimator::MillerMadow) - mm).abs() < 1e-12);
    }

    #[test]
    fn interleaved_dense_counter_matches_plain_counting() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let x: Vec<u32> = (0..10_003).map(|_| rng.random_range(0..50u32)).collect();
        let (d, v) = densify(&x);
        for r in [1usize, 2, 7] {
            let st = stream_lag_stats(&d, v, &[r], true)[0];
            let mut cells = vec![0u32; v * v];
            for t in 0..d.len() - r {
                cells[d[t] as usize * v + d[t + r] as usize] += 1;
            }
            let want = marginal_stats(&cells, true);
            assert_eq!(want.m, st.xy.m);
            assert!((want.c_ln_c - st.xy.c_ln_c).abs() < 1e-6);
            assert!((want.c_g_c - st.xy.c_g_c).abs() < 1e-6);
        }
    }

    #[test]
    fn dense_and_hash_counters_agree() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let x: Vec<u32> = (0..40_000).map(|_| rng.random_range(0..2100u32)).collect();
        let (d, v) = densify(&x);
        assert!(v > DENSE_MAX_VOCAB);
        let hash = stream_lag_stats(&d, v, &[1, 5], true);
        // the same pairs counted on a dense table built by hand
        for (k, &r) in [1usize, 5].iter().enumerate() {
            let mut cells = vec![0u32; v * v];
            for t in 0..d.len() - r {
                cells[d[t] as usize * v + d[t + r] as usize] += 1;
            }
            let dense = marginal_stats(&cells, true);
            assert_eq!(dense.m, hash[k].xy.m);
            assert!((dense.c_ln_c - hash[k].xy.c_ln_c).abs() < 1e-6);
            assert!((dense.c_g_c - hash[k].xy.c_g_c).abs() < 1e-6);
        }
    }

    #[test]
    fn markov_chain_matches_closed_form() {
        let p = 0.1;
        let x = markov(p, 1_000_000, 11);
        let cfg = MiConfig {
            max_lag: 60,
            ..MiConfig::default()
        };
        let prof = profile_stream(&x, &cfg).unwrap();
        for r in 1..=12 {
            let want = markov_two_state_mi(p, r);
            let got = prof.mutual_info[r - 1];
            // sd of the estimate ≈ (1−2p)^r·… ≪ 2 % of the value at these lags for N = 1e6
            assert!(
                (got - want).abs() < 0.03 * want + 2e-5,
                "lag {r}: got {got}, want {want}"
            );
        }
        // W: last lag with I ≥ 0.1·I(1) in the closed form
        let w = (1..=60)
            .take_while(|&r| markov_two_state_mi(p, r) >= 0.1 * markov_two_state_mi(p, 1))
            .last()
            .unwrap();
        // I(5)/I(1) = 0.149, I(6)/I(1) = 0.094
        assert_eq!(w, 5);
        assert_eq!(prof.dep_width, Some(w));
        // largest significant lag: where the closed form drops under the band (I ≈ c²/2 with
        // c = 0.8^r vs a band of ~15/(2N)): about 24.
        // Significance: n·c² (c = 0.8^r) against a band of ~14/(2N): every lag up to 22
        // (n·c² ≥ 54) is significant and the first insignificant lag is near 25. Beyond it the
        // sample MI of this strongly autocorrelated chain fluctuates more than the shuffled
        // (i.i.d.) null allows (Bartlett: variance × (1+ρ²)/(1−ρ²) = 4.6 for ρ = 0.8), so
        // isolated later lags may pass the band (here 40..=52): see the module docs.
        assert!(prof.significant[..22].iter().all(|&s| s));
        let first_off = prof.significant.iter().position(|&s| !s).unwrap() + 1;
        assert!(
            (23..=30).contains(&first_off),
            "first insignificant lag {first_off}"
        );
        assert_eq!(prof.decay.model, DecayModel::Exp);
        // I(r) ≈ ½(1−2p)^{2r} → decay length −1/(2 ln 0.8) = 2.24
        let l = -1.0 / (2.0 * (1.0 - 2.0 * p).ln());
        assert!((prof.decay.length - l).abs() < 0.1 * l, "{:?}", prof.decay);
    }

    #[test]
    fn iid_tokens_have_nothing_significant() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let x: Vec<u32> = (0..200_000).map(|_| rng.random_range(0..16u32)).collect();
        for est in [
            Estimator::MillerMadow,
            Estimator::Grassberger,
            Estimator::PlugIn,
        ] {
            let cfg = MiConfig {
                max_lag: 64,
                estimator: est,
                ..MiConfig::default()
            };
            let prof = profile_stream(&x, &cfg).unwrap();
            assert_eq!(prof.max_significant_lag, None, "{est:?}");
            assert_eq!(prof.dep_width, None);
            assert_eq!(prof.decay.model, DecayModel::None);
            let max = prof.mutual_info.iter().fold(0.0f64, |a, b| a.max(b.abs()));
            // plug-in bias ≈ (V−1)²/(2N) = 5.6e-4; corrected estimates are an order smaller
            let bound = if est == Estimator::PlugIn {
                1.5e-3
            } else {
                3e-4
            };
            assert!(max < bound, "{est:?} max |I| = {max}");
        }
    }

    #[test]
    fn corrections_remove_most_bias() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let x: Vec<u32> = (0..50_000).map(|_| rng.random_range(0..32u32)).collect();
        let mean = |est| {
            let p = profile_stream(
                &x,
                &MiConfig {
                    max_lag: 32,
                    estimator: est,
                    ..MiConfig::default()
                },
            )
            .unwrap();
            p.mutual_info.iter().sum::<f64>() / 32.0
        };
        let bias = 31.0 * 31.0 / (2.0 * 50_000.0);
        let pi = mean(Estimator::PlugIn);
        assert!((pi - bias).abs() < 0.1 * bias, "plug-in {pi} vs {bias}");
        assert!(mean(Estimator::MillerMadow).abs() < 0.1 * bias);
        assert!(mean(Estimator::Grassberger).abs() < 0.15 * bias);
    }

    fn block_examples(variant: BlockVariant, b: usize, n: u64) -> Vec<Example> {
        let cfg = BlockConfig {
            variant,
            vocab_size: 16,
            seq_len: 64,
            block_len: b,
            noise: 0.0,
        };
        (0..n)
            .map(|i| cfg.example(0, Split::Train, i).unwrap())
            .collect()
    }

    /// A lag longer than the examples names their length, not a token count (issue 16).
    #[test]
    fn example_lags_are_bounded_by_seq_len() {
        let ex = block_examples(BlockVariant::Copy, 4, 10);
        let seq_len = ex[0].input.len();
        let cfg = |max_lag| MiConfig {
            max_lag,
            ..MiConfig::default()
        };
        let e = profile_examples(&ex, &cfg(seq_len + 1))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "max_lag = {} is out of range: must be in 1..={seq_len} (the examples' seq_len)",
                seq_len + 1
            )
        );
        assert!(profile_examples(&ex, &cfg(seq_len - 1)).is_ok());
    }

    #[test]
    fn block_copy_peaks_at_b() {
        for b in [4usize, 8, 16] {
            let ex = block_examples(BlockVariant::Copy, b, 2000);
            let prof = profile_examples(
                &ex,
                &MiConfig {
                    max_lag: 40,
                    ..MiConfig::default()
                },
            )
            .unwrap();
            let argmax = prof
                .mutual_info
                .iter()
                .enumerate()
                .fold((0, f64::MIN), |a, (i, &v)| if v > a.1 { (i, v) } else { a })
                .0
                + 1;
            assert_eq!(argmax % b, 0, "B = {b}: argmax {argmax}");
            assert!((prof.mutual_info[b - 1] - 16f64.ln()).abs() < 0.02);
            assert_eq!(prof.dep_width, Some(b), "B = {b}");
            for r in 1..b {
                assert!(!prof.significant[r - 1], "B = {b}, lag {r}");
            }
        }
    }

    #[test]
    fn block_recall_is_bounded_by_b() {
        for b in [4usize, 8, 16] {
            let ex = block_examples(BlockVariant::Recall, b, 2000);
            let prof = profile_examples(
                &ex,
                &MiConfig {
                    max_lag: 40,
                    ..MiConfig::default()
                },
            )
            .unwrap();
            assert_eq!(prof.max_significant_lag, Some(b), "B = {b}");
            assert_eq!(prof.dep_width, Some(b), "B = {b}");
            assert!(!prof.significant[0], "lag 1 carries nothing");
        }
    }

    #[test]
    fn seeded_and_deterministic() {
        let x = markov(0.2, 50_000, 1);
        let cfg = MiConfig::default();
        assert_eq!(
            profile_stream(&x, &cfg).unwrap(),
            profile_stream(&x, &cfg).unwrap()
        );
        let other = MiConfig {
            seed: 1,
            ..cfg.clone()
        };
        let (a, b) = (
            profile_stream(&x, &cfg).unwrap(),
            profile_stream(&x, &other).unwrap(),
        );
        assert_eq!(a.mutual_info, b.mutual_info);
        assert_ne!(a.shuffle_hi, b.shuffle_hi);
    }

    #[test]
    fn decay_fit_recovers_laws() {
        let lags: Vec<f64> = (1..=50).map(|r| r as f64).collect();
        let pw: Vec<f64> = lags.iter().map(|r| 0.3 * r.powf(-0.7)).collect();
        let f = fit_decay(&lags, &pw);
        assert_eq!(f.model, DecayModel::Power);
        assert!((f.exponent - 0.7).abs() < 1e-9 && (f.r2_power - 1.0).abs() < 1e-12);
        let ex: Vec<f64> = lags.iter().map(|r| 0.3 * (-r / 7.0).exp()).collect();
        let f = fit_decay(&lags, &ex);
        assert_eq!(f.model, DecayModel::Exp);
        assert!((f.length - 7.0).abs() < 1e-9);
        assert_eq!(fit_decay(&lags[..2], &ex[..2]).model, DecayModel::None);
    }

    #[test]
    fn collapse_error_zero_for_rescaled_power_laws_and_positive_otherwise() {
        let lags: Vec<usize> = (1..=100).collect();
        let sig = vec![true; 100];
        // same power law in characters, different amplitudes and chars per token
        let a: Vec<f64> = lags
            .iter()
            .map(|&r| 0.5 * (r as f64 * 1.0).powf(-0.5))
            .collect();
        let b: Vec<f64> = lags
            .iter()
            .map(|&r| 2.0 * (r as f64 * 4.0).powf(-0.5))
            .collect();
        let c: Vec<f64> = lags
            .iter()
            .map(|&r| 2.0 * (-(r as f64) / 5.0).exp())
            .collect();
        fn cur<'a>(lags: &'a [usize], m: &'a [f64], sig: &'a [bool], cpt: f64) -> CurveRef<'a> {
            CurveRef {
                lags,
                mutual_info: m,
                significant: sig,
                chars_per_token: cpt,
            }
        }
        let e = collapse_error(&[cur(&lags, &a, &sig, 1.0), cur(&lags, &b, &sig, 4.0)]);
        assert!(e.iter().all(|v| v.unwrap() < 1e-9), "{e:?}");
        let e = collapse_error(&[cur(&lags, &a, &sig, 1.0), cur(&lags, &c, &sig, 4.0)]);
        assert!(e.iter().all(|v| v.unwrap() > 0.1), "{e:?}");
        assert_eq!(collapse_error(&[cur(&lags, &a, &sig, 1.0)]), vec![None]);
    }

    #[test]
    fn bad_config_is_one_line_error() {
        let e = profile_stream(
            &[1, 2, 3],
            &MiConfig {
                max_lag: 3,
                ..MiConfig::default()
            },
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "max_lag = 3 is out of range: must be in 1..=2 (number of tokens − 1)"
        );
        let e = MiConfig {
            alpha: 1.5,
            ..MiConfig::default()
        }
        .validate(100)
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "alpha = 1.5 is out of range: must be in (0, 1)"
        );
        assert!(Estimator::parse("foo").is_err());
        assert_eq!(
            Estimator::parse("grassberger").unwrap(),
            Estimator::Grassberger
        );
    }
}
