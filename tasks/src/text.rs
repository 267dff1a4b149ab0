//! Language modelling on a real corpus (SCIENCE.md section 2, "Real sequences"): windows of a
//! corpus's token stream ([`crate::granularity`]) as next-token examples.
//!
//! The stream is split **by position**: the first `1 − eval_fraction` of the tokens are the
//! training part, the rest the held-out part (so no evaluation window overlaps a training
//! window). Example `index` of a split is the window of `seq_len + 1` tokens starting at a
//! position drawn uniformly (from [`crate::example_rng`]`(seed, split, index)`) inside that
//! split's part: `input = x[s..s+L]`, `target = x[s+1..s+L+1]`, every position scored.
//!
//! ```no_run
//! use tasks::Split;
//! use tasks::text::TextConfig;
//! let cfg = TextConfig { corpus: "shakespeare".into(), granularity: "char".into(), seq_len: 128,
//!                        eval_fraction: 0.1, data_dir: "data".into() };
//! let ex = cfg.example(0, Split::Eval, 3)?;   // needs `make data`
//! assert_eq!(ex.input[1..], ex.target[..127]);
//! # Ok::<(), tasks::TaskError>(())
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use rand::Rng;

use crate::granularity::{Granularity, TokenStream, cached_stream};
use crate::{Example, Split, TaskError, check_batch, example_rng};

/// Configuration of a corpus language-modelling task.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TextConfig {
    /// Corpus name (`shakespeare`, `ecoli`, `chorales`).
    pub corpus: String,
    /// Granularity name (see [`crate::granularity`]).
    pub granularity: String,
    /// Context length, tokens.
    pub seq_len: usize,
    /// Fraction of the stream (its end) held out for evaluation, in `(0, 0.5]`.
    pub eval_fraction: f64,
    /// Data folder.
    pub data_dir: PathBuf,
}

/// The data folder: `$LAB_DATA_DIR` if set, else `data`.
pub fn default_data_dir() -> PathBuf {
    std::env::var_os("LAB_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("data"))
}

/// The corpus task's own parameters in a training run (the run's `seq_len` completes them into
/// a [`TextConfig`] reading [`default_data_dir`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextParams {
    /// Corpus name (`shakespeare`, `ecoli`, `chorales`).
    pub corpus: String,
    /// Granularity name (`char`, `word`, `bpe-V`, `token`, …; see [`crate::granularity`]).
    pub granularity: String,
}

impl TextParams {
    /// Parameter names, in serialisation order (checked by a test).
    pub const NAMES: &'static [&'static str] = &["corpus", "granularity"];

    /// The generator config for a run with context `seq_len`, holding out the last
    /// `eval_fraction` of the stream.
    pub fn config(&self, seq_len: usize, eval_fraction: f64) -> TextConfig {
        TextConfig {
            corpus: self.corpus.clone(),
            granularity: self.granularity.clone(),
            seq_len,
            eval_fraction,
            data_dir: default_data_dir(),
        }
    }
}

impl TextConfig {
    fn corpus_err(&self, e: impl std::fmt::Display) -> TaskError {
        TaskError::Invalid {
            field: "corpus",
            message: e.to_string(),
        }
    }

    /// The token stream (loaded once per process).
    ///
    /// # Errors
    /// [`TaskError::Invalid`] on `granularity` or `corpus` (missing data: run `make data`).
    pub fn stream(&self) -> Result<Arc<TokenStream>, TaskError> {
        let g = Granularity::parse(&self.granularity)?;
        cached_stream(&self.data_dir, &self.corpus, g).map_err(|e| self.corpus_err(e))
    }

    /// Token range `[lo, hi)` of `split`.
    fn range(&self, n: usize, split: Split) -> (usize, usize) {
        let cut = ((1.0 - self.eval_fraction) * n as f64).round() as usize;
        match split {
            Split::Train => (0, cut),
            Split::Eval => (cut, n),
        }
    }

    /// Check the fields and that the corpus is there with enough tokens in each split.
    ///
    /// # Errors
    /// [`TaskError`] naming the field.
    pub fn validate(&self) -> Result<(), TaskError> {
        if !(self.eval_fraction > 0.0 && self.eval_fraction <= 0.5) {
            return Err(TaskError::out_of_range(
                "eval_fraction",
                self.eval_fraction,
                "(0, 0.5]",
            ));
        }
        let s = self.stream()?;
        let (lo, hi) = self.range(s.ids.len(), Split::Eval);
        if hi - lo < self.seq_len + 1 {
            return Err(TaskError::out_of_range(
                "seq_len",
                self.seq_len,
                format!("1..={} (held-out tokens − 1)", (hi - lo).saturating_sub(1)),
            ));
        }
        Ok(())
    }

    /// Size of the id space.
    ///
    /// # Errors
    /// As [`TextConfig::stream`].
    pub fn vocab_size(&self) -> Result<usize, TaskError> {
        Ok(self.stream()?.vocab_size)
    }

    /// Example `index` of `split` (see the [module docs](self)).
    ///
    /// # Errors
    /// As [`TextConfig::validate`]; [`TaskError::OutOfRange`] on `index` past
    /// [`crate::MAX_INDEX`].
    pub fn example(&self, seed: u64, split: Split, index: u64) -> Result<Example, TaskError> {
        let s = self.stream()?;
        let mut rng = example_rng(seed, split, index)?;
        let (lo, hi) = self.range(s.ids.len(), split);
        if hi - lo < self.seq_len + 1 {
            return Err(TaskError::out_of_range(
                "seq_len",
                self.seq_len,
                format!("1..={} ({split:?} tokens − 1)", (hi - lo).saturating_sub(1)),
            ));
        }
        let start = rng.random_range(lo..=hi - self.seq_len - 1);
        let w = &s.ids[start..start + self.seq_len + 1];
        Ok(Example {
            input: w[..self.seq_len].to_vec(),
            target: w[1..].to_vec(),
            mask: vec![true; self.seq_len],
        })
    }

    /// Examples `index0..index0 + n` of `split`.
    ///
    /// # Errors
    /// As [`TextConfig::example`].
    pub fn batch(
        &self,
        seed: u64,
        split: Split,
        index0: u64,
        n: usize,
    ) -> Result<Vec<Example>, TaskError> {
        check_batch(index0, n)?;
        (0..n as u64)
            .map(|i| self.example(seed, split, index0 + i))
            .collect()
    }
}
