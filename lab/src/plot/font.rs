//! The TrueType font for figure text. plotters' `ab_glyph` backend draws text from a font that
//! the program registers, so the lab looks one up on the system at run time (no font is
//! shipped): `$LAB_FONT` if set, else DejaVu Sans where distributions install it (Debian:
//! `fonts-dejavu-core`), else whatever `fc-match sans-serif` names. It covers the Greek letters
//! and symbols the labels use (θ, π, β, ², ×, –).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::style::FontStyle;

use super::PlotError;

/// Environment variable naming a .ttf/.otf file to use instead of the system's DejaVu Sans.
pub const FONT_ENV: &str = "LAB_FONT";

const CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", // Debian, Ubuntu
    "/usr/share/fonts/TTF/DejaVuSans.ttf",             // Arch
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf", // Fedora
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/local/share/fonts/DejaVuSans.ttf",
    "/Library/Fonts/DejaVuSans.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf", // macOS fallback
];

/// The font file figures will use, or `None` when there is none.
pub fn find_font() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(FONT_ENV) {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = CANDIDATES.iter().map(Path::new).find(|p| p.is_file()) {
        return Some(p.to_path_buf());
    }
    let out = std::process::Command::new("fc-match")
        .args(["-f", "%{file}", "sans-serif"])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && p.is_file()).then_some(p)
}

/// Register the font as plotters' `sans-serif` (normal; bold from `*-Bold.ttf` beside it when
/// present). Done once per process; later calls return the first outcome.
pub fn register() -> Result<(), PlotError> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| load().map_err(|e| e.to_string()))
        .clone()
        .map_err(|why| match find_font() {
            None => PlotError::NoFont,
            Some(path) => PlotError::BadFont { path, why },
        })
}

fn load() -> Result<(), PlotError> {
    let path = find_font().ok_or(PlotError::NoFont)?;
    let leak = |p: &Path| -> Result<&'static [u8], PlotError> {
        let bytes = std::fs::read(p).map_err(|e| PlotError::BadFont {
            path: p.to_path_buf(),
            why: e.to_string(),
        })?;
        Ok(Box::leak(bytes.into_boxed_slice()))
    };
    plotters::style::register_font("sans-serif", FontStyle::Normal, leak(&path)?).map_err(
        |_| PlotError::BadFont {
            path: path.clone(),
            why: "not a TrueType/OpenType font".into(),
        },
    )?;
    let bold = path.with_file_name(
        path.file_stem()
            .map(|s| format!("{}-Bold.ttf", s.to_string_lossy()))
            .unwrap_or_default(),
    );
    if bold.is_file()
        && let Ok(bytes) = leak(&bold)
    {
        // Optional: text falls back to the normal face when bold is missing or unreadable.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Bold, bytes);
    }
    Ok(())
}
