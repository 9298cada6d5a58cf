//! The core's parts import each other without a circle. From every `.rs` file under `src/`,
//! each `crate::…`, `super::…` and child-module path (outside comments and `#[cfg(test)]`
//! modules) is resolved to the file that defines it; items that `lib.rs` re-exports
//! (`crate::open`) resolve to the file they come from, so the crate root is never a hub.
//!
//! A part is a top-level module (`checkpoint`, `remap`, `write`, …) or, inside `format/`, one
//! format's module (`format::torch`, `format::safetensors`, …) or a shared file
//! (`format::zip`, `format::parts`). Files within one part may recurse into each other (a
//! torch file nested in a torch file is read by the same readers; remap's presets expand into
//! rules the engine runs); across parts the graph must have no cycle. A circle is reported
//! with the parts on it and one file edge for each step.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Module path (`["format", "torch", "zip"]`) of each file.
fn modules() -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src()).unwrap().with_extension("");
                let mut m: Vec<String> = rel
                    .iter()
                    .map(|c| c.to_string_lossy().into_owned())
                    .collect();
                if m.last().is_some_and(|l| l == "mod" || l == "lib") {
                    m.pop();
                }
                out.insert(m, p);
            }
        }
    }
    out
}

/// The code of a file without comments and without its `#[cfg(test)]` part.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path starting at `crate::` or `super::`, as its segments, with `{a, b}` groups of
/// `use` lines expanded one level.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let rest: String = bytes[i..bytes.len().min(i + 7)].iter().collect();
        let start_ok = i == 0 || !(bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_');
        if start_ok && (rest.starts_with("crate::") || rest.starts_with("super::")) {
            let mut j = i;
            let mut s = String::new();
            while j < bytes.len() && (bytes[j].is_alphanumeric() || "_:".contains(bytes[j])) {
                s.push(bytes[j]);
                j += 1;
            }
            let base: Vec<String> = s
                .split("::")
                .filter(|x| !x.is_empty())
                .map(String::from)
                .collect();
            if j < bytes.len() && bytes[j] == '{' {
                let end = bytes[j..].iter().position(|&c| c == '}').map(|k| j + k);
                let group: String = bytes[j + 1..end.unwrap_or(j + 1)].iter().collect();
                for item in group.split(',') {
                    let mut p = base.clone();
                    p.extend(
                        item.split("::")
                            .map(|x| x.split_whitespace().next().unwrap_or(""))
                            .filter(|x| !x.is_empty() && *x != "self")
                            .map(String::from),
                    );
                    out.push(p);
                }
            } else {
                out.push(base);
            }
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

/// Paths that start at a child module of the file's module (`zip::open_zip` in
/// `format/mod.rs`), as full module paths.
fn child_paths(
    code: &str,
    m: &[String],
    mods: &BTreeMap<Vec<String>, PathBuf>,
) -> Vec<Vec<String>> {
    let children: Vec<&String> = mods
        .keys()
        .filter(|k| k.len() == m.len() + 1 && k.starts_with(m))
        .map(|k| &k[m.len()])
        .collect();
    let mut out = Vec::new();
    for c in children {
        let pat = format!("{c}::");
        let mut from = 0;
        while let Some(at) = code[from..].find(&pat) {
            let i = from + at;
            let before = code[..i].chars().next_back();
            if !before.is_some_and(|b| b.is_alphanumeric() || b == '_' || b == ':') {
                let mut p = m.to_vec();
                p.push(c.clone());
                out.push(p);
            }
            from = i + pat.len();
        }
        // `mod c;` alone declares, it does not import; `use c::…` and `c::f()` are caught above.
    }
    out
}

/// The part a module belongs to: its top-level module, or inside `format`, the format.
fn part(m: &[String]) -> Vec<String> {
    let n = if m.first().is_some_and(|f| f == "format") {
        2
    } else {
        1
    };
    m[..m.len().min(n)].to_vec()
}

/// `lib.rs`'s re-exports: item name -> the module path it comes from.
fn reexports(mods: &BTreeMap<Vec<String>, PathBuf>) -> BTreeMap<String, Vec<String>> {
    let lib = std::fs::read_to_string(&mods[&Vec::<String>::new()]).unwrap();
    let mut out = BTreeMap::new();
    for p in paths(&lib.replace("pub use ", "pub use crate::")) {
        if p.len() >= 3 {
            out.insert(p[p.len() - 1].clone(), p[1..p.len() - 1].to_vec());
        }
    }
    out
}

#[test]
fn no_import_circle_among_the_core_files() {
    let mods = modules();
    let again = reexports(&mods);
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    let mut witness: BTreeMap<(Vec<String>, Vec<String>), String> = BTreeMap::new();
    for (m, file) in &mods {
        if m.is_empty() {
            continue; // lib.rs declares and re-exports; it is not a participant
        }
        let m = &m.clone();
        let text = code(file);
        for p in paths(&text).into_iter().chain(child_paths(&text, m, &mods)) {
            let mut segs = if p[0] == "crate" {
                p[1..].to_vec()
            } else if p[0] != "super" {
                p.clone()
            } else {
                // `super::` is the parent of the file's module.
                let mut base = m.clone();
                let mut k = 0;
                while p.get(k).is_some_and(|s| s == "super") {
                    base.pop();
                    k += 1;
                }
                base.extend(p[k..].iter().cloned());
                base
            };
            if segs.len() == 1 {
                if let Some(m) = again.get(&segs[0]) {
                    segs = m.clone();
                }
            }
            // The longest prefix that is a file.
            while !segs.is_empty() && !mods.contains_key(&segs) {
                segs.pop();
            }
            if !segs.is_empty() && part(&segs) != part(m) {
                let e = edges.entry(part(m)).or_default();
                e.insert(part(&segs));
                witness
                    .entry((part(m), part(&segs)))
                    .or_insert_with(|| format!("{} uses {}", m.join("::"), segs.join("::")));
            }
        }
    }
    // Depth-first search for a back edge.
    fn visit(
        n: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
        found: &mut Vec<String>,
        witness: &BTreeMap<(Vec<String>, Vec<String>), String>,
    ) {
        state.insert(n.clone(), 1);
        stack.push(n.clone());
        for d in edges.get(n).into_iter().flatten() {
            match state.get(d).copied().unwrap_or(0) {
                0 => visit(d, edges, state, stack, found, witness),
                1 => {
                    let at = stack.iter().position(|s| s == d).unwrap();
                    let ring: Vec<&Vec<String>> =
                        stack[at..].iter().chain(std::iter::once(d)).collect();
                    found.push(
                        ring.windows(2)
                            .map(|w| witness[&(w[0].clone(), w[1].clone())].clone())
                            .collect::<Vec<_>>()
                            .join("; "),
                    );
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.clone(), 2);
    }
    let mut state = BTreeMap::new();
    let mut found = Vec::new();
    let parts: BTreeSet<Vec<String>> = mods.keys().map(|m| part(m)).collect();
    for m in &parts {
        if state.get(m).copied().unwrap_or(0) == 0 {
            visit(m, &edges, &mut state, &mut Vec::new(), &mut found, &witness);
        }
    }
    assert!(
        found.is_empty(),
        "import circles among the core's files:\n{}",
        found.join("\n")
    );
    // The check sees the graph: the checkpoint is built from the readers' parts.
    let has = |a: &[&str], b: &[&str]| {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        edges.get(&v(a)).is_some_and(|e| e.contains(&v(b)))
    };
    assert!(has(&["checkpoint"], &["format", "parts"]));
    assert!(has(&["format"], &["format", "sharded"]));
}
