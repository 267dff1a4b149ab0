//! Indirect-indexing diagnostics (PoPE paper, Gopalakrishnan et al., arXiv 2509.10534, §4; SCIENCE.md
//! §2): held-out accuracy split by the example's signed shift `k`.
//!
//! The task's final-token accuracy mixes two skills. At `k = 0` the answer is the query letter itself,
//! already in the prompt: copying it needs neither the string nor any position. At `k ≠ 0` the model
//! must find the query letter in the string (content) and move `k` places from it (position), the
//! part the diagnostic is about. Shifts are triangular (`P(k | N) = (N − |k|) / V(N)`,
//! [`tasks::indirect`]), so on a rung with few letters and small shifts `k = 0` is a quarter of the
//! examples (`N = 5, max_shift = 2`: `P(0) = 5/19`), and a model that only copies at `k = 0` and
//! guesses among the string's letters otherwise scores ≈ `P(0) + (1 − P(0)) / (N − 1)`. This split
//! tells that model from one that has learned the offset.

use std::collections::BTreeMap;

use burn::module::Module;
use burn::tensor::{Device, Int, Tensor, TensorData};
use tasks::Split;

use crate::config::{RunConfig, TaskGen};
use crate::model::Transformer;

/// Greedy (argmax) accuracy at the target position of held-out examples, by shift.
#[derive(Clone, Debug, PartialEq)]
pub struct ShiftAccuracy {
    /// `k → (examples, right)`, for every shift that occurred.
    pub by_shift: BTreeMap<i32, (usize, usize)>,
}

impl ShiftAccuracy {
    /// Examples scored.
    pub fn n(&self) -> usize {
        self.by_shift.values().map(|&(n, _)| n).sum()
    }

    /// Accuracy over the shifts `k` for which `keep(k)`; `None` when no example has such a shift.
    pub fn accuracy_where(&self, keep: impl Fn(i32) -> bool) -> Option<f64> {
        let (n, right) = self
            .by_shift
            .iter()
            .filter(|(k, _)| keep(**k))
            .fold((0, 0), |(n, r), (_, &(m, s))| (n + m, r + s));
        (n > 0).then(|| right as f64 / n as f64)
    }

    /// Accuracy on `k = 0` (copy the query letter).
    pub fn shift0(&self) -> Option<f64> {
        self.accuracy_where(|k| k == 0)
    }

    /// Accuracy on `k ≠ 0` (find the letter, then move).
    pub fn nonzero(&self) -> Option<f64> {
        self.accuracy_where(|k| k != 0)
    }

    /// One line per `|k|`: `|k|=0 0.998 (n=251)  |k|=1 0.180 (n=402) …`.
    pub fn describe(&self) -> String {
        let mut by_abs: BTreeMap<u32, (usize, usize)> = BTreeMap::new();
        for (k, &(n, r)) in &self.by_shift {
            let e = by_abs.entry(k.unsigned_abs()).or_default();
            e.0 += n;
            e.1 += r;
        }
        by_abs
            .iter()
            .map(|(a, &(n, r))| format!("|k|={a} {:.3} (n={n})", r as f64 / n.max(1) as f64))
            .collect::<Vec<_>>()
            .join("  ")
    }
}

/// Score the first `n` held-out examples of an indirect-indexing run (the same examples, in the same
/// order, as the run's evaluations: [`Split::Eval`] from index 0) by greedy argmax at the target
/// position, and split the result by shift. Forward passes of at most 256 examples
/// (`[256, seq_len]` tokens).
///
/// # Panics
/// If `cfg` is not an indirect-indexing run (callers check `cfg.task`).
pub fn accuracy_by_shift(
    model: &Transformer,
    cfg: &RunConfig,
    device: &Device,
    n: usize,
) -> ShiftAccuracy {
    let TaskGen::Indirect(task) = cfg.task() else {
        panic!("accuracy_by_shift needs an indirect-indexing run");
    };
    let model = model.valid();
    let device = device.clone().inner();
    let mut by_shift: BTreeMap<i32, (usize, usize)> = BTreeMap::new();
    let seq = cfg.seq_len;
    for start in (0..n).step_by(256) {
        let rows = (n - start).min(256);
        let mut ids = Vec::with_capacity(rows * seq);
        let mut wanted = Vec::with_capacity(rows);
        for i in 0..rows {
            let s = task
                .sample(cfg.seed, Split::Eval, (start + i) as u64)
                .expect("config validated");
            let ex = task.encode_sample(&s).expect("a drawn sample encodes");
            let t = ex
                .mask
                .iter()
                .position(|&m| m)
                .expect("one scored position");
            ids.extend(ex.input.iter().map(|&x| x as i64));
            wanted.push((s.shift, t, ex.target[t]));
        }
        let pred = crate::decode::argmax_ids(&model, ids, rows, seq, &device);
        for (row, &(k, t, target)) in wanted.iter().enumerate() {
            let e = by_shift.entry(k).or_default();
            e.0 += 1;
            e.1 += usize::from(pred[row * seq + t] == target as i64);
        }
    }
    ShiftAccuracy { by_shift }
}

/// What a prompt position is to the final (target-predicting) token, for the "what vs where" view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// The query letter's occurrence in the string (where the content match lands).
    Source,
    /// The answer's position in the string (`shift` places from the source).
    Target,
    /// Any other letter of the string.
    OtherLetter,
    /// The query token after the first comma.
    Query,
    /// Commas and the shift's characters.
    Rest,
}

impl Role {
    /// Every role, in table order.
    pub const ALL: [Role; 5] = [
        Role::Source,
        Role::Target,
        Role::OtherLetter,
        Role::Query,
        Role::Rest,
    ];

    /// The name written to `attention.parquet`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Source => "source",
            Role::Target => "target",
            Role::OtherLetter => "other_letter",
            Role::Query => "query",
            Role::Rest => "rest",
        }
    }
}

/// The role of each prompt position of a sample (`[N letters] , query , shift ,`), positions past the
/// prompt (the answer, padding) `None`.
pub fn roles(s: &tasks::indirect::IndirectSample, seq_len: usize) -> Vec<Option<Role>> {
    let n = s.source.chars().count();
    let src = s
        .source
        .chars()
        .position(|c| c == s.query)
        .expect("the query letter is in the string");
    let tgt = (src as i64 + s.shift as i64) as usize;
    let prompt = s.text.chars().count();
    (0..seq_len)
        .map(|p| match p {
            _ if p == src => Some(Role::Source),
            _ if p == tgt => Some(Role::Target),
            _ if p < n => Some(Role::OtherLetter),
            _ if p == n + 1 => Some(Role::Query),
            _ if p < prompt => Some(Role::Rest),
            _ => None,
        })
        .collect()
}

/// Mean attention of the final prompt token (the position that predicts the answer) on each [`Role`],
/// per layer and head, over the first `n` held-out examples with shift `k ≠ 0` (at `k = 0` source and
/// target coincide), drawn from the first `20 · n` held-out examples. Returns the number of examples
/// used and `shares[layer][head][role]`, which sums to 1 over roles (the final token's row is a causal
/// softmax over the prompt); `(0, [])` when no example has `k ≠ 0` (`max_shift = 0`). Materialises
/// `seq × seq` scores per head: for short prompts.
///
/// # Panics
/// If `cfg` is not an indirect-indexing run.
pub fn final_token_attention(
    model: &Transformer,
    cfg: &RunConfig,
    device: &Device,
    n: usize,
) -> (usize, Vec<Vec<[f64; 5]>>) {
    let TaskGen::Indirect(task) = cfg.task() else {
        panic!("final_token_attention needs an indirect-indexing run");
    };
    let model = model.valid();
    let device = device.clone().inner();
    let seq = cfg.seq_len;
    let samples: Vec<_> = (0..20 * n as u64)
        .map(|i| {
            task.sample(cfg.seed, Split::Eval, i)
                .expect("config validated")
        })
        .filter(|s| s.shift != 0)
        .take(n)
        .collect();
    if samples.is_empty() {
        return (0, Vec::new());
    }
    let (layers, heads) = (cfg.n_layers, cfg.n_heads);
    let mut shares = vec![vec![[0.0f64; 5]; heads]; layers];
    for chunk in samples.chunks(128) {
        let mut ids = Vec::with_capacity(chunk.len() * seq);
        for s in chunk {
            let ex = task.encode_sample(s).expect("a drawn sample encodes");
            ids.extend(ex.input.iter().map(|&x| x as i64));
        }
        let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [chunk.len(), seq]), &device);
        let (_, layer_probs) = model.forward_with_probs(tokens);
        for (l, probs) in layer_probs.into_iter().enumerate() {
            for (b, s) in chunk.iter().enumerate() {
                let t = s.text.chars().count() - 1;
                let role = roles(s, seq);
                for h in 0..heads {
                    let row = &probs[((b * heads + h) * seq + t) * seq..][..seq];
                    for (p, &w) in row.iter().enumerate().take(t + 1) {
                        let r = role[p].expect("positions up to the final token have roles");
                        shares[l][h][r as usize] += w as f64;
                    }
                }
            }
        }
    }
    let m = samples.len() as f64;
    for layer in &mut shares {
        for head in layer.iter_mut() {
            head.iter_mut().for_each(|v| *v /= m);
        }
    }
    (samples.len(), shares)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny test model on an indirect rung (`seq_len` 16).
    fn rung(min_letters: usize, max_letters: usize, max_shift: usize) -> RunConfig {
        let mut cfg = crate::config::tests::tiny();
        cfg.task = crate::config::TaskConfig::Indirect(tasks::indirect::IndirectParams {
            min_letters,
            max_letters,
            max_shift,
            ..Default::default()
        });
        cfg.vocab_size = tasks::indirect::vocab_size();
        cfg.seq_len = 16;
        cfg.validate().unwrap();
        cfg
    }

    #[test]
    fn accuracies_pool_the_right_shifts() {
        let a = ShiftAccuracy {
            by_shift: BTreeMap::from([(-2, (10, 1)), (-1, (10, 3)), (0, (20, 19)), (2, (10, 0))]),
        };
        assert_eq!(a.n(), 50);
        assert_eq!(a.shift0(), Some(0.95));
        assert_eq!(a.nonzero(), Some(4.0 / 30.0));
        assert_eq!(a.accuracy_where(|k| k > 5), None);
        assert_eq!(
            a.describe(),
            "|k|=0 0.950 (n=20)  |k|=1 0.300 (n=10)  |k|=2 0.050 (n=20)"
        );
    }

    #[test]
    fn roles_of_the_paper_example() {
        let s = tasks::indirect::IndirectSample {
            source: "QEOHoUbKfeSrMVNlCzXu".into(),
            query: 'z',
            shift: -3,
            target: 'N',
            text: "QEOHoUbKfeSrMVNlCzXu,z,-3,".into(),
        };
        let r = roles(&s, 30);
        assert_eq!(r[17], Some(Role::Source)); // 'z'
        assert_eq!(r[14], Some(Role::Target)); // 'N'
        assert_eq!(r[0], Some(Role::OtherLetter));
        assert_eq!(r[20], Some(Role::Rest)); // ','
        assert_eq!(r[21], Some(Role::Query));
        assert_eq!(r[22..26], [Some(Role::Rest); 4]); // ",-3,": the last is the final token
        assert_eq!(r[26], None);
        assert_eq!(r.iter().filter(|x| x.is_some()).count(), 26);
    }

    /// Each (layer, head) row of shares is a probability over roles.
    #[test]
    fn final_token_shares_sum_to_one() {
        let cfg = rung(5, 8, 2);
        let device = Device::flex();
        let model = cfg.model().init(cfg.seed, &device);
        let (n, shares) = final_token_attention(&model, &cfg, &device, 40);
        assert_eq!(n, 40);
        assert_eq!(shares.len(), cfg.n_layers);
        for head in shares.iter().flatten() {
            assert!((head.iter().sum::<f64>() - 1.0).abs() < 1e-4, "{head:?}");
            assert!(head.iter().all(|&v| v >= 0.0));
        }
    }

    /// With `max_shift = 0` every answer is the query letter: no example for the attention view.
    #[test]
    fn no_shifted_example_gives_no_attention_rows() {
        let cfg = rung(5, 5, 0);
        let device = Device::flex();
        let model = cfg.model().init(cfg.seed, &device);
        assert_eq!(
            final_token_attention(&model, &cfg, &device, 8),
            (0, Vec::new())
        );
        let a = accuracy_by_shift(&model, &cfg, &device, 10);
        assert_eq!((a.n(), a.nonzero()), (10, None));
    }

    /// The split counts every example once and, on the first examples, agrees with the run's own
    /// evaluation stream (same seeds): an untrained model's shift-0 share matches the task's law.
    #[test]
    fn untrained_model_scores_every_example_once() {
        let cfg = rung(5, 5, 2);
        let device = Device::flex();
        let model = cfg.model().init(cfg.seed, &device);
        let a = accuracy_by_shift(&model, &cfg, &device, 300);
        assert_eq!(a.n(), 300);
        assert!(a.by_shift.keys().all(|k| (-2..=2).contains(k)));
        // N = 5, max_shift = 2: P(0) = 5/19 ≈ 0.263; 300 draws, ±4 sd ≈ ±0.10.
        let p0 = a.by_shift[&0].0 as f64 / 300.0;
        assert!((p0 - 5.0 / 19.0).abs() < 0.10, "P(k = 0) = {p0}");
    }
}
