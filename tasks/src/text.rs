//! Language modelling on a real corpus (SCIENCE.md section 2, "Real sequences"): windows of a
//! corpus's token stream ([`crate::granularity`]) as next-token examples.
//!
//! The stream is split **by position** into three parts that never overlap: the first
//! `1 − eval_fraction − val_fraction` of the tokens are the training part, the next
//! `val_fraction` the validation part ([`Split::Val`]), the last `eval_fraction` the held-out
//! test part ([`Split::Eval`]); no window of one part overlaps another part. Example `index` of a split is the window of `seq_len + 1` tokens starting at a
//! position drawn uniformly (from [`crate::example_rng`]`(seed, split, index)`) inside that
//! split's part: `input = x[s..s+L]`, `target = x[s+1..s+L+1]`, every position scored.
//!
//! ```no_run
//! use tasks::Split;
//! use tasks::text::TextConfig;
//! let cfg = TextConfig { corpus: "shakespeare".into(), granularity: "char".into(), seq_len: 128,
//!                        eval_fraction: 0.1, val_fraction: 0.05, data_dir: "data".into() };
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
    /// Fraction of the stream just before the evaluation part held out for validation, in
    /// `[0, 0.5)` (`0`: no validation part).
    pub val_fraction: f64,
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
    /// `eval_fraction` of the stream for evaluation and the `val_fraction` before it for
    /// validation.
    pub fn config(&self, seq_len: usize, eval_fraction: f64, val_fraction: f64) -> TextConfig {
        TextConfig {
            corpus: self.corpus.clone(),
            granularity: self.granularity.clone(),
            seq_len,
            eval_fraction,
            val_fraction,
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

    /// Token range `[lo, hi)` of `split` in a stream of `n` tokens: train `[0, v)`, val
    /// `[v, e)`, eval `[e, n)` with `e = round((1 − eval_fraction)·n)` and
    /// `v = round((1 − eval_fraction − val_fraction)·n)`.
    pub fn range(&self, n: usize, split: Split) -> (usize, usize) {
        let cut = ((1.0 - self.eval_fraction) * n as f64).round() as usize;
        let cut_val =
            (((1.0 - self.eval_fraction - self.val_fraction) * n as f64).round() as usize).min(cut);
        match split {
            Split::Train => (0, cut_val),
            Split::Val => (cut_val, cut),
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
        if !(self.val_fraction >= 0.0 && self.val_fraction < 0.5) {
            return Err(TaskError::out_of_range(
                "val_fraction",
                self.val_fraction,
                "[0, 0.5)",
            ));
        }
        let s = self.stream()?;
        for split in [Split::Eval, Split::Val] {
            if split == Split::Val && self.val_fraction == 0.0 {
                continue;
            }
            let (lo, hi) = self.range(s.ids.len(), split);
            if hi - lo < self.seq_len + 1 {
                return Err(TaskError::out_of_range(
                    "seq_len",
                    self.seq_len,
                    format!(
                        "1..={} ({} tokens − 1)",
                        (hi - lo).saturating_sub(1),
                        if split == Split::Eval {
                            "held-out"
                        } else {
                            "validation"
                        }
                    ),
                ));
            }
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
    /// [`Split::max_index`].
    pub fn example(&self, seed: u64, split: Split, index: u64) -> Result<Example, TaskError> {
        let s = self.stream()?;
        let mut rng = example_rng(seed, split, index)?;
        let (lo, hi) = self.range(s.ids.len(), split);
        if hi - lo < self.seq_len + 1 {
            return Err(TaskError::out_of_range(
                "seq_len",
                self.seq_len,
                format!(
                    "1..={} ({} tokens − 1)",
                    (hi - lo).saturating_sub(1),
                    split.name()
                ),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(eval_fraction: f64, val_fraction: f64) -> TextConfig {
        TextConfig {
            corpus: "shakespeare".into(),
            granularity: "char".into(),
            seq_len: 8,
            eval_fraction,
            val_fraction,
            data_dir: "data".into(),
        }
    }

    #[test]
    fn the_three_parts_tile_the_stream_in_order() {
        let c = cfg(0.1, 0.05);
        assert_eq!(c.range(1000, Split::Train), (0, 850));
        assert_eq!(c.range(1000, Split::Val), (850, 900));
        assert_eq!(c.range(1000, Split::Eval), (900, 1000));
        // Rounded cuts still tile [0, n) without a gap or an overlap.
        let c = cfg(0.1, 0.05);
        let (t, v, e) = (
            c.range(1001, Split::Train),
            c.range(1001, Split::Val),
            c.range(1001, Split::Eval),
        );
        assert_eq!((t.0, t.1, v.1, e.1), (0, v.0, e.0, 1001));
        // Without a validation part the training and evaluation parts are those of before.
        let c = cfg(0.1, 0.0);
        assert_eq!(c.range(1000, Split::Train), (0, 900));
        assert_eq!(c.range(1000, Split::Val), (900, 900));
        assert_eq!(c.range(1000, Split::Eval), (900, 1000));
    }

    #[test]
    fn val_fraction_out_of_range_is_named() {
        for v in [-0.1, 0.5, f64::NAN] {
            let e = cfg(0.1, v).validate().unwrap_err().to_string();
            assert!(e.starts_with("val_fraction = "), "{e}");
            assert!(e.ends_with("must be in [0, 0.5)"), "{e}");
        }
    }
}
