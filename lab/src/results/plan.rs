//! The plan a results folder's tables describe (`plan.json`): which sweep, preset, `--set`
//! overrides and shard the last `lab sweep` (or `lab merge`) resolved there, and the ids of its
//! runs.
//!
//! A folder may hold the run folders of several plans (a sweep run twice with other overrides,
//! or other presets, into one `--out`): `runs/` keeps every run, but the merged tables
//! (`runs.parquet`, `curves.parquet`, …), the fit, the figures, `lab report` and `lab compare`
//! cover the runs of the recorded plan only, and `lab sweep` names the runs it left out
//! (issue 51, item 2). `lab status` without `--preset` or `--set` reports the recorded plan.
//!
//! Folders written before `plan.json` existed have none: their tables cover every finished run,
//! as they did.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// File name of the plan record in a results folder.
pub const PLAN_FILE: &str = "plan.json";

/// One resolved plan of a results folder.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FolderPlan {
    /// Sweep name.
    pub sweep: String,
    /// Preset.
    pub preset: String,
    /// `--set` overrides, as given, in order.
    #[serde(default)]
    pub sets: Vec<String>,
    /// `--shard i/n` when the folder holds one slice of the plan.
    #[serde(default)]
    pub shard: Option<String>,
    /// Identity of the whole plan (every shard of it has the same): the first 16 hex digits of
    /// the BLAKE3 hash of the sweep name and the run ids of the unsharded plan, in order.
    pub plan_id: String,
    /// The run ids of this folder's plan (of its shard), in plan order.
    pub run_ids: Vec<String>,
    /// The preset's selection on validation (docs/analysis-rules.md R58), if it has one: the
    /// folder's tables then use the selected runs ([`crate::analysis::select`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select: Option<crate::analysis::select::Selection>,
}

impl FolderPlan {
    /// The plan identity of `sweep`'s runs `ids` (the whole plan, before sharding).
    pub fn id_of(sweep: &str, ids: &[String]) -> String {
        let mut h = blake3::Hasher::new();
        h.update(sweep.as_bytes());
        for id in ids {
            h.update(b"\n");
            h.update(id.as_bytes());
        }
        h.finalize().to_hex()[..16].to_string()
    }

    /// `preset P` and the overrides, as the user typed them (`preset smoke --set steps=300`),
    /// with the shard.
    pub fn describe(&self) -> String {
        let mut s = format!("preset {}", self.preset);
        for set in &self.sets {
            s.push_str(&format!(" --set {set}"));
        }
        if let Some(shard) = &self.shard {
            s.push_str(&format!(" --shard {shard}"));
        }
        s
    }
}

/// The plan recorded in `out_dir`, if any (`None` also when the file does not parse).
pub fn read(out_dir: &Path) -> Option<FolderPlan> {
    let text = std::fs::read_to_string(out_dir.join(PLAN_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Record `plan` as `out_dir`'s plan (temporary file, then rename).
///
/// # Errors
/// The file cannot be written.
pub fn write(out_dir: &Path, plan: &FolderPlan) -> std::io::Result<()> {
    let json = serde_json::to_string_pretty(plan).expect("plan serialises");
    crate::results::write_file_atomic(&out_dir.join(PLAN_FILE), json.as_bytes())
}

/// The ids of the finished runs in `out_dir/runs/` (sorted).
pub fn finished_ids(out_dir: &Path) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(out_dir.join("runs"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        // Finished: its `runs.parquet` exists (written last, atomically; crate::sweep::runner).
        .filter(|id| out_dir.join("runs").join(id).join("runs.parquet").is_file())
        .collect();
    ids.sort();
    ids
}

/// The finished runs of `out_dir` outside `ids` (sorted): kept in `runs/`, left out of the
/// tables.
pub fn other_finished(out_dir: &Path, ids: &[String]) -> Vec<String> {
    let own: std::collections::HashSet<&String> = ids.iter().collect();
    finished_ids(out_dir)
        .into_iter()
        .filter(|id| !own.contains(id))
        .collect()
}

/// The note a folder's summary carries when it holds finished runs outside its plan: how many,
/// and where they are; empty when there are none.
pub fn others_note(out_dir: &Path, ids: &[String]) -> String {
    let others = other_finished(out_dir, ids);
    if others.is_empty() {
        return String::new();
    }
    format!(
        "note: {} holds {} more finished run(s) of other plans (other presets or --set values); they stay in {} but are not in these tables, fits or figures (plan.json lists this plan's runs)\n",
        out_dir.display(),
        others.len(),
        out_dir.join("runs").display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_round_trips_and_describes_itself() {
        let dir = std::env::temp_dir().join(format!("lab-plan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("runs")).unwrap();
        assert_eq!(read(&dir), None);
        let ids = vec!["aa".to_string(), "bb".to_string()];
        let plan = FolderPlan {
            select: None,
            sweep: "block-width".into(),
            preset: "smoke".into(),
            sets: vec!["steps=300".into()],
            shard: None,
            plan_id: FolderPlan::id_of("block-width", &ids),
            run_ids: ids.clone(),
        };
        write(&dir, &plan).unwrap();
        assert_eq!(read(&dir), Some(plan.clone()));
        assert_eq!(plan.describe(), "preset smoke --set steps=300");
        // The id depends on the sweep and on the runs and their order.
        assert_ne!(plan.plan_id, FolderPlan::id_of("other", &ids));
        assert_ne!(
            plan.plan_id,
            FolderPlan::id_of("block-width", &["bb".into(), "aa".into()])
        );
        // A finished run outside the plan is named in the note; one inside is not.
        for id in ["aa", "cc"] {
            std::fs::create_dir_all(dir.join("runs").join(id)).unwrap();
            std::fs::write(dir.join("runs").join(id).join("runs.parquet"), b"x").unwrap();
        }
        std::fs::create_dir_all(dir.join("runs").join("dd")).unwrap(); // unfinished
        assert_eq!(other_finished(&dir, &ids), vec!["cc".to_string()]);
        assert!(others_note(&dir, &ids).contains("1 more finished run(s)"));
        assert_eq!(others_note(&dir, &["aa".into(), "cc".into()]), "");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
