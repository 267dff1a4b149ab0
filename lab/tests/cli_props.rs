//! Property test (proptest) of the `lab` binary's subcommands with random arguments (issue 16):
//! numbers including 0, negative, huge, NaN and inf, random strings, missing and mismatched
//! folders. Whatever the input: the exit code is 0, 1 or 2; no panic; at most one line on
//! stderr for exit 2; no output folder created on an error; and the command ends within a
//! wall-clock bound (no hang).
//!
//! Commands that would start real work on valid input (`lab sweep` training, `lab bench`) are
//! given arguments that stop before it: a mismatched or missing sweep, or `--emit-slurm`.

mod common;

use std::time::Duration;

use common::*;
use proptest::prelude::*;

/// Wall-clock bound of one command.
const BOUND: Duration = Duration::from_secs(30);

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("-2.5".to_string()),
        Just("1e308".to_string()),
        Just("99999999999999999999".to_string()),
        Just("18446744073709551615".to_string()),
        Just("NaN".to_string()),
        Just("inf".to_string()),
        Just("-inf".to_string()),
        Just("".to_string()),
        (1u32..100).prop_map(|n| n.to_string()),
        (0.0f64..10.0).prop_map(|x| format!("{x:.3}")),
        "\\PC{0,8}",
    ]
}

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("block".to_string()),
        Just("indirect".to_string()),
        Just("igsm".to_string()),
        Just("needle".to_string()),
        Just("block-width".to_string()),
        Just("igsm-ops".to_string()),
        Just("mi-profiles".to_string()),
        Just("yarn".to_string()),
        Just("".to_string()),
        "[a-z_-]{1,10}",
        "\\PC{0,10}",
    ]
}

/// A folder argument: missing, an empty folder, or a results folder of another sweep.
fn folder() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("MISSING".to_string()),
        Just("EMPTY".to_string()),
        Just("OTHER".to_string()),
    ]
}

/// One command line (without the `lab` program name).
fn command() -> impl Strategy<Value = Vec<String>> {
    let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    prop_oneof![
        (number(), number(), word(), number()).prop_map(move |(d, b, s, f)| {
            let mut a = v(&["rope", "freqs", "--head-dim"]);
            a.extend([
                d,
                "--base".into(),
                b,
                "--scaling".into(),
                s,
                "--factor".into(),
                f,
            ]);
            a
        }),
        (word(), word(), number(), number()).prop_map(move |(t, k, x, n)| {
            let mut a = v(&["gen"]);
            a.extend([t, "--param".into(), format!("{k}={x}"), "--n".into(), n]);
            a
        }),
        (word(), number(), number()).prop_map(move |(k, x, r)| {
            let mut a = v(&["mi", "--task", "block", "--n-examples", "50", "--param"]);
            a.extend([format!("{k}={x}"), "--max-lag".into(), r]);
            a
        }),
        (folder(), number(), word(), number()).prop_map(move |(d, l, k, x)| {
            let mut a = v(&["eval"]);
            a.extend([d, "--seq-len".into(), l, "--set".into(), format!("{k}={x}")]);
            a
        }),
        (word(), folder()).prop_map(move |(s, d)| {
            let mut a = v(&["plot"]);
            a.extend([s, "--results".into(), d, "--out".into(), "OUT".into()]);
            a
        }),
        (word(), word(), folder()).prop_map(move |(s, p, d)| {
            let mut a = v(&["status"]);
            a.extend([s, "--preset".into(), p, "--out".into(), d]);
            a
        }),
        (word(), number(), number()).prop_map(move |(c, h, f)| {
            let mut a = v(&["recommend", "--corpus"]);
            a.extend([
                c,
                "--head-dim".into(),
                h,
                "--factor".into(),
                f,
                "--results".into(),
            ]);
            a.push("MISSING".into());
            a
        }),
        (folder(), folder()).prop_map(move |(a1, a2)| {
            let mut a = v(&["merge"]);
            a.extend([a1, a2, "--out".into(), "OUT".into()]);
            a
        }),
        (word(), word(), number(), number()).prop_map(move |(s, p, t, n)| {
            // A random sweep name: a real one would time a training step (seconds), the
            // rest must fail by name.
            let mut a = v(&["bench", "train-step", "--sweep"]);
            a.extend([
                s,
                "--preset".into(),
                p,
                "--threads".into(),
                t,
                "--steps".into(),
                n,
            ]);
            a
        }),
        (word(), word(), number(), number()).prop_map(move |(s, p, j, n)| {
            let mut a = v(&["sweep"]);
            a.extend([s, "--preset".into(), p, "--jobs".into(), j, "--out".into()]);
            a.extend(["OUT".into(), "--emit-slurm".into(), "OUT.sh".into()]);
            a.extend(["--slurm-shards".into(), n]);
            a
        }),
    ]
}

/// Run `args` with the placeholders resolved in a fresh folder; returns (exit code, stderr,
/// whether OUT was created).
fn run(args: &[String], case: usize) -> (Option<i32>, String, bool, Duration) {
    let dir = tmp(&format!("cli-props-{case}"));
    std::fs::create_dir_all(dir.join("EMPTY")).unwrap();
    let other = dir.join("OTHER");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::copy(reference().join("runs.parquet"), other.join("runs.parquet")).unwrap();
    let resolve = |a: &String| match a.as_str() {
        "MISSING" | "EMPTY" | "OTHER" | "OUT" | "OUT.sh" => dir.join(a).display().to_string(),
        _ => a.clone(),
    };
    let mut cmd = lab();
    cmd.args(args.iter().map(resolve));
    let (code, err, elapsed) = run_bounded(cmd, BOUND, Duration::from_millis(10));
    let created = dir.join("OUT").exists();
    let _ = std::fs::remove_dir_all(&dir);
    (code, err, created, elapsed)
}

proptest! {
    // 96 cases in CI (about 8 s); LAB_PROPS_CASES=N for a longer search.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("LAB_PROPS_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(96),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_subcommand_survives_random_arguments(args in command()) {
        static CASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let case = CASE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (code, err, created, elapsed) = run(&args, case);
        prop_assert!(elapsed <= BOUND, "lab {:?}: still running after {:?}", args, BOUND);
        prop_assert!(matches!(code, Some(0..=2)), "lab {:?}: exit {:?}\n{}", args, code, err);
        prop_assert!(!err.contains("panicked"), "lab {:?} panicked:\n{}", args, err);
        if code == Some(2) {
            prop_assert!(err.lines().count() <= 1, "lab {:?}: several stderr lines:\n{}", args, err);
            // `lab sweep --emit-slurm` creates OUT only after writing its script (success).
            prop_assert!(!created, "lab {:?}: output folder created on an error", args);
        }
    }
}
