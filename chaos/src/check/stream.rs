//! What the stream says the graph must hold, from each record's
//! `chaos.expect` header.

use std::collections::BTreeMap;

use super::Msg;
use crate::workload::Topics;

/// What the stream says must hold.
pub(crate) struct Expected {
    /// Node id → its accepted records (values and tombstones), Kafka order.
    pub items: BTreeMap<String, Vec<Msg>>,
    pub links: BTreeMap<String, Vec<Msg>>,
    /// Every record that must be rejected: coordinates → expected code.
    pub rejects: BTreeMap<Coords, String>,
    /// Copies of one fold-rejected record (a producer retry wrote it twice:
    /// same topic and key). A fold that sees both keeps one row per edge
    /// id, so one reject among the copies is enough.
    pub copies: BTreeMap<Coords, Vec<Coords>>,
}

pub(super) type Coords = (String, i32, i64);

/// Groups the stream: per key the accepted records in Kafka order, and
/// the records that must be rejected.
pub(crate) fn expected(msgs: &[Msg], topics: &Topics) -> Expected {
    let mut e = Expected {
        items: BTreeMap::new(),
        links: BTreeMap::new(),
        rejects: BTreeMap::new(),
        copies: BTreeMap::new(),
    };
    let mut sorted: Vec<&Msg> = msgs.iter().collect();
    sorted.sort_by_key(|m| (m.topic.clone(), m.partition, m.offset));
    let mut by_key: BTreeMap<(String, Option<String>), Vec<Coords>> = BTreeMap::new();
    for m in sorted {
        let exp = m.expect();
        if let Some(code) = exp.strip_prefix("reject:") {
            e.rejects.insert(m.coords(), code.to_string());
            continue;
        }
        if let Some(code) = exp.strip_prefix("fold:") {
            e.rejects.insert(m.coords(), code.to_string());
            by_key
                .entry((m.topic.clone(), m.key_str()))
                .or_default()
                .push(m.coords());
            continue;
        }
        let Some(k) = m.key_str() else { continue };
        if m.topic == topics.items {
            e.items.entry(k).or_default().push(m.clone());
        } else if m.topic == topics.links {
            e.links.entry(k).or_default().push(m.clone());
        }
    }
    for group in by_key.into_values().filter(|g| g.len() > 1) {
        for c in &group {
            e.copies.insert(c.clone(), group.clone());
        }
    }
    e
}
