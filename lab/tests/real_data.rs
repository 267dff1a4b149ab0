//! The real corpora (`make data`): their converted files, MI profiles on them, the corpus task,
//! and the `lab mi` / `lab recommend` commands. Every test prints why it skips when `data/` has
//! not been fetched; CI runs `make data` first, so there they run.

use std::path::{Path, PathBuf};
use std::process::Command;

use lab::tasks::Split;
use lab::tasks::granularity::{Granularity, corpus_stream};
use lab::tasks::mi::{MiConfig, profile_stream};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../data")
}

/// The data folder if `corpus` has been fetched, else `None` after printing why.
fn have(corpus: &str) -> Option<PathBuf> {
    let spec = lab::tasks::corpus::spec(corpus).unwrap();
    let d = data_dir();
    if d.join(spec.output).is_file() {
        Some(d)
    } else {
        println!(
            "SKIP: {} is missing (run `make data`)",
            d.join(spec.output).display()
        );
        None
    }
}

#[test]
fn ecoli_is_the_whole_genome_in_acgt() {
    let Some(d) = have("ecoli") else { return };
    let s = lab::tasks::corpus::load_text(&d, "ecoli").unwrap();
    let seq = s.trim_end();
    // NC_008253 (E. coli 536): 4,938,920 bp
    assert_eq!(seq.len(), 4_938_920);
    assert!(seq.bytes().all(|b| b"ACGT".contains(&b)));
    let gc = seq.bytes().filter(|b| *b == b'G' || *b == b'C').count() as f64 / seq.len() as f64;
    assert!((gc - 0.505).abs() < 0.01, "GC content {gc}");
}

#[test]
fn shakespeare_is_plain_text() {
    let Some(d) = have("shakespeare") else { return };
    let s = lab::tasks::corpus::load_text(&d, "shakespeare").unwrap();
    assert!(
        s.len() > 4_500_000 && s.len() < 5_500_000,
        "{} bytes",
        s.len()
    );
    assert!(s.contains("If music be the food of love, play on;\n"));
    assert!(!s.contains("**") && !s.contains("\n#"));
}

#[test]
fn chorales_are_four_voice_frames() {
    let Some(d) = have("chorales") else { return };
    let ch = lab::tasks::corpus::load_chorales(&d).unwrap();
    assert!((300..=420).contains(&ch.len()), "{} chorales", ch.len());
    for c in &ch {
        assert!(c.len() >= 16, "a chorale of {} sixteenths", c.len());
        // every voice starts with a pitch or a rest, never a hold
        assert!(c[0].iter().all(|&t| t != lab::tasks::corpus::HOLD));
        assert!(c.iter().flatten().all(|&t| t < lab::tasks::corpus::END));
    }
    let t = corpus_stream(&d, "chorales", Granularity::Token).unwrap();
    let f = corpus_stream(&d, "chorales", Granularity::Frame).unwrap();
    assert_eq!(t.ids.len(), 4 * f.ids.len());
    assert!((f.chars_per_token - 4.0).abs() < 1e-12);
}

#[test]
fn dna_and_prose_profiles_have_structure() {
    let Some(d) = have("ecoli") else { return };
    let s = corpus_stream(&d, "ecoli", Granularity::Char).unwrap();
    assert_eq!(s.vocab_size, 4);
    let p = profile_stream(
        &s.ids,
        &MiConfig {
            max_lag: 12,
            ..MiConfig::default()
        },
    )
    .unwrap();
    // codon structure: every third lag carries more than its neighbour before it
    // (measured: I(5) = 0.00052, I(6) = 0.00089, I(8) = 0.00018, I(9) = 0.00103, I(12) = 0.00155)
    let i = &p.mutual_info;
    for k in [6usize, 9, 12] {
        assert!(i[k - 1] > i[k - 2], "lag {k}: {i:?}");
    }
    assert!(i[8] > i[6] && i[11] > i[9] && i[11] > i[10], "{i:?}");
    assert!(p.significant.iter().all(|&x| x));
    let Some(d) = have("shakespeare") else { return };
    let s = corpus_stream(&d, "shakespeare", Granularity::Char).unwrap();
    let p = profile_stream(
        &s.ids,
        &MiConfig {
            max_lag: 64,
            ..MiConfig::default()
        },
    )
    .unwrap();
    assert!(p.mutual_info[0] > 0.5, "I(1) = {}", p.mutual_info[0]);
    assert!(p.mutual_info[0] > p.mutual_info[9] && p.mutual_info[9] > p.mutual_info[63]);
    assert_eq!(p.max_significant_lag, Some(64));
}

#[test]
fn corpus_task_windows_are_split_by_position() {
    let Some(_) = have("ecoli") else { return };
    let mut cfg = base_config();
    cfg.task = lab::config::TaskConfig::Corpus(lab::tasks::text::TextParams {
        corpus: "ecoli".into(),
        granularity: "char".into(),
    });
    cfg.vocab_size = 4;
    cfg.seq_len = 64;
    // SAFETY: every test of this binary that sets it sets the same value
    unsafe { std::env::set_var("LAB_DATA_DIR", data_dir()) };
    cfg.validate().unwrap();
    let lab::config::TaskGen::Corpus(t) = cfg.task() else {
        unreachable!("a corpus run")
    };
    let n = t.stream().unwrap().ids.len();
    let cut = (0.9 * n as f64).round() as usize;
    let full = t.stream().unwrap();
    for split in [Split::Train, Split::Eval] {
        for ex in cfg.task().batch(0, split, 0, 8).unwrap() {
            assert_eq!(ex.input[1..], ex.target[..63]);
            assert!(ex.mask.iter().all(|&m| m));
            // find the window in its part of the stream
            let (lo, hi) = if split == Split::Train {
                (0, cut)
            } else {
                (cut, n)
            };
            let found = (lo..=hi - 65)
                .any(|s| full.ids[s..s + 64] == ex.input[..] && full.ids[s + 64] == ex.target[63]);
            assert!(found, "{split:?} window not in its part");
        }
    }
    cfg.vocab_size = 3;
    assert!(
        cfg.validate()
            .unwrap_err()
            .to_string()
            .starts_with("vocab_size = 3 is out of range")
    );
}

fn base_config() -> lab::config::RunConfig {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../sweeps/real-sequences.toml"),
    )
    .unwrap();
    let t: toml::Table = text.parse().unwrap();
    let base = t["base"].as_table().unwrap().clone();
    lab::config::from_toml(base).unwrap()
}

#[test]
fn lab_mi_prints_csv_and_recommend_a_table() {
    let Some(d) = have("ecoli") else { return };
    let o = Command::new(env!("CARGO_BIN_EXE_lab"))
        .args(["mi", "--corpus", "ecoli", "--max-lag", "8", "--data-dir"])
        .arg(&d)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 9);
    assert!(lines[0].starts_with("lag,lag_chars,mutual_info,"));
    assert!(lines[3].starts_with("3,3,"));
    let o = Command::new(env!("CARGO_BIN_EXE_lab"))
        .args([
            "mi",
            "--corpus",
            "ecoli",
            "--granularity",
            "sentence",
            "--data-dir",
        ])
        .arg(&d)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("granularity"), "{err}");
}
