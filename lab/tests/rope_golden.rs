//! The scaling registry against golden vectors computed independently with NumPy
//! (`scripts/rope_golden.py` → `lab/tests/data/rope_golden.json`), to 1e-6 relative.

use lab::model::scaling::{RopeScaling, ScalingKind, scaled_inv_freq};
use serde_json::Value;

#[test]
fn registry_matches_golden_vectors() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/rope_golden.json"
    ))
    .unwrap();
    let cases: Vec<Value> = serde_json::from_str(&text).unwrap();
    assert!(cases.len() >= 9);
    for case in cases {
        let c = &case["case"];
        let kind: ScalingKind = serde_json::from_value(c["kind"].clone()).unwrap();
        let mut s = RopeScaling {
            kind,
            ..Default::default()
        };
        if let Some(f) = c["factor"].as_f64() {
            s.factor = f;
        }
        if let Some(l) = c["original_max_len"].as_u64() {
            s.original_max_len = l as usize;
        }
        s.seq_len = c["seq_len"].as_u64().map(|x| x as usize);
        if let Some(x) = c["beta_fast"].as_f64() {
            s.beta_fast = x;
        }
        if let Some(x) = c["beta_slow"].as_f64() {
            s.beta_slow = x;
        }
        if let Some(x) = c["truncate"].as_bool() {
            s.truncate = x;
        }
        if let Some(x) = c["low_freq_factor"].as_f64() {
            s.low_freq_factor = x;
        }
        if let Some(x) = c["high_freq_factor"].as_f64() {
            s.high_freq_factor = x;
        }
        let head_dim = c["head_dim"].as_u64().unwrap() as usize;
        let base = c["base"].as_f64().unwrap();
        let got = scaled_inv_freq(head_dim, base, &s).unwrap();
        let want: Vec<f64> = case["inv_freq"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(got.inv_freq.len(), want.len(), "{c}");
        for (i, (g, w)) in got.inv_freq.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs(),
                "{c}: inv_freq[{i}] = {g}, golden {w}"
            );
        }
        let att = case["attention_factor"].as_f64().unwrap();
        assert!((got.attention_factor - att).abs() <= 1e-12, "{c}");
    }
}
