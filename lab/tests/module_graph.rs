//! The imports between the library's top-level modules form no cycle (DESIGN.md: data flows one
//! way, tasks → model → train → probe → results → analysis → plot, sweep and CLI on top), and
//! `main.rs` stays a thin CLI.
//!
//! Unit-test modules are left out (a test may use any module). `make module-graph` prints the
//! graph (`cargo test --release --test module_graph -- --nocapture`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Code of `text` without `//` comments (doc comments and doc links included) and without its
/// unit-test module (from a `#[cfg(test)]` line followed by `mod …`): tests may reach anything.
fn strip_comments(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            lines[i].trim() == "#[cfg(test)]"
                && lines
                    .get(i + 1)
                    .is_some_and(|l| l.trim_start().starts_with("mod "))
        })
        .unwrap_or(lines.len());
    lines[..end]
        .iter()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Top-level modules named after `crate::` in `code`, including `crate::{a, b::c}` groups.
fn imports(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: split at commas outside nested braces.
            let mut depth = 0;
            let mut start = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.insert(ident_at(group[start..].trim_start()).to_string());
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident_at(group[start..].trim_start()).to_string());
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident_at(rest).to_string());
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

/// Edges module → modules it imports, for the library's top-level modules.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = src();
    let mut files = Vec::new();
    rs_files(&root, &mut files);
    let lib = std::fs::read_to_string(root.join("lib.rs")).unwrap();
    let modules: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for f in files {
        let rel = f.strip_prefix(&root).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if !modules.contains(&module) {
            continue; // lib.rs, main.rs and the binary's own modules
        }
        let code = strip_comments(&std::fs::read_to_string(&f).unwrap());
        for m in imports(&code) {
            if m != module && modules.contains(&m) {
                g.get_mut(&module).unwrap().insert(m);
            }
        }
    }
    g
}

/// A cycle of `g` if there is one (depth-first search).
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in &g[n] {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap();
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, g, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(n, g, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn the_parser_sees_plain_grouped_and_nested_imports() {
    let code = strip_comments(
        "use crate::model::Encoding;\n\
         use crate::{config::{RunConfig, X}, probe, results::tables};\n\
         // use crate::plot;\n\
         let x = crate::kernels::is_flex(d); /// [`crate::sweep`]\n",
    );
    let got: Vec<String> = imports(&code).into_iter().collect();
    assert_eq!(got, ["config", "kernels", "model", "probe", "results"]);
    let cyclic: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(find_cycle(&cyclic).unwrap(), ["a", "b", "c", "a"]);
}

#[test]
fn top_level_modules_import_each_other_without_cycles() {
    let g = graph();
    for (m, deps) in &g {
        let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
        println!("{m} -> {}", deps.join(", "));
    }
    assert!(g.len() >= 10, "lib.rs lists its modules as `pub mod x;`");
    if let Some(c) = find_cycle(&g) {
        panic!("import cycle between top-level modules: {}", c.join(" -> "));
    }
}

#[test]
fn main_rs_is_a_thin_cli() {
    let n = std::fs::read_to_string(src().join("main.rs"))
        .unwrap()
        .lines()
        .count();
    println!("lab/src/main.rs: {n} lines");
    assert!(
        n < 300,
        "lab/src/main.rs has {n} lines; logic belongs in the library"
    );
}
