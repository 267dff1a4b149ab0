//! `lab gen TASK`: print a task's examples as JSON lines, so anyone can inspect the data.
//!
//! The tasks are the task registry's ([`TaskKind`], `lab/src/task.rs`); each has an arm below
//! (a match over the registry, so a new task does not compile until `lab gen` can show it).
//! Every line has `input` and `target` (token ids, `seq_len` each), `mask` (scored positions),
//! the task name and all of its parameters; tasks with a text form add it (indirect indexing:
//! `text`, `source`, `query`, `shift`, `answer`; iGSM: `text`, `prompt`, `completion`, `answer`,
//! `ops`, `structure_hash`, `answer_positions`; needle: `text`, `key`, `value`, `needle_start`,
//! `query_start`). The corpus task reads its corpus from `data/` (`lab data fetch`).

use serde_json::{Value, json};
use tasks::Split;
use tasks::block::BlockConfig;
use tasks::igsm::IgsmConfig;
use tasks::indirect::IndirectConfig;
use tasks::needle::NeedleConfig;
use tasks::text::TextParams;

use crate::hint::did_you_mean;
use crate::task::{CORPUS_EVAL_FRACTION, CORPUS_VAL_FRACTION, TaskKind};

/// Errors of `lab gen` (one line).
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    /// Unknown task: its name and the closest hint.
    #[error("unknown task `{0}`; available tasks: {names}{1}", names = TaskKind::NAMES.join(", "))]
    UnknownTask(String, String),
    /// A bad `--param`.
    #[error("--param {0}")]
    Param(String),
    /// The generator rejected its parameters.
    #[error(transparent)]
    Task(#[from] tasks::TaskError),
}

use tasks::MAX_SEQ_LEN;

/// A generator's error about a parameter the user typed, as that `--param KEY=VALUE`
/// ([`crate::hint::blamed`]); other errors unchanged.
fn blame_params(e: GenError, params: &[String]) -> GenError {
    match e {
        GenError::Task(t) => match crate::hint::blamed(&t.to_string(), params) {
            Some(p) => GenError::Param(format!("{p}: {t}")),
            None => GenError::Task(t),
        },
        other => other,
    }
}

/// The task config from its parameters, or one line naming the bad one
/// (`block_len: invalid type: string "abc", expected usize`).
fn typed<T: serde::de::DeserializeOwned>(params: Value) -> Result<T, String> {
    serde_path_to_error::deserialize(params)
        .map_err(|e| crate::hint::at_field(&e.path().to_string(), &e.inner().to_string()))
}

/// The registry's task named `task`.
fn kind(task: &str) -> Result<TaskKind, GenError> {
    TaskKind::from_name(task).ok_or_else(|| {
        GenError::UnknownTask(
            task.to_string(),
            did_you_mean(task, TaskKind::NAMES.iter().copied()),
        )
    })
}

fn defaults(task: &str) -> Result<Value, GenError> {
    Ok(match kind(task)? {
        TaskKind::Block => {
            json!({"variant": "copy", "vocab_size": 16, "seq_len": 32, "block_len": 4, "noise": 0.0})
        }
        TaskKind::Indirect => serde_json::to_value(IndirectConfig::default()).expect("serialises"),
        TaskKind::Igsm => {
            let mut v = serde_json::to_value(IgsmConfig::default()).expect("serialises");
            // Unset by default and so not serialised; listed so `--param min_ops=1` is accepted.
            v["min_ops"] = Value::Null;
            v
        }
        TaskKind::Needle => serde_json::to_value(NeedleConfig::default()).expect("serialises"),
        TaskKind::Corpus => json!({"corpus": "shakespeare", "granularity": "char", "seq_len": 64}),
    })
}

/// The corpus task's generator from `lab gen` parameters (`corpus`, `granularity`, `seq_len`),
/// checked (the corpus must be in the data folder).
fn corpus_config(p: &Value) -> Result<tasks::text::TextConfig, GenError> {
    let seq_len = p["seq_len"].as_u64().unwrap_or(64) as usize;
    let mut params = p.clone();
    params.as_object_mut().expect("object").remove("seq_len");
    let tp: TextParams = typed(params).map_err(GenError::Param)?;
    let cfg = tp.config(seq_len, CORPUS_EVAL_FRACTION, CORPUS_VAL_FRACTION);
    cfg.validate()?;
    Ok(cfg)
}

/// Parse `key=value` params over the task's defaults (values as JSON scalars, else strings).
fn with_params(task: &str, params: &[String]) -> Result<Value, GenError> {
    let mut v = defaults(task)?;
    let obj = v.as_object_mut().expect("defaults are an object");
    let keys: Vec<String> = obj.keys().cloned().collect();
    for p in params {
        let (k, val) = p
            .split_once('=')
            .ok_or_else(|| GenError::Param(format!("{p}: expected key=value")))?;
        let k = k.trim();
        if !obj.contains_key(k) {
            return Err(GenError::Param(format!(
                "{p}: unknown parameter `{k}` of task {task} (parameters: {}){}",
                keys.join(", "),
                did_you_mean(k, keys.iter().map(|s| s.as_str()))
            )));
        }
        let parsed = serde_json::from_str::<Value>(val.trim())
            .unwrap_or(Value::String(val.trim().to_string()));
        obj.insert(k.to_string(), parsed);
    }
    // The same bound as a run's `seq_len` (lab::config): a larger context is refused before
    // anything is allocated.
    if let Some(l) = obj.get("seq_len").and_then(Value::as_u64)
        && !(2..=MAX_SEQ_LEN as u64).contains(&l)
    {
        return Err(GenError::Param(format!(
            "seq_len={l}: seq_len = {l} is out of range: must be in 2..={MAX_SEQ_LEN}"
        )));
    }
    Ok(v)
}

/// `n` examples (ids, targets, masks) of `task` with `key=value` parameters over the same
/// defaults as [`gen_lines`], from `split` and `seed` (used by `lab mi --task`).
///
/// # Errors
/// [`GenError`] for an unknown task or a bad parameter.
pub fn task_examples(
    task: &str,
    params: &[String],
    n: usize,
    seed: u64,
    split: Split,
) -> Result<Vec<tasks::Example>, GenError> {
    task_examples_inner(task, params, n, seed, split).map_err(|e| blame_params(e, params))
}

/// See [`task_examples`].
fn task_examples_inner(
    task: &str,
    params: &[String],
    n: usize,
    seed: u64,
    split: Split,
) -> Result<Vec<tasks::Example>, GenError> {
    let p = with_params(task, params)?;
    let bad = |e: String| GenError::Param(e);
    Ok(match kind(task)? {
        TaskKind::Block => {
            let cfg: BlockConfig = typed(p).map_err(bad)?;
            cfg.batch(seed, split, 0, n)?
        }
        TaskKind::Indirect => {
            let cfg: IndirectConfig = typed(p).map_err(bad)?;
            cfg.batch(seed, split, 0, n)?
        }
        TaskKind::Igsm => {
            let cfg: IgsmConfig = typed(p).map_err(bad)?;
            cfg.batch(seed, split, 0, n)?
        }
        TaskKind::Needle => {
            let cfg: NeedleConfig = typed(p).map_err(bad)?;
            cfg.batch(seed, split, 0, n)?
        }
        TaskKind::Corpus => corpus_config(&p)?.batch(seed, split, 0, n)?,
    })
}

/// `n` examples of `task` from `split` and `seed`, one JSON object per line.
pub fn gen_lines(
    task: &str,
    params: &[String],
    n: usize,
    seed: u64,
    split: Split,
) -> Result<Vec<String>, GenError> {
    gen_lines_inner(task, params, n, seed, split).map_err(|e| blame_params(e, params))
}

/// See [`gen_lines`].
fn gen_lines_inner(
    task: &str,
    params: &[String],
    n: usize,
    seed: u64,
    split: Split,
) -> Result<Vec<String>, GenError> {
    let p = with_params(task, params)?;
    let bad = |e: String| GenError::Param(e);
    let mut out = Vec::with_capacity(n);
    match kind(task)? {
        TaskKind::Block => {
            let cfg: BlockConfig = typed(p.clone()).map_err(bad)?;
            cfg.validate()?;
            for (i, ex) in cfg.batch(seed, split, 0, n)?.into_iter().enumerate() {
                let mut line = json!({"task": "block", "index": i, "seed": seed,
                    "input": ex.input, "target": ex.target, "mask": ex.mask});
                merge(&mut line, &p);
                out.push(line.to_string());
            }
        }
        TaskKind::Indirect => {
            let cfg: IndirectConfig = typed(p.clone()).map_err(bad)?;
            cfg.validate()?;
            for i in 0..n {
                let s = cfg.sample(seed, split, i as u64)?;
                let ex = cfg.example(seed, split, i as u64)?;
                let mut line = json!({"task": "indirect", "index": i, "seed": seed,
                    "text": s.text, "source": s.source, "query": s.query.to_string(),
                    "shift": s.shift, "answer": s.target.to_string(),
                    "input": ex.input, "target": ex.target, "mask": ex.mask});
                merge(&mut line, &p);
                out.push(line.to_string());
            }
        }
        TaskKind::Igsm => {
            let cfg: IgsmConfig = typed(p.clone()).map_err(bad)?;
            cfg.validate()?;
            for i in 0..n {
                let problem = cfg.sample(seed, split, i as u64)?;
                let ex = cfg.encode_problem(&problem)?;
                let r = problem.answer_positions();
                let mut line = json!({"task": "igsm", "index": i, "seed": seed,
                    "text": tasks::igsm::render(&problem), "prompt": problem.prompt(),
                    "completion": problem.completion(), "answer": problem.answer(),
                    "ops": problem.ops(), "structure_hash": problem.structure_hash().to_string(),
                    "answer_positions": [r.start, r.end],
                    "input": ex.input, "target": ex.target, "mask": ex.mask});
                merge(&mut line, &p);
                out.push(line.to_string());
            }
        }
        TaskKind::Needle => {
            let cfg: NeedleConfig = typed(p.clone()).map_err(bad)?;
            cfg.validate()?;
            for i in 0..n {
                let s = cfg.sample(seed, split, i as u64)?;
                let ex = cfg.example(seed, split, i as u64)?;
                let mut line = json!({"task": "needle", "index": i, "seed": seed,
                    "text": s.text, "key": s.key, "value": s.value,
                    "needle_start": s.needle_start, "query_start": cfg.query_start(),
                    "input": ex.input, "target": ex.target, "mask": ex.mask});
                merge(&mut line, &p);
                out.push(line.to_string());
            }
        }
        TaskKind::Corpus => {
            let cfg = corpus_config(&p)?;
            for (i, ex) in cfg.batch(seed, split, 0, n)?.into_iter().enumerate() {
                let mut line = json!({"task": "corpus", "index": i, "seed": seed,
                    "input": ex.input, "target": ex.target, "mask": ex.mask});
                merge(&mut line, &p);
                out.push(line.to_string());
            }
        }
    }
    Ok(out)
}

fn merge(line: &mut Value, params: &Value) {
    let obj = line.as_object_mut().unwrap();
    for (k, v) in params.as_object().unwrap() {
        obj.insert(k.clone(), v.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_lines_carry_params_and_targets() {
        let lines = gen_lines(
            "block",
            &["block_len=3".into(), "seq_len=8".into()],
            2,
            5,
            Split::Train,
        )
        .unwrap();
        assert_eq!(lines.len(), 2);
        let v: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(v["block_len"], 3);
        assert_eq!(v["input"].as_array().unwrap().len(), 8);
        let input: Vec<u64> = v["input"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        let target: Vec<u64> = v["target"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        // copy, noise 0: every scored target is the input token B − 1 back.
        for t in 2..8 {
            assert_eq!(target[t], input[t + 1 - 3]);
        }
    }

    #[test]
    fn bad_params_are_one_line() {
        let e = gen_lines("block", &["blok_len=3".into()], 1, 0, Split::Train)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown parameter `blok_len`"), "{e}");
        assert!(e.contains("did you mean `block_len`?"), "{e}");
        let e = gen_lines("sudoku", &[], 1, 0, Split::Train)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "unknown task `sudoku`; available tasks: block, indirect, igsm, needle, corpus"
        );
        let e = gen_lines("neadle", &[], 1, 0, Split::Train)
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("did you mean `needle`?"), "{e}");
        let e = gen_lines("corpus", &["corpus=nowhere".into()], 1, 0, Split::Train)
            .unwrap_err()
            .to_string();
        assert!(e.contains("nowhere") && !e.contains('\n'), "{e}");
        let e = gen_lines("block", &["block_len=99".into()], 1, 0, Split::Train)
            .unwrap_err()
            .to_string();
        assert!(e.contains("block_len = 99 is out of range"), "{e}");
        // Type errors name the parameter (issue 16).
        let e = gen_lines("block", &["block_len=abc".into()], 1, 0, Split::Train)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "--param block_len: invalid type: string \"abc\", expected usize"
        );
        // A context longer than a run's is refused before anything is allocated (issue 16).
        let e = gen_lines("block", &["seq_len=99999999999".into()], 1, 0, Split::Train)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "--param seq_len=99999999999: seq_len = 99999999999 is out of range: must be in 2..=65536"
        );
    }

    #[test]
    fn indirect_lines_are_self_consistent() {
        for line in gen_lines("indirect", &[], 20, 1, Split::Eval).unwrap() {
            let v: Value = serde_json::from_str(&line).unwrap();
            let text = v["text"].as_str().unwrap();
            let answer = v["answer"].as_str().unwrap().chars().next().unwrap();
            assert_eq!(tasks::indirect::solve(text), Some(answer), "{text}");
        }
    }

    #[test]
    fn igsm_lines_check_and_carry_text() {
        let lines = gen_lines(
            "igsm",
            &["ops=4".into(), "distractors=2".into()],
            5,
            3,
            Split::Eval,
        )
        .unwrap();
        assert_eq!(lines.len(), 5);
        for line in lines {
            let v: Value = serde_json::from_str(&line).unwrap();
            let text = v["text"].as_str().unwrap();
            assert_eq!(
                tasks::igsm::check(text).unwrap() as u64,
                v["answer"].as_u64().unwrap()
            );
            assert_eq!(v["ops"], 4);
            assert_eq!(v["distractors"], 2);
            let prompt = v["prompt"].as_str().unwrap();
            let completion = v["completion"].as_str().unwrap();
            assert_eq!(format!("{prompt}{completion}"), text);
            assert_eq!(v["input"].as_array().unwrap().len(), 512);
        }
        let e = gen_lines("igsm", &["ops=0".into()], 1, 0, Split::Train)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "--param ops=0: ops = 0 is out of range: must be in 1..=20"
        );
    }

    #[test]
    fn needle_lines_place_the_needle_at_depth() {
        let lines = gen_lines(
            "needle",
            &["seq_len=256".into(), "depth=0.5".into()],
            3,
            0,
            Split::Train,
        )
        .unwrap();
        for line in lines {
            let v: Value = serde_json::from_str(&line).unwrap();
            let text = v["text"].as_str().unwrap();
            assert_eq!(text.len(), 256);
            // Default key 3 + value 4: F = 256 − 18 = 238, start = round(0.5 · 238) = 119.
            assert_eq!(v["needle_start"], 119);
            let key = v["key"].as_str().unwrap();
            assert_eq!(&text[119..122], key);
            assert!(text.ends_with(&format!("?{key}:{}", v["value"].as_str().unwrap())));
        }
        let e = gen_lines("needle", &["haystack=hay".into()], 1, 0, Split::Train)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--param haystack: unknown variant `hay`, expected `noise` or `pairs`"),
            "{e}"
        );
    }
}
