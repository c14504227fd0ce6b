//! No crate of the workspace has an import cycle between its modules, and
//! the `slotgate` crate has none of the house's forbidden arrows
//! ([`FORBIDDEN`]): the store names no Redis type, a receiver writes
//! nothing to Postgres, and the ground floor does no I/O by the back door.
//!
//! A cycle (`a` uses `b`, `b` uses `a`, perhaps through others) means
//! neither module can be read, changed or tested without the other, and
//! layers stop being layers: the one-way flow of DESIGN section 2 is held
//! here. Each top-level module of a crate (a file or folder under `src/`,
//! with the crate root as a node of its own) is a node; a path
//! `crate::m…` (or, in a top-level file, `super::x`) outside comments and
//! outside the `#[cfg(test)]` module is an edge. A name the crate root
//! defines or re-exports is an edge to the root, so a module that reaches
//! back up to `main.rs`/`lib.rs` for a helper counts too.
//!
//! The reading is textual, like a reviewer's: enough for `use` lines and
//! paths, which is how this code base names other modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = "(crate root)";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable src folder") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without comment lines and without its test module
/// (tests may reach anywhere in their own file's module).
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first path segment after each `prefix` (`crate::` → `config` in
/// `crate::config::Config`; every name of a `crate::{a, b::c}` group).
fn names_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| is_ident(c) || c == ':') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let first: String = item.trim().chars().take_while(|c| is_ident(*c)).collect();
                if !first.is_empty() && first != "self" {
                    names.insert(first);
                }
            }
        } else {
            let first: String = rest.chars().take_while(|c| is_ident(*c)).collect();
            if !first.is_empty() {
                names.insert(first);
            }
        }
    }
    names
}

/// The module graph of the crate whose sources are in `src`: node → the
/// nodes it uses. `bin/` targets are crates of their own and left out.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let node_of = |path: &Path| -> Option<String> {
        let rel = path.strip_prefix(src).expect("under src");
        let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
        if first == "bin" {
            return None;
        }
        let name = first.trim_end_matches(".rs").to_owned();
        Some(if name == "lib" || name == "main" {
            ROOT.to_owned()
        } else {
            name
        })
    };
    let nodes: BTreeSet<String> = files.iter().filter_map(|f| node_of(f)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(from) = node_of(file) else { continue };
        let text = code(&std::fs::read_to_string(file).expect("a readable source file"));
        let top_level = file.parent() == Some(src);
        let mut used = names_after(&text, "crate::");
        if top_level && from != ROOT {
            // `super::x` in `src/m.rs` is the crate root's `x`.
            used.extend(
                names_after(&text, "super::")
                    .into_iter()
                    .map(|_| ROOT.to_owned()),
            );
        }
        for name in used {
            let to = if nodes.contains(&name) {
                name
            } else {
                ROOT.to_owned()
            };
            if to != from {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
        if from == ROOT {
            // The root's own uses of its modules (`use figures::emit`,
            // `stack::Stack::new`), beside `mod m;` which is no use.
            for node in &nodes {
                if node != ROOT && !names_after(&text, &format!("{node}::")).is_empty() {
                    edges.entry(from.clone()).or_default().insert(node.clone());
                }
            }
        }
    }
    edges
}

/// One cycle of `edges`, as the path that closes it, if there is one.
fn a_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            let mut cycle = path[i..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        if let Some(c) = visit(node, edges, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn no_crate_has_an_import_cycle() {
    let root = workspace();
    let mut crates = 0;
    let mut cycles = Vec::new();
    for entry in std::fs::read_dir(&root).expect("the workspace") {
        let src = entry.expect("an entry").path().join("src");
        if !src.is_dir() || !src.parent().unwrap().join("Cargo.toml").is_file() {
            continue;
        }
        crates += 1;
        let edges = graph(&src);
        if let Some(cycle) = a_cycle(&edges) {
            cycles.push(format!("{}: {}", src.display(), cycle.join(" → ")));
        }
    }
    assert!(
        crates >= 8,
        "found only {crates} crates under {}",
        root.display()
    );
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

/// The arrows `slotgate`'s modules must not have, each with why: (from,
/// to, the rule). DESIGN section 2's Layers paragraph states them.
const FORBIDDEN: &[(&[&str], &[&str], &str)] = &[
    (
        &["store"],
        &["queue", "lease"],
        "the store names no Redis type: what the executor acknowledges or fences in Redis is built on the executor's side",
    ),
    (
        &["receiver"],
        &["store"],
        "a receiver talks to its CMS only: what it reads is written to Postgres by the worker's drafts step",
    ),
    (
        GROUND_FLOOR,
        DOES_IO,
        "the ground floor is pure: a module every layer may use must not reach a module doing I/O",
    ),
];

/// The modules every layer may use: pure values and rules.
const GROUND_FLOOR: &[&str] = &[
    "outcome",
    "clock",
    "secret",
    "terminal",
    "untrusted",
    "telemetry",
];

/// The modules doing I/O (Postgres, Redis, HTTP, files).
const DOES_IO: &[&str] = &[
    "store",
    "queue",
    "receiver",
    "lease",
    "worker",
    "executor",
    "reconcile",
    "retention",
    "report",
    "watch",
    "import",
    "operator",
    "plan",
    "config",
];

/// Every forbidden arrow of `edges`, one line each, saying which rule it
/// breaks.
fn forbidden_arrows(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut broken = Vec::new();
    for (froms, tos, why) in FORBIDDEN {
        for from in *froms {
            for to in edges.get(*from).into_iter().flatten() {
                if tos.contains(&to.as_str()) {
                    broken.push(format!("{from} → {to}: {why}"));
                }
            }
        }
    }
    broken
}

#[test]
fn slotgate_has_none_of_the_forbidden_arrows() {
    let edges = graph(&workspace().join("shared").join("src"));
    // The rules' modules were read (a module that uses none has no entry).
    for node in ["store", "queue", "receiver", "executor", "worker"] {
        assert!(edges.contains_key(node), "no module {node} read: {edges:?}");
    }
    let broken = forbidden_arrows(&edges);
    assert!(
        broken.is_empty(),
        "forbidden arrows between slotgate's modules:\n{}",
        broken.join("\n")
    );
}

/// Each rule of [`FORBIDDEN`] fails when its arrow is drawn, so the test
/// above cannot pass by checking nothing.
#[test]
fn each_forbidden_arrow_is_caught() {
    let edge =
        |from: &str, to: &str| BTreeMap::from([(from.to_owned(), BTreeSet::from([to.to_owned()]))]);
    for (from, to, rule) in [
        ("store", "queue", "store names no Redis type"),
        ("receiver", "store", "a receiver talks to its CMS only"),
        ("outcome", "store", "the ground floor is pure"),
        ("clock", "executor", "the ground floor is pure"),
        ("telemetry", "worker", "the ground floor is pure"),
    ] {
        let broken = forbidden_arrows(&edge(from, to));
        assert_eq!(broken.len(), 1, "{from} → {to}: {broken:?}");
        assert!(
            broken[0].starts_with(&format!("{from} → {to}: ")) && broken[0].contains(rule),
            "{}",
            broken[0]
        );
    }
    // Arrows the rules allow.
    for (from, to) in [
        ("queue", "store"),
        ("executor", "store"),
        ("store", "outcome"),
    ] {
        assert_eq!(forbidden_arrows(&edge(from, to)), Vec::<String>::new());
    }
}

/// The reader finds a cycle where there is one, so the test above cannot
/// pass by reading nothing.
#[test]
fn the_reader_sees_a_cycle_it_is_shown() {
    let dir = std::env::temp_dir().join(format!("layers-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("b")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\npub use a::A;\n").unwrap();
    std::fs::write(
        src.join("a.rs"),
        "// crate::c in a comment is no use\nuse crate::b::B;\npub struct A;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("b/mod.rs"),
        "use crate::{a::A, self};\npub struct B;\n",
    )
    .unwrap();
    let edges = graph(&src);
    let cycle = a_cycle(&edges).expect("a ↔ b is a cycle");
    assert_eq!(cycle.first(), cycle.last());
    assert!(cycle.contains(&"a".to_owned()) && cycle.contains(&"b".to_owned()));
    assert_eq!(edges["a"], BTreeSet::from(["b".to_owned()]));

    std::fs::write(src.join("b/mod.rs"), "pub struct B;\n").unwrap();
    assert_eq!(a_cycle(&graph(&src)), None, "{:?}", graph(&src));
    // A module that reaches back to the root for a name the root uses
    // from it is a cycle too.
    std::fs::write(src.join("b/mod.rs"), "use crate::A;\npub struct B;\n").unwrap();
    let cycle = a_cycle(&graph(&src)).expect("b → root → a → b");
    assert!(cycle.contains(&ROOT.to_owned()), "{cycle:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
