//! Decoder-only transformer with pluggable positional attention.
//!
//! Architecture (GPT-style, pre-norm): token embedding → `n_layers` × [RMSNorm → causal
//! self-attention → residual; RMSNorm → GELU MLP → residual] → RMSNorm → linear head.
//! No biases, no dropout, untied embedding and head. Positions enter *only* through the
//! attention scores, computed by a [`PositionalAttention`] variant: one file per encoding
//! (`nope.rs`, `rope.rs`), one line per encoding in [`PositionalAttention`] and [`Encoding`].
//!
//! Initialisation is done on the host with the run's own seeded RNG (ChaCha8), not with burn's
//! process-global RNG, so the initial weights depend only on `(ModelConfig, seed)` (DESIGN.md,
//! "Flex's RNG is one process-global generator"). Weights are `N(0, 0.02²)` (GPT-2), the two
//! residual output projections scaled by `1/√(2·n_layers)`, norm gains 1.

pub mod encoding;
pub mod nope;
pub mod p_rope;
pub mod partial_rope;
pub mod pope;
pub mod rope;
pub mod scaling;
pub mod tapa;

use burn::module::{Module, Param};
use burn::tensor::activation::{gelu, softmax};
use burn::tensor::module::embedding;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};

pub use encoding::{
    EncodingParams, KernelEncoding, NoParams, ParamError, PositionalEncoding, Spectrum, SpectrumMap,
};
pub use nope::Nope;
pub use p_rope::{PRope, PRopeParams};
pub use partial_rope::{PartialRope, PartialRopeParams};
pub use pope::{DeltaInit, Pope, PopeParams};
pub use rope::{PairLayout, Rope};
pub use tapa::{Tapa, TapaParams, TapaPhase};

/// The registry of encodings: one line per encoding (its variant name, its type, which
/// implements [`PositionalEncoding`], and its name, the type's `NAME`). It generates
/// [`Encoding`] (which encoding), [`EncodingConfig`] (the encoding with its own parameters, a
/// run's config section) and [`PositionalAttention`] (the burn module holding one layer's
/// encoding), whose methods dispatch to the trait.
macro_rules! encodings {
    ($($(#[$doc:meta])* $variant:ident($ty:ty) = $name:literal,)*) => {
        /// Which positional encoding the attention uses (SCIENCE.md §1, §8); in configs and
        /// tables by its name (`rope`, `p-rope`, …).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Encoding {
            $($(#[$doc])* $variant,)*
        }

        impl Encoding {
            /// Every encoding, in registry order.
            pub const ALL: &[Encoding] = &[$(Encoding::$variant,)*];
            /// Their names, in registry order.
            pub const NAMES: &[&str] = &[$(<$ty as PositionalEncoding>::NAME,)*];

            /// Name used in configs and tables.
            pub fn name(self) -> &'static str {
                match self {
                    $(Encoding::$variant => <$ty as PositionalEncoding>::NAME,)*
                }
            }

            /// Whether the encoding's spectrum channels are position frequencies, so the law
            /// is fitted on them ([`PositionalEncoding::FITS_LAW`]).
            pub fn is_rotary(self) -> bool {
                match self {
                    $(Encoding::$variant => <$ty as PositionalEncoding>::FITS_LAW,)*
                }
            }

            /// Whether RoPE scalings and the band ablation apply
            /// ([`PositionalEncoding::ROPE_SCALABLE`]).
            pub fn rope_scalable(self) -> bool {
                match self {
                    $(Encoding::$variant => <$ty as PositionalEncoding>::ROPE_SCALABLE,)*
                }
            }

            /// The encoding's own parameter names (its config section's keys besides `kind`).
            pub fn params(self) -> &'static [&'static str] {
                match self {
                    $(Encoding::$variant => <<$ty as PositionalEncoding>::Params as EncodingParams>::NAMES,)*
                }
            }

            /// The encoding named `name`.
            pub fn from_name(name: &str) -> Option<Encoding> {
                match name {
                    $($name => Some(Encoding::$variant),)*
                    _ => None,
                }
            }

            /// The probe's view of this encoding in a model with `config`: with the model's
            /// encoding parameters when it is the model's encoding, else with the encoding's
            /// defaults (a hybrid model's NoPE layers).
            pub fn spectrum(self, config: &ModelConfig) -> Spectrum {
                match self {
                    $(Encoding::$variant => {
                        #[allow(unreachable_patterns)]
                        let params = match &config.encoding {
                            EncodingConfig::$variant(p) => p.clone(),
                            _ => Default::default(),
                        };
                        <$ty as PositionalEncoding>::spectrum(config, &params)
                    })*
                }
            }
        }

        /// A run's encoding and its own parameters, tagged by `kind`
        /// (`{"kind": "tapa", "tapa_rho": 0.5, "tapa_alpha": 0.1, "tapa_phase": "quadratic"}`).
        /// Sweep files, `--set` and `runs.parquet` write the parameters as flat keys beside
        /// `encoding = "tapa"` ([`crate::config::nest_encoding_fields`] nests them); a
        /// parameter of another encoding is refused by name.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "kind")]
        pub enum EncodingConfig {
            $($(#[$doc])* #[serde(rename = $name)] $variant(<$ty as PositionalEncoding>::Params),)*
        }

        impl EncodingConfig {
            /// Which encoding this is.
            pub fn kind(&self) -> Encoding {
                match self {
                    $(EncodingConfig::$variant(_) => Encoding::$variant,)*
                }
            }

            /// Check the encoding's parameters for heads of `head_dim` dimensions.
            ///
            /// # Errors
            /// The first bad parameter, its value and its allowed range.
            pub fn validate(&self, head_dim: usize) -> Result<(), ParamError> {
                match self {
                    $(EncodingConfig::$variant(p) => p.validate(head_dim),)*
                }
            }
        }

        impl From<Encoding> for EncodingConfig {
            /// The encoding with its default parameters.
            fn from(e: Encoding) -> Self {
                match e {
                    $(Encoding::$variant => EncodingConfig::$variant(Default::default()),)*
                }
            }
        }

        /// The positional part of attention of one layer: turns per-head queries and keys into
        /// attention logits. One variant per registry line.
        #[derive(Module, Debug)]
        pub enum PositionalAttention {
            $(#[doc = concat!("See [`", stringify!($variant), "`](", stringify!($ty), ").")] $variant($ty),)*
        }

        impl PositionalAttention {
            /// Encoding `encoding` for a layer of a model with `config` (PoPE's δ drawn from
            /// `seed` when uniform): with the model's encoding parameters when `encoding` is
            /// the model's encoding, else with its defaults (a hybrid model's NoPE layers).
            pub fn new_for(encoding: Encoding, config: &ModelConfig, seed: u64, device: &Device) -> Self {
                match encoding {
                    $(Encoding::$variant => {
                        #[allow(unreachable_patterns)]
                        let params = match &config.encoding {
                            EncodingConfig::$variant(p) => p.clone(),
                            _ => Default::default(),
                        };
                        PositionalAttention::$variant(<$ty as PositionalEncoding>::new(config, &params, seed, device))
                    })*
                }
            }

            /// The encoding this layer uses.
            pub fn encoding(&self) -> Encoding {
                match self {
                    $(PositionalAttention::$variant(_) => Encoding::$variant,)*
                }
            }

            /// Apply a RoPE frequency scaling (evaluation at other lengths); encodings that do
            /// not take one are returned unchanged (evaluated as trained).
            pub fn with_scaling(self, freqs: &scaling::ScaledFreqs) -> Self {
                match self {
                    $(PositionalAttention::$variant(p) => PositionalAttention::$variant(p.with_scaling(freqs)),)*
                }
            }

            /// Keep constrained parameters in range (PoPE's δ ∈ [−2π, 0]); identity otherwise.
            pub fn project(self) -> Self {
                match self {
                    $(PositionalAttention::$variant(p) => PositionalAttention::$variant(p.project()),)*
                }
            }

            /// The fused kernel's description of this encoding, and PoPE's δ
            /// `[heads · head_dim]`.
            pub fn kernel_encoding(&self) -> (KernelEncoding, Option<Tensor<1>>) {
                match self {
                    $(PositionalAttention::$variant(p) => p.kernel_map(),)*
                }
            }

            /// Attention logits before mask and softmax.
            ///
            /// `q`, `k`: `[batch, heads, seq, head_dim]` (query and key positions `0..seq`).
            /// Returns `[batch, heads, seq_q, seq_k]`, already scaled (`1/√head_dim` for the
            /// dot-product encodings; TAPA's own normalisation).
            pub fn scores(&self, q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
                match self {
                    $(PositionalAttention::$variant(p) => PositionalEncoding::scores(p, q, k),)*
                }
            }
        }
    };
}

encodings! {
    /// No positional encoding: plain `q·k/√d` under a causal mask.
    Nope(Nope) = "nope",
    /// Rotary position embedding, `θ_i = rope_base^(−2i/d)`.
    Rope(Rope) = "rope",
    /// Polar coordinate position embedding, `θ_c = rope_base^(−(c−1)/d)` (`pope_delta_init`).
    Pope(Pope) = "pope",
    /// Token-aware phase attention (`tapa_rho`, `tapa_alpha`, `tapa_phase`).
    Tapa(Tapa) = "tapa",
    /// p-RoPE: rotary on the highest fraction `rope_p` of RoPE's frequencies only.
    PRope(PRope) = "p-rope",
    /// Partial rotary: rotary on the first `rotary_dim` dims, frequencies over `rotary_dim`.
    PartialRope(PartialRope) = "partial-rope",
}

impl EncodingConfig {
    /// The encoding's name in configs and tables.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// See [`Encoding::is_rotary`].
    pub fn is_rotary(&self) -> bool {
        self.kind().is_rotary()
    }

    /// See [`Encoding::rope_scalable`].
    pub fn rope_scalable(&self) -> bool {
        self.kind().rope_scalable()
    }

    /// The parameters as flat `key → value` pairs, `encoding` holding the name (the form of
    /// sweep files and of the `runs` table's columns).
    pub fn flat(&self) -> serde_json::Map<String, serde_json::Value> {
        let serde_json::Value::Object(mut m) =
            serde_json::to_value(self).expect("encoding config serialises")
        else {
            unreachable!("an internally tagged enum serialises to an object")
        };
        let kind = m.remove("kind").expect("tagged");
        m.insert("encoding".into(), kind);
        m
    }
}

impl EncodingConfig {
    /// `encoding` with its default parameters, except PoPE's δ drawn uniform (so δ ≠ 0 and the
    /// kernels' δ path is exercised) and TAPA's phase `phase`: the settings the kernel checks
    /// and benchmarks compare implementations at.
    pub fn for_kernel_checks(encoding: Encoding, phase: TapaPhase) -> Self {
        match encoding {
            Encoding::Pope => EncodingConfig::Pope(PopeParams {
                pope_delta_init: DeltaInit::Uniform,
            }),
            Encoding::Tapa => EncodingConfig::Tapa(TapaParams {
                tapa_phase: phase,
                ..TapaParams::default()
            }),
            e => e.into(),
        }
    }
}

impl PartialEq<Encoding> for EncodingConfig {
    fn eq(&self, other: &Encoding) -> bool {
        self.kind() == *other
    }
}

impl Default for EncodingConfig {
    /// RoPE.
    fn default() -> Self {
        Encoding::Rope.into()
    }
}

/// Every parameter name of every encoding, in registry order.
pub fn all_encoding_params() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for e in Encoding::ALL {
        for p in e.params() {
            if !out.contains(p) {
                out.push(p);
            }
        }
    }
    out
}

impl serde::Serialize for Encoding {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Encoding {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Encoding::from_name(&name)
            .ok_or_else(|| serde::de::Error::unknown_variant(&name, Encoding::NAMES))
    }
}

/// Which implementation computes causal attention, RMSNorm and GELU (same maths, different
/// cost).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionKernel {
    /// The lab's fused kernels with hand-written backwards: flash-style attention
    /// ([`crate::kernels::positional_attention`], O(seq·head_dim) memory; Rust on flex, CubeCL
    /// on wgpu/cuda), RMSNorm and GELU ([`crate::kernels::pointwise`], flex only: CubeCL
    /// devices use burn's ops, which its fusion fuses).
    #[default]
    Fused,
    /// Burn tensor ops with autodiff ([`causal_attention`], [`rms_norm`], burn's `gelu`):
    /// materialises `[seq, seq]` per head.
    Reference,
    /// Training steps on the whole-step CPU path ([`crate::fast`]: forward, backward and AdamW by
    /// hand over flat buffers, the same fused kernels); evaluation, probes and checkpoints go
    /// through the burn model with the fused kernels, refreshed from the fast path's weights
    /// before each use. Flex (CPU) only: on CubeCL devices it is `fused`.
    Fast,
}

impl AttentionKernel {
    /// Lower-case name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            AttentionKernel::Fused => "fused",
            AttentionKernel::Reference => "reference",
            AttentionKernel::Fast => "fast",
        }
    }

    /// Whether RMSNorm and GELU (and on CubeCL devices the loss, [`masked_cross_entropy_for`])
    /// run on the lab's fused kernels on `device`: with the fused (or fast) kernel choice, on flex
    /// ([`crate::kernels::pointwise`]) always, on a CubeCL device unless `LAB_POINTWISE=ops`
    /// ([`crate::kernels::PointwiseKernel`]).
    pub fn fused_pointwise(self, device: &burn::tensor::Device) -> bool {
        self != AttentionKernel::Reference
            && (crate::kernels::is_flex(device)
                || crate::kernels::pointwise_kernel() == crate::kernels::PointwiseKernel::Fused)
    }
}

/// Shape and encoding of a model. All sizes are counts (tokens, dimensions).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Vocabulary size (token ids `0..vocab_size`).
    pub vocab_size: usize,
    /// Residual stream width.
    pub d_model: usize,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Attention heads per block; `head_dim = d_model / n_heads`.
    pub n_heads: usize,
    /// Hidden width of the MLP.
    pub d_ff: usize,
    /// Positional encoding and its own parameters.
    pub encoding: EncodingConfig,
    /// RoPE base (`θ_i = rope_base^(−2i/head_dim)`): the reference frequency grid of every
    /// encoding (PoPE's `θ_c`, p-RoPE's and partial rotary's `θ_i`; the grid the probe uses for
    /// NoPE).
    pub rope_base: f64,
    /// RoPE pair layout (also how the probe reads NoPE's pairs).
    pub pair_layout: PairLayout,
    /// Attention implementation.
    #[serde(default)]
    pub attention: AttentionKernel,
    /// Hybrid layers: every `k`-th layer (layers `k−1, 2k−1, …`, 0-based) uses NoPE and the
    /// others `encoding` (Llama 4's interleaving); 0 = every layer uses `encoding`.
    #[serde(default)]
    pub nope_every: usize,
    /// Width of each block's causal depthwise convolution before attention ([`Block::canon`]);
    /// 0 = none.
    #[serde(default)]
    pub canon_len: usize,
}

/// Largest [`ModelConfig::canon_len`].
pub const MAX_CANON_LEN: usize = 8;

impl ModelConfig {
    /// A one-layer model whose only use is its attention (`PositionalAttention::new(&cfg, 0, …)`):
    /// `heads` heads of `head_dim` dims with `encoding`, RoPE base 10000, adjacent pairs, the
    /// reference attention, vocabulary 8 and `d_ff` 8 (unused). The configuration the kernel
    /// checks, the benchmarks and `lab selfcheck` compare implementations at.
    pub fn attention_only(encoding: EncodingConfig, heads: usize, head_dim: usize) -> Self {
        ModelConfig {
            vocab_size: 8,
            d_model: heads * head_dim,
            n_layers: 1,
            n_heads: heads,
            d_ff: 8,
            encoding,
            rope_base: 10000.0,
            pair_layout: PairLayout::Adjacent,
            attention: AttentionKernel::Reference,
            nope_every: 0,
            canon_len: 0,
        }
    }

    /// The encoding of layer `layer` (0-based): NoPE on every `nope_every`-th layer, `encoding`
    /// elsewhere.
    pub fn layer_encoding(&self, layer: usize) -> Encoding {
        if self.nope_every > 0 && (layer + 1) % self.nope_every == 0 {
            Encoding::Nope
        } else {
            self.encoding.kind()
        }
    }

    /// Per-head dimension.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }

    /// Build the model on `device` with weights drawn from `seed`.
    ///
    /// Shapes are assumed consistent (`d_model % n_heads == 0`, even `head_dim`): validate the
    /// run's config first ([`RunConfig::validate`](crate::config::RunConfig::validate)).
    pub fn init(&self, seed: u64, device: &Device) -> Transformer {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5EED_0F_1A1B);
        let std = 0.02;
        let resid_std = std / ((2 * self.n_layers) as f64).sqrt();
        let mut normal = |shape: [usize; 2], std: f64| -> Param<Tensor<2>> {
            let dist = Normal::new(0.0, std).expect("finite std");
            let n = shape[0] * shape[1];
            let values: Vec<f32> = (0..n).map(|_| dist.sample(&mut rng) as f32).collect();
            Param::from_data(TensorData::new(values, shape), device)
        };
        let d = self.d_model;
        let token_embedding = normal([self.vocab_size, d], std);
        let mut blocks = Vec::with_capacity(self.n_layers);
        for layer in 0..self.n_layers {
            blocks.push(Block {
                attn_norm: ones(d, device),
                wq: normal([d, d], std),
                wk: normal([d, d], std),
                wv: normal([d, d], std),
                wo: normal([d, d], resid_std),
                mlp_norm: ones(d, device),
                w_in: normal([d, self.d_ff], std),
                w_out: normal([self.d_ff, d], resid_std),
                positional: PositionalAttention::new_for(
                    self.layer_encoding(layer),
                    self,
                    seed,
                    device,
                ),
                n_heads: self.n_heads,
                kernel: self.attention,
                // Zero: the block starts as the one without it, and the seed's stream of the
                // other weights is unchanged.
                canon: (self.canon_len > 0).then(|| {
                    Param::from_data(
                        TensorData::new(vec![0.0f32; self.canon_len * d], [self.canon_len, d]),
                        device,
                    )
                }),
            });
        }
        // TAPA's phase scale at initialisation (R59, H-init): the phase columns of W_q and W_k
        // drawn √s larger, after the draw so the seed's stream is unchanged.
        for (layer, block) in blocks.iter_mut().enumerate() {
            if let (Encoding::Tapa, EncodingConfig::Tapa(p)) =
                (self.layer_encoding(layer), &self.encoding)
                && p.tapa_phase_init_scale != 1.0
            {
                let head_dim = self.head_dim();
                let amp_dim = Tapa::new(head_dim, p.tapa_rho, p.tapa_alpha, p.tapa_phase).amp_dim;
                let gain = p.tapa_phase_init_scale.sqrt() as f32;
                block.wq = scale_phase_columns(&block.wq, head_dim, amp_dim, gain, device);
                block.wk = scale_phase_columns(&block.wk, head_dim, amp_dim, gain, device);
            }
        }
        let lm_head = normal([d, self.vocab_size], std);
        Transformer {
            token_embedding,
            blocks,
            final_norm: ones(d, device),
            lm_head,
            kernel: self.attention,
        }
    }
}

/// `w` (`[d_model, d_model]`, input-major, output column `h·head_dim + j` = head `h`'s dim `j`)
/// with every head's columns `amp_dim..head_dim` multiplied by `gain`.
fn scale_phase_columns(
    w: &Param<Tensor<2>>,
    head_dim: usize,
    amp_dim: usize,
    gain: f32,
    device: &Device,
) -> Param<Tensor<2>> {
    let [rows, cols] = w.val().dims();
    let mut v = w
        .val()
        .into_data()
        .try_to_vec::<f32>()
        .expect("f32 weights");
    for r in 0..rows {
        for c in 0..cols {
            if c % head_dim >= amp_dim {
                v[r * cols + c] *= gain;
            }
        }
    }
    Param::from_data(TensorData::new(v, [rows, cols]), device)
}

fn ones(d: usize, device: &Device) -> Param<Tensor<1>> {
    Param::from_data(TensorData::new(vec![1.0f32; d], [d]), device)
}

impl PositionalAttention {
    /// Layer 0's encoding for `config` (see [`ModelConfig::layer_encoding`] for the others).
    pub fn new(config: &ModelConfig, seed: u64, device: &Device) -> Self {
        Self::new_for(config.encoding.kind(), config, seed, device)
    }
}

/// One pre-norm transformer block.
#[derive(Module, Debug)]
pub struct Block {
    /// RMSNorm gain before attention, `[d_model]`.
    pub attn_norm: Param<Tensor<1>>,
    /// Query projection `[d_model, d_model]` (input-major: `x @ wq`).
    pub wq: Param<Tensor<2>>,
    /// Key projection `[d_model, d_model]`.
    pub wk: Param<Tensor<2>>,
    /// Value projection `[d_model, d_model]`.
    pub wv: Param<Tensor<2>>,
    /// Output projection `[d_model, d_model]`.
    pub wo: Param<Tensor<2>>,
    /// RMSNorm gain before the MLP, `[d_model]`.
    pub mlp_norm: Param<Tensor<1>>,
    /// MLP input `[d_model, d_ff]`.
    pub w_in: Param<Tensor<2>>,
    /// MLP output `[d_ff, d_model]`.
    pub w_out: Param<Tensor<2>>,
    /// The encoding's score function.
    pub positional: PositionalAttention,
    /// Number of heads.
    pub n_heads: usize,
    /// Attention implementation.
    #[module(skip)]
    pub kernel: AttentionKernel,
    /// Causal depthwise convolution before attention, `[canon_len, d_model]` ("Canon-A" of
    /// Allen-Zhu, *Physics of Language Models, Part 4.1*, 2025): the normalised input `h`
    /// becomes `h_t + Σ_{j<canon_len} w_j ⊙ h_{t−j}` (`h_{t−j} = 0` before the sequence), so
    /// every position sees its last few tokens before any attention. `None` = no canon layer.
    pub canon: Option<Param<Tensor<2>>>,
}

/// The causal depthwise convolution of [`Block::canon`] with its residual: `h`: `[batch, seq,
/// d]`, `w`: `[len, d]` → `[batch, seq, d]`, `out_t = h_t + Σ_j w_j ⊙ h_{t−j}` (zero before the
/// first position).
pub fn canon_conv(h: Tensor<3>, w: Tensor<2>) -> Tensor<3> {
    let [b, l, d] = h.dims();
    let [len, _] = w.dims();
    let mut out = h.clone();
    for j in 0..len.min(l) {
        let wj = w.clone().slice([j..j + 1, 0..d]).reshape([1, 1, d]);
        let shifted = if j == 0 {
            h.clone()
        } else {
            Tensor::cat(
                vec![
                    Tensor::zeros([b, j, d], &h.device()),
                    h.clone().slice([0..b, 0..l - j, 0..d]),
                ],
                1,
            )
        };
        out = out + shifted * wj;
    }
    out
}

/// Per-layer queries and keys, as seen by the positional score function (before any rotation).
pub struct LayerQk {
    /// `[batch, heads, seq, head_dim]`
    pub q: Tensor<4>,
    /// `[batch, heads, seq, head_dim]`
    pub k: Tensor<4>,
}

impl Block {
    /// `[batch, seq, d_model]` → `[batch, heads, seq, head_dim]`, a strided view (no copy). The
    /// CubeCL attention takes it as it is (RoPE's and PoPE's first kernel reads it in place,
    /// NoPE's and TAPA's copies q, k, v in one launch) and gives the output and the gradients back
    /// in the same layout, so that the merge after the attention is free too
    /// (`kernels::cube::kernel_qk`); other consumers copy it.
    fn split_heads(&self, x: Tensor<3>) -> Tensor<4> {
        let [b, l, d] = x.dims();
        x.reshape([b, l, self.n_heads, d / self.n_heads])
            .swap_dims(1, 2)
    }

    /// `x`: `[batch, seq, d_model]` → same shape. `mask`: `[seq, seq]`, true where a key is
    /// hidden (key position > query position); read by the reference attention only (the fused
    /// kernels mask by position), which panics without it. Pushes this layer's q/k to `qk` when
    /// given.
    pub fn forward(
        &self,
        x: Tensor<3>,
        mask: Option<&Tensor<2, Bool>>,
        qk: Option<&mut Vec<LayerQk>>,
    ) -> Tensor<3> {
        let [b, l, d] = x.dims();
        // The fused RMSNorm/GELU: Rust kernels on flex, CubeCL kernels on wgpu/cuda
        // (`LAB_POINTWISE=ops` keeps burn's tensor operations there).
        let pointwise = self.kernel.fused_pointwise(&x.device());
        let norm = |x: Tensor<3>, gain: &Param<Tensor<1>>| {
            if pointwise {
                crate::kernels::pointwise::rms_norm(x, gain.val())
            } else {
                rms_norm(x, gain)
            }
        };
        let h = norm(x.clone(), &self.attn_norm);
        let h = match &self.canon {
            Some(w) => canon_conv(h, w.val()),
            None => h,
        };
        let q = self.split_heads(linear(h.clone(), &self.wq));
        let k = self.split_heads(linear(h.clone(), &self.wk));
        let v = self.split_heads(linear(h, &self.wv));
        if let Some(store) = qk {
            store.push(LayerQk {
                q: q.clone(),
                k: k.clone(),
            });
        }
        let out = match self.kernel {
            AttentionKernel::Reference => causal_attention(
                &self.positional,
                q,
                k,
                v,
                mask.expect("the reference attention needs the causal mask"),
            ),
            AttentionKernel::Fused | AttentionKernel::Fast => {
                let (encoding, delta) = self.positional.kernel_encoding();
                crate::kernels::positional_attention(q, k, v, delta, encoding)
            }
        };
        let out = out.swap_dims(1, 2).reshape([b, l, d]);
        let x = x + linear(out, &self.wo);
        let h = norm(x.clone(), &self.mlp_norm);
        let h = linear(h, &self.w_in);
        let h = if pointwise {
            crate::kernels::pointwise::gelu(h)
        } else {
            gelu(h)
        };
        x + linear(h, &self.w_out)
    }
}

/// Causal attention with a positional score function (the reference implementation: it
/// materialises the `[seq, seq]` score matrix per head).
///
/// `q`, `k`, `v`: `[batch, heads, seq, head_dim]`; `mask`: `[seq, seq]`, true where key position >
/// query position. Returns `[batch, heads, seq, head_dim]`. Masked logits are set to −1e9 before
/// the softmax (a finite value, so even a fully masked row could not produce NaN).
pub fn causal_attention(
    positional: &PositionalAttention,
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask: &Tensor<2, Bool>,
) -> Tensor<4> {
    let scores = positional.scores(q, k);
    let scores = scores.mask_fill(mask.clone().unsqueeze::<4>(), -1.0e9f32);
    softmax(scores, 3).matmul(v)
}

/// The `[seq, seq]` causal mask: true where the key position is after the query position
/// (row = query `t`, column = key `s`, hidden when `s > t`). burn's `tril_mask(_, 0)` is false on
/// the lower triangle and the diagonal and true elsewhere, which is exactly that.
pub fn causal_mask(seq: usize, device: &Device) -> Tensor<2, Bool> {
    Tensor::<2, Bool>::tril_mask([seq, seq], 0, device)
}

/// `x @ w` for `x` `[batch, seq, d_in]` and `w` `[d_in, d_out]`, as one `[batch·seq, d_in]`
/// matrix product (a batched product with a broadcast weight runs `batch` small products, and its
/// weight gradient is a sum of `batch` partial products).
pub fn linear(x: Tensor<3>, w: &Param<Tensor<2>>) -> Tensor<3> {
    let [b, l, d] = x.dims();
    let w = w.val();
    let d_out = w.dims()[1];
    x.reshape([b * l, d]).matmul(w).reshape([b, l, d_out])
}

/// RMSNorm: `x / √(mean(x²) + 1e-6) · gain` over the last axis. `x`: `[batch, seq, d]`.
pub fn rms_norm(x: Tensor<3>, gain: &Param<Tensor<1>>) -> Tensor<3> {
    let rms = (x.clone().square().mean_dim(2) + 1e-6).sqrt();
    x / rms * gain.val().unsqueeze::<3>()
}

/// The whole model.
#[derive(Module, Debug)]
pub struct Transformer {
    /// `[vocab, d_model]`
    pub token_embedding: Param<Tensor<2>>,
    /// The blocks, bottom to top.
    pub blocks: Vec<Block>,
    /// Final RMSNorm gain `[d_model]`.
    pub final_norm: Param<Tensor<1>>,
    /// Output head `[d_model, vocab]`.
    pub lm_head: Param<Tensor<2>>,
    /// Kernels for the final RMSNorm (the blocks carry their own).
    #[module(skip)]
    pub kernel: AttentionKernel,
}

impl Transformer {
    /// Project constrained parameters back into range (after an optimiser step).
    pub fn project(mut self) -> Self {
        self.blocks = self
            .blocks
            .into_iter()
            .map(|mut b| {
                b.positional = b.positional.project();
                b
            })
            .collect();
        self
    }

    /// Use `kernel` for attention, RMSNorm and GELU in every layer.
    pub fn with_attention(mut self, kernel: AttentionKernel) -> Self {
        self.kernel = kernel;
        for b in &mut self.blocks {
            b.kernel = kernel;
        }
        self
    }

    /// Apply a RoPE frequency scaling to every layer (see [`PositionalAttention::with_scaling`]).
    pub fn with_scaling(mut self, freqs: &scaling::ScaledFreqs) -> Self {
        self.blocks = self
            .blocks
            .into_iter()
            .map(|mut b| {
                b.positional = b.positional.with_scaling(freqs);
                b
            })
            .collect();
        self
    }

    /// Logits `[batch, seq, vocab]` for token ids `[batch, seq]`.
    pub fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        self.forward_inner(tokens, None)
    }

    /// Logits and every layer's queries/keys (for the frequency probe).
    pub fn forward_with_qk(&self, tokens: Tensor<2, Int>) -> (Tensor<3>, Vec<LayerQk>) {
        let mut qk = Vec::with_capacity(self.blocks.len());
        let logits = self.forward_inner(tokens, Some(&mut qk));
        (logits, qk)
    }

    /// Causal attention probabilities of layer `layer`, `[batch, heads, seq_q, seq_k]` (zero above
    /// the diagonal), from its queries and keys `q`, `k`: `[batch, heads, seq, head_dim]` (as
    /// [`Transformer::forward_with_qk`] returns them) and the encoding's reference scores (the
    /// same maths as the fused kernels). Materialises `seq × seq` per head: for probes on short
    /// sequences.
    pub fn attention_probs(&self, layer: usize, q: Tensor<4>, k: Tensor<4>) -> Tensor<4> {
        let [_, _, l, _] = q.dims();
        let mask = causal_mask(l, &q.device());
        let scores = self.blocks[layer].positional.scores(q, k);
        softmax(scores.mask_fill(mask.unsqueeze::<4>(), -1.0e9f32), 3)
    }

    /// Logits `[batch, seq, vocab]` and every layer's causal attention probabilities as host
    /// vectors, each `[batch, heads, seq_q, seq_k]` row-major ([`Transformer::forward_with_qk`]
    /// then [`Transformer::attention_probs`] per layer). For probes on short sequences.
    pub fn forward_with_probs(&self, tokens: Tensor<2, Int>) -> (Tensor<3>, Vec<Vec<f32>>) {
        let (logits, qk) = self.forward_with_qk(tokens);
        let probs = qk
            .into_iter()
            .enumerate()
            .map(|(l, layer_qk)| {
                self.attention_probs(l, layer_qk.q, layer_qk.k)
                    .into_data()
                    .convert::<f32>()
                    .try_to_vec::<f32>()
                    .expect("f32 probabilities")
            })
            .collect();
        (logits, probs)
    }

    fn forward_inner(
        &self,
        tokens: Tensor<2, Int>,
        mut qk: Option<&mut Vec<LayerQk>>,
    ) -> Tensor<3> {
        let [_, l] = tokens.dims();
        let device = tokens.device();
        // Only the reference attention reads the mask: the fused kernels skip building it (a few
        // launches per step on CubeCL devices).
        let reference = self
            .blocks
            .iter()
            .any(|b| b.kernel == AttentionKernel::Reference);
        let mask = reference.then(|| causal_mask(l, &device));
        let mut x = embedding(self.token_embedding.val(), tokens);
        for block in &self.blocks {
            x = block.forward(x, mask.as_ref(), qk.as_deref_mut());
        }
        let x = if self.kernel.fused_pointwise(&device) {
            crate::kernels::pointwise::rms_norm(x, self.final_norm.val())
        } else {
            rms_norm(x, &self.final_norm)
        };
        linear(x, &self.lm_head)
    }
}

/// Mean cross-entropy over scored positions and the number of correct argmax predictions.
///
/// `logits`: `[batch, seq, vocab]`; `targets`: `[batch, seq]` token ids; `mask`: `[batch, seq]`
/// with 1.0 where scored, 0.0 elsewhere; `n_scored`: the number of ones in `mask`, known on the
/// host (the divisor, at least 1; no reduction of `mask` on the device). Returns `(loss [1] in
/// nats, correct [1])` where `correct` counts scored positions whose argmax equals the target
/// (not differentiable).
pub fn masked_cross_entropy(
    logits: Tensor<3>,
    targets: Tensor<2, Int>,
    mask: Tensor<2>,
    n_scored: usize,
) -> (Tensor<1>, Tensor<1>) {
    let [b, l, _] = logits.dims();
    let log_probs = burn::tensor::activation::log_softmax(logits.clone(), 2);
    let picked = log_probs
        .gather(2, targets.clone().unsqueeze_dim::<3>(2))
        .reshape([b, l]);
    let loss = -(picked * mask.clone()).sum() / n_scored.max(1) as f64;
    let pred = logits.detach().argmax(2).reshape([b, l]);
    let correct = (pred.equal(targets).float() * mask).sum();
    (loss, correct)
}

/// [`masked_cross_entropy`] as a model with the attention `kernel` computes it on `logits`'
/// device: on a CubeCL device with the fused (or fast) kernels, one kernel forward and one
/// backward ([`crate::kernels::pointwise::cross_entropy_rows`]; the same value to f32 rounding,
/// the targets cast to f32 ids first) unless `LAB_POINTWISE=ops`; burn's tensor operations
/// elsewhere (flex always, and the reference kernel everywhere).
pub fn masked_cross_entropy_for(
    kernel: AttentionKernel,
    logits: Tensor<3>,
    targets: Tensor<2, Int>,
    mask: Tensor<2>,
    n_scored: usize,
) -> (Tensor<1>, Tensor<1>) {
    let device = logits.device();
    if kernel.fused_pointwise(&device) && !crate::kernels::is_flex(&device) {
        let (loss, correct) =
            crate::kernels::pointwise::cross_entropy_rows(logits, targets.float(), mask);
        return (loss.sum() / n_scored.max(1) as f64, correct.sum());
    }
    masked_cross_entropy(logits, targets, mask, n_scored)
}
