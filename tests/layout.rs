//! The workspace's layout has no circle: not between its crates, and not between the modules of
//! any crate. Inside a crate a node is a top-level module (`ledger`, `config`, `server`, …) or,
//! inside a folder module, one of its child modules among its siblings (`ledger::load` beside
//! `ledger::commit`, `server::delivery` beside `server::topic`). A circle hides which module is
//! the lower one, and it is how the pure domain code ends up depending on the serde layer, or a
//! server's parts on each other; this test reads every crate's sources so that a new circle fails
//! here, naming it, the files and the lines that make it, rather than in a review. Between crates,
//! a node is a package and an edge any dependency a manifest declares on another member (a
//! dev-dependency too: cargo builds such a circle, but it inverts the layers all the same).
//!
//! The crates are found, not listed: the members of the root `Cargo.toml`, each package's library
//! and binaries (its manifest's `[lib]` and `[[bin]]`, or cargo's defaults), and each crate's
//! modules by following its `mod` declarations from the crate root, inline `mod x { … }` blocks
//! included. A `#[path]` attribute is refused (the module would not be where its name says).
//!
//! The scanner is deliberately small. It blanks comments and string and character literals, drops
//! every item under `#[cfg(test)]` (test code may reach anywhere, and the test modules it declares
//! are not followed), then reads the paths that start with `crate::`, `super::` or `self::` and the
//! `use` trees, with their `{…}` groups. A glob import (`use x::*`) names nothing, so a name
//! re-exported through one is not followed.
//!
//! The same reading holds the production code to its sizes: no function over 80 lines and no file
//! whose code (its test modules left out) runs past 600, but those named in this file with the
//! reason they read better whole; a name that no longer needs its place fails too.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

use kit::source::{
    closing, is_ident, strip_comments_and_literals, tokenize, without_test_code, Token,
};

/// A module's path below the crate root: `[]` is the root, `["ledger", "load"]` is `ledger::load`.
type ModPath = Vec<String>;

/// The module graph: each node's dependencies. A node is a module path joined with `::`.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// Why each edge of a graph is there: the first file and line that makes it.
type Evidence = BTreeMap<(String, String), String>;

#[test]
fn no_module_circles_in_any_crate() {
    let workspace = Workspace::read(&kit::repo_root());
    let mut report = String::new();
    let mut edges = 0;
    for krate in workspace.crates() {
        let files = read_crate(&workspace.root, &krate.root);
        let (graph, evidence) = module_graph(&files);
        edges += graph.values().map(BTreeSet::len).sum::<usize>();
        report.push_str(&circles_report(&krate.name, &graph, &evidence));
    }
    // A scan that found nothing would pass vacuously; the crates' modules do depend on each other.
    assert!(edges > 50, "only {edges} edges found in {workspace:?}");
    assert!(
        report.is_empty(),
        "modules depend on each other in a circle (a node is a top-level module, or a child module \
         among its folder's siblings):{report}"
    );
}

#[test]
fn no_circle_between_the_crates() {
    let workspace = Workspace::read(&kit::repo_root());
    let (graph, evidence) = workspace.crate_graph();
    // The core, the front door, the worker and the kit, at least; the core is below them all.
    assert!(graph.len() >= 4, "{graph:?}");
    for package in graph.keys().filter(|p| *p != "dedupe") {
        assert!(
            depends_on(&graph, package, "dedupe"),
            "{package} does not stand on the core: {graph:?}"
        );
    }
    let report = circles_report("the workspace", &graph, &evidence);
    assert!(
        report.is_empty(),
        "the workspace's packages depend on each other in a circle:{report}"
    );
}

/// Whether `to` is reachable from `from` in `graph`.
fn depends_on(graph: &Graph, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut queue = VecDeque::from([from.to_owned()]);
    while let Some(node) = queue.pop_front() {
        if node == to {
            return true;
        }
        for next in graph.get(&node).into_iter().flatten() {
            if seen.insert(next.clone()) {
                queue.push_back(next.clone());
            }
        }
    }
    false
}

/// Each circle of `graph`, each step with the file and line that makes it; empty without one.
fn circles_report(name: &str, graph: &Graph, evidence: &Evidence) -> String {
    let mut report = String::new();
    for circle in circles(graph) {
        report.push_str(&format!("\n  in {name}: {}", circle.join(" -> ")));
        for step in circle.windows(2) {
            let why = &evidence[&(step[0].clone(), step[1].clone())];
            report.push_str(&format!("\n      {} -> {}: {why}", step[0], step[1]));
        }
    }
    report
}

#[test]
fn a_circle_fails_naming_its_files_and_lines() {
    let dir = tempfile::tempdir().unwrap();
    let write = |file: &str, code: &str| {
        let path = dir.path().join(file);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, code).unwrap();
    };
    write(
        "Cargo.toml",
        "[workspace]\nmembers = [\".\", \"door\"]\n[package]\nname = \"low\"\n\
         [dev-dependencies]\ndoor = { path = \"door\" }\n",
    );
    write(
        "src/lib.rs",
        "pub mod a;\npub mod outer {\n    pub mod b;\n    pub mod c;\n}\n\
         #[cfg(test)]\nmod tests;\n",
    );
    write("src/a.rs", "use crate::outer::b::B;\npub struct A(B);\n");
    // `b` is a file of the inline module `outer`; its `super` is `outer`.
    write(
        "src/outer/b.rs",
        "pub struct B;\npub fn f() -> super::c::C { super::c::C(crate::a::A(B)) }\n",
    );
    write("src/outer/c.rs", "pub struct C(pub crate::a::A);\n");
    // Test code is no edge, and the test module is not followed.
    write("src/tests.rs", "use crate::outer::b::B;\n");
    write(
        "door/Cargo.toml",
        "[package]\nname = \"door\"\n[dependencies]\nlow = { path = \"..\" }\n",
    );
    write("door/src/main.rs", "fn main() { low::a::f(); }\n");

    let workspace = Workspace::read(dir.path());
    let crates: Vec<String> = workspace.crates().map(|c| c.name).collect();
    assert_eq!(crates, ["low (lib)", "door (bin door)"]);

    let files = read_crate(&workspace.root, &dir.path().join("src/lib.rs"));
    let modules: Vec<String> = files.iter().map(|f| f.module.join("::")).collect();
    assert_eq!(modules, ["", "a", "outer", "outer::b", "outer::c"]);
    let (graph, evidence) = module_graph(&files);
    // `b`'s and `c`'s files are siblings inside `outer`; from outside, both are `outer`.
    assert_eq!(
        graph,
        graph_of(&[("a", "outer"), ("outer", "a"), ("outer::b", "outer::c")])
    );
    let report = circles_report("low", &graph, &evidence);
    assert_eq!(
        report,
        "\n  in low: a -> outer -> a\
         \n      a -> outer: src/a.rs:1 crate::outer::b::B in `use crate::outer::b::B;`\
         \n      outer -> a: src/outer/b.rs:2 crate::a::A in \
         `pub fn f() -> super::c::C { super::c::C(crate::a::A(B)) }`"
    );

    // Between the packages: the door's main names the low crate; the low one's dev-dependency on
    // the door closes a circle.
    let (graph, evidence) = workspace.crate_graph();
    assert_eq!(
        circles_report("the workspace", &graph, &evidence),
        "\n  in the workspace: door -> low -> door\
         \n      door -> low: door/src/main.rs:1 low::a::f in `fn main() { low::a::f(); }`\
         \n      low -> door: Cargo.toml declares `door` in [dev-dependencies]"
    );
}

#[test]
fn a_path_attribute_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("src")).unwrap();
    fs::write(
        dir.path().join("src/lib.rs"),
        "#[path = \"elsewhere.rs\"]\nmod a;\n",
    )
    .unwrap();
    let refused =
        std::panic::catch_unwind(|| read_crate(dir.path(), &dir.path().join("src/lib.rs")));
    let message = *refused
        .err()
        .expect("refused")
        .downcast::<String>()
        .unwrap();
    assert!(message.contains("src/lib.rs:1"), "{message}");
}

/// The workspace: its root and its members' manifests.
#[derive(Debug)]
struct Workspace {
    root: PathBuf,
    /// Each member's package name, folder and manifest, in the members' order.
    packages: Vec<(String, PathBuf, toml::Table)>,
    /// `[workspace.dependencies]`, for the dependencies that say `workspace = true`.
    shared: toml::Table,
}

/// One crate: a package's library or one of its binaries.
struct CrateRoot {
    /// `dedupe-tracking (lib)`, `dedupe-actors (bin dedupe)`.
    name: String,
    root: PathBuf,
}

impl Workspace {
    fn read(root: &Path) -> Workspace {
        let manifest = read_toml(&root.join("Cargo.toml"));
        let members = manifest["workspace"]["members"]
            .as_array()
            .expect("[workspace] members");
        let mut dirs = Vec::new();
        for member in members {
            let member = member.as_str().expect("a member is a path");
            match member.strip_suffix("/*") {
                Some(parent) => {
                    let mut found: Vec<PathBuf> = fs::read_dir(root.join(parent))
                        .unwrap()
                        .map(|e| e.unwrap().path())
                        .filter(|p| p.join("Cargo.toml").is_file())
                        .collect();
                    found.sort();
                    dirs.extend(found);
                }
                None => dirs.push(root.join(member)),
            }
        }
        let packages = dirs
            .into_iter()
            .map(|dir| {
                let manifest = read_toml(&dir.join("Cargo.toml"));
                let name = manifest["package"]["name"]
                    .as_str()
                    .expect("[package] name")
                    .to_owned();
                (name, dir, manifest)
            })
            .collect();
        let shared = manifest
            .get("workspace")
            .and_then(|w| w.get("dependencies"))
            .and_then(|d| d.as_table())
            .cloned()
            .unwrap_or_default();
        Workspace {
            root: root.to_owned(),
            packages,
            shared,
        }
    }

    /// Every crate of every member: its library, then its binaries, in the members' order.
    fn crates(&self) -> impl Iterator<Item = CrateRoot> + '_ {
        self.packages.iter().flat_map(|(name, dir, manifest)| {
            let mut roots = Vec::new();
            let lib = manifest
                .get("lib")
                .and_then(|l| l.get("path"))
                .and_then(|p| p.as_str())
                .unwrap_or("src/lib.rs");
            if dir.join(lib).is_file() {
                roots.push(CrateRoot {
                    name: format!("{name} (lib)"),
                    root: dir.join(lib),
                });
            }
            let bins = manifest
                .get("bin")
                .and_then(|b| b.as_array())
                .cloned()
                .unwrap_or_default();
            let mut declared = BTreeSet::new();
            for bin in &bins {
                let bin_name = bin["name"].as_str().expect("[[bin]] name");
                let path = bin
                    .get("path")
                    .and_then(|p| p.as_str())
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("src/bin/{bin_name}.rs"));
                declared.insert(dir.join(&path));
                roots.push(CrateRoot {
                    name: format!("{name} (bin {bin_name})"),
                    root: dir.join(path),
                });
            }
            // Cargo's defaults: `src/main.rs` is a binary of the package's name, `src/bin/x.rs`
            // one named `x`.
            let main = dir.join("src/main.rs");
            if main.is_file() && !declared.contains(&main) {
                roots.push(CrateRoot {
                    name: format!("{name} (bin {name})"),
                    root: main,
                });
            }
            let mut others: Vec<PathBuf> = fs::read_dir(dir.join("src/bin"))
                .into_iter()
                .flatten()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|e| e == "rs") && !declared.contains(p))
                .collect();
            others.sort();
            for path in others {
                let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
                roots.push(CrateRoot {
                    name: format!("{name} (bin {stem})"),
                    root: path,
                });
            }
            roots
        })
    }

    /// The packages and their dependencies on each other (normal, build and dev), each edge with
    /// the first line of the package's code outside its tests that names the other crate, or the
    /// manifest table that declares it.
    fn crate_graph(&self) -> (Graph, Evidence) {
        let mut graph = Graph::new();
        let mut evidence = Evidence::new();
        let members: BTreeSet<&str> = self.packages.iter().map(|p| p.0.as_str()).collect();
        for (name, dir, manifest) in &self.packages {
            graph.entry(name.clone()).or_default();
            // The dependency's package and the name the code calls it by.
            let mut deps: Vec<(String, &str, &str)> = Vec::new();
            for table in ["dependencies", "build-dependencies", "dev-dependencies"] {
                let Some(entries) = manifest.get(table).and_then(|t| t.as_table()) else {
                    continue;
                };
                for (key, spec) in entries {
                    let shared = self.shared.get(key);
                    let package = [spec.get("package"), shared.and_then(|s| s.get("package"))]
                        .into_iter()
                        .flatten()
                        .find_map(|p| p.as_str())
                        .unwrap_or(key);
                    if package != name && members.contains(package) {
                        deps.push((package.to_owned(), key.as_str(), table));
                    }
                }
            }
            let sources: Vec<Source> = self
                .crates()
                .filter(|c| c.name.starts_with(&format!("{name} (")))
                .flat_map(|c| read_crate(&self.root, &c.root))
                .collect();
            let manifest_file = relative(&self.root, &dir.join("Cargo.toml"));
            for (package, key, table) in deps {
                let code_name = key.replace('-', "_");
                let found = sources.iter().find_map(|f| {
                    let at = f
                        .tokens
                        .windows(2)
                        .position(|w| w[0].text == code_name && w[1].text == "::")?;
                    let before = at.checked_sub(1).map(|b| f.tokens[b].text.as_str());
                    if before == Some("::") {
                        return None;
                    }
                    let mut segments = Vec::new();
                    for t in f.tokens[at..].iter() {
                        if is_ident(&t.text) {
                            segments.push(t.text.clone());
                        } else if t.text != "::" {
                            break;
                        }
                    }
                    let line = f.tokens[at].line;
                    Some(format!(
                        "{}:{line} {} in `{}`",
                        f.file,
                        segments.join("::"),
                        f.line(line)
                    ))
                });
                graph.entry(package.clone()).or_default();
                graph
                    .entry(name.clone())
                    .or_default()
                    .insert(package.clone());
                evidence
                    .entry((name.clone(), package.clone()))
                    .or_insert_with(|| {
                        found.unwrap_or_else(|| {
                            format!("{manifest_file} declares `{key}` in [{table}]")
                        })
                    });
            }
        }
        (graph, evidence)
    }
}

fn read_toml(path: &Path) -> toml::Table {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `path` below `root`, with `/`, for messages.
fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
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
        text: code.to_owned(),
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
        "a/y.rs:1 super::X in `use super::X; pub struct Y;`"
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

/// One module of a crate: the file it is in, and its own tokens (an inline module's are its own
/// module's, not the file's), test code dropped.
struct Source {
    /// Relative to the workspace, for the failure message.
    file: String,
    module: ModPath,
    tokens: Vec<Token>,
    /// The file's text, for the lines a failure quotes.
    text: String,
}

impl Source {
    /// Line `line` (from 1) of the file, trimmed.
    fn line(&self, line: usize) -> &str {
        self.text.lines().nth(line - 1).unwrap_or("").trim()
    }
}

/// The modules of the crate whose root file is `root`, found by following its `mod` declarations
/// (test code dropped, so its test modules are not followed), sorted by module path.
fn read_crate(workspace: &Path, root: &Path) -> Vec<Source> {
    let mut found = Vec::new();
    // A module file, its module path, and the folder its child modules' files are in.
    let mut queue = vec![(
        root.to_path_buf(),
        ModPath::new(),
        root.parent().unwrap().to_path_buf(),
    )];
    while let Some((path, module, children)) = queue.pop() {
        let text = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (module `{}`)", path.display(), module.join("::")));
        let file = relative(workspace, &path);
        let tokens = without_test_code(tokenize(&strip_comments_and_literals(&text)));
        if let Some(at) = tokens
            .windows(3)
            .position(|w| w[0].text == "#" && w[1].text == "[" && w[2].text == "path")
        {
            panic!(
                "{file}:{}: a #[path] attribute; this scan takes a module to be where its name \
                 says",
                tokens[at].line
            );
        }
        split_modules(
            &file, &text, module, &children, tokens, &mut found, &mut queue,
        );
    }
    found.sort_by(|a, b| a.module.cmp(&b.module));
    found
}

/// The module `module` of file `file` from its `tokens`: each inline `mod x { … }` split off as a
/// module of its own, each `mod x;` queued as a file (`x.rs` or `x/mod.rs` in `children`).
fn split_modules(
    file: &str,
    text: &str,
    module: ModPath,
    children: &Path,
    tokens: Vec<Token>,
    found: &mut Vec<Source>,
    queue: &mut Vec<(PathBuf, ModPath, PathBuf)>,
) {
    let mut kept = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        let declares = tokens[i].text == "mod"
            && tokens.get(i + 1).is_some_and(|t| is_ident(&t.text))
            && (i == 0 || tokens[i - 1].text != "::");
        if !declares {
            kept.push(tokens[i].clone());
            i += 1;
            continue;
        }
        let name = tokens[i + 1].text.clone();
        let mut child = module.clone();
        child.push(name.clone());
        let folder = children.join(&name);
        match tokens.get(i + 2).map(|t| t.text.as_str()) {
            Some("{") => {
                let end = closing(&tokens, i + 2);
                let body = tokens[i + 3..end - 1].to_vec();
                split_modules(file, text, child, &folder, body, found, queue);
                i = end;
            }
            _ => {
                let flat = children.join(format!("{name}.rs"));
                let path = if flat.is_file() {
                    flat
                } else {
                    folder.join("mod.rs")
                };
                queue.push((path, child, folder));
                // The declaration stays: `mod x;` names nothing another module depends on.
                i += 2;
            }
        }
    }
    found.push(Source {
        file: file.to_owned(),
        module,
        tokens: kept,
        text: text.to_owned(),
    });
}

/// The dependency graph between the modules, and for each edge the first path that makes it.
fn module_graph(files: &[Source]) -> (Graph, Evidence) {
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
            evidence.entry((from, to)).or_insert_with(|| {
                format!(
                    "{}:{} {} in `{}`",
                    f.file,
                    p.line,
                    p.segments.join("::"),
                    f.line(p.line)
                )
            });
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

// ---- sizes ---------------------------------------------------------------------------------

/// A production function longer than this many lines (from its `fn` to its closing brace) is
/// listed in [`LONG_FUNCTIONS`] with the reason it reads better whole.
const FUNCTION_LINES: usize = 80;
/// A file whose production code (test modules left out) runs past this line is listed in
/// [`LONG_FILES`] with its reason.
const FILE_LINES: usize = 600;

/// The production functions over [`FUNCTION_LINES`], as `file:name`, and why each stays whole.
const LONG_FUNCTIONS: &[(&str, &str)] = &[];

/// The production files over [`FILE_LINES`], and why each stays one file.
const LONG_FILES: &[(&str, &str)] = &[];

#[test]
fn no_production_function_or_file_is_longer_than_the_limits_but_the_named_ones() {
    let workspace = Workspace::read(&kit::repo_root());
    let mut files: BTreeMap<String, Vec<Token>> = BTreeMap::new();
    for krate in workspace.crates() {
        // The test kit is test code.
        if krate.root.starts_with(workspace.root.join("tests")) {
            continue;
        }
        for source in read_crate(&workspace.root, &krate.root) {
            files.entry(source.file).or_default().extend(source.tokens);
        }
    }
    assert!(files.len() > 100, "only {} files read", files.len());
    let (mut functions, mut long_files, mut counted) = (BTreeMap::new(), BTreeMap::new(), 0);
    for (file, tokens) in &files {
        let last = tokens.iter().map(|t| t.line).max().unwrap_or(0);
        if last > FILE_LINES {
            long_files.insert(file.clone(), last);
        }
        for (name, lines) in function_lengths(tokens) {
            counted += 1;
            if lines > FUNCTION_LINES {
                let key = format!("{file}:{name}");
                let longest = functions.entry(key).or_insert(0);
                *longest = lines.max(*longest);
            }
        }
    }
    // The scan is not blind.
    assert!(counted > 1_000, "only {counted} functions found");
    let report = |found: &BTreeMap<String, usize>, named: &[(&str, &str)], limit: usize| {
        let mut report = String::new();
        for (key, lines) in found {
            if !named.iter().any(|(n, _)| n == key) {
                report.push_str(&format!(
                    "\n  {key}: {lines} lines, over {limit} and not named"
                ));
            }
        }
        for (key, reason) in named {
            assert!(!reason.is_empty(), "{key} is named without a reason");
            if !found.contains_key(*key) {
                report.push_str(&format!(
                    "\n  {key}: named as over {limit} lines, and it is not (take it off the list)"
                ));
            }
        }
        report
    };
    let report = report(&functions, LONG_FUNCTIONS, FUNCTION_LINES)
        + &report(&long_files, LONG_FILES, FILE_LINES);
    assert!(
        report.is_empty(),
        "split these, or name them with the reason they read better whole:{report}"
    );
}

/// Each function's name and length in lines, from its `fn` to its body's closing brace; a
/// function without a body (a trait's declaration) has none.
fn function_lengths(tokens: &[Token]) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (at, window) in tokens.windows(2).enumerate() {
        if window[0].text != "fn" || !is_ident(&window[1].text) {
            continue;
        }
        let mut i = at + 2;
        while i < tokens.len() {
            match tokens[i].text.as_str() {
                ";" => break,
                "{" => {
                    let end = closing(tokens, i);
                    found.push((
                        window[1].text.clone(),
                        tokens[end - 1].line - window[0].line + 1,
                    ));
                    break;
                }
                "(" | "[" => i = closing(tokens, i),
                _ => i += 1,
            }
        }
    }
    found
}

#[test]
fn function_lengths_run_from_fn_to_the_closing_brace_and_skip_declarations() {
    let code = "trait T {\n    fn declared(&self);\n}\nfn f(x: [u8; 2]) -> u8\nwhere\n    u8: Copy,\n{\n    let g = |y: u8| { y };\n    fn inner() {}\n    g(x[0])\n}\n";
    let tokens = tokenize(&strip_comments_and_literals(code));
    assert_eq!(
        function_lengths(&tokens),
        vec![("f".to_owned(), 8), ("inner".to_owned(), 1)]
    );
}
