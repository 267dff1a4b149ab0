//! Synthetic and real sequence tasks for the lab.
//!
//! Every generator in this crate is a pure function of `(task config, split, seed, example index)`:
//! the same arguments always give the same [`Example`], any example can be produced on its own
//! (so batches can be generated in any order or in parallel), and the training and evaluation
//! splits draw from disjoint random streams (see [`example_rng`]).
//!
//! Each example is next-token shaped: an input of `seq_len` token ids, a target of `seq_len`
//! token ids (`target[t]` is what the model must emit at position `t`) and a loss mask of
//! `seq_len` booleans saying which targets are scored.
//!
//! Tasks:
//! - [`block`]: block-structured sequences of width `B` (`copy` and `recall`), the
//!   dependency-width knob of SCIENCE.md section 2.
//! - [`indirect`]: indirect indexing, the PoPE diagnostic (find a query letter in a string of
//!   distinct letters, step a signed shift, emit the letter there); character-level tokens, one
//!   scored token per example.
//! - [`igsm`]: iGSM-style modular arithmetic (after *Physics of Language Models 2.1*): a random
//!   DAG of named quantities, shuffled statements, a question, and a step-by-step solution whose
//!   number of operations is the knob `ops`; train/eval split by solution-structure hash; a
//!   checker that re-derives every step. Character-level tokens; the solution is scored.
//! - [`needle`]: needle retrieval (TAPA/RULER style): a `key:value;` needle at a chosen relative
//!   depth in a haystack of noise letters or distractor records, queried at the end of a
//!   `seq_len`-token context; the value tokens are scored.
//! - [`corpus`]: real corpora (Shakespeare, the E. coli genome, Bach chorales) fetched from the
//!   package registries into `data/` and converted to token streams; [`granularity`]: bytes,
//!   characters, words, k-mers, BPE (HF `tokenizers`), chorale tokens and frames.
//! - [`text`]: language modelling on a corpus (windows of its token stream, held-out split by
//!   position).
//! - [`mi`]: mutual-information profiles `I(r)` of token streams and of tasks (Miller–Madow /
//!   Grassberger, shuffled baseline, dependency width, decay fit, collapse across granularities).
//!
//! # Random streams
//!
//! All randomness comes from ChaCha8 ([`rand_chacha::ChaCha8Rng`]) keyed by
//! `ChaCha8Rng::seed_from_u64(seed)` (the 32-byte key is the PCG32 expansion of `seed` defined by
//! `rand_core` 0.9). ChaCha offers 2^64 stream ids per key; distinct stream ids give
//! non-overlapping keystreams by construction. This crate assigns them as follows:
//!
//! | stream id          | used for                                  |
//! |--------------------|-------------------------------------------|
//! | `0`                | [`split_rng`]`(seed, Split::Train)`       |
//! | `1`                | [`split_rng`]`(seed, Split::Eval)`        |
//! | `2 + 2·index`      | [`example_rng`]`(seed, Split::Train, index)` |
//! | `3 + 2·index`      | [`example_rng`]`(seed, Split::Eval, index)`, `index < 2^62`  |
//! | `3 + 2·(2^62 + index)` | [`example_rng`]`(seed, Split::Val, index)` |
//!
//! so no two of these generators ever share a single random word, and in particular no training
//! example shares randomness with an evaluation example, and no validation example with a test
//! (evaluation) one: validation takes the held-out side's stream ids from [`VAL_INDEX_BASE`] on,
//! test the ids below it ([`Split::max_index`]). Outputs are reproducible for a fixed
//! version of `rand` (0.9) and `rand_chacha` (0.9); the test suite pins a few values so that a
//! dependency upgrade that changes them is noticed.

#![warn(missing_docs)]

/// Longest context any generator is asked for (tokens): runs, evaluations, `lab gen` and
/// `lab mi --task` all refuse a larger `seq_len` before allocating anything.
pub const MAX_SEQ_LEN: usize = 1 << 16;

pub mod block;
pub mod corpus;
pub mod granularity;
pub mod igsm;
pub mod indirect;
pub mod mi;
pub mod needle;
pub mod text;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Error returned when a task configuration (or a request such as an example index) is invalid.
///
/// `Display` is a single line naming the offending field and what is allowed, e.g.
/// `block_len = 300 is out of range: must be in 1..=256 (seq_len)`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// A numeric field lies outside its allowed range.
    #[error("{field} = {value} is out of range: must be in {allowed}")]
    OutOfRange {
        /// Name of the field, as spelled in the config (e.g. `"block_len"`).
        field: &'static str,
        /// The rejected value, formatted.
        value: String,
        /// The allowed range in Rust range syntax, optionally followed by a parenthesised note
        /// naming the field that sets a bound (e.g. `"1..=256 (seq_len)"`).
        allowed: String,
    },
    /// A field (or combination of fields/arguments) is invalid for a reason other than a range.
    #[error("{field} is invalid: {message}")]
    Invalid {
        /// Name of the field or argument.
        field: &'static str,
        /// One-line explanation.
        message: String,
    },
}

impl TaskError {
    /// [`TaskError::OutOfRange`] for `field = value`; `allowed` is the range in Rust syntax,
    /// optionally followed by a parenthesised note naming the field that sets a bound, e.g.
    /// `TaskError::out_of_range("block_len", 300, "1..=256 (seq_len)")` displays as
    /// `block_len = 300 is out of range: must be in 1..=256 (seq_len)`.
    pub fn out_of_range(
        field: &'static str,
        value: impl ToString,
        allowed: impl Into<String>,
    ) -> Self {
        Self::OutOfRange {
            field,
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }
}

/// Character of token `id` in a character vocabulary whose id 0 is padding and whose id `n ≥ 1`
/// is `chars[n − 1]`; `None` for id 0 and for ids past the table.
pub(crate) fn decode_char(chars: &[char], id: u32) -> Option<char> {
    (id as usize)
        .checked_sub(1)
        .and_then(|i| chars.get(i))
        .copied()
}

/// The string of `ids` in that vocabulary with padding (id 0) dropped, or `None` if an id lies
/// past the table.
pub(crate) fn decode_chars(chars: &[char], ids: &[u32]) -> Option<String> {
    ids.iter()
        .filter(|&&id| id != 0)
        .map(|&id| decode_char(chars, id))
        .collect()
}

/// One training/evaluation example.
///
/// All three vectors have length `seq_len` (the configured context length).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Example {
    /// Input token ids, length `seq_len`. Position `t` is fed to the model at position `t`.
    pub input: Vec<u32>,
    /// Target token ids, length `seq_len`: `target[t]` is what the model must predict at position
    /// `t` (having seen `input[0..=t]`). For plain next-token tasks `target[t]` is the token at
    /// position `t + 1` of the underlying sequence; a task's docs say where it departs from that.
    pub target: Vec<u32>,
    /// Loss mask, length `seq_len`: `true` where `target[t]` is scored.
    pub mask: Vec<bool>,
}

impl Example {
    /// Number of scored positions (`true` entries of [`Example::mask`]).
    pub fn n_scored(&self) -> usize {
        self.mask.iter().filter(|&&m| m).count()
    }
}

/// Which split an example belongs to. Training, validation and evaluation (test) data never
/// share random streams (crate docs), and corpora split their token stream by position
/// ([`text`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Training data.
    Train,
    /// Evaluation (held-out, test) data: what a run reports.
    Eval,
    /// Validation data: held out like [`Split::Eval`] (iGSM: the same held-out structures) but
    /// other examples; what a selection chooses on (docs/analysis-rules.md R58).
    Val,
}

/// First held-out stream index of the validation split (`2^62`): example `i` of
/// [`Split::Val`] has the stream of held-out index `VAL_INDEX_BASE + i`, above every index
/// [`Split::Eval`] accepts.
pub const VAL_INDEX_BASE: u64 = 1 << 62;

impl Split {
    /// `0` for [`Split::Train`], `1` for the held-out side ([`Split::Eval`], [`Split::Val`]): the
    /// low bit of every stream id this crate assigns (see the crate docs).
    pub fn id(self) -> u64 {
        match self {
            Split::Train => 0,
            Split::Eval | Split::Val => 1,
        }
    }

    /// Whether the split is held out from training ([`Split::Eval`] or [`Split::Val`]).
    pub fn is_held_out(self) -> bool {
        self != Split::Train
    }

    /// Largest example index of the split: [`MAX_INDEX`] for training, `2^62 − 1` for
    /// evaluation, `MAX_INDEX − 2^62` for validation (so that no two splits share a stream).
    pub fn max_index(self) -> u64 {
        match self {
            Split::Train => MAX_INDEX,
            Split::Eval => VAL_INDEX_BASE - 1,
            Split::Val => MAX_INDEX - VAL_INDEX_BASE,
        }
    }

    /// The split's name: `train`, `eval`, `val`.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Eval => "eval",
            Split::Val => "val",
        }
    }
}

/// Largest example index accepted by [`example_rng`] (`2^63 − 2`), so that the stream id
/// `2 + 2·index + split` fits in a `u64`.
pub const MAX_INDEX: u64 = (u64::MAX - 3) / 2;

/// The split-level random stream for `seed`: ChaCha8 keyed by `seed_from_u64(seed)` on stream id
/// `0` (train) or `1` (held out: eval and val share it, as they share iGSM's held-out
/// structures).
///
/// Use it for split-wide randomness that is not tied to one example (e.g. shuffling an
/// example order). It never overlaps the other split's stream or any [`example_rng`] stream.
pub fn split_rng(seed: u64, split: Split) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(split.id());
    rng
}

/// A plain `u64` seed derived for `split` from `seed`: the first `u64` of
/// [`split_rng`]`(seed, split)`.
///
/// For consumers that need an integer seed (e.g. another framework's RNG). Train and eval seeds
/// are the first words of two disjoint ChaCha streams, so they differ with overwhelming
/// probability (2^-64 chance of a clash, not excluded by construction; prefer [`split_rng`] or
/// [`example_rng`] inside this crate).
pub fn split_seed(seed: u64, split: Split) -> u64 {
    use rand::RngCore;
    split_rng(seed, split).next_u64()
}

/// The random stream of example `index` of `split` for `seed`: ChaCha8 keyed by
/// `seed_from_u64(seed)` on stream id `2 + 2·index + split.id()` (validation: `index +
/// VAL_INDEX_BASE` in place of `index`).
///
/// Distinct `(split, index)` pairs get distinct stream ids, hence non-overlapping keystreams.
///
/// # Errors
/// [`TaskError::OutOfRange`] naming `index` if `index > split.max_index()`.
pub fn example_rng(seed: u64, split: Split, index: u64) -> Result<ChaCha8Rng, TaskError> {
    if index > split.max_index() {
        return Err(TaskError::out_of_range(
            "index",
            index,
            format!("0..={} ({} split)", split.max_index(), split.name()),
        ));
    }
    let slot = match split {
        Split::Val => VAL_INDEX_BASE + index,
        Split::Train | Split::Eval => index,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(2 + 2 * slot + split.id());
    Ok(rng)
}

/// Check that examples `index0 .. index0 + batch` all have indices `≤ MAX_INDEX`.
///
/// # Errors
/// [`TaskError::Invalid`] on `batch` otherwise.
pub(crate) fn check_batch(index0: u64, batch: usize) -> Result<(), TaskError> {
    if batch > 0 {
        let last = (batch as u64 - 1)
            .checked_add(index0)
            .filter(|&l| l <= MAX_INDEX);
        if last.is_none() {
            return Err(TaskError::Invalid {
                field: "batch",
                message: format!(
                    "examples {index0}..{index0}+{batch} go past the largest index {MAX_INDEX}"
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngCore;

    #[test]
    fn validation_streams_are_apart_from_test_and_training() {
        // Validation example i is held-out slot 2^62 + i: the same as no eval or train example.
        assert_eq!(
            example_rng(5, Split::Val, 3).unwrap().get_stream(),
            2 + 2 * (VAL_INDEX_BASE + 3) + 1
        );
        assert_eq!(
            example_rng(5, Split::Eval, 3).unwrap().get_stream(),
            2 + 6 + 1
        );
        assert_eq!(example_rng(5, Split::Train, 3).unwrap().get_stream(), 2 + 6);
        let mut a = example_rng(5, Split::Val, 0).unwrap();
        let mut b = example_rng(5, Split::Eval, 0).unwrap();
        assert_ne!(a.next_u64(), b.next_u64());
        // Each split's largest index, and one past it named with the split.
        assert!(example_rng(0, Split::Eval, VAL_INDEX_BASE - 1).is_ok());
        let e = example_rng(0, Split::Eval, VAL_INDEX_BASE).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "index = {VAL_INDEX_BASE} is out of range: must be in 0..={} (eval split)",
                VAL_INDEX_BASE - 1
            )
        );
        let top = example_rng(0, Split::Val, Split::Val.max_index()).unwrap();
        assert_eq!(top.get_stream(), 2 + 2 * MAX_INDEX + 1);
        assert!(example_rng(0, Split::Val, Split::Val.max_index() + 1).is_err());
        assert!(example_rng(0, Split::Train, MAX_INDEX).is_ok());
        assert_eq!(
            serde_json::to_string(&Split::Val).unwrap(),
            format!("\"{}\"", Split::Val.name())
        );
    }

    #[test]
    fn char_vocabulary_decoding() {
        let chars = ['a', 'b'];
        assert_eq!(decode_char(&chars, 0), None);
        assert_eq!(decode_char(&chars, 1), Some('a'));
        assert_eq!(decode_char(&chars, 2), Some('b'));
        assert_eq!(decode_char(&chars, 3), None);
        assert_eq!(
            decode_chars(&chars, &[0, 2, 1, 0, 2]).as_deref(),
            Some("bab")
        );
        assert_eq!(decode_chars(&chars, &[1, 3]), None);
        assert_eq!(
            TaskError::out_of_range("block_len", 300, "1..=256 (seq_len)").to_string(),
            "block_len = 300 is out of range: must be in 1..=256 (seq_len)"
        );
    }

    #[test]
    fn error_display_is_one_line_and_names_field() {
        let e = TaskError::OutOfRange {
            field: "block_len",
            value: "300".into(),
            allowed: "1..=256 (seq_len)".into(),
        };
        assert_eq!(
            e.to_string(),
            "block_len = 300 is out of range: must be in 1..=256 (seq_len)"
        );
        let e = TaskError::Invalid {
            field: "batch",
            message: "too large".into(),
        };
        assert_eq!(e.to_string(), "batch is invalid: too large");
    }

    #[test]
    fn split_streams_differ() {
        let mut a = split_rng(7, Split::Train);
        let mut b = split_rng(7, Split::Eval);
        let wa: Vec<u32> = (0..64).map(|_| a.next_u32()).collect();
        let wb: Vec<u32> = (0..64).map(|_| b.next_u32()).collect();
        assert_ne!(wa, wb);
        assert_ne!(split_seed(7, Split::Train), split_seed(7, Split::Eval));
        assert_eq!(split_seed(7, Split::Train), split_seed(7, Split::Train));
        assert_ne!(split_seed(7, Split::Train), split_seed(8, Split::Train));
        assert_eq!(split_rng(7, Split::Train).get_stream(), 0);
        assert_eq!(split_rng(7, Split::Eval).get_stream(), 1);
    }

    #[test]
    fn example_streams_are_distinct_ids() {
        let t0 = example_rng(1, Split::Train, 0).unwrap();
        let e0 = example_rng(1, Split::Eval, 0).unwrap();
        let t1 = example_rng(1, Split::Train, 1).unwrap();
        assert_eq!(t0.get_stream(), 2);
        assert_eq!(e0.get_stream(), 3);
        assert_eq!(t1.get_stream(), 4);
        let last = example_rng(1, Split::Val, Split::Val.max_index()).unwrap();
        assert_eq!(last.get_stream(), u64::MAX);
        let err = example_rng(1, Split::Train, MAX_INDEX + 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "index = 9223372036854775807 is out of range: must be in 0..=9223372036854775806 (train split)"
        );
    }
}
