//! TAPA: token-aware phase attention (Wang, Shen, Munos, Zhan, Tian, *Positional Encoding via
//! Token-Aware Phase Attention*, arXiv 2509.12635, §3; SCIENCE.md §1).
//!
//! Each head is split into an amplitude part (`q_A, k_A`: the first `ρ·d` dimensions) and a phase
//! part (`q_P, k_P`: the rest). The score of query position `m` and key position `n` is
//!
//! `(q_A·k_A / √(ρd)) · cos(2π · |m − n|^α · (q_P·k_P) / √((1−ρ)d))`,
//!
//! with `ρ = 0.5` and `α = 0.1` (an exponent on the distance) by default. The phase frequency is
//! token-aware (it depends on `q_P·k_P`), and TAPA has no parameters of its own. The
//! linear-phase ablation replaces `q_P·k_P` by `Σ_j q_P,j + Σ_j k_P,j` (same normalisation).

use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::ModelConfig;
use super::encoding::{
    EncodingParams, KernelEncoding, ParamError, PositionalEncoding, Spectrum, SpectrumMap,
};
pub use crate::kernels::map::TapaPhase;

/// Centres of the TAPA phase-frequency bins of the probe: 24 log-spaced bins of `|ω|` between
/// `10^−2` and `10^2` radians per unit of `|m−n|^α`; values outside fall into the end bins.
pub fn tapa_bins() -> Vec<f64> {
    let (lo, hi, n) = (-2.0f64, 2.0f64, 24);
    (0..n)
        .map(|i| 10f64.powf(lo + (i as f64 + 0.5) * (hi - lo) / n as f64))
        .collect()
}

/// The bin of [`tapa_bins`] that `|omega|` falls into.
pub fn tapa_bin(omega: f64) -> usize {
    let (lo, hi, n) = (-2.0f64, 2.0f64, 24usize);
    let x = (omega.abs().max(1e-300).log10() - lo) / (hi - lo) * n as f64;
    (x.floor().max(0.0) as usize).min(n - 1)
}

/// TAPA's parameters (config section `encoding = "tapa"`); the defaults are the paper's.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TapaParams {
    /// Amplitude fraction ρ of each head, in (0, 1).
    #[serde(default = "default_rho")]
    pub tapa_rho: f64,
    /// Distance exponent α, in [0, 10].
    #[serde(default = "default_alpha")]
    pub tapa_alpha: f64,
    /// `quadratic` (the paper) or `linear` (ablation) phase.
    #[serde(default)]
    pub tapa_phase: TapaPhase,
    /// Scale `s` of the phase argument at initialisation, in (0, 10⁴]: the phase columns of
    /// `W_q` and `W_k` (head dims `amp_dim..head_dim` of every head) are drawn `√s` times larger,
    /// so the quadratic phase `q_P·k_P` starts `s` times larger (the linear one `√s`); the other
    /// weights and the seed's stream are unchanged. 1 = the paper's initialisation (R59's
    /// H-init; not serialised at 1, so run ids of the default stay as they were).
    #[serde(
        default = "default_init_scale",
        skip_serializing_if = "is_default_init_scale"
    )]
    pub tapa_phase_init_scale: f64,
    /// Gain `g` of the phase argument, in (0, 10⁴]: the cosine's argument is
    /// `2π·|m − n|^α · g·(q_P·k_P)/√((1−ρ)d)` (the linear phase likewise). With
    /// `tapa_phase_init_scale = 1/g` the function at initialisation is the paper's, and AdamW's
    /// steps (of a size set by the learning rate, whatever the gradient's scale) move the
    /// quadratic phase `√g` times faster: the phase projections' learning rate ×√g (R59's H-lr).
    /// 1 = the paper (not serialised at 1).
    #[serde(
        default = "default_init_scale",
        skip_serializing_if = "is_default_init_scale"
    )]
    pub tapa_phase_gain: f64,
}

fn default_init_scale() -> f64 {
    1.0
}
fn is_default_init_scale(s: &f64) -> bool {
    *s == 1.0
}

fn default_rho() -> f64 {
    0.5
}
fn default_alpha() -> f64 {
    0.1
}

impl Default for TapaParams {
    /// ρ = 0.5, α = 0.1, quadratic phase (arXiv 2509.12635, §3).
    fn default() -> Self {
        TapaParams {
            tapa_rho: default_rho(),
            tapa_alpha: default_alpha(),
            tapa_phase: TapaPhase::default(),
            tapa_phase_init_scale: default_init_scale(),
            tapa_phase_gain: default_init_scale(),
        }
    }
}

impl EncodingParams for TapaParams {
    const NAMES: &'static [&'static str] = &[
        "tapa_rho",
        "tapa_alpha",
        "tapa_phase",
        "tapa_phase_init_scale",
        "tapa_phase_gain",
    ];

    fn validate(&self, _head_dim: usize) -> Result<(), ParamError> {
        if !(self.tapa_rho > 0.0 && self.tapa_rho < 1.0) {
            return Err((
                "tapa_rho",
                self.tapa_rho.to_string(),
                "must be in (0, 1)".into(),
            ));
        }
        if !(self.tapa_alpha.is_finite() && (0.0..=10.0).contains(&self.tapa_alpha)) {
            return Err((
                "tapa_alpha",
                self.tapa_alpha.to_string(),
                "must be in [0, 10]".into(),
            ));
        }
        let s = self.tapa_phase_init_scale;
        if !(s.is_finite() && s > 0.0 && s <= 1e4) {
            return Err((
                "tapa_phase_init_scale",
                s.to_string(),
                "must be in (0, 10000]".into(),
            ));
        }
        let g = self.tapa_phase_gain;
        if !(g.is_finite() && g > 0.0 && g <= 1e4) {
            return Err((
                "tapa_phase_gain",
                g.to_string(),
                "must be in (0, 10000]".into(),
            ));
        }
        Ok(())
    }
}

/// TAPA score function (no learned parameters).
#[derive(Module, Debug)]
pub struct Tapa {
    /// Per-head dimension `d`.
    pub head_dim: usize,
    /// Amplitude dimensions `round(ρ·d)`, at least 1 and at most `d − 1`.
    pub amp_dim: usize,
    /// Distance exponent α.
    pub alpha: f64,
    /// Phase form.
    #[module(skip)]
    pub phase: TapaPhase,
    /// Gain `g` of the phase argument ([`TapaParams::tapa_phase_gain`]; 1 = the paper).
    pub gain: f64,
}

impl Tapa {
    /// TAPA with amplitude fraction `rho` and exponent `alpha`.
    pub fn new(head_dim: usize, rho: f64, alpha: f64, phase: TapaPhase) -> Self {
        let amp_dim = ((rho * head_dim as f64).round() as usize).clamp(1, head_dim - 1);
        Self {
            head_dim,
            amp_dim,
            alpha,
            phase,
            gain: 1.0,
        }
    }

    /// The same with phase gain `gain` ([`TapaParams::tapa_phase_gain`]).
    pub fn with_gain(mut self, gain: f64) -> Self {
        self.gain = gain;
        self
    }

    /// Phase dimensions `d − amp_dim`.
    pub fn phase_dim(&self) -> usize {
        self.head_dim - self.amp_dim
    }

    /// `|m − n|^α` as `[1, 1, seq, seq]` (0 on the diagonal).
    pub fn distance_power(&self, seq: usize, device: &Device) -> Tensor<4> {
        let mut v = Vec::with_capacity(seq * seq);
        for m in 0..seq {
            for n in 0..seq {
                let dist = (m as f64 - n as f64).abs();
                v.push(if dist == 0.0 {
                    0.0
                } else {
                    dist.powf(self.alpha) as f32
                });
            }
        }
        Tensor::<2>::from_data(TensorData::new(v, [seq, seq]), device).unsqueeze()
    }

    /// The phase argument's token part, `[batch, heads, seq, seq]`, already divided by
    /// `√((1−ρ)d)`: `q_P·k_P` or `Σ q_P + Σ k_P`.
    pub fn phase_term(&self, q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
        let (a, p) = (self.amp_dim, self.phase_dim());
        let qp = q.narrow(3, a, p);
        let kp = k.narrow(3, a, p);
        let raw = match self.phase {
            TapaPhase::Quadratic => qp.matmul(kp.swap_dims(2, 3)),
            TapaPhase::Linear => qp.sum_dim(3) + kp.sum_dim(3).swap_dims(2, 3),
        };
        raw / (p as f64).sqrt()
    }

    /// The amplitude term `q_A·k_A / √(ρd)`, `[batch, heads, seq, seq]`.
    pub fn amplitude_term(&self, q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
        let a = self.amp_dim;
        q.narrow(3, 0, a).matmul(k.narrow(3, 0, a).swap_dims(2, 3)) / (a as f64).sqrt()
    }

    /// `q`, `k`: `[batch, heads, seq, head_dim]` → scores `[batch, heads, seq, seq]`.
    pub fn scores(&self, q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
        let [_, _, l, _] = q.dims();
        let dist = self.distance_power(l, &q.device());
        let amp = self.amplitude_term(q.clone(), k.clone());
        let phase = self.phase_term(q, k) * dist * (2.0 * std::f64::consts::PI * self.gain);
        amp * phase.cos()
    }
}

impl PositionalEncoding for Tapa {
    const NAME: &'static str = "tapa";
    type Params = TapaParams;
    const FITS_LAW: bool = false;
    const ROPE_SCALABLE: bool = false;

    fn new(config: &ModelConfig, params: &TapaParams, _seed: u64, _device: &Device) -> Self {
        Tapa::new(
            config.head_dim(),
            params.tapa_rho,
            params.tapa_alpha,
            params.tapa_phase,
        )
        .with_gain(params.tapa_phase_gain)
    }

    fn spectrum(config: &ModelConfig, params: &TapaParams) -> Spectrum {
        let t = Tapa::new(
            config.head_dim(),
            params.tapa_rho,
            params.tapa_alpha,
            params.tapa_phase,
        );
        Spectrum {
            map: SpectrumMap::TapaBins {
                amp_dim: t.amp_dim,
                linear_phase: t.phase == TapaPhase::Linear,
            },
            freqs: tapa_bins(),
        }
    }

    fn scores(&self, q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
        Tapa::scores(self, q, k)
    }

    fn kernel_map(&self) -> (KernelEncoding, Option<Tensor<1>>) {
        let (amp_dim, alpha, phase) = (self.amp_dim, self.alpha, self.phase);
        (
            KernelEncoding::Tapa {
                amp_dim,
                alpha,
                phase,
                phase_gain: self.gain,
            },
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-computed small case: d = 4, ρ = 0.5 → amplitude dims {0,1}, phase dims {2,3}.
    #[test]
    fn hand_computed_scores() {
        let device = Device::flex();
        let tapa = Tapa::new(4, 0.5, 0.1, TapaPhase::Quadratic);
        // Positions 0 and 1. q(1) = [1, 2, 0.5, 0.25]; k(0) = [3, -1, 1, 2].
        let q = Tensor::<4>::from_data(
            TensorData::new(
                vec![0.0f32, 0.0, 0.0, 0.0, 1.0, 2.0, 0.5, 0.25],
                [1, 1, 2, 4],
            ),
            &device,
        );
        let k = Tensor::<4>::from_data(
            TensorData::new(
                vec![3.0f32, -1.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0],
                [1, 1, 2, 4],
            ),
            &device,
        );
        let s = tapa
            .scores(q.clone(), k.clone())
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        // amp = (1·3 + 2·(−1))/√2 = 1/√2; phase = (0.5·1 + 0.25·2)/√2 = 1/√2; |1−0|^0.1 = 1.
        let want = (1.0 / 2f64.sqrt()) * (2.0 * std::f64::consts::PI / 2f64.sqrt()).cos();
        assert!((s[2] as f64 - want).abs() < 1e-6, "{} vs {want}", s[2]);
        // Linear ablation: phase = (0.5 + 0.25 + 1 + 2)/√2 = 3.75/√2.
        let lin = Tapa::new(4, 0.5, 0.1, TapaPhase::Linear);
        let s = lin.scores(q, k).into_data().try_to_vec::<f32>().unwrap();
        let want = (1.0 / 2f64.sqrt()) * (2.0 * std::f64::consts::PI * 3.75 / 2f64.sqrt()).cos();
        assert!((s[2] as f64 - want).abs() < 1e-5, "{} vs {want}", s[2]);
    }

    /// `tapa_phase_init_scale = s` multiplies exactly the phase columns of `W_q` and `W_k` by
    /// `√s` (head dims `amp_dim..head_dim` of every head) and leaves every other weight as drawn.
    #[test]
    fn phase_init_scale_scales_the_phase_columns_only() {
        use crate::model::{EncodingConfig, ModelConfig};
        let device = Device::flex();
        let at = |s: f64| {
            ModelConfig::attention_only(
                EncodingConfig::Tapa(TapaParams {
                    tapa_phase_init_scale: s,
                    ..TapaParams::default()
                }),
                2,
                8,
            )
            .init(3, &device)
        };
        let (m0, m1) = (at(1.0), at(100.0));
        let vals =
            |p: &burn::module::Param<Tensor<2>>| p.val().into_data().try_to_vec::<f32>().unwrap();
        let (b0, b1) = (&m0.blocks[0], &m1.blocks[0]);
        for (w0, w1) in [(vals(&b0.wq), vals(&b1.wq)), (vals(&b0.wk), vals(&b1.wk))] {
            let mut scaled = 0;
            for (i, (a, b)) in w0.iter().zip(&w1).enumerate() {
                // 16 columns: head h's dim j is column 8h + j; ρ = 0.5 → dims 4..8 are phase.
                if (i % 16) % 8 >= 4 {
                    assert!(
                        (b - 10.0 * a).abs() <= 1e-6 * a.abs().max(1e-3),
                        "{b} vs 10·{a}"
                    );
                    scaled += 1;
                } else {
                    assert_eq!(a, b);
                }
            }
            assert_eq!(scaled, 16 * 8);
        }
        assert_eq!(vals(&b0.wv), vals(&b1.wv));
        assert_eq!(vals(&b0.wo), vals(&b1.wo));
        // Not serialised at its default (run ids unchanged), serialised otherwise.
        let json = |s: f64| {
            serde_json::to_string(&TapaParams {
                tapa_phase_init_scale: s,
                ..TapaParams::default()
            })
            .unwrap()
        };
        assert!(!json(1.0).contains("init_scale"));
        assert!(json(10.0).contains(r#""tapa_phase_init_scale":10.0"#));
    }

    /// A gain `g` on the phase is the same as the phase dims of q multiplied by `g` (quadratic
    /// phase: `g·q_P·k_P = (g·q_P)·k_P`).
    #[test]
    fn phase_gain_is_a_scaled_query_phase() {
        let device = Device::flex();
        let (l, d) = (5, 8);
        let vals = |seed: u32| -> Vec<f32> {
            (0..l * d)
                .map(|i| (((i as u32 * 2654435761u32) ^ seed) % 1000) as f32 / 1000.0 - 0.5)
                .collect()
        };
        let t = |v: Vec<f32>| Tensor::<4>::from_data(TensorData::new(v, [1, 1, l, d]), &device);
        let (q, k) = (vals(1), vals(2));
        let mut q_scaled = q.clone();
        for (i, x) in q_scaled.iter_mut().enumerate() {
            if i % d >= 4 {
                *x *= 2.5;
            }
        }
        let gained = Tapa::new(d, 0.5, 0.1, TapaPhase::Quadratic).with_gain(2.5);
        let plain = Tapa::new(d, 0.5, 0.1, TapaPhase::Quadratic);
        let a = gained
            .scores(t(q.clone()), t(k.clone()))
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let b = plain
            .scores(t(q_scaled), t(k.clone()))
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let c = plain
            .scores(t(q), t(k))
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        }
        assert!(
            a.iter().zip(&c).any(|(x, y)| (x - y).abs() > 1e-3),
            "the gain changes the scores"
        );
    }

    #[test]
    fn distance_exponent() {
        let tapa = Tapa::new(8, 0.5, 0.5, TapaPhase::Quadratic);
        let d = tapa
            .distance_power(3, &Device::flex())
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let r2 = 2f32.sqrt();
        assert_eq!(d, vec![0.0, 1.0, r2, 1.0, 0.0, 1.0, r2, 1.0, 0.0]);
    }
}
