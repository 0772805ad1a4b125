//! `@unique`: a row's tuple must not be held by another row, of this fold
//! (the earliest record in Kafka order keeps it) or of the base that this
//! fold neither deletes nor rewrites. Null parts exempt a row.

use std::collections::{BTreeMap, HashMap, HashSet};

use arrow::array::{Array, ArrayRef, RecordBatch};

use crate::error::{Error, Result};
use crate::fold::rows::strings;
use crate::rejects::{RefusedRow, RejectCode};
use crate::schema::{canonical_ids, GraphType, Provenance, ID};

/// A committed row holding a `@unique` tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    pub tuple: String,
    pub id: String,
}

/// Rows of `rows` whose `@unique` tuple another row holds, by row index;
/// the message names the first constraint each breaks. `base` holds the
/// committed tuples of each constraint; `deletes` are ids this fold deletes.
pub(crate) fn unique_violations(
    ty: &GraphType,
    rows: &RecordBatch,
    deletes: &[String],
    base: &[Vec<Held>],
) -> Result<Vec<RefusedRow>> {
    let mut bad: BTreeMap<usize, String> = BTreeMap::new();
    if ty.constraints.uniques.is_empty() {
        return Ok(vec![]);
    }
    let gone: HashSet<&str> = deletes.iter().map(String::as_str).collect();
    let ids = strings(rows, ID)?;
    // Claimants in Kafka order per partition (provenance), so the earliest
    // record keeps a contested tuple whatever shard it came through.
    let prov = Provenance::of(rows)?;
    let mut order: Vec<usize> = (0..rows.num_rows()).collect();
    order.sort_by_key(|&i| prov.order_key(i));
    for (k, u) in ty.constraints.uniques.iter().enumerate() {
        let cols: Vec<&str> = u.iter().map(String::as_str).collect();
        let mine = tuples(rows, &cols)?;
        let new_tuple: HashMap<&str, Option<&String>> = (0..rows.num_rows())
            .map(|i| (ids.value(i), mine[i].as_ref()))
            .collect();
        // Base holders that still hold their tuple after this fold.
        let mut held: HashMap<&str, &str> = HashMap::new();
        for h in base.get(k).map(Vec::as_slice).unwrap_or_default() {
            if gone.contains(h.id.as_str()) {
                continue;
            }
            let keeps = new_tuple
                .get(h.id.as_str())
                .is_none_or(|n| *n == Some(&h.tuple));
            if keeps {
                held.insert(&h.tuple, &h.id);
            }
        }
        for &i in &order {
            let Some(t) = &mine[i] else { continue };
            let id = ids.value(i);
            match held.get(t.as_str()) {
                Some(other) if *other != id => {
                    bad.entry(i).or_insert_with(|| {
                        format!(
                            "@unique({}) = {t} is already held by {} {other:?}",
                            u.join(", "),
                            ty.name
                        )
                    });
                }
                Some(_) => {}
                None => {
                    held.insert(t, id);
                }
            }
        }
    }
    Ok(bad
        .into_iter()
        .map(|(row, message)| RefusedRow {
            row,
            code: RejectCode::Unique,
            message,
        })
        .collect())
}

/// Each row's tuple of `cols`: the JSON array of the values' canonical
/// strings (as `schema::canonical_ids` spells key parts, here always an
/// array, even of one part), or `None` when a part is null.
pub(crate) fn tuples(rows: &RecordBatch, cols: &[&str]) -> Result<Vec<Option<String>>> {
    let parts: Vec<ArrayRef> = cols
        .iter()
        .map(|c| {
            rows.column_by_name(c)
                .cloned()
                .ok_or_else(|| Error::Corrupt(format!("no column {c} for @unique")))
        })
        .collect::<Result<_>>()?;
    let text = canonical_ids(&parts)?;
    Ok((0..rows.num_rows())
        .map(|i| {
            if parts.iter().any(|p| p.is_null(i)) {
                None
            } else if parts.len() == 1 {
                Some(serde_json::to_string(&[text.value(i)]).expect("strings serialize"))
            } else {
                Some(text.value(i).to_string())
            }
        })
        .collect())
}
