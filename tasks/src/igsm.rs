//! iGSM-style modular arithmetic word problems (SCIENCE.md section 2), after Ye, Xu, Li and
//! Allen-Zhu, *Physics of Language Models: Part 2.1, Grade-School Math and the Hidden Reasoning
//! Process* (arXiv 2407.20311), whose synthetic data set is called iGSM.
//!
//! A problem is a random dependency DAG of named quantities. *Leaf* quantities are given a value
//! in `0..=22`; every *defined* quantity is the sum, difference or product of two distinct other
//! quantities, modulo 23 (the paper's arithmetic). The statements are printed in random order, a
//! question asks for one quantity, and the solution computes exactly the quantities that the
//! question needs, in a topological order, and ends in the answer:
//!
//! ```text
//! c=a+b;a=5;d=c*a;b=3;?c:a=5;b=3;c=a+b=5+3=8;#8.
//! |------ prompt -------||---- completion -----|
//! ```
//!
//! (`d` is a *distractor*: a quantity the question does not need.) The knob is
//! [`IgsmConfig::ops`], the **exact** number of arithmetic operations on the solution path
//! (the paper's `op`; the lab's sweep varies it from 2 to 10, SCIENCE.md section 2). Train and
//! evaluation problems are split by a hash of the solution's *structure* (the DAG shape and its
//! operators, ignoring names, values, distractors and statement order), so no evaluation
//! problem is an instance of a template seen in training.
//!
//! ```
//! use tasks::Split;
//! use tasks::igsm::{self, IgsmConfig};
//!
//! let cfg = IgsmConfig { ops: 3, ..IgsmConfig::default() };
//! let p = cfg.sample(7, Split::Train, 0)?;
//! assert_eq!(p.ops(), 3); // exactly 3 operations on the solution path
//! let text = igsm::render(&p);
//! assert_eq!(igsm::check(&text), Ok(p.answer())); // the checker re-derives every step
//! assert_eq!(cfg.split_of(p.structure_hash()), Split::Train);
//!
//! let ex = cfg.example(7, Split::Train, 0)?;
//! assert_eq!(ex.input.len(), cfg.seq_len);
//! // The answer digits are the targets at `answer_positions`.
//! let digits: String = igsm::answer_positions(&ex).unwrap()
//!     .map(|t| igsm::decode(ex.target[t]).unwrap())
//!     .collect();
//! assert_eq!(digits, p.answer().to_string());
//! # Ok::<(), tasks::TaskError>(())
//! ```
//!
//! # Text grammar
//!
//! Character level, no spaces. In the EBNF below `{x}` means zero or more `x`, quoted strings
//! are literal characters:
//!
//! ```text
//! text      = problem solution
//! problem   = statement {statement} question
//! statement = name "=" value ";"                          (leaf: the value is given)
//!           | name "=" name op name ";"                   (defined quantity)
//! question  = "?" name ":"
//! solution  = step {step} answer
//! step      = name "=" value ";"                          (leaf, value restated)
//!           | name "=" name op name "=" value op value "=" value ";"
//! answer    = "#" value "."
//! op        = "+" | "-" | "*"
//! value     = "0" | digit1-9 [digit]                       (decimal in 0..=22, no leading zero)
//! name      = letter {letter}                              (letter = a..z | A..Z)
//! ```
//!
//! Semantics (what [`check`] enforces):
//! - every statement defines a distinct name; every name used on a right-hand side and the
//!   question's name are defined by some statement; definitions are acyclic;
//! - the value of a leaf is its given value; the value of `x=y+z` is `(y + z) mod 23`, of `x=y-z`
//!   is `(y − z) mod 23` (in `0..=22`), of `x=y*z` is `(y · z) mod 23`;
//! - the *needed* quantities are the question's quantity and everything it depends on,
//!   transitively. The solution has exactly one step per needed quantity and no other steps;
//!   a step's right-hand side repeats its statement (`x=y+z`), then substitutes the operand values
//!   (`=5+3`), then gives the result (`=8`); each operand must have been computed by an earlier
//!   step (so the steps are in a topological order and the question's quantity comes last);
//!   a leaf's step restates its given value;
//! - the answer after `#` is the value of the question's quantity.
//!
//! The **prompt** is the problem (up to and including `:`); the **completion** is the solution
//! (from the first step to the final `.`). The generator writes the solution steps in the
//! depth-first post-order of the question's dependencies, left operand first
//! ([`Problem::solution`]); [`check`] accepts any topological order.
//!
//! # Vocabulary
//!
//! Character-level and fixed, independent of the config ([`VOCAB_SIZE`] = 72 ids):
//!
//! | id        | token                          |
//! |-----------|--------------------------------|
//! | `0`       | `PAD` ([`PAD`]; no character)  |
//! | `1..=26`  | `a`..=`z`                      |
//! | `27..=52` | `A`..=`Z`                      |
//! | `53..=62` | `0`..=`9`                      |
//! | `63..=71` | `=` `+` `-` `*` `;` `?` `:` `#` `.` |
//!
//! [`CHARS`] lists the characters of ids `1..=71` (`CHARS[id − 1]`); [`encode`], [`decode`],
//! [`encode_str`] and [`decode_ids`] convert them.
//!
//! Values are written in decimal by default; with [`ValueFormat::Letters`] (`values = "letters"`)
//! each value `0..=22` is the one character `A`..=`W` (`c=a+b;a=F;b=D;?c:a=F;b=D;c=a+b=F+D=I;#I.`),
//! names are then lowercase, and [`check_with`] reads that format.
//!
//! # Example layout
//!
//! The full token sequence is `x = encode(render(problem))`, right-padded with [`PAD`] to length
//! `seq_len + 1`; then, next-token as everywhere in this crate, `input = x[0..seq_len]`,
//! `target = x[1..seq_len + 1]` and
//!
//! ```text
//! mask[t] = (len(prompt) − 1 ≤ t < len(text) − 1)
//! ```
//!
//! so every character of the solution (steps, `#`, answer digits, final `.`) is scored, and
//! nothing of the problem is. [`answer_positions`] (or [`Problem::answer_positions`]) gives the
//! 1–2 positions `t` whose targets are the answer's digits, for answer accuracy (an answer is
//! right when all of them are). `seq_len` must be at least [`IgsmConfig::min_seq_len`], the
//! longest text the config can produce, so the whole text always fits and the last target is
//! always `PAD`.
//!
//! # Sampling
//!
//! Per example, from its own stream [`crate::example_rng`], in this order (write `k = ops`):
//! 1. **Solution structure.** (With [`IgsmConfig::min_ops`] set below `ops`, a training problem's
//!    `k` is first drawn uniformly in `min_ops..=ops`, and step 2 redraws `k` with the
//!    structure; evaluation problems keep `k = ops`.) The number of leaves `L` uniform in `2..=k + 1` (the fewest and
//!    most a connected binary DAG with `k` operations can have); quantities `0..L` are leaves.
//!    Then `k` defined quantities `L, …, L + k − 1`, each from two distinct earlier ones. To make
//!    every quantity an ancestor of the last one (the question), the generator tracks the set
//!    `U` of quantities not yet used as an operand: the `i`-th defined quantity (`r = k − i`
//!    left, this one included) takes `c` operands from `U` and `2 − c` from the used ones, `c`
//!    uniform in `max(|U| + 1 − r, 2 − |used|, 0) ..= min(|U|, 2)`, the operands uniform without
//!    replacement within each group; the two operands are swapped with probability 1/2, and the
//!    operator is uniform on `+ − *`. (This keeps `|U| ≤ r + 1`, so the last quantity uses up
//!    `U` and everything is needed.) The question asks for quantity `L + k − 1`.
//! 2. **Split.** If [`IgsmConfig::split_of`]`(`[`structure_hash`]`)` of that structure is not the
//!    requested split, step 1 is redrawn (on the same stream), up to [`MAX_SPLIT_DRAWS`] times.
//! 3. **Distractors.** `distractors` more quantities, each a leaf with probability 1/2, else an
//!    operation (uniform operator) on an ordered pair of distinct quantities drawn uniformly from
//!    all earlier ones (solution quantities and earlier distractors). The question never depends
//!    on a distractor; distractors may depend on needed quantities.
//! 4. **Values.** Leaf values uniform in `0..=22`, in index order; defined values computed.
//! 5. **Names.** For each quantity in index order, `name_len` characters uniform over
//!    `alphabet`, redrawn until distinct from the earlier names.
//! 6. **Statement order.** A uniform shuffle of all quantities (Fisher–Yates from the last
//!    position down: position `i` swaps with `j` uniform in `0..=i`).
//!
//! # Train/eval split by structure
//!
//! [`structure_hash`] is a 64-bit hash of the needed sub-DAG with leaves unlabelled, `+` and `*`
//! treated as commutative and `−` as ordered; it is computed by two passes of
//! Weisfeiler–Lehman-style signatures (bottom-up: what a quantity computes; top-down: how it is
//! used) combined as a sorted multiset, so it is **invariant under renaming, reindexing and
//! reordering**: isomorphic solution structures always get the same hash and so always fall in
//! the same split (different structures may collide, which only merges templates). A structure
//! belongs to [`Split::Eval`] iff the top 53 bits of its hash, read as a fraction in `[0, 1)`, are
//! below `eval_fraction`. The split of a problem is thus a property of its template, not of the
//! seed: `Split::Train` of any seed never contains an evaluation template.
//!
//! Small `ops` have few templates: `ops = 1` has exactly three (`a+b`, `a−b`, `a·b`), so one
//! part may be empty; sampling that part then fails with [`TaskError::Invalid`] on `ops` after
//! [`MAX_SPLIT_DRAWS`] draws (the tests check that both parts are reachable for `ops` in
//! `2..=10` with the default `eval_fraction`).

use std::collections::HashSet;
use std::ops::Range;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::{Example, Split, TaskError, example_rng};

/// Values live in `0..MODULUS`; every operation is taken modulo 23 (iGSM's arithmetic).
pub const MODULUS: u32 = 23;

/// Largest accepted [`IgsmConfig::ops`].
pub const MAX_OPS: usize = 20;

/// Largest accepted [`IgsmConfig::distractors`].
pub const MAX_DISTRACTORS: usize = 40;

/// Largest accepted [`IgsmConfig::name_len`].
pub const MAX_NAME_LEN: usize = 4;

/// How many times a solution structure is drawn before giving up on finding one in the requested
/// split (see the [module docs](self)).
pub const MAX_SPLIT_DRAWS: usize = 10_000;

/// Token id of padding (no character); fills every position after the text.
pub const PAD: u32 = 0;

/// Number of token ids: `PAD` plus the 71 characters of [`CHARS`].
pub const VOCAB_SIZE: usize = 72;

/// The punctuation characters, ids `63..=71` in order.
const SYMBOLS: [char; 9] = ['=', '+', '-', '*', ';', '?', ':', '#', '.'];

/// The characters of token ids `1..=71` in id order (`CHARS[id − 1]`; id 0 is [`PAD`]):
/// `a–z`, `A–Z`, `0–9`, then `= + - * ; ? : # .`.
pub const CHARS: [char; 71] = {
    let mut out = ['\0'; 71];
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
    let mut s = 0;
    while s < SYMBOLS.len() {
        out[62 + s] = SYMBOLS[s];
        s += 1;
    }
    out
};

/// Number of token ids, [`VOCAB_SIZE`] (72); ids are `0..72`.
pub fn vocab_size() -> usize {
    VOCAB_SIZE
}

/// Token id of character `c` (see the vocabulary table in the [module docs](self)), or `None`
/// if `c` is not in the vocabulary.
pub fn encode(c: char) -> Option<u32> {
    match c {
        'a'..='z' => Some(1 + (c as u32 - 'a' as u32)),
        'A'..='Z' => Some(27 + (c as u32 - 'A' as u32)),
        '0'..='9' => Some(53 + (c as u32 - '0' as u32)),
        _ => SYMBOLS.iter().position(|&s| s == c).map(|i| 63 + i as u32),
    }
}

/// Character of token id `id`, or `None` for [`PAD`] and for ids `≥ 72`.
pub fn decode(id: u32) -> Option<char> {
    crate::decode_char(&CHARS, id)
}

/// Token ids of every character of `s`, or `None` if some character is not in the vocabulary.
pub fn encode_str(s: &str) -> Option<Vec<u32>> {
    s.chars().map(encode).collect()
}

/// The string of `ids` with [`PAD`] ids dropped, or `None` if some id is `≥ 72`.
/// `decode_ids(&example.input)` shows an example's full text.
pub fn decode_ids(ids: &[u32]) -> Option<String> {
    crate::decode_chars(&CHARS, ids)
}

/// An arithmetic operator, taken modulo [`MODULUS`]. Serialised as `"add"`, `"sub"`, `"mul"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// `a + b mod 23`, written `+`.
    Add,
    /// `a − b mod 23` (in `0..=22`), written `-`.
    Sub,
    /// `a · b mod 23`, written `*`.
    Mul,
}

impl Op {
    /// The three operators, in the order the generator indexes them (uniform draw in `0..3`).
    pub const ALL: [Op; 3] = [Op::Add, Op::Sub, Op::Mul];

    /// The operator's character: `+`, `-` or `*`.
    pub fn symbol(self) -> char {
        match self {
            Op::Add => '+',
            Op::Sub => '-',
            Op::Mul => '*',
        }
    }

    /// The operator of character `c`, if any.
    pub fn from_symbol(c: char) -> Option<Op> {
        match c {
            '+' => Some(Op::Add),
            '-' => Some(Op::Sub),
            '*' => Some(Op::Mul),
            _ => None,
        }
    }

    /// `a op b` modulo 23, in `0..=22`. `a` and `b` are reduced modulo 23 first.
    ///
    /// ```
    /// use tasks::igsm::Op;
    /// assert_eq!(Op::Add.apply(20, 5), 2);
    /// assert_eq!(Op::Sub.apply(3, 5), 21);
    /// assert_eq!(Op::Mul.apply(7, 10), 1); // 70 = 3·23 + 1
    /// ```
    pub fn apply(self, a: u32, b: u32) -> u32 {
        let (a, b) = (a % MODULUS, b % MODULUS);
        match self {
            Op::Add => (a + b) % MODULUS,
            Op::Sub => (a + MODULUS - b) % MODULUS,
            Op::Mul => (a * b) % MODULUS,
        }
    }
}

/// How a quantity is defined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Def {
    /// A leaf: its value is given in the problem.
    Leaf,
    /// `lhs op rhs`: indices into [`Problem::quantities`] of two distinct quantities.
    Op {
        /// The operator.
        op: Op,
        /// Index of the left operand.
        lhs: usize,
        /// Index of the right operand.
        rhs: usize,
    },
}

/// One named quantity of a problem.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Quantity {
    /// Its name (letters only).
    pub name: String,
    /// Leaf or operation.
    pub def: Def,
    /// Its value in `0..=22`: given for a leaf, `lhs op rhs mod 23` for an operation.
    pub value: u32,
}

/// How values `0..=22` are written (issue 19's number-formatting lever).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ValueFormat {
    /// Decimal, one or two digit characters (`0`..`22`), the original iGSM format.
    #[default]
    Digits,
    /// One character per value: `A`..=`W` for `0..=22` (ids 27..=49 of the same vocabulary), so
    /// each value is one token. Names are then lowercase only.
    Letters,
}

impl ValueFormat {
    /// `value` (in `0..=22`) as text: `"17"` or `"R"`.
    pub fn render(self, value: u32) -> String {
        match self {
            ValueFormat::Digits => value.to_string(),
            ValueFormat::Letters => char::from(b'A' + value as u8).to_string(),
        }
    }

    /// Whether `c` is a character of a value in this format.
    pub fn is_value_char(self, c: u8) -> bool {
        match self {
            ValueFormat::Digits => c.is_ascii_digit(),
            ValueFormat::Letters => (b'A'..b'A' + MODULUS as u8).contains(&c),
        }
    }

    /// `true` for [`ValueFormat::Digits`] (serde: the default is not written, so run ids of
    /// digit-format runs are unchanged).
    pub fn is_digits(&self) -> bool {
        *self == ValueFormat::Digits
    }
}

/// A structured problem: the DAG, the statement order and the question.
///
/// Generated problems satisfy: `quantities` is in a topological order (operands have smaller
/// indices), names are distinct, values are consistent with the definitions, `statement_order`
/// is a permutation of `0..quantities.len()`. Methods that index (e.g. [`render`]) panic if an
/// index is out of range; they do not check the other properties ([`check`] of the rendered text
/// does).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Problem {
    /// All quantities, needed ones and distractors, in a topological order.
    pub quantities: Vec<Quantity>,
    /// The order in which the statements are printed (indices into `quantities`).
    pub statement_order: Vec<usize>,
    /// Index of the quantity the question asks for.
    pub query: usize,
    /// How the problem's values are written.
    #[serde(default, skip_serializing_if = "ValueFormat::is_digits")]
    pub values: ValueFormat,
}

/// Depth-first post-order of `query`'s dependencies (left operand first), `query` last.
fn post_order(defs: &[Def], query: usize) -> Vec<usize> {
    let mut seen = vec![false; defs.len()];
    let mut out = Vec::new();
    // Iterative: (node, operands pushed?)
    let mut stack = vec![(query, false)];
    while let Some((v, expanded)) = stack.pop() {
        if expanded {
            out.push(v);
            continue;
        }
        if seen[v] {
            continue;
        }
        seen[v] = true;
        stack.push((v, true));
        if let Def::Op { lhs, rhs, .. } = defs[v] {
            // Pushed in reverse so that lhs is visited first.
            if !seen[rhs] {
                stack.push((rhs, false));
            }
            if !seen[lhs] {
                stack.push((lhs, false));
            }
        }
    }
    out
}

/// A stable 64-bit mixing step (SplitMix64's finaliser applied to a rotated combination), used by
/// [`structure_hash`]. Stable across platforms and Rust versions (unlike `std`'s hashers).
fn mix(h: u64, x: u64) -> u64 {
    let mut z = (h.rotate_left(5) ^ x).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn mix_all(tag: u64, xs: &[u64]) -> u64 {
    xs.iter().fold(mix(tag, xs.len() as u64), |h, &x| mix(h, x))
}

fn op_tag(op: Op) -> u64 {
    match op {
        Op::Add => 11,
        Op::Sub => 12,
        Op::Mul => 13,
    }
}

/// The structure hash of the sub-DAG of `defs` that `query` needs (see the [module docs](self)).
///
/// `defs[i]` defines quantity `i`; operands must index into `defs`. Only the needed quantities
/// matter; names, values and order do not.
///
/// Signatures: bottom-up, `up(leaf) = mix(1, 0)`, `up(x = y op z) = mix(mix(op, a), b)` with
/// `(a, b) = (up(y), up(z))` for `−` and sorted for `+`, `*`. Top-down, `down(query) = 2` and
/// `down(v) = mix_all(3, sorted [mix(mix(mix(down(p), up(p)), op(p)), role)])` over the uses of
/// `v` as an operand of a needed `p` (role: 0 for `+`/`*`, 1/2 for the left/right of `−`). The
/// hash is `mix_all(4, sorted [mix(up(v), down(v))])` over needed `v`.
pub fn structure_hash(defs: &[Def], query: usize) -> u64 {
    let order = post_order(defs, query);
    let mut up = vec![0u64; defs.len()];
    for &v in &order {
        up[v] = match defs[v] {
            Def::Leaf => mix(1, 0),
            Def::Op { op, lhs, rhs } => {
                let (a, b) = (up[lhs], up[rhs]);
                let (a, b) = if op == Op::Sub {
                    (a, b)
                } else {
                    (a.min(b), a.max(b))
                };
                mix(mix(op_tag(op), a), b)
            }
        };
    }
    let mut uses: Vec<Vec<u64>> = vec![Vec::new(); defs.len()];
    let mut down = vec![0u64; defs.len()];
    for &v in order.iter().rev() {
        down[v] = if v == query {
            2
        } else {
            uses[v].sort_unstable();
            mix_all(3, &uses[v])
        };
        if let Def::Op { op, lhs, rhs } = defs[v] {
            let (rl, rr) = if op == Op::Sub { (1, 2) } else { (0, 0) };
            let base = mix(mix(down[v], up[v]), op_tag(op));
            uses[lhs].push(mix(base, rl));
            uses[rhs].push(mix(base, rr));
        }
    }
    let mut sigs: Vec<u64> = order.iter().map(|&v| mix(up[v], down[v])).collect();
    sigs.sort_unstable();
    mix_all(4, &sigs)
}

impl Problem {
    fn defs(&self) -> Vec<Def> {
        self.quantities.iter().map(|q| q.def).collect()
    }

    /// The solution steps: indices of the needed quantities in depth-first post-order from the
    /// question (left operand first), so every operand precedes its use and the question's
    /// quantity is last.
    pub fn solution(&self) -> Vec<usize> {
        post_order(&self.defs(), self.query)
    }

    /// Number of arithmetic operations on the solution path: the defined (non-leaf) quantities
    /// among the solution steps. Equals [`IgsmConfig::ops`] for generated problems.
    pub fn ops(&self) -> usize {
        self.solution()
            .iter()
            .filter(|&&i| matches!(self.quantities[i].def, Def::Op { .. }))
            .count()
    }

    /// Depth of the question's dependency tree in operations: 0 for a leaf, else 1 + the deeper
    /// of its operands' depths. The most name-by-name lookups between the question and a leaf
    /// of its solution (issue 19, R52: greedy answers by depth); `1..=ops` for generated
    /// problems: `ops` for a chain, at least ⌈log₂(ops + 1)⌉ for a tree (3 at ops 4).
    pub fn depth(&self) -> usize {
        let defs = self.defs();
        // Post-order puts every operand before its use: one pass fills the depths.
        let mut depth = vec![0usize; defs.len()];
        for i in post_order(&defs, self.query) {
            if let Def::Op { lhs, rhs, .. } = defs[i] {
                depth[i] = 1 + depth[lhs].max(depth[rhs]);
            }
        }
        depth[self.query]
    }

    /// The answer: the value of the question's quantity, in `0..=22`.
    pub fn answer(&self) -> u32 {
        self.quantities[self.query].value
    }

    /// [`structure_hash`] of this problem's solution structure.
    pub fn structure_hash(&self) -> u64 {
        structure_hash(&self.defs(), self.query)
    }

    /// The problem text: the statements in `statement_order`, then the question (`?name:`).
    pub fn prompt(&self) -> String {
        let mut s = String::new();
        for &i in &self.statement_order {
            let q = &self.quantities[i];
            s.push_str(&q.name);
            s.push('=');
            match q.def {
                Def::Leaf => s.push_str(&self.values.render(q.value)),
                Def::Op { op, lhs, rhs } => {
                    s.push_str(&self.quantities[lhs].name);
                    s.push(op.symbol());
                    s.push_str(&self.quantities[rhs].name);
                }
            }
            s.push(';');
        }
        s.push('?');
        s.push_str(&self.quantities[self.query].name);
        s.push(':');
        s
    }

    /// The completion: one step per [`Problem::solution`] entry, then `#answer.`.
    pub fn completion(&self) -> String {
        let mut s = String::new();
        for i in self.solution() {
            let q = &self.quantities[i];
            s.push_str(&q.name);
            s.push('=');
            if let Def::Op { op, lhs, rhs } = q.def {
                let (l, r) = (&self.quantities[lhs], &self.quantities[rhs]);
                let o = op.symbol();
                let f = |v| self.values.render(v);
                s.push_str(&format!(
                    "{}{o}{}={}{o}{}=",
                    l.name,
                    r.name,
                    f(l.value),
                    f(r.value)
                ));
            }
            s.push_str(&self.values.render(q.value));
            s.push(';');
        }
        s.push_str(&format!("#{}.", self.values.render(self.answer())));
        s
    }

    /// Positions `t` of the example (see [`answer_positions`]) whose targets are the answer's
    /// characters: `k .. k + d` where `k` is the index of `#` in the text and `d` the number of
    /// characters of the answer (1 or 2 digits; 1 letter).
    pub fn answer_positions(&self) -> Range<usize> {
        let d = self.values.render(self.answer()).len();
        let k = self.prompt().len() + self.completion().len() - d - 2;
        k..k + d
    }
}

/// The full text of `problem`: [`Problem::prompt`] followed by [`Problem::completion`] (grammar
/// in the [module docs](self)).
pub fn render(problem: &Problem) -> String {
    problem.prompt() + &problem.completion()
}

/// The positions `t` of `example` whose targets are the answer's characters (the targets right
/// after the input `#`: digits, or one letter `A`..=`W` in [`ValueFormat::Letters`]), or `None`
/// if the input holds no `#` followed by such a target.
///
/// Answer accuracy: the model is right when its predictions at all of these positions equal
/// the targets.
pub fn answer_positions(example: &Example) -> Option<Range<usize>> {
    let hash = encode('#').expect("# is in the vocabulary");
    let k = example.input.iter().position(|&id| id == hash)?;
    let is_value = |id: u32| {
        decode(id).is_some_and(|c| {
            ValueFormat::Digits.is_value_char(c as u8)
                || ValueFormat::Letters.is_value_char(c as u8)
        })
    };
    let d = example.target[k..]
        .iter()
        .take_while(|&&id| is_value(id))
        .count();
    (d > 0).then_some(k..k + d)
}

/// Why a text failed [`check`]. `Display` is one line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// The text does not follow the grammar. `pos` is the 0-based byte offset (the character
    /// offset for ASCII text, which every valid text is).
    #[error("syntax error at character {pos}: {message}")]
    Syntax {
        /// Byte offset where the text departs from the grammar.
        pos: usize,
        /// What was expected and what was found.
        message: String,
    },
    /// The problem statements are inconsistent (duplicate, undefined or cyclic definitions).
    #[error("bad problem: {0}")]
    Problem(String),
    /// Solution step number `step` (1-based) is wrong.
    #[error("step {step} (`{name}`): {message}")]
    Step {
        /// 1-based step number.
        step: usize,
        /// The name the step computes.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The solution never computes a quantity the question needs.
    #[error("the solution never computes `{0}`, which the question needs")]
    Missing(String),
    /// The final answer is not the value of the question's quantity.
    #[error("answer {got} is wrong: `{name}` = {expected}")]
    Answer {
        /// The question's quantity.
        name: String,
        /// Its value.
        expected: u32,
        /// The answer written.
        got: u32,
    },
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
    values: ValueFormat,
}

fn show(c: Option<u8>) -> String {
    match c {
        Some(c) if c.is_ascii_graphic() => format!("`{}`", c as char),
        Some(c) => format!("byte 0x{c:02x}"),
        None => "end of text".into(),
    }
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn err(&self, expected: &str) -> CheckError {
        CheckError::Syntax {
            pos: self.pos,
            message: format!("expected {expected}, found {}", show(self.peek())),
        }
    }

    fn expect(&mut self, c: u8) -> Result<(), CheckError> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.err(&format!("`{}`", c as char)))
        }
    }

    /// Whether the next character starts a value.
    fn at_value(&self) -> bool {
        self.peek().is_some_and(|c| self.values.is_value_char(c))
    }

    fn name(&mut self) -> Result<&'a str, CheckError> {
        let start = self.pos;
        let letters = self.values == ValueFormat::Letters;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_lowercase() || (!letters && c.is_ascii_uppercase()))
        {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.err("a name"));
        }
        Ok(std::str::from_utf8(&self.s[start..self.pos]).expect("ASCII"))
    }

    fn value(&mut self) -> Result<u32, CheckError> {
        let start = self.pos;
        if self.values == ValueFormat::Letters {
            return match self.peek() {
                Some(c) if self.values.is_value_char(c) => {
                    self.pos += 1;
                    Ok(u32::from(c - b'A'))
                }
                _ => Err(self.err("a value `A`..`W`")),
            };
        }
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let lit = std::str::from_utf8(&self.s[start..self.pos]).expect("ASCII");
        if lit.is_empty() {
            return Err(self.err("a value"));
        }
        match lit.parse::<u32>() {
            Ok(v) if v < MODULUS && v.to_string() == lit => Ok(v),
            _ => Err(CheckError::Syntax {
                pos: start,
                message: format!("value `{lit}` is not a number in 0..=22 without leading zeros"),
            }),
        }
    }

    fn op(&mut self) -> Result<Op, CheckError> {
        match self.peek().and_then(|c| Op::from_symbol(c as char)) {
            Some(op) => {
                self.pos += 1;
                Ok(op)
            }
            None => Err(self.err("an operator `+`, `-` or `*`")),
        }
    }
}

/// A parsed statement: leaf value or (op, lhs name, rhs name).
enum Rhs<'a> {
    Leaf(u32),
    Op(Op, &'a str, &'a str),
}

/// Parse a full text (problem, solution, answer; grammar in the [module docs](self)), re-derive
/// every value from the problem statements alone, verify every solution step against them, and
/// return the answer.
///
/// Checks, in order: the problem parses; names are defined once; every used name is defined;
/// definitions are acyclic; then each step (its name is a needed quantity not computed before;
/// a leaf step restates the given value; an operation step repeats its statement, substitutes
/// operand values that were computed by earlier steps, and gives the right result modulo 23);
/// every needed quantity has a step; the text ends in `#answer.` with the question's value.
///
/// ```
/// use tasks::igsm::{check, CheckError};
/// assert_eq!(check("c=a+b;a=5;d=c*a;b=3;?c:a=5;b=3;c=a+b=5+3=8;#8."), Ok(8));
/// assert!(matches!(check("a=5;b=3;c=a+b;?c:a=5;b=3;c=a+b=5+3=9;#9."), Err(CheckError::Step { step: 3, .. })));
/// ```
///
/// # Errors
/// The first problem found, as a [`CheckError`].
pub fn check(text: &str) -> Result<u32, CheckError> {
    check_with(text, ValueFormat::Digits)
}

/// [`check`] for a text whose values are written in `values` (names are lowercase only in
/// [`ValueFormat::Letters`]).
///
/// ```
/// use tasks::igsm::{check_with, ValueFormat};
/// assert_eq!(check_with("c=a+b;a=F;d=c*a;b=D;?c:a=F;b=D;c=a+b=F+D=I;#I.", ValueFormat::Letters), Ok(8));
/// ```
///
/// # Errors
/// As [`check`].
pub fn check_with(text: &str, values: ValueFormat) -> Result<u32, CheckError> {
    let mut p = Parser {
        s: text.as_bytes(),
        pos: 0,
        values,
    };
    // ---- problem ----
    let mut stmts: Vec<(&str, Rhs)> = Vec::new();
    loop {
        let name = p.name()?;
        p.expect(b'=')?;
        let rhs = if p.at_value() {
            Rhs::Leaf(p.value()?)
        } else {
            let a = p.name()?;
            let op = p.op()?;
            let b = p.name()?;
            Rhs::Op(op, a, b)
        };
        p.expect(b';')?;
        stmts.push((name, rhs));
        if p.peek() == Some(b'?') {
            break;
        }
    }
    p.expect(b'?')?;
    let query_name = p.name()?;
    p.expect(b':')?;

    let mut index = std::collections::HashMap::new();
    for (i, (name, _)) in stmts.iter().enumerate() {
        if index.insert(*name, i).is_some() {
            return Err(CheckError::Problem(format!(
                "`{name}` is defined more than once"
            )));
        }
    }
    let lookup = |user: &str, name: &str| {
        index.get(name).copied().ok_or_else(|| {
            CheckError::Problem(format!("{user} uses `{name}`, which is not defined"))
        })
    };
    let mut defs = Vec::with_capacity(stmts.len());
    let mut given = Vec::with_capacity(stmts.len());
    for (name, rhs) in &stmts {
        match *rhs {
            Rhs::Leaf(v) => {
                defs.push(Def::Leaf);
                given.push(v);
            }
            Rhs::Op(op, a, b) => {
                let user = format!("`{name}`");
                defs.push(Def::Op {
                    op,
                    lhs: lookup(&user, a)?,
                    rhs: lookup(&user, b)?,
                });
                given.push(0);
            }
        }
    }
    let query = lookup("the question", query_name)?;

    // Evaluate every quantity (iterative DFS, detecting cycles).
    let n = stmts.len();
    let mut value: Vec<Option<u32>> = vec![None; n];
    let mut on_stack = vec![false; n];
    for root in 0..n {
        let mut stack = vec![root];
        while let Some(&v) = stack.last() {
            if value[v].is_some() {
                stack.pop();
                continue;
            }
            match defs[v] {
                Def::Leaf => {
                    value[v] = Some(given[v]);
                    stack.pop();
                }
                Def::Op { op, lhs, rhs } => match (value[lhs], value[rhs]) {
                    (Some(a), Some(b)) => {
                        value[v] = Some(op.apply(a, b));
                        on_stack[v] = false;
                        stack.pop();
                    }
                    _ => {
                        if on_stack[v] {
                            return Err(CheckError::Problem(format!(
                                "the definitions are cyclic (through `{}`)",
                                stmts[v].0
                            )));
                        }
                        on_stack[v] = true;
                        for w in [rhs, lhs] {
                            if value[w].is_none() {
                                if on_stack[w] {
                                    return Err(CheckError::Problem(format!(
                                        "the definitions are cyclic (through `{}`)",
                                        stmts[w].0
                                    )));
                                }
                                stack.push(w);
                            }
                        }
                    }
                },
            }
        }
    }
    let value: Vec<u32> = value.into_iter().map(|v| v.expect("evaluated")).collect();
    let mut needed = vec![false; n];
    for v in post_order(&defs, query) {
        needed[v] = true;
    }

    // ---- solution ----
    let mut computed = vec![false; n];
    let mut step = 0;
    while p.peek() != Some(b'#') {
        step += 1;
        let name = p.name()?;
        let bad = |message: String| CheckError::Step {
            step,
            name: name.to_string(),
            message,
        };
        p.expect(b'=')?;
        let Some(&i) = index.get(name) else {
            return Err(bad("no statement defines this name".into()));
        };
        if computed[i] {
            return Err(bad("computed a second time".into()));
        }
        if !needed[i] {
            return Err(bad(format!("not needed for the question `{query_name}`")));
        }
        match defs[i] {
            Def::Leaf => {
                let v = p.value()?;
                p.expect(b';')?;
                if v != value[i] {
                    return Err(bad(format!("given as {}, not {v}", value[i])));
                }
            }
            Def::Op { op, lhs, rhs } => {
                let a = p.name()?;
                let o = p.op()?;
                let b = p.name()?;
                p.expect(b'=')?;
                let va = p.value()?;
                let o2 = p.op()?;
                let vb = p.value()?;
                p.expect(b'=')?;
                let r = p.value()?;
                p.expect(b';')?;
                let (ln, rn) = (stmts[lhs].0, stmts[rhs].0);
                if (a, o, b) != (ln, op, rn) {
                    return Err(bad(format!(
                        "the statement is {ln}{}{rn}, not {a}{}{b}",
                        op.symbol(),
                        o.symbol()
                    )));
                }
                for (w, name_w) in [(lhs, ln), (rhs, rn)] {
                    if !computed[w] {
                        return Err(bad(format!("operand `{name_w}` is used before its step")));
                    }
                }
                if o2 != op {
                    return Err(bad(format!(
                        "substitutes with `{}` instead of `{}`",
                        o2.symbol(),
                        op.symbol()
                    )));
                }
                if (va, vb) != (value[lhs], value[rhs]) {
                    return Err(bad(format!(
                        "operands are {ln} = {} and {rn} = {}, not {va} and {vb}",
                        value[lhs], value[rhs]
                    )));
                }
                let want = op.apply(va, vb);
                if r != want {
                    return Err(bad(format!(
                        "{va}{}{vb} = {want} (mod 23), not {r}",
                        op.symbol()
                    )));
                }
            }
        }
        computed[i] = true;
    }
    if let Some(i) = (0..n).find(|&i| needed[i] && !computed[i]) {
        return Err(CheckError::Missing(stmts[i].0.to_string()));
    }
    p.expect(b'#')?;
    let got = p.value()?;
    p.expect(b'.')?;
    if p.peek().is_some() {
        return Err(p.err("end of text"));
    }
    if got != value[query] {
        return Err(CheckError::Answer {
            name: query_name.to_string(),
            expected: value[query],
            got,
        });
    }
    Ok(got)
}

/// Configuration of the iGSM task (see the [module docs](self)).
///
/// `Default`: `ops = 4`, `distractors = 4`, names of one letter from `a–z`,
/// `eval_fraction = 0.25`, `seq_len = 512` (enough for `ops ≤ 10` with the default distractors
/// and names). Deserialising does not validate; every entry point calls
/// [`IgsmConfig::validate`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IgsmConfig {
    /// Exact number of arithmetic operations on the solution path, in `1..=20` (the sweep uses
    /// 2..=10).
    pub ops: usize,
    /// Number of distractor quantities (not needed by the question), in `0..=40`.
    pub distractors: usize,
    /// The letters names are made of: distinct characters of `a–zA–Z`, at least one.
    pub alphabet: String,
    /// Characters per name, in `1..=4`; `alphabet.len()^name_len` must be at least
    /// [`IgsmConfig::max_quantities`].
    pub name_len: usize,
    /// Fraction of solution *templates* (structure-hash space) reserved for [`Split::Eval`],
    /// finite, strictly between 0 and 1.
    pub eval_fraction: f64,
    /// Context length (tokens): length of `input`, `target` and `mask`; at least
    /// [`IgsmConfig::min_seq_len`].
    pub seq_len: usize,
    /// How values are written ([`ValueFormat::Letters`] needs a lowercase `alphabet`).
    #[serde(default)]
    pub values: ValueFormat,
    /// A mixture over problem sizes in training: when set (in `1..=ops`), each [`Split::Train`]
    /// problem's number of operations is drawn uniformly in `min_ops..=ops` before its structure,
    /// and the pair is redrawn together until the structure falls in the training part (so a size
    /// with no training template is skipped rather than failing). [`Split::Eval`] problems always
    /// have exactly `ops`: a mixture run is evaluated at its target size. `None` (the default):
    /// every problem has exactly `ops`, and the random stream is the one of configs without this
    /// field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ops: Option<usize>,
}

impl Default for IgsmConfig {
    fn default() -> Self {
        IgsmConfig {
            ops: 4,
            distractors: 4,
            alphabet: "abcdefghijklmnopqrstuvwxyz".into(),
            name_len: 1,
            eval_fraction: 0.25,
            seq_len: 512,
            values: ValueFormat::Digits,
            min_ops: None,
        }
    }
}

/// iGSM's own parameters in a training run (the run's `seq_len` completes them into an
/// [`IgsmConfig`] with its default alphabet, names and held-out fraction).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IgsmParams {
    /// Arithmetic operations on the solution path.
    pub ops: usize,
    /// Quantities the question does not need.
    pub distractors: usize,
    /// How values are written: `"digits"` (default; not serialised, so run ids are unchanged) or
    /// `"letters"` (one token per value).
    #[serde(skip_serializing_if = "ValueFormat::is_digits")]
    pub values: ValueFormat,
    /// Train on a mixture of sizes: each training problem's `ops` uniform in `min_ops..=ops`
    /// ([`IgsmConfig::min_ops`]; held-out problems keep exactly `ops`). Unset (default; not
    /// serialised, so run ids are unchanged): every problem has exactly `ops`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_ops: Option<usize>,
}

impl Default for IgsmParams {
    fn default() -> Self {
        let c = IgsmConfig::default();
        IgsmParams {
            ops: c.ops,
            distractors: c.distractors,
            values: c.values,
            min_ops: c.min_ops,
        }
    }
}

impl IgsmParams {
    /// Parameter names, in serialisation order (checked by a test).
    pub const NAMES: &'static [&'static str] = &["ops", "distractors", "values", "min_ops"];

    /// The generator config for a run with context `seq_len`.
    pub fn config(&self, seq_len: usize) -> IgsmConfig {
        IgsmConfig {
            ops: self.ops,
            distractors: self.distractors,
            seq_len,
            values: self.values,
            min_ops: self.min_ops,
            ..IgsmConfig::default()
        }
    }
}

impl IgsmConfig {
    /// Check every field.
    ///
    /// # Errors
    /// The first bad field, in the order `ops` (`1..=20`), `min_ops` (`1..=ops` when set),
    /// `distractors` (`0..=40`), `alphabet`
    /// ([`TaskError::Invalid`]: empty, a character outside `a–zA–Z`, or repeated), `name_len`
    /// (`1..=4`, then at least the smallest length giving [`IgsmConfig::max_quantities`]
    /// distinct names; [`TaskError::Invalid`] on `alphabet` if even 4 is too short),
    /// an uppercase `alphabet` letter with [`ValueFormat::Letters`],
    /// `eval_fraction` (`0 < x < 1`), `seq_len` (`min_seq_len()..`), e.g.
    /// `seq_len = 100 is out of range: must be in 165.. (ops, distractors, name_len)`.
    pub fn validate(&self) -> Result<(), TaskError> {
        if !(1..=MAX_OPS).contains(&self.ops) {
            return Err(TaskError::out_of_range(
                "ops",
                self.ops,
                format!("1..={MAX_OPS}"),
            ));
        }
        if let Some(lo) = self.min_ops
            && !(1..=self.ops).contains(&lo)
        {
            return Err(TaskError::out_of_range(
                "min_ops",
                lo,
                format!("1..={} (ops)", self.ops),
            ));
        }
        if self.distractors > MAX_DISTRACTORS {
            return Err(TaskError::out_of_range(
                "distractors",
                self.distractors,
                format!("0..={MAX_DISTRACTORS}"),
            ));
        }
        let invalid = |message: String| TaskError::Invalid {
            field: "alphabet",
            message,
        };
        if self.alphabet.is_empty() {
            return Err(invalid("must hold at least one letter".into()));
        }
        let mut seen = HashSet::new();
        for c in self.alphabet.chars() {
            if !c.is_ascii_alphabetic() {
                return Err(invalid(format!(
                    "{c:?} is not a letter a-z or A-Z (names are letters only)"
                )));
            }
            if !seen.insert(c) {
                return Err(invalid(format!("{c:?} appears more than once")));
            }
            if self.values == ValueFormat::Letters && c.is_ascii_uppercase() {
                return Err(invalid(format!(
                    "{c:?} is uppercase: with values = \"letters\" the values are A-W, so names are lowercase a-z only"
                )));
            }
        }
        if !(1..=MAX_NAME_LEN).contains(&self.name_len) {
            return Err(TaskError::out_of_range(
                "name_len",
                self.name_len,
                format!("1..={MAX_NAME_LEN}"),
            ));
        }
        let need = self.max_quantities();
        let a = seen.len();
        let n_names = |len: usize| a.pow(len as u32);
        if n_names(self.name_len) < need {
            return match (1..=MAX_NAME_LEN).find(|&l| n_names(l) >= need) {
                Some(min) => Err(TaskError::out_of_range(
                    "name_len",
                    self.name_len,
                    format!("{min}..={MAX_NAME_LEN} (alphabet, ops, distractors)"),
                )),
                None => Err(invalid(format!(
                    "{a} letters give fewer than the {need} names ops = {} and distractors = {} may need",
                    self.ops, self.distractors
                ))),
            };
        }
        if !(self.eval_fraction.is_finite() && self.eval_fraction > 0.0 && self.eval_fraction < 1.0)
        {
            return Err(TaskError::out_of_range(
                "eval_fraction",
                self.eval_fraction,
                "0.0 < x < 1.0",
            ));
        }
        let min = self.min_seq_len();
        if self.seq_len < min {
            return Err(TaskError::out_of_range(
                "seq_len",
                self.seq_len,
                format!("{min}.. (ops, distractors, name_len)"),
            ));
        }
        Ok(())
    }

    /// Most quantities a problem can have: `ops + (ops + 1) + distractors` (at most `ops + 1`
    /// leaves on the solution path).
    pub fn max_quantities(&self) -> usize {
        2 * self.ops + 1 + self.distractors
    }

    /// Smallest valid `seq_len`: the longest text this config can produce, with `k = ops`,
    /// `d = distractors`, `n = name_len`:
    ///
    /// ```text
    ///   (k + d)·(3n + 3)    operation statements  x=y+z;
    /// + (k + 1)·(n + 4)     leaf statements       x=22;
    /// + (n + 2)             question              ?x:
    /// + k·(3n + 12)         operation steps       x=y+z=22+22=22;
    /// + (k + 1)·(n + 4)     leaf steps            x=22;
    /// + 4                   answer                #22.
    /// ```
    ///
    /// 165 for the default config; 387 for `ops = 10`, `distractors = 10`.
    pub fn min_seq_len(&self) -> usize {
        let (k, d, n) = (self.ops, self.distractors, self.name_len);
        (k + d) * (3 * n + 3) + 2 * (k + 1) * (n + 4) + (n + 2) + k * (3 * n + 12) + 4
    }

    /// The split a solution structure with hash `structure_hash` belongs to: [`Split::Eval`] iff
    /// `(structure_hash >> 11) / 2^53 < eval_fraction`.
    pub fn split_of(&self, structure_hash: u64) -> Split {
        let u = (structure_hash >> 11) as f64 / (1u64 << 53) as f64;
        if u < self.eval_fraction {
            Split::Eval
        } else {
            Split::Train
        }
    }

    /// Draw problem number `index` of `split` for `seed` (a pure function of the arguments; the
    /// problem [`IgsmConfig::example`] encodes). Its structure hash is in `split`'s part.
    ///
    /// # Errors
    /// Any [`IgsmConfig::validate`] error; [`TaskError::OutOfRange`] on `index` if
    /// `index > MAX_INDEX`; [`TaskError::Invalid`] on `ops` if no structure of the requested
    /// split turns up in [`MAX_SPLIT_DRAWS`] draws (only for very small `ops`).
    pub fn sample(&self, seed: u64, split: Split, index: u64) -> Result<Problem, TaskError> {
        self.validate()?;
        let mut rng = example_rng(seed, split, index)?;
        self.draw(&mut rng, split)
    }

    /// Example number `index` of `split` for `seed`: the encoding
    /// ([`IgsmConfig::encode_problem`]) of `self.sample(seed, split, index)`.
    ///
    /// # Errors
    /// As [`IgsmConfig::sample`].
    pub fn example(&self, seed: u64, split: Split, index: u64) -> Result<Example, TaskError> {
        let p = self.sample(seed, split, index)?;
        Ok(self.assemble(&p))
    }

    /// A batch: examples `index0 .. index0 + batch` of `split` for `seed`, in order. Element `i`
    /// equals `self.example(seed, split, index0 + i)`.
    ///
    /// # Errors
    /// As [`IgsmConfig::sample`]; [`TaskError::Invalid`] on `batch` if the last index
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

    /// Encode a problem (e.g. one written by hand) with this config's `seq_len`, laid out as in
    /// the [module docs](self).
    ///
    /// # Errors
    /// Any [`IgsmConfig::validate`] error; [`TaskError::Invalid`] on `problem` if its rendered
    /// text fails [`check`] or is longer than `seq_len`.
    pub fn encode_problem(&self, problem: &Problem) -> Result<Example, TaskError> {
        self.validate()?;
        let invalid = |message: String| TaskError::Invalid {
            field: "problem",
            message,
        };
        let text = render(problem);
        check_with(&text, problem.values)
            .map_err(|e| invalid(format!("{text:?} fails the check: {e}")))?;
        if text.len() > self.seq_len {
            return Err(invalid(format!(
                "text is {} tokens, longer than seq_len = {}",
                text.len(),
                self.seq_len
            )));
        }
        Ok(self.assemble(problem))
    }

    /// Lay out a problem whose text fits in `seq_len`.
    fn assemble(&self, p: &Problem) -> Example {
        let n = self.seq_len;
        let prompt = p.prompt();
        let text = prompt.clone() + &p.completion();
        debug_assert!(text.len() <= n);
        let mut x: Vec<u32> = text
            .chars()
            .map(|c| encode(c).expect("rendered text is in the vocabulary"))
            .collect();
        x.resize(n + 1, PAD);
        let scored = prompt.len() - 1..text.len() - 1;
        Example {
            input: x[..n].to_vec(),
            target: x[1..].to_vec(),
            mask: (0..n).map(|t| scored.contains(&t)).collect(),
        }
    }

    /// Step 1 of the sampling procedure with `k` operations: the solution's `Def`s, question last.
    fn draw_structure(&self, rng: &mut ChaCha8Rng, k: usize) -> Vec<Def> {
        let n_leaves = rng.random_range(2..=k + 1);
        let mut defs = vec![Def::Leaf; n_leaves];
        let mut unused: Vec<usize> = (0..n_leaves).collect();
        let mut used: Vec<usize> = Vec::new();
        for i in 0..k {
            let r = k - i;
            let u = unused.len();
            let lo = (u + 1)
                .saturating_sub(r)
                .max(2usize.saturating_sub(used.len()));
            let hi = u.min(2);
            debug_assert!(lo <= hi);
            let c = rng.random_range(lo..=hi);
            let mut operands = Vec::with_capacity(2);
            for _ in 0..c {
                let j = rng.random_range(0..unused.len());
                operands.push(unused.swap_remove(j));
            }
            if c == 1 {
                operands.push(used[rng.random_range(0..used.len())]);
            } else if c == 0 {
                let a = rng.random_range(0..used.len());
                let mut b = rng.random_range(0..used.len() - 1);
                if b >= a {
                    b += 1;
                }
                operands.push(used[a]);
                operands.push(used[b]);
            }
            used.extend_from_slice(&operands[..c]);
            if rng.random_bool(0.5) {
                operands.swap(0, 1);
            }
            let op = Op::ALL[rng.random_range(0..3)];
            defs.push(Def::Op {
                op,
                lhs: operands[0],
                rhs: operands[1],
            });
            unused.push(n_leaves + i);
        }
        debug_assert_eq!(unused, [defs.len() - 1]);
        defs
    }

    /// The whole sampling procedure (module docs). Config must be valid.
    fn draw(&self, rng: &mut ChaCha8Rng, split: Split) -> Result<Problem, TaskError> {
        let mut defs = None;
        for _ in 0..MAX_SPLIT_DRAWS {
            let k = match self.min_ops {
                Some(lo) if lo < self.ops && split == Split::Train => {
                    rng.random_range(lo..=self.ops)
                }
                _ => self.ops,
            };
            let d = self.draw_structure(rng, k);
            // Validation problems come from the held-out structures, like evaluation ones.
            let part = if split.is_held_out() {
                Split::Eval
            } else {
                Split::Train
            };
            if self.split_of(structure_hash(&d, d.len() - 1)) == part {
                defs = Some(d);
                break;
            }
        }
        let Some(mut defs) = defs else {
            return Err(TaskError::Invalid {
                field: "ops",
                message: format!(
                    "no solution structure with ops = {} fell in the {} part (eval_fraction = {}) in {MAX_SPLIT_DRAWS} draws; use more ops",
                    self.ops,
                    if split.is_held_out() { "eval" } else { "train" },
                    self.eval_fraction
                ),
            });
        };
        let query = defs.len() - 1;
        for _ in 0..self.distractors {
            let n = defs.len();
            if rng.random_bool(0.5) {
                defs.push(Def::Leaf);
            } else {
                let lhs = rng.random_range(0..n);
                let mut rhs = rng.random_range(0..n - 1);
                if rhs >= lhs {
                    rhs += 1;
                }
                let op = Op::ALL[rng.random_range(0..3)];
                defs.push(Def::Op { op, lhs, rhs });
            }
        }
        let mut values: Vec<u32> = Vec::with_capacity(defs.len());
        for d in &defs {
            let v = match *d {
                Def::Leaf => rng.random_range(0..MODULUS),
                Def::Op { op, lhs, rhs } => op.apply(values[lhs], values[rhs]),
            };
            values.push(v);
        }
        let letters: Vec<char> = self.alphabet.chars().collect();
        let mut taken = HashSet::new();
        let mut names = Vec::with_capacity(defs.len());
        for _ in 0..defs.len() {
            let name = loop {
                let s: String = (0..self.name_len)
                    .map(|_| letters[rng.random_range(0..letters.len())])
                    .collect();
                if !taken.contains(&s) {
                    break s;
                }
            };
            taken.insert(name.clone());
            names.push(name);
        }
        let mut statement_order: Vec<usize> = (0..defs.len()).collect();
        for i in (1..statement_order.len()).rev() {
            let j = rng.random_range(0..=i);
            statement_order.swap(i, j);
        }
        let quantities = names
            .into_iter()
            .zip(defs)
            .zip(values)
            .map(|((name, def), value)| Quantity { name, def, value })
            .collect();
        Ok(Problem {
            quantities,
            statement_order,
            query,
            values: self.values,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_INDEX;

    const BOTH: [Split; 2] = [Split::Train, Split::Eval];
    const AZ: &str = "abcdefghijklmnopqrstuvwxyz";
    const AZ_BOTH: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

    fn cfg(ops: usize, distractors: usize) -> IgsmConfig {
        IgsmConfig {
            ops,
            distractors,
            ..IgsmConfig::default()
        }
    }

    fn q(name: &str, def: Def, value: u32) -> Quantity {
        Quantity {
            name: name.into(),
            def,
            value,
        }
    }

    fn op(op: Op, lhs: usize, rhs: usize) -> Def {
        Def::Op { op, lhs, rhs }
    }

    #[test]
    fn depth_counts_the_longest_chain_of_operations() {
        let leaf = |n: &str, v| q(n, Def::Leaf, v);
        let problem = |quantities: Vec<Quantity>, query| Problem {
            statement_order: (0..quantities.len()).collect(),
            quantities,
            query,
            values: ValueFormat::Digits,
        };
        // a, b leaves; c = a+b; d = c*a; e = d-b: a chain of 3 operations.
        let chain = problem(
            vec![
                leaf("a", 1),
                leaf("b", 2),
                q("c", op(Op::Add, 0, 1), 3),
                q("d", op(Op::Mul, 2, 0), 3),
                q("e", op(Op::Sub, 3, 1), 1),
            ],
            4,
        );
        assert_eq!((chain.depth(), chain.ops()), (3, 3));
        // c = a+b; d = a*b; e = c+d: 3 operations, depth 2 (balanced).
        let balanced = problem(
            vec![
                leaf("a", 1),
                leaf("b", 2),
                q("c", op(Op::Add, 0, 1), 3),
                q("d", op(Op::Mul, 0, 1), 2),
                q("e", op(Op::Add, 2, 3), 5),
            ],
            4,
        );
        assert_eq!((balanced.depth(), balanced.ops()), (2, 3));
        // The question a leaf: depth 0; a question on c alone ignores d, e.
        assert_eq!(problem(vec![leaf("a", 4)], 0).depth(), 0);
        assert_eq!(problem(balanced.quantities.clone(), 2).depth(), 1);
        // Generated problems: 1 <= depth <= ops.
        for ops in 1..=6 {
            for i in 0..50 {
                let p = cfg(ops, 2).sample(7, Split::Train, i).unwrap();
                assert!(
                    (1..=ops).contains(&p.depth()),
                    "ops {ops}: depth {}",
                    p.depth()
                );
            }
        }
    }

    /// The module-doc example: `c=a+b;a=5;d=c*a;b=3;?c:a=5;b=3;c=a+b=5+3=8;#8.`
    fn doc_problem() -> Problem {
        Problem {
            quantities: vec![
                q("a", Def::Leaf, 5),
                q("b", Def::Leaf, 3),
                q("c", op(Op::Add, 0, 1), 8),
                q("d", op(Op::Mul, 2, 0), 17), // 8·5 = 40 = 23 + 17
            ],
            statement_order: vec![2, 0, 3, 1],
            query: 2,
            values: ValueFormat::Digits,
        }
    }

    /// `min_ops`: sizes uniform in `min_ops..=ops` (seeded frequencies), every problem in its split
    /// and valid, `min_ops = ops` the stream of an unset `min_ops`, and out-of-range values refused
    /// by name.
    #[test]
    fn min_ops_mixes_sizes_uniformly() {
        let mixed = IgsmConfig {
            min_ops: Some(2),
            distractors: 0,
            seq_len: 200,
            ..cfg(4, 0)
        };
        for split in [Split::Train, Split::Eval, Split::Val] {
            let mut count = [0usize; 5];
            for i in 0..900 {
                let p = mixed.sample(3, split, i).unwrap();
                // Validation problems come from the held-out structures too.
                let part = if split.is_held_out() {
                    Split::Eval
                } else {
                    split
                };
                assert_eq!(mixed.split_of(p.structure_hash()), part);
                if split == Split::Val {
                    assert_ne!(p, mixed.sample(3, Split::Eval, i).unwrap());
                }
                assert_eq!(check(&render(&p)), Ok(p.answer()));
                count[p.ops()] += 1;
            }
            match split {
                // Uniform over 2, 3, 4 up to the training part's acceptance per size: 300 ± 100.
                Split::Train => {
                    assert_eq!(count[0] + count[1], 0, "{count:?}");
                    for k in 2..=4 {
                        assert!((200..=400).contains(&count[k]), "ops {k}: {count:?}");
                    }
                }
                // Held-out problems are of the target size only, the same as without a mixture.
                Split::Eval | Split::Val => {
                    assert_eq!(count[4], 900, "{count:?}");
                    assert_eq!(
                        mixed.sample(3, split, 7).unwrap(),
                        IgsmConfig {
                            min_ops: None,
                            ..mixed.clone()
                        }
                        .sample(3, split, 7)
                        .unwrap()
                    );
                }
            }
        }
        // min_ops = ops draws nothing extra: the same problems as without it.
        let same = IgsmConfig {
            min_ops: Some(3),
            ..cfg(3, 2)
        };
        for i in 0..20 {
            assert_eq!(
                same.sample(1, Split::Train, i).unwrap(),
                cfg(3, 2).sample(1, Split::Train, i).unwrap()
            );
        }
        // Down to one operation: both splits still sample (a size without a training template is
        // redrawn).
        let from_one = IgsmConfig {
            min_ops: Some(1),
            ..cfg(2, 0)
        };
        for split in BOTH {
            let ops: Vec<usize> = (0..200)
                .map(|i| from_one.sample(0, split, i).unwrap().ops())
                .collect();
            assert!(ops.iter().all(|&k| k == 1 || k == 2));
        }
        for bad in [0, 4] {
            let c = IgsmConfig {
                min_ops: Some(bad),
                ..cfg(3, 0)
            };
            match c.validate() {
                Err(TaskError::OutOfRange { field, .. }) => assert_eq!(field, "min_ops"),
                other => panic!("min_ops = {bad}: {other:?}"),
            }
        }
    }

    /// The doc problem with one token per value: 5 → `F`, 3 → `D`, 8 → `I`, by hand.
    #[test]
    fn letters_write_each_value_as_one_character() {
        let p = Problem {
            values: ValueFormat::Letters,
            ..doc_problem()
        };
        let text = render(&p);
        assert_eq!(text, "c=a+b;a=F;d=c*a;b=D;?c:a=F;b=D;c=a+b=F+D=I;#I.");
        assert_eq!(check_with(&text, ValueFormat::Letters), Ok(8));
        // The digit parser refuses it, and the letter parser refuses digits.
        assert!(check(&text).is_err());
        assert!(check_with(DOC_TEXT, ValueFormat::Letters).is_err());
        // A wrong result is caught as in digits: 5 + 3 = 8 (`I`), not 9 (`J`).
        let wrong = "c=a+b;a=F;d=c*a;b=D;?c:a=F;b=D;c=a+b=F+D=J;#J.";
        assert!(matches!(
            check_with(wrong, ValueFormat::Letters),
            Err(CheckError::Step { step: 3, .. })
        ));
        // The answer is the one character after `#` (text index 43): the target of position 43.
        assert_eq!(p.answer_positions(), 43..44);
        assert_eq!(&text[43..45], "#I");
        assert_eq!(ValueFormat::Letters.render(22), "W");
        assert_eq!(ValueFormat::Letters.render(0), "A");
    }

    /// Generated letter-format problems check, have the same structure and answer as the digit
    /// ones of the same seed and index, and are shorter; an uppercase alphabet is refused.
    #[test]
    fn letter_problems_match_digit_problems() {
        let digits = IgsmConfig {
            ops: 4,
            distractors: 2,
            ..IgsmConfig::default()
        };
        let letters = IgsmConfig {
            values: ValueFormat::Letters,
            ..digits.clone()
        };
        for i in 0..50 {
            let (d, l) = (
                digits.sample(3, Split::Train, i).unwrap(),
                letters.sample(3, Split::Train, i).unwrap(),
            );
            assert_eq!(d.structure_hash(), l.structure_hash());
            assert_eq!(
                check_with(&render(&l), ValueFormat::Letters),
                Ok(d.answer())
            );
            assert!(render(&l).len() <= render(&d).len());
            assert!(!render(&l).bytes().any(|c| c.is_ascii_digit()));
            let ex = letters.encode_problem(&l).unwrap();
            assert_eq!(answer_positions(&ex), Some(l.answer_positions()));
        }
        let bad = IgsmConfig {
            alphabet: "abcX".into(),
            ..letters
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("alphabet") && e.contains("lowercase"), "{e}");
    }

    const DOC_TEXT: &str = "c=a+b;a=5;d=c*a;b=3;?c:a=5;b=3;c=a+b=5+3=8;#8.";

    /// The solution steps of `p` as separate strings (each ending in `;`), written
    /// independently of `Problem::completion`.
    fn steps(p: &Problem) -> Vec<String> {
        p.solution()
            .into_iter()
            .map(|i| {
                let x = &p.quantities[i];
                match x.def {
                    Def::Leaf => format!("{}={};", x.name, x.value),
                    Def::Op { op, lhs, rhs } => {
                        let (l, r) = (&p.quantities[lhs], &p.quantities[rhs]);
                        let o = op.symbol();
                        format!(
                            "{}={}{o}{}={}{o}{}={};",
                            x.name, l.name, r.name, l.value, r.value, x.value
                        )
                    }
                }
            })
            .collect()
    }

    fn text_from(p: &Problem, steps: &[String], answer: u32) -> String {
        format!("{}{}#{answer}.", p.prompt(), steps.concat())
    }

    // ---- vocabulary and arithmetic ----

    #[test]
    fn vocabulary_round_trips() {
        assert_eq!(vocab_size(), 72);
        assert_eq!(CHARS.len() + 1, VOCAB_SIZE);
        for id in 1..VOCAB_SIZE as u32 {
            let c = decode(id).unwrap();
            assert_eq!(encode(c), Some(id), "{c:?}");
        }
        assert_eq!(encode('a'), Some(1));
        assert_eq!(encode('Z'), Some(52));
        assert_eq!(encode('0'), Some(53));
        assert_eq!(encode('9'), Some(62));
        assert_eq!(encode('='), Some(63));
        assert_eq!(encode('#'), Some(70));
        assert_eq!(encode('.'), Some(71));
        assert_eq!(encode(' '), None);
        assert_eq!(encode(','), None);
        assert_eq!(decode(PAD), None);
        assert_eq!(decode(72), None);
        let ids = encode_str(DOC_TEXT).unwrap();
        assert_eq!(decode_ids(&ids).unwrap(), DOC_TEXT);
        assert_eq!(encode_str("a b"), None);
    }

    #[test]
    fn op_arithmetic_mod_23() {
        assert_eq!(Op::Add.apply(22, 22), 21);
        assert_eq!(Op::Add.apply(0, 0), 0);
        assert_eq!(Op::Sub.apply(0, 1), 22);
        assert_eq!(Op::Sub.apply(5, 5), 0);
        assert_eq!(Op::Sub.apply(21, 20), 1);
        assert_eq!(Op::Mul.apply(22, 22), 1); // (−1)² = 1
        assert_eq!(Op::Mul.apply(13, 21), 20); // 273 = 11·23 + 20
        for o in Op::ALL {
            assert_eq!(Op::from_symbol(o.symbol()), Some(o));
            for a in 0..23 {
                for b in 0..23 {
                    assert!(o.apply(a, b) < 23);
                }
            }
        }
        assert_eq!(Op::from_symbol('/'), None);
    }

    // ---- hand-made problem ----

    #[test]
    fn doc_problem_renders_checks_and_lays_out() {
        let p = doc_problem();
        assert_eq!(p.prompt(), "c=a+b;a=5;d=c*a;b=3;?c:");
        assert_eq!(p.completion(), "a=5;b=3;c=a+b=5+3=8;#8.");
        assert_eq!(render(&p), DOC_TEXT);
        assert_eq!(p.solution(), vec![0, 1, 2]);
        assert_eq!(p.ops(), 1);
        assert_eq!(p.answer(), 8);
        assert_eq!(check(DOC_TEXT), Ok(8));
        // '#' is character 43 (23-character prompt + 20), so the answer digit is target[43].
        assert_eq!(DOC_TEXT.len(), 46);
        assert_eq!(DOC_TEXT.find('#'), Some(43));
        assert_eq!(p.answer_positions(), 43..44);

        let c = IgsmConfig::default();
        let ex = c.encode_problem(&p).unwrap();
        assert_eq!(ex.input.len(), 512);
        assert_eq!(decode_ids(&ex.input).unwrap(), DOC_TEXT);
        assert_eq!(ex.input[0], encode('c').unwrap());
        assert_eq!(ex.target[0], encode('=').unwrap());
        // Scored: t = 22 (input ':', target 'a') ..= 44 (input '8', target '.').
        let scored: Vec<usize> = (0..512).filter(|&t| ex.mask[t]).collect();
        assert_eq!(scored, (22..45).collect::<Vec<_>>());
        assert_eq!(ex.n_scored(), p.completion().len());
        assert_eq!(decode(ex.input[22]), Some(':'));
        assert_eq!(decode(ex.target[22]), Some('a'));
        assert_eq!(decode(ex.target[44]), Some('.'));
        assert_eq!(ex.target[45], PAD);
        assert!(ex.input[46..].iter().all(|&id| id == PAD));
        assert_eq!(answer_positions(&ex), Some(43..44));
        assert_eq!(decode(ex.target[43]), Some('8'));

        // A two-digit answer: ask for d = 17 instead.
        let mut p2 = p.clone();
        p2.query = 3;
        let t2 = render(&p2);
        assert_eq!(
            t2,
            "c=a+b;a=5;d=c*a;b=3;?d:a=5;b=3;c=a+b=5+3=8;d=c*a=8*5=17;#17."
        );
        assert_eq!(check(&t2), Ok(17));
        assert_eq!(p2.ops(), 2);
        let ex2 = c.encode_problem(&p2).unwrap();
        let r = answer_positions(&ex2).unwrap();
        assert_eq!(r, p2.answer_positions());
        assert_eq!(r.len(), 2);
        let digits: String = r.map(|t| decode(ex2.target[t]).unwrap()).collect();
        assert_eq!(digits, "17");
    }

    // ---- generated problems ----

    fn configs() -> Vec<IgsmConfig> {
        let mut out = vec![
            cfg(2, 0),
            IgsmConfig {
                alphabet: "xyz".into(),
                name_len: 2,
                ..cfg(3, 2)
            },
            cfg(4, 4),
            IgsmConfig {
                alphabet: AZ_BOTH.into(),
                ..cfg(8, 8)
            },
            cfg(10, 5),
            IgsmConfig {
                name_len: 2,
                seq_len: 2000,
                ..cfg(20, 3)
            },
        ];
        for c in &mut out {
            c.seq_len = c.seq_len.max(c.min_seq_len());
        }
        out
    }

    /// Every structural property of one generated problem.
    fn check_problem(c: &IgsmConfig, split: Split, p: &Problem) {
        let text = render(p);
        assert_eq!(check(&text), Ok(p.answer()), "{text}");
        assert_eq!(p.ops(), c.ops, "{text}");
        assert!(text.len() <= c.min_seq_len(), "{text}");
        assert_eq!(c.split_of(p.structure_hash()), split);
        let sol = p.solution();
        assert_eq!(*sol.last().unwrap(), p.query);
        let leaves = sol
            .iter()
            .filter(|&&i| p.quantities[i].def == Def::Leaf)
            .count();
        assert!((2..=c.ops + 1).contains(&leaves), "{leaves} leaves");
        assert_eq!(p.quantities.len(), sol.len() + c.distractors);
        let mut order = p.statement_order.clone();
        order.sort_unstable();
        assert_eq!(order, (0..p.quantities.len()).collect::<Vec<_>>());
        let names: HashSet<&str> = p.quantities.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names.len(), p.quantities.len());
        for x in &p.quantities {
            assert_eq!(x.name.chars().count(), c.name_len);
            assert!(x.name.chars().all(|ch| c.alphabet.contains(ch)));
            assert!(x.value < MODULUS);
        }
        for (i, x) in p.quantities.iter().enumerate() {
            if let Def::Op { op, lhs, rhs } = x.def {
                assert!(lhs < i && rhs < i && lhs != rhs);
                let want = op.apply(p.quantities[lhs].value, p.quantities[rhs].value);
                assert_eq!(x.value, want);
            }
        }
        // The example encodes exactly this text.
        let ex = c.encode_problem(p).unwrap();
        assert_eq!(decode_ids(&ex.input).unwrap(), text);
        assert_eq!(ex.n_scored(), p.completion().len());
        let r = answer_positions(&ex).unwrap();
        assert_eq!(r, p.answer_positions());
        let digits: String = r.map(|t| decode(ex.target[t]).unwrap()).collect();
        assert_eq!(digits, p.answer().to_string());
    }

    #[test]
    fn generated_problems_verify() {
        let mut n = 0;
        for c in configs() {
            c.validate().unwrap();
            for split in BOTH {
                for index in 0..60 {
                    let p = c.sample(5, split, index).unwrap();
                    check_problem(&c, split, &p);
                    assert_eq!(
                        c.example(5, split, index).unwrap(),
                        c.encode_problem(&p).unwrap()
                    );
                    n += 1;
                }
            }
        }
        assert_eq!(n, 720);
    }

    #[test]
    fn ops_is_exact_counted_from_the_text() {
        for ops in 1..=MAX_OPS {
            let c = IgsmConfig {
                alphabet: AZ_BOTH.into(),
                seq_len: 2000,
                ..cfg(ops, 3)
            };
            for index in 0..20 {
                let p = c.sample(11, Split::Train, index).unwrap();
                let text = render(&p);
                // Count solution steps with an operator: the ones holding three '='.
                let completion = &text[text.find(':').unwrap() + 1..text.find('#').unwrap()];
                let op_steps = completion
                    .split_terminator(';')
                    .filter(|s| s.matches('=').count() == 3)
                    .count();
                assert_eq!(op_steps, ops, "{text}");
                assert_eq!(p.ops(), ops);
            }
        }
    }

    #[test]
    fn leaf_count_reaches_both_bounds() {
        let c = cfg(3, 0);
        let mut seen = [0usize; 5];
        for index in 0..300 {
            let p = c.sample(2, Split::Train, index).unwrap();
            seen[p.quantities.len() - 3] += 1; // 3 ops + L leaves, L in 2..=4
        }
        assert_eq!(seen[..2], [0, 0]);
        assert!(seen[2..].iter().all(|&k| k > 60), "{seen:?}");
    }

    #[test]
    fn corrupted_steps_and_answers_fail() {
        let mut checked = 0;
        for c in [cfg(3, 3), cfg(6, 2)] {
            for index in 0..25 {
                let p = c.sample(3, Split::Train, index).unwrap();
                let good = steps(&p);
                assert_eq!(text_from(&p, &good, p.answer()), render(&p));
                let sol = p.solution();
                for (k, &i) in sol.iter().enumerate() {
                    let x = &p.quantities[i];
                    // Wrong result (or wrong restated leaf value).
                    let wrong = (x.value + 1) % MODULUS;
                    let mut s = good.clone();
                    let cut = s[k].rfind('=').unwrap();
                    s[k] = format!("{}{wrong};", &s[k][..=cut]);
                    let e = check(&text_from(&p, &s, p.answer())).unwrap_err();
                    assert!(
                        matches!(&e, CheckError::Step { step, name, .. } if *step == k + 1 && *name == x.name),
                        "{e}"
                    );
                    if let Def::Op { op, lhs, rhs } = x.def {
                        // Wrong substituted operand value.
                        let (l, r) = (&p.quantities[lhs], &p.quantities[rhs]);
                        let o = op.symbol();
                        let mut s = good.clone();
                        s[k] = format!(
                            "{}={}{o}{}={}{o}{}={};",
                            x.name,
                            l.name,
                            r.name,
                            (l.value + 5) % MODULUS,
                            r.value,
                            x.value
                        );
                        let e = check(&text_from(&p, &s, p.answer())).unwrap_err();
                        assert!(matches!(e, CheckError::Step { step, .. } if step == k + 1));
                        // Dropping the step: a later step uses it, or the question needs it.
                        let mut s = good.clone();
                        s.remove(k);
                        assert!(check(&text_from(&p, &s, p.answer())).is_err());
                    }
                    checked += 1;
                }
                // Wrong answer.
                let wrong = (p.answer() + 7) % MODULUS;
                assert_eq!(
                    check(&text_from(&p, &good, wrong)),
                    Err(CheckError::Answer {
                        name: p.quantities[p.query].name.clone(),
                        expected: p.answer(),
                        got: wrong
                    })
                );
                // The question's step moved first: its operands are not computed yet.
                let mut s = good.clone();
                let last = s.pop().unwrap();
                s.insert(0, last);
                let e = check(&text_from(&p, &s, p.answer())).unwrap_err();
                assert!(
                    matches!(&e, CheckError::Step { step: 1, message, .. } if message.contains("before its step")),
                    "{e}"
                );
                // A distractor step is not needed.
                let needed: HashSet<usize> = sol.iter().copied().collect();
                let d = (0..p.quantities.len())
                    .find(|i| !needed.contains(i))
                    .unwrap();
                let mut s = good.clone();
                s.insert(0, format!("{}=0;", p.quantities[d].name));
                let e = check(&text_from(&p, &s, p.answer())).unwrap_err();
                assert!(
                    matches!(&e, CheckError::Step { step: 1, message, .. } if message.starts_with("not needed")),
                    "{e}"
                );
            }
        }
        assert!(checked > 300, "{checked}");
    }

    #[test]
    fn checker_messages_are_one_line_and_precise() {
        let cases: &[(&str, &str)] = &[
            (
                "a=5;b=3;c=a+b;?c:a=5;b=3;c=a+b=5+3=9;#9.",
                "step 3 (`c`): 5+3 = 8 (mod 23), not 9",
            ),
            (
                "a=5;b=3;c=a+b;?c:a=5;b=4;c=a+b=5+4=9;#9.",
                "step 2 (`b`): given as 3, not 4",
            ),
            (
                "a=5;b=3;c=a-b;?c:a=5;b=3;c=a+b=5+3=8;#8.",
                "step 3 (`c`): the statement is a-b, not a+b",
            ),
            (
                "a=5;b=3;c=a+b;?c:a=5;b=3;c=a+b=5+2=7;#7.",
                "step 3 (`c`): operands are a = 5 and b = 3, not 5 and 2",
            ),
            (
                "a=5;b=3;c=a+b;?c:a=5;b=3;c=a+b=5-3=2;#2.",
                "step 3 (`c`): substitutes with `-` instead of `+`",
            ),
            (
                "a=5;b=3;c=a+b;?c:a=5;c=a+b=5+3=8;#8.",
                "step 2 (`c`): operand `b` is used before its step",
            ),
            (
                "a=5;b=3;c=a+b;?c:a=5;a=5;b=3;c=a+b=5+3=8;#8.",
                "step 2 (`a`): computed a second time",
            ),
            (
                "a=5;b=3;c=a+b;?c:a=5;b=3;c=a+b=5+3=8;#9.",
                "answer 9 is wrong: `c` = 8",
            ),
            (
                "a=5;b=3;c=a+b;?c:a=5;b=3;#8.",
                "the solution never computes `c`, which the question needs",
            ),
            (
                "a=5;b=3;c=a+b;?c:a=5;b=3;z=1;#8.",
                "step 3 (`z`): no statement defines this name",
            ),
            (
                "a=5;a=3;c=a+a;?c:#6.",
                "bad problem: `a` is defined more than once",
            ),
            (
                "a=5;c=a+b;?c:#6.",
                "bad problem: `c` uses `b`, which is not defined",
            ),
            (
                "a=5;?z:#5.",
                "bad problem: the question uses `z`, which is not defined",
            ),
            (
                "a=b+c;b=a+c;c=1;?a:#1.",
                "bad problem: the definitions are cyclic (through `a`)",
            ),
            (
                "a=a+c;c=1;?a:#1.",
                "bad problem: the definitions are cyclic (through `a`)",
            ),
            (
                "a=25;?a:a=25;#25.",
                "syntax error at character 2: value `25` is not a number in 0..=22 without leading zeros",
            ),
            (
                "a=05;?a:a=5;#5.",
                "syntax error at character 2: value `05` is not a number in 0..=22 without leading zeros",
            ),
            (
                "a=5?a:a=5;#5.",
                "syntax error at character 3: expected `;`, found `?`",
            ),
            (
                "a=5;?a:a=5;#5",
                "syntax error at character 13: expected `.`, found end of text",
            ),
            (
                "a=5;?a:a=5;#5.x",
                "syntax error at character 14: expected end of text, found `x`",
            ),
            (
                "a=5; ?a:a=5;#5.",
                "syntax error at character 4: expected a name, found byte 0x20",
            ),
            (
                "a=b/c;?a:",
                "syntax error at character 3: expected an operator `+`, `-` or `*`, found `/`",
            ),
            (
                "?a:#1.",
                "syntax error at character 0: expected a name, found `?`",
            ),
            (
                "",
                "syntax error at character 0: expected a name, found end of text",
            ),
        ];
        for (text, want) in cases {
            let e = check(text).unwrap_err().to_string();
            assert_eq!(&e, want, "{text}");
            assert!(!e.contains('\n'));
        }
        // Another topological order than the generator's is accepted.
        assert_eq!(check("a=5;b=3;c=a+b;?c:b=3;a=5;c=a+b=5+3=8;#8."), Ok(8));
        assert_eq!(check(DOC_TEXT), Ok(8));
    }

    // ---- split by structure ----

    #[test]
    fn split_is_disjoint_by_structure_hash() {
        for ops in 2..=10 {
            let c = cfg(ops, 2);
            let hashes = |split: Split| -> HashSet<u64> {
                (0..80)
                    .map(|i| {
                        let p = c.sample(ops as u64, split, i).unwrap();
                        let h = p.structure_hash();
                        assert_eq!(c.split_of(h), split);
                        h
                    })
                    .collect()
            };
            let (train, eval) = (hashes(Split::Train), hashes(Split::Eval));
            assert!(train.is_disjoint(&eval), "ops = {ops}");
            // Another seed's train templates are also never eval templates.
            let other: HashSet<u64> = (0..80)
                .map(|i| c.sample(999, Split::Train, i).unwrap().structure_hash())
                .collect();
            assert!(other.is_disjoint(&eval), "ops = {ops}");
            if ops >= 4 {
                assert!(train.len() > 40 && eval.len() > 40, "ops = {ops}");
            }
        }
    }

    #[test]
    fn structure_hash_ignores_names_values_order_and_distractors() {
        let a = doc_problem();
        // Same solution structure (c = leaf + leaf), relabelled: the leaves are at other
        // indices, the sum is commuted, other values and names, more distractors, another
        // statement order.
        let b = Problem {
            quantities: vec![
                q("x", Def::Leaf, 1),
                q("p", Def::Leaf, 9),
                q("y", op(Op::Sub, 0, 1), 15),
                q("k", Def::Leaf, 2),
                q("m", op(Op::Add, 3, 1), 11),
            ],
            statement_order: vec![4, 3, 2, 1, 0],
            query: 4,
            values: ValueFormat::Digits,
        };
        assert_eq!(check(&render(&b)), Ok(11));
        assert_eq!(a.structure_hash(), b.structure_hash());
        // a − b and b − a (leaves swapped) are the same template.
        let sub =
            |l: usize, r: usize| structure_hash(&[Def::Leaf, Def::Leaf, op(Op::Sub, l, r)], 2);
        assert_eq!(sub(0, 1), sub(1, 0));
        // Operators matter.
        let one = |o: Op| structure_hash(&[Def::Leaf, Def::Leaf, op(o, 0, 1)], 2);
        let hs: HashSet<u64> = Op::ALL.iter().map(|&o| one(o)).collect();
        assert_eq!(hs.len(), 3);
        // (a − b)·a and (a − b)·b differ (which side of the difference is reused), as do
        // (a − b)·a and (a − b)·c (reuse or a new leaf).
        let d = |third: Def| {
            let mut defs = vec![Def::Leaf, Def::Leaf, op(Op::Sub, 0, 1), Def::Leaf];
            defs.push(third);
            structure_hash(&defs, 4)
        };
        let reuse_a = d(op(Op::Mul, 2, 0));
        let reuse_b = d(op(Op::Mul, 2, 1));
        let fresh = d(op(Op::Mul, 2, 3));
        assert_ne!(reuse_a, reuse_b);
        assert_ne!(reuse_a, fresh);
        assert_ne!(reuse_b, fresh);
        // Commuting the product does not matter.
        assert_eq!(reuse_a, d(op(Op::Mul, 0, 2)));
        // Pinned value (catches an accidental change of the hash, which would move templates
        // between the splits).
        assert_eq!(a.structure_hash(), PINNED_ADD_HASH);
    }

    const PINNED_ADD_HASH: u64 = 7326496547867071358;

    #[test]
    fn ops_one_has_templates_in_train_only() {
        // The three templates a+b, a−b, a·b all fall in the train part with the default
        // eval_fraction, so the eval part is empty (a one-line error, not a hang).
        let c = cfg(1, 0);
        let hs: HashSet<u64> = (0..50)
            .map(|i| c.sample(0, Split::Train, i).unwrap().structure_hash())
            .collect();
        assert_eq!(hs.len(), 3);
        let e = c.sample(0, Split::Eval, 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "ops is invalid: no solution structure with ops = 1 fell in the eval part (eval_fraction = 0.25) in 10000 draws; use more ops"
        );
    }

    // ---- distribution sanity ----

    #[test]
    fn statements_shuffled_values_and_ops_cover_their_ranges() {
        let c = cfg(5, 4);
        let mut forward_refs = 0;
        let mut query_last = 0;
        let mut leaf_values = [0usize; 23];
        let mut answers = [0usize; 23];
        let mut op_counts = [0usize; 3];
        for index in 0..300 {
            let p = c.sample(21, Split::Train, index).unwrap();
            // A forward reference: a statement uses a name whose statement comes later.
            let pos: Vec<usize> = {
                let mut pos = vec![0; p.quantities.len()];
                for (k, &i) in p.statement_order.iter().enumerate() {
                    pos[i] = k;
                }
                pos
            };
            if p.quantities.iter().enumerate().any(|(i, x)| {
                matches!(x.def, Def::Op { lhs, rhs, .. } if pos[lhs] > pos[i] || pos[rhs] > pos[i])
            }) {
                forward_refs += 1;
            }
            if *p.statement_order.last().unwrap() == p.query {
                query_last += 1;
            }
            for x in &p.quantities {
                match x.def {
                    Def::Leaf => leaf_values[x.value as usize] += 1,
                    Def::Op { op, .. } => {
                        op_counts[Op::ALL.iter().position(|&o| o == op).unwrap()] += 1
                    }
                }
            }
            answers[p.answer() as usize] += 1;
        }
        assert!(forward_refs > 250, "{forward_refs}");
        assert!(query_last < 60, "{query_last}");
        assert!(leaf_values.iter().all(|&k| k > 20), "{leaf_values:?}");
        assert!(answers.iter().all(|&k| k > 0), "{answers:?}");
        // ≈ 300 · (5 + 2) ops, a third each.
        assert!(
            op_counts.iter().all(|&k| (550..850).contains(&k)),
            "{op_counts:?}"
        );
    }

    // ---- determinism ----

    #[test]
    fn deterministic_and_pinned() {
        let c = IgsmConfig::default();
        let a = c.sample(42, Split::Train, 9).unwrap();
        assert_eq!(a, c.sample(42, Split::Train, 9).unwrap());
        assert_eq!(
            c.example(42, Split::Eval, 9).unwrap(),
            c.example(42, Split::Eval, 9).unwrap()
        );
        assert_ne!(render(&a), render(&c.sample(42, Split::Train, 10).unwrap()));
        assert_ne!(render(&a), render(&c.sample(43, Split::Train, 9).unwrap()));
        assert_eq!(render(&c.sample(0, Split::Train, 0).unwrap()), PINNED_TRAIN);
        assert_eq!(render(&c.sample(0, Split::Eval, 0).unwrap()), PINNED_EVAL);
    }

    const PINNED_TRAIN: &str = "d=g+v;v=13;g=o-q;r=11;h=l*g;a=18;z=2;o=21;q=v*o;l=v+o;?h:v=13;o=21;l=v+o=13+21=11;q=v*o=13*21=20;g=o-q=21-20=1;h=l*g=11*1=11;#11.";
    const PINNED_EVAL: &str = "j=r*y;v=e*r;y=16;u=c-t;k=z-t;z=g-e;r=a-z;c=0;t=18;a=t+y;g=6;e=13;?v:e=13;t=18;y=16;a=t+y=18+16=11;g=6;z=g-e=6-13=16;r=a-z=11-16=18;v=e*r=13*18=4;#4.";

    #[test]
    fn batch_equals_individual_examples() {
        let c = cfg(3, 1);
        let batch = c.batch(8, Split::Eval, 100, 4).unwrap();
        assert_eq!(batch.len(), 4);
        for (i, ex) in batch.iter().enumerate() {
            assert_eq!(*ex, c.example(8, Split::Eval, 100 + i as u64).unwrap());
        }
        assert!(c.batch(8, Split::Eval, 100, 0).unwrap().is_empty());
        assert!(c.example(0, Split::Train, MAX_INDEX).is_ok());
        let e = c.example(0, Split::Train, MAX_INDEX + 1).unwrap_err();
        assert!(
            matches!(e, TaskError::OutOfRange { field: "index", .. }),
            "{e}"
        );
        let e = c.batch(0, Split::Train, MAX_INDEX - 1, 3).unwrap_err();
        assert!(
            matches!(e, TaskError::Invalid { field: "batch", .. }),
            "{e}"
        );
    }

    // ---- validation ----

    fn err(c: &IgsmConfig) -> String {
        let e = c.validate().unwrap_err();
        assert_eq!(c.sample(0, Split::Train, 0).unwrap_err(), e);
        assert_eq!(c.example(0, Split::Train, 0).unwrap_err(), e);
        assert_eq!(c.batch(0, Split::Train, 0, 2).unwrap_err(), e);
        assert_eq!(c.encode_problem(&doc_problem()).unwrap_err(), e);
        let s = e.to_string();
        assert!(!s.contains('\n'));
        s
    }

    #[test]
    fn default_config_and_min_seq_len() {
        let c = IgsmConfig::default();
        assert!(c.validate().is_ok());
        assert_eq!(c.max_quantities(), 13);
        // (4 + 4)·6 + 2·5·5 + 3 + 4·15 + 4 = 48 + 50 + 3 + 60 + 4.
        assert_eq!(c.min_seq_len(), 165);
        assert_eq!(
            IgsmConfig {
                alphabet: AZ_BOTH.into(),
                ..cfg(10, 10)
            }
            .min_seq_len(),
            387
        );
        // The bound is reached: 2-digit values everywhere, all distractors operations.
        let mut p = Problem {
            quantities: vec![
                q("a", Def::Leaf, 10),
                q("b", Def::Leaf, 11),
                q("c", op(Op::Add, 0, 1), 21),
                q("d", op(Op::Add, 0, 1), 21),
            ],
            statement_order: vec![0, 1, 2, 3],
            query: 2,
            values: ValueFormat::Digits,
        };
        let tight = IgsmConfig {
            seq_len: 0,
            ..cfg(1, 1)
        };
        assert_eq!(render(&p).len(), tight.min_seq_len());
        p.quantities[3] = q("d", Def::Leaf, 10);
        assert!(render(&p).len() < tight.min_seq_len());
    }

    #[test]
    fn validation_errors_name_the_field() {
        assert_eq!(
            err(&cfg(0, 0)),
            "ops = 0 is out of range: must be in 1..=20"
        );
        assert_eq!(
            err(&cfg(21, 0)),
            "ops = 21 is out of range: must be in 1..=20"
        );
        assert_eq!(
            err(&cfg(4, 41)),
            "distractors = 41 is out of range: must be in 0..=40"
        );
        let with = |alphabet: &str, name_len: usize| IgsmConfig {
            alphabet: alphabet.into(),
            name_len,
            ..cfg(4, 4)
        };
        assert_eq!(
            err(&with("", 1)),
            "alphabet is invalid: must hold at least one letter"
        );
        assert_eq!(
            err(&with("ab1", 1)),
            "alphabet is invalid: '1' is not a letter a-z or A-Z (names are letters only)"
        );
        assert_eq!(
            err(&with("aba", 1)),
            "alphabet is invalid: 'a' appears more than once"
        );
        assert_eq!(
            err(&with(AZ, 0)),
            "name_len = 0 is out of range: must be in 1..=4"
        );
        assert_eq!(
            err(&with(AZ, 5)),
            "name_len = 5 is out of range: must be in 1..=4"
        );
        // 13 quantities: 4 letters need names of 2 characters.
        assert_eq!(
            err(&with("abcd", 1)),
            "name_len = 1 is out of range: must be in 2..=4 (alphabet, ops, distractors)"
        );
        assert!(with("abcd", 2).validate().is_ok());
        assert_eq!(
            err(&with("a", 4)),
            "alphabet is invalid: 1 letters give fewer than the 13 names ops = 4 and distractors = 4 may need"
        );
        for (x, shown) in [(0.0, "0"), (1.0, "1"), (f64::NAN, "NaN"), (-0.5, "-0.5")] {
            let c = IgsmConfig {
                eval_fraction: x,
                ..cfg(4, 4)
            };
            assert_eq!(
                err(&c),
                format!("eval_fraction = {shown} is out of range: must be in 0.0 < x < 1.0")
            );
        }
        let c = IgsmConfig {
            seq_len: 164,
            ..cfg(4, 4)
        };
        assert_eq!(
            err(&c),
            "seq_len = 164 is out of range: must be in 165.. (ops, distractors, name_len)"
        );
        assert!(
            IgsmConfig {
                seq_len: 165,
                ..cfg(4, 4)
            }
            .validate()
            .is_ok()
        );
    }

    #[test]
    fn encode_problem_rejects_wrong_problems() {
        let c = IgsmConfig::default();
        let mut p = doc_problem();
        p.quantities[2].value = 9;
        assert_eq!(
            c.encode_problem(&p).unwrap_err().to_string(),
            "problem is invalid: \"c=a+b;a=5;d=c*a;b=3;?c:a=5;b=3;c=a+b=5+3=9;#9.\" fails the check: step 3 (`c`): 5+3 = 8 (mod 23), not 9"
        );
        // A 2-operation problem (60 characters) does not fit a 1-operation config.
        let short = IgsmConfig {
            ops: 1,
            distractors: 0,
            seq_len: 48,
            ..IgsmConfig::default()
        };
        assert_eq!(short.min_seq_len(), 48);
        assert!(short.encode_problem(&doc_problem()).is_ok());
        let mut p2 = doc_problem();
        p2.query = 3;
        assert_eq!(
            short.encode_problem(&p2).unwrap_err().to_string(),
            "problem is invalid: text is 60 tokens, longer than seq_len = 48"
        );
    }
}
