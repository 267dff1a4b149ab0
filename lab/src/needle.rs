//! Needle-retrieval attention probe (issue 18; docs/analysis-rules.md R33): where the token that
//! predicts the needle's value looks, at the training length and beyond it.
//!
//! A trained needle model retrieves the value `key:value;` hidden in a haystack when the query
//! `?key:` asks for it ([`tasks::needle`]). At the query's `:` (position `t`, the one that predicts
//! the value's first character) each head spreads its attention over the needle record's `R`
//! positions and the haystack's `H` positions (everything before the query outside the needle).
//! Two numbers per head separate why a head stops finding the needle in a longer context:
//!
//! - the **needle share** `s = Σ_{p ∈ needle} a_tp`, mean over contexts;
//! - the **log-ratio** `r = ln(Σ a_needle / Σ R) − ln(Σ a_haystack / Σ H)` (sums over contexts): the
//!   log of the mean attention per needle position over the mean attention per haystack position.
//!   Under a softmax, `r` is the needle's log-sum-exp score advantage over the haystack's mean key,
//!   independent of how many keys there are. If `r` holds while `s` falls, the needle is only
//!   *diluted* among more keys; if `r` falls, keys score differently than in training
//!   (*distortion*).
//!
//! Also: the **far share**, the part of the haystack attention on keys at distance `t − p ≥ L`
//! (distances the model never saw when trained at `L` tokens), and the **aim share**, the part of
//! the needle attention on the needle's copy of the very character the row predicts (R34).

use burn::module::Module;
use burn::tensor::{Device, Int, Tensor, TensorData};
use tasks::Split;

use crate::config::{RunConfig, TaskGen};
use crate::model::Transformer;

/// Attention sums of one query row (see [`row_sums`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RowSums {
    /// Attention mass on the needle record.
    pub needle_mass: f64,
    /// Needle positions counted.
    pub needle_count: f64,
    /// Attention mass on haystack positions.
    pub haystack_mass: f64,
    /// Haystack positions counted.
    pub haystack_count: f64,
    /// Attention mass on haystack positions at distance `≥ train_len` from the query row.
    pub far_mass: f64,
    /// Attention mass on the needle's own copy of the character the row predicts.
    pub aim_mass: f64,
}

impl RowSums {
    fn add(&mut self, o: &RowSums) {
        self.needle_mass += o.needle_mass;
        self.needle_count += o.needle_count;
        self.haystack_mass += o.haystack_mass;
        self.haystack_count += o.haystack_count;
        self.far_mass += o.far_mass;
        self.aim_mass += o.aim_mass;
    }
}

/// Split the attention row `row` of query position `t` (`row[p]` for keys `p ≤ t`) into the needle
/// record `needle` (positions `needle.start..needle.end`) and the haystack, the positions
/// `0..query_start` outside the needle; keys from `query_start` to `t` (the query itself) are
/// neither. Haystack keys at distance `t − p ≥ train_len` also count as far; `aim` (a needle
/// position: the needle's copy of the character the row predicts) also counts as aimed.
///
/// # Panics
/// If `t ≥ row.len()`, `query_start > t`, the needle does not end by `query_start` or `aim` is
/// outside the needle.
pub fn row_sums(
    row: &[f32],
    t: usize,
    needle: std::ops::Range<usize>,
    aim: usize,
    query_start: usize,
    train_len: usize,
) -> RowSums {
    assert!(t < row.len() && query_start <= t && needle.end <= query_start);
    assert!(needle.contains(&aim), "the aimed position is in the needle");
    let mut s = RowSums {
        aim_mass: row[aim] as f64,
        ..RowSums::default()
    };
    for (p, &a) in row.iter().enumerate().take(query_start) {
        let a = a as f64;
        if needle.contains(&p) {
            s.needle_mass += a;
            s.needle_count += 1.0;
        } else {
            s.haystack_mass += a;
            s.haystack_count += 1.0;
            if t - p >= train_len {
                s.far_mass += a;
            }
        }
    }
    s
}

/// One head's needle statistics at one context length (see the [module docs](self)).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct NeedleHead {
    /// Layer index.
    pub layer: usize,
    /// Head index.
    pub head: usize,
    /// Mean attention mass on the needle record, `s` (in `[0, 1]`).
    pub needle_share: f64,
    /// `r`, nats: ln(mean attention per needle position / mean attention per haystack position).
    pub log_ratio: f64,
    /// Part of the haystack attention on keys at distance ≥ the training length (in `[0, 1]`).
    pub far_share: f64,
    /// Part of the needle attention on the needle's copy of the predicted character (in `[0, 1]`;
    /// R34's `a_j`).
    pub aim_share: f64,
    /// Needle positions per context (the record length `R`).
    pub needle_positions: f64,
    /// Mean haystack positions per context (`H`).
    pub haystack_positions: f64,
}

impl NeedleHead {
    fn from_sums(layer: usize, head: usize, s: &RowSums, contexts: usize) -> Self {
        let m = contexts as f64;
        NeedleHead {
            layer,
            head,
            needle_share: s.needle_mass / m,
            log_ratio: (s.needle_mass / s.needle_count).ln()
                - (s.haystack_mass / s.haystack_count).ln(),
            far_share: if s.haystack_mass > 0.0 {
                s.far_mass / s.haystack_mass
            } else {
                0.0
            },
            aim_share: if s.needle_mass > 0.0 {
                s.aim_mass / s.needle_mass
            } else {
                0.0
            },
            needle_positions: s.needle_count / m,
            haystack_positions: s.haystack_count / m,
        }
    }
}

/// The heads' needle statistics on the query row that predicts one value character.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueRow {
    /// Which value character the row predicts (0: the query's `:` predicts the first).
    pub value_index: usize,
    /// Greedy (argmax) accuracy of that character over the contexts.
    pub accuracy: f64,
    /// `[layer][head]`.
    pub heads: Vec<Vec<NeedleHead>>,
}

/// Needle statistics of every head of `model` at context `cfg.seq_len`, over the first `n` held-out
/// contexts of the run's seed (the needle task of `cfg`, so the trained task at another length),
/// one [`ValueRow`] per value character (row 0, the query's `:`, is R33's), from one forward pass
/// per chunk of 32 contexts. `train_len` is the length the model was trained at (for the far
/// share). Materialises `seq × seq` probabilities per head.
///
/// # Panics
/// If `cfg` is not a needle-retrieval run or `n = 0`.
pub fn needle_attention(
    model: &Transformer,
    cfg: &RunConfig,
    train_len: usize,
    device: &Device,
    n: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Vec<ValueRow> {
    let TaskGen::Needle(task) = cfg.task() else {
        panic!("needle_attention needs a needle-retrieval run");
    };
    assert!(n > 0, "needle_attention needs at least one context");
    let model = model.valid();
    let device = device.clone().inner();
    let seq = cfg.seq_len;
    let (layers, heads) = (cfg.n_layers, cfg.n_heads);
    let query_start = task.query_start();
    // The query `?key:`: its `:` (row t0) predicts the value's first character, row t0 + j the
    // character j.
    let t0 = query_start + task.key_len + 1;
    let rows = task.value_len;
    let record = task.record_len();
    let mut right = vec![0usize; rows];
    let mut sums = vec![vec![vec![RowSums::default(); heads]; layers]; rows];
    let indices: Vec<u64> = (0..n as u64).collect();
    // Contexts per forward pass: up to 32, fewer where their attention weights
    // ([contexts, heads, seq, seq] per layer) would pass 2^26 floats (256 MiB).
    let per_pass = ((1usize << 26) / (heads * seq * seq).max(1)).clamp(1, 32);
    let mut done = 0;
    for chunk_idx in indices.chunks(per_pass) {
        done += chunk_idx.len();
        let samples: Vec<_> = chunk_idx
            .iter()
            .map(|&i| {
                task.sample(cfg.seed, Split::Eval, i)
                    .expect("config validated")
            })
            .collect();
        // The text is the whole context (`seq` characters); the model reads it, row t predicts
        // character t + 1.
        let ids: Vec<i64> = samples
            .iter()
            .flat_map(|s| s.text.chars())
            .map(|c| tasks::needle::encode(c).expect("text is in the vocabulary") as i64)
            .collect();
        let tokens = Tensor::<2, Int>::from_data(
            TensorData::new(ids.clone(), [samples.len(), seq]),
            &device,
        );
        let (logits, layer_probs) = model.forward_with_probs(tokens);
        let predicted = logits
            .argmax(2)
            .into_data()
            .convert::<i64>()
            .try_to_vec::<i64>()
            .expect("argmax gives integers");
        for b in 0..samples.len() {
            for (j, r) in right.iter_mut().enumerate() {
                let t = t0 + j;
                *r += usize::from(predicted[b * seq + t] == ids[b * seq + t + 1]);
            }
        }
        for (l, probs) in layer_probs.into_iter().enumerate() {
            for (b, s) in samples.iter().enumerate() {
                let needle = s.needle_start..s.needle_start + record;
                for (j, sums_j) in sums.iter_mut().enumerate() {
                    let (t, aim) = (t0 + j, s.needle_start + task.key_len + 1 + j);
                    for (h, sum) in sums_j[l].iter_mut().enumerate() {
                        let row = &probs[((b * heads + h) * seq + t) * seq..][..seq];
                        sum.add(&row_sums(
                            row,
                            t,
                            needle.clone(),
                            aim,
                            query_start,
                            train_len,
                        ));
                    }
                }
            }
        }
        progress(done, n);
    }
    sums.iter()
        .zip(&right)
        .enumerate()
        .map(|(j, (sums_j, &r))| ValueRow {
            value_index: j,
            accuracy: r as f64 / n as f64,
            heads: sums_j
                .iter()
                .enumerate()
                .map(|(l, layer)| {
                    layer
                        .iter()
                        .enumerate()
                        .map(|(h, s)| NeedleHead::from_sums(l, h, s, n))
                        .collect()
                })
                .collect(),
        })
        .collect()
}

/// Most held-out contexts `lab needle-attention` averages over (`--n`).
pub const MAX_CONTEXTS: usize = 65_536;

/// `lab needle-attention`: load the run at `path` (a run or checkpoint folder), probe it at
/// `seq_len` over `n` held-out contexts on the CPU, and return one JSON line per value character
/// and head (the run's id, encoding, seed, both lengths, the value index and that character's
/// greedy accuracy, and [`NeedleHead`]'s fields).
///
/// # Errors
/// One line naming the problem: the checkpoint does not load, the run is not needle retrieval,
/// `n` is 0, or `seq_len` is shorter than the task needs.
pub fn needle_attention_command(
    path: &std::path::Path,
    seq_len: usize,
    n: usize,
) -> Result<Vec<String>, anyhow::Error> {
    let device = Device::default();
    let (train_cfg, model) = crate::checkpoint::load(path, &device)?;
    if !matches!(train_cfg.task(), TaskGen::Needle(_)) {
        anyhow::bail!(
            "{}: not a needle-retrieval run (task {})",
            path.display(),
            train_cfg.task.kind().name()
        );
    }
    if !(1..=MAX_CONTEXTS).contains(&n) {
        anyhow::bail!("--n {n} is out of range: must be in 1..={MAX_CONTEXTS}");
    }
    // One context's attention weights, every layer and head, are held at once: at most 2^30
    // floats (4 GiB).
    let per_context = train_cfg.n_layers * train_cfg.n_heads;
    let max_seq = (((1u64 << 30) / per_context.max(1) as u64) as f64).sqrt() as usize;
    if !(1..=max_seq.min(tasks::MAX_SEQ_LEN)).contains(&seq_len) {
        anyhow::bail!(
            "--seq-len {seq_len} is out of range: must be in 1..={} for this model ({} layers × {} heads of [seq, seq] attention weights, at most 4 GiB)",
            max_seq.min(tasks::MAX_SEQ_LEN),
            train_cfg.n_layers,
            train_cfg.n_heads
        );
    }
    let mut cfg = train_cfg.clone();
    cfg.seq_len = seq_len;
    cfg.validate()
        .map_err(|e| anyhow::anyhow!("--seq-len {seq_len}: {e}"))?;
    let mut ticker =
        crate::eval::Ticker::new(format!("needle-attention at seq_len {seq_len}"), "contexts");
    let rows = needle_attention(&model, &cfg, train_cfg.seq_len, &device, n, &mut |d, t| {
        ticker.tick(d, t)
    });
    Ok(rows
        .iter()
        .flat_map(|row| row.heads.iter().flatten().map(move |h| (row, h)))
        .map(|(row, h)| {
            let mut v = serde_json::to_value(h).expect("plain numbers");
            v["run_id"] = train_cfg.run_id().into();
            v["encoding"] = train_cfg.encoding.name().into();
            v["seed"] = train_cfg.seed.into();
            v["seq_len"] = seq_len.into();
            v["train_seq_len"] = train_cfg.seq_len.into();
            v["contexts"] = n.into();
            v["value_index"] = row.value_index.into();
            v["value_accuracy"] = row.accuracy.into();
            v.to_string()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_sums_split_needle_haystack_and_far_keys() {
        // 10 keys, query at 7..9, t = 9; needle at 2..4; trained at 5 tokens (far: p ≤ 4).
        let row = [0.05, 0.05, 0.3, 0.2, 0.1, 0.1, 0.1, 0.04, 0.03, 0.03];
        let s = row_sums(&row, 9, 2..4, 3, 7, 5);
        assert!((s.aim_mass - 0.2).abs() < 1e-7);
        assert!((s.needle_mass - 0.5).abs() < 1e-7);
        assert_eq!(s.needle_count, 2.0);
        assert!((s.haystack_mass - 0.4).abs() < 1e-7); // 0, 1, 4, 5, 6
        assert_eq!(s.haystack_count, 5.0);
        assert!((s.far_mass - 0.2).abs() < 1e-7); // 0, 1, 4 (distances 9, 8, 5)
        let h = NeedleHead::from_sums(0, 1, &s, 1);
        // r = ln(0.25 / 0.08).
        assert!((h.log_ratio - (0.25f64 / 0.08).ln()).abs() < 1e-6);
        assert!((h.far_share - 0.5).abs() < 1e-6);
        assert!((h.aim_share - 0.4).abs() < 1e-6);
    }

    #[test]
    fn log_ratio_ignores_the_number_of_keys() {
        // A softmax with the needle's score 3 above every haystack key's: r = 3 at any length.
        for hay in [10usize, 100, 1000] {
            let z = 2.0 * 3f64.exp() + hay as f64;
            let mut row = vec![(1.0 / z) as f32; hay];
            row.splice(0..0, [(3f64.exp() / z) as f32; 2]);
            row.extend([0.0f32; 3]); // the query
            let t = row.len() - 1;
            let s = row_sums(&row, t, 0..2, 1, hay + 2, 1 << 20);
            let h = NeedleHead::from_sums(0, 0, &s, 1);
            assert!((h.log_ratio - 3.0).abs() < 1e-4, "{hay}: {}", h.log_ratio);
            assert!((h.needle_share - 2.0 * 3f64.exp() / z).abs() < 1e-5);
            assert_eq!(h.far_share, 0.0);
            assert!((h.aim_share - 0.5).abs() < 1e-6);
        }
    }
}
