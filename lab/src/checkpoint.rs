//! Checkpoints: a trained model's weights (SafeTensors, via burn-store) next to its run config.
//!
//! A checkpoint is a folder holding `config.json` (the [`RunConfig`]) and `model.safetensors`.
//! Every run of a sweep saves one in its run folder (`results/<sweep>/runs/<run_id>/`), so a run
//! id's folder is a checkpoint. Both files are written to temporary names and renamed.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::store::{ModuleSnapshot, SafetensorsStore};
use burn::tensor::Device;

use crate::config::RunConfig;
use crate::model::Transformer;

/// Weights file name inside a checkpoint folder.
pub const WEIGHTS: &str = "model.safetensors";
/// Config file name inside a checkpoint folder.
pub const CONFIG: &str = "config.json";

/// Checkpoint errors (one line, with the path).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// File system.
    #[error("cannot read or write {path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        message: String,
    },
    /// Not a checkpoint.
    #[error("{path} is not a checkpoint: {message}")]
    Invalid {
        /// The folder.
        path: PathBuf,
        /// What is missing or wrong.
        message: String,
    },
}

/// Save `model` and `cfg` into `dir`.
pub fn save(model: &Transformer, cfg: &RunConfig, dir: &Path) -> Result<(), CheckpointError> {
    let io = |path: &Path, e: &dyn std::fmt::Display| CheckpointError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, &e))?;
    let tmp = dir.join(format!(".{WEIGHTS}.tmp-{}", std::process::id()));
    let mut store = SafetensorsStore::from_file(&tmp);
    model
        .valid()
        .save_into(&mut store)
        .map_err(|e| io(&tmp, &e))?;
    std::fs::rename(&tmp, dir.join(WEIGHTS)).map_err(|e| io(&dir.join(WEIGHTS), &e))?;
    let cfg_tmp = dir.join(format!(".{CONFIG}.tmp-{}", std::process::id()));
    std::fs::write(
        &cfg_tmp,
        serde_json::to_string_pretty(cfg).expect("config serialises"),
    )
    .map_err(|e| io(&cfg_tmp, &e))?;
    std::fs::rename(&cfg_tmp, dir.join(CONFIG)).map_err(|e| io(&dir.join(CONFIG), &e))?;
    Ok(())
}

/// Load a checkpoint folder (or the folder of a given `model.safetensors`) onto `device`.
pub fn load(path: &Path, device: &Device) -> Result<(RunConfig, Transformer), CheckpointError> {
    let dir = if path.is_file() {
        path.parent().unwrap_or(Path::new(".")).to_path_buf()
    } else {
        path.to_path_buf()
    };
    let invalid = |message: String| CheckpointError::Invalid {
        path: dir.clone(),
        message,
    };
    let text =
        std::fs::read_to_string(dir.join(CONFIG)).map_err(|e| invalid(format!("{CONFIG}: {e}")))?;
    let cfg = RunConfig::from_json(&text).map_err(|e| invalid(format!("{CONFIG}: {e}")))?;
    if !dir.join(WEIGHTS).is_file() {
        return Err(invalid(format!("no {WEIGHTS} (was the run finished?)")));
    }
    let mut model = cfg.model().init(cfg.seed, device);
    let mut store = SafetensorsStore::from_file(dir.join(WEIGHTS));
    let result = model
        .load_from(&mut store)
        .map_err(|e| invalid(format!("{WEIGHTS}: {e}")))?;
    if !result.errors.is_empty() || !result.missing.is_empty() {
        return Err(invalid(format!(
            "{WEIGHTS} does not match the config's model ({} errors, {} missing tensors)",
            result.errors.len(),
            result.missing.len()
        )));
    }
    Ok((cfg, model))
}
