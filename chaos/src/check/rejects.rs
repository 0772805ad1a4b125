//! Rejects: every bad record once in `_ingest_rejects` with its code, and
//! at least once on the dead-letter topic under its `reject_id`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::graph::Snapshot;
use super::stream::{Coords, Expected};
use super::{Msg, Tally};

/// Every record in `want` is exactly one row of `_ingest_rejects` with the
/// expected code; no row rejects a record that must be accepted.
pub(super) fn rejects(
    snap: &Snapshot,
    exp: &Expected,
    want: &BTreeSet<(String, i32, i64)>,
    dead_letters: Option<&[Msg]>,
    errors: &mut Vec<String>,
    t: &mut Tally,
) {
    let mut seen: BTreeMap<(String, i32, i64), Vec<&Value>> = BTreeMap::new();
    for r in &snap.rejects {
        let (Some(topic), Some(p), Some(o)) = (
            r["topic"].as_str(),
            r["partition"].as_i64(),
            r["offset"].as_i64(),
        ) else {
            errors.push(format!(
                "_ingest_rejects: a row without its source record: {r}"
            ));
            continue;
        };
        seen.entry((topic.to_string(), p as i32, o))
            .or_default()
            .push(r);
    }
    for (c, rows) in &seen {
        match exp.rejects.get(c) {
            None => errors.push(format!(
                "_ingest_rejects: {}/{}@{} was rejected ({}) but is a good record",
                c.0, c.1, c.2, rows[0]["code"]
            )),
            Some(code) => {
                if rows.len() > 1 {
                    errors.push(format!(
                        "_ingest_rejects: {}/{}@{} rejected {} times",
                        c.0,
                        c.1,
                        c.2,
                        rows.len()
                    ));
                }
                if rows[0]["code"].as_str() != Some(code) {
                    errors.push(format!(
                        "_ingest_rejects: {}/{}@{} has code {} where {code} was expected",
                        c.0, c.1, c.2, rows[0]["code"]
                    ));
                }
            }
        }
    }
    for c in want {
        let copies = exp.copies.get(c).map_or(&[][..], Vec::as_slice);
        if !seen.contains_key(c) && !copies.iter().any(|d| seen.contains_key(d)) {
            errors.push(format!(
                "_ingest_rejects: {}/{}@{} ({}) is missing",
                c.0, c.1, c.2, exp.rejects[c]
            ));
        }
    }
    t.rejects = snap.rejects.len();
    if let Some(dl) = dead_letters {
        dead_letters_cover(snap, want, dl, None, errors, t);
    }
}

/// Every reject of `want` is on the dead-letter topic at least once under
/// its `reject_id`, with its source coordinates and code; every dead
/// letter is a row of the table. After a crash (`acked` given), only dead
/// letters below the committed offsets must have their row: a poll's
/// rejects reach the dead-letter topic before its rejects-WAL write is
/// durable, and such a poll's offset is not committed.
pub(super) fn dead_letters_cover(
    snap: &Snapshot,
    want: &BTreeSet<Coords>,
    dead_letters: &[Msg],
    acked: Option<&dyn Fn(&Coords) -> bool>,
    errors: &mut Vec<String>,
    t: &mut Tally,
) {
    let on_topic = by_reject_id(dead_letters, errors);
    let mut rows = BTreeMap::new();
    for r in &snap.rejects {
        let id = r["reject_id"].as_str().unwrap_or_default().to_string();
        let c = (
            r["topic"].as_str().unwrap_or_default().to_string(),
            r["partition"].as_i64().unwrap_or(-1) as i32,
            r["offset"].as_i64().unwrap_or(-1),
        );
        if want.contains(&c) && !on_topic.contains_key(&id) {
            errors.push(format!(
                "dead-letter topic: reject {id} ({}/{}@{}, {}) never delivered",
                c.0, c.1, c.2, r["code"]
            ));
        }
        rows.insert(id, (c, r["code"].as_str().unwrap_or_default().to_string()));
    }
    letters_match_rows(&on_topic, &rows, acked, errors);
    fold_rejects_once(&on_topic, errors);
    t.dead_letters = on_topic.len();
    t.dead_letter_duplicates = on_topic.values().map(|n| n.len() - 1).sum();
}

/// The dead letters by their `graphsink.reject_id` header (one without it
/// is an error).
fn by_reject_id<'m>(
    dead_letters: &'m [Msg],
    errors: &mut Vec<String>,
) -> BTreeMap<String, Vec<&'m Msg>> {
    let mut on_topic: BTreeMap<String, Vec<&Msg>> = BTreeMap::new();
    for m in dead_letters {
        match m.headers.get("graphsink.reject_id") {
            Some(id) => on_topic.entry(id.clone()).or_default().push(m),
            None => errors.push(format!(
                "dead letter at offset {} has no graphsink.reject_id",
                m.offset
            )),
        }
    }
    on_topic
}

/// Every dead letter says what its row says; one without a row is an error
/// unless it is past what `acked` covers.
fn letters_match_rows(
    on_topic: &BTreeMap<String, Vec<&Msg>>,
    rows: &BTreeMap<String, (Coords, String)>,
    acked: Option<&dyn Fn(&Coords) -> bool>,
    errors: &mut Vec<String>,
) {
    for (id, letters) in on_topic {
        for m in letters {
            let h = |k: &str| m.headers.get(k).cloned().unwrap_or_default();
            let src: Coords = (
                h("__connect.errors.topic"),
                h("__connect.errors.partition").parse().unwrap_or(-1),
                h("__connect.errors.offset").parse().unwrap_or(-1),
            );
            match rows.get(id) {
                Some((c, code))
                    if *c != src || h("__connect.errors.exception.class.name") != *code =>
                {
                    errors.push(format!(
                        "dead letter {id} says {}/{}@{} {} but its row says {}/{}@{} {code}",
                        src.0,
                        src.1,
                        src.2,
                        h("__connect.errors.exception.class.name"),
                        c.0,
                        c.1,
                        c.2
                    ));
                }
                Some(_) => {}
                None if acked.is_none_or(|a| a(&src)) => {
                    errors.push(format!(
                        "dead-letter topic: reject {id} ({}/{}@{}) is not in _ingest_rejects",
                        src.0, src.1, src.2
                    ));
                }
                None => {}
            }
        }
    }
}

/// Fold rejects go out once: a re-delivery skips what the topic holds
/// (GraphCommit::dead_letter_since).
fn fold_rejects_once(on_topic: &BTreeMap<String, Vec<&Msg>>, errors: &mut Vec<String>) {
    for (id, letters) in on_topic {
        let fold = letters
            .iter()
            .any(|m| m.headers.get("graphsink.stage").map(String::as_str) == Some("fold"));
        if fold && letters.len() > 1 {
            let offsets: Vec<i64> = letters.iter().map(|m| m.offset).collect();
            errors.push(format!(
                "dead-letter topic: fold reject {id} delivered {} times (offsets {offsets:?})",
                letters.len()
            ));
        }
    }
}
