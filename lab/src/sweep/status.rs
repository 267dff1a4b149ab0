//! What a results folder holds: the state of every run of a sweep (`lab status`), the
//! "running" marker each run process leaves while it works, and merging shard folders
//! (`lab merge`).
//!
//! A run's state is read from its folder `runs/<run_id>/`:
//! - `done` / `failed`: `runs.parquet` exists (written last, atomically) with that `status`;
//! - `running`: no `runs.parquet`, and `running.json` names a live `lab run-one` process on
//!   this host (on another host the marker is reported as running, unverified);
//! - `missing`: neither (never started, or interrupted: the next `lab sweep` redoes it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::runner::{SweepError, collect_named, is_finished, run_dir};
use crate::results::{self, column};

/// Name of the marker a run process's folder holds while the process runs.
pub const MARKER: &str = "running.json";

/// Host name (`/proc/sys/kernel/hostname`, else `$HOSTNAME`, else `localhost`).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The process that holds a run folder, from its `running.json`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Marker {
    /// Host the process runs on.
    pub host: String,
    /// Its process id.
    pub pid: u32,
}

/// Write `running.json` for process `pid` into `dir` (temporary file + rename).
pub fn write_marker(dir: &Path, pid: u32) -> std::io::Result<()> {
    let m = Marker {
        host: host_name(),
        pid,
    };
    results::write_file_atomic(
        &dir.join(MARKER),
        serde_json::to_string(&m)
            .expect("marker serialises")
            .as_bytes(),
    )
}

/// Remove `running.json` from `dir` (if any).
pub fn clear_marker(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(MARKER));
}

/// The marker of `dir` if it names a process that is alive: on this host, a `lab run-one` with
/// that pid (checked through `/proc`); on another host, taken on trust.
pub fn live_marker(dir: &Path) -> Option<Marker> {
    let text = std::fs::read_to_string(dir.join(MARKER)).ok()?;
    let m: Marker = serde_json::from_str(&text).ok()?;
    if m.host != host_name() {
        return Some(m);
    }
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", m.pid)).ok()?;
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    // A zombie has an empty command line: it is not running any more.
    args.contains(&b"run-one".as_slice()).then_some(m)
}

/// State of one run in a results folder.
#[derive(Clone, Debug, PartialEq)]
pub enum RunState {
    /// Finished.
    Done,
    /// Recorded as failed.
    Failed {
        /// Step at which it stopped (0 for a crashed process).
        step: Option<i64>,
        /// Why.
        reason: String,
    },
    /// A live process holds it.
    Running(Marker),
    /// Not started, or interrupted.
    Missing,
}

/// State of run `id` in `out_dir`.
pub fn run_state(out_dir: &Path, id: &str) -> RunState {
    let dir = run_dir(out_dir, id);
    if is_finished(out_dir, id) {
        return match results::read_parquet(&dir.join("runs.parquet")) {
            Ok((_, b)) if !b.is_empty() && b[0].num_rows() > 0 => {
                let status = column::strings(&b[0], "status")[0].clone();
                if status.as_deref() == Some("done") {
                    RunState::Done
                } else {
                    RunState::Failed {
                        step: column::ints(&b[0], "fail_step")[0],
                        reason: column::strings(&b[0], "fail_reason")[0]
                            .clone()
                            .unwrap_or_default(),
                    }
                }
            }
            Ok(_) => RunState::Failed {
                step: None,
                reason: "empty runs.parquet".into(),
            },
            Err(e) => RunState::Failed {
                step: None,
                reason: e.to_string(),
            },
        };
    }
    match live_marker(&dir) {
        Some(m) => RunState::Running(m),
        None => RunState::Missing,
    }
}

/// The states of a list of runs and a printable report.
#[derive(Clone, Debug)]
pub struct StatusReport {
    /// `(run_id, label, state)` in plan order.
    pub runs: Vec<(String, String, RunState)>,
}

impl StatusReport {
    /// Counts `(done, running, failed, missing)`.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let mut c = (0, 0, 0, 0);
        for (_, _, s) in &self.runs {
            match s {
                RunState::Done => c.0 += 1,
                RunState::Running(_) => c.1 += 1,
                RunState::Failed { .. } => c.2 += 1,
                RunState::Missing => c.3 += 1,
            }
        }
        c
    }

    /// One summary line, then one line per run that is not done.
    pub fn text(&self) -> String {
        let (done, running, failed, missing) = self.counts();
        let mut s = format!(
            "{} runs: {done} done, {running} running, {failed} failed, {missing} missing\n",
            self.runs.len()
        );
        for (id, label, state) in &self.runs {
            let what = match state {
                RunState::Done => continue,
                RunState::Running(m) => format!("running   (pid {} on {})", m.pid, m.host),
                RunState::Failed { step, reason } => match step {
                    Some(step) => format!("failed    at step {step}: {reason}"),
                    None => format!("failed    {reason}"),
                },
                RunState::Missing => "missing".to_string(),
            };
            s.push_str(&format!("  {id}  {what}  [{label}]\n"));
        }
        s
    }
}

/// States of `runs` (`(run_id, label)`) in `out_dir`.
pub fn status(out_dir: &Path, runs: &[(String, String)]) -> StatusReport {
    StatusReport {
        runs: runs
            .iter()
            .map(|(id, label)| (id.clone(), label.clone(), run_state(out_dir, id)))
            .collect(),
    }
}

/// What [`merge_dirs`] did.
#[derive(Clone, Debug)]
pub struct MergeReport {
    /// Finished runs found in the inputs (with repeats).
    pub found: usize,
    /// Runs copied into the output folder.
    pub copied: usize,
    /// Runs the output folder already had, or that an earlier input already gave.
    pub duplicates: usize,
    /// Runs in the output folder after the merge.
    pub total: usize,
    /// Summary of the merged tables and fit (as `lab sweep` prints it).
    pub summary: String,
}

impl MergeReport {
    /// The line `lab merge` prints after the summary, for `n_inputs` folders merged into `out`.
    pub fn closing_line(&self, n_inputs: usize, out: &Path) -> String {
        format!(
            "merged {n_inputs} folder(s) into {}: {} finished runs found, {} copied, {} duplicates skipped; {} runs in total",
            out.display(),
            self.found,
            self.copied,
            self.duplicates,
            self.total
        )
    }
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let name = e.file_name();
        // Temporaries of a killed writer and the live-process marker are not results.
        let n = name.to_string_lossy();
        if (n.starts_with('.') && n.contains(".tmp-")) || n == MARKER {
            continue;
        }
        let (src, dst) = (e.path(), to.join(&name));
        if e.file_type()?.is_dir() {
            copy_dir(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

fn sweep_error(context: String) -> impl FnOnce(std::io::Error) -> SweepError {
    move |source| SweepError::Io { context, source }
}

/// Merge the finished runs of the results folders `inputs` (e.g. the shard folders of a sweep)
/// into `out`: each run folder is copied once (a run id already in `out`, or given by an earlier
/// input, is a duplicate and skipped; an unfinished folder in `out` is replaced), whole or not at
/// all (copied under a temporary name, then renamed). The finished runs in `out` are grouped by
/// plan (the inputs' `plan.json`: the shards of one plan are one group; runs no plan names, by
/// their `(sweep, preset)`); the group with most runs becomes `out`'s plan, and its tables and
/// fit are rebuilt (the others stay in `runs/`, named in the summary).
pub fn merge_dirs(inputs: &[PathBuf], out: &Path) -> Result<MergeReport, SweepError> {
    // Every input is checked before the output folder is created (no folder left on an error).
    if let Some(bad) = inputs.iter().find(|i| !i.join("runs").is_dir()) {
        return Err(SweepError::Data(format!(
            "{} is not a results folder (no runs/ in it)",
            bad.display()
        )));
    }
    let runs_out = out.join("runs");
    std::fs::create_dir_all(&runs_out).map_err(sweep_error(format!(
        "cannot create the output folder {}",
        out.display()
    )))?;
    results::clean_temporaries(&runs_out);
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    let (mut found, mut copied, mut duplicates) = (0, 0, 0);
    for input in inputs {
        let runs_in = input.join("runs");
        let mut ids: Vec<String> = std::fs::read_dir(&runs_in)
            .map_err(sweep_error(format!(
                "{} is not a results folder (no runs/ in it)",
                input.display()
            )))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|id| is_finished(input, id))
            .collect();
        ids.sort();
        found += ids.len();
        if same(input, out) {
            continue;
        }
        for id in ids {
            if is_finished(out, &id) {
                duplicates += 1;
                continue;
            }
            let dst = run_dir(out, &id);
            let tmp = runs_out.join(format!(".{id}.tmp-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&tmp);
            copy_dir(&run_dir(input, &id), &tmp).map_err(sweep_error(format!(
                "cannot copy run {id} from {} to {}",
                input.display(),
                out.display()
            )))?;
            if dst.exists() {
                std::fs::remove_dir_all(&dst)
                    .map_err(sweep_error(format!("cannot replace {}", dst.display())))?;
            }
            std::fs::rename(&tmp, &dst)
                .map_err(sweep_error(format!("cannot rename into {}", dst.display())))?;
            copied += 1;
        }
    }
    // Which plan each finished run in `out` belongs to: the first plan recorded by an input (or
    // by `out` itself) that names it (the shards of one plan share its id), else its
    // (sweep, preset) as its own `runs` row records them.
    let recorded: Vec<crate::results::plan::FolderPlan> = inputs
        .iter()
        .map(PathBuf::as_path)
        .chain(std::iter::once(out))
        .filter_map(crate::results::plan::read)
        .collect();
    type Group = (
        String,
        String,
        Option<crate::results::plan::FolderPlan>,
        Vec<String>,
    );
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    let all = crate::results::plan::finished_ids(out);
    for id in &all {
        if let Some(p) = recorded.iter().find(|p| p.run_ids.contains(id)) {
            groups
                .entry(format!("plan {}", p.plan_id))
                .or_insert_with(|| (p.sweep.clone(), p.preset.clone(), Some(p.clone()), vec![]))
                .3
                .push(id.clone());
            continue;
        }
        let (_, b) = results::read_parquet(&run_dir(out, id).join("runs.parquet"))?;
        let first = |c: &str| {
            b.first()
                .and_then(|b| column::strings(b, c).first().cloned().flatten())
                .unwrap_or_default()
        };
        let (sweep, preset) = (first("sweep"), first("preset"));
        groups
            .entry(format!("runs {sweep} {preset}"))
            .or_insert_with(|| (sweep, preset, None, vec![]))
            .3
            .push(id.clone());
    }
    // The largest group; on a tie, one that a recorded plan names.
    let summary = match groups.values().max_by_key(|g| (g.3.len(), g.2.is_some())) {
        Some((sweep, preset, recorded_plan, ids)) => {
            let plan = crate::results::plan::FolderPlan {
                sweep: sweep.clone(),
                preset: preset.clone(),
                sets: recorded_plan
                    .as_ref()
                    .map(|p| p.sets.clone())
                    .unwrap_or_default(),
                shard: None,
                plan_id: recorded_plan
                    .as_ref()
                    .map(|p| p.plan_id.clone())
                    .unwrap_or_else(|| crate::results::plan::FolderPlan::id_of(sweep, ids)),
                run_ids: ids.clone(),
                select: recorded_plan.as_ref().and_then(|p| p.select.clone()),
            };
            crate::results::plan::write(out, &plan).map_err(sweep_error(format!(
                "cannot write {} in {}",
                crate::results::plan::PLAN_FILE,
                out.display()
            )))?;
            let (_, text, _) = collect_named(sweep, preset, out, ids)?;
            let mut head = format!("sweep {sweep}, {}: {} runs\n", plan.describe(), ids.len());
            if groups.len() > 1 {
                head.push_str(&format!(
                    "(the folder also holds runs of {} other plan(s); the tables and the fit cover this one)\n",
                    groups.len() - 1
                ));
            }
            head + &text
        }
        None => "no finished run in the inputs\n".to_string(),
    };
    Ok(MergeReport {
        found,
        copied,
        duplicates,
        total: all.len(),
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// A marker names a live `run-one` process → running; once the process is gone (or for a
    /// pid that runs something else) → not running.
    #[test]
    fn marker_is_live_only_while_its_process_runs() {
        let dir = std::env::temp_dir().join(format!("lab-marker-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(live_marker(&dir), None);
        // A process whose command line reads `run-one 30`.
        let mut child = std::process::Command::new("sleep")
            .arg0("run-one")
            .arg("30")
            .spawn()
            .unwrap();
        write_marker(&dir, child.id()).unwrap();
        assert_eq!(
            live_marker(&dir),
            Some(Marker {
                host: host_name(),
                pid: child.id()
            })
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(live_marker(&dir), None);
        // This test process is alive but is not a run.
        write_marker(&dir, std::process::id()).unwrap();
        assert_eq!(live_marker(&dir), None);
        clear_marker(&dir);
        assert!(!dir.join(MARKER).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
