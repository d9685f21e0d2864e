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

// ───────────────────────── Sibling files ─────────────────────────
//
// The check above sees the crate's top level only. Inside a folder the same rule holds:
// the files (and sub-folders) beside each other form layers, so a reader can open one and
// read it without the one that needs it. `a` uses `b` and `b` uses `a` — through
// `use super::b`, `crate::path::b`, `self::`, or a path in code like `super::b::f()` — is
// a cycle, and the test names it by its files.

/// One token of Rust source, as much of one as the scan needs.
#[derive(Clone, Debug, PartialEq)]
enum Token {
    Name(String),
    /// `::`
    Colons,
    Open,
    Close,
    Semicolon,
    Comma,
    Star,
    Other(char),
}

/// The tokens of a file with their line numbers (from 1); comments, strings and characters
/// are dropped, so that a path written in prose or in a message is not mistaken for code.
fn tokens(text: &str) -> Vec<(Token, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(chars[i] == '\n');
                    i += 1;
                }
            }
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                line += usize::from(at(i) == '\n');
                i += 1;
            }
            i += 1;
        } else if c == '\'' {
            // A character ('x', '\n') or a lifetime ('a, 'static: its name is kept).
            if at(i + 1) == '\\' {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while at(i).is_ascii_alphanumeric() || at(i) == '_' {
                i += 1;
            }
            let name: String = chars[start..i].iter().collect();
            let raw_string = (name == "r" || name == "br") && matches!(at(i), '"' | '#');
            if raw_string {
                let mut hashes = 0;
                while at(i) == '#' {
                    hashes += 1;
                    i += 1;
                }
                i += 1;
                loop {
                    if i >= chars.len() {
                        break;
                    }
                    if chars[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#') {
                        i += 1 + hashes;
                        break;
                    }
                    line += usize::from(chars[i] == '\n');
                    i += 1;
                }
            } else {
                out.push((Token::Name(name), line));
            }
        } else if c.is_ascii_digit() {
            while at(i).is_ascii_alphanumeric() || at(i) == '_' {
                i += 1;
            }
            out.push((Token::Other('0'), line));
        } else {
            let token = match c {
                ':' if at(i + 1) == ':' => {
                    i += 1;
                    Token::Colons
                }
                '{' => Token::Open,
                '}' => Token::Close,
                ';' => Token::Semicolon,
                ',' => Token::Comma,
                '*' => Token::Star,
                other => Token::Other(other),
            };
            out.push((token, line));
            i += 1;
        }
    }
    out
}

/// The tokens without the items marked `#[cfg(test)]` (a test may look at any file; the
/// code it tests may not).
fn without_tests(tokens: Vec<(Token, usize)>) -> Vec<(Token, usize)> {
    let name = |t: &Token, n: &str| matches!(t, Token::Name(s) if s == n);
    let mut kept = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let cfg_test = tokens.len() > i + 6
            && tokens[i].0 == Token::Other('#')
            && tokens[i + 1].0 == Token::Other('[')
            && name(&tokens[i + 2].0, "cfg")
            && tokens[i + 3].0 == Token::Other('(')
            && name(&tokens[i + 4].0, "test")
            && tokens[i + 5].0 == Token::Other(')')
            && tokens[i + 6].0 == Token::Other(']');
        if !cfg_test {
            kept.push(tokens[i].clone());
            i += 1;
            continue;
        }
        // Skip the item: up to its `;`, or to the brace that closes its block.
        i += 7;
        let mut depth = 0;
        while i < tokens.len() {
            match tokens[i].0 {
                Token::Semicolon if depth == 0 => break,
                Token::Open => depth += 1,
                Token::Close => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        i += 1;
    }
    kept
}

/// A path a piece of code names, where it names it, and the module it is named from (an
/// inline `mod x { … }` is a module of its own for `super::` and `self::`).
#[derive(Debug)]
struct Named {
    from: Vec<String>,
    path: Vec<String>,
    line: usize,
}

/// What a file names: the paths in its code, and what each `use` binds (name → path).
#[derive(Default, Debug)]
struct Names {
    paths: Vec<Named>,
    uses: Vec<(Vec<String>, String, Vec<String>)>,
    inline_modules: Vec<Vec<String>>,
}

/// Reads one `use` tree at `i` (after the `use`), with the path above it in `prefix`, into
/// `(path, bound name)` pairs: `use super::{a, b::c as d}` → (super::a, a), (super::b::c, d).
fn use_tree(
    tokens: &[(Token, usize)],
    i: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, String)>,
) {
    let mut path = prefix;
    loop {
        match tokens.get(*i).map(|t| &t.0) {
            Some(Token::Name(name)) => {
                path.push(name.clone());
                *i += 1;
                if tokens.get(*i).map(|t| &t.0) == Some(&Token::Colons) {
                    *i += 1;
                    continue;
                }
                let mut bound = name.clone();
                if matches!(tokens.get(*i).map(|t| &t.0), Some(Token::Name(n)) if n == "as") {
                    if let Some((Token::Name(alias), _)) = tokens.get(*i + 1) {
                        bound = alias.clone();
                    }
                    *i += 2;
                }
                if bound == "self" {
                    path.pop();
                    bound = path.last().cloned().unwrap_or_default();
                }
                out.push((path, bound));
                return;
            }
            Some(Token::Open) => {
                *i += 1;
                loop {
                    match tokens.get(*i).map(|t| &t.0) {
                        Some(Token::Close) | None => {
                            *i += 1;
                            return;
                        }
                        Some(Token::Comma) => *i += 1,
                        _ => use_tree(tokens, i, path.clone(), out),
                    }
                }
            }
            Some(Token::Star) => {
                *i += 1;
                out.push((path, "*".into()));
                return;
            }
            Some(Token::Colons) => *i += 1,
            _ => return,
        }
    }
}

/// The paths a file's code names, read from its tokens; `module` is the file's own module.
fn names_in(tokens: &[(Token, usize)], module: &[String]) -> Names {
    let mut names = Names::default();
    let mut inline: Vec<(usize, String)> = Vec::new();
    let mut depth = 0;
    let here = |inline: &Vec<(usize, String)>| {
        let mut here = module.to_vec();
        here.extend(inline.iter().map(|(_, name)| name.clone()));
        here
    };
    let mut i = 0;
    while i < tokens.len() {
        let (token, line) = &tokens[i];
        match token {
            Token::Open => depth += 1,
            Token::Close => {
                depth -= 1;
                if inline.last().is_some_and(|(at, _)| *at == depth) {
                    inline.pop();
                }
            }
            Token::Name(word) if word == "mod" => {
                if let (Some((Token::Name(name), _)), Some((Token::Open, _))) =
                    (tokens.get(i + 1), tokens.get(i + 2))
                {
                    inline.push((depth, name.clone()));
                    names.inline_modules.push(here(&inline));
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            Token::Name(word) if word == "use" => {
                let mut trees = Vec::new();
                i += 1;
                use_tree(tokens, &mut i, Vec::new(), &mut trees);
                for (path, bound) in trees {
                    names.paths.push(Named {
                        from: here(&inline),
                        path: path.clone(),
                        line: *line,
                    });
                    names.uses.push((here(&inline), bound, path));
                }
                continue;
            }
            Token::Name(first) if i == 0 || tokens[i - 1].0 != Token::Colons => {
                let mut path = vec![first.clone()];
                let mut next = i + 1;
                while let (Some((Token::Colons, _)), Some((Token::Name(name), _))) =
                    (tokens.get(next), tokens.get(next + 1))
                {
                    path.push(name.clone());
                    next += 2;
                }
                if path.len() > 1 {
                    names.paths.push(Named {
                        from: here(&inline),
                        path,
                        line: *line,
                    });
                    i = next;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    names
}

/// The crate's module a file is (`src/labs/network/scene.rs` → labs::network::scene,
/// `src/labs/network/mod.rs` → labs::network, `src/lib.rs` → the root).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut path: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_str().unwrap().to_string())
        .collect();
    if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
        path.pop();
    }
    path
}

/// Where a path leads, as a path from the crate's root, if it leads into the crate:
/// `super::`, `self::`, `crate::`, a child module's name, or a name a `use` bound.
fn resolve(
    from: &[String],
    path: &[String],
    bound: &BTreeMap<(Vec<String>, String), Vec<String>>,
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let mut base = from.to_vec();
    let mut rest = path;
    match rest.first()?.as_str() {
        "crate" => {
            base.clear();
            rest = &rest[1..];
        }
        "self" => rest = &rest[1..],
        "super" => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        first => {
            let mut child = base.clone();
            child.push(first.to_string());
            if !modules.contains(&child) {
                let target = bound.get(&(from.to_vec(), first.to_string()))?;
                let mut whole = target.clone();
                whole.extend(rest[1..].iter().cloned());
                return Some(whole);
            }
        }
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// An import between two files of one folder, lifted to the folder's children: a file in
/// `network/` that names `labs::chaos::show` makes `labs/network` need `labs/chaos`.
#[derive(Debug)]
struct Need {
    /// The module whose children these are (labs::network).
    parent: Vec<String>,
    from: String,
    to: String,
    /// Where it is written: a file and a line.
    at: String,
}

fn sibling_needs(src: &Path) -> Vec<Need> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    files.retain(|file| {
        file.file_name()
            .is_some_and(|n| n != "main.rs" && n != "tests.rs")
    });
    let mut read = Vec::new();
    for file in &files {
        let module = module_path(src, file);
        let text = fs::read_to_string(file).unwrap();
        let names = names_in(&without_tests(tokens(&text)), &module);
        read.push((file.clone(), module, names));
    }
    // Every module, and the file module each one is written in.
    let mut file_of: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
    for (_, module, names) in &read {
        file_of.insert(module.clone(), module.clone());
        for inline in &names.inline_modules {
            file_of.insert(inline.clone(), module.clone());
        }
    }
    let modules: BTreeSet<Vec<String>> = file_of.keys().cloned().collect();
    let mut needs = Vec::new();
    for (file, module, names) in &read {
        // What each `use` of this file binds, resolved once (a use may name a child module).
        let mut bound = BTreeMap::new();
        for (from, name, path) in &names.uses {
            if let Some(target) = resolve(from, path, &BTreeMap::new(), &modules) {
                bound.insert((from.clone(), name.clone()), target);
            }
        }
        for named in &names.paths {
            let Some(target) = resolve(&named.from, &named.path, &bound, &modules) else {
                continue;
            };
            // The file the path leads into: its longest prefix that is a module.
            let Some(owner) = (0..=target.len())
                .rev()
                .find_map(|n| file_of.get(&target[..n]))
            else {
                continue;
            };
            let common = module.iter().zip(owner).take_while(|(a, b)| a == b).count();
            // A file may use its parent or its children: only siblings make a cycle.
            if common == module.len() || common == owner.len() {
                continue;
            }
            needs.push(Need {
                parent: module[..common].to_vec(),
                from: module[common].clone(),
                to: owner[common].clone(),
                at: format!(
                    "{}:{}",
                    file.strip_prefix(src.parent().unwrap()).unwrap().display(),
                    named.line
                ),
            });
        }
    }
    needs
}

/// The groups of siblings that need each other (each group one cycle or several tangled),
/// each as its members, in order.
fn tangles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(node) = todo.pop() {
            for next in edges.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        edges.keys().map(|node| (node, reach(node))).collect();
    let mut grouped = BTreeSet::new();
    let mut groups = Vec::new();
    for (node, reached) in &reaches {
        if grouped.contains(*node) || !reached.contains(*node) {
            continue;
        }
        let group: Vec<String> = reached
            .iter()
            .filter(|other| reaches.get(other).is_some_and(|back| back.contains(*node)))
            .cloned()
            .collect();
        grouped.extend(group.iter().cloned());
        groups.push(group);
    }
    groups
}

/// A sibling's name as a reader finds it: `src/labs/network/scene.rs`, or a folder.
fn shown(src: &Path, parent: &[String], child: &str) -> String {
    let mut dir = src.to_path_buf();
    dir.extend(parent);
    let file = dir.join(format!("{child}.rs"));
    let root = src.parent().unwrap();
    if file.exists() {
        file.strip_prefix(root).unwrap().display().to_string()
    } else {
        format!("{}/", dir.join(child).strip_prefix(root).unwrap().display())
    }
}

/// Every cycle between siblings below the crate's top level (the top level is the test
/// above's), with the module whose children they are, described by its files and the
/// lines that make it.
fn sibling_cycles(src: &Path) -> Vec<(Vec<String>, String)> {
    let mut by_parent: BTreeMap<Vec<String>, Vec<Need>> = BTreeMap::new();
    for need in sibling_needs(src) {
        if !need.parent.is_empty() {
            by_parent.entry(need.parent.clone()).or_default().push(need);
        }
    }
    let mut cycles = Vec::new();
    for (parent, needs) in by_parent {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for need in &needs {
            edges
                .entry(need.from.clone())
                .or_default()
                .insert(need.to.clone());
        }
        for group in tangles(&edges) {
            let mut lines = vec![
                group
                    .iter()
                    .map(|child| shown(src, &parent, child))
                    .collect::<Vec<_>>()
                    .join(" ⇄ "),
            ];
            for from in &group {
                for to in &edges[from] {
                    if group.contains(to) {
                        let at = needs.iter().find(|n| &n.from == from && &n.to == to);
                        lines.push(format!("    {from} → {to} ({})", at.unwrap().at));
                    }
                }
            }
            cycles.push((parent.clone(), lines.join("\n")));
        }
    }
    cycles
}

#[test]
fn no_file_imports_a_sibling_that_imports_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let needs = sibling_needs(&src);
    assert!(
        needs
            .iter()
            .any(|n| n.from == "cut_off" && n.to == "scene" && n.parent == ["labs", "network"]),
        "the scan sees imports between siblings"
    );
    let cycles: Vec<String> = sibling_cycles(&src)
        .into_iter()
        .map(|(_, cycle)| cycle)
        .collect();
    assert!(
        cycles.is_empty(),
        "{} import cycles between sibling files:\n{}",
        cycles.len(),
        cycles.join("\n")
    );
}

#[test]
fn the_sibling_scan_reads_every_way_a_file_names_another() {
    let module = vec!["labs".to_string(), "lab".to_string(), "a".to_string()];
    let text = "use super::{b::{self, Thing as Other}, c};\n\
                use crate::labs::lab::d::*;\n\
                // super::e::f() in a comment is prose\n\
                fn f() { let _ = \"super::e\"; super::super::lab::g::h(); self::i::j(); }\n\
                mod inner { fn k() { super::l::m(); } }\n\
                #[cfg(test)]\nmod tests { use super::super::n; }\n";
    let names = names_in(&without_tests(tokens(text)), &module);
    let paths: Vec<String> = names
        .paths
        .iter()
        .map(|named| format!("{}:{}", named.from.join("::"), named.path.join("::")))
        .collect();
    assert_eq!(
        paths,
        [
            "labs::lab::a:super::b",
            "labs::lab::a:super::b::Thing",
            "labs::lab::a:super::c",
            "labs::lab::a:crate::labs::lab::d",
            "labs::lab::a:super::super::lab::g::h",
            "labs::lab::a:self::i::j",
            "labs::lab::a::inner:super::l::m",
        ]
    );
    let modules = BTreeSet::from([module.clone(), [&module[..], &["i".to_string()]].concat()]);
    let at = |path: &str| path.split("::").map(String::from).collect::<Vec<_>>();
    assert_eq!(
        resolve(
            &module,
            &at("super::super::lab::g::h"),
            &BTreeMap::new(),
            &modules
        ),
        Some(at("labs::lab::g::h"))
    );
    assert_eq!(
        resolve(&module, &at("i::j"), &BTreeMap::new(), &modules),
        Some(at("labs::lab::a::i::j"))
    );
    let bound = BTreeMap::from([(
        (module.clone(), "Other".to_string()),
        at("labs::lab::b::Thing"),
    )]);
    assert_eq!(
        resolve(&module, &at("Other::new"), &bound, &modules),
        Some(at("labs::lab::b::Thing::new"))
    );
    assert_eq!(resolve(&module, &at("std::fs"), &bound, &modules), None);
    let edges = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        (
            "b".to_string(),
            BTreeSet::from(["a".to_string(), "c".to_string()]),
        ),
        ("c".to_string(), BTreeSet::new()),
    ]);
    assert_eq!(
        tangles(&edges),
        vec![vec!["a".to_string(), "b".to_string()]]
    );
}

// ───────────────────────── Long functions in the labs ─────────────────────────
//
// A lab is read by someone learning: a function over a screenful or two is split into
// named steps. Lines are counted as a reader sees them, from the line of `fn` to the line
// of its closing brace, blank lines and comments included; unit tests are not counted.

/// The longest a function in a lab may be.
const LONGEST_LAB_FUNCTION: usize = 100;

/// Every function of `text` with a body: its name, the line of its `fn` and its length.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let tokens = without_tests(tokens(text));
    let mut found = Vec::new();
    for (i, (token, line)) in tokens.iter().enumerate() {
        let (Token::Name(word), Some((Token::Name(name), _))) = (token, tokens.get(i + 1)) else {
            continue;
        };
        if word != "fn" {
            continue;
        }
        // The body opens at the first `{` after the signature; a `;` first: no body.
        let Some(open) = tokens[i..]
            .iter()
            .position(|(t, _)| matches!(t, Token::Open | Token::Semicolon))
            .map(|at| i + at)
            .filter(|&at| tokens[at].0 == Token::Open)
        else {
            continue;
        };
        let mut depth = 0;
        for (t, end) in &tokens[open..] {
            match t {
                Token::Open => depth += 1,
                Token::Close => {
                    depth -= 1;
                    if depth == 0 {
                        found.push((name.clone(), *line, end - line + 1));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    found
}

/// The functions under `src/<dir>` longer than `limit` lines, as `path:line name (N lines)`
/// keyed by `path::name`, longest first.
fn longer_than(dir: &str, limit: usize, skip: &[&str]) -> Vec<(String, usize, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join(dir), &mut files);
    let mut long = Vec::new();
    for file in files {
        let path = file.strip_prefix(root).unwrap().display().to_string();
        if skip.iter().any(|s| path.starts_with(s)) {
            continue;
        }
        for (name, line, length) in functions(&fs::read_to_string(&file).unwrap()) {
            if length > limit {
                long.push((format!("{path}::{name}"), length, format!("{path}:{line}")));
            }
        }
    }
    long.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    long
}

/// The labs' fault choreography still over the limit: the functions that start workers
/// and strike them by hand. They are being rewritten onto one fault player (issue 43, "one
/// nemesis, one player"); the lead empties this list as that work merges. A function only
/// leaves it: nothing is added.
const CHOREOGRAPHY_STILL_LONG: &[&str] = &[];

#[test]
fn no_function_in_a_lab_runs_past_a_hundred_lines() {
    let long = longer_than("src/labs", LONGEST_LAB_FUNCTION, &[]);
    let over: Vec<String> = long
        .iter()
        .filter(|(name, _, _)| !CHOREOGRAPHY_STILL_LONG.contains(&name.as_str()))
        .map(|(name, length, at)| format!("{name} ({length} lines, {at})"))
        .collect();
    // A name left on the list once its function is short (or gone) is said too, so that
    // the list only shrinks to what is true.
    let stale: Vec<&&str> = CHOREOGRAPHY_STILL_LONG
        .iter()
        .filter(|name| !long.iter().any(|(long, _, _)| long == **name))
        .collect();
    assert!(
        stale.is_empty(),
        "no longer over {LONGEST_LAB_FUNCTION} lines: take them off CHOREOGRAPHY_STILL_LONG: {stale:?}"
    );
    assert!(
        over.is_empty(),
        "{} functions over {LONGEST_LAB_FUNCTION} lines:\n{}",
        over.len(),
        over.join("\n")
    );
}

#[test]
fn a_function_is_measured_from_its_fn_to_its_closing_brace() {
    let text = "trait T { fn declared(&self); }\n\
                fn short() { let s = \"}\"; }\n\
                fn long(\n    a: u32,\n) -> u32\nwhere\n    u32: Copy,\n{\n    // {\n    a\n}\n\
                #[cfg(test)]\nmod tests { fn hidden() {\n}\n}\n";
    assert_eq!(
        functions(text),
        vec![("short".to_string(), 2, 1), ("long".to_string(), 3, 9)]
    );
}

/// The rows of the one table that registers the labs (`lab_table!` in `src/labs/mod.rs`):
/// `(Variant, module, Args)` for each `Variant => module::Args,` line.
fn lab_table(labs_mod: &str) -> Vec<(String, String, String)> {
    let call = labs_mod
        .split("\nlab_table! {\n")
        .nth(1)
        .expect("src/labs/mod.rs calls lab_table! { … } at its top level");
    let rows = call.split("\n}").next().unwrap();
    rows.lines()
        .map(|line| line.trim().trim_end_matches(','))
        .filter(|line| !line.is_empty())
        .map(|row| {
            let (variant, path) = row
                .split_once(" => ")
                .expect("a row is `Variant => module::Args,`");
            let (module, args) = path.split_once("::").expect("a row names module::Args");
            (variant.to_string(), module.to_string(), args.to_string())
        })
        .collect()
}

/// Whether `code` names `word` as a whole identifier.
fn names_identifier(code: &str, word: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(word).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// Where `code` reaches into the labs' module `module`: by the path `labs::module`, by
/// `super::module` when its file is a child of `labs` (`in_labs`), or inside a `labs::{…}`
/// group.
fn reaches_lab_module(code: &str, module: &str, in_labs: bool) -> bool {
    let by_path = names_identifier(code, &format!("labs::{module}"))
        || (in_labs && names_identifier(code, &format!("super::{module}")));
    let in_group = code.match_indices("labs::{").any(|(at, _)| {
        let group = &code[at + "labs::{".len()..];
        names_identifier(&group[..group.find('}').unwrap_or(group.len())], module)
    });
    by_path || in_group
}

/// The engine's promise: adding a lab is its folder plus one row of `lab_table!`. Every
/// folder of `src/labs` that is a lab (a `clap::Args` and a `pub fn run` in its `mod.rs`)
/// has exactly one row, and no other file of `src/` names the lab's module, its `Args` or
/// its variant: the subcommand, its dispatch, its shared options, `check`'s replay and the
/// menu row all come from that row and what the folder defines.
#[test]
fn a_lab_is_its_folder_and_one_row_of_the_lab_table() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let labs_dir = src.join("labs");
    let labs_mod = fs::read_to_string(labs_dir.join("mod.rs")).unwrap();
    let table = lab_table(&code_of(&labs_mod));

    let mut folders = BTreeSet::new();
    for entry in fs::read_dir(&labs_dir).unwrap() {
        let path = entry.unwrap().path();
        let Ok(text) = fs::read_to_string(path.join("mod.rs")) else {
            continue;
        };
        let code = code_of(&text);
        if code.contains("derive(clap::Args") && code.contains("pub fn run(") {
            folders.insert(path.file_name().unwrap().to_str().unwrap().to_string());
        }
    }
    assert!(folders.len() >= 10, "the scan found the labs: {folders:?}");
    let rows: Vec<&String> = table.iter().map(|(_, module, _)| module).collect();
    let registered: BTreeSet<String> = rows.iter().map(|m| m.to_string()).collect();
    assert_eq!(
        rows.len(),
        registered.len(),
        "a lab registered twice: {rows:?}"
    );
    assert_eq!(folders, registered, "lab folders vs rows of lab_table!");

    // Naming a lab elsewhere is what adding one used to cost: an edit in each such file.
    // One known exception: `lockslab proxy`, lab 8's hands-on tool, a command of its own.
    let allowed = [("cli.rs", "labs::network::by_hand")];
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut elsewhere = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let mut code = code_of(&fs::read_to_string(file).unwrap());
        for (path, exempt) in allowed {
            if relative == Path::new(path) {
                code = code.replace(exempt, "");
            }
        }
        // A file whose `super` is `labs`: `labs/step.rs` or `labs/stage/mod.rs`.
        let parts: Vec<_> = relative.iter().collect();
        let child_of_labs = parts.first().is_some_and(|p| *p == "labs")
            && (parts.len() == 2 || (parts.len() == 3 && parts[2] == "mod.rs"));
        for (variant, module, args) in &table {
            let in_its_folder = relative.starts_with(Path::new("labs").join(module));
            if in_its_folder || relative == Path::new("labs/mod.rs") {
                continue;
            }
            let lab_variant = format!("Lab::{variant}");
            if reaches_lab_module(&code, module, child_of_labs)
                || names_identifier(&code, args)
                || names_identifier(&code, &lab_variant)
            {
                elsewhere.push(format!("src/{} names lab {module}", relative.display()));
            }
        }
    }
    assert!(elsewhere.is_empty(), "{}", elsewhere.join("\n"));
}

#[test]
fn the_lab_scan_sees_each_way_of_naming_a_lab() {
    let sees = |code: &str, module: &str, in_labs: bool| reaches_lab_module(code, module, in_labs);
    assert!(sees(
        "use crate::labs::gc_pause::{self, GcPauseArgs};",
        "gc_pause",
        false
    ));
    assert!(sees(
        "crate::labs::naive::replay(events, verdict)",
        "naive",
        false
    ));
    assert!(sees("use super::queue::Plan;", "queue", true));
    assert!(!sees("use super::queue::Plan;", "queue", false));
    assert!(sees("use crate::labs::{network, queue};", "queue", false));
    assert!(!sees("use crate::chaos::failover;", "failover", false));
    assert!(!sees("use crate::labs::redlock_words;", "redlock", false));
    assert!(!sees("use crate::labs::{Feed, Stage};", "queue", false));
    let table = lab_table("x\nlab_table! {\n    GcPause => gc_pause::GcPauseArgs,\n}\n");
    assert_eq!(
        table,
        [("GcPause".into(), "gc_pause".into(), "GcPauseArgs".into())]
    );
}
