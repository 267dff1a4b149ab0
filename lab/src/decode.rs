//! Greedy decoding, for metrics that teacher forcing cannot give.
//!
//! iGSM's answer accuracy (Ye et al., *Physics of Language Models 2.1*, §3): the model is given
//! only the problem and the question (the prompt, up to `?name:`), writes its own solution token by
//! token (argmax), and is right when the number after `#` in what it wrote equals the true answer.
//! Under teacher forcing the answer would just be copied from the last step of the reference
//! solution already in the input, so this is measured by generation.
//!
//! Decoding runs the whole batch of problems in lock step: one forward pass over the longest
//! sequence so far per generated token (no KV cache; the causal mask makes padding after a row's
//! end irrelevant to that row). A row ends at its final `.` or at the longest text the config can
//! produce (`IgsmConfig::min_seq_len`, at most `seq_len`), so decoding costs at most that many
//! forward passes of `[n, ≤ min_seq_len]` tokens whatever the evaluated context length.

use burn::module::Module;
use burn::tensor::{Device, Int, Tensor, TensorData};
use tasks::Split;

use crate::config::{RunConfig, TaskGen};
use crate::model::Transformer;

/// The argmax token id at every position of `model`'s logits for token ids `ids` (row-major
/// `[rows, width]`), as one row-major `Vec` of `rows · width` ids. `model` should be the inference
/// copy (`Module::valid`) and `device` its device.
pub fn argmax_ids(
    model: &Transformer,
    ids: Vec<i64>,
    rows: usize,
    width: usize,
    device: &Device,
) -> Vec<i64> {
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [rows, width]), device);
    model
        .forward(tokens)
        .argmax(2)
        .into_data()
        .convert::<i64>()
        .try_to_vec::<i64>()
        .expect("argmax gives integers")
}

/// Which iGSM problems a decoding metric is measured on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProblemSet {
    /// Held-out structures: [`Split::Eval`] from index 0, the run's evaluation problems (no
    /// problem of a template seen in training; `tasks::igsm`, "Train/eval split by structure").
    HeldOut,
    /// Unseen problems of *training* structures: [`Split::Train`] from index
    /// [`TRAIN_STRUCTURES_START`], past every index training draws (`step · batch_size + i`), so
    /// the problems are new but their templates were trained on (issue 19's R27: is the failure
    /// in-distribution or a failure to generalise to new structures?).
    TrainStructures,
}

/// The problems a run is scored on: its config with any mixture of sizes removed, so a run
/// trained on `min_ops..=ops` ([`tasks::igsm::IgsmConfig::min_ops`]) is scored on problems of
/// exactly `ops` operations, its target size, in both sets (held-out problems have exactly `ops`
/// anyway; the training-structure set would otherwise be a mixture).
fn at_largest_size(task: tasks::igsm::IgsmConfig) -> tasks::igsm::IgsmConfig {
    tasks::igsm::IgsmConfig {
        min_ops: None,
        ..task
    }
}

/// First [`Split::Train`] index of [`ProblemSet::TrainStructures`] (2⁴⁰, beyond any run's
/// `steps · batch_size`).
pub const TRAIN_STRUCTURES_START: u64 = 1 << 40;

impl ProblemSet {
    /// Problem `i` of this set.
    fn sample(self, task: &tasks::igsm::IgsmConfig, seed: u64, i: u64) -> tasks::igsm::Problem {
        let (split, index) = match self {
            ProblemSet::HeldOut => (Split::Eval, i),
            ProblemSet::TrainStructures => (Split::Train, TRAIN_STRUCTURES_START + i),
        };
        task.sample(seed, split, index).expect("config validated")
    }
}

/// Generated-solution metrics of an iGSM run.
#[derive(Clone, Debug, PartialEq)]
pub struct IgsmGeneration {
    /// Problems decoded (from the held-out split).
    pub n: usize,
    /// Share whose generated answer equals the true answer.
    pub answer_accuracy: f64,
    /// Share whose generated text passes [`tasks::igsm::check`] (every step re-derived correctly).
    pub solution_valid: f64,
    /// `(problems, right answers)` by the depth of the problem's dependency tree
    /// ([`tasks::igsm::Problem::depth`]), index = depth (0 ..= the deepest seen).
    pub by_depth: Vec<(usize, usize)>,
    /// Where each *wrong* answer's solution first leaves the reference ([`first_divergence`]), one
    /// entry per problem whose generated answer is wrong, in problem order.
    pub first_errors: Vec<FirstError>,
}

/// A wrong greedy solution beside its reference (both completions: the text after the prompt).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirstError {
    /// Where `generated` first leaves `reference`.
    pub divergence: Divergence,
    /// The reference completion ([`tasks::igsm::Problem::completion`]).
    pub reference: String,
    /// What the model wrote after the prompt.
    pub generated: String,
}

/// The first character at which a generated completion leaves the reference one
/// ([`tasks::igsm::Problem::completion`]): where, and what the reference writes there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// Character index in the completion (0 = the first character after the prompt's `:`).
    pub index: usize,
    /// The role of the reference character at `index` ([`solution_roles`]).
    pub role: SolutionRole,
    /// The solution step it falls in: the number of `;` before `index` in the reference, so
    /// `0 ..= steps − 1` inside the steps and `steps` in the final `#answer.`.
    pub step: usize,
    /// Steps of the reference solution (its number of `;`).
    pub steps: usize,
    /// Whether the reference step at `step` is a leaf (`name=value;`); `false` for an operation
    /// step and for the final `#answer.`.
    pub leaf_step: bool,
}

/// Where `generated` (a completion: the text after the prompt) first differs from `reference`,
/// or `None` if they are equal. A `generated` that stops early (a strict prefix) diverges at its
/// end; one that runs on past the reference's end is not a divergence inside it and is reported
/// at `reference.len()` with the role of the reference's last character.
pub fn first_divergence(reference: &str, generated: &str) -> Option<Divergence> {
    let (r, g) = (reference.as_bytes(), generated.as_bytes());
    let index = r.iter().zip(g).take_while(|(a, b)| a == b).count();
    if index == r.len() && index == g.len() {
        return None;
    }
    let roles = solution_roles(reference);
    let at = index.min(r.len().saturating_sub(1));
    let step = r[..index.min(r.len())]
        .iter()
        .filter(|&&c| c == b';')
        .count();
    let steps = r.iter().filter(|&&c| c == b';').count();
    let leaf_step = reference
        .split_inclusive(';')
        .nth(step)
        .is_some_and(|s| s.ends_with(';') && s.matches('=').count() == 1);
    Some(Divergence {
        index,
        role: roles.get(at).copied().unwrap_or(SolutionRole::Structure),
        step,
        steps,
        leaf_step,
    })
}

/// The answer after the last `#` of a generated text, if it is a number followed by `.` (or the
/// end of the text).
pub fn parse_answer(text: &str) -> Option<u32> {
    parse_answer_with(text, tasks::igsm::ValueFormat::Digits)
}

/// [`parse_answer`] for values written in `values`: digits, or one letter `A`..=`W` in
/// [`tasks::igsm::ValueFormat::Letters`].
pub fn parse_answer_with(text: &str, values: tasks::igsm::ValueFormat) -> Option<u32> {
    let after = &text[text.rfind('#')? + 1..];
    let lit: String = match values {
        tasks::igsm::ValueFormat::Digits => {
            after.chars().take_while(|c| c.is_ascii_digit()).collect()
        }
        tasks::igsm::ValueFormat::Letters => after
            .chars()
            .take(1)
            .filter(|&c| values.is_value_char(c as u8))
            .collect(),
    };
    let rest = &after[lit.len()..];
    if lit.is_empty() || !(rest.is_empty() || rest.starts_with('.')) {
        return None;
    }
    match values {
        tasks::igsm::ValueFormat::Digits => lit.parse().ok(),
        tasks::igsm::ValueFormat::Letters => Some(u32::from(lit.as_bytes()[0] - b'A')),
    }
}

/// Greedy-decode the first `n` problems of `set` of an iGSM run and score them.
///
/// # Panics
/// If `cfg` is not an iGSM run (callers check `cfg.task`).
pub fn igsm_generation(
    model: &Transformer,
    cfg: &RunConfig,
    device: &Device,
    n: usize,
    set: ProblemSet,
) -> IgsmGeneration {
    let TaskGen::Igsm(task) = cfg.task() else {
        panic!("igsm_generation needs an igsm run");
    };
    let task = at_largest_size(task);
    let model = model.valid();
    let device = device.clone().inner();
    let problems: Vec<_> = (0..n as u64)
        .map(|i| set.sample(&task, cfg.seed, i))
        .collect();
    let end = tasks::igsm::encode('.').expect("'.' is in the vocabulary");
    let mut seqs: Vec<Vec<u32>> = problems
        .iter()
        .map(|p| tasks::igsm::encode_str(&p.prompt()).expect("prompt is in the vocabulary"))
        .collect();
    // No text of this config is longer than `min_seq_len()`: a row stops there (or at the context's
    // end) even if it never writes the final `.`, which bounds the cost of decoding a model that
    // has lost the format (e.g. under a RoPE scaling at 4× the training length).
    let max_len = task.min_seq_len().min(cfg.seq_len);
    let mut done: Vec<bool> = seqs.iter().map(|s| s.len() >= max_len).collect();
    while done.iter().any(|d| !d) {
        let active: Vec<usize> = (0..n).filter(|&i| !done[i]).collect();
        let width = active.iter().map(|&i| seqs[i].len()).max().unwrap_or(1);
        let mut ids = Vec::with_capacity(active.len() * width);
        for &i in &active {
            ids.extend(seqs[i].iter().map(|&t| t as i64));
            ids.extend(std::iter::repeat_n(0i64, width - seqs[i].len()));
        }
        let next = argmax_ids(&model, ids, active.len(), width, &device);
        for (row, &i) in active.iter().enumerate() {
            let t = next[row * width + seqs[i].len() - 1] as u32;
            seqs[i].push(t);
            if t == end || seqs[i].len() >= max_len {
                done[i] = true;
            }
        }
    }
    let (mut right, mut valid) = (0usize, 0usize);
    let depths: Vec<usize> = problems.iter().map(|p| p.depth()).collect();
    let mut by_depth = vec![(0usize, 0usize); depths.iter().max().map_or(0, |&d| d + 1)];
    let mut first_errors = Vec::new();
    for ((p, s), &depth) in problems.iter().zip(&seqs).zip(&depths) {
        let text = tasks::igsm::decode_ids(s).unwrap_or_default();
        let cell = &mut by_depth[depth];
        cell.0 += 1;
        if parse_answer_with(&text, p.values) == Some(p.answer()) {
            right += 1;
            cell.1 += 1;
        } else {
            let generated = text.get(p.prompt().len()..).unwrap_or("").to_string();
            let reference = p.completion();
            if let Some(divergence) = first_divergence(&reference, &generated) {
                first_errors.push(FirstError {
                    divergence,
                    reference,
                    generated,
                });
            }
        }
        if tasks::igsm::check_with(&text, p.values).is_ok_and(|a| a == p.answer()) {
            valid += 1;
        }
    }
    IgsmGeneration {
        n,
        answer_accuracy: right as f64 / n.max(1) as f64,
        solution_valid: valid as f64 / n.max(1) as f64,
        by_depth,
        first_errors,
    }
}

/// What a character of an iGSM solution is, for teacher-forced accuracy by role (issue 19: which part
/// of a solution the model gets wrong).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SolutionRole {
    /// `=`, `;`, `#`, `.`: the grammar.
    Structure,
    /// A step's quantity name (which quantity comes next: the solution order).
    Name,
    /// A step's operand names `l`, `r` of `l+r` (copied from the problem statement, or inferred from
    /// the solution so far: in post-order the right operand is usually the step just written).
    Definition,
    /// A number copied from earlier in the solution: the operand values `lv+rv` of a step (and the
    /// operator between them, repeated from the step's definition).
    Value,
    /// The value an operation computes (mod-23 arithmetic).
    Result,
    /// The answer's digits after `#`.
    Answer,
    /// A step's operator `+ - *` in its definition `l+r`: the one part of a step that can only be
    /// copied from its statement, three characters past the name (issue 19, R38).
    Operator,
    /// A leaf step's value `7` of `m=7;`, copied from its statement `m=7;` in the problem: a lookup
    /// by the name alone, which nothing earlier in the solution gives away.
    Leaf,
}

impl SolutionRole {
    /// Every role, in table order.
    pub const ALL: [SolutionRole; 8] = [
        SolutionRole::Structure,
        SolutionRole::Name,
        SolutionRole::Definition,
        SolutionRole::Value,
        SolutionRole::Result,
        SolutionRole::Answer,
        SolutionRole::Operator,
        SolutionRole::Leaf,
    ];

    /// Short name (`runs.parquet` columns `acc_tf_<name>`).
    pub fn name(self) -> &'static str {
        match self {
            SolutionRole::Structure => "structure",
            SolutionRole::Name => "name",
            SolutionRole::Definition => "definition",
            SolutionRole::Value => "value",
            SolutionRole::Result => "result",
            SolutionRole::Answer => "answer",
            SolutionRole::Operator => "operator",
            SolutionRole::Leaf => "leaf",
        }
    }
}

/// `name 0.680 (n=1189)  definition …` for [`igsm_accuracy_by_role`]'s counts.
pub fn describe_roles(by_role: &[(usize, usize); 8]) -> String {
    SolutionRole::ALL
        .iter()
        .zip(by_role)
        .map(|(r, &(scored, right))| {
            format!(
                "{} {:.3} (n={scored})",
                r.name(),
                right as f64 / scored.max(1) as f64
            )
        })
        .collect::<Vec<_>>()
        .join("  ")
}

/// The role of each character of an iGSM completion (the grammar of [`tasks::igsm`]): steps
/// `name=value;` (a leaf) or `name=l∘r=lv∘rv=result;`, then `#answer.`.
pub fn solution_roles(completion: &str) -> Vec<SolutionRole> {
    use SolutionRole::*;
    let mut roles = Vec::with_capacity(completion.len());
    let (steps, answer) = match completion.rfind('#') {
        Some(k) => (&completion[..k], &completion[k..]),
        None => (completion, ""),
    };
    for step in steps.split_inclusive(';') {
        let body = step.strip_suffix(';').unwrap_or(step);
        let parts: Vec<&str> = body.split('=').collect();
        let part_roles: &[SolutionRole] = if parts.len() == 4 {
            &[Name, Definition, Value, Result]
        } else {
            &[Name, Leaf]
        };
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                roles.push(Structure); // '='
            }
            let r = part_roles.get(i).copied().unwrap_or(Structure);
            if r == Definition {
                // Names are letters; the operator is the one character that is not.
                roles.extend(part.chars().map(|c| {
                    if c.is_ascii_alphabetic() {
                        Definition
                    } else {
                        Operator
                    }
                }));
            } else {
                roles.extend(std::iter::repeat_n(r, part.len()));
            }
        }
        if step.ends_with(';') {
            roles.push(Structure);
        }
    }
    // `#`, the answer's characters (digits or one value letter), `.`.
    for c in answer.chars() {
        roles.push(if c == '#' || c == '.' {
            Structure
        } else {
            Answer
        });
    }
    roles
}

/// Teacher-forced argmax accuracy on the solution characters of the first `n` iGSM problems of `set`,
/// by [`SolutionRole`]: `(scored, right)` per role in [`SolutionRole::ALL`] order. The model sees the
/// reference solution up to each character (not its own), so this locates errors that greedy decoding
/// then compounds.
///
/// # Panics
/// If `cfg` is not an iGSM run.
pub fn igsm_accuracy_by_role(
    model: &Transformer,
    cfg: &RunConfig,
    device: &Device,
    n: usize,
    set: ProblemSet,
) -> [(usize, usize); 8] {
    let TaskGen::Igsm(task) = cfg.task() else {
        panic!("igsm_accuracy_by_role needs an igsm run");
    };
    let task = at_largest_size(task);
    let model = model.valid();
    let device = device.clone().inner();
    let seq = cfg.seq_len;
    let mut out = [(0usize, 0usize); 8];
    for start in (0..n).step_by(64) {
        let rows = (n - start).min(64);
        let problems: Vec<_> = (start..start + rows)
            .map(|i| set.sample(&task, cfg.seed, i as u64))
            .collect();
        let mut ids = Vec::with_capacity(rows * seq);
        for p in &problems {
            let ex = task.encode_problem(p).expect("a drawn problem encodes");
            ids.extend(ex.input.iter().map(|&t| t as i64));
        }
        let pred = argmax_ids(&model, ids, rows, seq, &device);
        for (row, p) in problems.iter().enumerate() {
            let (prompt, completion) = (p.prompt(), p.completion());
            let want =
                tasks::igsm::encode_str(&completion).expect("completion is in the vocabulary");
            for (j, role) in solution_roles(&completion).into_iter().enumerate() {
                // Completion character j is the target at position len(prompt) + j − 1.
                let t = prompt.len() + j - 1;
                let r = &mut out[role as usize];
                r.0 += 1;
                r.1 += usize::from(pred[row * seq + t] == want[j] as i64);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-computed divergences from the reference `a=5;b=3;c=a+b=5+3=8;#8.` (3 steps; the
    /// operation step starts at index 8, `#` is at 20).
    #[test]
    fn first_divergence_hand_cases() {
        use SolutionRole::*;
        let r = "a=5;b=3;c=a+b=5+3=8;#8.";
        assert_eq!(first_divergence(r, r), None);
        let d = |index, role, step, leaf_step| Divergence {
            index,
            role,
            step,
            steps: 3,
            leaf_step,
        };
        // The wrong operator of the operation step.
        assert_eq!(
            first_divergence(r, "a=5;b=3;c=a*b=5*3=15;#15."),
            Some(d(11, Operator, 2, false))
        );
        // The wrong name in the second (leaf) step.
        assert_eq!(first_divergence(r, "a=5;d=3;"), Some(d(4, Name, 1, true)));
        // The first step's value.
        assert_eq!(first_divergence(r, "a=6;"), Some(d(2, Leaf, 0, true)));
        // The answer only.
        assert_eq!(
            first_divergence(r, "a=5;b=3;c=a+b=5+3=8;#9."),
            Some(d(21, Answer, 3, false))
        );
        // The mod-23 result of the operation step.
        assert_eq!(
            first_divergence(r, "a=5;b=3;c=a+b=5+3=9;#9."),
            Some(d(18, Result, 2, false))
        );
        // Stopped early: the divergence is where the text ends.
        assert_eq!(first_divergence(r, "a=5;b"), Some(d(5, Structure, 1, true)));
        assert_eq!(first_divergence(r, ""), Some(d(0, Name, 0, true)));
        // Ran on past the reference's end: reported at its end, in the answer.
        assert_eq!(
            first_divergence(r, "a=5;b=3;c=a+b=5+3=8;#8.x"),
            Some(d(23, Structure, 3, false))
        );
    }

    #[test]
    fn solution_roles_of_the_doc_example() {
        use SolutionRole::*;
        let c = "a=5;b=3;c=a+b=5+3=8;#8.";
        let r = solution_roles(c);
        assert_eq!(r.len(), c.len());
        let (s, n, d, v, x, a, o, l) = (
            Structure, Name, Definition, Value, Result, Answer, Operator, Leaf,
        );
        #[rustfmt::skip]
        let want = [n, s, l, s,  n, s, l, s,  n, s, d, o, d, s, v, v, v, s, x, s,  s, a, s];
        assert_eq!(r, want);
        // Two-digit values and names keep one role per character.
        let r = solution_roles("xy=12;#12.");
        assert_eq!(r, [n, n, s, l, l, s, s, a, a, s]);
        // One token per value (`values = "letters"`): the answer letter is the answer.
        let r = solution_roles("a=F;b=D;c=a+b=F+D=I;#I.");
        #[rustfmt::skip]
        let want = [n, s, l, s,  n, s, l, s,  n, s, d, o, d, s, v, v, v, s, x, s,  s, a, s];
        assert_eq!(r, want);
        // Two-letter names: both letters of each operand are names, the one operator between.
        let r = solution_roles("ab=c*de=2*3=6;#6.");
        #[rustfmt::skip]
        let want = [n, n, s, d, o, d, d, s, v, v, v, s, x, s,  s, a, s];
        assert_eq!(r, want);
    }

    #[test]
    fn parse_answer_reads_the_number_after_the_last_hash() {
        assert_eq!(parse_answer("a=5;?a:a=5;#5."), Some(5));
        assert_eq!(parse_answer("c=a+b=5+3=8;#18."), Some(18));
        assert_eq!(parse_answer("x#3;#21"), Some(21));
        assert_eq!(parse_answer("no answer"), None);
        assert_eq!(parse_answer("#."), None);
        assert_eq!(parse_answer("#12a."), None);
        let letters = tasks::igsm::ValueFormat::Letters;
        assert_eq!(parse_answer_with("c=a+b=F+D=I;#I.", letters), Some(8));
        assert_eq!(parse_answer_with("#W", letters), Some(22));
        assert_eq!(parse_answer_with("#X.", letters), None);
        assert_eq!(parse_answer_with("#IJ.", letters), None);
        assert_eq!(parse_answer_with("#8.", letters), None);
        assert_eq!(parse_answer("#I."), None);
    }

    /// An untrained model decodes every problem to the end (the loop terminates) and scores in
    /// [0, 1]; the first problems are the held-out ones.
    #[test]
    fn untrained_model_decodes_and_terminates() {
        for values in [
            tasks::igsm::ValueFormat::Digits,
            tasks::igsm::ValueFormat::Letters,
        ] {
            untrained_model_decodes_and_terminates_with(values);
        }
    }

    fn untrained_model_decodes_and_terminates_with(values: tasks::igsm::ValueFormat) {
        let mut cfg = crate::config::tests::tiny();
        cfg.task = crate::config::TaskConfig::Igsm(tasks::igsm::IgsmParams {
            ops: 2,
            distractors: 0,
            values,
            min_ops: None,
        });
        cfg.vocab_size = 72;
        cfg.seq_len = 80;
        cfg.validate().unwrap();
        let device = Device::flex();
        let model = cfg.model().init(cfg.seed, &device);
        let g = igsm_generation(&model, &cfg, &device, 3, ProblemSet::HeldOut);
        assert_eq!(g.n, 3);
        // Every problem counted once by depth (ops 2: depth 1 or 2), its answer once.
        assert_eq!(g.by_depth.iter().map(|c| c.0).sum::<usize>(), 3);
        assert_eq!(g.by_depth[0].0, 0);
        assert!(g.by_depth.len() <= 3);
        assert_eq!(
            g.by_depth.iter().map(|c| c.1).sum::<usize>() as f64 / 3.0,
            g.answer_accuracy
        );
        // One first divergence per wrong answer, inside its reference solution.
        let right: usize = g.by_depth.iter().map(|c| c.1).sum();
        assert_eq!(g.first_errors.len(), 3 - right);
        assert!(
            g.first_errors
                .iter()
                .all(|e| e.divergence.step <= e.divergence.steps
                    && e.reference[..e.divergence.index] == e.generated[..e.divergence.index])
        );
        // Teacher forcing scores every completion character once, by role.
        let by_role = igsm_accuracy_by_role(&model, &cfg, &device, 3, ProblemSet::HeldOut);
        let TaskGen::Igsm(task) = cfg.task() else {
            unreachable!()
        };
        let chars: usize = (0..3)
            .map(|i| {
                task.sample(cfg.seed, Split::Eval, i)
                    .unwrap()
                    .completion()
                    .len()
            })
            .sum();
        assert_eq!(by_role.iter().map(|r| r.0).sum::<usize>(), chars);
        assert!(by_role.iter().all(|&(n, right)| right <= n));
        assert!(
            by_role[SolutionRole::Result as usize].0 >= 3 * 2,
            "ops = 2: two results each"
        );
        assert_eq!(
            by_role[SolutionRole::Operator as usize].0,
            3 * 2,
            "ops = 2: two operators each"
        );
        // Every problem's answer is scored: one or two digits, or exactly one letter.
        let answers = by_role[SolutionRole::Answer as usize].0;
        match values {
            tasks::igsm::ValueFormat::Letters => assert_eq!(answers, 3),
            tasks::igsm::ValueFormat::Digits => assert!((3..=6).contains(&answers)),
        }
        let line = describe_roles(&[
            (4, 2),
            (2, 1),
            (0, 0),
            (1, 1),
            (5, 0),
            (1, 1),
            (2, 2),
            (4, 1),
        ]);
        assert!(
            line.starts_with("structure 0.500 (n=4)  name 0.500 (n=2)  definition 0.000 (n=0)")
        );
        assert!(line.ends_with("answer 1.000 (n=1)  operator 1.000 (n=2)  leaf 0.250 (n=4)"));
        assert!((0.0..=1.0).contains(&g.answer_accuracy));
        assert!(g.solution_valid <= g.answer_accuracy + 1e-12);
    }

    /// The training-structure problems are new problems (not the first training batches) whose
    /// templates all lie in the training part, and held-out problems' templates in the eval part.
    #[test]
    fn problem_sets_draw_from_their_split() {
        let task = tasks::igsm::IgsmConfig {
            ops: 2,
            distractors: 0,
            ..Default::default()
        };
        let first_train = task.sample(0, Split::Train, 0).unwrap();
        for i in 0..20 {
            let seen = ProblemSet::TrainStructures.sample(&task, 0, i);
            assert_eq!(task.split_of(seen.structure_hash()), Split::Train);
            let held = ProblemSet::HeldOut.sample(&task, 0, i);
            assert_eq!(task.split_of(held.structure_hash()), Split::Eval);
            assert_eq!(
                held.prompt(),
                task.sample(0, Split::Eval, i).unwrap().prompt()
            );
        }
        let seen0 = ProblemSet::TrainStructures.sample(&task, 0, 0);
        assert_ne!(seen0.prompt(), first_train.prompt());
        assert_eq!(
            seen0.prompt(),
            task.sample(0, Split::Train, TRAIN_STRUCTURES_START)
                .unwrap()
                .prompt()
        );
    }
}
