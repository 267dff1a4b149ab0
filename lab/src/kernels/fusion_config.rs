//! burn's operation fusion as the lab configures it: the beam search's `max_blocks`
//! (`LAB_FUSION_MAX_BLOCKS`, default 1), and whether the CubeCL attention joins the fusion stream
//! as a lazy operation (`LAB_FUSION_ATTENTION`, default `lazy`; [`AttentionMode`]).
//!
//! burn-fusion 0.22 splits each stretch of queued operations into at most `max_blocks`
//! independent blocks and fuses each (burn's default: 5). On the lab's training step that search
//! often ends in burn-fusion's fallback "unfused stream order" (its ordering repair finds a cycle
//! between the blocks and then runs every operation of the stretch as its own kernel): with 5
//! blocks the quick model's step launched 261–266 kernels on lavapipe, 35 of them single
//! multiplies; with one block (operations fused in stream order, as far as each fused kernel
//! reaches) 204, 7 of them single multiplies. The lazy attention, not the block count, is what
//! cut the host's share of a small step (dry run: 33 → 19 ms with both, 31 with one block alone;
//! docs/performance.md, "One fusion block per stretch"). Other values stay available for
//! measurement; the rest of burn's configuration (`burn.toml`, `BURN_FUSION_LOG`) is kept.

/// The largest `LAB_FUSION_MAX_BLOCKS` accepted (burn's search costs grow with the square of it).
pub const MAX_BLOCKS_LIMIT: usize = 64;

/// The lab's default `max_blocks`.
pub const DEFAULT_MAX_BLOCKS: usize = 1;

/// Parse the value of `LAB_FUSION_MAX_BLOCKS` (`None` when unset: [`DEFAULT_MAX_BLOCKS`]).
///
/// # Errors
/// Anything but an integer in `1..=64`: one line naming the variable and the range.
pub fn parse_max_blocks(value: Option<&str>) -> Result<usize, String> {
    match value.map(str::trim) {
        None | Some("") => Ok(DEFAULT_MAX_BLOCKS),
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=MAX_BLOCKS_LIMIT).contains(&n) => Ok(n),
            _ => Err(format!(
                "LAB_FUSION_MAX_BLOCKS = `{text}`: allowed values are integers from 1 to {MAX_BLOCKS_LIMIT} (default {DEFAULT_MAX_BLOCKS}; burn's own default is 5)"
            )),
        },
    }
}

/// How the CubeCL attention runs on `Fusion<CubeBackend>` (`LAB_FUSION_ATTENTION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionMode {
    /// One custom operation in burn's fusion stream for the forward and one for the backward:
    /// the kernels run when the stream reaches them (the default).
    Lazy,
    /// The inputs resolved to device tensors at each call, which drains the stream (the lab's
    /// path until 2026-12-05; kept to compare on a GPU).
    Eager,
}

impl AttentionMode {
    /// Parse the value of `LAB_FUSION_ATTENTION` (`None` when unset: `Lazy`).
    ///
    /// # Errors
    /// Anything but `lazy` or `eager`: one line naming the variable and the values allowed.
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        let choices = [
            ("lazy", AttentionMode::Lazy),
            ("eager", AttentionMode::Eager),
        ];
        super::parse_switch("LAB_FUSION_ATTENTION", value, choices)
    }
}

impl AttentionMode {
    /// `lazy` or `eager`, as `LAB_FUSION_ATTENTION` spells it.
    pub fn name(self) -> &'static str {
        match self {
            AttentionMode::Lazy => "lazy",
            AttentionMode::Eager => "eager",
        }
    }
}

static ATTENTION_MODE: std::sync::OnceLock<AttentionMode> = std::sync::OnceLock::new();

static MAX_BLOCKS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// `(max_blocks, attention mode)` as [`configure`] set them, in a build with burn's fusion;
/// `None` before `configure` or without fusion (what `lab bench train-step` reports as `fusion`).
pub fn settings() -> Option<(usize, AttentionMode)> {
    if !cfg!(feature = "fusion") {
        return None;
    }
    Some((*MAX_BLOCKS.get()?, attention_mode()))
}

/// The attention mode [`configure`] set (`Lazy` when it was never called, as in the tests).
pub fn attention_mode() -> AttentionMode {
    *ATTENTION_MODE.get().unwrap_or(&AttentionMode::Lazy)
}

/// Install burn's configuration for this process with `max_blocks` from `LAB_FUSION_MAX_BLOCKS`
/// ([`parse_max_blocks`]) and fix the attention mode from `LAB_FUSION_ATTENTION`
/// ([`AttentionMode::parse`]); call before the first fused operation (`Backend::device` does).
/// Later calls, and calls after burn has read its configuration, change nothing. Without the
/// `fusion` feature only the variables' values are checked.
///
/// # Errors
/// A `LAB_FUSION_MAX_BLOCKS` or `LAB_FUSION_ATTENTION` value that its parser refuses.
pub fn configure() -> Result<(), String> {
    let max_blocks = parse_max_blocks(std::env::var("LAB_FUSION_MAX_BLOCKS").ok().as_deref())?;
    let mode = AttentionMode::parse(std::env::var("LAB_FUSION_ATTENTION").ok().as_deref())?;
    let _ = ATTENTION_MODE.set(mode);
    let _ = MAX_BLOCKS.set(max_blocks);
    #[cfg(all(feature = "fusion", any(feature = "wgpu", feature = "cuda-plain")))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| install(max_blocks));
    }
    #[cfg(not(all(feature = "fusion", any(feature = "wgpu", feature = "cuda-plain"))))]
    let _ = max_blocks;
    Ok(())
}

/// `config` with the fusion search's `max_blocks` set, everything else kept. `BurnConfig`'s
/// fields are private, so the value goes through its TOML form.
///
/// # Panics
/// If burn's configuration does not survive its own TOML form (a burn bug).
#[cfg(all(feature = "fusion", any(feature = "wgpu", feature = "cuda-plain")))]
pub fn with_max_blocks(config: burn::BurnConfig, max_blocks: usize) -> burn::BurnConfig {
    let mut value = toml::Table::try_from(&config).expect("burn's configuration serializes");
    let fusion = value
        .entry("fusion")
        .or_insert_with(|| toml::Table::new().into());
    let search = fusion
        .as_table_mut()
        .expect("fusion is a table")
        .entry("beam_search")
        .or_insert_with(|| toml::Table::new().into());
    search
        .as_table_mut()
        .expect("beam_search is a table")
        .insert("max_blocks".into(), (max_blocks as i64).into());
    value
        .try_into()
        .expect("burn's configuration deserializes from its own TOML form")
}

#[cfg(all(feature = "fusion", any(feature = "wgpu", feature = "cuda-plain")))]
fn install(max_blocks: usize) {
    use cubecl::config::RuntimeConfig;
    let config = burn::BurnConfig::from_current_dir().override_from_env();
    // `false` when burn already holds a configuration (a fused operation ran before): it stays.
    let _ = burn::BurnConfig::try_set(with_max_blocks(config, max_blocks));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_lab_fusion_max_blocks() {
        assert_eq!(parse_max_blocks(None), Ok(1));
        assert_eq!(parse_max_blocks(Some(" ")), Ok(1));
        assert_eq!(parse_max_blocks(Some("5")), Ok(5));
        assert_eq!(parse_max_blocks(Some("64")), Ok(64));
        for bad in ["0", "65", "-1", "two", "1.5"] {
            let err = parse_max_blocks(Some(bad)).unwrap_err();
            assert!(
                err.starts_with(&format!("LAB_FUSION_MAX_BLOCKS = `{bad}`")),
                "{err}"
            );
            assert!(err.contains("from 1 to 64"), "{err}");
        }
    }

    #[test]
    fn parse_lab_fusion_attention() {
        assert_eq!(AttentionMode::parse(None), Ok(AttentionMode::Lazy));
        assert_eq!(AttentionMode::parse(Some("lazy")), Ok(AttentionMode::Lazy));
        assert_eq!(
            AttentionMode::parse(Some(" eager ")),
            Ok(AttentionMode::Eager)
        );
        let err = AttentionMode::parse(Some("sync")).unwrap_err();
        assert!(err.starts_with("LAB_FUSION_ATTENTION = `sync`"), "{err}");
    }
}
