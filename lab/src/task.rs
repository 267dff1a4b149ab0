//! A run's task as one unit (SCIENCE.md §2): its kind and its own parameters, one registry line
//! per task.
//!
//! Each task's parameters are its own type in its file of the `tasks` crate
//! ([`tasks::block::BlockParams`], [`tasks::indirect::IndirectParams`], …), so a run holds only
//! the parameters its task has: a block run has no `ops`, an iGSM run no `block_len`. In memory
//! and in a run's canonical JSON (its identity) they form the `task` section,
//! `{"kind": "block", "variant": "copy", "block_len": 8, "noise": 0.0}`; sweep files and
//! `--set` keep writing them as flat keys beside `task = "block"` ([`nest_task_fields`] moves
//! them into the section), and a parameter of another task is refused by name.
//!
//! A new task: its generator and parameter type in `tasks/src/<task>.rs`, one line in
//! [`task_registry!`](crate::task) below, and its arms in [`TaskConfig::generator`] (the
//! generator's constructor), [`TaskConfig::dep_width`] and `lab gen` ([`crate::generate`]);
//! the compiler lists every match that lacks it.

use serde::{Deserialize, Serialize};
use tasks::block::BlockParams;
use tasks::igsm::IgsmParams;
use tasks::indirect::IndirectParams;
use tasks::needle::NeedleParams;
use tasks::text::TextParams;
use tasks::{Example, Split, TaskError};

/// Fraction of a corpus's token stream (its end) held out for evaluation (the test part).
pub const CORPUS_EVAL_FRACTION: f64 = 0.1;

/// Fraction of a corpus's token stream just before the test part held out for validation
/// (docs/analysis-rules.md R58, from 2026-12-07; before, the training part reached the test
/// part, and corpus run ids carry the change: [`crate::config::RunConfig::run_id`]).
pub const CORPUS_VAL_FRACTION: f64 = 0.05;

macro_rules! task_registry {
    ($( $(#[$doc:meta])* $variant:ident($params:ty) = $name:literal; )*) => {
        /// Task family of a run (serialised by its name).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum TaskKind {
            $($(#[$doc])* #[serde(rename = $name)] $variant,)*
        }

        impl TaskKind {
            /// Every task, in registry order.
            pub const ALL: &[TaskKind] = &[$(TaskKind::$variant,)*];
            /// Their names, in registry order.
            pub const NAMES: &[&str] = &[$($name,)*];

            /// The task's name in configs and tables.
            pub fn name(self) -> &'static str {
                match self {
                    $(TaskKind::$variant => $name,)*
                }
            }

            /// The task's own parameter names (its section's keys besides `kind`).
            pub fn params(self) -> &'static [&'static str] {
                match self {
                    $(TaskKind::$variant => <$params>::NAMES,)*
                }
            }

            /// The task named `name`.
            pub fn from_name(name: &str) -> Option<TaskKind> {
                match name {
                    $($name => Some(TaskKind::$variant),)*
                    _ => None,
                }
            }
        }

        /// A run's task and its own parameters, tagged by `kind` (see the [module docs](self)).
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "kind")]
        pub enum TaskConfig {
            $($(#[$doc])* #[serde(rename = $name)] $variant($params),)*
        }

        impl TaskConfig {
            /// Which task this is.
            pub fn kind(&self) -> TaskKind {
                match self {
                    $(TaskConfig::$variant(_) => TaskKind::$variant,)*
                }
            }
        }
    };
}

task_registry! {
    /// Block-structured sequences of width `B` (`variant`, `block_len`, `noise`).
    Block(BlockParams) = "block";
    /// Indirect indexing (PoPE's diagnostic: `min_letters`, `max_letters`, `max_shift`); the
    /// run's `vocab_size` must cover the task's character vocabulary.
    Indirect(IndirectParams) = "indirect";
    /// iGSM-style modular arithmetic (`ops`, `distractors`). Loss and (teacher-forced) accuracy
    /// on the whole solution; the sweep runner adds the answer accuracy of greedy-decoded
    /// solutions (`answer_accuracy`, [`crate::decode`]).
    Igsm(IgsmParams) = "igsm";
    /// Needle retrieval (`needle_depth`, `key_len`, `value_len`, `haystack`); loss and accuracy
    /// on the value tokens.
    Needle(NeedleParams) = "needle";
    /// Language modelling on a real corpus (`corpus`, `granularity`): windows of the corpus's
    /// token stream from `data/` (or `$LAB_DATA_DIR`), the last [`CORPUS_EVAL_FRACTION`] held
    /// out; every position scored. `vocab_size` must cover the granularity's vocabulary.
    Corpus(TextParams) = "corpus";
}

impl std::fmt::Display for TaskKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A run's data generator.
#[derive(Clone, Debug, PartialEq)]
pub enum TaskGen {
    /// Block task.
    Block(tasks::block::BlockConfig),
    /// Indirect indexing.
    Indirect(tasks::indirect::IndirectConfig),
    /// iGSM arithmetic.
    Igsm(tasks::igsm::IgsmConfig),
    /// Needle retrieval.
    Needle(tasks::needle::NeedleConfig),
    /// Corpus language modelling.
    Corpus(tasks::text::TextConfig),
}

impl TaskGen {
    /// Examples `index0..index0+n` of `split` for `seed` (see the `tasks` crate).
    ///
    /// # Errors
    /// The generator's [`TaskError`] (a bad parameter, a missing corpus).
    pub fn batch(
        &self,
        seed: u64,
        split: Split,
        index0: u64,
        n: usize,
    ) -> Result<Vec<Example>, TaskError> {
        match self {
            TaskGen::Block(c) => c.batch(seed, split, index0, n),
            TaskGen::Indirect(c) => c.batch(seed, split, index0, n),
            TaskGen::Igsm(c) => c.batch(seed, split, index0, n),
            TaskGen::Needle(c) => c.batch(seed, split, index0, n),
            TaskGen::Corpus(c) => c.batch(seed, split, index0, n),
        }
    }

    /// Smallest vocabulary the task's token ids fit in (`None`: set by `vocab_size` itself).
    pub fn vocab_needed(&self) -> Option<usize> {
        match self {
            TaskGen::Block(_) => None,
            TaskGen::Indirect(_) => Some(tasks::indirect::vocab_size()),
            TaskGen::Igsm(_) => Some(tasks::igsm::vocab_size()),
            TaskGen::Needle(_) => Some(tasks::needle::vocab_size()),
            TaskGen::Corpus(c) => c.vocab_size().ok(),
        }
    }

    /// The token that pads a context, for the tasks whose contexts are padded: iGSM and
    /// indirect indexing right-pad every example with their `PAD` (id 0, no character) after its
    /// text. `None` where every input position holds a token of the example (block, needle,
    /// corpus). The frequency probe leaves pad positions out ([`crate::probe`]).
    pub fn pad_token(&self) -> Option<u32> {
        match self {
            TaskGen::Indirect(_) => Some(tasks::indirect::PAD),
            TaskGen::Igsm(_) => Some(tasks::igsm::PAD),
            TaskGen::Block(_) | TaskGen::Needle(_) | TaskGen::Corpus(_) => None,
        }
    }

    /// Which input positions of `examples` hold a token of their example, row-major
    /// `[examples.len(), seq_len]` (`false` at padding, [`TaskGen::pad_token`]); `None` when
    /// the task does not pad.
    pub fn real_positions(&self, examples: &[Example]) -> Option<Vec<bool>> {
        let pad = self.pad_token()?;
        Some(
            examples
                .iter()
                .flat_map(|e| e.input.iter().map(move |&t| t != pad))
                .collect(),
        )
    }

    /// Validate the generator's own parameters.
    ///
    /// # Errors
    /// [`TaskError`] naming the first bad parameter and its allowed range.
    pub fn validate(&self) -> Result<(), TaskError> {
        match self {
            TaskGen::Block(c) => c.validate(),
            TaskGen::Indirect(c) => c.validate(),
            TaskGen::Igsm(c) => c.validate(),
            TaskGen::Needle(c) => c.validate(),
            TaskGen::Corpus(c) => c.validate(),
        }
    }
}

impl TaskConfig {
    /// The data generator of a run with `vocab_size` tokens and context `seq_len`.
    pub fn generator(&self, vocab_size: usize, seq_len: usize) -> TaskGen {
        match self {
            TaskConfig::Block(p) => TaskGen::Block(p.config(vocab_size, seq_len)),
            TaskConfig::Indirect(p) => TaskGen::Indirect(p.config(seq_len)),
            TaskConfig::Igsm(p) => TaskGen::Igsm(p.config(seq_len)),
            TaskConfig::Needle(p) => TaskGen::Needle(p.config(seq_len)),
            TaskConfig::Corpus(p) => {
                TaskGen::Corpus(p.config(seq_len, CORPUS_EVAL_FRACTION, CORPUS_VAL_FRACTION))
            }
        }
    }

    /// Dependency width `W` of the data in tokens (SCIENCE.md §2) for context `seq_len`, when
    /// the task's parameters set it: `B` for the block task; indirect indexing: the source
    /// string's length bound `max_letters`; iGSM: the longest problem (statements + solution),
    /// which grows with `ops`; needle: `seq_len` (the answer is copied from anywhere). `None`
    /// for a corpus, whose width is measured from its data
    /// ([`RunConfig::dep_width`](crate::config::RunConfig::dep_width)).
    pub fn dep_width(&self, vocab_size: usize, seq_len: usize) -> Option<usize> {
        match self {
            TaskConfig::Block(p) => Some(p.config(vocab_size, seq_len).dep_width()),
            TaskConfig::Indirect(p) => Some(p.max_letters),
            TaskConfig::Igsm(p) => Some(p.config(seq_len).min_seq_len()),
            TaskConfig::Needle(_) => Some(seq_len),
            TaskConfig::Corpus(_) => None,
        }
    }

    /// The corpus task's parameters, when this is the corpus task.
    pub fn corpus(&self) -> Option<&TextParams> {
        match self {
            TaskConfig::Corpus(p) => Some(p),
            _ => None,
        }
    }

    /// The block task's parameters, when this is the block task.
    pub fn block(&self) -> Option<&BlockParams> {
        match self {
            TaskConfig::Block(p) => Some(p),
            _ => None,
        }
    }

    /// The parameters as flat `key → value` pairs, `task` holding the kind's name (the form of
    /// sweep files and of the `runs` table's columns).
    pub fn flat(&self) -> serde_json::Map<String, serde_json::Value> {
        let serde_json::Value::Object(mut m) =
            serde_json::to_value(self).expect("task config serialises")
        else {
            unreachable!("an internally tagged enum serialises to an object")
        };
        let kind = m.remove("kind").expect("tagged");
        m.insert("task".into(), kind);
        m
    }
}

/// Every task parameter name of every task, in registry order (duplicates removed).
pub fn all_params() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for k in TaskKind::ALL {
        for p in k.params() {
            if !out.contains(p) {
                out.push(p);
            }
        }
    }
    out
}

/// Move a flat table's task parameters into its `task` section: `task = "block"` with
/// `block_len = 8` beside it becomes `task = { kind = "block", block_len = 8 }`. A `task` that
/// is already a section (a serialised run config) takes the flat keys over its own, so `--set
/// block_len=16` overrides a stored run's value.
///
/// # Errors
/// One line: a missing or unknown task (with the closest name), or a parameter of another task
/// (`max_letters` is a parameter of task indirect, not of this run's task block).
pub fn nest_task_fields(table: toml::Table) -> Result<toml::Table, String> {
    let kinds: Vec<(&'static str, &'static [&'static str])> = TaskKind::ALL
        .iter()
        .map(|k| (k.name(), k.params()))
        .collect();
    crate::section::nest(
        table,
        &crate::section::Section {
            key: "task",
            expected: "a task name",
            kinds: &kinds,
            required: true,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each parameter type's `NAMES` lists exactly what it serialises, in order.
    #[test]
    fn parameter_names_match_their_types() {
        let cases: Vec<(TaskKind, TaskConfig)> = vec![
            (
                TaskKind::Block,
                TaskConfig::Block(BlockParams {
                    variant: tasks::block::BlockVariant::Copy,
                    block_len: 4,
                    noise: 0.0,
                }),
            ),
            (
                TaskKind::Indirect,
                TaskConfig::Indirect(IndirectParams {
                    min_abs_shift: 1,
                    shift_sign: tasks::indirect::ShiftSign::Positive,
                    ..Default::default()
                }),
            ),
            (
                TaskKind::Igsm,
                TaskConfig::Igsm(tasks::igsm::IgsmParams {
                    values: tasks::igsm::ValueFormat::Letters,
                    min_ops: Some(2),
                    ..Default::default()
                }),
            ),
            (TaskKind::Needle, TaskConfig::Needle(Default::default())),
            (
                TaskKind::Corpus,
                TaskConfig::Corpus(TextParams {
                    corpus: "ecoli".into(),
                    granularity: "char".into(),
                }),
            ),
        ];
        assert_eq!(cases.len(), TaskKind::ALL.len());
        for (kind, cfg) in cases {
            assert_eq!(cfg.kind(), kind);
            let mut keys: Vec<String> = cfg.flat().keys().cloned().collect();
            keys.retain(|k| k != "task");
            let mut names: Vec<String> = kind.params().iter().map(|s| s.to_string()).collect();
            keys.sort();
            names.sort();
            assert_eq!(keys, names, "{kind}");
            assert_eq!(cfg.flat()["task"], kind.name());
        }
    }

    #[test]
    fn flat_keys_nest_and_foreign_keys_are_refused() {
        let t: toml::Table =
            toml::from_str("task = \"block\"\nvariant = \"copy\"\nblock_len = 8\nseq_len = 32\n")
                .unwrap();
        let n = nest_task_fields(t).unwrap();
        assert_eq!(n["seq_len"].as_integer(), Some(32));
        let s = n["task"].as_table().unwrap();
        assert_eq!(s["kind"].as_str(), Some("block"));
        assert_eq!(s["block_len"].as_integer(), Some(8));
        let cfg: TaskConfig = s.clone().try_into().unwrap();
        assert_eq!(cfg.block().unwrap().block_len, 8);
        assert_eq!(cfg.block().unwrap().noise, 0.0);
        // A flat key overrides the section's value (`--set` on a stored run).
        let mut again = n.clone();
        again.insert("block_len".into(), toml::Value::Integer(16));
        let s = nest_task_fields(again).unwrap()["task"]
            .as_table()
            .unwrap()
            .clone();
        assert_eq!(s["block_len"].as_integer(), Some(16));

        let t: toml::Table = toml::from_str("task = \"block\"\nmax_letters = 8\n").unwrap();
        assert_eq!(
            nest_task_fields(t).unwrap_err(),
            "max_letters: a parameter of task indirect, not of this run's task block; remove it, \
             or set it only for runs with task = \"indirect\" (in their [[arms]])"
        );
        let t: toml::Table = toml::from_str("task = \"blok\"\n").unwrap();
        let e = nest_task_fields(t).unwrap_err();
        assert!(
            e.contains("unknown task `blok`") && e.contains("did you mean `block`"),
            "{e}"
        );
        let t: toml::Table = toml::from_str("seq_len = 3\n").unwrap();
        assert!(
            nest_task_fields(t)
                .unwrap_err()
                .starts_with("missing field `task`")
        );
    }

    /// The generators get the run's context and vocabulary; defaults are the tasks' own.
    #[test]
    fn generators_and_widths() {
        let b = TaskConfig::Block(BlockParams {
            variant: tasks::block::BlockVariant::Recall,
            block_len: 8,
            noise: 0.0,
        });
        assert_eq!(b.dep_width(32, 64), Some(8));
        match b.generator(32, 64) {
            TaskGen::Block(c) => assert_eq!((c.vocab_size, c.seq_len, c.block_len), (32, 64, 8)),
            other => panic!("{other:?}"),
        }
        let i = TaskConfig::Indirect(IndirectParams::default());
        assert_eq!(i.dep_width(60, 48), Some(40));
        let n = TaskConfig::Needle(NeedleParams::default());
        assert_eq!(n.dep_width(66, 40), Some(40));
        match n.generator(66, 40) {
            TaskGen::Needle(c) => assert_eq!((c.seq_len, c.depth, c.key_len), (40, None, 3)),
            other => panic!("{other:?}"),
        }
    }
}
