//! What a positional encoding is to the rest of the lab: one trait, implemented once per
//! encoding file (`nope.rs`, `rope.rs`, `pope.rs`, `tapa.rs`, `p_rope.rs`, `partial_rope.rs`),
//! and listed once in the registry (`encodings!` in `model/mod.rs`).
//!
//! An encoding owns (DESIGN.md, "Layout"):
//! - its parameters, its own config section ([`PositionalEncoding::Params`], an
//!   [`EncodingParams`] type in the encoding's file: TAPA's `tapa_rho`, `tapa_alpha`,
//!   `tapa_phase`, PoPE's `pope_delta_init`, p-RoPE's `rope_p`, partial rotary's `rotary_dim`;
//!   RoPE and NoPE have none, [`NoParams`]). The model-wide `rope_base` and `pair_layout` are
//!   not an encoding's: they set the reference grid every encoding's spectrum is read on;
//! - its construction from the model's config and its parameters ([`PositionalEncoding::new`]);
//! - its reference scores from burn tensor ops ([`PositionalEncoding::scores`]);
//! - its score-space map for the fused kernels ([`PositionalEncoding::kernel_map`], a plain
//!   [`KernelEncoding`] description: the kernels know that type, not the encodings);
//! - its spectrum for the probe ([`PositionalEncoding::spectrum`]: which q/k dimensions carry
//!   which frequency; the probe knows [`Spectrum`], not the encodings).
//!
//! Shapes: `q`, `k` are `[batch, heads, seq, head_dim]`; scores `[batch, heads, seq, seq]`.

use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::ModelConfig;
use super::scaling::ScaledFreqs;
pub use crate::kernels::map::KernelEncoding;

/// How the probe reads one head's `q`, `k` (`[seq, head_dim]`) for an encoding.
#[derive(Clone, Debug, PartialEq)]
pub enum SpectrumMap {
    /// Rotary pairs: channel `i` is the pair of dims `dims[i] = (a, b)`, amplitude `|x_a, x_b|`
    /// (RoPE and its variants; NoPE as a control on the RoPE grid). Pass-through dims of partial
    /// rotary and p-RoPE's unrotated pairs are not listed: the probe ignores them.
    Pairs {
        /// `(a, b)` per channel.
        dims: Vec<(usize, usize)>,
    },
    /// One frequency per component `c`, amplitude `softplus(x_c)` (PoPE, §3).
    Components,
    /// TAPA: the frequency of a token pair is `ω = 2π·(q_P·k_P)/√((1−ρ)d)` per unit of
    /// `|m−n|^α`, binned in `|ω|` (SCIENCE.md §3).
    TapaBins {
        /// Amplitude dimensions (the first `amp_dim` of each head).
        amp_dim: usize,
        /// The linear-phase ablation (`Σq_P + Σk_P`).
        linear_phase: bool,
    },
}

/// The probe's view of an encoding: how to read the channels, and each channel's frequency.
#[derive(Clone, Debug, PartialEq)]
pub struct Spectrum {
    /// How channels are read from `q`, `k`.
    pub map: SpectrumMap,
    /// Frequency of each channel, radians per token (TAPA: bin centres, radians per unit of
    /// `|m−n|^α`), in channel (`freq_index`) order.
    pub freqs: Vec<f64>,
}

/// A parameter of an encoding that is out of range: `(field, value, allowed)`, turned into the
/// config's one-line error by [`crate::config::RunConfig::validate`].
pub type ParamError = (&'static str, String, String);

/// An encoding's own parameters: its config section besides `kind`. In sweep files, on the
/// command line and as `runs.parquet` columns they are flat keys beside `encoding = "<name>"`.
pub trait EncodingParams:
    Clone + std::fmt::Debug + PartialEq + Default + Serialize + DeserializeOwned
{
    /// The parameter names, as serialised.
    const NAMES: &'static [&'static str];

    /// Check every parameter for a model with heads of `head_dim` dimensions.
    ///
    /// # Errors
    /// The first bad parameter, its value and its allowed range.
    fn validate(&self, _head_dim: usize) -> Result<(), ParamError> {
        Ok(())
    }
}

/// The parameters of an encoding that has none (RoPE, NoPE).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

impl EncodingParams for NoParams {
    const NAMES: &'static [&'static str] = &[];
}

/// One positional encoding: everything the model, the fused kernels and the probe need.
pub trait PositionalEncoding: Sized {
    /// Name in configs and tables (`encoding = "p-rope"`); the registry line repeats it (a test
    /// checks they agree).
    const NAME: &'static str;
    /// The encoding's own parameters.
    type Params: EncodingParams;
    /// Whether the spectrum's channels are position frequencies, so the law is fitted on them
    /// (RoPE family, PoPE), or not (NoPE: a control; TAPA: per-token-pair frequencies).
    const FITS_LAW: bool;
    /// Whether the encoding takes Hugging Face RoPE frequency scalings at evaluation and the
    /// band ablation of the causal check (its frequencies are RoPE's `θ_i` per pair).
    const ROPE_SCALABLE: bool;

    /// The encoding for one layer of a model with `config` and the encoding's `params` (PoPE
    /// draws δ from `seed`).
    fn new(config: &ModelConfig, params: &Self::Params, seed: u64, device: &Device) -> Self;

    /// The probe's view for `config` and `params` (needs no weights).
    fn spectrum(config: &ModelConfig, params: &Self::Params) -> Spectrum;

    /// Attention logits before mask and softmax, already scaled: `q`, `k`
    /// `[batch, heads, seq, head_dim]` → `[batch, heads, seq, seq]`.
    fn scores(&self, q: Tensor<4>, k: Tensor<4>) -> Tensor<4>;

    /// The fused kernels' description of the encoding, and PoPE's δ `[heads · head_dim]`.
    fn kernel_map(&self) -> (KernelEncoding, Option<Tensor<1>>);

    /// The encoding with a RoPE frequency scaling applied (evaluation at other lengths).
    /// Default: unchanged (the encoding is evaluated as trained).
    fn with_scaling(self, _freqs: &ScaledFreqs) -> Self {
        self
    }

    /// Keep constrained parameters in range after an optimiser step (PoPE's δ). Default:
    /// identity.
    fn project(self) -> Self {
        self
    }
}
