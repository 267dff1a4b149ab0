//! Indirect indexing, the PoPE diagnostic (SCIENCE.md section 2).
//!
//! The model reads a string of distinct letters, a query letter that occurs in it and a signed
//! shift, and must emit the letter `shift` places away from the query:
//!
//! ```text
//! QEOHoUbKfeSrMVNlCzXu,z,-3,  →  N      ('z' is at index 17; index 17 − 3 = 14 holds 'N')
//! ```
//!
//! Solving it requires locating a token by *content* (the query) and then moving a *relative*
//! distance from it, the combination that separates PoPE from RoPE in Gopalakrishnan et al.,
//! *Decoupling the "What" and "Where" With Polar Coordinate Positional Embeddings*
//! (arXiv 2509.10534): RoPE 11.16 ± 2.45 %, PoPE 94.82 ± 2.91 % final-token accuracy.
//!
//! ```
//! use tasks::Split;
//! use tasks::indirect::{self, IndirectConfig, IndirectSample, PAD};
//!
//! let cfg = IndirectConfig::default(); // 20..=40 letters, shifts in −15..=15, seq_len 48
//! // The paper's example, encoded by hand.
//! let paper = IndirectSample {
//!     source: "QEOHoUbKfeSrMVNlCzXu".into(),
//!     query: 'z',
//!     shift: -3,
//!     target: 'N',
//!     text: "QEOHoUbKfeSrMVNlCzXu,z,-3,".into(),
//! };
//! assert_eq!(indirect::solve(&paper.text), Some('N'));
//! let ex = cfg.encode_sample(&paper)?;
//! assert_eq!(ex.input.len(), 48);
//! assert_eq!(ex.n_scored(), 1);
//! assert!(ex.mask[25]); // input[25] is the final ',' of the 26-character prompt
//! assert_eq!(ex.target[25], indirect::encode('N').unwrap()); // id 40
//! assert_eq!(ex.input[26], 40); // the answer is also the next input token...
//! assert!(ex.input[27..].iter().all(|&id| id == PAD)); // ...followed by padding
//!
//! // Generated examples: deterministic in (seed, split, index), one scored token each.
//! let s = cfg.sample(7, Split::Train, 0)?;
//! assert_eq!(indirect::solve(&s.text), Some(s.target));
//! let ex = cfg.example(7, Split::Train, 0)?;
//! assert_eq!(ex, cfg.encode_sample(&s)?);
//! let batch = cfg.batch(7, Split::Eval, 0, 4)?; // disjoint from every train example
//! assert_eq!(batch.len(), 4);
//! # Ok::<(), tasks::TaskError>(())
//! ```
//!
//! # Text format
//!
//! The prompt (`text`) is `SOURCE,q,k,` where
//! - `SOURCE` is `N` distinct letters from `a–zA–Z` (52 letters), `N` in
//!   `min_letters..=max_letters`;
//! - `q` is one letter of `SOURCE` (the *query*);
//! - `k` is the shift, written as a signed decimal in Rust's `i32` `Display` form: `-3`, `0`,
//!   `7` — a minus sign for negatives, **no plus sign** for positives (as in the paper's `-3`),
//!   no leading zeros;
//!
//! and the answer (`target`) is `SOURCE[i + k]` where `i` is the index of `q` in `SOURCE`. The
//! generator only emits prompts with `0 ≤ i + k < N`. [`solve`] is a reference solver for this
//! format.
//!
//! # Vocabulary
//!
//! Character-level and fixed, independent of the config ([`VOCAB_SIZE`] = 65 ids):
//!
//! | id       | token                      |
//! |----------|----------------------------|
//! | `0`      | `PAD` ([`PAD`]; no character) |
//! | `1..=26` | `a`..=`z`                  |
//! | `27..=52`| `A`..=`Z`                  |
//! | `53`     | `,`                        |
//! | `54`     | `-`                        |
//! | `55..=64`| `0`..=`9`                  |
//!
//! [`CHARS`] lists the characters of ids `1..=64` in order (`CHARS[id − 1]`); [`encode`] and
//! [`decode`] convert single tokens, [`encode_str`] and [`decode_ids`] whole strings.
//!
//! # Example layout (fixed length, for batching)
//!
//! The full token sequence is `x = encode(text) ++ [encode(target)]`, right-padded with [`PAD`]
//! to length `seq_len + 1`. Then, next-token as everywhere in this crate,
//!
//! ```text
//! input  = x[0 .. seq_len]
//! target = x[1 .. seq_len + 1]
//! mask[t] = (t == len(text) − 1)      exactly one scored position: the final ','
//! ```
//!
//! so `target[len(text) − 1]` is the answer letter, and loss and accuracy are taken on that
//! token only. `seq_len` must be at least [`IndirectConfig::min_seq_len`] =
//! `max_letters + 5 + w`, the length of the longest possible full string (`SOURCE`, `,`, `q`,
//! `,`, shift, `,`, answer), where `w` is the width of the longest shift text (`-15` → 3; `0` → 1
//! when `max_shift = 0`). So every input holds the whole string (prompt *and* answer), and every
//! target after the answer is `PAD` (at least one: `target[seq_len − 1]` always is).
//! Default: `40 + 5 + 3 = 48`.
//!
//! Worked layout for the paper example (`seq_len = 48`; `len(text) = 26`):
//!
//! ```text
//! t        0   1  …  19  20  21  22  23  24  25   26   27  …   47
//! input    Q   E  …   u   ,   z   ,   -   3   ,    N  PAD  …  PAD
//! target   E   O  …   ,   z   ,   -   3   ,   N  PAD  PAD  …  PAD
//! mask     F   F  …   F   F   F   F   F   F   T    F    F  …    F
//! ```
//!
//! # Sampling (with rejection)
//!
//! Per example, from its own stream [`crate::example_rng`], in this order:
//! 1. `N` uniform in `min_letters..=max_letters`;
//! 2. `SOURCE`: an ordered uniform sample of `N` letters without replacement (the first `N`
//!    steps of a Fisher–Yates shuffle of `a..=zA..=Z`);
//! 3. repeat: query index `i` uniform in `0..N`, shift `k` uniform in `−max_shift..=max_shift`;
//!    **until** `0 ≤ i + k < N`, `|k| ≥ min_abs_shift` and `k`'s sign is kept by `shift_sign`
//!    ([`ShiftSign`]; the last two are ladder knobs, off by default). Both `i` and `k` are
//!    redrawn on every rejection; `N` and `SOURCE` are drawn once and never redrawn. With the
//!    knobs off the stream of draws is the one generated before they existed.
//!
//! Consequences (write `K' = min(max_shift, N − 1)`, the largest shift that can be kept):
//! - `N` is exactly uniform on `min_letters..=max_letters` (redrawing the string on rejection
//!   would have favoured long strings).
//! - `(i, k)` is uniform over the `V(N) = N(2K' + 1) − K'(K' + 1)` valid pairs, so the kept
//!   shift is **not** uniform but triangular: `P(k | N) = (N − |k|) / V(N)` for `|k| ≤ K'`
//!   (symmetric, mean 0; small shifts are more common because more query positions admit them).
//!   For `N = 20, max_shift = 15`: `P(0) = 20/380`, `P(±15) = 5/380`.
//! - The query index is not uniform either: `P(i | N) = (min(i, K') + min(N − 1 − i, K') + 1) /
//!   V(N)` (uniform when `max_shift ≥ N − 1`); by symmetry the answer index has the same law.
//! - With the knobs on, `(i, k)` is uniform over the valid pairs that they keep, so `P(k | N)`
//!   is the same triangle restricted to the kept shifts and renormalised.
//! - A draw is accepted with probability `V(N) / (N(2·max_shift + 1))` (0.61 for `N = 20`, 0.81
//!   for `N = 40`); shift `0` is always valid, so the loop ends with probability 1.
//!
//! # Paper protocol
//!
//! The paper trains on [`PAPER_TRAIN`] examples and reports validation/test accuracy on
//! [`PAPER_VAL`] / [`PAPER_TEST`] examples, over 3 seeds. With this crate, one way to get fixed
//! disjoint sets is train = `Split::Train` indices `0..PAPER_TRAIN`, validation = `Split::Eval`
//! indices `0..PAPER_VAL`, test = `Split::Eval` indices `PAPER_VAL..PAPER_VAL + PAPER_TEST`.
//! (The three sets share no random stream; as the task space is finite, an identical string may
//! still occur in two of them by chance.)

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::{Example, MAX_INDEX, Split, TaskError, example_rng};

/// Number of training examples in the PoPE indirect-indexing protocol (Gopalakrishnan et al.,
/// arXiv 2509.10534): 1,000,000.
pub const PAPER_TRAIN: u64 = 1_000_000;

/// Number of validation examples in the PoPE indirect-indexing protocol (Gopalakrishnan et al.,
/// arXiv 2509.10534): 10,000.
pub const PAPER_VAL: u64 = 10_000;

/// Number of test examples in the PoPE indirect-indexing protocol (Gopalakrishnan et al.,
/// arXiv 2509.10534): 10,000. Accuracy is reported on the final (answer) token only.
pub const PAPER_TEST: u64 = 10_000;

/// The 52 source letters in id order: `a..=z` (ids 1–26), then `A..=Z` (ids 27–52).
pub const LETTERS: [char; 52] = [
    'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l', 'm', 'n', 'o', 'p', 'q', 'r', 's',
    't', 'u', 'v', 'w', 'x', 'y', 'z', 'A', 'B', 'C', 'D', 'E', 'F', 'G', 'H', 'I', 'J', 'K', 'L',
    'M', 'N', 'O', 'P', 'Q', 'R', 'S', 'T', 'U', 'V', 'W', 'X', 'Y', 'Z',
];

/// The characters of token ids `1..=64`, in id order: `CHARS[id − 1]` (id 0 is [`PAD`]).
/// Letters `a–z`, `A–Z`, then `,`, `-`, digits `0–9`.
pub const CHARS: [char; 64] = {
    let mut out = ['\0'; 64];
    let mut i = 0;
    while i < 52 {
        out[i] = LETTERS[i];
        i += 1;
    }
    out[52] = ',';
    out[53] = '-';
    let mut d = 0;
    while d < 10 {
        out[54 + d] = (b'0' + d as u8) as char;
        d += 1;
    }
    out
};

/// Token id of padding (no character). Padding fills every position after the answer (in every
/// target; in the input unless the string fills it).
pub const PAD: u32 = 0;

/// Number of token ids: `PAD` plus the 64 characters of [`CHARS`].
pub const VOCAB_SIZE: usize = 65;

/// Number of token ids, [`VOCAB_SIZE`] (65); ids are `0..65`.
pub fn vocab_size() -> usize {
    VOCAB_SIZE
}

/// Token id of character `c` (see the vocabulary table in the [module docs](self)), or `None`
/// if `c` is not in the vocabulary.
pub fn encode(c: char) -> Option<u32> {
    match c {
        'a'..='z' => Some(1 + (c as u32 - 'a' as u32)),
        'A'..='Z' => Some(27 + (c as u32 - 'A' as u32)),
        ',' => Some(53),
        '-' => Some(54),
        '0'..='9' => Some(55 + (c as u32 - '0' as u32)),
        _ => None,
    }
}

/// Character of token id `id`, or `None` for [`PAD`] and for ids `≥ 65`.
pub fn decode(id: u32) -> Option<char> {
    crate::decode_char(&CHARS, id)
}

/// Token ids of every character of `s`, or `None` if some character is not in the vocabulary.
pub fn encode_str(s: &str) -> Option<Vec<u32>> {
    s.chars().map(encode).collect()
}

/// The string of `ids` with [`PAD`] ids dropped (wherever they are), or `None` if some id is
/// `≥ 65`. `decode_ids(&example.input)` shows an example's full string (prompt and answer).
pub fn decode_ids(ids: &[u32]) -> Option<String> {
    crate::decode_chars(&CHARS, ids)
}

/// Reference solver: the answer to prompt `text` (format `SOURCE,q,k,`, see the
/// [module docs](self)), or `None` if `text` is not a well-formed prompt.
///
/// Well-formed means: exactly three `,`-terminated fields; `SOURCE` is non-empty and made of
/// distinct letters from `a–zA–Z`; `q` is a single letter occurring in `SOURCE`; `k` is an `i32`
/// written exactly as `Display` writes it (so `+3`, `03`, `-0` are rejected); and the answer
/// index `index(q) + k` lies inside `SOURCE`. Independent of any config (any `N` is accepted).
///
/// ```
/// assert_eq!(tasks::indirect::solve("QEOHoUbKfeSrMVNlCzXu,z,-3,"), Some('N'));
/// assert_eq!(tasks::indirect::solve("abc,a,2,"), Some('c'));
/// assert_eq!(tasks::indirect::solve("abc,a,3,"), None); // past the end
/// ```
pub fn solve(text: &str) -> Option<char> {
    let body = text.strip_suffix(',')?;
    let mut fields = body.split(',');
    let (source, query, shift) = (fields.next()?, fields.next()?, fields.next()?);
    if fields.next().is_some() {
        return None;
    }
    let letters: Vec<char> = source.chars().collect();
    let mut seen = [false; VOCAB_SIZE];
    for &c in &letters {
        if !c.is_ascii_alphabetic() {
            return None;
        }
        let id = encode(c)? as usize;
        if std::mem::replace(&mut seen[id], true) {
            return None; // repeated letter
        }
    }
    let mut q = query.chars();
    let (qc, rest) = (q.next()?, q.next());
    if rest.is_some() {
        return None;
    }
    let i = letters.iter().position(|&c| c == qc)?;
    let k: i32 = shift.parse().ok()?;
    if k.to_string() != shift {
        return None;
    }
    let j = i as i64 + k as i64;
    (0..letters.len() as i64)
        .contains(&j)
        .then(|| letters[j as usize])
}

/// One drawn task instance in human-readable form (e.g. for printing examples as JSON lines).
///
/// Fields are redundant by construction: `text == format!("{source},{query},{shift},")` and
/// `target == solve(&text).unwrap()` for every generated sample.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndirectSample {
    /// The `N` distinct source letters, in order.
    pub source: String,
    /// The query letter (occurs in `source`).
    pub query: char,
    /// The signed shift `k`, with `0 ≤ index(query) + k < N`.
    pub shift: i32,
    /// The answer: `source[index(query) + shift]`.
    pub target: char,
    /// The prompt, `"{source},{query},{shift},"`, e.g. `"QEOHoUbKfeSrMVNlCzXu,z,-3,"`.
    pub text: String,
}

/// Configuration of the indirect-indexing task (see the [module docs](self)).
///
/// `Default` is the paper's setting: 20..=40 letters, shifts in `−15..=15`, `seq_len = 48`.
/// Deserialising does not validate; [`IndirectConfig::example`], [`IndirectConfig::batch`],
/// [`IndirectConfig::sample`] and [`IndirectConfig::encode_sample`] call
/// [`IndirectConfig::validate`] themselves.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IndirectConfig {
    /// Fewest source letters `N`, in `2..=52`.
    pub min_letters: usize,
    /// Most source letters `N`, in `min_letters..=52`. `N` is uniform on
    /// `min_letters..=max_letters`.
    pub max_letters: usize,
    /// Shifts are drawn uniformly from `−max_shift..=max_shift` (then rejected if out of the
    /// string); in `0..=51`. Shifts beyond `N − 1` in size are never kept.
    pub max_shift: usize,
    /// Shifts with `|k| < min_abs_shift` are rejected (and redrawn); in `0..=max_shift` and below
    /// `min_letters`. Default 0 (every shift kept). A ladder knob: `1` removes the `k = 0`
    /// examples, whose answer is the query letter itself.
    #[serde(default)]
    pub min_abs_shift: usize,
    /// Which signs of `k` are kept ([`ShiftSign`]); default both.
    #[serde(default)]
    pub shift_sign: ShiftSign,
    /// Context length: length of `input`, `target` and `mask`; at least
    /// [`IndirectConfig::min_seq_len`].
    pub seq_len: usize,
}

/// Which signs of the shift `k` an indirect-indexing generator keeps (a difficulty-ladder knob,
/// issue 18). `Positive` keeps `k ≥ 1` only: the answer lies after the query letter, so with
/// `max_shift = 1` the task is "the letter after the query letter", an induction-head lookup
/// (content match, then one fixed offset). `Negative` keeps `k ≤ −1` only.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ShiftSign {
    /// Every sign (the paper's task); `k = 0` too unless `min_abs_shift ≥ 1`.
    #[default]
    Both,
    /// `k ≥ 1` only.
    Positive,
    /// `k ≤ −1` only.
    Negative,
}

impl ShiftSign {
    /// `true` for [`ShiftSign::Both`] (serde: the default is not written, so run ids of runs
    /// without the knob are unchanged).
    pub fn is_both(&self) -> bool {
        *self == ShiftSign::Both
    }

    /// Whether shift `k` has a kept sign.
    pub fn keeps(self, k: i32) -> bool {
        match self {
            ShiftSign::Both => true,
            ShiftSign::Positive => k >= 1,
            ShiftSign::Negative => k <= -1,
        }
    }
}

/// `true` when `n == 0` (serde: an absent `min_abs_shift` keeps run ids unchanged).
fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Default for IndirectConfig {
    fn default() -> Self {
        IndirectConfig {
            min_letters: 20,
            max_letters: 40,
            max_shift: 15,
            min_abs_shift: 0,
            shift_sign: ShiftSign::Both,
            seq_len: 48,
        }
    }
}

/// Indirect indexing's own parameters in a training run (the run's `seq_len` completes them
/// into an [`IndirectConfig`]). Defaults are the paper's (20–40 letters, shifts up to ±15).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IndirectParams {
    /// Fewest letters in the source string.
    pub min_letters: usize,
    /// Most letters in the source string.
    pub max_letters: usize,
    /// Largest absolute shift.
    pub max_shift: usize,
    /// Smallest absolute shift kept (default 0; not serialised when 0, so run ids are unchanged).
    #[serde(skip_serializing_if = "is_zero")]
    pub min_abs_shift: usize,
    /// Signs of the shift kept: `"both"` (default; not serialised), `"positive"`, `"negative"`.
    #[serde(skip_serializing_if = "ShiftSign::is_both")]
    pub shift_sign: ShiftSign,
}

impl Default for IndirectParams {
    fn default() -> Self {
        let c = IndirectConfig::default();
        IndirectParams {
            min_letters: c.min_letters,
            max_letters: c.max_letters,
            max_shift: c.max_shift,
            min_abs_shift: c.min_abs_shift,
            shift_sign: c.shift_sign,
        }
    }
}

impl IndirectParams {
    /// Parameter names, in serialisation order (checked by a test).
    pub const NAMES: &'static [&'static str] = &[
        "min_letters",
        "max_letters",
        "max_shift",
        "min_abs_shift",
        "shift_sign",
    ];

    /// The generator config for a run with context `seq_len`.
    pub fn config(&self, seq_len: usize) -> IndirectConfig {
        IndirectConfig {
            min_letters: self.min_letters,
            max_letters: self.max_letters,
            max_shift: self.max_shift,
            min_abs_shift: self.min_abs_shift,
            shift_sign: self.shift_sign,
            seq_len,
        }
    }
}

impl IndirectConfig {
    /// Check every field.
    ///
    /// # Errors
    /// [`TaskError::OutOfRange`] naming the first bad field, checked in the order `min_letters`
    /// (`2..=52`), `max_letters` (`min_letters..=52`), `max_shift` (`0..=51`), `min_abs_shift`
    /// (`0..=max_shift` and, with the smallest kept size `max(min_abs_shift, 1)` for a signed
    /// [`ShiftSign`], below `min_letters`), then [`TaskError::Invalid`] on `shift_sign` when it
    /// is signed and `max_shift = 0`, then `seq_len`
    /// (`min_seq_len()..`), e.g.
    /// `seq_len = 40 is out of range: must be in 48.. (max_letters, max_shift)`.
    pub fn validate(&self) -> Result<(), TaskError> {
        let n_letters = LETTERS.len();
        if !(2..=n_letters).contains(&self.min_letters) {
            return Err(TaskError::out_of_range(
                "min_letters",
                self.min_letters,
                format!("2..={n_letters}"),
            ));
        }
        if !(self.min_letters..=n_letters).contains(&self.max_letters) {
            return Err(TaskError::out_of_range(
                "max_letters",
                self.max_letters,
                format!("{}..={n_letters} (min_letters)", self.min_letters),
            ));
        }
        if self.max_shift > n_letters - 1 {
            return Err(TaskError::out_of_range(
                "max_shift",
                self.max_shift,
                format!("0..={}", n_letters - 1),
            ));
        }
        // A kept shift must fit in the shortest string: |k| ≥ the smallest kept size, ≤ N − 1.
        let smallest = if self.shift_sign.is_both() {
            self.min_abs_shift
        } else {
            self.min_abs_shift.max(1)
        };
        if self.min_abs_shift > self.max_shift || smallest >= self.min_letters {
            return Err(TaskError::out_of_range(
                "min_abs_shift",
                self.min_abs_shift,
                format!(
                    "0..={} (max_shift, and below min_letters = {})",
                    self.max_shift.min(self.min_letters - 1),
                    self.min_letters
                ),
            ));
        }
        if !self.shift_sign.is_both() && self.max_shift == 0 {
            return Err(TaskError::Invalid {
                field: "shift_sign",
                message: "\"positive\" and \"negative\" need max_shift ≥ 1; max_shift = 0".into(),
            });
        }
        let min = self.min_seq_len();
        if self.seq_len < min {
            return Err(TaskError::out_of_range(
                "seq_len",
                self.seq_len,
                format!("{min}.. (max_letters, max_shift)"),
            ));
        }
        Ok(())
    }

    /// Smallest valid `seq_len`: the length of the longest possible full string (prompt and
    /// answer), `max_letters + 5 + w` with `w` the number of characters of `-max_shift` (or 1 for
    /// `max_shift = 0`). 48 for the default config.
    pub fn min_seq_len(&self) -> usize {
        let w = if self.max_shift == 0 {
            1
        } else {
            1 + self.max_shift.to_string().len()
        };
        // SOURCE + ',' + q + ',' + shift + ',' + answer.
        self.max_letters + 5 + w
    }

    /// Scored positions per example: always 1 (the answer token).
    pub fn n_scored(&self) -> usize {
        1
    }

    /// Draw sample number `index` of `split` for `seed`, in human-readable form. A pure function
    /// of `(self, seed, split, index)`, and the same instance that
    /// [`IndirectConfig::example`] encodes for those arguments.
    ///
    /// # Errors
    /// Any [`IndirectConfig::validate`] error; [`TaskError::OutOfRange`] on `index` if
    /// `index > MAX_INDEX`.
    pub fn sample(&self, seed: u64, split: Split, index: u64) -> Result<IndirectSample, TaskError> {
        self.validate()?;
        let mut rng = example_rng(seed, split, index)?;
        Ok(self.draw(&mut rng))
    }

    /// Generate example number `index` of `split` for `seed`, deterministically: the
    /// encoding ([`IndirectConfig::encode_sample`]) of `self.sample(seed, split, index)`.
    /// `input`, `target` and `mask` have length `seq_len`; one position is scored.
    ///
    /// # Errors
    /// Any [`IndirectConfig::validate`] error; [`TaskError::OutOfRange`] on `index` if
    /// `index > MAX_INDEX`.
    pub fn example(&self, seed: u64, split: Split, index: u64) -> Result<Example, TaskError> {
        self.validate()?;
        let mut rng = example_rng(seed, split, index)?;
        let s = self.draw(&mut rng);
        Ok(self.assemble(&s.text, s.target))
    }

    /// A batch: examples `index0 .. index0 + batch` of `split` for `seed`, in order. Element `i`
    /// equals `self.example(seed, split, index0 + i)`. `batch = 0` gives an empty vector.
    ///
    /// # Errors
    /// Any [`IndirectConfig::validate`] error; [`TaskError::Invalid`] on `batch` if the last
    /// index `index0 + batch − 1` exceeds `MAX_INDEX`.
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
                let s = self.draw(&mut rng);
                Ok(self.assemble(&s.text, s.target))
            })
            .collect()
    }

    /// Encode a sample (e.g. one written by hand) as an [`Example`] with this config's
    /// `seq_len`, laid out as in the [module docs](self). Only `text` and `target` are used;
    /// the sample need not respect this config's letter or shift ranges.
    ///
    /// # Errors
    /// Any [`IndirectConfig::validate`] error; [`TaskError::Invalid`] on `sample` if `text` is
    /// not a well-formed prompt ([`solve`] gives `None`), if `target` is not its answer, or if
    /// the full string (prompt and answer) is longer than `seq_len` tokens.
    pub fn encode_sample(&self, sample: &IndirectSample) -> Result<Example, TaskError> {
        self.validate()?;
        let invalid = |message: String| TaskError::Invalid {
            field: "sample",
            message,
        };
        let Some(answer) = solve(&sample.text) else {
            return Err(invalid(format!(
                "text {:?} is not a well-formed prompt",
                sample.text
            )));
        };
        if answer != sample.target {
            return Err(invalid(format!(
                "target {:?} is not the answer {answer:?} to {:?}",
                sample.target, sample.text
            )));
        }
        // solve() accepted the text, so every character is in the vocabulary (one byte each).
        let len = sample.text.len() + 1;
        if len > self.seq_len {
            return Err(invalid(format!(
                "prompt + answer is {len} tokens, longer than seq_len = {}",
                self.seq_len
            )));
        }
        Ok(self.assemble(&sample.text, sample.target))
    }

    /// Draw one instance (see "Sampling" in the module docs). Config must be valid.
    fn draw(&self, rng: &mut ChaCha8Rng) -> IndirectSample {
        let n = rng.random_range(self.min_letters..=self.max_letters);
        let mut alphabet = LETTERS;
        for i in 0..n {
            let j = rng.random_range(i..alphabet.len());
            alphabet.swap(i, j);
        }
        let letters = &alphabet[..n];
        let k = self.max_shift as i32;
        let (i, shift) = loop {
            let i = rng.random_range(0..n) as i32;
            let shift = rng.random_range(-k..=k);
            if (0..n as i32).contains(&(i + shift))
                && shift.unsigned_abs() as usize >= self.min_abs_shift
                && self.shift_sign.keeps(shift)
            {
                break (i as usize, shift);
            }
        };
        let source: String = letters.iter().collect();
        let query = letters[i];
        let target = letters[(i as i32 + shift) as usize];
        let text = format!("{source},{query},{shift},");
        IndirectSample {
            source,
            query,
            shift,
            target,
            text,
        }
    }

    /// Lay out `text ++ target` as an example (see the module docs). `text` must be in the
    /// vocabulary and `len(text) + 1 ≤ seq_len`.
    fn assemble(&self, text: &str, target: char) -> Example {
        let n = self.seq_len;
        let mut x: Vec<u32> = Vec::with_capacity(n + 1);
        x.extend(
            text.chars()
                .map(|c| encode(c).expect("text is in the vocabulary")),
        );
        let scored = x.len() - 1;
        x.push(encode(target).expect("target is in the vocabulary"));
        debug_assert!(x.len() <= n);
        x.resize(n + 1, PAD);
        let mut mask = vec![false; n];
        mask[scored] = true;
        Example {
            input: x[..n].to_vec(),
            target: x[1..].to_vec(),
            mask,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAPER_TEXT: &str = "QEOHoUbKfeSrMVNlCzXu,z,-3,";

    fn cfg(min_letters: usize, max_letters: usize, max_shift: usize) -> IndirectConfig {
        let mut c = IndirectConfig {
            min_letters,
            max_letters,
            max_shift,
            seq_len: 0,
            ..IndirectConfig::default()
        };
        c.seq_len = c.min_seq_len();
        c
    }

    fn paper_sample() -> IndirectSample {
        IndirectSample {
            source: "QEOHoUbKfeSrMVNlCzXu".into(),
            query: 'z',
            shift: -3,
            target: 'N',
            text: PAPER_TEXT.into(),
        }
    }

    /// Pearson chi-square statistic of `counts` against probabilities `probs`.
    fn chi2(counts: &[usize], probs: &[f64]) -> f64 {
        let total: usize = counts.iter().sum();
        counts
            .iter()
            .zip(probs)
            .map(|(&c, &p)| {
                let e = p * total as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum()
    }

    /// Check every structural property of one sample against the config.
    fn check_sample(c: &IndirectConfig, s: &IndirectSample) {
        let letters: Vec<char> = s.source.chars().collect();
        let n = letters.len();
        assert!((c.min_letters..=c.max_letters).contains(&n), "N = {n}");
        assert!(letters.iter().all(|ch| LETTERS.contains(ch)), "{s:?}");
        let mut sorted = letters.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), n, "letters not distinct: {}", s.source);
        assert!(s.shift.unsigned_abs() as usize <= c.max_shift);
        let i = letters.iter().position(|&ch| ch == s.query).unwrap();
        let j = i as i32 + s.shift;
        assert!((0..n as i32).contains(&j), "{s:?}");
        assert_eq!(letters[j as usize], s.target);
        assert_eq!(s.text, format!("{},{},{},", s.source, s.query, s.shift));
        assert_eq!(solve(&s.text), Some(s.target), "{s:?}");
    }

    /// Check the layout of `ex` against the sample it encodes.
    fn check_example(c: &IndirectConfig, s: &IndirectSample, ex: &Example) {
        let n = c.seq_len;
        assert_eq!(ex.input.len(), n);
        assert_eq!(ex.target.len(), n);
        assert_eq!(ex.mask.len(), n);
        let p = s.text.len(); // index of the answer in x
        let scored: Vec<usize> = (0..n).filter(|&t| ex.mask[t]).collect();
        assert_eq!(scored, vec![p - 1]);
        assert_eq!(ex.n_scored(), c.n_scored());
        assert_eq!(decode(ex.target[p - 1]), Some(s.target));
        assert_eq!(decode(ex.input[p - 1]), Some(','));
        assert_eq!(decode(ex.input[p]), Some(s.target));
        assert_eq!(ex.input[..p], encode_str(&s.text).unwrap()[..]);
        assert!(p < n, "the answer is in the input");
        assert!(ex.input[p + 1..].iter().all(|&id| id == PAD));
        assert!(ex.target[p..].iter().all(|&id| id == PAD));
        assert_eq!(ex.target[n - 1], PAD);
        for t in 0..n - 1 {
            assert_eq!(ex.target[t], ex.input[t + 1]);
        }
        assert!(ex.input.iter().all(|&id| (id as usize) < VOCAB_SIZE));
        assert_eq!(
            decode_ids(&ex.input).unwrap(),
            format!("{}{}", s.text, s.target)
        );
    }

    // ---- vocabulary ----

    #[test]
    fn vocabulary_table() {
        assert_eq!(vocab_size(), 65);
        assert_eq!(CHARS.len() + 1, VOCAB_SIZE);
        let table = [
            ('a', 1),
            ('b', 2),
            ('z', 26),
            ('A', 27),
            ('N', 40),
            ('Z', 52),
            (',', 53),
            ('-', 54),
            ('0', 55),
            ('3', 58),
            ('9', 64),
        ];
        for (c, id) in table {
            assert_eq!(encode(c), Some(id), "{c}");
            assert_eq!(decode(id), Some(c), "{id}");
        }
        assert_eq!(decode(PAD), None);
        assert_eq!(decode(65), None);
        assert_eq!(decode(u32::MAX), None);
        for c in ['+', ' ', '\0', 'é', '.', '\n', 'ß'] {
            assert_eq!(encode(c), None, "{c:?}");
        }
        assert_eq!(
            CHARS.iter().collect::<String>(),
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ,-0123456789"
        );
    }

    #[test]
    fn encoding_round_trips() {
        for id in 1..VOCAB_SIZE as u32 {
            assert_eq!(encode(decode(id).unwrap()), Some(id));
            assert_eq!(CHARS[id as usize - 1], decode(id).unwrap());
        }
        let mut seen = [false; VOCAB_SIZE];
        for c in CHARS {
            let id = encode(c).unwrap() as usize;
            assert!(!seen[id], "id {id} used twice");
            seen[id] = true;
        }
        assert_eq!(seen.iter().filter(|&&s| s).count(), 64);
        assert!(!seen[PAD as usize]);
    }

    #[test]
    fn paper_text_encodes_and_decodes() {
        let ids = encode_str(PAPER_TEXT).unwrap();
        assert_eq!(ids.len(), 26);
        // Q E O H o ... , z , - 3 ,
        assert_eq!(ids[..5], [43, 31, 41, 34, 15]);
        assert_eq!(ids[20..], [53, 26, 53, 54, 58, 53]);
        assert_eq!(decode_ids(&ids).unwrap(), PAPER_TEXT);
        let mut padded = ids.clone();
        padded.extend([PAD, PAD]);
        assert_eq!(decode_ids(&padded).unwrap(), PAPER_TEXT);
        assert_eq!(decode_ids(&[1, 65]), None);
        assert_eq!(encode_str("ab+c"), None);
    }

    // ---- reference solver ----

    #[test]
    fn solver_on_paper_example() {
        assert_eq!(solve(PAPER_TEXT), Some('N'));
        // By hand: 'z' is at index 17, 17 − 3 = 14.
        let source: Vec<char> = "QEOHoUbKfeSrMVNlCzXu".chars().collect();
        assert_eq!(source.iter().position(|&c| c == 'z'), Some(17));
        assert_eq!(source[14], 'N');
        assert_eq!(solve("QEOHoUbKfeSrMVNlCzXu,z,0,"), Some('z'));
        assert_eq!(solve("QEOHoUbKfeSrMVNlCzXu,z,2,"), Some('u'));
        assert_eq!(solve("QEOHoUbKfeSrMVNlCzXu,Q,19,"), Some('u'));
        assert_eq!(solve("QEOHoUbKfeSrMVNlCzXu,u,-19,"), Some('Q'));
        assert_eq!(solve("ab,b,-1,"), Some('a'));
    }

    #[test]
    fn solver_rejects_malformed_prompts() {
        for bad in [
            "",
            ",",
            "QEOHoUbKfeSrMVNlCzXu,z,-3",   // no final comma
            "QEOHoUbKfeSrMVNlCzXu,z,3,",   // index 20: past the end
            "QEOHoUbKfeSrMVNlCzXu,Q,-1,",  // index −1
            "QEOHoUbKfeSrMVNlCzXu,z,+2,",  // plus sign
            "QEOHoUbKfeSrMVNlCzXu,z,02,",  // leading zero
            "QEOHoUbKfeSrMVNlCzXu,z,-0,",  // negative zero
            "QEOHoUbKfeSrMVNlCzXu,z,,",    // empty shift
            "QEOHoUbKfeSrMVNlCzXu,a,0,",   // query absent
            "QEOHoUbKfeSrMVNlCzXu,zz,0,",  // two-letter query
            "QEOHoUbKfeSrMVNlCzXu,,0,",    // empty query
            ",a,0,",                       // empty source
            "abca,a,1,",                   // repeated letter
            "ab1,a,1,",                    // digit in source
            "abé,a,1,",                    // non-ASCII letter
            "abc,a,1,,",                   // extra field
            "abc,a,1,x,",                  // extra field
            "abc,a,99999999999999999999,", // not an i32
        ] {
            assert_eq!(solve(bad), None, "{bad:?}");
        }
    }

    // ---- generator semantics ----

    #[test]
    fn generated_targets_match_solver_default() {
        let c = IndirectConfig::default();
        for split in [Split::Train, Split::Eval] {
            for index in 0..2000 {
                let s = c.sample(11, split, index).unwrap();
                check_sample(&c, &s);
            }
        }
    }

    #[test]
    fn generated_targets_match_solver_other_configs() {
        for c in [
            cfg(2, 2, 1),
            cfg(2, 2, 51),
            cfg(52, 52, 51),
            cfg(52, 52, 0),
            cfg(5, 9, 3),
            cfg(30, 52, 20),
        ] {
            for index in 0..300 {
                let s = c.sample(5, Split::Train, index).unwrap();
                check_sample(&c, &s);
                if c.max_letters == 52 && c.min_letters == 52 {
                    // Every letter exactly once: a permutation of the alphabet.
                    let mut l: Vec<char> = s.source.chars().collect();
                    l.sort_unstable();
                    let mut all = LETTERS.to_vec();
                    all.sort_unstable();
                    assert_eq!(l, all);
                }
                if c.max_shift == 0 {
                    assert_eq!(s.shift, 0);
                    assert_eq!(s.target, s.query);
                }
            }
        }
    }

    #[test]
    fn examples_encode_their_samples() {
        for c in [
            IndirectConfig::default(),
            cfg(2, 2, 1),
            cfg(52, 52, 51),
            IndirectConfig {
                seq_len: 100,
                ..IndirectConfig::default()
            },
        ] {
            for index in 0..300 {
                let s = c.sample(3, Split::Eval, index).unwrap();
                let ex = c.example(3, Split::Eval, index).unwrap();
                check_example(&c, &s, &ex);
                assert_eq!(ex, c.encode_sample(&s).unwrap());
            }
        }
    }

    #[test]
    fn paper_example_layout() {
        let c = IndirectConfig::default();
        let ex = c.encode_sample(&paper_sample()).unwrap();
        check_example(&c, &paper_sample(), &ex);
        let mut mask = vec![false; 48];
        mask[25] = true;
        assert_eq!(ex.mask, mask);
        assert_eq!(ex.target[25], 40); // 'N'
        assert_eq!(ex.input[25], 53); // ','
        assert_eq!(ex.input[26], 40);
        assert_eq!(ex.input[27..], [PAD; 21]);
        assert_eq!(ex.target[26..], [PAD; 22]);
        assert_eq!(ex.target[..3], [31, 41, 34]); // E O H
    }

    #[test]
    fn longest_example_fits_default_seq_len() {
        // 40 letters and a 3-character shift: 40 + 4 + 3 = 47-character prompt, answer at 47 =
        // the last input position; the last target is PAD.
        let c = IndirectConfig::default();
        assert_eq!(c.min_seq_len(), 48);
        let source: String = LETTERS[..40].iter().collect();
        let s = IndirectSample {
            text: format!("{source},z,-15,"),
            source,
            query: 'z',
            shift: -15,
            target: 'k',
        };
        assert_eq!(s.text.len(), 47);
        let ex = c.encode_sample(&s).unwrap();
        check_example(&c, &s, &ex);
        assert!(ex.mask[46]);
        assert_eq!(decode(ex.target[46]), Some('k'));
        assert_eq!(decode(ex.input[47]), Some('k'));
        assert_eq!(ex.target[47], PAD);
        assert!(!ex.input.contains(&PAD));
        // One token shorter would cut off the answer.
        let short = IndirectConfig { seq_len: 47, ..c };
        assert!(short.validate().is_err());
    }

    #[test]
    fn n_is_uniform_and_reaches_both_bounds() {
        let c = IndirectConfig::default();
        let mut counts = [0usize; 21];
        let total = 4200;
        for index in 0..total {
            let n = c.sample(2024, Split::Train, index).unwrap().source.len();
            counts[n - 20] += 1;
        }
        assert!(counts[0] > 0 && counts[20] > 0, "bounds 20 and 40 reached");
        assert!(counts.iter().all(|&k| k > 0));
        // Expected 200 per value; chi-square with 20 df, 0.999 quantile 45.3.
        let stat = chi2(&counts, &[1.0 / 21.0; 21]);
        assert!(stat < 45.3, "chi2 = {stat}, counts {counts:?}");
        // Small ranges too.
        let c = cfg(2, 3, 1);
        let mut seen = [0usize; 2];
        for index in 0..200 {
            seen[c.sample(1, Split::Eval, index).unwrap().source.len() - 2] += 1;
        }
        assert!(seen[0] > 60 && seen[1] > 60, "{seen:?}");
    }

    #[test]
    fn every_letter_is_used() {
        let c = IndirectConfig::default();
        let mut seen = [0usize; VOCAB_SIZE];
        for index in 0..500 {
            for ch in c.sample(9, Split::Train, index).unwrap().source.chars() {
                seen[encode(ch).unwrap() as usize] += 1;
            }
        }
        // 500 × 30 letters on average ⇒ ≈ 288 per letter.
        for (id, &k) in seen.iter().enumerate().take(53).skip(1) {
            assert!((180..400).contains(&k), "id {id}: {k}");
        }
    }

    /// Exact law of the kept shift, averaged over N uniform on the config's range.
    fn shift_law(c: &IndirectConfig) -> Vec<f64> {
        let k = c.max_shift as i64;
        let mut p = vec![0.0; 2 * c.max_shift + 1];
        let n_values = (c.max_letters - c.min_letters + 1) as f64;
        for n in c.min_letters as i64..=c.max_letters as i64 {
            let kk = k.min(n - 1);
            let v = (n * (2 * kk + 1) - kk * (kk + 1)) as f64;
            let direct: i64 = (-kk..=kk).map(|s| n - s.abs()).sum();
            assert_eq!(direct as f64, v);
            for s in -kk..=kk {
                p[(s + k) as usize] += (n - s.abs()) as f64 / v / n_values;
            }
        }
        p
    }

    #[test]
    fn shift_law_is_triangular_for_small_string() {
        // N = 4, max_shift = 3: valid (i, k) pairs per shift are 1, 2, 3, 4, 3, 2, 1 (of 16).
        let c = cfg(4, 4, 3);
        let want = [1.0, 2.0, 3.0, 4.0, 3.0, 2.0, 1.0].map(|x| x / 16.0);
        let law = shift_law(&c);
        for (a, b) in law.iter().zip(want) {
            assert!((a - b).abs() < 1e-12);
        }
        let total = 16_000u64;
        let mut counts = [0usize; 7];
        for index in 0..total {
            counts[(c.sample(6, Split::Train, index).unwrap().shift + 3) as usize] += 1;
        }
        for (s, (&got, p)) in counts.iter().zip(want).enumerate() {
            let e = p * total as f64;
            let sd = (e * (1.0 - p)).sqrt();
            assert!(
                (got as f64 - e).abs() < 4.0 * sd,
                "shift {}: {got} vs {e}",
                s as i64 - 3
            );
        }
        // Not uniform: shift 0 is about four times as common as ±3.
        assert!(
            counts[3] > 3 * counts[0] && counts[3] > 3 * counts[6],
            "{counts:?}"
        );
    }

    #[test]
    fn shift_knobs_keep_the_restricted_triangle() {
        // N = 4, max_shift = 3, |k| ≥ 1: the triangle 1, 2, 3, (4), 3, 2, 1 without k = 0 (of 12).
        let mut c = cfg(4, 4, 3);
        c.min_abs_shift = 1;
        let want = [1.0, 2.0, 3.0, 0.0, 3.0, 2.0, 1.0].map(|x| x / 12.0);
        let total = 12_000u64;
        let mut counts = [0usize; 7];
        for index in 0..total {
            let s = c.sample(6, Split::Train, index).unwrap();
            assert_eq!(solve(&s.text), Some(s.target));
            counts[(s.shift + 3) as usize] += 1;
        }
        assert_eq!(counts[3], 0, "k = 0 is never kept");
        let stat = chi2(
            &[
                counts[0], counts[1], counts[2], counts[4], counts[5], counts[6],
            ],
            &[want[0], want[1], want[2], want[4], want[5], want[6]],
        );
        assert!(
            stat < 20.5,
            "chi2 = {stat} (df 5, p = 0.001 at 20.5): {counts:?}"
        );
        // Positive only, max_shift = 1: the letter right after the query, every time.
        for (sign, k) in [(ShiftSign::Positive, 1), (ShiftSign::Negative, -1)] {
            let c = IndirectConfig {
                min_letters: 5,
                max_letters: 8,
                max_shift: 1,
                min_abs_shift: 1,
                shift_sign: sign,
                seq_len: 0,
            };
            let c = IndirectConfig {
                seq_len: c.min_seq_len(),
                ..c
            };
            for index in 0..500 {
                let s = c.sample(2, Split::Eval, index).unwrap();
                assert_eq!(s.shift, k);
                let i = s.source.find(s.query).unwrap() as i32;
                assert_eq!(s.source.as_bytes()[(i + k) as usize] as char, s.target);
            }
        }
        // The knobs off draw exactly the stream of the default config.
        let d = IndirectConfig::default();
        let off = IndirectConfig {
            min_abs_shift: 0,
            shift_sign: ShiftSign::Both,
            ..d.clone()
        };
        for index in 0..50 {
            assert_eq!(
                d.sample(9, Split::Train, index).unwrap(),
                off.sample(9, Split::Train, index).unwrap()
            );
        }
    }

    #[test]
    fn shift_knobs_are_validated_and_not_serialised_when_off() {
        let mut c = cfg(5, 8, 2);
        c.min_abs_shift = 3;
        assert_eq!(
            err(&c),
            "min_abs_shift = 3 is out of range: must be in 0..=2 (max_shift, and below min_letters = 5)"
        );
        let mut c = cfg(3, 8, 4);
        c.min_abs_shift = 3;
        assert_eq!(
            err(&c),
            "min_abs_shift = 3 is out of range: must be in 0..=2 (max_shift, and below min_letters = 3)"
        );
        let mut c = cfg(5, 8, 0);
        c.shift_sign = ShiftSign::Positive;
        assert!(err(&c).contains("shift_sign"), "{}", err(&c));
        // Params: the defaults are not written (run ids of older runs stay), the knobs are.
        let p = IndirectParams::default();
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(
            json,
            r#"{"min_letters":20,"max_letters":40,"max_shift":15}"#
        );
        let p = IndirectParams {
            min_abs_shift: 1,
            shift_sign: ShiftSign::Positive,
            ..p
        };
        let json = serde_json::to_string(&p).unwrap();
        assert!(
            json.ends_with(r#""min_abs_shift":1,"shift_sign":"positive"}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<IndirectParams>(&json).unwrap(), p);
    }

    #[test]
    fn shift_distribution_default() {
        let c = IndirectConfig::default();
        let total = 20_000u64;
        let mut counts = [0usize; 31];
        let mut sum = 0i64;
        for index in 0..total {
            let s = c.sample(31337, Split::Train, index).unwrap().shift;
            assert!((-15..=15).contains(&s));
            counts[(s + 15) as usize] += 1;
            sum += s as i64;
        }
        // Covers −15..=15.
        assert!(counts.iter().all(|&k| k > 0), "{counts:?}");
        // Mean ≈ 0: the shift's sd is ≈ 8.06, so the sample mean's sd is ≈ 0.057.
        let mean = sum as f64 / total as f64;
        assert!(mean.abs() < 0.25, "mean shift {mean}");
        // Symmetric: counts of ±s agree within 4 sd of their difference.
        for s in 1..=15 {
            let (a, b) = (counts[15 + s] as f64, counts[15 - s] as f64);
            assert!((a - b).abs() < 4.0 * (a + b).sqrt(), "±{s}: {a} vs {b}");
        }
        // Matches the exact law; chi-square with 30 df, 0.999 quantile 59.7.
        let law = shift_law(&c);
        let sum_p: f64 = law.iter().sum();
        assert!((sum_p - 1.0).abs() < 1e-12);
        // The law itself: P(0) = mean over N of N / V(N) ≈ 0.04444 and P(±15) =
        // mean of (N − 15) / V(N) ≈ 0.02084, versus 1/31 ≈ 0.03226 if the kept shift were
        // uniform.
        assert!((law[15] - 0.044440).abs() < 1e-6, "{}", law[15]);
        assert!((law[0] - 0.020838).abs() < 1e-6, "{}", law[0]);
        assert_eq!(law[0], law[30]);
        let stat = chi2(&counts, &law);
        assert!(stat < 59.7, "chi2 = {stat}, counts {counts:?}");
        // And a uniform law is clearly rejected (so the test can tell the two apart).
        assert!(chi2(&counts, &[1.0 / 31.0; 31]) > 200.0);
    }

    #[test]
    fn query_position_law() {
        // N = 20, max_shift = 15: position i admits min(i,15) + min(19−i,15) + 1 shifts
        // (16, 17, 18, 19 at the ends, 20 inside), out of V = 380.
        let c = cfg(20, 20, 15);
        let law: Vec<f64> = (0..20usize)
            .map(|i| (i.min(15) + (19 - i).min(15) + 1) as f64 / 380.0)
            .collect();
        assert!((law.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let mut q_counts = [0usize; 20];
        let mut t_counts = [0usize; 20];
        for index in 0..20_000 {
            let s = c.sample(8, Split::Eval, index).unwrap();
            let i = s.source.find(s.query).unwrap();
            q_counts[i] += 1;
            t_counts[s.source.find(s.target).unwrap()] += 1;
        }
        // 19 df, 0.999 quantile 43.8.
        let stat = chi2(&q_counts, &law);
        assert!(stat < 43.8, "query chi2 = {stat}, {q_counts:?}");
        let stat = chi2(&t_counts, &law);
        assert!(stat < 43.8, "target chi2 = {stat}, {t_counts:?}");
    }

    // ---- determinism and streams ----

    #[test]
    fn deterministic_and_index_dependent() {
        let c = IndirectConfig::default();
        let a = c.sample(42, Split::Train, 9).unwrap();
        assert_eq!(a, c.sample(42, Split::Train, 9).unwrap());
        assert_eq!(
            c.example(42, Split::Train, 9).unwrap(),
            c.example(42, Split::Train, 9).unwrap()
        );
        assert_ne!(a.text, c.sample(42, Split::Train, 10).unwrap().text);
        assert_ne!(a.text, c.sample(43, Split::Train, 9).unwrap().text);
    }

    #[test]
    fn batch_equals_individual_examples() {
        let c = IndirectConfig::default();
        let batch = c.batch(8, Split::Eval, 100, 5).unwrap();
        assert_eq!(batch.len(), 5);
        for (i, ex) in batch.iter().enumerate() {
            assert_eq!(*ex, c.example(8, Split::Eval, 100 + i as u64).unwrap());
        }
        assert!(c.batch(8, Split::Eval, 100, 0).unwrap().is_empty());
    }

    #[test]
    fn train_and_eval_differ() {
        let c = IndirectConfig::default();
        let train: Vec<String> = (0..50)
            .map(|i| c.sample(42, Split::Train, i).unwrap().text)
            .collect();
        let eval: Vec<String> = (0..50)
            .map(|i| c.sample(42, Split::Eval, i).unwrap().text)
            .collect();
        for tr in &train {
            assert!(!eval.contains(tr));
        }
    }

    #[test]
    fn pinned_values() {
        // Regression pin: catches a change of the random streams (e.g. a rand upgrade).
        let c = IndirectConfig::default();
        let s = c.sample(0, Split::Train, 0).unwrap();
        assert_eq!(s.text, PINNED_TRAIN_TEXT);
        assert_eq!(s.target, PINNED_TRAIN_TARGET);
        let s = c.sample(0, Split::Eval, 0).unwrap();
        assert_eq!(s.text, PINNED_EVAL_TEXT);
        assert_eq!(s.target, PINNED_EVAL_TARGET);
    }

    const PINNED_TRAIN_TEXT: &str = "rgVRILjvMOPyAFSftpKWm,K,-6,";
    const PINNED_TRAIN_TARGET: char = 'A';
    const PINNED_EVAL_TEXT: &str = "cReopmAyMftqzlGQJnHrXDNFS,o,2,";
    const PINNED_EVAL_TARGET: char = 'm';

    // ---- validation ----

    fn err(c: &IndirectConfig) -> String {
        let e = c.validate().unwrap_err();
        // The same error is reported by every entry point.
        assert_eq!(c.example(0, Split::Train, 0).unwrap_err(), e);
        assert_eq!(c.batch(0, Split::Train, 0, 2).unwrap_err(), e);
        assert_eq!(c.sample(0, Split::Train, 0).unwrap_err(), e);
        assert_eq!(c.encode_sample(&paper_sample()).unwrap_err(), e);
        let s = e.to_string();
        assert!(!s.contains('\n'));
        s
    }

    #[test]
    fn default_is_valid_and_paper_constants() {
        let c = IndirectConfig::default();
        assert_eq!(
            c,
            IndirectConfig {
                min_letters: 20,
                max_letters: 40,
                max_shift: 15,
                min_abs_shift: 0,
                shift_sign: ShiftSign::Both,
                seq_len: 48
            }
        );
        assert!(c.validate().is_ok());
        assert_eq!(c.n_scored(), 1);
        assert_eq!(
            (PAPER_TRAIN, PAPER_VAL, PAPER_TEST),
            (1_000_000, 10_000, 10_000)
        );
    }

    #[test]
    fn letters_out_of_range() {
        assert_eq!(
            err(&cfg(1, 40, 15)),
            "min_letters = 1 is out of range: must be in 2..=52"
        );
        assert_eq!(
            err(&cfg(0, 40, 15)),
            "min_letters = 0 is out of range: must be in 2..=52"
        );
        assert_eq!(
            err(&cfg(53, 53, 15)),
            "min_letters = 53 is out of range: must be in 2..=52"
        );
        assert_eq!(
            err(&cfg(20, 19, 15)),
            "max_letters = 19 is out of range: must be in 20..=52 (min_letters)"
        );
        assert_eq!(
            err(&cfg(20, 53, 15)),
            "max_letters = 53 is out of range: must be in 20..=52 (min_letters)"
        );
        assert!(cfg(2, 2, 0).validate().is_ok());
        assert!(cfg(52, 52, 51).validate().is_ok());
    }

    #[test]
    fn shift_and_seq_len_out_of_range() {
        assert_eq!(
            err(&cfg(20, 40, 52)),
            "max_shift = 52 is out of range: must be in 0..=51"
        );
        let c = IndirectConfig {
            seq_len: 47,
            ..IndirectConfig::default()
        };
        assert_eq!(
            err(&c),
            "seq_len = 47 is out of range: must be in 48.. (max_letters, max_shift)"
        );
        let c = IndirectConfig {
            seq_len: 0,
            ..IndirectConfig::default()
        };
        assert_eq!(
            err(&c),
            "seq_len = 0 is out of range: must be in 48.. (max_letters, max_shift)"
        );
        // min_seq_len by shift width: "0" (1), "-9" (2), "-10" (3), "-51" (3).
        for (max_shift, want) in [(0, 46), (9, 47), (10, 48), (51, 48)] {
            assert_eq!(cfg(20, 40, max_shift).min_seq_len(), want, "{max_shift}");
        }
        assert_eq!(cfg(52, 52, 51).min_seq_len(), 60);
        assert_eq!(cfg(2, 2, 1).min_seq_len(), 9); // "ab,b,-1,a"
        let c = IndirectConfig {
            max_shift: 0,
            seq_len: 45,
            ..IndirectConfig::default()
        };
        assert_eq!(
            err(&c),
            "seq_len = 45 is out of range: must be in 46.. (max_letters, max_shift)"
        );
    }

    #[test]
    fn encode_sample_errors() {
        let c = IndirectConfig::default();
        let mut s = paper_sample();
        s.target = 'M';
        assert_eq!(
            c.encode_sample(&s).unwrap_err().to_string(),
            "sample is invalid: target 'M' is not the answer 'N' to \"QEOHoUbKfeSrMVNlCzXu,z,-3,\""
        );
        let mut s = paper_sample();
        s.text = "QEOHoUbKfeSrMVNlCzXu,z,+3,".into();
        assert_eq!(
            c.encode_sample(&s).unwrap_err().to_string(),
            "sample is invalid: text \"QEOHoUbKfeSrMVNlCzXu,z,+3,\" is not a well-formed prompt"
        );
        // Paper example: 27 tokens > 26.
        let tight = IndirectConfig {
            min_letters: 2,
            max_letters: 19,
            max_shift: 1,
            seq_len: 26,
            ..IndirectConfig::default()
        };
        assert!(tight.validate().is_ok());
        assert_eq!(
            tight
                .encode_sample(&paper_sample())
                .unwrap_err()
                .to_string(),
            "sample is invalid: prompt + answer is 27 tokens, longer than seq_len = 26"
        );
        let fits = IndirectConfig {
            seq_len: 27,
            ..tight
        };
        let ex = fits.encode_sample(&paper_sample()).unwrap();
        check_example(&fits, &paper_sample(), &ex);
        assert_eq!(decode(ex.input[26]), Some('N'));
        assert_eq!(ex.target[26], PAD);
    }

    #[test]
    fn index_limits() {
        let c = IndirectConfig::default();
        assert!(c.example(0, Split::Train, MAX_INDEX).is_ok());
        let e = c.example(0, Split::Train, MAX_INDEX + 1).unwrap_err();
        assert!(
            matches!(e, TaskError::OutOfRange { field: "index", .. }),
            "{e}"
        );
        let e = c.sample(0, Split::Train, MAX_INDEX + 1).unwrap_err();
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
}
