//! No module of any workspace crate depends, through another, on itself: within each crate
//! the top-level modules (`src/x.rs` or `src/x/`) and their `crate::` references form an
//! acyclic graph, so each crate reads from its leaves up. References in comments (intra-doc
//! links) and in `#[cfg(test)]` code do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The workspace's member crate folders, from the root `Cargo.toml`.
fn members(root: &Path) -> Vec<PathBuf> {
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("workspace Cargo.toml");
    let table: toml::Table = manifest.parse().expect("workspace Cargo.toml parses");
    table["workspace"]["members"]
        .as_array()
        .expect("workspace members")
        .iter()
        .map(|m| root.join(m.as_str().expect("member path")))
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("readable source folder") {
        let path = entry.expect("folder entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a source file that counts: before its first `#[cfg(test)]`, without comments.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The names `crate::NAME` (and `crate::{A, B::…}`) refers to in `code`.
fn crate_refs(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut refs = BTreeSet::new();
    for (i, m) in code.match_indices("crate::") {
        // `dmem_crate::` or `$crate::` are not this crate's paths.
        if code[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$')
        {
            continue;
        }
        let rest = &code[i + m.len()..];
        let Some(group) = rest.strip_prefix('{') else {
            refs.insert(ident(rest));
            continue;
        };
        // The first name of each item of the group, at the group's own depth.
        let (mut depth, mut start) = (0usize, 0usize);
        for (j, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    refs.insert(ident(&group[start..j]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    refs.insert(ident(&group[start..j]));
                    start = j + 1;
                }
                _ => {}
            }
        }
    }
    refs.remove("");
    refs
}

/// The module graph of one crate: top-level module → the top-level modules it refers to.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let module_of = |path: &Path| -> Option<String> {
        let rel = path.strip_prefix(src).ok()?;
        let first = rel.components().next()?.as_os_str().to_str()?;
        let name = first.strip_suffix(".rs").unwrap_or(first);
        (!matches!(name, "lib" | "main")).then(|| name.to_owned())
    };
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(module) = module_of(file) else {
            continue;
        };
        let text = fs::read_to_string(file).expect("readable source file");
        let refs = crate_refs(&code(&text));
        let edges = graph.entry(module.clone()).or_default();
        edges.extend(
            refs.into_iter()
                .filter(|r| *r != module && modules.contains(r)),
        );
    }
    graph
}

/// A cycle of `graph`, if it has one, as the modules along it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_owned(), 1);
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let start = path.iter().position(|p| p == next).unwrap_or(0);
                    let mut cycle = path[start..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(cycle) = visit(next, graph, state, path) {
                        return Some(cycle);
                    }
                }
            }
        }
        path.pop();
        state.insert(node.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node.as_str())
            && let Some(cycle) = visit(node, graph, &mut state, &mut Vec::new())
        {
            return Some(cycle);
        }
    }
    None
}

#[test]
fn no_crate_has_a_module_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let crates = members(&root);
    assert!(crates.len() > 10, "found the workspace's crates");
    let mut cycles = Vec::new();
    for krate in crates {
        let src = krate.join("src");
        if !src.is_dir() {
            continue;
        }
        if let Some(cycle) = find_cycle(&module_graph(&src)) {
            cycles.push(format!("{}: {}", krate.display(), cycle.join(" -> ")));
        }
    }
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_cycle_finder_finds_a_planted_cycle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    let cycle = find_cycle(&graph).expect("a -> b -> c -> a");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4);
    let mut acyclic = graph;
    acyclic.get_mut("c").expect("c").clear();
    assert_eq!(find_cycle(&acyclic), None);
}

#[test]
fn comments_tests_and_other_crates_paths_do_not_count() {
    let text = "use crate::a::X;\n/// see [`crate::b`]\nuse dmem_crate::c;\n$crate::d\n\
                use crate::{f::{G, H}, i, j::K};\n#[cfg(test)]\nuse crate::e;";
    let refs = crate_refs(&code(text));
    let expected = ["a", "f", "i", "j"].map(str::to_owned);
    assert_eq!(refs, BTreeSet::from(expected));
}
