//! The checks: the graph against the stream, in full at the end of a phase
//! and up to the committed offsets after a crash.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::graph::Snapshot;
use super::rejects::{dead_letters_cover, rejects};
use super::stream::{Coords, Expected};
use super::{Msg, Tally};

/// Does `row` hold what `m` says (its fields and its source offset)?
fn row_is(row: &Value, m: &Msg, fields: &[&str]) -> bool {
    let Some(v) = m.json() else { return false };
    row["_src_offset"].as_i64() == Some(m.offset)
        && row["_src_partition"].as_i64() == Some(m.partition as i64)
        && fields.iter().all(|f| row[*f] == v[*f])
}

/// The final check, once everything is consumed and folded: every key
/// holds exactly its last accepted record, no edge lacks an endpoint,
/// nothing stays deferred, every bad record is one reject in the table and
/// at least once on the dead-letter topic, and nothing else is.
pub(crate) fn check_final(
    snap: &Snapshot,
    exp: &Expected,
    dead_letters: &[Msg],
    errors: &mut Vec<String>,
) -> Tally {
    let mut t = Tally::default();
    same_state(
        "nodes/Item",
        &snap.items,
        &BTreeMap::new(),
        &exp.items,
        &["name", "qty"],
        None,
        errors,
    );
    same_state(
        "edges/Link",
        &snap.links,
        &BTreeMap::new(),
        &exp.links,
        &["src", "dst", "w"],
        None,
        errors,
    );
    if !snap.pending_links.is_empty() {
        errors.push(format!(
            "{} Link edges still deferred although every endpoint was produced: {:?}",
            snap.pending_links.len(),
            snap.pending_links.keys().take(5).collect::<Vec<_>>()
        ));
    }
    if !snap.dangles.is_empty() {
        errors.push(format!(
            "{} Dangle edges stored; all should be rejected",
            snap.dangles.len()
        ));
    }
    endpoints(snap, errors);
    let all: BTreeSet<_> = exp.rejects.keys().cloned().collect();
    rejects(snap, exp, &all, Some(dead_letters), errors, &mut t);
    t.nodes = snap.items.len();
    t.edges = snap.links.len();
    t.head_seq = snap.seq;
    t
}

/// After a crash, once everything durable is folded (`graphsink fold`):
/// every record below the committed offsets is in the graph (it, or a
/// later record of its key), and every bad record below them is a reject
/// in the table and on the dead-letter topic.
pub(crate) fn check_committed(
    snap: &Snapshot,
    exp: &Expected,
    committed: &BTreeMap<String, BTreeMap<i32, i64>>,
    dead_letters: &[Msg],
    errors: &mut Vec<String>,
) -> Tally {
    let mut t = Tally::default();
    let below = |m: &Msg| {
        committed
            .get(&m.topic)
            .and_then(|c| c.get(&m.partition))
            .is_some_and(|&c| m.offset < c)
    };
    same_state(
        "nodes/Item",
        &snap.items,
        &BTreeMap::new(),
        &exp.items,
        &["name", "qty"],
        Some(&below),
        errors,
    );
    same_state(
        "edges/Link",
        &snap.links,
        &snap.pending_links,
        &exp.links,
        &["src", "dst", "w"],
        Some(&below),
        errors,
    );
    endpoints(snap, errors);
    let acked: BTreeSet<_> = exp
        .rejects
        .keys()
        .filter(|(topic, p, o)| {
            committed
                .get(topic)
                .and_then(|c| c.get(p))
                .is_some_and(|&c| *o < c)
        })
        .cloned()
        .collect();
    // Fold rejects reach the dead-letter topic when the connector next
    // starts (the offline fold has no producer): only the table is checked.
    let sync: BTreeSet<_> = acked
        .iter()
        .filter(|c| {
            exp.rejects
                .get(*c)
                .is_some_and(|code| code != "endpoint_not_found")
        })
        .cloned()
        .collect();
    rejects(snap, exp, &acked, None, errors, &mut t);
    let below_commit = |c: &Coords| {
        committed
            .get(&c.0)
            .and_then(|p| p.get(&c.1))
            .is_some_and(|&n| c.2 < n)
    };
    dead_letters_cover(
        snap,
        &sync,
        dead_letters,
        Some(&below_commit),
        errors,
        &mut t,
    );
    t.nodes = snap.items.len();
    t.edges = snap.links.len();
    t
}

/// Compares a table with the stream. Without `below`, each key must hold
/// exactly its last accepted record. With it (after a crash), each key
/// must hold a record at or after its last accepted record below the
/// committed offsets: it may hold a newer one that became durable too.
fn same_state(
    table: &str,
    rows: &BTreeMap<String, Value>,
    deferred: &BTreeMap<String, Value>,
    exp: &BTreeMap<String, Vec<Msg>>,
    fields: &[&str],
    below: Option<&dyn Fn(&Msg) -> bool>,
    errors: &mut Vec<String>,
) {
    for (id, recs) in exp {
        // A newer version of an edge may wait in `deferred` while the older
        // one stays in the table: either may hold the record looked for.
        let held: Vec<&Value> = rows.get(id).into_iter().chain(deferred.get(id)).collect();
        let row = held.first().copied();
        let floor = match below {
            None => recs.len() - 1,
            Some(b) => match recs.iter().rposition(b) {
                Some(i) => i,
                None => {
                    // Nothing of this key is acked: any of its records or none.
                    for row in &held {
                        if !recs.iter().any(|m| row_is(row, m, fields)) {
                            errors.push(format!(
                                "{table} {id}: holds {row}, which no record of the key says"
                            ));
                        }
                    }
                    continue;
                }
            },
        };
        let allowed = &recs[floor..];
        let ok = if held.is_empty() {
            allowed.iter().any(|m| m.value.is_none())
        } else {
            held.iter().any(|row| {
                allowed
                    .iter()
                    .any(|m| m.value.is_some() && row_is(row, m, fields))
            })
        };
        if !ok {
            let last = &recs[floor];
            let want = match &last.value {
                Some(v) => String::from_utf8_lossy(v).into_owned(),
                None => "absent (tombstone)".into(),
            };
            errors.push(format!(
                "{table} {id}: {} but the record at {}/{}@{} says {want}{}",
                row.map_or("absent".to_string(), |r| format!("holds {r}")),
                last.topic,
                last.partition,
                last.offset,
                if allowed.len() > 1 {
                    " (or a later one)"
                } else {
                    ""
                }
            ));
        }
    }
    for id in rows.keys().chain(deferred.keys()) {
        if !exp.contains_key(id) {
            errors.push(format!("{table} {id}: a row no accepted record made"));
        }
    }
}

fn endpoints(snap: &Snapshot, errors: &mut Vec<String>) {
    for (id, e) in &snap.links {
        for end in ["src", "dst"] {
            let n = e[end].as_str().unwrap_or_default();
            if !snap.items.contains_key(n) {
                errors.push(format!(
                    "edges/Link {id}: {end} {n} is not a node of the same commit"
                ));
            }
        }
    }
}
