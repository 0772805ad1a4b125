//! `@card(min..max)` per `src`: new edges past `max` are rejected (the
//! earliest in Kafka order are kept; an update that keeps its `src` is not
//! counted again), and explicit deletes that would take a `src` below `min`
//! are refused (cascaded deletes are not: their node is gone).

use std::collections::HashMap;

use arrow::array::RecordBatch;

use super::view::CardBase;
use super::Rejection;
use crate::error::Result;
use crate::fold::rows::strings;
use crate::rejects::{RefusedRow, RejectCode};
use crate::schema::{EdgeEnds, GraphType, Provenance, ID};

/// What `@card` decided for one edge table.
#[derive(Debug, Default)]
pub(crate) struct CardOutcome {
    /// The explicit deletes it lets through.
    pub deletes: Vec<String>,
    /// The explicit deletes it refuses.
    pub refused: Vec<Rejection>,
    /// Rows of the checked batch past `max`.
    pub over: Vec<RefusedRow>,
}

/// Edges per `src` at the base, as this fold changes them.
#[derive(Default)]
struct Counts {
    src_of: HashMap<String, String>,
    count: HashMap<String, u64>,
}

impl Counts {
    fn of(base: &CardBase) -> Counts {
        Counts {
            src_of: base.src_of.clone(),
            count: base.count.clone(),
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some(src) = self.src_of.remove(id) {
            if let Some(n) = self.count.get_mut(&src) {
                *n -= 1;
            }
        }
    }
}

/// Checks `rows` (this fold's resolved edges) and `deletes` (explicit) of
/// edge type `ty` against the committed edges `base` (as far as they
/// count for these rows and deletes), after `cascaded`.
pub(crate) fn card_check(
    ty: &GraphType,
    ends: &EdgeEnds,
    rows: &RecordBatch,
    deletes: Vec<String>,
    cascaded: &[String],
    base: &CardBase,
) -> Result<CardOutcome> {
    if ends.card_max.is_none() && ends.card_min == 0 {
        return Ok(CardOutcome {
            deletes,
            ..Default::default()
        });
    }
    let card = format!(
        "@card({}..{})",
        ends.card_min,
        ends.card_max.map(|m| m.to_string()).unwrap_or_default()
    );
    let mut counts = Counts::of(base);
    for id in cascaded {
        counts.remove(id);
    }
    let mut out = CardOutcome::default();
    for id in deletes {
        let Some(src) = counts.src_of.get(&id).cloned() else {
            out.deletes.push(id);
            continue;
        };
        let n = counts.count.get(&src).copied().unwrap_or_default();
        if n <= ends.card_min as u64 {
            let message = format!(
                "delete of edge {} {id:?} refused: src {src:?} would have fewer than {card} allows",
                ty.name
            );
            let row = serde_json::json!({ "id": id, "src": src });
            out.refused.push(Rejection::delete(
                ty,
                &id,
                row,
                RejectCode::Cardinality,
                message,
            ));
        } else {
            counts.remove(&id);
            out.deletes.push(id);
        }
    }
    if let Some(max) = ends.card_max {
        out.over = over_max(ty, &card, max, rows, &mut counts)?;
    }
    Ok(out)
}

/// Rows past `max` per `src`, claiming in Kafka order.
fn over_max(
    ty: &GraphType,
    card: &str,
    max: u32,
    rows: &RecordBatch,
    counts: &mut Counts,
) -> Result<Vec<RefusedRow>> {
    let (ids, srcs) = (strings(rows, ID)?, strings(rows, "src")?);
    let prov = Provenance::of(rows)?;
    let mut order: Vec<usize> = (0..rows.num_rows()).collect();
    order.sort_by_key(|&i| prov.order_key(i));
    let mut over = Vec::new();
    for i in order {
        let (id, src) = (ids.value(i), srcs.value(i));
        if counts.src_of.get(id).map(String::as_str) == Some(src) {
            continue; // an update that keeps its src
        }
        let c = counts.count.entry(src.to_string()).or_default();
        if *c >= max as u64 {
            let message = format!("{card}: src {src:?} already has {c} edge(s) of {}", ty.name);
            over.push(RefusedRow {
                row: i,
                code: RejectCode::Cardinality,
                message,
            });
            continue;
        }
        *c += 1;
        if let Some(old) = counts.src_of.insert(id.to_string(), src.to_string()) {
            if let Some(n) = counts.count.get_mut(&old) {
                *n -= 1;
            }
        }
    }
    Ok(over)
}
