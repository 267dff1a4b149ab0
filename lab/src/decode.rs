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
//! end irrelevant to that row). Cost: `max completion length` forward passes of
//! `[n, ≤ seq_len]` tokens; with the fused attention, memory stays linear in the length.

use burn::module::Module;
use burn::tensor::{Device, Int, Tensor, TensorData};
use tasks::Split;

use crate::config::{RunConfig, TaskGen};
use crate::model::Transformer;

/// Generated-solution metrics of an iGSM run.
#[derive(Clone, Debug, PartialEq)]
pub struct IgsmGeneration {
    /// Problems decoded (from the held-out split).
    pub n: usize,
    /// Share whose generated answer equals the true answer.
    pub answer_accuracy: f64,
    /// Share whose generated text passes [`tasks::igsm::check`] (every step re-derived correctly).
    pub solution_valid: f64,
}

/// The answer after the last `#` of a generated text, if it is a number followed by `.` (or the
/// end of the text).
pub fn parse_answer(text: &str) -> Option<u32> {
    let after = &text[text.rfind('#')? + 1..];
    let digits: String = after.chars().take_while(|c| c.is_ascii_digit()).collect();
    let rest = &after[digits.len()..];
    if digits.is_empty() || !(rest.is_empty() || rest.starts_with('.')) {
        return None;
    }
    digits.parse().ok()
}

/// Greedy-decode the first `n` held-out problems of an iGSM run and score them.
///
/// # Panics
/// If `cfg` is not an iGSM run (callers check `cfg.task`).
pub fn igsm_generation(
    model: &Transformer,
    cfg: &RunConfig,
    device: &Device,
    n: usize,
) -> IgsmGeneration {
    let TaskGen::Igsm(task) = cfg.task() else {
        panic!("igsm_generation needs an igsm run");
    };
    let model = model.valid();
    let device = device.clone().inner();
    let problems: Vec<_> = (0..n as u64)
        .map(|i| {
            task.sample(cfg.seed, Split::Eval, i)
                .expect("config validated")
        })
        .collect();
    let end = tasks::igsm::encode('.').expect("'.' is in the vocabulary");
    let mut seqs: Vec<Vec<u32>> = problems
        .iter()
        .map(|p| tasks::igsm::encode_str(&p.prompt()).expect("prompt is in the vocabulary"))
        .collect();
    let mut done: Vec<bool> = seqs.iter().map(|s| s.len() >= cfg.seq_len).collect();
    while done.iter().any(|d| !d) {
        let active: Vec<usize> = (0..n).filter(|&i| !done[i]).collect();
        let width = active.iter().map(|&i| seqs[i].len()).max().unwrap_or(1);
        let mut ids = Vec::with_capacity(active.len() * width);
        for &i in &active {
            ids.extend(seqs[i].iter().map(|&t| t as i64));
            ids.extend(std::iter::repeat_n(0i64, width - seqs[i].len()));
        }
        let tokens =
            Tensor::<2, Int>::from_data(TensorData::new(ids, [active.len(), width]), &device);
        let next = model
            .forward(tokens)
            .argmax(2)
            .into_data()
            .convert::<i64>()
            .try_to_vec::<i64>()
            .expect("argmax gives integers");
        for (row, &i) in active.iter().enumerate() {
            let t = next[row * width + seqs[i].len() - 1] as u32;
            seqs[i].push(t);
            if t == end || seqs[i].len() >= cfg.seq_len {
                done[i] = true;
            }
        }
    }
    let (mut right, mut valid) = (0usize, 0usize);
    for (p, s) in problems.iter().zip(&seqs) {
        let text = tasks::igsm::decode_ids(s).unwrap_or_default();
        if parse_answer(&text) == Some(p.answer()) {
            right += 1;
        }
        if tasks::igsm::check(&text).is_ok_and(|a| a == p.answer()) {
            valid += 1;
        }
    }
    IgsmGeneration {
        n,
        answer_accuracy: right as f64 / n.max(1) as f64,
        solution_valid: valid as f64 / n.max(1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_answer_reads_the_number_after_the_last_hash() {
        assert_eq!(parse_answer("a=5;?a:a=5;#5."), Some(5));
        assert_eq!(parse_answer("c=a+b=5+3=8;#18."), Some(18));
        assert_eq!(parse_answer("x#3;#21"), Some(21));
        assert_eq!(parse_answer("no answer"), None);
        assert_eq!(parse_answer("#."), None);
        assert_eq!(parse_answer("#12a."), None);
    }

    /// An untrained model decodes every problem to the end (the loop terminates) and scores in
    /// [0, 1]; the first problems are the held-out ones.
    #[test]
    fn untrained_model_decodes_and_terminates() {
        let mut cfg = crate::config::tests::tiny();
        cfg.task = crate::config::TaskConfig::Igsm(tasks::igsm::IgsmParams {
            ops: 2,
            distractors: 0,
        });
        cfg.vocab_size = 72;
        cfg.seq_len = 80;
        cfg.validate().unwrap();
        let device = Device::flex();
        let model = cfg.model().init(cfg.seed, &device);
        let g = igsm_generation(&model, &cfg, &device, 3);
        assert_eq!(g.n, 3);
        assert!((0.0..=1.0).contains(&g.answer_accuracy));
        assert!(g.solution_valid <= g.answer_accuracy + 1e-12);
    }
}
