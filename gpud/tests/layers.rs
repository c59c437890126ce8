//! gpud's modules form layers: the floors are listed in the crate docs
//! (`src/lib.rs`, "Layers"), bottom to top, and a module may use only
//! modules on floors below its own. This test reads the sources and fails
//! naming the edge (file and line) that breaks the rule, and any cycle.
//!
//! The rule, as checked:
//! - a node is a top-level module of the crate (the `mod` lines of
//!   `lib.rs`); a module and its submodules are one node (`backend`,
//!   `backend::cpu` and `backend::cuda::driver` are all `backend`);
//! - an edge is a path in code, `crate::x` (or `super::x` from a top-level
//!   module, the same thing), from a file of one node to another;
//! - comments do not count, nor items under `#[cfg(test)]` (unit tests may
//!   use the test kit above them, as integration tests do);
//! - `lib.rs` itself is the root: it may use anything.
//!
//! Inside a directory module its files form layers too: a file may reach a
//! sibling (`super::sibling`) only if that sibling does not reach it back,
//! directly or not. And `backend/cuda/driver.rs` is the only file that
//! calls the raw driver API (`sys::cu*`), and uses nothing else of gpud.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");

/// One source file: where it is, and its code without comments and
/// `#[cfg(test)]` items, line numbers kept.
struct File {
    rel: String,
    code: String,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `s` with comments blanked (newlines kept), string and char literals
/// left alone.
fn strip_comments(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if b[i] == b'"' {
            // A string literal, copied whole (it may hold `//`).
            let start = i;
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str(&s[start..i.min(b.len())]);
        } else {
            let c = s[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// `code` with every item that follows `#[cfg(test)]` blanked (newlines
/// kept): up to its `;`, or its braces' end.
fn strip_cfg_test(code: &str) -> String {
    const ATTR: &str = "#[cfg(test)]";
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find(ATTR) {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let mut depth = 0usize;
        let mut end = item.len();
        for (i, c) in item.char_indices().skip(ATTR.len()) {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        out.extend(item[..end].chars().filter(|&c| c == '\n'));
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// Files declared `#[cfg(test)] mod x;`: test code, left out whole.
fn test_only_files(files: &[(String, String)]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (rel, text) in files {
        let dir = match rel.rsplit_once('/') {
            Some((d, "mod.rs")) => format!("{d}/"),
            Some((d, f)) => format!("{d}/{}/", f.trim_end_matches(".rs")),
            None if rel == "lib.rs" => String::new(),
            None => format!("{}/", rel.trim_end_matches(".rs")),
        };
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for w in lines.windows(2) {
            if w[0] == "#[cfg(test)]" {
                if let Some(name) = w[1].strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) {
                    out.insert(format!("{dir}{name}.rs"));
                    out.insert(format!("{dir}{name}/mod.rs"));
                }
            }
        }
    }
    out
}

fn sources() -> Vec<File> {
    let mut paths = Vec::new();
    rust_files(Path::new(SRC), &mut paths);
    let raw: Vec<(String, String)> = paths
        .iter()
        .map(|p| {
            let rel = p.strip_prefix(SRC).unwrap().to_string_lossy().replace('\\', "/");
            (rel, std::fs::read_to_string(p).unwrap())
        })
        .collect();
    let tests = test_only_files(&raw);
    raw.into_iter()
        .filter(|(rel, _)| !tests.contains(rel))
        // The binaries sit on top of the library, outside its layers.
        .filter(|(rel, _)| rel != "main.rs" && !rel.starts_with("bin/"))
        .map(|(rel, text)| File { code: strip_cfg_test(&strip_comments(&text)), rel })
        .collect()
}

/// The names a path names right after `prefix` (`crate::`, `super::`),
/// with the line of each: `crate::a::X` gives `a`, `crate::{a, b::X}`
/// gives `a` and `b`.
fn names_after(code: &str, prefix: &str) -> Vec<(String, usize)> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut out = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        // `$crate::` and `gpud_crate::` are not this crate's paths.
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$' || c == ':') {
            continue;
        }
        let line = code[..at].matches('\n').count() + 1;
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => start = true,
                    c if c.is_whitespace() => {}
                    _ => {
                        if start && depth == 1 {
                            out.push((ident(&group[i..]), line));
                        }
                        start = false;
                    }
                }
            }
        } else {
            out.push((ident(rest), line));
        }
    }
    out
}

/// The top-level modules `lib.rs` declares.
fn top_modules() -> BTreeSet<String> {
    let lib = strip_comments(&std::fs::read_to_string(format!("{SRC}/lib.rs")).unwrap());
    lib.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            l.strip_prefix("mod ")?.strip_suffix(';').map(str::to_string)
        })
        .collect()
}

/// The floors of the crate docs: `//! N. [`a`], [`b`]: ...`, bottom first.
fn floors() -> BTreeMap<String, usize> {
    let lib = std::fs::read_to_string(format!("{SRC}/lib.rs")).unwrap();
    let mut out = BTreeMap::new();
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else { continue };
        let doc = doc.trim();
        let Some((n, rest)) = doc.split_once(". ") else { continue };
        let Ok(n) = n.parse::<usize>() else { continue };
        let names = rest.split(':').next().unwrap();
        for link in names.split("[`").skip(1) {
            let name = link.split('`').next().unwrap().to_string();
            assert!(out.insert(name.clone(), n).is_none(), "{name} is on two floors of lib.rs's Layers");
        }
    }
    out
}

/// The top-level module a file belongs to (None for lib.rs).
fn node_of(rel: &str) -> Option<String> {
    if rel == "lib.rs" {
        return None;
    }
    Some(rel.split('/').next().unwrap().trim_end_matches(".rs").to_string())
}

/// Edges `from -> to` of `graph` with a cycle through them, as
/// `a -> b -> a`, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn dfs(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in graph.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let i = stack.iter().position(|s| s == m).unwrap();
                    let mut cycle = stack[i..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = dfs(m, graph, state, stack) {
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
    for n in graph.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = dfs(n, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn modules_form_the_layers_lib_rs_lists() {
    let tops = top_modules();
    let floors = floors();
    let listed: BTreeSet<String> = floors.keys().cloned().collect();
    assert_eq!(listed, tops, "lib.rs's Layers must list every top-level module once (left: listed, right: declared)");

    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut witness: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut wrong = Vec::new();
    for f in sources() {
        let Some(from) = node_of(&f.rel) else { continue };
        let mut refs = names_after(&f.code, "crate::");
        if !f.rel.contains('/') || f.rel.matches('/').count() == 1 && f.rel.ends_with("/mod.rs") {
            // A top-level module's `super` is the crate.
            refs.extend(names_after(&f.code, "super::"));
        }
        for (to, line) in refs {
            if to == from || !tops.contains(&to) {
                continue;
            }
            graph.entry(from.clone()).or_default().insert(to.clone());
            witness.entry((from.clone(), to.clone())).or_insert_with(|| format!("src/{}:{line}", f.rel));
            if floors[&to] >= floors[&from] {
                wrong.push(format!(
                    "{from} (floor {}) uses {to} (floor {}) at src/{}:{line}",
                    floors[&from], floors[&to], f.rel
                ));
            }
        }
    }
    if let Some(cycle) = find_cycle(&graph) {
        let steps: Vec<String> = cycle
            .windows(2)
            .map(|w| format!("{} -> {} ({})", w[0], w[1], witness[&(w[0].clone(), w[1].clone())]))
            .collect();
        panic!("gpud's modules form a cycle:\n  {}", steps.join("\n  "));
    }
    assert!(wrong.is_empty(), "uses that go up or sideways in lib.rs's Layers:\n  {}", wrong.join("\n  "));
}

#[test]
fn files_of_a_directory_module_form_layers() {
    let files = sources();
    let mut dirs: BTreeMap<String, BTreeMap<String, BTreeSet<(String, String)>>> = BTreeMap::new();
    for f in &files {
        let Some((dir, name)) = f.rel.rsplit_once('/') else { continue };
        let name = name.trim_end_matches(".rs");
        if name == "mod" {
            continue;
        }
        dirs.entry(dir.to_string()).or_default().entry(name.to_string()).or_default();
    }
    for f in &files {
        let Some((dir, name)) = f.rel.rsplit_once('/') else { continue };
        let name = name.trim_end_matches(".rs");
        let Some(siblings) = dirs.get_mut(dir) else { continue };
        if name == "mod" {
            continue;
        }
        let mod_path = format!("crate::{}::", dir.replace('/', "::"));
        let mut refs = names_after(&f.code, "super::");
        refs.extend(names_after(&f.code, &mod_path));
        for (to, line) in refs {
            if to != name && siblings.contains_key(&to) {
                siblings.get_mut(name).unwrap().insert((to, format!("src/{}:{line}", f.rel)));
            }
        }
    }
    for (dir, siblings) in &dirs {
        let graph: BTreeMap<String, BTreeSet<String>> = siblings
            .iter()
            .map(|(n, tos)| (n.clone(), tos.iter().map(|(t, _)| t.clone()).collect()))
            .collect();
        if let Some(cycle) = find_cycle(&graph) {
            let steps: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    let at = siblings[&w[0]].iter().find(|(t, _)| *t == w[1]).unwrap();
                    format!("{} -> {} ({})", w[0], w[1], at.1)
                })
                .collect();
            panic!("the files of src/{dir} form a cycle:\n  {}", steps.join("\n  "));
        }
    }
}

#[test]
fn only_the_driver_layer_calls_the_driver() {
    let files = sources();
    let driver = files.iter().find(|f| f.rel == "backend/cuda/driver.rs").expect("backend/cuda/driver.rs");
    let uses: Vec<_> = names_after(&driver.code, "crate::")
        .into_iter()
        .chain(names_after(&driver.code, "super::"))
        .collect();
    assert!(uses.is_empty(), "the driver layer uses the rest of gpud: {uses:?}");
    for f in files.iter().filter(|f| f.rel != driver.rel) {
        for (n, line) in f.code.lines().enumerate() {
            assert!(
                !line.contains("sys::cu"),
                "src/{}:{}: a raw driver call outside backend/cuda/driver.rs: {}",
                f.rel,
                n + 1,
                line.trim()
            );
        }
    }
}
