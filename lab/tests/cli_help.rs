//! Bad input names what the user typed (issue 51, "the class behind the rest"): every option of
//! every subcommand, as the binary's own `--help` lists them, is given values that no option of
//! the lab accepts (`banana`, `nan`, `inf`, `-inf`, `1e999`, `-1`, the empty string), and a
//! folder option an absent path. Whatever the option: exit code 2, exactly one line on stderr,
//! `error: …`, naming the option as typed (`--factor`), or the path typed; never a panic, never
//! a run that starts. Options are derived from `--help`, so an option added later is covered
//! without being listed here; what this file lists is each subcommand's smallest valid
//! invocation and, for an option that is read only together with another (`--beta-fast` with
//! `--scaling yarn`), that other option.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use common::*;

/// Values no option of the lab accepts (paths aside).
const BAD: &[&str] = &["banana", "nan", "inf", "-inf", "1e999", "-1", ""];

/// Wall-clock bound of one refused command.
const BOUND: Duration = Duration::from_secs(30);

/// Options whose value is a folder or file the command writes (any string is a valid one).
const OUTPUTS: &[&str] = &["--out", "--emit-slurm"];

/// Options whose value is a path the command reads: an absent path must be named.
const INPUTS: &[&str] = &["--results", "--input", "--data-dir"];

/// `(option, value)` pairs that are valid although they look bad: free-form names.
const VALID: &[(&str, &str)] = &[
    ("--slurm-partition", "banana"),
    ("--slurm-partition", "nan"),
    ("--slurm-partition", "inf"),
    ("--slurm-partition", "-inf"),
    ("--slurm-partition", "1e999"),
    ("--slurm-partition", "-1"),
];

/// Folders the invocations use: a finished block run, its results folder, a needle run.
struct Fixture {
    results: PathBuf,
    run: PathBuf,
    needle: PathBuf,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let tiny = [
            "--set",
            "steps=2",
            "--set",
            "warmup_steps=0",
            "--set",
            "eval_every=1",
            "--set",
            "seed=0",
            "--set",
            "encoding=rope",
        ];
        let results = tmp("cli-help-block");
        let o = lab()
            .args(["sweep", "block-width", "--preset", "smoke", "--no-progress"])
            .args(tiny)
            .args(["--set", "block_len=4", "--set", "variant=copy", "--out"])
            .arg(&results)
            .output()
            .unwrap();
        assert!(o.status.success(), "{:?}", text(&o));
        let needle_dir = tmp("cli-help-needle");
        let o = lab()
            .args([
                "sweep",
                "length-extrapolation",
                "--preset",
                "smoke",
                "--no-progress",
            ])
            .args(tiny)
            .arg("--out")
            .arg(&needle_dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "{:?}", text(&o));
        let one = |d: &Path| {
            std::fs::read_dir(d.join("runs"))
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .find(|p| p.join("runs.parquet").is_file())
                .unwrap()
        };
        Fixture {
            run: one(&results),
            needle: one(&needle_dir),
            results,
        }
    })
}

/// The subcommand paths of `lab --help` (`["sweep"]`, `["rope", "freqs"]`, …), `help` left out.
fn subcommands(prefix: &[String]) -> Vec<Vec<String>> {
    let o = lab().args(prefix).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&o.stdout).into_owned();
    let Some(start) = help.find("Commands:\n") else {
        return vec![prefix.to_vec()];
    };
    let mut out = Vec::new();
    for line in help[start + 10..].lines() {
        if !line.starts_with("  ") {
            break;
        }
        let name = line.split_whitespace().next().unwrap_or_default();
        if name.is_empty() || name == "help" {
            continue;
        }
        let mut path = prefix.to_vec();
        path.push(name.to_string());
        out.extend(subcommands(&path));
    }
    out
}

/// The options of `lab <path> --help` that take a value: `(--flag, value name)`.
fn value_options(path: &[String]) -> Vec<(String, String)> {
    let o = lab().args(path).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut out = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        let t = t.strip_prefix("-h, ").unwrap_or(t);
        let Some(rest) = t.strip_prefix("--") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let flag = format!("--{}", words.next().unwrap_or_default());
        if let Some(v) = words.next().filter(|w| w.starts_with('<')) {
            out.push((flag, v.trim_matches(['<', '>']).to_string()));
        }
    }
    out
}

/// The smallest valid invocation of a subcommand, with the fixture's folders; `out` a fresh
/// path the command may write.
fn base(path: &[String], out: &Path) -> Vec<String> {
    let f = fixture();
    let o = out.display().to_string();
    let s = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let results = f.results.display().to_string();
    let args: Vec<String> = match path
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["sweep"] => s(&[
            "sweep",
            "block-width",
            "--preset",
            "smoke",
            "--dry-run",
            "--out",
            &o,
        ]),
        ["status"] => s(&["status", "block-width", "--out", &results]),
        ["merge"] => s(&["merge", &results, "--out", &o]),
        ["gen"] => s(&["gen", "block"]),
        ["rope", "freqs"] => s(&["rope", "freqs", "--head-dim", "8"]),
        ["eval"] => s(&["eval", &f.run.display().to_string(), "--seq-len", "64"]),
        ["needle-attention"] => s(&[
            "needle-attention",
            &f.needle.display().to_string(),
            "--seq-len",
            "32",
            "--n",
            "2",
        ]),
        ["plot"] => s(&["plot", "block-width", "--results", &results, "--out", &o]),
        ["report"] => s(&["report", "block-width", "--results", &results, "--out", &o]),
        ["compare"] => s(&["compare", &results, &results]),
        ["selfcheck"] => s(&["selfcheck"]),
        ["bench", "train-step"] => s(&[
            "bench",
            "train-step",
            "--sweep",
            "block-width",
            "--preset",
            "smoke",
            "--steps",
            "1",
            "--warmup",
            "0",
        ]),
        ["bench", "attention"] => s(&[
            "bench",
            "attention",
            "--seq",
            "16",
            "--iters",
            "1",
            "--warmup",
            "0",
        ]),
        ["bench", "cuda-source"] | ["bench", "cuda-host"] => {
            let mut a = path.to_vec();
            a.extend(s(&["--out", &o]));
            a
        }
        ["mi"] => s(&[
            "mi",
            "--task",
            "block",
            "--n-examples",
            "20",
            "--max-lag",
            "4",
        ]),
        ["recommend"] => s(&[
            "recommend",
            "--corpus",
            "shakespeare",
            "--results",
            &results,
        ]),
        ["data", "fetch"] => s(&["data", "fetch", "--data-dir", &o]),
        other => panic!(
            "lab {}: a subcommand this test has no valid invocation for; add one to `base`",
            other.join(" ")
        ),
    };
    args
}

/// What an option needs beside the base invocation to be read at all (and what of the base
/// it replaces), so that a bad value reaches its own check.
fn context(path: &[String], flag: &str, base: Vec<String>) -> Vec<String> {
    let mut a = base;
    let scaling = |a: &mut Vec<String>, kind: &str| a.extend(["--scaling".into(), kind.into()]);
    match (path.first().map(String::as_str), flag) {
        (Some("rope" | "eval"), "--factor") => scaling(&mut a, "linear"),
        (Some("rope" | "eval"), "--beta-fast" | "--beta-slow") => scaling(&mut a, "yarn"),
        (Some("rope" | "eval"), "--low-freq-factor" | "--high-freq-factor") => {
            scaling(&mut a, "llama3")
        }
        (Some("rope" | "eval"), "--scaling-seq-len" | "--seq-len") if path[0] == "rope" => {
            scaling(&mut a, "dynamic")
        }
        (Some("eval"), "--scaling-seq-len") => scaling(&mut a, "dynamic"),
        (Some("sweep"), f) if f.starts_with("--slurm-") => {
            let i = a.iter().position(|x| x == "--dry-run").unwrap();
            a[i] = "--emit-slurm".into();
            a.insert(i + 1, format!("{}.sh", a.last().unwrap()));
        }
        (Some("sweep"), "--shard") => {}
        (Some("mi"), "--corpus" | "--input" | "--task") => a.truncate(1),
        (Some("mi"), "--data-dir") => {
            a.truncate(1);
            a.extend(["--corpus".into(), "shakespeare".into()]);
        }
        (Some("mi"), "--out") => a.extend(["--format".into(), "parquet".into()]),
        (Some("recommend"), "--corpus") => {
            a.drain(1..3);
        }
        _ => {}
    }
    a
}

/// Run `lab args`; (exit code, stderr), killed after [`BOUND`].
fn run(args: &[String]) -> (Option<i32>, String) {
    let mut cmd = lab();
    cmd.args(args);
    let (code, err, _) = run_bounded(cmd, BOUND, Duration::from_millis(5));
    (code, err)
}

/// Why one refused invocation breaks the rule, if it does.
fn fault(args: &[String], named: &str, code: Option<i32>, err: &str) -> Option<String> {
    let line = err.trim_end();
    let why = if code != Some(2) {
        format!("exit {code:?} (expected 2)")
    } else if err.contains("panicked") {
        "a panic".to_string()
    } else if line.lines().count() != 1 {
        format!("{} lines on stderr", line.lines().count())
    } else if !line.starts_with("error: ") {
        "not an `error: ` line".to_string()
    } else if !line.contains(named) {
        format!("does not name `{named}`")
    } else {
        return None;
    };
    Some(format!(
        "lab {}: {why}\n    {}",
        args.join(" "),
        line.replace('\n', "\n    ")
    ))
}

#[test]
fn every_option_refuses_bad_values_naming_itself() {
    let mut faults = Vec::new();
    let mut checked = 0;
    let out_root = tmp("cli-help-out");
    for path in subcommands(&[]) {
        // A subcommand this build lacks (a cargo feature) is refused as a whole, by name.
        let (code, err) = run(&base(&path, &out_root.join("probe")));
        if code == Some(2) && err.contains("this build has no cargo feature") {
            continue;
        }
        for (flag, value_name) in value_options(&path) {
            // `lab data fetch --data-dir` is where it writes the corpora.
            let writes = path == ["data", "fetch"] && flag == "--data-dir";
            if OUTPUTS.contains(&flag.as_str()) || writes {
                continue;
            }
            let cases: Vec<(String, String)> = if INPUTS.contains(&flag.as_str()) {
                let missing = out_root.join("absent").join("folder").display().to_string();
                vec![(format!("{flag}={missing}"), missing)]
            } else {
                BAD.iter()
                    .filter(|v| !VALID.contains(&(flag.as_str(), **v)))
                    .map(|v| (format!("{flag}={v}"), flag.clone()))
                    .collect()
            };
            for (arg, named) in cases {
                let out = out_root.join(format!("case-{checked}"));
                let mut args = context(&path, &flag, base(&path, &out));
                // The option given last: a second occurrence of an option the base already
                // has (`--seq-len`) would be refused as a repeat, so replace it.
                if let Some(i) = args.iter().position(|a| *a == flag) {
                    args.drain(i..i + 2);
                }
                args.push(arg);
                let (code, err) = run(&args);
                checked += 1;
                if let Some(f) = fault(&args, &named, code, &err) {
                    faults.push(format!("{f}  [{value_name}]"));
                }
                assert!(
                    !out.exists() || code == Some(0),
                    "{args:?}: created {}",
                    out.display()
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&out_root);
    assert!(checked > 300, "only {checked} cases: is --help parsed?");
    assert!(
        faults.is_empty(),
        "{} of {checked} bad inputs broke the rule:\n{}",
        faults.len(),
        faults.join("\n")
    );
}

/// A sweep, run or results folder given as a positional argument that does not exist is named.
#[test]
fn absent_positional_paths_are_named() {
    let f = fixture();
    let absent = tmp("cli-help-absent").join("nothing").display().to_string();
    let results = f.results.display().to_string();
    let s = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let mut faults = Vec::new();
    for args in [
        s(&["sweep", &format!("{absent}.toml"), "--dry-run"]),
        s(&["status", &format!("{absent}.toml")]),
        s(&["eval", &absent, "--seq-len", "32"]),
        s(&["needle-attention", &absent, "--seq-len", "32"]),
        s(&["merge", &absent, "--out", &format!("{absent}-out")]),
        s(&["compare", &results, &absent]),
        s(&["plot", "block-width", "--results", &absent]),
        s(&["report", "block-width", "--results", &absent]),
    ] {
        let (code, err) = run(&args);
        if let Some(f) = fault(&args, &absent, code, &err) {
            faults.push(f);
        }
        assert!(
            !Path::new(&absent).exists(),
            "lab {args:?} created {absent}"
        );
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}
