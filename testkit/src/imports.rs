//! Which module of a crate imports which, read from its sources, and the
//! circles among them. Each folder of modules (the crate root, `shards/`,
//! `fold/checks/`) is one graph: a child module → the siblings its files
//! import. A circle there means no file of it can be read, changed or
//! tested without the others. Every crate of the workspace runs
//! `assert_no_circle` in a test; the connector's `layers.rs` also checks
//! its layer table against `folder("crate")`.
//!
//! It reads text, not Rust: every `crate::`, `super::` and `self::` path in
//! code (comments dropped, a `use` group over several lines included),
//! taken to the deepest module it names, and through a module's `pub use`
//! to the child that defines the item. A parent and its children may import
//! each other (the parent is their outline), and `tests` children are left
//! out (they may reach every sibling).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Within one folder: a child module → the sibling modules it imports.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// A module's path from the crate root (the root's is empty).
type ModPath = Vec<String>;

/// The imports of one crate, folder by folder.
#[derive(Debug, Default)]
pub struct Imports {
    folders: BTreeMap<String, Graph>,
    through_root: BTreeSet<String>,
}

impl Imports {
    /// Reads every `.rs` file under `src` (a crate's `src/`).
    pub fn read(src: &Path) -> Imports {
        let (mut files, mut dirs) = (Vec::new(), vec![src.to_path_buf()]);
        while let Some(dir) = dirs.pop() {
            for e in std::fs::read_dir(&dir).expect("read a source folder") {
                let p = e.expect("a folder entry").path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|e| e == "rs") {
                    let rel = p.strip_prefix(src).expect("under src");
                    let rel = rel.to_string_lossy().replace('\\', "/");
                    files.push((rel, std::fs::read_to_string(&p).expect("read a source")));
                }
            }
        }
        Imports::of(files.iter().map(|(p, t)| (p.as_str(), t.as_str())))
    }

    /// From (path under `src/`, text) pairs.
    pub fn of<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> Imports {
        let files: Vec<(ModPath, String)> = (files.into_iter())
            .map(|(path, text)| (module_of(path), code_of(text)))
            .collect();
        let mut krate = Crate {
            modules: files.iter().map(|(m, _)| m.clone()).collect(),
            reexports: BTreeMap::new(),
        };
        for (me, code) in &files {
            krate.note_reexports(me, code);
        }
        let mut out = Imports::default();
        // Every child is a node, whether it imports anything or not.
        for m in &krate.modules {
            if let Some((child, folder)) = m.split_last().filter(|(c, _)| *c != "tests") {
                let graph = out.folders.entry(name(folder)).or_default();
                graph.entry(child.clone()).or_default();
            }
        }
        for (me, code) in &files {
            for path in paths(code) {
                let Some((target, via_root)) = krate.resolve(me, &path.segs, 0) else {
                    continue;
                };
                if let Some(item) = via_root.filter(|_| !me.is_empty()) {
                    out.through_root
                        .insert(format!("{} names crate::{item}", name(me)));
                }
                out.note(me, &target);
            }
        }
        out
    }

    /// One folder's graph: `"crate"` for the root's modules, `"fold::checks"`
    /// for a folder below (empty if there is no such folder).
    pub fn folder(&self, folder: &str) -> Graph {
        self.folders.get(folder).cloned().unwrap_or_default()
    }

    /// The first circle found in each folder that has one: (folder, the
    /// circle as a path of its modules).
    pub fn circles(&self) -> Vec<(String, Vec<String>)> {
        (self.folders.iter())
            .filter_map(|(f, g)| circle(g).map(|c| (f.clone(), c)))
            .collect()
    }

    /// Fails, naming each circle, if any folder has one.
    pub fn assert_no_circle(&self) {
        let found: Vec<String> = (self.circles().into_iter())
            .map(|(folder, c)| format!("in {folder}: {}", c.join(" → ")))
            .collect();
        assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
    }

    /// Modules that name an item through the crate root's re-exports
    /// (`crate::Error` where `error` owns it): a library's root re-exports
    /// for its users, and a module importing through it makes the root an
    /// edge of the graph.
    pub fn through_root(&self) -> &BTreeSet<String> {
        &self.through_root
    }

    fn note(&mut self, me: &[String], target: &[String]) {
        let k = me.iter().zip(target).take_while(|(a, b)| a == b).count();
        // An ancestor, the file itself or a descendant: no sibling.
        if k == me.len() || k == target.len() {
            return;
        }
        let (from, to) = (&me[k], &target[k]);
        if from == "tests" || to == "tests" {
            return;
        }
        let graph = self.folders.entry(name(&me[..k])).or_default();
        graph.entry(from.clone()).or_default().insert(to.clone());
    }
}

/// The test each crate runs: no circle in any folder of `src`.
pub fn assert_no_circle(src: &Path) {
    Imports::read(src).assert_no_circle();
}

/// The first circle found in `graph`, as a path of modules.
pub fn circle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        graph: &Graph,
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
    (graph.keys()).find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

/// The modules of a crate and what each re-exports.
struct Crate {
    modules: BTreeSet<ModPath>,
    /// (module, name it re-exports) → (that module, the path it names).
    reexports: BTreeMap<(ModPath, String), (ModPath, Vec<String>)>,
}

impl Crate {
    /// `pub use` (of any visibility) in `me`, of a path in the crate.
    fn note_reexports(&mut self, me: &ModPath, code: &str) {
        let b = code.as_bytes();
        for (i, _) in code.match_indices("use ") {
            let before = code[..i].trim_end();
            let before = match before.strip_suffix(')') {
                Some(vis) => vis.rfind('(').map_or("", |k| vis[..k].trim_end()),
                None => before,
            };
            if !ends_with_word(before, "pub") || (i > 0 && is_ident(b[i - 1])) {
                continue;
            }
            let mut uses = Vec::new();
            tree(b, i + "use ".len(), &[], &mut uses);
            for u in uses {
                let Some(key) = u.alias.clone().or_else(|| leaf(&u.segs)) else {
                    continue;
                };
                let mut segs = u.segs;
                if !["crate", "super", "self"].contains(&segs[0].as_str()) {
                    let child = [me.clone(), vec![segs[0].clone()]].concat();
                    if !self.modules.contains(&child) {
                        continue; // another crate's
                    }
                    segs.insert(0, "self".into());
                }
                self.reexports.insert((me.clone(), key), (me.clone(), segs));
            }
        }
    }

    /// The deepest module `path` names from `me` (through re-exports), and
    /// the item when it went through the root's. `None`: not a path of
    /// this crate.
    fn resolve(
        &self,
        me: &[String],
        path: &[String],
        depth: u8,
    ) -> Option<(ModPath, Option<String>)> {
        let mut segs = path.iter().map(String::as_str).peekable();
        let mut cur: ModPath = match segs.next()? {
            "crate" => vec![],
            "self" => me.to_vec(),
            "super" => me.split_last()?.1.to_vec(),
            _ => return None,
        };
        while segs.next_if_eq(&"super").is_some() {
            cur.pop()?;
        }
        let mut via_root = None;
        for seg in segs.filter(|s| *s != "self") {
            let child = [cur.clone(), vec![seg.to_string()]].concat();
            if self.modules.contains(&child) {
                cur = child;
                continue;
            }
            let Some((at, to)) = self.reexports.get(&(cur.clone(), seg.to_string())) else {
                break;
            };
            if depth > 8 {
                break; // a loop of re-exports: not Rust, stop
            }
            if cur.is_empty() {
                via_root = Some(seg.to_string());
            }
            cur = self.resolve(at, to, depth + 1)?.0;
        }
        Some((cur, via_root))
    }
}

/// One path of a `use` tree or an expression, in full.
#[derive(Debug, PartialEq)]
struct UsePath {
    segs: Vec<String>,
    alias: Option<String>,
}

/// Every path in `code` that starts at `crate::`, `super::` or `self::`.
fn paths(code: &str) -> Vec<UsePath> {
    let b = code.as_bytes();
    let (mut out, mut done) = (Vec::new(), 0);
    for i in 0..b.len() {
        let starts = ["crate::", "super::", "self::"];
        if i < done || !starts.iter().any(|s| b[i..].starts_with(s.as_bytes())) {
            continue;
        }
        // Not the middle of a name (`my_self::`), a macro's `$crate::`, or
        // a later segment (`super::super::`).
        let after_path = code[..i].trim_end().ends_with("::");
        if (i > 0 && (is_ident(b[i - 1]) || b[i - 1] == b'$')) || after_path {
            continue;
        }
        done = tree(b, i, &[], &mut out);
    }
    out
}

/// The paths of the tree `a::b::{c, d::{e as f, g}}` at `i`, each after
/// `prefix`, into `out`; returns where the tree ends.
fn tree(b: &[u8], mut i: usize, prefix: &[String], out: &mut Vec<UsePath>) -> usize {
    let mut segs = prefix.to_vec();
    loop {
        i = skip_space(b, i);
        if b.get(i) == Some(&b'{') {
            i += 1;
            loop {
                i = skip_space(b, tree(b, i, &segs, out));
                match b.get(i) {
                    Some(b',') => i += 1,
                    Some(b'}') => return i + 1,
                    _ => return i,
                }
            }
        }
        let start = i;
        while i < b.len() && (is_ident(b[i]) || b[i] == b'*') {
            i += 1;
        }
        if i == start {
            break;
        }
        segs.push(String::from_utf8_lossy(&b[start..i]).into_owned());
        let next = skip_space(b, i);
        if !b[next..].starts_with(b"::") {
            break;
        }
        i = next + 2;
    }
    let mut alias = None;
    let next = skip_space(b, i);
    if b[next..].starts_with(b"as ") {
        let start = skip_space(b, next + 2);
        let end = (start..b.len())
            .find(|&k| !is_ident(b[k]))
            .unwrap_or(b.len());
        alias = Some(String::from_utf8_lossy(&b[start..end]).into_owned());
        i = end;
    }
    if segs.len() > prefix.len() {
        out.push(UsePath { segs, alias });
    }
    i
}

/// The name a path brings in: its last segment (`a::{self}` brings `a`).
fn leaf(segs: &[String]) -> Option<String> {
    let mut names = segs.iter().rev().filter(|s| *s != "self");
    names
        .next()
        .filter(|s| *s != "*" && segs.len() > 1)
        .cloned()
}

/// `src/shards/pool.rs` → `shards::pool`; `lib.rs`, `main.rs` → the root.
fn module_of(path: &str) -> ModPath {
    let path = path.strip_suffix(".rs").unwrap_or(path);
    let mut m: ModPath = path.split('/').map(str::to_string).collect();
    if m.last().is_some_and(|l| l == "mod") || m == ["lib"] || m == ["main"] {
        m.pop();
    }
    m
}

/// One line of code per file, comments dropped, so a `use` group spread
/// over lines reads as one.
fn code_of(text: &str) -> String {
    (text.lines())
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(" ")
}

fn name(m: &[String]) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

fn skip_space(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn ends_with_word(text: &str, word: &str) -> bool {
    text.strip_suffix(word)
        .is_some_and(|rest| !rest.bytes().last().is_some_and(is_ident))
}

#[cfg(test)]
mod tests;
