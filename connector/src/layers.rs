//! The layering rule, checked: every module of the crate has a layer, and a
//! module may import only from its own layer or below, with no circle. The
//! check reads the sources, so a new `use crate::…` that reaches up fails
//! `cargo test`. docs/ARCHITECTURE.md explains each layer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

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
