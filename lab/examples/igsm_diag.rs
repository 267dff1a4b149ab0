//! Where an iGSM model's solutions go wrong, character by character (issue 19, docs/analysis-rules.md:
//! "What the definition diagnostic showed", R38–R41). Teacher-forced argmax on 256 problems of a
//! trained run: each definition `l∘r` split into left name, operator and right name, with the kind of
//! each wrong guess (the other statement's operator, an operator absent from the prompt, another
//! name of the prompt, the two operands swapped); each copied number split into a leaf's first and
//! second digit and the operands' digits; greedy answer accuracy on the same set; four problems
//! printed with the model's wrong characters in upper case.
//!
//! ```text
//! cargo run --release -p lab --example igsm_diag -- RUN_DIR [eval|train] [OPS]
//! ```
//!
//! `eval`: held-out structures (default); `train`: new problems of training structures. `OPS`
//! scores problems of exactly that many operations (a mixture run's `min_ops` is dropped).
//! A lab tool for reading one run, not part of the sweeps: it panics on a non-iGSM run.

use burn::module::Module;
use burn::tensor::Device;
use lab::config::TaskGen;
use lab::decode::{SolutionRole, argmax_ids, solution_roles};
use std::path::Path;
use tasks::Split;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = Path::new(&args[1]);
    let split = if args.get(2).map(|s| s.as_str()) == Some("train") {
        Split::Train
    } else {
        Split::Eval
    };
    let start: u64 = if split == Split::Train { 1 << 40 } else { 0 };
    let device = Device::default();
    let (mut cfg, model) = lab::checkpoint::load(path, &device).unwrap();
    if let Some(k) = args.get(3) {
        if let lab::config::TaskConfig::Igsm(p) = &mut cfg.task {
            p.ops = k.parse().unwrap();
            p.min_ops = None;
        }
    }
    let set = if split == Split::Train {
        lab::decode::ProblemSet::TrainStructures
    } else {
        lab::decode::ProblemSet::HeldOut
    };
    let g = lab::decode::igsm_generation(&model, &cfg, &device, 256, set);
    println!(
        "greedy answer accuracy {:.4} valid {:.4}",
        g.answer_accuracy, g.solution_valid
    );
    let TaskGen::Igsm(task) = cfg.task() else {
        panic!()
    };
    let model = model.valid();
    let dev = device.clone().inner();
    let seq = cfg.seq_len;
    let n = 256usize;
    // def index stats: [scored, right] for index 0,1,2 within the definition
    let mut def = [[0usize; 2]; 3];
    let mut wrong_kind = std::collections::BTreeMap::<String, usize>::new();
    let mut shown = 0;
    let mut vals = std::collections::BTreeMap::<&'static str, [usize; 2]>::new();
    for s0 in (0..n).step_by(64) {
        let rows = 64.min(n - s0);
        let problems: Vec<_> = (s0..s0 + rows)
            .map(|i| task.sample(cfg.seed, split, start + i as u64).unwrap())
            .collect();
        let mut ids = vec![];
        for p in &problems {
            let ex = task.encode_problem(p).unwrap();
            ids.extend(ex.input.iter().map(|&t| t as i64));
        }
        let pred = argmax_ids(&model, ids, rows, seq, &dev);
        for (row, p) in problems.iter().enumerate() {
            let (prompt, comp) = (p.prompt(), p.completion());
            let roles = solution_roles(&comp);
            let cc: Vec<char> = comp.chars().collect();
            let mut k = 0;
            let mut line = String::new();
            // sub-labels of value chars
            let mut sub: Vec<&'static str> = Vec::new();
            {
                let body = match comp.rfind('#') {
                    Some(h) => &comp[..h],
                    None => &comp[..],
                };
                for step in body.split_inclusive(';') {
                    let b = step.strip_suffix(';').unwrap_or(step);
                    let parts: Vec<&str> = b.split('=').collect();
                    for (i, part) in parts.iter().enumerate() {
                        if i > 0 {
                            sub.push("-");
                        }
                        if parts.len() == 2 && i == 1 {
                            for (d, _) in part.chars().enumerate() {
                                sub.push(if d == 0 { "leaf-d0" } else { "leaf-d1" });
                            }
                        } else if parts.len() == 4 && i == 2 {
                            let mut seen_op = false;
                            for (d, c) in part.chars().enumerate() {
                                if "+-*".contains(c) {
                                    seen_op = true;
                                    sub.push("val-op");
                                } else if !seen_op {
                                    sub.push(if d == 0 { "lv-d0" } else { "lv-d1" });
                                } else {
                                    let prev = part.chars().nth(d - 1).unwrap();
                                    sub.push(if "+-*".contains(prev) {
                                        "rv-d0"
                                    } else {
                                        "rv-d1"
                                    });
                                }
                            }
                        } else {
                            for _ in part.chars() {
                                sub.push("-");
                            }
                        }
                    }
                    if step.ends_with(';') {
                        sub.push("-");
                    }
                }
            }
            for (j, r) in roles.iter().enumerate() {
                let t = prompt.len() + j - 1;
                let pc = tasks::igsm::decode(pred[row * seq + t] as u32).unwrap_or('_');
                let ok = pc == cc[j];
                line.push(if ok { cc[j] } else { pc.to_ascii_uppercase() });
                if *r == SolutionRole::Value || *r == SolutionRole::Leaf {
                    let e = vals
                        .entry(sub.get(j).copied().unwrap_or("?"))
                        .or_insert([0usize; 2]);
                    e[0] += 1;
                    e[1] += ok as usize;
                }
                if *r == SolutionRole::Operator {
                    def[1][0] += 1;
                    def[1][1] += ok as usize;
                    if !ok {
                        let ops_in_prompt: String =
                            prompt.chars().filter(|c| "+-*".contains(*c)).collect();
                        let kind = if ops_in_prompt.contains(pc) {
                            "op-from-other-statement"
                        } else {
                            "op-not-in-prompt"
                        };
                        *wrong_kind.entry(kind.to_string()).or_default() += 1;
                    }
                }
                if *r == SolutionRole::Definition {
                    let slot = if k % 2 == 0 { 0 } else { 2 };
                    def[slot][0] += 1;
                    def[slot][1] += ok as usize;
                    if !ok {
                        let in_prompt = prompt.contains(pc);
                        let other = if slot == 0 { cc[j + 2] } else { cc[j - 2] };
                        let kind = if pc == other {
                            "swapped-operand".to_string()
                        } else if in_prompt {
                            "other-name-in-prompt".into()
                        } else {
                            format!("not-in-prompt:{pc}")
                        };
                        *wrong_kind.entry(kind).or_default() += 1;
                    }
                    k += 1;
                }
            }
            if shown < 4 {
                println!(
                    "{prompt}  |  {comp}\n{}{}",
                    " ".repeat(prompt.len() + 4),
                    line
                );
                shown += 1;
            }
        }
    }
    for (i, d) in def.iter().enumerate() {
        println!(
            "definition char {i}: {}/{} = {:.3}",
            d[1],
            d[0],
            d[1] as f64 / d[0] as f64
        );
    }
    println!("{wrong_kind:?}");
    for (k, v) in &vals {
        println!(
            "value {k}: {}/{} = {:.3}",
            v[1],
            v[0],
            v[1] as f64 / v[0] as f64
        );
    }
}
