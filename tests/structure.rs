//! The shape of the source, checked: the modules form layers (no import cycle), so that a
//! reader can start at the bottom (`lock`, `store`) and climb to `cli` without meeting a
//! module that needs one above it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// A file's code without its comments and without its unit tests (a test may look at any
/// layer; the code it tests may not).
fn code_of(text: &str) -> String {
    let before_tests = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    before_tests
        .lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The crate's top-level module a file belongs to (`src/labs/naive.rs` → `labs`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.trim_end_matches(".rs");
    (name != "lib" && name != "main").then(|| name.to_string())
}

/// Every `crate::name` a piece of code mentions, with `use crate::{a, b::c}` groups opened.
fn mentions(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The names at the group's top level: `{output::{Style, human}, procs}` → output, procs.
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_ascii_alphanumeric() || c == '_') => {
                        item_start = false;
                        let name: String = group[i..]
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        found.insert(name);
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // Exported macros live at the crate root but belong to the module that defines them.
    let mut macro_home = BTreeMap::new();
    let mut code = Vec::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let text = code_of(&fs::read_to_string(file).unwrap());
        for line in text.lines() {
            if let Some(after) = line.trim().strip_prefix("macro_rules! ") {
                let name = after.trim_end_matches(['{', ' ']).to_string();
                macro_home.insert(name, module.clone());
            }
        }
        code.push((module, text));
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, text) in code {
        let needs = graph.entry(module.clone()).or_default();
        for name in mentions(&text) {
            let home = macro_home.get(&name).cloned().unwrap_or(name);
            if home != module {
                needs.insert(home);
            }
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for needs in graph.values_mut() {
        needs.retain(|name| modules.contains(name));
    }
    graph
}

/// A path of modules that leads from `from` back to itself, if there is one.
fn cycle_through(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    let mut stack = vec![vec![from.to_string()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last().unwrap();
        for next in graph.get(last).into_iter().flatten() {
            if next == from {
                let mut cycle = path.clone();
                cycle.push(next.clone());
                return Some(cycle);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push(longer);
            }
        }
    }
    None
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = module_graph();
    assert!(
        graph.contains_key("labs") && graph.contains_key("cli"),
        "{graph:?}"
    );
    assert!(graph["cli"].contains("labs"), "the scan sees imports");
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|module| cycle_through(&graph, module))
        .map(|cycle| cycle.join(" → "))
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_scan_finds_a_cycle_when_there_is_one() {
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    graph.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    graph.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(
        cycle_through(&graph, "a"),
        Some(vec!["a".into(), "b".into(), "a".into()])
    );
    assert_eq!(cycle_through(&graph, "c"), None);
    assert_eq!(
        mentions("use crate::{output::{Style, human}, procs};\ncrate::outln!();"),
        BTreeSet::from(["output".into(), "procs".into(), "outln".into()])
    );
}
