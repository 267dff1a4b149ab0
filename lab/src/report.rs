//! `lab report SWEEP`: a sweep's results as one self-contained HTML page — the claim and the
//! verdict measured, every figure (inlined SVG) with its caption, the summary `lab sweep`
//! printed, the law's fits, the runs (a sortable table), the failed runs with their reasons, and
//! provenance (lab version, git commit, command line, preset, machine, times, steps, tokens).
//!
//! The page loads nothing: no network, no external script, style or font; its one script (a
//! click-to-sort for tables) is inline. Figures are drawn first (`lab plot`) when the results
//! folder has none. Sources: `runs.parquet`, `fit.parquet`, `figures/*.svg`, `summary.txt` and
//! `provenance.json` ([`crate::sweep::provenance`]) of the results folder; the sweep file for the
//! description and claim.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::plot::data::Table;
use crate::plot::{self, PlotError};
use crate::sweep::provenance::{self, Invocation, SUMMARY_FILE};

/// Errors of `lab report`. One line each.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The results folder has neither a `runs` table nor MI tables.
    #[error(
        "{0} has no runs.parquet or mi.parquet: run the sweep first (`lab sweep NAME`), or pass its folder with --results"
    )]
    NoResults(PathBuf),
    /// Reading a table.
    #[error(transparent)]
    Table(#[from] PlotError),
    /// Writing the page.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// What [`write_report`] wrote.
#[derive(Clone, Debug)]
pub struct Written {
    /// The HTML file.
    pub path: PathBuf,
    /// Figures inlined (file stems).
    pub figures: Vec<String>,
    /// Figures of the sweep that are not in the page, each with why.
    pub missing: Vec<String>,
}

impl Written {
    /// What `lab report` prints: the file and the number of figures inlined, then one
    /// `note:` line per figure left out.
    pub fn text(&self) -> String {
        let mut s = format!(
            "{} ({} figure(s) inlined)",
            self.path.display(),
            self.figures.len()
        );
        for m in &self.missing {
            s.push_str(&format!("\nnote: figure {m}"));
        }
        s
    }
}

/// The claim a sweep tests, from its sweep file (`claim = "…"`), else its description.
fn claim_of(sweep: &str, sweeps_dir: &Path) -> (String, String) {
    let path = crate::sweep::commands::sweep_path(sweep, sweeps_dir);
    if crate::mi::is_mi_sweep(&path) {
        return crate::mi::MiSweep::load(&path)
            .map(|s| (s.description.clone(), s.claim.clone()))
            .unwrap_or_default();
    }
    crate::sweep::find_sweep(sweep, sweeps_dir)
        .map(|s| (s.description.clone(), s.claim.clone()))
        .unwrap_or_default()
}

/// Escape text for HTML.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// An SVG file's text ready to inline: the XML prolog and doctype dropped, and a `viewBox`
/// added from `width`/`height` when the root has none (so CSS can scale it). `None` when the
/// text has no `<svg` element.
pub fn inline_svg(text: &str) -> Option<String> {
    let start = text.find("<svg")?;
    let body = &text[start..];
    let end = body.find('>')?;
    let (root, rest) = body.split_at(end);
    if root.contains("viewBox") {
        return Some(body.to_string());
    }
    let attr = |name: &str| -> Option<f64> {
        let key = format!(" {name}=\"");
        let i = root.find(&key)? + key.len();
        let j = root[i..].find('"')? + i;
        root[i..j].trim_end_matches("px").parse().ok()
    };
    match (attr("width"), attr("height")) {
        (Some(w), Some(h)) => Some(format!("{root} viewBox=\"0 0 {w} {h}\"{rest}")),
        _ => Some(body.to_string()),
    }
}

/// Columns of the runs table shown after the run's settings, in this order (those present).
const RUN_METRICS: &[&str] = &[
    "final_eval_accuracy",
    "answer_accuracy",
    "final_eval_loss",
    "effective_freq",
    "effective_freq_positional",
    "positional_layer",
    "dep_width_mi",
    "steps_done",
    "converged_step",
    "wall_time_s",
];

/// Every cell of column `col` as text (floats to 4 significant digits, nulls as `–`).
fn cells(t: &Table, col: &str) -> Vec<String> {
    let fmt_f = |v: f64| {
        if v == 0.0 || (1e-3..1e5).contains(&v.abs()) {
            let digits = (3 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
            format!("{v:.digits$}")
        } else {
            format!("{v:.3e}")
        }
    };
    use arrow_schema::DataType as D;
    let dash = || "–".to_string();
    let unknown = || vec![dash(); t.rows()];
    match t.data_type(col) {
        Some(D::Utf8 | D::LargeUtf8 | D::Utf8View) => t.strs(col).map_or_else(
            |_| unknown(),
            |v| v.into_iter().map(|x| x.unwrap_or_else(dash)).collect(),
        ),
        Some(D::Int64) => t.i64s(col).map_or_else(
            |_| unknown(),
            |v| {
                v.into_iter()
                    .map(|x| x.map_or_else(dash, |x| x.to_string()))
                    .collect()
            },
        ),
        Some(D::Float64) => t.f64s(col).map_or_else(
            |_| unknown(),
            |v| v.into_iter().map(|x| x.map_or_else(dash, fmt_f)).collect(),
        ),
        Some(D::Boolean) => t.bools(col).map_or_else(
            |_| unknown(),
            |v| {
                v.into_iter()
                    .map(|x| x.map_or_else(dash, |x| x.to_string()))
                    .collect()
            },
        ),
        _ => unknown(),
    }
}

/// A sortable HTML table of `columns` (header, cells).
fn html_table(class: &str, columns: &[(String, Vec<String>)]) -> String {
    let rows = columns.first().map_or(0, |c| c.1.len());
    let mut s = format!("<table class=\"{class} sortable\"><thead><tr>");
    for (h, _) in columns {
        let _ = write!(s, "<th title=\"click to sort\">{}</th>", esc(h));
    }
    s.push_str("</tr></thead><tbody>");
    for r in 0..rows {
        s.push_str("<tr>");
        for (_, v) in columns {
            let _ = write!(s, "<td>{}</td>", esc(&v[r]));
        }
        s.push_str("</tr>");
    }
    s.push_str("</tbody></table>");
    s
}

/// The settings that tell the runs apart: config fields (and `preset`) whose value differs
/// between rows of the runs table, in the table's column order.
fn varying_settings(runs: &Table) -> Vec<String> {
    let fields: BTreeSet<&str> = crate::config::fields().iter().copied().collect();
    runs.column_names()
        .into_iter()
        .filter(|c| c == "preset" || fields.contains(c.as_str()))
        .filter(|c| {
            let v: BTreeSet<String> = cells(runs, c).into_iter().collect();
            v.len() > 1
        })
        .collect()
}

/// The law's fits as a table with a verdict column: the one `lab sweep` wrote into the fit
/// table ([`crate::results::tables::law_verdict`]: β ∈ [0.8, 1.2] and R² ≥ 0.8, given R57's
/// minimum of widths, seeds and accuracy). `positional` rows first.
fn fit_section(fit: &Table) -> Result<(String, Vec<String>), PlotError> {
    let s = |c: &str| fit.strs(c);
    let f = |c: &str| fit.f64s(c);
    let (enc, var, pool, src, group) = (
        s("encoding")?,
        s("variant")?,
        s("pooling")?,
        s("width_source")?,
        s("group")?,
    );
    let (beta, lo, hi, c, clo, chi, r2) = (
        f("beta")?,
        f("beta_ci_low")?,
        f("beta_ci_high")?,
        f("c")?,
        f("c_ci_low")?,
        f("c_ci_high")?,
        f("r2")?,
    );
    let n = fit.i64s("n")?;
    let seeds = fit.i64s("n_seeds")?;
    // The verdict as `lab sweep` wrote it (docs/analysis-rules.md R57); a fit table of a lab
    // version before R57 has none, and gets no verdict.
    let written: Vec<Option<String>> = if fit.has("verdict") {
        s("verdict")?
    } else {
        vec![None; fit.rows()]
    };
    // The headline pooling: the positional layer (R2), else (one-layer models) all layers.
    let headline = if pool.iter().any(|p| p.as_deref() == Some("positional")) {
        "positional"
    } else {
        "all"
    };
    let mut order: Vec<usize> = (0..fit.rows()).collect();
    order.sort_by_key(|&i| {
        (
            pool[i].as_deref() != Some(headline),
            src[i].as_deref() != Some("dep_width"),
            i,
        )
    });
    let g = |v: &[Option<f64>], i: usize| v[i].unwrap_or(f64::NAN);
    let mut cols: Vec<(String, Vec<String>)> = [
        "encoding",
        "variant",
        "group",
        "pooling",
        "W from",
        "β [95 % CI]",
        "c [95 % CI]",
        "R²",
        "runs (seeds)",
        "verdict (R57)",
    ]
    .iter()
    .map(|h| (h.to_string(), Vec::new()))
    .collect();
    let mut verdicts = Vec::new();
    let txt = |v: &Option<String>| v.clone().unwrap_or_default();
    for &i in &order {
        let verdict = written[i].clone().unwrap_or_else(|| {
            "no verdict: fit table written before docs/analysis-rules.md R57 (run the sweep again)"
                .to_string()
        });
        let own_group = group[i]
            .clone()
            .filter(|g| !g.is_empty() && *g != format!("{}/{}", txt(&enc[i]), txt(&var[i])))
            .unwrap_or_else(|| "–".into());
        let row = [
            txt(&enc[i]),
            txt(&var[i]),
            own_group,
            txt(&pool[i]),
            txt(&src[i]),
            format!("{:.3} [{:.3}, {:.3}]", g(&beta, i), g(&lo, i), g(&hi, i)),
            format!("{:.3} [{:.3}, {:.3}]", g(&c, i), g(&clo, i), g(&chi, i)),
            format!("{:.3}", g(&r2, i)),
            format!("{} ({})", n[i].unwrap_or(0), seeds[i].unwrap_or(0)),
            verdict.clone(),
        ];
        for (col, v) in cols.iter_mut().zip(row) {
            col.1.push(v);
        }
        if pool[i].as_deref() == Some(headline) && src[i].as_deref() == Some("dep_width") {
            verdicts.push(format!(
                "{}/{}{} ({headline} pooling): β = {:.3} [{:.3}, {:.3}], c = {:.3}, R² = {:.3} over {} runs — {}",
                txt(&enc[i]),
                txt(&var[i]),
                group[i]
                    .as_deref()
                    .filter(|g| !g.is_empty() && *g != format!("{}/{}", txt(&enc[i]), txt(&var[i])))
                    .map(|g| format!(" ({g})"))
                    .unwrap_or_default(),
                g(&beta, i),
                g(&lo, i),
                g(&hi, i),
                g(&c, i),
                g(&r2, i),
                n[i].unwrap_or(0),
                verdict
            ));
        }
    }
    // The group column only where some group is more than encoding/variant.
    if cols[2].1.iter().all(|g| g == "–") {
        cols.remove(2);
    }
    Ok((html_table("fits", &cols), verdicts))
}

/// Totals over the finished runs of the table: `(runs, steps, tokens, run seconds)`.
fn totals(runs: &Table) -> (usize, i64, f64, f64) {
    let steps = runs.i64s("steps_done").unwrap_or_default();
    let batch = runs.i64s("batch_size").unwrap_or_default();
    let len = runs.i64s("seq_len").unwrap_or_default();
    let wall = runs.f64s("wall_time_s").unwrap_or_default();
    let mut t = (runs.rows(), 0i64, 0.0, 0.0);
    for i in 0..runs.rows() {
        let s = steps.get(i).copied().flatten().unwrap_or(0);
        t.1 += s;
        t.2 += s as f64
            * batch.get(i).copied().flatten().unwrap_or(0) as f64
            * len.get(i).copied().flatten().unwrap_or(0) as f64;
        t.3 += wall.get(i).copied().flatten().unwrap_or(0.0);
    }
    t
}

fn provenance_section(inv: &[Invocation], runs: Option<&Table>) -> String {
    let mut s = String::new();
    if let Some(runs) = runs {
        let (n, steps, tokens, secs) = totals(runs);
        let _ = write!(
            s,
            "<p>{n} runs in the tables: {steps} training steps, {:.3e} training tokens, {:.1} min of run time (summed over runs).</p>",
            tokens,
            secs / 60.0
        );
    }
    if inv.is_empty() {
        s.push_str("<p>No provenance record (<code>provenance.json</code>): these results were written by a lab before reports existed; run the same <code>lab sweep</code> again (finished runs are skipped) to record it.</p>");
        return s;
    }
    let last = inv.last().expect("non-empty");
    let wall: f64 = inv.iter().map(|i| i.wall_time_s).sum();
    let _ = write!(
        s,
        "<dl class=\"prov\"><dt>lab version</dt><dd>{}</dd><dt>git commit</dt><dd><code>{}</code></dd><dt>machine</dt><dd>{} — {}, {} cores; {} job(s) × {} thread(s), backend {}</dd><dt>first start</dt><dd>{}</dd><dt>last end</dt><dd>{}</dd><dt>wall time</dt><dd>{:.1} min over {} invocation(s)</dd></dl>",
        esc(&last.lab_version),
        esc(last
            .git_commit
            .as_deref()
            .unwrap_or("unknown (not a git checkout)")),
        esc(&last.host),
        esc(last.cpu_model.as_deref().unwrap_or("unknown CPU")),
        last.cores,
        last.jobs,
        last.threads_per_run,
        esc(&last.backend),
        provenance::utc_text(inv[0].started_unix_s),
        provenance::utc_text(last.ended_unix_s),
        wall / 60.0,
        inv.len()
    );
    let col = |h: &str, f: &dyn Fn(&Invocation) -> String| {
        (h.to_string(), inv.iter().map(f).collect::<Vec<_>>())
    };
    s.push_str(&html_table(
        "invocations",
        &[
            col("started", &|i| provenance::utc_text(i.started_unix_s)),
            col("command", &|i| i.command.clone()),
            col("preset", &|i| i.preset.clone()),
            col("--set", &|i| i.sets.join(" ")),
            col("commit", &|i| {
                i.git_commit
                    .as_deref()
                    .map(|c| {
                        c.chars().take(12).collect::<String>()
                            + if c.ends_with("-dirty") { "-dirty" } else { "" }
                    })
                    .unwrap_or_else(|| "–".into())
            }),
            col("runs (ran / skipped / failed)", &|i| {
                format!("{} ({} / {} / {})", i.planned, i.ran, i.skipped, i.failed)
            }),
            col("wall time (min)", &|i| {
                format!("{:.1}", i.wall_time_s / 60.0)
            }),
        ],
    ));
    s
}

const STYLE: &str = "body{font-family:'DejaVu Sans',system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}\
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}\
.claim{background:#f4f6fa;border-left:4px solid #4a6fa5;padding:.6em 1em}\
.verdict li{margin:.2em 0}.holds{color:#1a7f37;font-weight:bold}.miss{color:#b42318;font-weight:bold}\
figure{margin:1.2em 0;border:1px solid #ddd;padding:.6em;background:#fff}figure svg{max-width:100%;height:auto;display:block;margin:auto}\
figcaption{font-size:.92em;color:#444;margin-top:.4em}\
table{border-collapse:collapse;font-size:.82em;margin:.6em 0;display:block;overflow-x:auto}\
th,td{border:1px solid #ddd;padding:.2em .45em;text-align:right;white-space:nowrap}th{background:#f0f0f0;cursor:pointer}\
tbody tr:nth-child(even){background:#fafafa}pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:.78em}\
dl.prov{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}dt{font-weight:bold}dd{margin:0}\
nav a{margin-right:1em}";

const SORT_SCRIPT: &str = "document.querySelectorAll('table.sortable th').forEach(function(th){th.addEventListener('click',function(){var i=th.cellIndex,t=th.closest('table'),b=t.tBodies[0],rows=Array.prototype.slice.call(b.rows),up=th.getAttribute('data-up')!=='1';rows.sort(function(x,y){var a=x.cells[i].textContent,c=y.cells[i].textContent,na=parseFloat(a),nc=parseFloat(c),r=(!isNaN(na)&&!isNaN(nc))?na-nc:a.localeCompare(c);return up?r:-r;});th.setAttribute('data-up',up?'1':'0');rows.forEach(function(r){b.appendChild(r);});});});";

/// Render the report of sweep `sweep` from `results` (figures under `results/figures`, drawn
/// there first when none of the sweep's figures exists). Returns the page and what it holds.
///
/// # Errors
/// A results folder without tables, a table that cannot be read.
pub fn render(
    sweep: &str,
    results: &Path,
    sweeps_dir: &Path,
) -> Result<(String, Vec<String>, Vec<String>), ReportError> {
    let runs_path = results.join("runs.parquet");
    let mi_path = results.join("mi.parquet");
    if !runs_path.is_file() && !mi_path.is_file() {
        return Err(ReportError::NoResults(results.to_path_buf()));
    }
    // Another sweep's folder would get this sweep's claim over its fits (issue 51, item 6).
    plot::check_sweep(sweep, results)?;
    let runs = runs_path
        .is_file()
        .then(|| Table::read_selected(&runs_path))
        .transpose()?;
    let (description, claim) = claim_of(sweep, sweeps_dir);
    let inv = provenance::read(results);

    // Figures: draw them when none is there yet.
    let fig_dir = results.join("figures");
    let stems: Vec<&str> = plot::SWEEP_FIGURES
        .iter()
        .find(|(n, _)| *n == sweep)
        .map(|(_, f)| f.to_vec())
        .unwrap_or_default();
    let mut plot_error = None;
    if !stems.is_empty()
        && !stems
            .iter()
            .any(|f| fig_dir.join(format!("{f}.svg")).is_file())
    {
        if let Err(e) = plot::plot_sweep(sweep, results, &fig_dir) {
            plot_error = Some(e.to_string());
        }
    }
    // The selection figure, whatever the sweep (a sweep file without figures of its own too).
    if !fig_dir
        .join(format!("{}.svg", plot::SELECTION_FIGURE))
        .is_file()
        && std::fs::create_dir_all(&fig_dir).is_ok()
        && let Err(e) = plot::selection_figure(results, &fig_dir)
    {
        plot_error.get_or_insert(e.to_string());
    }
    let mut optional: Vec<&str> = plot::OPTIONAL_FIGURES
        .iter()
        .find(|(n, _)| *n == sweep)
        .map(|(_, f)| f.to_vec())
        .unwrap_or_default();
    optional.push(plot::SELECTION_FIGURE);
    let (fig_html, figures, missing) =
        figures_html(sweep, &fig_dir, &stems, &optional, plot_error.as_deref());

    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>lab report: {}</title><style>{STYLE}</style></head><body>",
        esc(sweep)
    );
    let preset = inv.last().map(|i| i.preset.clone()).unwrap_or_default();
    let _ = write!(
        h,
        "<h1>lab sweep {}</h1><p>{}{}</p>",
        esc(sweep),
        esc(&description),
        if preset.is_empty() {
            String::new()
        } else {
            format!(" — preset <code>{}</code>", esc(&preset))
        }
    );
    h.push_str("<nav><a href=\"#claim\">claim</a><a href=\"#figures\">figures</a><a href=\"#summary\">summary</a><a href=\"#runs\">runs</a><a href=\"#provenance\">provenance</a></nav>");

    // Claim and verdict.
    let _ = write!(
        h,
        "<h2 id=\"claim\">Claim and verdict</h2><div class=\"claim\">{}</div>",
        esc(if claim.is_empty() {
            "(the sweep file states no claim)"
        } else {
            &claim
        })
    );
    let fit_path = results.join("fit.parquet");
    let mut fit_html = String::new();
    if fit_path.is_file() {
        let fit = Table::read(&fit_path)?;
        if fit.rows() > 0 {
            let (table, verdicts) = fit_section(&fit)?;
            h.push_str("<p>The law: θ_eff = c · W<sup>−β</sup> with β = 1, c = π (the paper measures c = 3.02). A fit holds here when β ∈ [0.8, 1.2] and R² ≥ 0.8, and gets a verdict only with ≥ 4 widths over ≥ 4×, ≥ 3 seeds per width and accuracy ≥ 0.9 in every run (docs/analysis-rules.md R57); the positional layer's fit against W = B (docs/analysis-rules.md R1–R2; all layers pooled when the model has one layer) is the headline.</p><ul class=\"verdict\">");
            for v in &verdicts {
                let class = if v.ends_with("the law holds") {
                    "holds"
                } else {
                    "miss"
                };
                let (head, tail) = v.rsplit_once(" — ").unwrap_or((v, ""));
                let _ = write!(
                    h,
                    "<li>{} — <span class=\"{class}\">{}</span></li>",
                    esc(head),
                    esc(tail)
                );
            }
            h.push_str("</ul>");
            fit_html = table;
        }
    }
    if fit_html.is_empty() {
        h.push_str(
            "<p>The measured numbers are in the summary below (this sweep fits no law).</p>",
        );
    }

    // Figures.
    h.push_str("<h2 id=\"figures\">Figures</h2>");
    h.push_str(&fig_html);
    if figures.is_empty() && stems.is_empty() {
        h.push_str("<p>This sweep has no figures of its own.</p>");
    }
    if !missing.is_empty() {
        h.push_str("<p>Not in this page:</p><ul>");
        for m in &missing {
            let _ = write!(h, "<li>{}</li>", esc(m));
        }
        h.push_str("</ul>");
    }

    // Summary and fits.
    h.push_str("<h2 id=\"summary\">Summary</h2>");
    match std::fs::read_to_string(results.join(SUMMARY_FILE)) {
        Ok(text) => {
            let _ = write!(
                h,
                "<p>As <code>lab sweep</code> printed it at the end of its last invocation:</p><pre>{}</pre>",
                esc(text.trim_end())
            );
        }
        Err(_) => h.push_str("<p>No <code>summary.txt</code> (written by <code>lab sweep</code> since reports exist): run the sweep again, finished runs are skipped.</p>"),
    }
    if !fit_html.is_empty() {
        h.push_str("<h3>Every fit</h3>");
        h.push_str(&fit_html);
    }
    if runs.is_none() && mi_path.is_file() {
        for name in ["mi_summary", "mi"] {
            let path = results.join(format!("{name}.parquet"));
            if let Ok(t) = Table::read(&path)
                && name == "mi_summary"
            {
                let cols: Vec<(String, Vec<String>)> = t
                    .column_names()
                    .into_iter()
                    .map(|c| {
                        let v = cells(&t, &c);
                        (c, v)
                    })
                    .collect();
                let _ = write!(h, "<h3>{name}</h3>{}", html_table("mi", &cols));
            }
        }
    }

    // Runs, failed runs.
    h.push_str("<h2 id=\"runs\">Runs</h2>");
    if let Some(runs) = &runs {
        let settings = varying_settings(runs);
        let mut cols: Vec<(String, Vec<String>)> = vec![(
            "run_id".into(),
            cells(runs, "run_id")
                .into_iter()
                .map(|id| id.chars().take(10).collect())
                .collect(),
        )];
        cols.push(("status".into(), cells(runs, "status")));
        for c in settings.iter().map(String::as_str).chain(
            RUN_METRICS
                .iter()
                .copied()
                .filter(|c| runs.has(c) && cells(runs, c).iter().any(|v| v != "–")),
        ) {
            cols.push((c.to_string(), cells(runs, c)));
        }
        // Grouped: sorted by the settings that vary, in column order.
        let n = runs.rows();
        let mut order: Vec<usize> = (0..n).collect();
        let keys: Vec<&Vec<String>> = cols[2..2 + settings.len()].iter().map(|c| &c.1).collect();
        order.sort_by(|&a, &b| {
            for k in &keys {
                let (x, y) = (&k[a], &k[b]);
                let o = match (x.parse::<f64>(), y.parse::<f64>()) {
                    (Ok(p), Ok(q)) => p.total_cmp(&q),
                    _ => x.cmp(y),
                };
                if o.is_ne() {
                    return o;
                }
            }
            std::cmp::Ordering::Equal
        });
        for c in &mut cols {
            c.1 = order.iter().map(|&i| c.1[i].clone()).collect();
        }
        // A selection on validation keeps one run per group (R58): say how many of the plan's.
        let selection = crate::results::plan::read(results)
            .and_then(|p| p.select.map(|sel| (sel, p.run_ids.len())))
            .map(|(sel, all)| {
                format!(
                    " Selected on validation ({}, docs/analysis-rules.md R58): {n} of the plan's {all} runs; the others are in runs.parquet with <code>selected = false</code>, and the figure <code>selection</code> shows every run's validation metric.",
                    esc(&sel.describe())
                )
            })
            .unwrap_or_default();
        let _ = write!(
            h,
            "<p>{n} runs, grouped by the settings that differ ({}); click a column to sort.{selection}</p>{}",
            esc(&settings.join(", ")),
            html_table("runs", &cols)
        );
        let status = cells(runs, "status");
        let failed: Vec<usize> = (0..n).filter(|&i| status[i] != "done").collect();
        h.push_str("<h3 id=\"failed\">Failed runs</h3>");
        if failed.is_empty() {
            h.push_str("<p>None.</p>");
        } else {
            let ids = cells(runs, "run_id");
            let step = cells(runs, "fail_step");
            let why = cells(runs, "fail_reason");
            let pick = |v: &Vec<String>| failed.iter().map(|&i| v[i].clone()).collect::<Vec<_>>();
            h.push_str(&html_table(
                "failed",
                &[
                    ("run_id".into(), pick(&ids)),
                    ("step".into(), pick(&step)),
                    ("reason".into(), pick(&why)),
                ],
            ));
        }
    } else {
        h.push_str("<p>An MI sweep trains no runs.</p>");
    }

    h.push_str("<h2 id=\"provenance\">Provenance</h2>");
    h.push_str(&provenance_section(&inv, runs.as_ref()));
    let _ = write!(
        h,
        "<p class=\"foot\">Written by <code>lab report {}</code> (lab {}) from {}.</p><script>{SORT_SCRIPT}</script></body></html>\n",
        esc(sweep),
        env!("CARGO_PKG_VERSION"),
        esc(&results.display().to_string())
    );
    Ok((h, figures, missing))
}

/// The report's figures: each of `stems` (the sweep's figures, [`plot::SWEEP_FIGURES`]) inlined
/// from `fig_dir/<stem>.svg` with its caption, or listed as missing (with `plot_error` when the
/// drawing failed); then each of `optional` ([`plot::OPTIONAL_FIGURES`]) that is there, the others
/// left out without a word. Returns the HTML, the stems inlined and the missing ones.
fn figures_html(
    sweep: &str,
    fig_dir: &Path,
    stems: &[&str],
    optional: &[&str],
    plot_error: Option<&str>,
) -> (String, Vec<String>, Vec<String>) {
    let mut figures = Vec::new();
    let mut missing = Vec::new();
    let mut fig_html = String::new();
    let all = stems.iter().map(|s| (s, true));
    for (stem, required) in all.chain(optional.iter().map(|s| (s, false))) {
        let path = fig_dir.join(format!("{stem}.svg"));
        match std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| inline_svg(&t))
        {
            Some(svg) => {
                let _ = write!(
                    fig_html,
                    "<figure id=\"fig-{stem}\" class=\"lab-figure\">{svg}<figcaption><b>{stem}</b> — {}</figcaption></figure>",
                    esc(plot::figure_caption(sweep, stem))
                );
                figures.push(stem.to_string());
            }
            None if required => missing.push(format!(
                "{stem}: {}",
                plot_error.unwrap_or("not drawn (the sweep has no data for it)")
            )),
            None => {}
        }
    }
    (fig_html, figures, missing)
}

/// Render the report (see [`render`]) and write it to `out` atomically.
///
/// # Errors
/// As [`render`], and a file that cannot be written.
pub fn write_report(
    sweep: &str,
    results: &Path,
    out: &Path,
    sweeps_dir: &Path,
) -> Result<Written, ReportError> {
    let (html, figures, missing) = render(sweep, results, sweeps_dir)?;
    crate::results::write_file_atomic(out, html.as_bytes()).map_err(|source| ReportError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    Ok(Written {
        path: out.to_path_buf(),
        figures,
        missing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sweep's own figures are inlined or listed as missing; an optional one only when drawn.
    #[test]
    fn optional_figures_are_inlined_only_when_drawn() {
        let dir = std::env::temp_dir().join(format!("lab-report-figs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let svg =
            "<svg width=\"10\" height=\"10\" xmlns=\"http://www.w3.org/2000/svg\"><rect/></svg>";
        std::fs::write(dir.join("igsm-ops.svg"), svg).unwrap();
        let draw = || {
            figures_html(
                "igsm-ops",
                &dir,
                &["igsm-ops"],
                &["igsm-answer-curves"],
                None,
            )
        };
        let (html, figures, missing) = draw();
        assert_eq!(figures, ["igsm-ops"]);
        assert!(missing.is_empty(), "{missing:?}");
        assert!(html.contains("id=\"fig-igsm-ops\"") && !html.contains("fig-igsm-answer-curves"));
        std::fs::write(dir.join("igsm-answer-curves.svg"), svg).unwrap();
        let (html, figures, _) = draw();
        assert_eq!(figures, ["igsm-ops", "igsm-answer-curves"]);
        assert!(html.contains(&esc(plot::figure_caption("igsm-ops", "igsm-answer-curves"))));
        // A required figure that is not there is named, with the drawing's error.
        std::fs::remove_file(dir.join("igsm-ops.svg")).unwrap();
        let (_, figures, missing) = figures_html(
            "igsm-ops",
            &dir,
            &["igsm-ops"],
            &[],
            Some("no finished run"),
        );
        assert!(figures.is_empty());
        assert_eq!(missing, ["igsm-ops: no finished run"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn escaping_covers_the_five_html_characters() {
        assert_eq!(esc(r#"a<b>&"c"'"#), "a&lt;b&gt;&amp;&quot;c&quot;&#39;");
    }

    #[test]
    fn an_svg_gets_a_viewbox_from_its_size_and_loses_its_prolog() {
        let svg = "<?xml version=\"1.0\"?>\n<svg width=\"800\" height=\"600\" xmlns=\"http://www.w3.org/2000/svg\"><rect/></svg>";
        assert_eq!(
            inline_svg(svg).unwrap(),
            "<svg width=\"800\" height=\"600\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 800 600\"><rect/></svg>"
        );
        let with = "<svg viewBox=\"0 0 1 1\"><g/></svg>";
        assert_eq!(inline_svg(with).unwrap(), with);
        assert!(inline_svg("not an svg").is_none());
    }
}
