//! The core's modules depend on each other without a circle: each top-level module (`ledger`,
//! `config`, `batch`, …) and, inside a folder module, each of its child modules among its siblings
//! (`ledger::load` beside `ledger::commit`). A circle hides which module is the lower one, and it
//! is how the pure domain code ends up depending on the serde layer; this test reads the crate's
//! own sources so that a new circle fails here, naming it, rather than in a review.
//!
//! The scanner is deliberately small. It blanks comments and string and character literals, drops
//! every item under `#[cfg(test)]` and every `tests.rs` / `*_tests.rs` file (test code may reach
//! anywhere), then reads the paths that start with `crate::`, `super::` or `self::` and the `use`
//! trees, with their `{…}` groups. What it does not model it rejects or ignores openly: an inline
//! `mod x { … }` outside test code fails the test (its `super` would mean something else), and a
//! glob import (`use x::*`) names nothing, so a name re-exported through one is not followed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::Path;

/// A module's path below the crate root: `[]` is the root, `["ledger", "load"]` is `ledger::load`.
type ModPath = Vec<String>;

/// The module graph: each node's dependencies. A node is a module path joined with `::`.
type Graph = BTreeMap<String, BTreeSet<String>>;

#[test]
fn no_module_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = read_sources(&src);
    let (graph, evidence) = module_graph(&files);
    // A scan that found nothing would pass vacuously; the core's modules do depend on each other.
    assert!(
        graph.values().map(BTreeSet::len).sum::<usize>() > 10,
        "no edges found: {graph:?}"
    );

    let circles = circles(&graph);
    let mut report = String::new();
    for circle in &circles {
        report.push_str(&format!("\n  {}", circle.join(" -> ")));
        for step in circle.windows(2) {
            let why = &evidence[&(step[0].clone(), step[1].clone())];
            report.push_str(&format!("\n      {} -> {}: {why}", step[0], step[1]));
        }
    }
    assert!(
        circles.is_empty(),
        "the core's modules depend on each other in a circle (a node is a top-level module, or a \
         child module among its folder's siblings):{report}"
    );
}

#[test]
fn cycle_finder_names_a_circle() {
    let graph = graph_of(&[
        ("a", "b"),
        ("b", "c"),
        ("c", "a"),
        ("c", "d"),
        ("d", "e"),
        ("x", "e"),
    ]);
    assert_eq!(circles(&graph), [["a", "b", "c", "a"]]);

    // One strongly connected component, two circles: both are named, each once.
    let graph = graph_of(&[("a", "b"), ("b", "a"), ("b", "c"), ("c", "a")]);
    assert_eq!(
        circles(&graph),
        [vec!["a", "b", "a"], vec!["a", "b", "c", "a"]]
    );

    let acyclic = graph_of(&[("a", "b"), ("b", "c"), ("a", "c"), ("d", "c")]);
    assert!(circles(&acyclic).is_empty());
}

#[test]
fn scanner_reads_paths_and_skips_comments_literals_and_test_code() {
    let code = r##"
        //! [`crate::doc_link`] and // crate::line_comment
        /* crate::block /* nested */ crate::still_comment */
        use super::{sibling::{self, Item as Renamed}, other::Thing,};
        pub(in crate::ledger) fn f() -> char {
            let _ = "crate::in_string \" crate::escaped";
            let _ = r#"crate::in_raw " string"#;
            let _: &'static str = b"crate::bytes";
            crate::inline::call::<u8>(crate::arg::VALUE);
            '"'
        }
        #[cfg(test)]
        #[allow(dead_code)]
        fn only_in_tests() { crate::test_only::x(); }
        #[cfg(test)]
        use crate::test_import;
        struct After;
    "##;
    let tokens = without_test_code(tokenize(&strip_comments_and_literals(code)));
    let paths: Vec<String> = paths(&tokens)
        .iter()
        .map(|p| p.segments.join("::"))
        .collect();
    assert_eq!(
        paths,
        [
            "super::sibling",
            "super::sibling::Item",
            "super::other::Thing",
            "crate::inline::call",
            "crate::arg::VALUE"
        ]
    );
    assert_eq!(paths_of_use(&tokens)[1].name.as_deref(), Some("Renamed"));
    assert!(
        tokens.iter().any(|t| t.text == "After"),
        "the item after test code survives"
    );
}

#[test]
fn graph_follows_super_and_a_parent_s_re_exports() {
    let source = |file: &str, module: &[&str], code: &str| Source {
        file: file.to_owned(),
        module: module.iter().map(|m| m.to_string()).collect(),
        tokens: tokenize(code),
    };
    let files = [
        source("lib.rs", &[], "mod a; mod b;"),
        source("a/mod.rs", &["a"], "mod x; mod y; pub use x::X;"),
        // `super::X` is `a::x::X`, re-exported by the parent: an edge to the sibling `x`.
        source("a/y.rs", &["a", "y"], "use super::X; pub struct Y;"),
        source(
            "a/x.rs",
            &["a", "x"],
            "pub struct X(super::y::Y); fn f() { crate::b::g() }",
        ),
        source("b.rs", &["b"], "pub fn g() {}"),
    ];
    let (graph, evidence) = module_graph(&files);
    assert_eq!(
        graph,
        graph_of(&[("a", "b"), ("a::x", "a::y"), ("a::y", "a::x")])
    );
    assert_eq!(
        evidence[&("a::y".into(), "a::x".into())],
        "a/y.rs:1 super::X"
    );
    assert_eq!(circles(&graph), [["a::x", "a::y", "a::x"]]);
}

fn graph_of(edges: &[(&str, &str)]) -> Graph {
    let mut graph = Graph::new();
    for (from, to) in edges {
        graph
            .entry(from.to_string())
            .or_default()
            .insert(to.to_string());
        graph.entry(to.to_string()).or_default();
    }
    graph
}

/// One source file of the crate: the module it is and its tokens, test code dropped.
struct Source {
    /// Relative to the crate, for the failure message.
    file: String,
    module: ModPath,
    tokens: Vec<Token>,
}

/// Every `.rs` file under `src`, but the test files.
fn read_sources(src: &Path) -> Vec<Source> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if !name.ends_with(".rs") || name == "tests.rs" || name.ends_with("_tests.rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap();
            let mut module: ModPath = relative
                .iter()
                .map(|c| c.to_str().unwrap().to_owned())
                .collect();
            let stem = module.pop().unwrap().trim_end_matches(".rs").to_owned();
            // `lib.rs` is the root and `x/mod.rs` is `x`; any other file is a module of its name.
            if stem != "lib" && stem != "mod" {
                module.push(stem);
            }
            let text = fs::read_to_string(&path).unwrap();
            let tokens = without_test_code(tokenize(&strip_comments_and_literals(&text)));
            let file = format!("src/{}", relative.display());
            if let Some(at) = tokens
                .windows(3)
                .position(|w| w[0].text == "mod" && is_ident(&w[1].text) && w[2].text == "{")
            {
                panic!(
                    "{file}:{}: an inline module outside test code; this scanner takes a module \
                     to be a file",
                    tokens[at].line
                );
            }
            files.push(Source {
                file,
                module,
                tokens,
            });
        }
    }
    files.sort_by(|a, b| a.file.cmp(&b.file));
    files
}

/// The dependency graph between the modules, and for each edge the first path that makes it.
fn module_graph(files: &[Source]) -> (Graph, BTreeMap<(String, String), String>) {
    let modules: BTreeSet<ModPath> = files.iter().map(|f| f.module.clone()).collect();
    // What each module's `use` declarations name, by the name they bring into scope: a child that
    // reaches an item through its parent (`super::Result`) reaches whichever sibling the parent
    // imported it from (`pub use error::Result`).
    let mut imports: BTreeMap<ModPath, BTreeMap<String, ModPath>> = BTreeMap::new();
    for f in files {
        for p in paths_of_use(&f.tokens) {
            if let (Some(name), Some(target)) = (p.name, absolute(&p.segments, &f.module, &modules))
            {
                imports
                    .entry(f.module.clone())
                    .or_default()
                    .insert(name, target);
            }
        }
    }

    let mut graph = Graph::new();
    let mut evidence = BTreeMap::new();
    for f in files {
        for p in paths(&f.tokens) {
            let Some(target) = absolute(&p.segments, &f.module, &modules) else {
                continue;
            };
            let target = owner(&target, &f.module, &modules, &imports);
            // The edge joins the two modules' ancestors just below their common one: siblings in
            // one folder, or two top-level modules. A module and its own ancestor are no edge.
            let common = f
                .module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common == f.module.len() || common == target.len() {
                continue;
            }
            let from = f.module[..=common].join("::");
            let to = target[..=common].join("::");
            graph.entry(to.clone()).or_default();
            graph.entry(from.clone()).or_default().insert(to.clone());
            evidence
                .entry((from, to))
                .or_insert_with(|| format!("{}:{} {}", f.file, p.line, p.segments.join("::")));
        }
    }
    (graph, evidence)
}

/// `segments` as a path from the crate root, or `None` for a path into another crate.
fn absolute(segments: &[String], module: &ModPath, modules: &BTreeSet<ModPath>) -> Option<ModPath> {
    let mut base = module.clone();
    let mut rest = segments;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        // Since the 2018 edition a `use` may start at a child module without `self::`.
        Some(first) if modules.contains(&[module.as_slice(), &[first.to_owned()]].concat()) => {}
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The module that defines what `path` names, as far as `user` is concerned: the longest known
/// module the path starts with, except that a name reached through one of `user`'s own ancestors is
/// followed through that ancestor's imports (the ancestor is no node beside `user`).
fn owner(
    path: &ModPath,
    user: &ModPath,
    modules: &BTreeSet<ModPath>,
    imports: &BTreeMap<ModPath, BTreeMap<String, ModPath>>,
) -> ModPath {
    let mut path = path.clone();
    // Bounded: a re-export may name itself through a glob or a rename loop this scanner can't see.
    for _ in 0..8 {
        let len = (0..=path.len())
            .rev()
            .find(|&n| modules.contains(&path[..n]))
            .unwrap_or(0);
        let module = path[..len].to_vec();
        let imported = path
            .get(len)
            .and_then(|name| imports.get(&module)?.get(name));
        match imported {
            Some(target) if user.starts_with(&module) => {
                path = [target.as_slice(), &path[len + 1..]].concat();
            }
            _ => return module,
        }
    }
    path
}

/// Each circle of `graph`, as its nodes from the first back to it: for every strongly connected
/// component of more than one node, the shortest circle through each of its edges, each circle
/// once, starting at its smallest node.
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    let mut found = BTreeSet::new();
    for component in components(graph).into_iter().filter(|c| c.len() > 1) {
        for from in &component {
            for to in graph[from].iter().filter(|to| component.contains(*to)) {
                // The shortest way back from `to` to `from`, inside the component.
                let mut parent: BTreeMap<&String, &String> = BTreeMap::new();
                let mut queue = VecDeque::from([to]);
                while let Some(node) = queue.pop_front() {
                    if node == from {
                        break;
                    }
                    for next in graph[node].iter().filter(|n| component.contains(*n)) {
                        if next != to && !parent.contains_key(next) {
                            parent.insert(next, node);
                            queue.push_back(next);
                        }
                    }
                }
                let mut circle = vec![from.clone()];
                let mut node = from;
                while node != to {
                    node = parent[node];
                    circle.push(node.clone());
                }
                circle.reverse();
                // `to … from`, then rotated to start at its smallest node and closed.
                let at = (0..circle.len()).min_by_key(|&i| &circle[i]).unwrap();
                circle.rotate_left(at);
                circle.push(circle[0].clone());
                found.insert(circle);
            }
        }
    }
    found.into_iter().collect()
}

/// The strongly connected components of `graph` (Tarjan's algorithm).
fn components(graph: &Graph) -> Vec<BTreeSet<String>> {
    struct Tarjan<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g String, usize>,
        low: BTreeMap<&'g String, usize>,
        stack: Vec<&'g String>,
        found: Vec<BTreeSet<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, node: &'g String) {
            let index = self.index.len();
            self.index.insert(node, index);
            self.low.insert(node, index);
            self.stack.push(node);
            for next in &self.graph[node] {
                if !self.index.contains_key(next) {
                    self.visit(next);
                    self.low.insert(node, self.low[node].min(self.low[next]));
                } else if self.stack.contains(&next) {
                    self.low.insert(node, self.low[node].min(self.index[next]));
                }
            }
            if self.low[node] == index {
                let mut component = BTreeSet::new();
                while let Some(member) = self.stack.pop() {
                    component.insert(member.clone());
                    if member == node {
                        break;
                    }
                }
                self.found.push(component);
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !t.index.contains_key(node) {
            t.visit(node);
        }
    }
    t.found
}

/// `code` with every comment and string, byte-string and character literal blanked, line breaks
/// kept (so that line numbers stay true): what is left is code only.
fn strip_comments_and_literals(code: &str) -> String {
    let c: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    while i < c.len() {
        let end = if c[i..].starts_with(&['/', '/']) {
            c[i..]
                .iter()
                .position(|&ch| ch == '\n')
                .map_or(c.len(), |n| i + n)
        } else if c[i..].starts_with(&['/', '*']) {
            block_comment_end(&c, i)
        } else {
            literal_end(&c, i).unwrap_or(i)
        };
        if end == i {
            out.push(c[i]);
            i += 1;
        } else {
            out.extend(
                c[i..end]
                    .iter()
                    .map(|&ch| if ch == '\n' { '\n' } else { ' ' }),
            );
            i = end;
        }
    }
    out
}

/// Where the block comment at `start` ends; block comments nest.
fn block_comment_end(c: &[char], start: usize) -> usize {
    let (mut depth, mut i) = (0, start);
    while i < c.len() {
        if c[i..].starts_with(&['/', '*']) {
            depth += 1;
            i += 2;
        } else if c[i..].starts_with(&['*', '/']) {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    c.len()
}

/// Where the string or character literal at `start` ends, if one starts there (a `'` that starts
/// a lifetime or a label is no literal).
fn literal_end(c: &[char], start: usize) -> Option<usize> {
    if start > 0 && (c[start - 1].is_alphanumeric() || c[start - 1] == '_') {
        return None;
    }
    let mut i = start;
    if matches!(c[i], 'b' | 'c') {
        i += 1;
    }
    let raw = c.get(i) == Some(&'r');
    if raw {
        i += 1;
    }
    let hashes = c[i..].iter().take_while(|&&ch| ch == '#').count();
    i += hashes;
    match c.get(i) {
        Some('"') if raw => {
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let body = i + 1;
            Some(
                c[body..]
                    .windows(close.len())
                    .position(|w| w == close)
                    .map_or(c.len(), |n| body + n + close.len()),
            )
        }
        Some('"') if hashes == 0 => {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            Some((i + 1).min(c.len()))
        }
        Some('\'') if !raw && hashes == 0 && c.get(start) != Some(&'c') => {
            if c.get(i + 1) == Some(&'\\') {
                // An escape: `'\n'`, `'\''`, `'\u{…}'`; it ends at the first `'` after its second
                // character.
                let after = i + 3;
                Some(
                    c[after.min(c.len())..]
                        .iter()
                        .position(|&ch| ch == '\'')
                        .map_or(c.len(), |n| after + n + 1),
                )
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 3)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// A token of code with its line: an identifier or keyword, `::`, or one other character.
#[derive(Clone, Debug)]
struct Token {
    text: String,
    line: usize,
}

fn is_ident(text: &str) -> bool {
    text.starts_with(|ch: char| ch.is_alphabetic() || ch == '_')
}

fn tokenize(code: &str) -> Vec<Token> {
    let c: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        let len = if ch.is_whitespace() {
            line += usize::from(ch == '\n');
            i += 1;
            continue;
        } else if ch.is_alphanumeric() || ch == '_' {
            c[i..]
                .iter()
                .take_while(|ch| ch.is_alphanumeric() || **ch == '_')
                .count()
        } else if c[i..].starts_with(&[':', ':']) {
            2
        } else {
            1
        };
        tokens.push(Token {
            text: c[i..i + len].iter().collect(),
            line,
        });
        i += len;
    }
    tokens
}

/// `tokens` without the items under `#[cfg(test)]`, or none at all in a file under `#![cfg(test)]`.
fn without_test_code(tokens: Vec<Token>) -> Vec<Token> {
    let is = |at: usize, texts: &[&str]| {
        tokens
            .get(at..at + texts.len())
            .is_some_and(|ts| ts.iter().zip(texts).all(|(t, s)| t.text == *s))
    };
    let mut kept = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        if is(i, &["#", "!", "[", "cfg", "(", "test", ")", "]"]) {
            return Vec::new();
        }
        if !is(i, &["#", "[", "cfg", "(", "test", ")", "]"]) {
            kept.push(tokens[i].clone());
            i += 1;
            continue;
        }
        i += 7;
        // The item's other attributes, then the item: up to its `;` or through its `{…}` body,
        // whichever comes first outside brackets (a `}` first closes the block the item is in).
        while is(i, &["#", "["]) {
            i = closing(&tokens, i + 1);
        }
        while i < tokens.len() {
            match tokens[i].text.as_str() {
                ";" => {
                    i += 1;
                    break;
                }
                "{" => {
                    i = closing(&tokens, i);
                    break;
                }
                "(" | "[" => i = closing(&tokens, i),
                "}" => break,
                _ => i += 1,
            }
        }
    }
    kept
}

/// Just past the bracket that closes the one at `open`.
fn closing(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, t) in tokens.iter().enumerate().skip(open) {
        match t.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// A path in the code, as written, and the name it brings into scope if it is imported by a `use`.
struct CodePath {
    segments: Vec<String>,
    name: Option<String>,
    line: usize,
}

/// Every path that may name a module of this crate: those starting with `crate`, `super` or `self`
/// anywhere, and every path a `use` imports (it may start at a child module). A `pub(in crate::…)`
/// restricts visibility and depends on nothing.
fn paths(tokens: &[Token]) -> Vec<CodePath> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let at_path_start = matches!(tokens[i].text.as_str(), "crate" | "super" | "self")
            && tokens.get(i + 1).is_some_and(|t| t.text == "::")
            && (i == 0 || !matches!(tokens[i - 1].text.as_str(), "::" | "in"));
        if tokens[i].text == "use" {
            i = use_tree(tokens, i + 1, Vec::new(), &mut found);
        } else if at_path_start {
            i = use_tree(tokens, i, Vec::new(), &mut found);
        } else {
            i += 1;
        }
    }
    found.retain(|p| !p.segments.is_empty());
    found
}

/// The paths of `use` declarations only, with the names they import.
fn paths_of_use(tokens: &[Token]) -> Vec<CodePath> {
    let mut found = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        if t.text == "use" {
            use_tree(tokens, i + 1, Vec::new(), &mut found);
        }
    }
    found
}

/// Reads the path or `use` tree at `i` (`a::b`, `a::{b, c::d as e}`, `a::*`) onto `found`, each
/// leaf as a path of its own; returns where it ends.
fn use_tree(
    tokens: &[Token],
    mut i: usize,
    mut prefix: Vec<String>,
    found: &mut Vec<CodePath>,
) -> usize {
    let line = tokens.get(i).map_or(0, |t| t.line);
    while let Some(t) = tokens.get(i) {
        if t.text == "{" {
            i += 1;
            while tokens.get(i).is_some_and(|t| t.text != "}") {
                i = use_tree(tokens, i, prefix.clone(), found);
                if tokens.get(i).is_some_and(|t| t.text == ",") {
                    i += 1;
                }
            }
            return i + 1;
        }
        if t.text == "*" {
            // A glob imports names this scanner does not know; the path still is a dependency.
            found.push(CodePath {
                segments: prefix,
                name: None,
                line,
            });
            return i + 1;
        }
        if !is_ident(&t.text) {
            break;
        }
        prefix.push(t.text.clone());
        i += 1;
        if tokens.get(i).is_some_and(|t| t.text == "::") {
            i += 1;
        } else {
            break;
        }
    }
    // `{self, …}` imports the module itself.
    if prefix.last().is_some_and(|s| s == "self") && prefix.len() > 1 {
        prefix.pop();
    }
    let mut name = prefix.last().cloned();
    if tokens.get(i).is_some_and(|t| t.text == "as") {
        name = tokens
            .get(i + 1)
            .map(|t| t.text.clone())
            .filter(|n| n != "_");
        i += 2;
    }
    if !prefix.is_empty() {
        found.push(CodePath {
            segments: prefix,
            name,
            line,
        });
    }
    i
}
