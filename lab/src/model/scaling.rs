//! RoPE frequency scalings for context extension: a registry of pure functions returning the
//! inverse frequencies `θ_i` (radians per token, `[head_dim/2]`) and the attention factor (a
//! multiplier on the attention logits' `cos`/`sin` tables, 1 when the method has none).
//!
//! The reference values are the Hugging Face `transformers` definitions in
//! `modeling_rope_utils.py` (`_compute_default_rope_parameters`, `_compute_linear_scaling_rope_parameters`,
//! `_compute_dynamic_ntk_parameters`, `_compute_yarn_parameters`, `_compute_llama3_parameters`);
//! golden vectors computed independently with NumPy (`scripts/rope_golden.py`, output in
//! `lab/tests/data/rope_golden.json`) pin them to 1e-6 relative. Sources of each formula:
//!
//! - **linear / PI** (Chen et al. 2023, *Position Interpolation*, eq. 2): `θ_i / s`.
//! - **NTK-aware** (bloc97 2023; SCIENCE.md §1): base `b' = b · s^(d/(d−2))`.
//! - **dynamic NTK** (Hugging Face): for a current length `L > L₀`,
//!   `b' = b · (s·L/L₀ − (s − 1))^(d/(d−2))`; identical to the default for `L ≤ L₀`.
//! - **YaRN** (Peng et al. 2023, *YaRN*, eq. 18–20 and §3.4): per-dimension ramp between
//!   interpolation `θ_i/s` and extrapolation `θ_i`, from `β_fast = 32` to `β_slow = 1` rotations
//!   over the original context; attention factor `0.1 ln s + 1`.
//! - **Llama 3** (Meta 2024): wavelengths longer than `L₀/low_freq_factor` are divided by `s`,
//!   shorter than `L₀/high_freq_factor` kept, a smooth blend in between.

use serde::{Deserialize, Serialize};

/// Which scaling to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ScalingKind {
    /// No scaling: `θ_i = base^(−2i/d)`.
    None,
    /// Position interpolation: `θ_i / factor`.
    Linear,
    /// NTK-aware base change: `base · factor^(d/(d−2))`.
    Ntk,
    /// Dynamic NTK: NTK with a factor that grows with the current length.
    Dynamic,
    /// YaRN.
    Yarn,
    /// Llama 3.
    Llama3,
}

impl ScalingKind {
    /// Name in configs, tables and on the command line (`none`, `linear`, `ntk`, `dynamic`,
    /// `yarn`, `llama3`).
    pub fn name(self) -> &'static str {
        match self {
            ScalingKind::None => "none",
            ScalingKind::Linear => "linear",
            ScalingKind::Ntk => "ntk",
            ScalingKind::Dynamic => "dynamic",
            ScalingKind::Yarn => "yarn",
            ScalingKind::Llama3 => "llama3",
        }
    }
}

/// Parameters of a scaling (the Hugging Face `rope_scaling` dictionary, flattened).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    /// Method.
    pub kind: ScalingKind,
    /// Scale factor `s` (> 0; ≥ 1 for context extension).
    pub factor: f64,
    /// Original (training) context length `L₀`, tokens.
    pub original_max_len: usize,
    /// Current sequence length (dynamic NTK only), tokens.
    pub seq_len: Option<usize>,
    /// YaRN `β_fast` (rotations), default 32.
    pub beta_fast: f64,
    /// YaRN `β_slow` (rotations), default 1.
    pub beta_slow: f64,
    /// YaRN: round the correction range outward (HF `truncate`, default true).
    pub truncate: bool,
    /// Llama 3 low-frequency factor, default 1.
    pub low_freq_factor: f64,
    /// Llama 3 high-frequency factor, default 4.
    pub high_freq_factor: f64,
}

impl Default for RopeScaling {
    fn default() -> Self {
        Self {
            kind: ScalingKind::None,
            factor: 1.0,
            original_max_len: 2048,
            seq_len: None,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: true,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
        }
    }
}

/// Inverse frequencies and attention factor.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScaledFreqs {
    /// `θ_i`, `[head_dim/2]`, radians per token.
    pub inv_freq: Vec<f64>,
    /// Multiplier of the rotary tables (YaRN's `mscale`); 1 otherwise.
    pub attention_factor: f64,
}

/// Error for bad scaling parameters: one line naming the field and its range.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{field} = {value} is out of range: {allowed}")]
pub struct ScalingError {
    /// Field.
    pub field: &'static str,
    /// Value.
    pub value: String,
    /// Allowed range.
    pub allowed: &'static str,
}

fn default_inv_freq(head_dim: usize, base: f64) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| 1.0 / base.powf((2 * i) as f64 / head_dim as f64))
        .collect()
}

/// YaRN's attention factor `0.1 ln s + 1` (1 for `s ≤ 1`).
pub fn yarn_mscale(factor: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * factor.ln() + 1.0
    }
}

/// The dimension (of `d`) whose wavelength makes `num_rotations` turns over `max_len` tokens
/// (YaRN eq. 17 solved for the dimension index).
fn yarn_correction_dim(num_rotations: f64, dim: usize, base: f64, max_len: usize) -> f64 {
    (dim as f64 * (max_len as f64 / (num_rotations * 2.0 * std::f64::consts::PI)).ln())
        / (2.0 * base.ln())
}

/// Inverse frequencies and attention factor for `scaling` of a RoPE with `head_dim`, `base`.
pub fn scaled_inv_freq(
    head_dim: usize,
    base: f64,
    scaling: &RopeScaling,
) -> Result<ScaledFreqs, ScalingError> {
    let err = |field, value: f64, allowed| ScalingError {
        field,
        value: number_text(value),
        allowed,
    };
    if !(4..=MAX_HEAD_DIM).contains(&head_dim) || head_dim % 2 != 0 {
        return Err(err(
            "head_dim",
            head_dim as f64,
            "must be even and in 4..=4096",
        ));
    }
    if !(base > 1.0 && base <= MAX_BASE) {
        return Err(err("base", base, "must be a number in (1, 1e12]"));
    }
    if !(scaling.factor > 0.0 && scaling.factor <= MAX_FACTOR) {
        return Err(err(
            "factor",
            scaling.factor,
            "must be a number in (0, 65536]",
        ));
    }
    if !(1..=MAX_LEN).contains(&scaling.original_max_len) {
        return Err(err(
            "original_max_len",
            scaling.original_max_len as f64,
            "must be in 1..=16777216",
        ));
    }
    if let Some(l) = scaling.seq_len
        && !(1..=MAX_LEN).contains(&l)
    {
        return Err(err("seq_len", l as f64, "must be in 1..=16777216"));
    }
    for (field, v) in [
        ("beta_fast", scaling.beta_fast),
        ("beta_slow", scaling.beta_slow),
        ("low_freq_factor", scaling.low_freq_factor),
        ("high_freq_factor", scaling.high_freq_factor),
    ] {
        if !(v > 0.0 && v <= MAX_FACTOR) {
            return Err(err(field, v, "must be a number in (0, 65536]"));
        }
    }
    let d = head_dim as f64;
    let s = scaling.factor;
    let plain = default_inv_freq(head_dim, base);
    let (inv_freq, attention_factor) = match scaling.kind {
        ScalingKind::None => (plain, 1.0),
        ScalingKind::Linear => (plain.iter().map(|f| f / s).collect(), 1.0),
        ScalingKind::Ntk => (
            default_inv_freq(head_dim, base * s.powf(d / (d - 2.0))),
            1.0,
        ),
        ScalingKind::Dynamic => {
            let l0 = scaling.original_max_len as f64;
            let l = scaling
                .seq_len
                .unwrap_or(scaling.original_max_len)
                .max(scaling.original_max_len) as f64;
            let new_base = base * (s * l / l0 - (s - 1.0)).powf(d / (d - 2.0));
            (default_inv_freq(head_dim, new_base), 1.0)
        }
        ScalingKind::Yarn => {
            if !(scaling.beta_fast > scaling.beta_slow && scaling.beta_slow > 0.0) {
                return Err(err(
                    "beta_fast",
                    scaling.beta_fast,
                    "must exceed beta_slow > 0",
                ));
            }
            let l0 = scaling.original_max_len;
            let mut low = yarn_correction_dim(scaling.beta_fast, head_dim, base, l0);
            let mut high = yarn_correction_dim(scaling.beta_slow, head_dim, base, l0);
            if scaling.truncate {
                low = low.floor();
                high = high.ceil();
            }
            let low = low.max(0.0);
            let high = high.min(d - 1.0);
            let high = if low == high { high + 0.001 } else { high };
            let inv = plain
                .iter()
                .enumerate()
                .map(|(i, &f)| {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolation = 1.0 - ramp;
                    (f / s) * (1.0 - extrapolation) + f * extrapolation
                })
                .collect();
            (inv, yarn_mscale(s))
        }
        ScalingKind::Llama3 => {
            let (lo, hi) = (scaling.low_freq_factor, scaling.high_freq_factor);
            if !(hi > lo && lo > 0.0) {
                return Err(err(
                    "high_freq_factor",
                    hi,
                    "must exceed low_freq_factor > 0",
                ));
            }
            let l0 = scaling.original_max_len as f64;
            let low_wavelen = l0 / lo;
            let high_wavelen = l0 / hi;
            let inv = plain
                .iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / s
                    } else {
                        let smooth = (l0 / wavelen - lo) / (hi - lo);
                        (1.0 - smooth) * f / s + smooth * f
                    }
                })
                .collect();
            (inv, 1.0)
        }
    };
    // A scaled base can overflow (NTK with a huge factor: base·s^(d/(d−2)) = ∞ gives
    // inv_freq = [1, 0, 0, …], a different model): every frequency must stay a positive number.
    if let Some(f) = inv_freq.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
        return Err(ScalingError {
            field: "factor",
            value: number_text(scaling.factor),
            allowed: if f.is_finite() {
                "too large for this base and head_dim: a scaled frequency underflows to 0"
            } else {
                "too large for this base and head_dim: a scaled frequency is not finite"
            },
        });
    }
    Ok(ScaledFreqs {
        inv_freq,
        attention_factor,
    })
}

/// A number as an error shows it: as typed for ordinary sizes (`2`, `0.5`), in exponent form
/// for very large or small ones (`1e308`, not 309 digits).
pub fn number_text(x: f64) -> String {
    if x != 0.0 && x.is_finite() && !(1e-4..1e9).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        x.to_string()
    }
}

/// Largest head dimension a scaling accepts.
pub const MAX_HEAD_DIM: usize = 4096;
/// Largest RoPE base a scaling accepts.
pub const MAX_BASE: f64 = 1e12;
/// Largest scale factor (and YaRN β, Llama 3 factor) accepted: 2^16, the longest context a task
/// generates ([`tasks::MAX_SEQ_LEN`]) over a one-token training length.
pub const MAX_FACTOR: f64 = 65536.0;
/// Largest original or current length a scaling accepts, tokens (2^24).
pub const MAX_LEN: usize = 1 << 24;

impl ScalingError {
    /// The error as the command line spells the field: `--factor 1e308 is out of range: …`
    /// (`field` `beta_fast` is the flag `--beta-fast`; `seq_len` is `--scaling-seq-len`).
    pub fn for_cli(&self) -> String {
        let flag = match self.field {
            "seq_len" => "scaling-seq-len".to_string(),
            f => f.replace('_', "-"),
        };
        format!("--{flag} {} is out of range: {}", self.value, self.allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_names_are_the_serde_names() {
        for k in [
            ScalingKind::None,
            ScalingKind::Linear,
            ScalingKind::Ntk,
            ScalingKind::Dynamic,
            ScalingKind::Yarn,
            ScalingKind::Llama3,
        ] {
            assert_eq!(
                serde_json::to_string(&k).unwrap(),
                format!("\"{}\"", k.name())
            );
        }
    }

    #[test]
    fn none_and_linear_closed_form() {
        let s = RopeScaling::default();
        let f = scaled_inv_freq(8, 10000.0, &s).unwrap();
        assert_eq!(f.attention_factor, 1.0);
        for (a, b) in f.inv_freq.iter().zip([1.0, 0.1, 0.01, 0.001]) {
            assert!((a - b).abs() <= 1e-15 * b.max(1e-3));
        }
        let lin = RopeScaling {
            kind: ScalingKind::Linear,
            factor: 4.0,
            ..Default::default()
        };
        let g = scaled_inv_freq(8, 10000.0, &lin).unwrap();
        assert!((g.inv_freq[1] - 0.025).abs() < 1e-15);
    }

    #[test]
    fn ntk_keeps_highest_frequency_and_scales_lowest_by_factor() {
        // With b' = b·s^(d/(d−2)), θ_0 = 1 unchanged and θ_{d/2−1} = b'^(−(d−2)/d) = θ_{d/2−1}/s.
        let ntk = RopeScaling {
            kind: ScalingKind::Ntk,
            factor: 8.0,
            ..Default::default()
        };
        let plain = scaled_inv_freq(64, 10000.0, &RopeScaling::default())
            .unwrap()
            .inv_freq;
        let f = scaled_inv_freq(64, 10000.0, &ntk).unwrap().inv_freq;
        assert!((f[0] - 1.0).abs() < 1e-15);
        assert!((f[31] - plain[31] / 8.0).abs() < 1e-12 * plain[31]);
    }

    #[test]
    fn dynamic_equals_default_within_original_length() {
        let dynamic = RopeScaling {
            kind: ScalingKind::Dynamic,
            factor: 4.0,
            original_max_len: 1024,
            seq_len: Some(512),
            ..Default::default()
        };
        let plain = scaled_inv_freq(32, 10000.0, &RopeScaling::default()).unwrap();
        assert_eq!(scaled_inv_freq(32, 10000.0, &dynamic).unwrap(), plain);
    }

    #[test]
    fn yarn_attention_factor() {
        assert!((yarn_mscale(8.0) - (0.1 * 8f64.ln() + 1.0)).abs() < 1e-15);
        assert_eq!(yarn_mscale(0.5), 1.0);
    }

    #[test]
    fn bad_parameters_name_the_field() {
        let bad = RopeScaling {
            kind: ScalingKind::Linear,
            factor: -1.0,
            ..Default::default()
        };
        assert_eq!(
            scaled_inv_freq(8, 10000.0, &bad).unwrap_err().to_string(),
            "factor = -1 is out of range: must be a number in (0, 65536]"
        );
        assert_eq!(
            scaled_inv_freq(8, 10000.0, &bad).unwrap_err().for_cli(),
            "--factor -1 is out of range: must be a number in (0, 65536]"
        );
        // NaN and ∞ anywhere are refused by name, never computed with.
        for (field, s) in [
            (
                "factor",
                RopeScaling {
                    kind: ScalingKind::Ntk,
                    factor: f64::NAN,
                    ..Default::default()
                },
            ),
            (
                "factor",
                RopeScaling {
                    kind: ScalingKind::Ntk,
                    factor: 1e308,
                    ..Default::default()
                },
            ),
            (
                "beta_fast",
                RopeScaling {
                    kind: ScalingKind::Yarn,
                    factor: 2.0,
                    beta_fast: f64::INFINITY,
                    ..Default::default()
                },
            ),
            (
                "beta_slow",
                RopeScaling {
                    kind: ScalingKind::Yarn,
                    factor: 2.0,
                    beta_slow: f64::NAN,
                    ..Default::default()
                },
            ),
            (
                "high_freq_factor",
                RopeScaling {
                    kind: ScalingKind::Llama3,
                    factor: 2.0,
                    high_freq_factor: f64::INFINITY,
                    ..Default::default()
                },
            ),
        ] {
            assert_eq!(scaled_inv_freq(8, 10000.0, &s).unwrap_err().field, field);
        }
        assert_eq!(
            scaled_inv_freq(8, f64::INFINITY, &RopeScaling::default())
                .unwrap_err()
                .field,
            "base"
        );
        assert_eq!(
            scaled_inv_freq(1 << 20, 10000.0, &RopeScaling::default())
                .unwrap_err()
                .field,
            "head_dim"
        );
    }

    /// Issue 51, item 4: `--scaling ntk --factor` large enough that the NTK base overflows used to
    /// give `inv_freq = [1, 0, 0, …]` (then evaluated as a model); within the allowed factors,
    /// an overflow or underflow of the scaled frequencies is refused.
    #[test]
    fn a_scaling_whose_frequencies_overflow_is_refused() {
        // NTK at d = 4: base·s^(4/2) = 1e4·s²; s = 65536 gives 4.3e13, still finite, θ_1 > 0.
        let ok = RopeScaling {
            kind: ScalingKind::Ntk,
            factor: 65536.0,
            ..Default::default()
        };
        let f = scaled_inv_freq(4, 10000.0, &ok).unwrap();
        assert!(f.inv_freq.iter().all(|x| x.is_finite() && *x > 0.0));
        // Base 1e12 at d = 4096: θ_{2047} = b'^(−2046/2048) with b' = 1e12·65536^(4096/4094):
        // about 1e-16.8, still positive. Dynamic NTK at the longest length: also finite.
        let dynamic = RopeScaling {
            kind: ScalingKind::Dynamic,
            factor: 65536.0,
            original_max_len: 1,
            seq_len: Some(MAX_LEN),
            ..Default::default()
        };
        match scaled_inv_freq(4096, 1e12, &dynamic) {
            Ok(f) => assert!(f.inv_freq.iter().all(|x| x.is_finite() && *x > 0.0)),
            Err(e) => assert_eq!(e.field, "factor", "{e}"),
        }
    }
}
