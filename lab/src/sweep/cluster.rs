//! Sweeps on more than one machine: deterministic shards of a grid (`--shard i/n`) and a Slurm
//! job-array script that runs one shard per array task (`--emit-slurm FILE`).
//!
//! A shard is a fixed slice of the preset's expanded grid: run number `p` (0-based, in the
//! order [`SweepSpec::expand`](super::SweepSpec::expand) lists them) belongs to shard
//! `p mod n + 1`. Round-robin keeps the shards' work balanced when the grid is ordered by
//! size (e.g. block widths), and the slices of `1/n … n/n` partition the grid: every run is in
//! exactly one shard. Each shard writes its own output folder; `lab merge` joins them.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// One slice `index/count` of a grid (1-based `index`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// Which slice, `1..=count`.
    pub index: usize,
    /// Number of slices, `≥ 1`.
    pub count: usize,
}

/// A `--shard` value that is not `i/n` with `1 ≤ i ≤ n`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("--shard {0}: must be i/n with 1 ≤ i ≤ n (e.g. 2/4)")]
pub struct ShardError(pub String);

impl FromStr for Shard {
    type Err = ShardError;
    fn from_str(s: &str) -> Result<Self, ShardError> {
        let bad = || ShardError(s.to_string());
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: usize = i.trim().parse().map_err(|_| bad())?;
        let count: usize = n.trim().parse().map_err(|_| bad())?;
        if index == 0 || count == 0 || index > count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl Shard {
    /// Whether run number `position` (0-based, plan order) is in this shard.
    pub fn contains(&self, position: usize) -> bool {
        position % self.count == self.index - 1
    }

    /// The runs of `plan` in this shard, in plan order.
    pub fn select<T>(&self, plan: Vec<T>) -> Vec<T> {
        plan.into_iter()
            .enumerate()
            .filter(|(p, _)| self.contains(*p))
            .map(|(_, r)| r)
            .collect()
    }
}

/// `--slurm-time`: a Slurm time limit, `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM` or
/// `D-HH:MM:SS` (sbatch(1), `--time`), at least one minute. Returns it unchanged.
///
/// # Errors
/// One line naming the value and the forms allowed (as clap prints a value parser's error).
pub fn parse_slurm_time(s: &str) -> Result<String, String> {
    let bad = || {
        format!(
            "`{s}` is not a Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 02:00:00, 1-12), at least 1 minute"
        )
    };
    let num = |p: &str| -> Result<u64, String> {
        if p.is_empty() || p.len() > 6 || !p.chars().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        p.parse().map_err(|_| bad())
    };
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (Some(num(d)?), r),
        None => (None, s),
    };
    let parts: Vec<u64> = rest.split(':').map(num).collect::<Result<_, _>>()?;
    let seconds = match (days, parts.as_slice()) {
        (None, [m]) => m * 60,
        (None, [m, sec]) if *sec < 60 => m * 60 + sec,
        (None, [h, m, sec]) if *m < 60 && *sec < 60 => h * 3600 + m * 60 + sec,
        (Some(d), [h]) if *h < 24 => d * 86400 + h * 3600,
        (Some(d), [h, m]) if *h < 24 && *m < 60 => d * 86400 + h * 3600 + m * 60,
        (Some(d), [h, m, sec]) if *h < 24 && *m < 60 && *sec < 60 => {
            d * 86400 + h * 3600 + m * 60 + sec
        }
        _ => return Err(bad()),
    };
    if seconds < 60 {
        return Err(bad());
    }
    Ok(s.to_string())
}

/// `--slurm-mem`: a Slurm memory size, a whole number ≥ 1 with an optional unit `K`, `M`, `G`
/// or `T` (sbatch(1), `--mem`; no unit means megabytes). Returns it unchanged.
///
/// # Errors
/// One line naming the value and the form allowed.
pub fn parse_slurm_mem(s: &str) -> Result<String, String> {
    let digits = s.trim_end_matches(['K', 'M', 'G', 'T', 'k', 'm', 'g', 't']);
    let unit_len = s.len() - digits.len();
    let ok = unit_len <= 1
        && !digits.is_empty()
        && digits.len() <= 9
        && digits.chars().all(|c| c.is_ascii_digit())
        && digits.parse::<u64>().is_ok_and(|n| n >= 1);
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "`{s}` is not a Slurm memory size: a whole number ≥ 1 with an optional unit K, M, G or T (e.g. 4G, 500M)"
        ))
    }
}

/// `--slurm-partition`: a partition name (letters, digits, `_`, `-`, `.`; `,` between several),
/// at most 64 characters, so that the `#SBATCH` line holds exactly it. Returns it unchanged.
///
/// # Errors
/// One line naming the value and the characters allowed.
pub fn parse_slurm_partition(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.split(',').all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        });
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "`{s}` is not a Slurm partition: letters, digits, _, - and ., several separated by commas (at most 64 characters)"
        ))
    }
}

/// Resources and layout of an emitted Slurm job array.
#[derive(Clone, Debug)]
pub struct SlurmOptions {
    /// Array tasks = shards.
    pub shards: usize,
    /// `--cpus-per-task` (the run's CPU threads).
    pub cpus_per_task: usize,
    /// `--mem`, e.g. `4G`.
    pub mem: String,
    /// `--time` limit of one array task, e.g. `02:00:00`.
    pub time: String,
    /// `--partition`, if any.
    pub partition: Option<String>,
    /// `--gpus-per-task`, if any.
    pub gpus_per_task: Option<usize>,
    /// Runs at once inside one array task (`lab sweep --jobs`).
    pub jobs: usize,
    /// `--backend` of the runs (`cpu`, …).
    pub backend: String,
}

/// Quote `s` for a POSIX shell (single quotes; `'` as `'\''`).
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The Slurm batch script of a sweep: a job array of `opts.shards` tasks, task `i` running
/// `lab sweep SPEC --preset P --shard i/n --out OUT/shard-i`. `exe`, `spec_path` and `out_dir`
/// should be absolute (the job may start elsewhere); `$LAB` overrides the executable at submit
/// time. `sets` are the command line's `--set KEY=VALUE` overrides, passed on to every task.
/// After the array: `lab merge OUT/shard-* --out OUT`. On a CubeCL backend (`opts.backend` other
/// than `cpu`) the script sets `LAB_KERNEL_CACHE` to the node's `/tmp` unless the submitter set it.
pub fn slurm_script(
    sweep_name: &str,
    spec_path: &Path,
    preset: &str,
    sets: &[String],
    out_dir: &Path,
    exe: &Path,
    opts: &SlurmOptions,
) -> String {
    let n = opts.shards.max(1);
    let out = out_dir.display().to_string();
    let q = |s: &str| shell_quote(s);
    let mut s = String::new();
    s.push_str("#!/bin/bash\n");
    s.push_str(&format!(
        "# lab sweep {sweep_name} --preset {preset}, as a Slurm job array: one array task per shard ({n}).\n"
    ));
    s.push_str("# Submit:       sbatch THIS_FILE            (or: sbatch --wait THIS_FILE)\n");
    s.push_str(&format!(
        "# Then merge:   lab merge {}/shard-* --out {}\n",
        q(&out),
        q(&out)
    ));
    s.push_str(
        "# Written by `lab sweep --emit-slurm`; each shard writes its own folder, finished\n",
    );
    s.push_str("# runs are skipped when a task is resubmitted.\n");
    // #SBATCH lines are not shell words: no quoting there.
    s.push_str(&format!("#SBATCH --job-name=lab-{sweep_name}\n"));
    s.push_str(&format!("#SBATCH --array=1-{n}\n"));
    s.push_str("#SBATCH --ntasks=1\n");
    s.push_str(&format!("#SBATCH --cpus-per-task={}\n", opts.cpus_per_task));
    s.push_str(&format!("#SBATCH --mem={}\n", opts.mem));
    s.push_str(&format!("#SBATCH --time={}\n", opts.time));
    if let Some(p) = &opts.partition {
        s.push_str(&format!("#SBATCH --partition={p}\n"));
    }
    if let Some(g) = opts.gpus_per_task {
        s.push_str(&format!("#SBATCH --gpus-per-task={g}\n"));
    }
    s.push_str(&format!("#SBATCH --output={out}/slurm-%A_%a.log\n"));
    s.push_str("set -euo pipefail\n");
    s.push_str(&format!(
        "LAB=\"${{LAB:-{}}}\"\n",
        exe.display().to_string().replace('"', "\\\"")
    ));
    if opts.backend != "cpu" {
        // CubeCL's kernel cache is a database with a write-ahead log: on a node's local disk, not
        // the shared file system a checkout (its default place) often lives on.
        s.push_str(
            "# CubeCL's kernel cache on the node's local disk (src/kernels/kernel_cache.rs).\n",
        );
        s.push_str(
            "export LAB_KERNEL_CACHE=\"${LAB_KERNEL_CACHE:-/tmp/lab-kernel-cache-$(id -u)}\"\n",
        );
    }
    s.push_str(&format!("N_SHARDS={n}\n"));
    s.push_str("SHARD=\"${SLURM_ARRAY_TASK_ID:?run this script with sbatch}\"\n");
    s.push_str(&format!(
        "exec \"$LAB\" sweep {} --preset {}{} --shard \"$SHARD/$N_SHARDS\" --jobs {} --backend {} \\\n    --out {}\"/shard-$SHARD\" --no-progress\n",
        q(&spec_path.display().to_string()),
        q(preset),
        sets.iter()
            .map(|x| format!(" --set {}", q(x)))
            .collect::<String>(),
        opts.jobs.max(1),
        q(&opts.backend),
        q(&out),
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_values_are_checked() {
        for ok in [
            "30",
            "90:00",
            "02:00:00",
            "1-12",
            "2-06:30",
            "0-01:00:00",
            "100:00:00",
        ] {
            assert_eq!(parse_slurm_time(ok).as_deref(), Ok(ok), "{ok}");
        }
        for bad in [
            "banana", "", "0", "00:30", "1:60", "1-24", "1-", "-1", "2:3:4:5", "1.5", "nan", "inf",
        ] {
            let e = parse_slurm_time(bad).unwrap_err();
            assert!(
                e.starts_with(&format!("`{bad}` is not a Slurm time limit")),
                "{e}"
            );
        }
        for ok in ["4G", "500M", "1024", "2T", "64k"] {
            assert_eq!(parse_slurm_mem(ok).as_deref(), Ok(ok));
        }
        for bad in ["banana", "", "0G", "-4G", "4GB", "4.5G", "inf", "G"] {
            assert!(parse_slurm_mem(bad).is_err(), "{bad}");
        }
        for ok in ["gpu", "short,long", "a100_80g", "p-1.x"] {
            assert_eq!(parse_slurm_partition(ok).as_deref(), Ok(ok));
        }
        for bad in ["", "a b", "gpu\n#SBATCH --mem=1", "a,,b", "x;rm"] {
            assert!(parse_slurm_partition(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parse_and_display() {
        assert_eq!("2/4".parse::<Shard>(), Ok(Shard { index: 2, count: 4 }));
        assert_eq!(" 1 / 1".parse::<Shard>().unwrap().to_string(), "1/1");
        for bad in ["0/2", "3/2", "2", "a/b", "1/0", "-1/2", ""] {
            let e = bad.parse::<Shard>().unwrap_err().to_string();
            assert_eq!(
                e,
                format!("--shard {bad}: must be i/n with 1 ≤ i ≤ n (e.g. 2/4)")
            );
        }
    }

    /// The n shards partition the plan: each position in exactly one, round-robin.
    #[test]
    fn shards_partition_the_grid() {
        for n in 1..=7 {
            let mut seen = vec![0; 20];
            for i in 1..=n {
                let s = Shard { index: i, count: n };
                let got = s.select((0..20).collect::<Vec<usize>>());
                assert!(got.windows(2).all(|w| w[1] - w[0] == n));
                for p in got {
                    seen[p] += 1;
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "n = {n}: {seen:?}");
        }
        let s = Shard { index: 2, count: 3 };
        assert_eq!(s.select(vec!['a', 'b', 'c', 'd', 'e']), vec!['b', 'e']);
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("/a/b-c.toml"), "/a/b-c.toml");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    /// The script of the block-width sweep from a checkout in `/repo` into `/scratch/bw`.
    fn block_width_script(preset: &str, sets: &[String], opts: &SlurmOptions) -> String {
        slurm_script(
            "block-width",
            Path::new("/repo/sweeps/block-width.toml"),
            preset,
            sets,
            Path::new("/scratch/bw"),
            Path::new("/repo/target/release/lab"),
            opts,
        )
    }

    #[test]
    fn script_has_one_array_task_per_shard_and_the_resources() {
        let opts = SlurmOptions {
            shards: 4,
            cpus_per_task: 2,
            mem: "4G".into(),
            time: "01:00:00".into(),
            partition: Some("cpu".into()),
            gpus_per_task: None,
            jobs: 1,
            backend: "cpu".into(),
        };
        let s = block_width_script(
            "quick",
            &["steps=1000".to_string(), "block_len=[4, 16]".to_string()],
            &opts,
        );
        assert!(s.starts_with("#!/bin/bash\n"));
        for line in [
            "#SBATCH --array=1-4",
            "#SBATCH --cpus-per-task=2",
            "#SBATCH --mem=4G",
            "#SBATCH --time=01:00:00",
            "#SBATCH --partition=cpu",
            "#SBATCH --output=/scratch/bw/slurm-%A_%a.log",
            "LAB=\"${LAB:-/repo/target/release/lab}\"",
            "exec \"$LAB\" sweep /repo/sweeps/block-width.toml --preset quick --set steps=1000 --set 'block_len=[4, 16]' --shard \"$SHARD/$N_SHARDS\" --jobs 1 --backend cpu \\",
        ] {
            assert!(s.lines().any(|l| l == line), "no line `{line}` in:\n{s}");
        }
        assert!(!s.contains("--gpus-per-task"));
        assert!(!s.contains("LAB_KERNEL_CACHE"));
    }

    /// On a CubeCL backend the kernel cache goes to the node's local disk unless already set.
    #[test]
    fn gpu_script_puts_the_kernel_cache_on_the_node() {
        let opts = SlurmOptions {
            shards: 2,
            cpus_per_task: 4,
            mem: "16G".into(),
            time: "02:00:00".into(),
            partition: None,
            gpus_per_task: Some(1),
            jobs: 2,
            backend: "cuda".into(),
        };
        let s = block_width_script("full", &[], &opts);
        let export =
            "export LAB_KERNEL_CACHE=\"${LAB_KERNEL_CACHE:-/tmp/lab-kernel-cache-$(id -u)}\"";
        let at = |needle: &str| s.lines().position(|l| l.starts_with(needle));
        let (Some(cache), Some(exec)) = (at(export), at("exec ")) else {
            panic!("no `{export}` before the exec line in:\n{s}");
        };
        assert!(cache < exec, "{s}");
        assert!(s.lines().any(|l| l == "#SBATCH --gpus-per-task=1"));
        assert!(s.contains("--jobs 2 --backend cuda"));
    }
}
