//! Block-structured sequences of width `B` — the dependency-width knob (SCIENCE.md section 2).
//!
//! ```
//! use tasks::Split;
//! use tasks::block::{BlockConfig, BlockVariant};
//!
//! let cfg = BlockConfig { variant: BlockVariant::Copy, vocab_size: 16, seq_len: 8, block_len: 3, noise: 0.0 };
//! let ex = cfg.example(0, Split::Train, 0)?;
//! assert_eq!(ex.mask, [false, false, true, true, true, true, true, true]);
//! assert_eq!(cfg.n_scored(), 6);
//! for t in 2..8 {
//!     assert_eq!(ex.target[t], ex.input[t + 1 - 3]); // the token B back
//! }
//! let batch = cfg.batch(0, Split::Eval, 0, 4)?; // disjoint from every train example
//! assert_eq!(batch.len(), 4);
//! # Ok::<(), tasks::TaskError>(())
//! ```
//!
//! # Underlying sequence and blocks
//!
//! Every example is built from an underlying token sequence `x` of length `seq_len + 1`. The
//! positions `0..=seq_len` of `x` are cut into consecutive blocks of length `B = block_len`
//! starting at position 0: block `k` is `x[k·B .. (k+1)·B]` (the last block may be cut short).
//! The model input is always `input[t] = x[t]` for `t` in `0..seq_len`, so input positions share
//! the same block boundaries (position `t` is at offset `t mod B` of block `⌊t / B⌋`).
//!
//! # `copy`
//!
//! Vocabulary `0..vocab_size`. The first block `x[0..B]` is i.i.d. uniform over the vocabulary.
//! Every later position `p ≥ B` is a noisy copy of the token one block back:
//! `x[p] = x[p − B]` with probability `1 − noise`, otherwise a fresh uniform token (which may
//! happen to equal `x[p − B]`, so a position differs from its copy source with probability
//! `noise · (1 − 1/vocab_size)`). Copies are taken from the *realised* previous block, so a
//! corrupted token is itself copied forward.
//!
//! Targets are next-token: `target[t] = x[t + 1]`. A target is scored exactly when its
//! underlying position `p = t + 1` is a copy, i.e. `mask[t] = (t + 1 ≥ B)`; there are
//! `seq_len − B + 1` scored targets. With `noise = 0` every scored target equals the input token
//! `B − 1` positions back: `target[t] == input[t + 1 − B]`.
//!
//! Worked example (`vocab_size = 4, seq_len = 6, block_len = 2, noise = 0`), if the first block
//! is drawn as `[3, 1]`:
//!
//! ```text
//! x      = [3, 1, 3, 1, 3, 1, 3]
//! input  = [3, 1, 3, 1, 3, 1]
//! target = [1, 3, 1, 3, 1, 3]
//! mask   = [F, T, T, T, T, T]        (n_scored = 6 − 2 + 1 = 5)
//! ```
//!
//! # `recall`
//!
//! The vocabulary is split into a *header* sub-vocabulary `0..H` with
//! `H = n_headers() = vocab_size / 2` (integer division) and a *filler* sub-vocabulary
//! `H..vocab_size` (`vocab_size − H ≥ H` tokens). Every block of `x` opens with a header token,
//! uniform over the header sub-vocabulary; its other positions are filler tokens, i.i.d. uniform
//! over the filler sub-vocabulary (all draws independent).
//!
//! Targets: at an input position `t` that is a *later* position of its block (offset
//! `o = t mod B ≥ 1`) the model must predict that block's header, which it saw `o` positions
//! earlier: `target[t] = x[t − o]`, scored (`mask[t] = true`). At a block-opening position
//! (`o = 0`) the target is the plain next token `target[t] = x[t + 1]` and is **not** scored
//! (the next block's header is unpredictable, and a filler is independent of everything). So
//! `recall` departs from next-token targets on exactly the scored positions; there are
//! `seq_len − ⌈seq_len / B⌉` of them.
//!
//! Worked example (`vocab_size = 6` → headers `{0, 1, 2}`, fillers `{3, 4, 5}`;
//! `seq_len = 7, block_len = 3, noise = 0`), if `x` is drawn as `[2, 4, 3, 0, 5, 5, 1, 3]`:
//!
//! ```text
//! x      = [2, 4, 3 | 0, 5, 5 | 1, 3]
//! input  = [2, 4, 3,  0, 5, 5,  1]
//! target = [4, 2, 2,  5, 0, 0,  3]
//! mask   = [F, T, T,  F, T, T,  F]   (n_scored = 7 − ⌈7/3⌉ = 4)
//! ```
//!
//! Note for mutual-information profiles (SCIENCE.md section 4): in `recall` the input tokens are
//! mutually independent, so the dependency of width `B` is visible between `input[t − r]` and
//! `target[t]` (non-zero for `r = t mod B ∈ 1..B`), not in the raw input sequence alone. In
//! `copy` it is visible in the raw sequence `x` itself, at lag `B`.
//!
//! Noise in `recall` is *label noise*: each scored target is, with probability `noise`, replaced
//! by a uniform header token (which may equal the true header, so a scored target differs from
//! its block's header with probability `noise · (1 − 1/H)`). Inputs are never corrupted.
//!
//! # `window`
//!
//! Inputs are i.i.d. uniform bits, tokens `0` and `1` (ids `2..vocab_size` are never used).
//! From position `B − 1` on, every target is the **majority bit of the last `B` inputs**, the
//! current one included: `target[t] = 1` iff `Σ input[t − B + 1 ..= t] > B / 2` (a tie, possible
//! for even `B`, gives `0`), scored exactly when `t + 1 ≥ B` (`seq_len − B + 1` targets). The
//! target depends equally on every input of the window and on none outside it: the dependency
//! kernel is a box of width `W = B` (docs/analysis-rules.md R10). Noise is label noise, as in
//! `recall`: each scored target is, with probability `noise`, replaced by a uniform bit.
//!
//! Worked example (`seq_len = 6, block_len = 3`), if the inputs are drawn as `[1, 0, 1, 1, 0, 0]`:
//!
//! ```text
//! input  = [1, 0, 1, 1, 0, 0]
//! target = [0, 0, 1, 1, 1, 0]        (t ≥ 2: majority of input[t−2..=t]; t < 2 unscored, 0)
//! mask   = [F, F, T, T, T, T]
//! ```
//!
//! # `member`
//!
//! Inputs are i.i.d. uniform over the vocabulary. From position `B` on, the target says whether the
//! current token already appeared among the `B` inputs before it: `target[t] = 1` iff
//! `input[t] ∈ input[t − B ..= t − 1]`, else `0`, scored exactly when `t ≥ B` (`seq_len − B`
//! targets). The model must match content inside a window of width `W = B` and ignore matches
//! outside it (docs/analysis-rules.md R13); a vocabulary of about `1.44 · B` tokens makes a match
//! present half the time. Noise is label noise, as in `recall`: a uniform bit replaces a scored
//! target with probability `noise`.
//!
//! Worked example (`seq_len = 7, block_len = 2`), if the inputs are drawn as `[3, 1, 3, 3, 0, 1, 0]`:
//!
//! ```text
//! input  = [3, 1, 3, 3, 0, 1, 0]
//! target = [0, 0, 1, 1, 0, 0, 1]     (t ≥ 2: is input[t] among input[t−2], input[t−1]?)
//! mask   = [F, F, T, T, T, T, T]
//! ```
//!
//! # Randomness and coupling
//!
//! Example `index` of `split` for `seed` uses its own ChaCha8 stream ([`crate::example_rng`]),
//! so examples are reproducible, independent and can be generated in any order; train and eval
//! never share a stream. For every position the generator draws the same random numbers
//! whatever `noise` is (a uniform `u ∈ [0, 1)` and a fresh token, corrupting iff `u < noise`),
//! so examples with the same `(seed, split, index)` and different `noise` are coupled: the first
//! block is identical and the set of resampled positions only grows with `noise`.
//!
//! # Edge cases
//!
//! - `copy`, `block_len = 1`: every position copies the previous one, so with `noise = 0` the
//!   whole sequence is one repeated token; all `seq_len` targets are scored.
//! - `copy`, `block_len = seq_len`: only the last target is scored, `target[seq_len − 1] =
//!   x[seq_len]`, a noisy copy of `x[0] = input[0]`.
//! - `recall`, `block_len = 1`: rejected ([`TaskError::OutOfRange`] on `block_len`, allowed
//!   `2..=seq_len`), since blocks would have no later positions and nothing would be scored.
//! - `recall`, `block_len = seq_len`: one header at position 0; all other `seq_len − 1` targets
//!   are that header.
//! - `window`, `block_len = seq_len`: only the last target is scored (the majority of the whole
//!   input); `window`, `block_len = 1`: every target is the current input bit.
//! - `member`, `block_len = seq_len`: rejected (allowed `1..seq_len`): nothing would be scored.
//! - `block_len > seq_len`: rejected (allowed `1..=seq_len` for `copy` and `window`, `2..=seq_len`
//!   for `recall`); such a task would score nothing.

use rand::Rng;
use rand::distr::{Distribution, Uniform};
use rand_chacha::ChaCha8Rng;

use crate::{Example, MAX_INDEX, Split, TaskError, example_rng};

/// Which block task to generate. Serialised as `"copy"`, `"recall"`, `"window"`, `"member"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockVariant {
    /// Each block is a noisy copy of the previous one (`x[p] = x[p − B]` w.p. `1 − noise`).
    Copy,
    /// Each block opens with a header token; its later positions must predict that header.
    Recall,
    /// I.i.d. bits; each target is the majority bit of the last `B` inputs.
    Window,
    /// I.i.d. tokens; each target says whether the current token is among the `B` before it.
    Member,
}

/// Configuration of a block-structured task (see the [module docs](self) for the semantics).
///
/// Deserialising does not validate; [`BlockConfig::example`] and [`BlockConfig::batch`] call
/// [`BlockConfig::validate`] themselves.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BlockConfig {
    /// `copy`, `recall`, `window` or `member`.
    pub variant: BlockVariant,
    /// Number of token ids; tokens are `0..vocab_size`. `copy`, `window`, `member`:
    /// `2..=u32::MAX`; `recall`: `4..=u32::MAX` (so both sub-vocabularies have at least 2 tokens).
    pub vocab_size: usize,
    /// Context length: length of `input`, `target` and `mask`. At least 2.
    pub seq_len: usize,
    /// Block length `B`, in tokens. `copy`, `window`: `1..=seq_len`; `member`: `1..seq_len`;
    /// `recall`: `2..=seq_len`.
    pub block_len: usize,
    /// Corruption probability `ε`, finite, in `[0, 1]`. `copy`: probability that a position is
    /// resampled instead of copied; `recall`: probability that a scored target is replaced by a
    /// uniform header; `window`, `member`: by a uniform bit (label noise).
    pub noise: f64,
}

/// The block task's own parameters in a training run (the run's task section; the run's
/// `vocab_size` and `seq_len` complete them into a [`BlockConfig`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockParams {
    /// `copy`, `recall`, `window` or `member`.
    pub variant: BlockVariant,
    /// Block length `B`, tokens.
    pub block_len: usize,
    /// Corruption probability `ε` (default 0).
    #[serde(default)]
    pub noise: f64,
}

impl BlockParams {
    /// Parameter names, in serialisation order (checked by a test).
    pub const NAMES: &'static [&'static str] = &["variant", "block_len", "noise"];

    /// The generator config for a run of `vocab_size` tokens and context `seq_len`.
    pub fn config(&self, vocab_size: usize, seq_len: usize) -> BlockConfig {
        BlockConfig {
            variant: self.variant,
            vocab_size,
            seq_len,
            block_len: self.block_len,
            noise: self.noise,
        }
    }
}

impl BlockConfig {
    /// Check every field.
    ///
    /// # Errors
    /// [`TaskError::OutOfRange`] naming the first bad field, checked in the order `vocab_size`,
    /// `seq_len`, `block_len`, `noise`, with its allowed range (see the field docs).
    pub fn validate(&self) -> Result<(), TaskError> {
        let (min_vocab, min_block) = match self.variant {
            BlockVariant::Copy | BlockVariant::Window | BlockVariant::Member => (2, 1),
            BlockVariant::Recall => (4, 2),
        };
        let max_vocab = u32::MAX as usize;
        if !(min_vocab..=max_vocab).contains(&self.vocab_size) {
            return Err(TaskError::out_of_range(
                "vocab_size",
                self.vocab_size,
                format!("{min_vocab}..={max_vocab}"),
            ));
        }
        if self.seq_len < 2 {
            return Err(TaskError::out_of_range("seq_len", self.seq_len, "2.."));
        }
        // `member` scores positions t ≥ B: B = seq_len would score nothing.
        let max_block = match self.variant {
            BlockVariant::Member => self.seq_len - 1,
            _ => self.seq_len,
        };
        if !(min_block..=max_block).contains(&self.block_len) {
            let bound = if max_block == self.seq_len {
                format!("{min_block}..={max_block} (seq_len)")
            } else {
                format!("{min_block}..={max_block} (seq_len − 1)")
            };
            return Err(TaskError::out_of_range("block_len", self.block_len, bound));
        }
        if !(self.noise.is_finite() && (0.0..=1.0).contains(&self.noise)) {
            return Err(TaskError::out_of_range("noise", self.noise, "0.0..=1.0"));
        }
        Ok(())
    }

    /// Expected dependency width `W` of the task, in tokens: always `block_len`.
    ///
    /// `copy`: a scored target is the token `B` positions earlier in the underlying sequence
    /// (`B − 1` positions before the predicting input position). `recall`: the target at block
    /// offset `o` is the input token `o ≤ B − 1` positions back. `window`: the target depends on
    /// the inputs `0 … B − 1` positions back, equally; `member`: on the inputs `1 … B` back.
    /// Either way the data-induced dependency
    /// profile has support up to the block length, `W ≈ B`.
    pub fn dep_width(&self) -> usize {
        self.block_len
    }

    /// Number of header tokens `H` (`recall`: `vocab_size / 2`, headers are `0..H`; `copy` and
    /// `window`: 0).
    pub fn n_headers(&self) -> usize {
        match self.variant {
            BlockVariant::Copy | BlockVariant::Window | BlockVariant::Member => 0,
            BlockVariant::Recall => self.vocab_size / 2,
        }
    }

    /// Whether `target[t]` is scored (`mask[t]`), for `t < seq_len`. `copy` and `window`:
    /// `t + 1 ≥ B`; `member`: `t ≥ B`; `recall`: `t mod B ≠ 0`. Assumes a valid config.
    pub fn is_scored(&self, t: usize) -> bool {
        match self.variant {
            BlockVariant::Copy | BlockVariant::Window => t + 1 >= self.block_len,
            BlockVariant::Member => t >= self.block_len,
            BlockVariant::Recall => !t.is_multiple_of(self.block_len),
        }
    }

    /// Scored positions per example (`true` entries of every mask). `copy` and `window`:
    /// `seq_len − B + 1`; `member`: `seq_len − B`; `recall`: `seq_len − ⌈seq_len / B⌉`. Assumes
    /// a valid config.
    pub fn n_scored(&self) -> usize {
        match self.variant {
            BlockVariant::Copy | BlockVariant::Window => self.seq_len + 1 - self.block_len,
            BlockVariant::Member => self.seq_len - self.block_len,
            BlockVariant::Recall => self.seq_len - self.seq_len.div_ceil(self.block_len),
        }
    }

    /// Generate example number `index` of `split` for `seed`, deterministically (a pure function
    /// of `(self, seed, split, index)`). `input`, `target` and `mask` have length `seq_len`.
    ///
    /// # Errors
    /// Any [`BlockConfig::validate`] error; [`TaskError::OutOfRange`] on `index` if
    /// `index > MAX_INDEX`.
    pub fn example(&self, seed: u64, split: Split, index: u64) -> Result<Example, TaskError> {
        self.validate()?;
        let mut rng = example_rng(seed, split, index)?;
        Ok(self.generate(&mut rng))
    }

    /// A batch: examples `index0 .. index0 + batch` of `split` for `seed`, in order. Element `i`
    /// equals `self.example(seed, split, index0 + i)`. `batch = 0` gives an empty vector.
    ///
    /// # Errors
    /// Any [`BlockConfig::validate`] error; [`TaskError::Invalid`] on `batch` if the last index
    /// `index0 + batch − 1` exceeds `MAX_INDEX`.
    pub fn batch(
        &self,
        seed: u64,
        split: Split,
        index0: u64,
        batch: usize,
    ) -> Result<Vec<Example>, TaskError> {
        self.validate()?;
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
        (0..batch as u64)
            .map(|i| {
                let mut rng = example_rng(seed, split, index0 + i)?;
                Ok(self.generate(&mut rng))
            })
            .collect()
    }

    /// Draw the underlying sequence `x` (length `seq_len + 1`) and the recall label noise, then
    /// assemble the example. Config must be valid.
    fn generate(&self, rng: &mut ChaCha8Rng) -> Example {
        let (b, n) = (self.block_len, self.seq_len);
        let v = self.vocab_size as u32;
        let mut x = Vec::with_capacity(n + 1);
        match self.variant {
            BlockVariant::Copy => {
                let tok = Uniform::new(0, v).expect("validated vocab_size >= 2");
                x.extend((0..b).map(|_| tok.sample(rng)));
                for p in b..=n {
                    let u: f64 = rng.random();
                    let fresh = tok.sample(rng);
                    x.push(if u < self.noise { fresh } else { x[p - b] });
                }
                self.assemble(&x, |_| None)
            }
            BlockVariant::Recall => {
                let h = self.n_headers() as u32;
                let header = Uniform::new(0, h).expect("validated vocab_size >= 4");
                let filler = Uniform::new(h, v).expect("validated vocab_size >= 4");
                x.extend((0..=n).map(|p| {
                    if p % b == 0 {
                        header.sample(rng)
                    } else {
                        filler.sample(rng)
                    }
                }));
                self.assemble(&x, label_noise(self.noise, header, rng))
            }
            BlockVariant::Member => {
                let tok = Uniform::new(0, v).expect("validated vocab_size >= 2");
                x.extend((0..=n).map(|_| tok.sample(rng)));
                let bit = Uniform::new(0, 2).expect("two bits");
                self.assemble(&x, label_noise(self.noise, bit, rng))
            }
            BlockVariant::Window => {
                let bit = Uniform::new(0, 2).expect("two bits");
                x.extend((0..=n).map(|_| bit.sample(rng)));
                self.assemble(&x, label_noise(self.noise, bit, rng))
            }
        }
    }

    /// Build the example from the underlying sequence `x` (length `seq_len + 1`).
    /// `label_noise(t)` is called once per scored recall, window or member position, in increasing `t`,
    /// and returns `Some(token)` to replace that target (unused for copy).
    fn assemble(&self, x: &[u32], mut label_noise: impl FnMut(usize) -> Option<u32>) -> Example {
        let (b, n) = (self.block_len, self.seq_len);
        debug_assert_eq!(x.len(), n + 1);
        let input = x[..n].to_vec();
        let mask: Vec<bool> = (0..n).map(|t| self.is_scored(t)).collect();
        let target = match self.variant {
            BlockVariant::Copy => x[1..].to_vec(),
            BlockVariant::Recall => (0..n)
                .map(|t| {
                    let o = t % b;
                    if o == 0 {
                        x[t + 1]
                    } else {
                        label_noise(t).unwrap_or(x[t - o])
                    }
                })
                .collect(),
            BlockVariant::Window => {
                // Running count of ones over input[t − B + 1 ..= t].
                let mut ones = 0usize;
                (0..n)
                    .map(|t| {
                        ones += x[t] as usize;
                        if t >= b {
                            ones -= x[t - b] as usize;
                        }
                        if t + 1 < b {
                            0
                        } else {
                            let majority = u32::from(2 * ones > b);
                            label_noise(t).unwrap_or(majority)
                        }
                    })
                    .collect()
            }
            BlockVariant::Member => (0..n)
                .map(|t| {
                    if t < b {
                        0
                    } else {
                        let seen = u32::from(x[t - b..t].contains(&x[t]));
                        label_noise(t).unwrap_or(seen)
                    }
                })
                .collect(),
        };
        Example {
            input,
            target,
            mask,
        }
    }
}

/// Label noise for [`BlockConfig::assemble`]: for each scored target, in order, draw a uniform
/// `u ∈ [0, 1)` and a fresh token from `fresh`, and replace the target by it when `u < noise` (the
/// same two draws whatever `noise` is, so examples with different noise stay coupled).
fn label_noise(
    noise: f64,
    fresh: Uniform<u32>,
    rng: &mut ChaCha8Rng,
) -> impl FnMut(usize) -> Option<u32> + '_ {
    move |_| {
        let u: f64 = rng.random();
        let token = fresh.sample(rng);
        (u < noise).then_some(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(
        variant: BlockVariant,
        vocab_size: usize,
        seq_len: usize,
        block_len: usize,
    ) -> BlockConfig {
        BlockConfig {
            variant,
            vocab_size,
            seq_len,
            block_len,
            noise: 0.0,
        }
    }

    fn copy(v: usize, n: usize, b: usize) -> BlockConfig {
        cfg(BlockVariant::Copy, v, n, b)
    }

    fn recall(v: usize, n: usize, b: usize) -> BlockConfig {
        cfg(BlockVariant::Recall, v, n, b)
    }

    const T: bool = true;
    const F: bool = false;

    fn check_shapes(c: &BlockConfig, ex: &Example) {
        assert_eq!(ex.input.len(), c.seq_len);
        assert_eq!(ex.target.len(), c.seq_len);
        assert_eq!(ex.mask.len(), c.seq_len);
        assert_eq!(ex.n_scored(), c.n_scored());
        assert!(ex.input.iter().all(|&tok| (tok as usize) < c.vocab_size));
        assert!(ex.target.iter().all(|&tok| (tok as usize) < c.vocab_size));
        for t in 0..c.seq_len {
            assert_eq!(ex.mask[t], c.is_scored(t), "t = {t}");
        }
    }

    // ---- hand-computed worked examples (the ones in the module docs) ----

    #[test]
    fn worked_example_window() {
        let c = cfg(BlockVariant::Window, 2, 6, 3);
        // x has seq_len + 1 entries; the last is not an input.
        let ex = c.assemble(&[1, 0, 1, 1, 0, 0, 1], |_| None);
        assert_eq!(ex.input, vec![1, 0, 1, 1, 0, 0]);
        assert_eq!(ex.target, vec![0, 0, 1, 1, 1, 0]);
        assert_eq!(ex.mask, vec![F, F, T, T, T, T]);
        assert_eq!(c.n_scored(), 4);
    }

    #[test]
    fn member_block_len_must_leave_a_scored_position() {
        let c = cfg(BlockVariant::Member, 8, 16, 16);
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "block_len = 16 is out of range: must be in 1..=15 (seq_len − 1)"
        );
        assert!(cfg(BlockVariant::Member, 8, 16, 15).validate().is_ok());
    }

    #[test]
    fn worked_example_member() {
        let c = cfg(BlockVariant::Member, 4, 7, 2);
        let ex = c.assemble(&[3, 1, 3, 3, 0, 1, 0, 2], |_| None);
        assert_eq!(ex.target, vec![0, 0, 1, 1, 0, 0, 1]);
        assert_eq!(ex.mask, vec![F, F, T, T, T, T, T]);
        assert_eq!(c.n_scored(), 5);
    }

    /// Every scored member target says whether the token occurs among the B before it (counted
    /// directly); with a vocabulary of about 1.44 B a match is present about half the time.
    #[test]
    fn member_targets_and_balance() {
        for (b, v) in [(4, 6), (16, 23), (64, 92)] {
            let c = cfg(BlockVariant::Member, v, 128, b);
            let (mut ones, mut scored) = (0usize, 0usize);
            for ex in c.batch(5, Split::Train, 0, 40).unwrap() {
                check_shapes(&c, &ex);
                for t in b..c.seq_len {
                    let seen = ex.input[t - b..t].iter().any(|&x| x == ex.input[t]);
                    assert_eq!(ex.target[t], u32::from(seen), "B = {b}, t = {t}");
                    ones += ex.target[t] as usize;
                    scored += 1;
                }
            }
            let share = ones as f64 / scored as f64;
            let expected = 1.0 - (1.0 - 1.0 / v as f64).powi(b as i32);
            assert!(
                (share - expected).abs() < 0.03,
                "B = {b}: {share} vs {expected}"
            );
        }
    }

    /// Every scored window target is the majority of the last B inputs counted directly (a tie
    /// gives 0), inputs are bits, and the targets are balanced where B is odd.
    #[test]
    fn window_targets_are_majorities_of_the_last_b_inputs() {
        for b in [1, 4, 5, 16] {
            let c = cfg(BlockVariant::Window, 8, 40, b);
            let mut ones = 0;
            let mut scored = 0;
            for ex in c.batch(3, Split::Train, 0, 50).unwrap() {
                check_shapes(&c, &ex);
                assert!(ex.input.iter().all(|&x| x < 2));
                for t in (b - 1)..c.seq_len {
                    let count: u32 = ex.input[t + 1 - b..=t].iter().sum();
                    assert_eq!(
                        ex.target[t],
                        u32::from(2 * count as usize > b),
                        "B = {b}, t = {t}"
                    );
                    ones += ex.target[t] as usize;
                    scored += 1;
                }
            }
            let share = ones as f64 / scored as f64;
            if b % 2 == 1 {
                assert!((share - 0.5).abs() < 0.05, "B = {b}: share of ones {share}");
            } else {
                assert!(share < 0.5, "B = {b}: ties give 0, share {share}");
            }
        }
    }

    /// Window label noise replaces a scored target by a uniform bit: it differs from the
    /// majority with probability noise / 2.
    #[test]
    fn window_label_noise_rate() {
        let mut c = cfg(BlockVariant::Window, 2, 64, 5);
        c.noise = 0.4;
        let (mut differ, mut scored) = (0, 0);
        for ex in c.batch(9, Split::Eval, 0, 200).unwrap() {
            for t in 4..64 {
                let count: u32 = ex.input[t - 4..=t].iter().sum();
                differ += usize::from(ex.target[t] != u32::from(count > 2));
                scored += 1;
            }
        }
        let rate = differ as f64 / scored as f64;
        assert!((rate - 0.2).abs() < 0.02, "{rate}");
    }

    #[test]
    fn worked_example_copy() {
        let c = copy(4, 6, 2);
        let ex = c.assemble(&[3, 1, 3, 1, 3, 1, 3], |_| None);
        assert_eq!(ex.input, vec![3, 1, 3, 1, 3, 1]);
        assert_eq!(ex.target, vec![1, 3, 1, 3, 1, 3]);
        assert_eq!(ex.mask, vec![F, T, T, T, T, T]);
        assert_eq!(c.n_scored(), 5);
        // The generator gives the same mask, and the same copy structure.
        let g = c.example(11, Split::Train, 0).unwrap();
        assert_eq!(g.mask, vec![F, T, T, T, T, T]);
        assert_eq!(g.input[2..], g.input[..4]);
    }

    #[test]
    fn worked_example_recall() {
        let c = recall(6, 7, 3);
        assert_eq!(c.n_headers(), 3);
        let ex = c.assemble(&[2, 4, 3, 0, 5, 5, 1, 3], |_| None);
        assert_eq!(ex.input, vec![2, 4, 3, 0, 5, 5, 1]);
        assert_eq!(ex.target, vec![4, 2, 2, 5, 0, 0, 3]);
        assert_eq!(ex.mask, vec![F, T, T, F, T, T, F]);
        assert_eq!(c.n_scored(), 4);
        let g = c.example(11, Split::Train, 0).unwrap();
        assert_eq!(g.mask, vec![F, T, T, F, T, T, F]);
    }

    // ---- semantics ----

    #[test]
    fn copy_noise_free_targets_equal_token_b_back() {
        for (n, b) in [(16, 1), (16, 2), (16, 5), (16, 16), (64, 7), (128, 32)] {
            let c = copy(10, n, b);
            for index in 0..20 {
                let ex = c.example(3, Split::Train, index).unwrap();
                check_shapes(&c, &ex);
                for t in 0..n {
                    // Next-token targets everywhere.
                    if t + 1 < n {
                        assert_eq!(ex.target[t], ex.input[t + 1]);
                    }
                    if ex.mask[t] {
                        assert!(t + 1 >= b);
                        assert_eq!(ex.target[t], ex.input[t + 1 - b], "n={n} b={b} t={t}");
                    }
                }
                // Whole input is periodic with period b.
                for t in b..n {
                    assert_eq!(ex.input[t], ex.input[t - b]);
                }
            }
        }
    }

    #[test]
    fn copy_mask_counts() {
        for (n, b, want) in [(6, 2, 5), (10, 1, 10), (10, 10, 1), (10, 3, 8)] {
            let c = copy(5, n, b);
            assert_eq!(c.n_scored(), want);
            let ex = c.example(0, Split::Eval, 4).unwrap();
            assert_eq!(ex.mask.iter().filter(|&&m| m).count(), want);
        }
    }

    #[test]
    fn recall_scored_targets_are_block_headers() {
        for (v, n, b) in [
            (4, 16, 2),
            (10, 16, 3),
            (11, 64, 8),
            (20, 64, 64),
            (8, 37, 5),
        ] {
            let c = recall(v, n, b);
            let h = c.n_headers();
            assert_eq!(h, v / 2);
            for index in 0..20 {
                let ex = c.example(5, Split::Train, index).unwrap();
                check_shapes(&c, &ex);
                for t in 0..n {
                    let start = t - t % b;
                    if t % b == 0 {
                        assert!((ex.input[t] as usize) < h, "header out of sub-vocab");
                        assert!(!ex.mask[t]);
                        if t + 1 < n {
                            // Unscored block openers carry the plain next token.
                            assert_eq!(ex.target[t], ex.input[t + 1]);
                        }
                    } else {
                        assert!((ex.input[t] as usize) >= h, "filler out of sub-vocab");
                        assert!(ex.mask[t]);
                        assert_eq!(ex.target[t], ex.input[start], "v={v} n={n} b={b} t={t}");
                    }
                }
            }
        }
    }

    #[test]
    fn recall_mask_counts() {
        for (n, b, want) in [(7, 3, 4), (6, 2, 3), (10, 10, 9), (10, 2, 5), (9, 4, 6)] {
            let c = recall(6, n, b);
            assert_eq!(c.n_scored(), want);
            let ex = c.example(0, Split::Train, 1).unwrap();
            assert_eq!(ex.mask.iter().filter(|&&m| m).count(), want);
        }
    }

    #[test]
    fn recall_odd_vocab_split() {
        // vocab 5: headers {0, 1}, fillers {2, 3, 4}; all five ids occur.
        let c = recall(5, 64, 4);
        assert_eq!(c.n_headers(), 2);
        let mut seen = [false; 5];
        for ex in c.batch(1, Split::Train, 0, 10).unwrap() {
            for (t, &tok) in ex.input.iter().enumerate() {
                seen[tok as usize] = true;
                assert_eq!(t % 4 == 0, tok < 2);
            }
        }
        assert_eq!(seen, [true; 5]);
    }

    // ---- determinism and streams ----

    #[test]
    fn deterministic_and_index_dependent() {
        for c in [copy(50, 64, 4), recall(50, 64, 4)] {
            let a = c.example(42, Split::Train, 9).unwrap();
            let b = c.example(42, Split::Train, 9).unwrap();
            assert_eq!(a, b);
            let other_index = c.example(42, Split::Train, 10).unwrap();
            assert_ne!(a.input, other_index.input);
            let other_seed = c.example(43, Split::Train, 9).unwrap();
            assert_ne!(a.input, other_seed.input);
        }
    }

    #[test]
    fn batch_equals_individual_examples() {
        let c = copy(7, 32, 3);
        let batch = c.batch(8, Split::Eval, 100, 5).unwrap();
        assert_eq!(batch.len(), 5);
        for (i, ex) in batch.iter().enumerate() {
            assert_eq!(*ex, c.example(8, Split::Eval, 100 + i as u64).unwrap());
        }
        assert!(c.batch(8, Split::Eval, 100, 0).unwrap().is_empty());
    }

    #[test]
    fn train_and_eval_differ() {
        for c in [copy(50, 64, 4), recall(50, 64, 4)] {
            let train = c.batch(42, Split::Train, 0, 8).unwrap();
            let eval = c.batch(42, Split::Eval, 0, 8).unwrap();
            for tr in &train {
                for ev in &eval {
                    assert_ne!(tr.input, ev.input);
                }
            }
        }
    }

    #[test]
    fn pinned_values() {
        // Regression pin: catches a change of the random streams (e.g. a rand upgrade).
        let c = copy(10, 8, 3);
        let ex = c.example(0, Split::Train, 0).unwrap();
        assert_eq!(ex.input, PINNED_COPY_INPUT);
        let c = recall(10, 8, 3);
        let ex = c.example(0, Split::Eval, 0).unwrap();
        assert_eq!(ex.input, PINNED_RECALL_INPUT);
    }

    const PINNED_COPY_INPUT: [u32; 8] = [0, 3, 1, 0, 3, 1, 0, 3];
    const PINNED_RECALL_INPUT: [u32; 8] = [1, 5, 9, 0, 6, 6, 0, 7];

    // ---- noise ----

    /// Fraction of scored copy targets that differ from the input token B − 1 back.
    fn copy_diff_fraction(c: &BlockConfig, n_examples: usize) -> f64 {
        let (mut diff, mut total) = (0usize, 0usize);
        for ex in c.batch(2024, Split::Train, 0, n_examples).unwrap() {
            for t in 0..c.seq_len {
                if ex.mask[t] {
                    total += 1;
                    diff += (ex.target[t] != ex.input[t + 1 - c.block_len]) as usize;
                }
            }
        }
        diff as f64 / total as f64
    }

    #[test]
    fn copy_noise_rate() {
        // 200 examples × 61 scored targets = 12200 Bernoulli trials; sd ≈ 0.004.
        let mut c = copy(8, 64, 4);
        c.noise = 0.3;
        let expected = 0.3 * (1.0 - 1.0 / 8.0);
        let got = copy_diff_fraction(&c, 200);
        assert!(
            (got - expected).abs() < 0.02,
            "got {got}, expected {expected}"
        );
        c.noise = 1.0;
        let got = copy_diff_fraction(&c, 200);
        assert!((got - 0.875).abs() < 0.02, "got {got}");
        c.noise = 0.0;
        assert_eq!(copy_diff_fraction(&c, 50), 0.0);
    }

    #[test]
    fn copy_noise_is_coupled_across_levels() {
        let mut lo = copy(16, 128, 5);
        lo.noise = 0.1;
        let mut hi = lo.clone();
        hi.noise = 0.4;
        let clean = copy(16, 128, 5);
        for index in 0..20 {
            let a = lo.example(1, Split::Train, index).unwrap();
            let b = hi.example(1, Split::Train, index).unwrap();
            let z = clean.example(1, Split::Train, index).unwrap();
            assert_eq!(a.input[..5], b.input[..5]);
            assert_eq!(a.input[..5], z.input[..5]);
            // Wherever the low-noise sequence was resampled (visibly), the high-noise one was
            // resampled too, with the same fresh token.
            for t in 5..128 {
                if a.input[t] != a.input[t - 5] {
                    assert_eq!(b.input[t], a.input[t], "index {index} t {t}");
                }
            }
        }
    }

    #[test]
    fn recall_label_noise_rate() {
        // 200 examples × 48 scored targets = 9600 trials; sd ≈ 0.0045.
        let mut c = recall(10, 64, 4);
        c.noise = 0.3;
        let h = c.n_headers() as f64;
        let expected = 0.3 * (1.0 - 1.0 / h);
        let (mut diff, mut total) = (0usize, 0usize);
        for ex in c.batch(77, Split::Eval, 0, 200).unwrap() {
            for t in 0..64 {
                // Inputs are never corrupted.
                assert_eq!(t % 4 == 0, (ex.input[t] as usize) < 5);
                if ex.mask[t] {
                    total += 1;
                    assert!((ex.target[t] as usize) < 5, "noisy label must be a header");
                    diff += (ex.target[t] != ex.input[t - t % 4]) as usize;
                }
            }
        }
        let got = diff as f64 / total as f64;
        assert!(
            (got - expected).abs() < 0.02,
            "got {got}, expected {expected}"
        );
    }

    // ---- edge cases and validation ----

    #[test]
    fn copy_block_len_one() {
        let c = copy(9, 20, 1);
        let ex = c.example(4, Split::Train, 0).unwrap();
        assert_eq!(ex.mask, vec![true; 20]);
        assert!(ex.input.iter().all(|&tok| tok == ex.input[0]));
        assert!(ex.target.iter().all(|&tok| tok == ex.input[0]));
    }

    #[test]
    fn copy_block_len_seq_len() {
        let c = copy(1000, 12, 12);
        assert_eq!(c.n_scored(), 1);
        for index in 0..10 {
            let ex = c.example(4, Split::Train, index).unwrap();
            let mut want = vec![false; 12];
            want[11] = true;
            assert_eq!(ex.mask, want);
            assert_eq!(ex.target[11], ex.input[0]);
        }
    }

    #[test]
    fn recall_block_len_seq_len() {
        let c = recall(8, 12, 12);
        assert_eq!(c.n_scored(), 11);
        let ex = c.example(4, Split::Train, 0).unwrap();
        assert!(!ex.mask[0]);
        assert!(ex.mask[1..].iter().all(|&m| m));
        assert!(ex.target[1..].iter().all(|&tok| tok == ex.input[0]));
    }

    fn err(c: &BlockConfig) -> String {
        let e = c.validate().unwrap_err();
        // The same error is reported by the generators.
        assert_eq!(c.example(0, Split::Train, 0).unwrap_err(), e);
        assert_eq!(c.batch(0, Split::Train, 0, 2).unwrap_err(), e);
        let s = e.to_string();
        assert!(!s.contains('\n'));
        s
    }

    #[test]
    fn block_len_out_of_range() {
        assert_eq!(
            err(&copy(10, 256, 300)),
            "block_len = 300 is out of range: must be in 1..=256 (seq_len)"
        );
        assert_eq!(
            err(&copy(10, 256, 257)),
            "block_len = 257 is out of range: must be in 1..=256 (seq_len)"
        );
        assert_eq!(
            err(&copy(10, 256, 0)),
            "block_len = 0 is out of range: must be in 1..=256 (seq_len)"
        );
        assert_eq!(
            err(&recall(10, 256, 1)),
            "block_len = 1 is out of range: must be in 2..=256 (seq_len)"
        );
        assert_eq!(
            err(&recall(10, 16, 17)),
            "block_len = 17 is out of range: must be in 2..=16 (seq_len)"
        );
        assert!(copy(10, 256, 1).validate().is_ok());
        assert!(copy(10, 256, 256).validate().is_ok());
        assert!(recall(10, 256, 2).validate().is_ok());
        assert!(recall(10, 256, 256).validate().is_ok());
    }

    #[test]
    fn other_fields_out_of_range() {
        assert_eq!(
            err(&copy(1, 16, 2)),
            "vocab_size = 1 is out of range: must be in 2..=4294967295"
        );
        assert_eq!(
            err(&recall(3, 16, 2)),
            "vocab_size = 3 is out of range: must be in 4..=4294967295"
        );
        assert_eq!(
            err(&copy(1 << 32, 16, 2)),
            "vocab_size = 4294967296 is out of range: must be in 2..=4294967295"
        );
        assert!(copy(2, 16, 2).validate().is_ok());
        assert!(recall(4, 16, 2).validate().is_ok());
        assert_eq!(
            err(&copy(10, 1, 1)),
            "seq_len = 1 is out of range: must be in 2.."
        );
        for (noise, shown) in [
            (-0.1, "-0.1"),
            (1.5, "1.5"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "inf"),
        ] {
            let mut c = copy(10, 16, 2);
            c.noise = noise;
            assert_eq!(
                err(&c),
                format!("noise = {shown} is out of range: must be in 0.0..=1.0")
            );
        }
        let mut c = recall(10, 16, 2);
        c.noise = 1.0;
        assert!(c.validate().is_ok());
    }

    #[test]
    fn index_limits() {
        let c = copy(10, 8, 2);
        assert!(c.example(0, Split::Train, MAX_INDEX).is_ok());
        let e = c.example(0, Split::Train, MAX_INDEX + 1).unwrap_err();
        assert!(
            matches!(e, TaskError::OutOfRange { field: "index", .. }),
            "{e}"
        );
        assert_eq!(c.batch(0, Split::Train, MAX_INDEX - 1, 2).unwrap().len(), 2);
        let e = c.batch(0, Split::Train, MAX_INDEX - 1, 3).unwrap_err();
        assert!(
            matches!(e, TaskError::Invalid { field: "batch", .. }),
            "{e}"
        );
        let e = c.batch(0, Split::Train, u64::MAX, 2).unwrap_err();
        assert!(
            matches!(e, TaskError::Invalid { field: "batch", .. }),
            "{e}"
        );
    }

    #[test]
    fn dep_width_is_block_len() {
        assert_eq!(copy(10, 64, 7).dep_width(), 7);
        assert_eq!(recall(10, 64, 9).dep_width(), 9);
    }
}
