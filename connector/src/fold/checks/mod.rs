//! The graph checks of a fold: what needs base state. Pure functions of what
//! the fold read (`ReadSet`) and a pre-read view of the base tables at one
//! commit (`BaseView`, the only I/O), returning the rows to write (`Change`
//! per table) and typed rejections.
//!
//! Node tables first (`@unique`, deletes of referenced nodes under `reject`
//! or `cascade`), then edge tables (endpoints with their declared types,
//! deferral and `max_pending_edges`, `@card`, `@unique`), so edge checks see
//! this fold's nodes.

mod card;
mod edges;
mod home;
mod nodes;
mod unique;
mod view;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use arrow::array::{Array, RecordBatch};

use super::policy::Policies;
use super::read::{Read, ReadSet};
use super::rows::{str_at, strings, RowRef};
use crate::error::Result;
use crate::rejects::{FoldRefusal, RefusedRow, Reject, RejectCode};
use crate::schema::{pending_table, row_json, GraphSchema, GraphType, Provenance, ID};

pub(crate) use view::{read_view, BaseView};

/// The rows one fold changes in one table, after the checks.
#[derive(Debug, Default, Clone)]
pub(crate) struct Change {
    pub upserts: Option<RecordBatch>,
    pub deletes: Vec<String>,
    /// Rejected rows of this table (for its stats).
    pub rejected: u64,
    /// Overwrite instead of merge (pending tables).
    pub replace: Option<RecordBatch>,
}

/// What the checks refused, and why.
#[derive(Debug, Clone)]
pub(crate) struct Rejection {
    pub table: String,
    pub type_name: String,
    pub refused: Refused,
    pub code: RejectCode,
    pub message: String,
}

/// The refused write: an upserted row, or a delete by id.
#[derive(Debug, Clone)]
pub(crate) enum Refused {
    /// A row of the table's rows (with provenance).
    Upsert(RowRef),
    /// A delete; `row` is what the reject records of it. `shard` is the
    /// partition a shard-conflict delete came from: deletes carry no record
    /// coordinates, so it is what tells two such refusals of one id apart.
    Delete {
        id: String,
        row: serde_json::Value,
        shard: Option<u32>,
    },
}

impl Rejection {
    /// The refusal of row `r.row` of `rows`.
    fn of_row(ty: &GraphType, rows: &RecordBatch, r: RefusedRow) -> Self {
        Self::upsert(ty, rows, r.row, r.code, r.message)
    }

    fn upsert(
        ty: &GraphType,
        rows: &RecordBatch,
        index: usize,
        code: RejectCode,
        message: String,
    ) -> Self {
        Rejection {
            table: ty.table.clone(),
            type_name: ty.name.clone(),
            refused: Refused::Upsert(RowRef {
                rows: rows.clone(),
                index,
            }),
            code,
            message,
        }
    }

    fn delete(
        ty: &GraphType,
        id: &str,
        row: serde_json::Value,
        code: RejectCode,
        message: String,
    ) -> Self {
        Self::delete_from(ty, id, row, None, code, message)
    }

    /// A refused delete that came from partition `shard`.
    fn delete_from(
        ty: &GraphType,
        id: &str,
        row: serde_json::Value,
        shard: Option<u32>,
        code: RejectCode,
        message: String,
    ) -> Self {
        Rejection {
            table: ty.table.clone(),
            type_name: ty.name.clone(),
            refused: Refused::Delete {
                id: id.to_string(),
                row,
                shard,
            },
            code,
            message,
        }
    }

    /// The id of the refused row or delete.
    pub(super) fn id(&self) -> Result<String> {
        match &self.refused {
            Refused::Upsert(r) => str_at(&r.rows, ID, r.index),
            Refused::Delete { id, .. } => Ok(id.clone()),
        }
    }

    /// The reject of fold `commit_id`. Its id is a function of the commit,
    /// the table, the refused row and the code, so a rolled-forward fold
    /// rejects under the same ids.
    pub(super) fn to_reject(&self, commit_id: &str, created_at: i64) -> Result<Reject> {
        let id = self.id()?;
        let (what, row, source) = match &self.refused {
            Refused::Upsert(r) => {
                let source = Provenance::of(&r.rows)?.source(r.index);
                ("upsert".to_string(), row_json(&r.rows, r.index), source)
            }
            Refused::Delete { row, shard, .. } => {
                let what = match shard {
                    Some(s) => format!("delete@{s}"),
                    None => "delete".to_string(),
                };
                (what, Some(row.to_string()), None)
            }
        };
        Ok(Reject::of_fold(FoldRefusal {
            commit_id,
            what: &format!("{}:{what}:{id}", self.table),
            type_name: &self.type_name,
            code: self.code,
            message: self.message.clone(),
            row,
            source,
            created_at,
        }))
    }
}

/// What the checks decided for one fold.
#[derive(Debug, Default, Clone)]
pub(crate) struct Checked {
    /// Per table (node, edge and `_pending/*` tables).
    pub changes: BTreeMap<String, Change>,
    /// In the order the checks met them.
    pub rejections: Vec<Rejection>,
}

/// The ids a fold's checks keep and refuse: two checks of the same read
/// agree when their decisions are equal.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Decision {
    rejected: BTreeSet<(String, String, &'static str)>,
    tables: BTreeMap<String, TableDecision>,
}

#[derive(Debug, PartialEq, Eq)]
struct TableDecision {
    /// Each written id with the partition its row came from: under
    /// partition sharding the same ids can be written from different
    /// partitions' rows (`home::rehome` follows the head's homes).
    upserts: BTreeSet<(String, Option<i32>)>,
    deletes: BTreeSet<String>,
    replace: Option<BTreeSet<String>>,
}

impl Checked {
    /// Rows of an id that one fold read from a second shard (`read`):
    /// refused as `shard_conflict`; the kept row (the lowest shard's, or
    /// after `home::rehome` the committed partition's) is the one the other
    /// checks saw.
    fn shard_conflicts(&mut self, ty: &GraphType, r: &Read) {
        const WHY: &str = "under wal.sharding = \"partition\" one id must always arrive on one \
            partition (producers key by the id, with one partitioner); the row from the id's \
            committed partition, or for a new id from the lowest partition, was kept";
        let mut refused = Vec::new();
        if let Some(rows) = &r.conflicts.upserts {
            for i in 0..rows.num_rows() {
                let m =
                    format!("this id also arrived on another partition in the same fold; {WHY}");
                refused.push(Rejection::upsert(ty, rows, i, RejectCode::ShardConflict, m));
            }
        }
        for (id, partition) in &r.conflicts.deletes {
            let m = format!(
                "this id's delete arrived on partition {partition} and the id also on another \
                 partition in the same fold; {WHY}"
            );
            let row = serde_json::json!({ ID: id, "_src_partition": partition });
            let code = RejectCode::ShardConflict;
            refused.push(Rejection::delete_from(
                ty,
                id,
                row,
                Some(*partition),
                code,
                m,
            ));
        }
        if refused.is_empty() {
            return;
        }
        self.changes.entry(ty.table.clone()).or_default().rejected += refused.len() as u64;
        self.rejections.extend(refused);
    }

    pub(super) fn decision(&self) -> Result<Decision> {
        let ids = |b: Option<&RecordBatch>| -> Result<BTreeSet<String>> {
            Ok(super::rows::id_set(b)?.into_iter().collect())
        };
        let mut tables = BTreeMap::new();
        for (t, c) in &self.changes {
            let replace = match &c.replace {
                Some(r) => Some(ids(Some(r))?),
                None => None,
            };
            let d = TableDecision {
                upserts: written(c.upserts.as_ref())?,
                deletes: c.deletes.iter().cloned().collect(),
                replace,
            };
            tables.insert(t.clone(), d);
        }
        let rejected = self
            .rejections
            .iter()
            .map(|r| Ok((r.table.clone(), r.id()?, r.code.as_str())))
            .collect::<Result<_>>()?;
        Ok(Decision { rejected, tables })
    }
}

/// (id, source partition) of each row of `rows`.
fn written(rows: Option<&RecordBatch>) -> Result<BTreeSet<(String, Option<i32>)>> {
    let Some(rows) = rows else {
        return Ok(BTreeSet::new());
    };
    let (ids, parts) = (strings(rows, ID)?, Provenance::partitions(rows)?);
    Ok((0..rows.num_rows())
        .map(|i| {
            let p = parts.is_valid(i).then(|| parts.value(i));
            (ids.value(i).to_string(), p)
        })
        .collect())
}

/// What the checks read besides the rows: the schema, the policies, the
/// fold's clock and the base view.
pub(crate) struct Ctx<'a> {
    pub schema: &'a GraphSchema,
    pub policies: &'a Policies,
    /// The fold's `created_at`: deferral times and deadlines count from it.
    pub now: i64,
    /// Edge tables whose deferred edges this fold retries.
    pub retry_pending: &'a [String],
    pub read: &'a ReadSet,
    pub view: &'a BaseView,
}

/// Node ids this fold adds and removes, per node table: what edge checks
/// see on top of the base.
#[derive(Debug, Default)]
pub(crate) struct FoldNodes {
    pub added: HashMap<String, HashSet<String>>,
    pub removed: HashMap<String, HashSet<String>>,
    /// Edge ids whose deletes cascade from node deletes, per edge table.
    pub cascade: HashMap<String, Vec<String>>,
}

/// Runs every check: node tables, then edge tables.
pub(crate) fn check(ctx: &Ctx<'_>) -> Result<Checked> {
    let mut out = Checked::default();
    let mut nodes = FoldNodes::default();
    for ty in ctx.schema.nodes() {
        let Some(read) = ctx.read.get(&ty.table) else {
            continue;
        };
        let homes = ctx.view.homes.get(&ty.table);
        let rehomed = match homes {
            Some(homes) => home::rehome(read, homes)?,
            None => None,
        };
        let read = rehomed.as_ref().unwrap_or(read);
        let homed = match homes {
            Some(homes) => home::off_home(ty, read, homes)?,
            None => None,
        };
        let (r, off_home) = match &homed {
            Some((kept, refused)) => (kept, refused.as_slice()),
            None => (read, &[][..]),
        };
        let n = nodes::check_node_table(ctx, ty, r)?;
        for (table, ids) in n.cascade {
            nodes.cascade.entry(table).or_default().extend(ids);
        }
        nodes.added.insert(ty.table.clone(), n.added);
        nodes.removed.insert(ty.table.clone(), n.removed);
        out.rejections.extend(n.rejections);
        out.changes.insert(ty.table.clone(), n.change);
        out.shard_conflicts(ty, r);
        if !off_home.is_empty() {
            let c = out.changes.entry(ty.table.clone()).or_default();
            c.rejected += off_home.len() as u64;
            out.rejections.extend(off_home.iter().cloned());
        }
    }
    for ty in ctx.schema.edges() {
        let cascaded = nodes.cascade.remove(&ty.table).unwrap_or_default();
        if let Some(r) = ctx.read.get(&ty.table) {
            out.shard_conflicts(ty, r);
        }
        let Some(e) = edges::check_edge_table(ctx, ty, &nodes, cascaded)? else {
            continue;
        };
        out.rejections.extend(e.rejections);
        let change = out.changes.entry(ty.table.clone()).or_default();
        let rejected = change.rejected;
        *change = e.change;
        change.rejected += rejected;
        if let Some(rows) = e.pending {
            out.changes.insert(
                pending_table(&ty.table),
                Change {
                    replace: Some(rows),
                    ..Default::default()
                },
            );
        }
    }
    Ok(out)
}
