//! The layering rule, checked: every module of the crate has a layer, and a
//! module may import only from its own layer or below, with no circle. The
//! check reads the sources, so a new `use crate::…` that reaches up fails
//! `cargo test`. docs/ARCHITECTURE.md explains each layer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layers from the leaves up. A module missing here fails the test, so a
/// new module has to be placed on purpose.
const LAYERS: &[(&str, u8)] = &[
    ("types", 0),
    ("error", 0),
    ("failpoints", 0),
    ("config", 0),
    ("redact", 0),
    ("runtime", 1),
    ("metrics", 0),
    ("http", 1),
    ("schema", 1),
    ("registry", 1),
    ("store", 1),
    ("graph", 2),
    ("known_ids", 1),
    ("shards", 3),
    ("rejects", 3),
    ("offsets", 3),
    ("validate", 4),
    ("decode", 4),
    ("kafka", 4),
    ("fold", 5),
    ("retention", 5),
    ("read", 5),
    ("pipeline", 6),
    ("commands", 6),
    ("cli", 7),
    ("testing", 8),
    ("layers", 8),
];

/// Top-level module → the crate modules its files import (`crate::x`).
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = vec![src.to_path_buf()];
    while let Some(p) = files.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).expect("read src dir") {
                files.push(e.expect("dir entry").path());
            }
            continue;
        }
        if p.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let rel = p.strip_prefix(src).expect("under src");
        let first = rel.components().next().expect("a component");
        let module = Path::new(first.as_os_str())
            .file_stem()
            .expect("a name")
            .to_string_lossy()
            .to_string();
        if module == "lib" || module == "main" {
            continue; // the crate root re-exports; the binary calls cli
        }
        let text = std::fs::read_to_string(&p).expect("read source");
        // One line of code per file, comments dropped, so a `use` group
        // spread over lines reads as one.
        let code: String = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(" ");
        let deps = out.entry(module.clone()).or_default();
        for (i, _) in code.match_indices("crate::") {
            for n in first_segments(&code[i + "crate::".len()..]) {
                // `crate::Error` etc. are the root's re-exports of `error`.
                let n = match n.as_str() {
                    "Error" | "ErrorKind" | "Result" => "error".to_string(),
                    "Config" => "config".to_string(),
                    _ => n,
                };
                if !n.is_empty() && n != module {
                    deps.insert(n);
                }
            }
        }
    }
    out
}

/// The first path segment of what follows `crate::`: one name, or each
/// top-level item of a `{...}` group (nested groups included).
fn first_segments(rest: &str) -> Vec<String> {
    let name = |t: &str| {
        t.trim()
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap_or("")
            .to_string()
    };
    let Some(group) = rest.strip_prefix('{') else {
        return vec![name(rest)];
    };
    let (mut depth, mut start, mut out) = (0usize, 0usize, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                out.push(name(&group[start..i]));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(name(&group[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

/// The first circle found, as a path of modules.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut c = path[at..].to_vec();
            c.push(m.to_string());
            return Some(c);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for d in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(d, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

#[test]
fn imports_run_one_way_from_the_leaves_up() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = imports(&src);
    let layer: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let mut wrong = Vec::new();
    for (m, deps) in &graph {
        let Some(&mine) = layer.get(m.as_str()) else {
            wrong.push(format!("module {m} has no layer in layers.rs"));
            continue;
        };
        for d in deps {
            match layer.get(d.as_str()) {
                None => wrong.push(format!("{m} imports {d}, which has no layer")),
                Some(&theirs) if theirs > mine => wrong.push(format!(
                    "{m} (layer {mine}) imports {d} (layer {theirs}), which is above it"
                )),
                Some(_) => {}
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
    assert_eq!(circle(&graph), None, "import circle");
}

/// Within one folder of modules (`fold/checks/`): file → the sibling
/// files it imports (`super::x`), the folder's `mod.rs` and `tests.rs`
/// left out (the parent and its tests may reach every child).
fn sibling_imports(dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let stem = |p: &Path| p.file_stem().expect("a name").to_string_lossy().to_string();
    let files: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("rs"))
        .filter(|p| !["mod", "tests"].contains(&stem(p).as_str()))
        .collect();
    let names: BTreeSet<String> = files.iter().map(|p| stem(p)).collect();
    let mut out = BTreeMap::new();
    for p in &files {
        let text = std::fs::read_to_string(p).expect("read source");
        let code: String = (text.lines())
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(" ");
        let deps: BTreeSet<String> = (code.match_indices("super::"))
            .flat_map(|(i, _)| first_segments(&code[i + "super::".len()..]))
            .filter(|n| names.contains(n) && *n != stem(p))
            .collect();
        out.insert(stem(p), deps);
    }
    out
}

/// The checks of a fold import each other one way (`view` reads what
/// `unique` defines, never back).
#[test]
fn the_fold_checks_import_each_other_one_way() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/fold/checks");
    let graph = sibling_imports(&dir);
    assert!(graph["view"].contains("unique"), "{graph:?}");
    assert_eq!(circle(&graph), None, "import circle in fold/checks");
    // The circle this test keeps out, seen.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("mod.rs"), "use view::Held;\n").unwrap();
    std::fs::write(tmp.path().join("view.rs"), "use super::unique::tuples;\n").unwrap();
    std::fs::write(
        tmp.path().join("unique.rs"),
        "use super::{view::Held, Rejection};\n",
    )
    .unwrap();
    let g = sibling_imports(tmp.path());
    assert_eq!(g["unique"], BTreeSet::from(["view".to_string()]));
    assert!(circle(&g).is_some());
}

#[test]
fn the_checker_sees_an_upward_import_and_a_circle() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("fold")).unwrap();
    std::fs::write(
        dir.path().join("graph.rs"),
        "use crate::fold::Policies; // storage reaching up\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("fold/mod.rs"),
        "use crate::{\n    graph::{Graph, GraphCommit},\n    schema,\n};\n// crate::cli in a comment is no import\n",
    )
    .unwrap();
    let g = imports(dir.path());
    assert_eq!(g["graph"], BTreeSet::from(["fold".to_string()]));
    assert_eq!(
        g["fold"],
        BTreeSet::from(["graph".to_string(), "schema".to_string()])
    );
    assert_eq!(
        circle(&g),
        Some(vec!["fold".into(), "graph".into(), "fold".into()])
    );
}

/// docs/ARCHITECTURE.md's layer table lists exactly the modules and layers
/// of `LAYERS`, so the page a newcomer reads is the rule the test keeps.
#[test]
fn the_architecture_page_lists_exactly_these_layers() {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/ARCHITECTURE.md"
    ))
    .expect("docs/ARCHITECTURE.md");
    let mut listed: BTreeMap<String, u8> = BTreeMap::new();
    for line in page.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // `| N | `module`, `module` | owns | must not touch |`
        let (Some(layer), Some(names)) = (
            cells.get(1).and_then(|c| c.parse::<u8>().ok()),
            cells.get(2),
        ) else {
            continue;
        };
        for name in names.split('`').skip(1).step_by(2) {
            assert!(
                listed.insert(name.to_string(), layer).is_none(),
                "{name} is listed twice in docs/ARCHITECTURE.md"
            );
        }
    }
    let want: BTreeMap<String, u8> = LAYERS.iter().map(|(m, l)| (m.to_string(), *l)).collect();
    assert_eq!(
        listed, want,
        "docs/ARCHITECTURE.md's layer table against LAYERS"
    );
}

/// Circles among the files of one folder that other branches of issue 50
/// are removing: the folder (from the workspace root) and the modules in
/// the circle. Arrows among them are let pass until then; an entry whose
/// circle is gone fails the check, so the entry goes with its circle.
const KNOWN_FOLDER_CIRCLES: &[(&str, &[&str])] = &[
    ("connector/src/shards", &["pool", "table"]),
    ("bench/src", &["formats", "workload"]),
    ("chaos/src/check", &["judge", "rejects"]),
];

/// Every folder of modules under a crate's `src` (by its path) → its
/// child modules (a file, or a folder with its files) → the children they
/// import, through `crate::`, `self::` or `super::` paths. The folder's
/// own `mod.rs` (or the crate root) and its `tests` are left out: the
/// parent and its tests may reach every child.
fn folder_imports(src: &Path) -> BTreeMap<PathBuf, BTreeMap<String, BTreeSet<String>>> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("read dir") {
            let p = e.expect("dir entry").path();
            match p.extension().and_then(|e| e.to_str()) {
                _ if p.is_dir() => dirs.push(p),
                Some("rs") => files.push(p),
                _ => {}
            }
        }
    }
    // A file's module path: `a/b.rs` and `a/b/mod.rs` are both `a::b`.
    let module_of = |p: &Path| -> Vec<String> {
        let rel = p.strip_prefix(src).expect("under src").with_extension("");
        let mut m: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into()).collect();
        if matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main")) {
            m.pop();
        }
        m
    };
    let modules: BTreeSet<Vec<String>> = files.iter().map(|p| module_of(p)).collect();
    let mut out: BTreeMap<PathBuf, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for p in &files {
        let me = module_of(p);
        let text = std::fs::read_to_string(p).expect("read source");
        let code: String = (text.lines())
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(" ");
        for target in module_paths(&code, &me) {
            // Each folder holding both ends, below the point they part.
            let common = me.iter().zip(&target).take_while(|(a, b)| a == b).count();
            let (Some(from), Some(to)) = (me.get(common), target.get(common)) else {
                continue;
            };
            let to_module = target[..=common].to_vec();
            if from == "tests" || to == "tests" || !modules.contains(&to_module) {
                continue;
            }
            let folder = src.join(me[..common].iter().collect::<PathBuf>());
            let graph = out.entry(folder).or_default();
            graph.entry(from.clone()).or_default().insert(to.clone());
            graph.entry(to.clone()).or_default();
        }
    }
    out
}

/// The module paths a file's code names from `crate::`, `self::` or
/// `super::` (groups `{..}` expanded), made absolute from `me`, the
/// file's module.
fn module_paths(code: &str, me: &[String]) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for (i, _) in code.match_indices("::") {
        let before = code[..i].trim_end_matches(ident);
        let word = &code[before.len()..i];
        // Only where a path starts: not `a::super::`, not `xcrate::`.
        if !matches!(word, "crate" | "self" | "super") || before.ends_with("::") {
            continue;
        }
        let mut rest = &code[i + 2..];
        let mut ups = usize::from(word == "super");
        while let Some(r) = rest.trim_start().strip_prefix("super::") {
            ups += 1;
            rest = r;
        }
        let base = match word {
            "crate" => vec![],
            _ if ups > me.len() => continue,
            _ => me[..me.len() - ups].to_vec(),
        };
        expand(rest, base, &mut out);
    }
    out
}

/// The paths of a `use` tree: `a::b::{c, d::e}` under `base`.
fn expand(rest: &str, mut base: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut rest = rest.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut start) = (0usize, 0usize);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth > 0 => depth -= 1,
                    ',' | '}' if depth == 0 => {
                        expand(&group[start..i], base.clone(), out);
                        start = i + 1;
                        if c == '}' {
                            break;
                        }
                    }
                    _ => {}
                }
            }
            return;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        base.push(rest[..end].to_string());
        match rest[end..].trim_start().strip_prefix("::") {
            Some(r) => rest = r.trim_start(),
            None => break,
        }
    }
    out.push(base);
}

/// No circle among the files of any one folder, in any crate of the
/// workspace (`decode/`'s formats import `format.rs`, which imports none
/// of them), but those `KNOWN_FOLDER_CIRCLES` lists.
#[test]
fn no_folder_has_an_import_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut wrong = Vec::new();
    for krate in ["connector", "bench", "chaos", "testkit"] {
        let src = root.join(krate).join("src");
        for (folder, mut graph) in folder_imports(&src) {
            let name = folder.strip_prefix(&root).expect("under root");
            let known = KNOWN_FOLDER_CIRCLES
                .iter()
                .find(|(f, _)| Path::new(f) == name)
                .map_or(&[][..], |(_, members)| *members);
            let among: BTreeMap<String, BTreeSet<String>> = (graph.iter())
                .filter(|(m, _)| known.contains(&m.as_str()))
                .map(|(m, deps)| {
                    let deps = deps.iter().filter(|d| known.contains(&d.as_str()));
                    (m.clone(), deps.cloned().collect())
                })
                .collect();
            if !known.is_empty() && circle(&among).is_none() {
                wrong.push(format!(
                    "{}: {known:?} no longer import each other in a circle: remove them from KNOWN_FOLDER_CIRCLES",
                    name.display()
                ));
            }
            for (m, deps) in graph.iter_mut() {
                if known.contains(&m.as_str()) {
                    deps.retain(|d| !known.contains(&d.as_str()));
                }
            }
            if let Some(c) = circle(&graph) {
                wrong.push(format!("{}: {}", name.display(), c.join(" → ")));
            }
        }
    }
    assert!(wrong.is_empty(), "import circles:\n{}", wrong.join("\n"));
}

/// The folder check resolves `super::super::`, `crate::` paths into a
/// folder and a folder module's files, and sees a circle.
#[test]
fn the_folder_check_sees_a_circle_through_any_path() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    // Module names the crate has, as this file is read by the layer check.
    std::fs::create_dir_all(src.join("fold/plan")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod fold;\n").unwrap();
    let parent = "mod plan; mod read; use plan::X; use self::read::Y;\n";
    std::fs::write(src.join("fold/mod.rs"), parent).unwrap();
    // `plan`, a folder module: its child reaches `read` two levels up.
    std::fs::write(src.join("fold/plan.rs"), "mod inner;\n").unwrap();
    std::fs::write(
        src.join("fold/plan/inner.rs"),
        "use super::super::{read::Y, Step}; // super::write in a comment\n",
    )
    .unwrap();
    let read = "pub(in crate::fold) fn y() { crate::fold::plan::x() }\n";
    std::fs::write(src.join("fold/read.rs"), read).unwrap();
    let all = folder_imports(src);
    let fold = &all[&src.join("fold")];
    assert_eq!(fold["plan"], BTreeSet::from(["read".to_string()]));
    assert_eq!(fold["read"], BTreeSet::from(["plan".to_string()]));
    assert!(circle(fold).is_some());
    // The crate root's folder: `fold` imports nothing beside it.
    assert!(all.get(src).is_none_or(|g| circle(g).is_none()));
}
