//! Where a sweep's results came from: one record per `lab sweep` invocation on a results folder,
//! kept in `<out>/provenance.json` (`{"invocations": [...]}`, oldest first, written atomically),
//! and the summary that invocation printed, in `<out>/summary.txt`. `lab report` reads both.

use std::path::Path;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// File name of the provenance record in a results folder.
pub const PROVENANCE_FILE: &str = "provenance.json";
/// File name of the last printed summary in a results folder.
pub const SUMMARY_FILE: &str = "summary.txt";

/// One `lab sweep` invocation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Invocation {
    /// Sweep name.
    pub sweep: String,
    /// Preset.
    pub preset: String,
    /// `--set` overrides, as given.
    #[serde(default)]
    pub sets: Vec<String>,
    /// The command line (`std::env::args`, joined with spaces).
    pub command: String,
    /// Lab version (`CARGO_PKG_VERSION`).
    pub lab_version: String,
    /// `git rev-parse HEAD` of the repository holding the sweep file, with `-dirty` when tracked
    /// files differ from it (`git status --porcelain --untracked-files=no`); `None` outside git.
    pub git_commit: Option<String>,
    /// Host name.
    pub host: String,
    /// CPU model (`/proc/cpuinfo` `model name`), `None` where unknown.
    pub cpu_model: Option<String>,
    /// Logical cores available to the process.
    pub cores: usize,
    /// Runs at once.
    pub jobs: usize,
    /// Threads per run.
    pub threads_per_run: usize,
    /// Backend name.
    pub backend: String,
    /// Start, seconds since the Unix epoch (UTC).
    pub started_unix_s: f64,
    /// End, seconds since the Unix epoch (UTC).
    pub ended_unix_s: f64,
    /// Wall time of the invocation, seconds.
    pub wall_time_s: f64,
    /// Runs in the plan.
    pub planned: usize,
    /// Runs trained by this invocation.
    pub ran: usize,
    /// Runs already finished when it started.
    pub skipped: usize,
    /// Runs recorded as failed after it.
    pub failed: usize,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct ProvenanceFile {
    invocations: Vec<Invocation>,
}

/// Seconds since the Unix epoch of `t` (0 before the epoch).
pub fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a Unix time.
pub fn utc_text(unix_s: f64) -> String {
    chrono::DateTime::from_timestamp(unix_s.floor() as i64, 0)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| format!("{unix_s} s after the Unix epoch"))
}

/// The CPU model of this machine (`model name` in `/proc/cpuinfo`), `None` where unknown.
pub fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// The commit of the git repository holding `path` (a sweep file), `-dirty` when tracked files
/// differ from it; `None` when `git` or the repository is missing.
pub fn git_commit(path: &Path) -> Option<String> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty())?;
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = run(&["rev-parse", "HEAD"]).filter(|h| !h.is_empty())?;
    let dirty =
        run(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{head}-dirty") } else { head })
}

/// The invocations recorded in `out_dir` (empty when there is no record or it does not parse).
pub fn read(out_dir: &Path) -> Vec<Invocation> {
    std::fs::read_to_string(out_dir.join(PROVENANCE_FILE))
        .ok()
        .and_then(|t| serde_json::from_str::<ProvenanceFile>(&t).ok())
        .map(|f| f.invocations)
        .unwrap_or_default()
}

/// Append `inv` to `out_dir`'s record and write `summary` (the text `lab sweep` prints) to
/// `summary.txt`, both atomically.
///
/// # Errors
/// A file that cannot be written.
pub fn record(out_dir: &Path, inv: Invocation, summary: &str) -> std::io::Result<()> {
    let mut file = ProvenanceFile {
        invocations: read(out_dir),
    };
    file.invocations.push(inv);
    let json = serde_json::to_string_pretty(&file).expect("provenance serialises");
    crate::results::write_file_atomic(&out_dir.join(PROVENANCE_FILE), json.as_bytes())?;
    crate::results::write_file_atomic(&out_dir.join(SUMMARY_FILE), summary.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invocation(ran: usize) -> Invocation {
        Invocation {
            sweep: "block-width".into(),
            preset: "smoke".into(),
            sets: vec!["steps=20".into()],
            command: "lab sweep block-width --preset smoke".into(),
            lab_version: "0.1.0".into(),
            git_commit: None,
            host: "h".into(),
            cpu_model: None,
            cores: 2,
            jobs: 1,
            threads_per_run: 2,
            backend: "cpu".into(),
            started_unix_s: 0.0,
            ended_unix_s: 60.0,
            wall_time_s: 60.0,
            planned: 4,
            ran,
            skipped: 4 - ran,
            failed: 0,
        }
    }

    #[test]
    fn invocations_accumulate_in_order_and_the_summary_is_the_last() {
        let dir = std::env::temp_dir().join(format!("lab-prov-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(read(&dir).is_empty());
        record(&dir, invocation(4), "first").unwrap();
        record(&dir, invocation(0), "second").unwrap();
        let inv = read(&dir);
        assert_eq!(inv.len(), 2);
        assert_eq!((inv[0].ran, inv[1].ran), (4, 0));
        assert_eq!(
            std::fs::read_to_string(dir.join(SUMMARY_FILE)).unwrap(),
            "second"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn utc_text_formats_the_epoch_and_a_known_time() {
        assert_eq!(utc_text(0.0), "1970-01-01 00:00:00 UTC");
        // 2026-12-02 10:15:27 UTC = 1796206527 s (date -d @1796206527 -u).
        assert_eq!(utc_text(1_796_206_527.9), "2026-12-02 10:15:27 UTC");
    }
}
