//! The reader of imports on small made-up crates, and the testkit's own
//! sources checked for circles.

use std::collections::BTreeSet;
use std::path::Path;

use super::{circle, Imports};

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

#[test]
fn the_testkit_has_no_import_circle() {
    super::assert_no_circle(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}

#[test]
fn an_upward_import_and_a_circle_among_the_roots_modules() {
    let i = Imports::of([
        ("lib.rs", "mod fold;\nmod graph;\nmod schema;\n"),
        (
            "graph.rs",
            "use crate::fold::Policies; // storage reaching up\n",
        ),
        (
            "fold/mod.rs",
            "use crate::{\n    graph::{Graph, GraphCommit},\n    schema,\n};\n\
             // crate::cli in a comment is no import\n",
        ),
        ("schema.rs", "pub struct Schema;\n"),
    ]);
    let g = i.folder("crate");
    assert_eq!(g["graph"], set(&["fold"]));
    assert_eq!(g["fold"], set(&["graph", "schema"]));
    assert_eq!(
        g["schema"],
        set(&[]),
        "a module importing nothing is a node"
    );
    assert_eq!(
        circle(&g),
        Some(vec!["fold".into(), "graph".into(), "fold".into()])
    );
    assert_eq!(
        i.circles(),
        vec![("crate".to_string(), circle(&g).unwrap())]
    );
}

/// Siblings in a folder; its `mod.rs` (the outline) and `tests.rs` may
/// reach every child.
fn fold_checks() -> Imports {
    Imports::of([
        ("fold/mod.rs", "mod checks;\n"),
        (
            "fold/checks/mod.rs",
            "use view::Held;\nuse self::unique::tuples;\n",
        ),
        ("fold/checks/view.rs", "use super::unique::tuples;\n"),
        (
            "fold/checks/unique.rs",
            "use super::{view::Held, Rejection};\n",
        ),
        (
            "fold/checks/tests.rs",
            "use super::view::*;\nuse super::unique::*;\n",
        ),
    ])
}

#[test]
fn a_circle_among_the_files_of_a_folder() {
    let i = fold_checks();
    let g = i.folder("fold::checks");
    assert_eq!(g.keys().collect::<Vec<_>>(), ["unique", "view"]);
    assert_eq!(g["unique"], set(&["view"]));
    assert!(circle(&g).is_some());
    assert_eq!(i.folder("fold")["checks"], set(&[]));
}

#[test]
#[should_panic(expected = "in fold::checks: unique → view → unique")]
fn the_check_names_the_circle_it_finds() {
    fold_checks().assert_no_circle();
}

/// An item the outline re-exports is the child's that defines it, so a
/// circle through `super::Item` is still seen.
#[test]
fn an_import_through_a_reexport_reaches_the_child_that_owns_it() {
    let i = Imports::of([
        (
            "shards/mod.rs",
            "mod pool;\nmod table;\npub use pool::ShardPool;\n\
             pub(crate) use table::{fenced_or as fenced, Router};\n",
        ),
        ("shards/pool.rs", "use super::fenced;\n"),
        ("shards/table.rs", "fn f(p: &super::ShardPool) {}\n"),
    ]);
    let g = i.folder("shards");
    assert_eq!(g["pool"], set(&["table"]));
    assert_eq!(g["table"], set(&["pool"]));
    assert!(i.through_root().is_empty());
}

/// `crate::Error` where `error` owns it: an edge to `error`, and a use of
/// the root's re-export, which a crate can refuse.
#[test]
fn a_name_through_the_roots_reexport_is_seen() {
    let i = Imports::of([
        (
            "lib.rs",
            "mod cli;\nmod error;\npub use error::{Error, Result};\n",
        ),
        ("error.rs", "pub enum Error { Bug }\n"),
        (
            "cli/mod.rs",
            "fn f() -> crate::Result<()> {\n    Err(crate::Error::Bug)\n}\n",
        ),
        ("cli/run.rs", "use crate::error::Error;\n"),
    ]);
    assert_eq!(i.folder("crate")["cli"], set(&["error"]));
    assert_eq!(
        i.through_root(),
        &set(&["cli names crate::Error", "cli names crate::Result"])
    );
}

#[test]
fn paths_that_are_not_the_crates_own_or_go_up_twice() {
    let i = Imports::of([
        ("main.rs", "macro_rules! m { () => { $crate::b::X } }\n"),
        ("a/mod.rs", "mod b;\nmod c;\nmod x;\n"),
        ("a/b/mod.rs", "mod c;\nuse std::fmt::self_named;\n"),
        (
            "a/b/c.rs",
            "use super::super::x::Y;\nlet my_self::b = 1;\nfn f() -> Self::T {}\n",
        ),
        ("a/x.rs", ""),
        ("b.rs", ""),
    ]);
    assert_eq!(
        i.folder("a")["b"],
        set(&["x"]),
        "super::super from a::b::c is a"
    );
    assert_eq!(i.folder("crate")["a"], set(&[]));
    assert_eq!(i.folder("a::b")["c"], set(&[]));
}
