//! Where the lab reads and writes by default: one **lab root** for the sweep files
//! (`<root>/sweeps/`), the results (`<root>/results/<sweep>/`) and the corpora
//! (`<root>/data/`), so a command run from any folder of a checkout reads the checkout's sweep
//! files and writes into the checkout's results (issue 51, item 8).
//!
//! The root, first match:
//! 1. `$LAB_SWEEPS_DIR` set: the sweep files are there, and the root is the folder above it;
//! 2. the working directory or the nearest folder above it that has a `sweeps/` folder with a
//!    `.toml` file in it (a checkout of the lab, or a project of one's own sweep files);
//! 3. the source tree the binary was built from, when its `sweeps/` still exists;
//! 4. the working directory.
//!
//! `$LAB_DATA_DIR`, when set, moves the data folder alone. Every flag that names a folder
//! (`--out`, `--results`, `--data-dir`) overrides its default. The commands that take a sweep
//! name say on their first line which sweep file and which results folder they use
//! ([`where_line`]).

use std::path::{Path, PathBuf};

/// Whether `dir` holds at least one `.toml` file.
fn has_sweep_files(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "toml"))
        })
        .unwrap_or(false)
}

/// The lab root (see the [module docs](self)). It is the empty path (relative paths) when it
/// is the working directory, else absolute.
pub fn root() -> PathBuf {
    let cwd = std::env::current_dir().ok();
    let relative_to_cwd = |p: PathBuf| -> PathBuf {
        match &cwd {
            Some(c) if *c == p => PathBuf::new(),
            _ => p,
        }
    };
    if let Some(d) = std::env::var_os("LAB_SWEEPS_DIR") {
        let d = std::path::absolute(PathBuf::from(d)).unwrap_or_default();
        return relative_to_cwd(d.parent().map(Path::to_path_buf).unwrap_or_default());
    }
    if let Some(c) = &cwd {
        for dir in c.ancestors() {
            if has_sweep_files(&dir.join("sweeps")) {
                return relative_to_cwd(dir.to_path_buf());
            }
        }
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if source.join("sweeps").is_dir() {
        return relative_to_cwd(source.canonicalize().unwrap_or(source));
    }
    PathBuf::new()
}

/// The folder of the sweep files: `$LAB_SWEEPS_DIR`, else `<root>/sweeps`.
pub fn sweeps_dir() -> PathBuf {
    match std::env::var_os("LAB_SWEEPS_DIR") {
        Some(d) => PathBuf::from(d),
        None => root().join("sweeps"),
    }
}

/// The default results folder of sweep `name`: `<root>/results/<name>`.
pub fn default_results(name: &str) -> PathBuf {
    root().join("results").join(name)
}

/// The default folder of trained runs that `lab recommend` searches: `<root>/results`.
pub fn results_root() -> PathBuf {
    root().join("results")
}

/// The data folder: `$LAB_DATA_DIR`, else `<root>/data`.
pub fn data_dir() -> PathBuf {
    match std::env::var_os("LAB_DATA_DIR") {
        Some(d) => PathBuf::from(d),
        None => root().join("data"),
    }
}

/// The line a command prints first (on stderr) to say what it reads and writes:
/// `sweep file: sweeps/block-width.toml · results: results/block-width`.
pub fn where_line(sweep_file: Option<&Path>, results: &Path) -> String {
    match sweep_file {
        Some(f) => format!(
            "sweep file: {} · results: {}",
            f.display(),
            results.display()
        ),
        None => format!("results: {}", results.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test runs in the crate folder (`lab/`): the nearest folder above with sweep files is
    /// the checkout, so sweeps, results and data resolve there, together.
    #[test]
    fn the_checkout_is_the_root_from_any_folder_inside_it() {
        if std::env::var_os("LAB_SWEEPS_DIR").is_some()
            || std::env::var_os("LAB_DATA_DIR").is_some()
        {
            return;
        }
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .canonicalize()
            .unwrap();
        let r = root();
        let r = if r.as_os_str().is_empty() {
            std::env::current_dir().unwrap()
        } else {
            r
        };
        assert_eq!(r.canonicalize().unwrap(), checkout);
        assert_eq!(sweeps_dir(), root().join("sweeps"));
        assert_eq!(default_results("x"), root().join("results").join("x"));
        assert_eq!(data_dir(), root().join("data"));
        assert!(sweeps_dir().join("block-width.toml").is_file());
        assert_eq!(
            where_line(Some(Path::new("s/a.toml")), Path::new("r/a")),
            "sweep file: s/a.toml · results: r/a"
        );
    }
}
