//! The layering rule, checked: every module of the crate has a layer, and a
//! module may import only from its own layer or below; no folder of
//! modules has an import circle. The testkit's `imports` reads the sources
//! (the same reader checks the other crates), so a new `use crate::…` that
//! reaches up or closes a circle fails `cargo test`. docs/ARCHITECTURE.md
//! explains each layer.

use std::collections::BTreeMap;
use std::path::Path;

use graphsink_testkit::imports::Imports;

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

/// Folders allowed a circle while a change removes it (none now). Each
/// must still have its circle, so the change that removes one also
/// removes its line here.
const CIRCLES_BEING_REMOVED: &[&str] = &[];

fn sources() -> Imports {
    Imports::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

#[test]
fn imports_run_one_way_from_the_leaves_up() {
    let graph = sources().folder("crate");
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
    // Seen in a real folder: `view` reads what `unique` defines, never back.
    assert!(sources().folder("fold::checks")["view"].contains("unique"));
}

/// No circle among the modules of any folder (the root's, `shards/`,
/// `fold/checks/`, …), as in every crate of the workspace.
#[test]
fn no_import_circle_in_any_folder() {
    let circles = sources().circles();
    let found: Vec<String> = (circles.iter())
        .filter(|(folder, _)| !CIRCLES_BEING_REMOVED.contains(&folder.as_str()))
        .map(|(folder, c)| format!("in {folder}: {}", c.join(" → ")))
        .collect();
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
    for folder in CIRCLES_BEING_REMOVED {
        assert!(
            circles.iter().any(|(f, _)| f == folder),
            "the circle in {folder}/ is gone: take it out of CIRCLES_BEING_REMOVED"
        );
    }
}

/// The root re-exports for graphsink's users; a module imports an item
/// from the module that owns it (`crate::error::Error`, not `crate::Error`),
/// so the root is no edge of the graph.
#[test]
fn modules_import_from_the_owner_not_the_root() {
    let imports = sources();
    let through = imports.through_root();
    assert!(through.is_empty(), "{through:#?}");
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
