//! Property tests (proptest) of the two parsers that read user input: sweep files
//! (`SweepSpec::parse` + `expand`) and task parameters (`lab gen --param`, `lab eval --set`).
//! Whatever the input: no panic, and every error is one line.

use std::path::Path;

use lab::sweep::SweepSpec;
use proptest::prelude::*;

fn block_width() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../sweeps/block-width.toml"),
    )
    .unwrap()
}

/// Parse and, when it parses, expand every preset; errors must be one line.
fn check_sweep_text(text: &str) -> Result<(), TestCaseError> {
    match SweepSpec::parse(Path::new("sweeps/fuzz.toml"), text) {
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(!msg.contains('\n'), "multi-line error: {msg}");
            prop_assert!(
                msg.starts_with("sweeps/fuzz.toml"),
                "error without the file: {msg}"
            );
        }
        Ok(spec) => {
            for (preset, _) in spec.presets() {
                if let Err(e) = spec.expand(&preset) {
                    let msg = e.to_string();
                    prop_assert!(!msg.contains('\n'), "multi-line error: {msg}");
                }
            }
        }
    }
    Ok(())
}

/// One edit of a valid file: delete a span, insert text, or replace a span.
#[derive(Clone, Debug)]
enum Edit {
    Delete(usize, usize),
    Insert(usize, String),
    Replace(usize, usize, String),
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut s: Vec<char> = text.chars().collect();
    for e in edits {
        let n = s.len().max(1);
        match e {
            Edit::Delete(a, len) => {
                let a = a % n;
                let b = (a + len % 40).min(s.len());
                s.drain(a.min(s.len())..b);
            }
            Edit::Insert(a, t) => {
                let a = (a % n).min(s.len());
                s.splice(a..a, t.chars());
            }
            Edit::Replace(a, len, t) => {
                let a = (a % n).min(s.len());
                let b = (a + len % 20).min(s.len());
                s.splice(a..b, t.chars());
            }
        }
    }
    s.into_iter().collect()
}

/// TOML-ish fragments: keys of the config, numbers at the edges, brackets, quotes.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_]{1,12}",
        "[-0-9.e+]{1,12}",
        Just("[".to_string()),
        Just("]".to_string()),
        Just("{ }".to_string()),
        Just("\"".to_string()),
        Just("\n".to_string()),
        Just(" = ".to_string()),
        Just(", ".to_string()),
        Just("[presets.x]\n".to_string()),
        Just("[[arms]]\n".to_string()),
        Just("block_len = [0]".to_string()),
        Just("seq_len = 1e400".to_string()),
        Just("steps = -1".to_string()),
        Just("encoding = \"pope\"".to_string()),
        Just("n_heads = 0".to_string()),
        Just("task = \"igsm\"".to_string()),
        "\\PC{0,8}",
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<usize>()).prop_map(|(a, l)| Edit::Delete(a, l)),
        (any::<usize>(), fragment()).prop_map(|(a, t)| Edit::Insert(a, t)),
        (any::<usize>(), any::<usize>(), fragment()).prop_map(|(a, l, t)| Edit::Replace(a, l, t)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Arbitrary text is rejected (or accepted) without a panic, in one line.
    #[test]
    fn sweep_parser_takes_any_text(text in "\\PC{0,400}") {
        check_sweep_text(&text)?;
    }

    /// A valid sweep file with a few random edits.
    #[test]
    fn sweep_parser_takes_edited_files(edits in proptest::collection::vec(edit(), 1..4)) {
        let text = apply(&block_width(), &edits);
        check_sweep_text(&text)?;
    }

    /// `lab gen TASK --param k=v ...`: any parameters give examples or a one-line error.
    #[test]
    fn task_params_parse_or_fail_in_one_line(
        task in prop_oneof![Just("block"), Just("indirect"), Just("igsm"), Just("needle"), Just("blok")],
        params in proptest::collection::vec(
            (
                prop_oneof![
                    Just("variant"), Just("vocab_size"), Just("seq_len"), Just("block_len"),
                    Just("noise"), Just("min_letters"), Just("max_letters"), Just("max_shift"),
                    Just("ops"), Just("distractors"), Just("name_len"), Just("eval_fraction"),
                    Just("depth"), Just("key_len"), Just("value_len"), Just("haystack"),
                    Just("alphabet"), Just("seqlen"), Just(""),
                ],
                prop_oneof![
                    (-5i64..600).prop_map(|v| v.to_string()),
                    Just("1e9".to_string()), Just("-0.5".to_string()), Just("1.5".to_string()),
                    Just("null".to_string()), Just("copy".to_string()), Just("recall".to_string()),
                    Just("pairs".to_string()), Just("[1,2]".to_string()), Just("".to_string()),
                    "\\PC{0,6}",
                ],
                any::<bool>(),
            ).prop_map(|(k, v, eq)| if eq { format!("{k}={v}") } else { format!("{k}{v}") }),
            0..4,
        ),
        seed in 0u64..1000,
    ) {
        match lab::generate::gen_lines(task, &params, 1, seed, lab::tasks::Split::Train) {
            Ok(lines) => prop_assert_eq!(lines.len(), 1),
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(!msg.contains('\n'), "multi-line error: {}", msg);
            }
        }
    }

    /// `lab eval --set k=v`: overrides of a run config apply or fail in one line; an accepted
    /// override is followed by validation, which fails in one line too.
    #[test]
    fn run_overrides_parse_or_fail_in_one_line(
        overrides in proptest::collection::vec(
            (
                prop_oneof![
                    Just("block_len"), Just("seq_len"), Just("noise"), Just("encoding"),
                    Just("variant"), Just("lr"), Just("steps"), Just("n_heads"), Just("seed"),
                    Just("max_grad_norm"), Just("blok_len"), Just("task"),
                ],
                prop_oneof![
                    (-5i64..100_000).prop_map(|v| v.to_string()),
                    Just("1e400".to_string()), Just("nan".to_string()), Just("inf".to_string()),
                    Just("\"rope\"".to_string()), Just("pope".to_string()),
                    Just("[1, 2]".to_string()), Just("{ a = 1 }".to_string()),
                    "\\PC{0,6}",
                ],
            ).prop_map(|(k, v)| format!("{k}={v}")),
            0..4,
        ),
    ) {
        let spec = SweepSpec::parse(Path::new("sweeps/block-width.toml"), &block_width()).unwrap();
        let cfg = spec.expand("smoke").unwrap().remove(0).config;
        match lab::eval::apply_overrides(&cfg, &overrides) {
            Ok(c) => {
                if let Err(e) = c.validate() {
                    prop_assert!(!e.to_string().contains('\n'));
                }
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(!msg.contains('\n'), "multi-line error: {}", msg);
            }
        }
    }
}
