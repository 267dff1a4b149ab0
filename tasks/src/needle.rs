//! Needle retrieval (SCIENCE.md section 2, "TAPA/RULER style"): a single key–value
//! needle-in-a-haystack test in the manner of RULER (Hsieh et al., *RULER: What's the Real
//! Context Size of Your Long-Context Language Models?*, arXiv 2404.06654).
//!
//! A key–value *needle* `key:value;` is hidden at a chosen relative depth in a haystack that
//! fills the context; at the end a query `?key:` asks for the value, which is the target:
//!
//! ```text
//! QWERTYUIOPqx:4821;ASDFGHJKL?qx:4821        (noise haystack, seq_len = 35)
//! prefix    needle  suffix   qry value
//! ```
//!
//! The knobs are the context length `seq_len`, the needle's relative `depth` (0 = start of the
//! context, 1 = right before the query; random when unset), the value length and the haystack
//! kind: i.i.d. filler letters ([`Haystack::Noise`]) or distractor key–value records with other
//! keys ([`Haystack::Pairs`]).
//!
//! ```
//! use tasks::Split;
//! use tasks::needle::{self, Haystack, NeedleConfig};
//!
//! let cfg = NeedleConfig { seq_len: 64, depth: Some(0.5), key_len: 2, value_len: 4, haystack: Haystack::Pairs };
//! let s = cfg.sample(7, Split::Train, 0)?;
//! assert_eq!(s.needle_start, cfg.needle_start_at(0.5)); // round(0.5 · 48) = 24
//! assert_eq!(s.needle_start, 24);
//! assert_eq!(&s.text[24..26], s.key);
//! let ex = cfg.example(7, Split::Train, 0)?;
//! assert_eq!(ex.n_scored(), 4);
//! let value: String = cfg.scored_positions().map(|t| needle::decode(ex.target[t]).unwrap()).collect();
//! assert_eq!(value, s.value);
//! # Ok::<(), tasks::TaskError>(())
//! ```
//!
//! # Layout
//!
//! Write `k = key_len`, `m = value_len`, `n = seq_len`. The text has exactly `n` characters:
//!
//! ```text
//! text   = prefix ++ needle ++ suffix ++ query ++ value
//! needle = key ":" value ";"         R = k + m + 2 characters
//! query  = "?" key ":"               k + 2 characters
//! ```
//!
//! The haystack region (prefix, needle, suffix) has `C = n − (k + 2) − m` characters, of which
//! `F = C − R` are filler ([`NeedleConfig::filler_len`]). The needle starts at position
//! ([`NeedleConfig::needle_start_at`])
//!
//! ```text
//! needle_start = round(depth · F)        (round half away from zero)
//! ```
//!
//! so depth 0 puts it first and depth 1 puts it right before the query; with `depth` unset it is
//! uniform on `0..=F`. The query starts at `C` ([`NeedleConfig::query_start`]), the value at
//! `n − m`. `seq_len` must be at least [`NeedleConfig::min_seq_len`] `= 2k + 2m + 4` (no filler).
//!
//! # Haystacks
//!
//! Keys are strings of `k` lowercase letters `a–z`; values are strings of `m` digits `0–9`.
//! - [`Haystack::Noise`]: every filler character is an uppercase letter `A–Z`, i.i.d. uniform.
//! - [`Haystack::Pairs`]: the filler is made of distractor records `key:value;` (same format and
//!   length `R` as the needle) with uniform keys **different from the needle's key** and uniform
//!   values. A prefix of length `p` is `p mod R` noise letters followed by `⌊p / R⌋` records; a
//!   suffix of length `s` is `⌊s / R⌋` records followed by `s mod R` noise letters, so records
//!   sit right against the needle on both sides and the needle's position is exact.
//!
//! Either way the needle's key occurs exactly once before the query: in `Noise` no filler is
//! lowercase; in `Pairs` every run of lowercase letters is one whole key (delimited by `:`,
//! `;` and uppercase letters), and only the needle's equals the needle key.
//!
//! # Example
//!
//! Next-token as everywhere in this crate: `x = encode(text) ++ [PAD]`, `input = x[0..n]`,
//! `target = x[1..n + 1]`, and the mask scores exactly the `m` value tokens after the query:
//! `mask[t] = (n − m − 1 ≤ t < n − 1)` ([`NeedleConfig::scored_positions`]); `target[n − 1]`
//! is `PAD`. Accuracy on an example is usually taken as all `m` value tokens right.
//!
//! # Sampling
//!
//! Per example, from its own stream [`crate::example_rng`], in this order: the key (`k` uniform
//! letters), the value (`m` uniform digits), the needle start if `depth` is unset (uniform on
//! `0..=F`), then the filler characters from left to right (a distractor record draws its key,
//! redrawn while equal to the needle's, then its value). Train and eval differ only by their
//! random streams.
//!
//! # Vocabulary
//!
//! Character-level and fixed ([`VOCAB_SIZE`] = 66 ids): `0` is [`PAD`]; `1..=26` are `a–z`,
//! `27..=52` `A–Z`, `53..=62` `0–9`, `63` `:`, `64` `;`, `65` `?` ([`CHARS`]`[id − 1]`).

use std::ops::Range;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::{Example, Split, TaskError, example_rng};

/// Token id of padding (the target after the last value token).
pub const PAD: u32 = 0;

/// Number of token ids: `PAD` plus the 65 characters of [`CHARS`].
pub const VOCAB_SIZE: usize = 66;

/// Largest accepted [`NeedleConfig::key_len`].
pub const MAX_KEY_LEN: usize = 8;

/// Largest accepted [`NeedleConfig::value_len`].
pub const MAX_VALUE_LEN: usize = 16;

/// The characters of token ids `1..=65` in id order (`CHARS[id − 1]`): `a–z`, `A–Z`, `0–9`,
/// `:`, `;`, `?`.
pub const CHARS: [char; 65] = {
    let mut out = ['\0'; 65];
    let mut i = 0;
    while i < 26 {
        out[i] = (b'a' + i as u8) as char;
        out[26 + i] = (b'A' + i as u8) as char;
        i += 1;
    }
    let mut d = 0;
    while d < 10 {
        out[52 + d] = (b'0' + d as u8) as char;
        d += 1;
    }
    out[62] = ':';
    out[63] = ';';
    out[64] = '?';
    out
};

/// Number of token ids, [`VOCAB_SIZE`] (66).
pub fn vocab_size() -> usize {
    VOCAB_SIZE
}

/// Token id of character `c`, or `None` if it is not in the vocabulary.
pub fn encode(c: char) -> Option<u32> {
    match c {
        'a'..='z' => Some(1 + (c as u32 - 'a' as u32)),
        'A'..='Z' => Some(27 + (c as u32 - 'A' as u32)),
        '0'..='9' => Some(53 + (c as u32 - '0' as u32)),
        ':' => Some(63),
        ';' => Some(64),
        '?' => Some(65),
        _ => None,
    }
}

/// Character of token id `id`, or `None` for [`PAD`] and ids `≥ 66`.
pub fn decode(id: u32) -> Option<char> {
    crate::decode_char(&CHARS, id)
}

/// The string of `ids` with [`PAD`] dropped, or `None` if some id is `≥ 66`.
pub fn decode_ids(ids: &[u32]) -> Option<String> {
    crate::decode_chars(&CHARS, ids)
}

/// What fills the context around the needle. Serialised as `"noise"` / `"pairs"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Haystack {
    /// I.i.d. uniform uppercase letters `A–Z`.
    Noise,
    /// Distractor records `key:value;` with keys other than the needle's (topped up with noise
    /// letters where the length is not a multiple of the record length).
    Pairs,
}

/// Configuration of the needle task (see the [module docs](self)).
///
/// `Default`: `seq_len = 256`, random depth, 3-letter keys, 4-digit values, noise haystack.
/// Deserialising does not validate; every entry point calls [`NeedleConfig::validate`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NeedleConfig {
    /// Context length (tokens): the text length and the length of `input`, `target`, `mask`;
    /// at least [`NeedleConfig::min_seq_len`].
    pub seq_len: usize,
    /// Relative depth of the needle in the haystack, finite, in `[0, 1]`; `None` (JSON `null`):
    /// uniform over all positions.
    pub depth: Option<f64>,
    /// Letters per key, in `1..=8`.
    pub key_len: usize,
    /// Digits per value (the scored tokens), in `1..=16`.
    pub value_len: usize,
    /// Filler kind.
    pub haystack: Haystack,
}

impl Default for NeedleConfig {
    fn default() -> Self {
        NeedleConfig {
            seq_len: 256,
            depth: None,
            key_len: 3,
            value_len: 4,
            haystack: Haystack::Noise,
        }
    }
}

/// One drawn instance in readable form.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NeedleSample {
    /// The needle's key (`key_len` lowercase letters).
    pub key: String,
    /// The needle's value (`value_len` digits): the answer.
    pub value: String,
    /// Position of the needle's first character (its key) in `text`.
    pub needle_start: usize,
    /// The whole text (`seq_len` characters), query and value included.
    pub text: String,
}

/// The needle task's own parameters in a training run (the run's `seq_len` completes them into
/// a [`NeedleConfig`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NeedleParams {
    /// Relative depth of the needle in `[0, 1]`; negative = uniform random per example.
    pub needle_depth: f64,
    /// Key length, characters.
    pub key_len: usize,
    /// Value length, digits (the scored tokens).
    pub value_len: usize,
    /// `noise` (random letters) or `pairs` (distractor key:value records).
    pub haystack: Haystack,
}

impl Default for NeedleParams {
    fn default() -> Self {
        let c = NeedleConfig::default();
        NeedleParams {
            needle_depth: c.depth.unwrap_or(-1.0),
            key_len: c.key_len,
            value_len: c.value_len,
            haystack: c.haystack,
        }
    }
}

impl NeedleParams {
    /// Parameter names, in serialisation order (checked by a test).
    pub const NAMES: &'static [&'static str] =
        &["needle_depth", "key_len", "value_len", "haystack"];

    /// The generator config for a run with context `seq_len`.
    pub fn config(&self, seq_len: usize) -> NeedleConfig {
        NeedleConfig {
            seq_len,
            depth: (self.needle_depth >= 0.0).then_some(self.needle_depth),
            key_len: self.key_len,
            value_len: self.value_len,
            haystack: self.haystack,
        }
    }
}

impl NeedleConfig {
    /// Check every field.
    ///
    /// # Errors
    /// [`TaskError::OutOfRange`] naming the first bad field, in the order `key_len` (`1..=8`),
    /// `value_len` (`1..=16`), `seq_len` (`min_seq_len()..`), `depth` (`0.0..=1.0`), e.g.
    /// `seq_len = 10 is out of range: must be in 18.. (key_len, value_len)` (default keys and
    /// values).
    pub fn validate(&self) -> Result<(), TaskError> {
        if !(1..=MAX_KEY_LEN).contains(&self.key_len) {
            return Err(TaskError::out_of_range(
                "key_len",
                self.key_len,
                format!("1..={MAX_KEY_LEN}"),
            ));
        }
        if !(1..=MAX_VALUE_LEN).contains(&self.value_len) {
            return Err(TaskError::out_of_range(
                "value_len",
                self.value_len,
                format!("1..={MAX_VALUE_LEN}"),
            ));
        }
        let min = self.min_seq_len();
        if self.seq_len < min {
            return Err(TaskError::out_of_range(
                "seq_len",
                self.seq_len,
                format!("{min}.. (key_len, value_len)"),
            ));
        }
        if let Some(d) = self.depth
            && !(d.is_finite() && (0.0..=1.0).contains(&d))
        {
            return Err(TaskError::out_of_range("depth", d, "0.0..=1.0"));
        }
        Ok(())
    }

    /// Length of the needle (and of a distractor record), `key_len + value_len + 2`.
    pub fn record_len(&self) -> usize {
        self.key_len + self.value_len + 2
    }

    /// Smallest valid `seq_len`, `2·key_len + 2·value_len + 4`: needle, query and value with no
    /// filler.
    pub fn min_seq_len(&self) -> usize {
        self.record_len() + self.key_len + 2 + self.value_len
    }

    /// Number of filler characters `F = seq_len − min_seq_len()` (valid config).
    pub fn filler_len(&self) -> usize {
        self.seq_len - self.min_seq_len()
    }

    /// Position of the query's `?`: `C = seq_len − key_len − 2 − value_len` (valid config).
    pub fn query_start(&self) -> usize {
        self.seq_len - self.key_len - 2 - self.value_len
    }

    /// Where the needle starts for relative `depth` in `[0, 1]`: `round(depth · F)`, half away
    /// from zero (valid config; `depth` is clamped to `[0, 1]`).
    pub fn needle_start_at(&self, depth: f64) -> usize {
        let f = self.filler_len();
        ((depth.clamp(0.0, 1.0) * f as f64).round() as usize).min(f)
    }

    /// The scored positions `t` (targets are the value tokens): `seq_len − value_len − 1 ..
    /// seq_len − 1` (valid config).
    pub fn scored_positions(&self) -> Range<usize> {
        self.seq_len - self.value_len - 1..self.seq_len - 1
    }

    /// Scored positions per example: `value_len`.
    pub fn n_scored(&self) -> usize {
        self.value_len
    }

    /// Draw sample number `index` of `split` for `seed` (a pure function of the arguments; the
    /// instance [`NeedleConfig::example`] encodes).
    ///
    /// # Errors
    /// Any [`NeedleConfig::validate`] error; [`TaskError::OutOfRange`] on `index` if
    /// `index > MAX_INDEX`.
    pub fn sample(&self, seed: u64, split: Split, index: u64) -> Result<NeedleSample, TaskError> {
        self.validate()?;
        let mut rng = example_rng(seed, split, index)?;
        Ok(self.draw(&mut rng))
    }

    /// Example number `index` of `split` for `seed` (layout in the [module docs](self)).
    ///
    /// # Errors
    /// As [`NeedleConfig::sample`].
    pub fn example(&self, seed: u64, split: Split, index: u64) -> Result<Example, TaskError> {
        let s = self.sample(seed, split, index)?;
        Ok(self.assemble(&s.text))
    }

    /// A batch: examples `index0 .. index0 + batch` of `split` for `seed`, in order.
    ///
    /// # Errors
    /// As [`NeedleConfig::sample`]; [`TaskError::Invalid`] on `batch` if the last index
    /// `index0 + batch − 1` exceeds `MAX_INDEX`.
    pub fn batch(
        &self,
        seed: u64,
        split: Split,
        index0: u64,
        batch: usize,
    ) -> Result<Vec<Example>, TaskError> {
        self.validate()?;
        crate::check_batch(index0, batch)?;
        (0..batch as u64)
            .map(|i| self.example(seed, split, index0 + i))
            .collect()
    }

    fn assemble(&self, text: &str) -> Example {
        let n = self.seq_len;
        let mut x: Vec<u32> = text
            .chars()
            .map(|c| encode(c).expect("text is in the vocabulary"))
            .collect();
        debug_assert_eq!(x.len(), n);
        x.push(PAD);
        let scored = self.scored_positions();
        Example {
            input: x[..n].to_vec(),
            target: x[1..].to_vec(),
            mask: (0..n).map(|t| scored.contains(&t)).collect(),
        }
    }

    /// The sampling procedure of the module docs. Config must be valid.
    fn draw(&self, rng: &mut ChaCha8Rng) -> NeedleSample {
        let letters = |rng: &mut ChaCha8Rng, base: u8, len: usize| -> String {
            (0..len)
                .map(|_| (base + rng.random_range(0..26u8)) as char)
                .collect()
        };
        let digits = |rng: &mut ChaCha8Rng, len: usize| -> String {
            (0..len)
                .map(|_| (b'0' + rng.random_range(0..10u8)) as char)
                .collect()
        };
        let key = letters(rng, b'a', self.key_len);
        let value = digits(rng, self.value_len);
        let f = self.filler_len();
        let start = match self.depth {
            Some(d) => self.needle_start_at(d),
            None => rng.random_range(0..=f),
        };
        let r = self.record_len();
        let mut text = String::with_capacity(self.seq_len);
        let records = |rng: &mut ChaCha8Rng, text: &mut String, count: usize| {
            for _ in 0..count {
                let k = loop {
                    let k = letters(rng, b'a', self.key_len);
                    if k != key {
                        break k;
                    }
                };
                text.push_str(&k);
                text.push(':');
                text.push_str(&digits(rng, self.value_len));
                text.push(';');
            }
        };
        let (pre, suf) = (start, f - start);
        match self.haystack {
            Haystack::Noise => text.push_str(&letters(rng, b'A', pre)),
            Haystack::Pairs => {
                text.push_str(&letters(rng, b'A', pre % r));
                records(rng, &mut text, pre / r);
            }
        }
        text.push_str(&format!("{key}:{value};"));
        match self.haystack {
            Haystack::Noise => text.push_str(&letters(rng, b'A', suf)),
            Haystack::Pairs => {
                records(rng, &mut text, suf / r);
                text.push_str(&letters(rng, b'A', suf % r));
            }
        }
        text.push_str(&format!("?{key}:{value}"));
        debug_assert_eq!(text.len(), self.seq_len);
        NeedleSample {
            key,
            value,
            needle_start: start,
            text,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_INDEX;

    fn cfg(seq_len: usize, depth: Option<f64>, haystack: Haystack) -> NeedleConfig {
        NeedleConfig {
            seq_len,
            depth,
            key_len: 2,
            value_len: 2,
            haystack,
        }
    }

    /// Occurrences of `key` as a substring of `s`.
    fn occurrences(s: &str, key: &str) -> Vec<usize> {
        (0..=s.len().saturating_sub(key.len()))
            .filter(|&i| s[i..].starts_with(key))
            .collect()
    }

    fn check_sample(c: &NeedleConfig, s: &NeedleSample, ex: &Example) {
        let n = c.seq_len;
        let (k, m) = (c.key_len, c.value_len);
        assert_eq!(s.text.len(), n);
        assert_eq!(s.key.len(), k);
        assert!(s.key.chars().all(|ch| ch.is_ascii_lowercase()));
        assert_eq!(s.value.len(), m);
        assert!(s.value.chars().all(|ch| ch.is_ascii_digit()));
        let st = s.needle_start;
        assert!(st <= c.filler_len());
        assert_eq!(
            &s.text[st..st + k + m + 2],
            format!("{}:{};", s.key, s.value)
        );
        let qs = c.query_start();
        assert_eq!(&s.text[qs..], format!("?{}:{}", s.key, s.value));
        // Exactly one occurrence of the key before the query: the needle's.
        assert_eq!(occurrences(&s.text[..qs], &s.key), vec![st], "{}", s.text);
        // Example: shapes, text, mask on the value tokens only.
        assert_eq!(ex.input.len(), n);
        assert_eq!(ex.target.len(), n);
        assert_eq!(ex.mask.len(), n);
        assert_eq!(decode_ids(&ex.input).unwrap(), s.text);
        assert_eq!(ex.target[n - 1], PAD);
        assert_eq!(ex.target[..n - 1], ex.input[1..]);
        let scored: Vec<usize> = (0..n).filter(|&t| ex.mask[t]).collect();
        assert_eq!(scored, c.scored_positions().collect::<Vec<_>>());
        assert_eq!(scored.len(), m);
        let v: String = scored
            .iter()
            .map(|&t| decode(ex.target[t]).unwrap())
            .collect();
        assert_eq!(v, s.value);
        assert_eq!(decode(ex.input[scored[0]]), Some(':'));
    }

    #[test]
    fn vocabulary_round_trips() {
        assert_eq!(vocab_size(), 66);
        for id in 1..VOCAB_SIZE as u32 {
            assert_eq!(encode(decode(id).unwrap()), Some(id));
        }
        assert_eq!(encode('a'), Some(1));
        assert_eq!(encode('A'), Some(27));
        assert_eq!(encode('0'), Some(53));
        assert_eq!(encode('?'), Some(65));
        assert_eq!(encode('#'), None);
        assert_eq!(decode(0), None);
        assert_eq!(decode(66), None);
    }

    #[test]
    fn hand_computed_positions_noise() {
        // k = m = 2, n = 20: R = 6, query "?kk:" at C = 20 − 4 − 2 = 14, F = 14 − 6 = 8.
        let c = cfg(20, Some(0.0), Haystack::Noise);
        assert_eq!(c.record_len(), 6);
        assert_eq!(c.min_seq_len(), 12);
        assert_eq!(c.filler_len(), 8);
        assert_eq!(c.query_start(), 14);
        assert_eq!(c.scored_positions(), 17..19);
        // round(depth · 8), half away from zero.
        for (depth, want) in [
            (0.0, 0),
            (1.0, 8),
            (0.5, 4),
            (0.3, 2),    // 2.4
            (0.0625, 1), // 0.5 → 1
            (0.1875, 2), // 1.5 → 2
            (0.95, 8),   // 7.6
        ] {
            assert_eq!(c.needle_start_at(depth), want, "depth {depth}");
            let c = NeedleConfig {
                depth: Some(depth),
                ..c.clone()
            };
            for index in 0..5 {
                let s = c.sample(1, Split::Train, index).unwrap();
                assert_eq!(s.needle_start, want);
                check_sample(&c, &s, &c.example(1, Split::Train, index).unwrap());
                // Filler is uppercase noise everywhere outside needle, query and value.
                for (i, ch) in s.text[..14].char_indices() {
                    if !(want..want + 6).contains(&i) {
                        assert!(ch.is_ascii_uppercase(), "{}", s.text);
                    }
                }
            }
        }
        // Depth 1: the needle ends right before the query.
        let c = cfg(20, Some(1.0), Haystack::Noise);
        let s = c.sample(3, Split::Eval, 0).unwrap();
        assert_eq!(&s.text[8..14], format!("{}:{};", s.key, s.value));
        assert_eq!(&s.text[14..], format!("?{}:{}", s.key, s.value));
    }

    #[test]
    fn hand_computed_positions_pairs() {
        // n = 30, k = m = 2: R = 6, C = 24, F = 18; depth 0.5 → start 9:
        // prefix = 3 noise + 1 record, needle 9..15, suffix = 1 record + 3 noise, query 24.
        let c = cfg(30, Some(0.5), Haystack::Pairs);
        assert_eq!(c.filler_len(), 18);
        assert_eq!(c.needle_start_at(0.5), 9);
        for index in 0..20 {
            let s = c.sample(4, Split::Train, index).unwrap();
            check_sample(&c, &s, &c.example(4, Split::Train, index).unwrap());
            let t = s.text.as_bytes();
            let is_record = |r: &[u8]| {
                r[..2].iter().all(u8::is_ascii_lowercase)
                    && r[2] == b':'
                    && r[3..5].iter().all(u8::is_ascii_digit)
                    && r[5] == b';'
            };
            assert!(t[..3].iter().all(u8::is_ascii_uppercase), "{}", s.text);
            assert!(is_record(&t[3..9]) && is_record(&t[9..15]) && is_record(&t[15..21]));
            assert_ne!(&t[3..5], s.key.as_bytes());
            assert_ne!(&t[15..17], s.key.as_bytes());
            assert!(t[21..24].iter().all(u8::is_ascii_uppercase), "{}", s.text);
            assert_eq!(s.needle_start, 9);
        }
        // No noise when the lengths are multiples of R: n = 36 → F = 24 = 4 records.
        let c = cfg(36, Some(0.25), Haystack::Pairs);
        let s = c.sample(0, Split::Train, 0).unwrap();
        assert_eq!(s.needle_start, 6);
        assert!(
            !s.text.chars().any(|ch| ch.is_ascii_uppercase()),
            "{}",
            s.text
        );
        assert_eq!(s.text.matches(';').count(), 5);
    }

    #[test]
    fn key_occurs_once_for_many_samples() {
        for haystack in [Haystack::Noise, Haystack::Pairs] {
            for (key_len, value_len, seq_len) in [(1, 1, 40), (2, 4, 128), (3, 4, 256), (8, 16, 97)]
            {
                let c = NeedleConfig {
                    seq_len,
                    depth: None,
                    key_len,
                    value_len,
                    haystack,
                };
                for index in 0..40 {
                    for split in [Split::Train, Split::Eval] {
                        let s = c.sample(9, split, index).unwrap();
                        check_sample(&c, &s, &c.example(9, split, index).unwrap());
                    }
                }
            }
        }
    }

    #[test]
    fn random_depth_covers_all_starts() {
        let c = cfg(20, None, Haystack::Pairs); // F = 8: starts 0..=8
        let mut seen = [0usize; 9];
        for index in 0..900 {
            seen[c.sample(5, Split::Train, index).unwrap().needle_start] += 1;
        }
        // ≈ 100 each.
        assert!(seen.iter().all(|&k| (60..140).contains(&k)), "{seen:?}");
    }

    #[test]
    fn deterministic_and_pinned() {
        let c = NeedleConfig {
            seq_len: 40,
            depth: Some(0.5),
            ..NeedleConfig::default()
        };
        let a = c.sample(0, Split::Train, 0).unwrap();
        assert_eq!(a, c.sample(0, Split::Train, 0).unwrap());
        assert_ne!(a, c.sample(0, Split::Train, 1).unwrap());
        assert_ne!(a, c.sample(0, Split::Eval, 0).unwrap());
        assert_eq!(a.text, PINNED_NOISE);
        let c = NeedleConfig {
            haystack: Haystack::Pairs,
            ..c
        };
        assert_eq!(c.sample(0, Split::Train, 0).unwrap().text, PINNED_PAIRS);
    }

    const PINNED_NOISE: &str = "BIRSTIJMVQCcic:9866;POXEWIRXWVB?cic:9866";
    const PINNED_PAIRS: &str = "BIrst:3348;cic:9866;qcp:5818;IR?cic:9866";

    #[test]
    fn batch_and_index_limits() {
        let c = NeedleConfig::default();
        let batch = c.batch(2, Split::Eval, 10, 3).unwrap();
        for (i, ex) in batch.iter().enumerate() {
            assert_eq!(*ex, c.example(2, Split::Eval, 10 + i as u64).unwrap());
        }
        let e = c.example(0, Split::Train, MAX_INDEX + 1).unwrap_err();
        assert!(matches!(e, TaskError::OutOfRange { field: "index", .. }));
        let e = c.batch(0, Split::Train, MAX_INDEX, 2).unwrap_err();
        assert!(matches!(e, TaskError::Invalid { field: "batch", .. }));
    }

    fn err(c: &NeedleConfig) -> String {
        let e = c.validate().unwrap_err();
        assert_eq!(c.sample(0, Split::Train, 0).unwrap_err(), e);
        assert_eq!(c.example(0, Split::Train, 0).unwrap_err(), e);
        assert_eq!(c.batch(0, Split::Train, 0, 1).unwrap_err(), e);
        let s = e.to_string();
        assert!(!s.contains('\n'));
        s
    }

    #[test]
    fn validation_errors_name_the_field() {
        let d = NeedleConfig::default();
        assert!(d.validate().is_ok());
        assert_eq!(d.min_seq_len(), 18);
        let with = |f: &dyn Fn(&mut NeedleConfig)| {
            let mut c = NeedleConfig::default();
            f(&mut c);
            err(&c)
        };
        assert_eq!(
            with(&|c| c.key_len = 0),
            "key_len = 0 is out of range: must be in 1..=8"
        );
        assert_eq!(
            with(&|c| c.key_len = 9),
            "key_len = 9 is out of range: must be in 1..=8"
        );
        assert_eq!(
            with(&|c| c.value_len = 17),
            "value_len = 17 is out of range: must be in 1..=16"
        );
        assert_eq!(
            with(&|c| c.seq_len = 17),
            "seq_len = 17 is out of range: must be in 18.. (key_len, value_len)"
        );
        assert_eq!(
            with(&|c| c.depth = Some(1.5)),
            "depth = 1.5 is out of range: must be in 0.0..=1.0"
        );
        assert_eq!(
            with(&|c| c.depth = Some(f64::NAN)),
            "depth = NaN is out of range: must be in 0.0..=1.0"
        );
        // The smallest context: no filler, the needle at 0 whatever the depth.
        let c = NeedleConfig {
            seq_len: 18,
            depth: Some(0.7),
            ..d
        };
        let s = c.sample(0, Split::Train, 0).unwrap();
        assert_eq!(s.needle_start, 0);
        check_sample(&c, &s, &c.example(0, Split::Train, 0).unwrap());
    }
}
