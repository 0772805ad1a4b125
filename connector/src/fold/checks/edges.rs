//! Edge table checks: candidates (deferred edges, then this fold's), their
//! endpoints (committed at the base ∪ this fold's nodes − its deletes, each
//! of its declared type), deferral with `max_pending_edges`, then `@card`
//! and `@unique` of the resolved edges, and the rewrite of `_pending/<Edge>`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, TimestampMillisecondArray};

use super::card::card_check;
use super::unique::unique_violations;
use super::view::{no_ends, node_table};
use super::{Change, Ctx, FoldNodes, Rejection};
use crate::config::EndpointPolicy;
use crate::error::{Context, Result};
use crate::fold::policy::TypePolicy;
use crate::fold::rows::{rows_of, str_at, RowRef};
use crate::rejects::{refuse_rows, RejectCode};
use crate::schema::{pending_schema, pending_table, EdgeEnds, GraphType, ID};

/// What the checks decided for one edge table.
#[derive(Debug, Default)]
pub(crate) struct EdgeOutcome {
    pub change: Change,
    pub rejections: Vec<Rejection>,
    /// The new rows of its `_pending/` table, when they changed.
    pub pending: Option<RecordBatch>,
}

/// An edge this fold considers: a deferred one or one it read.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub row: RowRef,
    pub id: String,
    /// When it was first deferred (this fold's time for a new edge).
    pub since: i64,
    /// Read from this fold's WAL (not only deferred before).
    pub fresh: bool,
}

/// Where the candidates went.
#[derive(Debug, Default)]
pub(crate) struct Resolution {
    pub resolved: Vec<RowRef>,
    pub deferred: Vec<Candidate>,
    pub rejections: Vec<Rejection>,
}

/// Checks one edge table; `None` when the fold does not touch it.
pub(crate) fn check_edge_table(
    ctx: &Ctx<'_>,
    ty: &GraphType,
    nodes: &FoldNodes,
    cascaded: Vec<String>,
) -> Result<Option<EdgeOutcome>> {
    let r = ctx.read.get(&ty.table);
    let retry = ctx.retry_pending.contains(&ty.table);
    if r.is_none() && !retry && cascaded.is_empty() {
        return Ok(None);
    }
    let new_rows = r.and_then(|r| r.upserts.as_ref());
    let deletes = r.map(|r| r.deletes.clone()).unwrap_or_default();
    let ends = ty.ends.as_ref().ok_or_else(|| no_ends(ty))?;
    let policy = ctx.policies.of(&ty.name);
    let cands = candidates(ctx, ty, new_rows, &deletes)?;
    let mut res = resolve_endpoints(ctx, ty, ends, policy, nodes, cands)?;
    let mut out = EdgeOutcome::default();
    let overflow = bound_pending(ty, ctx.policies.max_pending_edges, &mut res.deferred)?;
    out.change.rejected += (res.rejections.len() + overflow.len()) as u64;
    out.rejections.append(&mut res.rejections);
    out.rejections.extend(overflow);
    let resolved = rows_of(&ty.table_schema, &res.resolved)?;
    let kept = constrain(ctx, ty, ends, resolved, deletes, cascaded)?;
    out.change.rejected += kept.rejections.len() as u64;
    out.rejections.extend(kept.rejections);
    out.change.upserts = kept.upserts.filter(|u| u.num_rows() > 0);
    out.change.deletes = kept.deletes;
    out.pending = pending_rewrite(ctx, ty, &res.deferred)?;
    Ok(Some(out))
}

/// What `@card` and `@unique` keep of an edge table's writes.
#[derive(Debug, Default)]
pub(crate) struct Constrained {
    pub upserts: Option<RecordBatch>,
    /// Explicit deletes `@card` lets through, then the cascaded ones.
    pub deletes: Vec<String>,
    /// Refused deletes (`@card` min), then refused rows (`@card` max, `@unique`).
    pub rejections: Vec<Rejection>,
}

/// `@card` and `@unique` of the resolved edges and the deletes, over the base.
fn constrain(
    ctx: &Ctx<'_>,
    ty: &GraphType,
    ends: &EdgeEnds,
    resolved: Option<RecordBatch>,
    deletes: Vec<String>,
    cascaded: Vec<String>,
) -> Result<Constrained> {
    let rows = resolved
        .clone()
        .unwrap_or_else(|| RecordBatch::new_empty(ty.table_schema.clone()));
    let empty = Default::default();
    let base = ctx.view.card.get(&ty.table).unwrap_or(&empty);
    let card = card_check(ty, ends, &rows, deletes, &cascaded, base)?;
    let mut out = Constrained {
        rejections: card.refused,
        ..Default::default()
    };
    let mut upserts = resolved;
    if let Some(resolved) = &upserts {
        // `@card` first; a row over it is refused once, for that.
        let mut dropped: BTreeSet<usize> = card.over.iter().map(|v| v.row).collect();
        let mut bad = card.over;
        let all_deletes: Vec<String> = card.deletes.iter().chain(&cascaded).cloned().collect();
        let held = ctx
            .view
            .uniques
            .get(&ty.table)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for v in unique_violations(ty, resolved, &all_deletes, held)? {
            if dropped.insert(v.row) {
                bad.push(v);
            }
        }
        if !bad.is_empty() {
            let refused = refuse_rows(resolved, bad, |v| Rejection::of_row(ty, resolved, v))?;
            out.rejections.extend(refused.refused);
            upserts = Some(refused.kept);
        }
    }
    out.upserts = upserts;
    out.deletes = card.deletes;
    out.deletes.extend(cascaded);
    Ok(out)
}

/// Deferred edges first, then this fold's rows (a newer row of an id
/// replaces the older and keeps its first deferral time); explicit deletes
/// drop their edge.
pub(crate) fn candidates(
    ctx: &Ctx<'_>,
    ty: &GraphType,
    new_rows: Option<&RecordBatch>,
    deletes: &[String],
) -> Result<Vec<Candidate>> {
    let explicit: HashSet<&str> = deletes.iter().map(String::as_str).collect();
    let mut cand: Vec<Candidate> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut push = |rows: &RecordBatch, index: usize, since: i64, fresh: bool| -> Result<()> {
        let id = str_at(rows, ID, index)?;
        if explicit.contains(id.as_str()) {
            return Ok(());
        }
        let row = RowRef {
            rows: rows.clone(),
            index,
        };
        match seen.get(&id) {
            Some(&k) => {
                let since = cand[k].since.min(since);
                cand[k] = Candidate {
                    row,
                    id,
                    since,
                    fresh,
                };
            }
            None => {
                seen.insert(id.clone(), cand.len());
                cand.push(Candidate {
                    row,
                    id,
                    since,
                    fresh,
                });
            }
        }
        Ok(())
    };
    if let Some(p) = ctx.view.pending.get(&ty.table) {
        for i in 0..p.rows.num_rows() {
            push(&p.rows, i, p.since[i], false)?;
        }
    }
    if let Some(b) = new_rows {
        for i in 0..b.num_rows() {
            push(b, i, ctx.now, true)?;
        }
    }
    Ok(cand)
}

/// Whether node `id` of type `node` exists after this fold.
fn node_exists(ctx: &Ctx<'_>, nodes: &FoldNodes, table: &str, id: &str) -> bool {
    let added = nodes.added.get(table).is_some_and(|a| a.contains(id));
    let removed = nodes.removed.get(table).is_some_and(|r| r.contains(id));
    added || (ctx.view.has_node(table, id) && !removed)
}

/// Sorts candidates into resolved (both endpoints exist), deferred, and
/// rejected (`on_missing_endpoint = "reject"`, or past the deadline).
pub(crate) fn resolve_endpoints(
    ctx: &Ctx<'_>,
    ty: &GraphType,
    ends: &EdgeEnds,
    policy: TypePolicy,
    nodes: &FoldNodes,
    cands: Vec<Candidate>,
) -> Result<Resolution> {
    let (from, to) = (
        node_table(ctx.schema, &ends.from)?,
        node_table(ctx.schema, &ends.to)?,
    );
    let mut out = Resolution::default();
    for c in cands {
        let src = str_at(&c.row.rows, "src", c.row.index)?;
        let dst = str_at(&c.row.rows, "dst", c.row.index)?;
        let src_ok = node_exists(ctx, nodes, &from, &src);
        let dst_ok = node_exists(ctx, nodes, &to, &dst);
        if src_ok && dst_ok {
            out.resolved.push(c.row);
            continue;
        }
        let missing = match (src_ok, dst_ok) {
            (false, false) => format!("src {} {src:?} and dst {} {dst:?}", ends.from, ends.to),
            (false, true) => format!("src {} {src:?}", ends.from),
            _ => format!("dst {} {dst:?}", ends.to),
        };
        let overdue = ctx.now - c.since >= policy.deadline_ms;
        if policy.endpoint != EndpointPolicy::Reject && !overdue {
            out.deferred.push(c);
            continue;
        }
        let why = if policy.endpoint == EndpointPolicy::Reject {
            "on_missing_endpoint = \"reject\"".to_string()
        } else {
            format!(
                "still missing after the endpoint_deadline of {} ms",
                policy.deadline_ms
            )
        };
        let message = format!("edge {} {:?}: {missing} not found ({why})", ty.name, c.id);
        let rej = Rejection::upsert(
            ty,
            &c.row.rows,
            c.row.index,
            RejectCode::EndpointNotFound,
            message,
        );
        out.rejections.push(rej);
    }
    Ok(out)
}

/// Bounds the deferred edges to `max`: the oldest go first, rejected.
pub(crate) fn bound_pending(
    ty: &GraphType,
    max: usize,
    deferred: &mut Vec<Candidate>,
) -> Result<Vec<Rejection>> {
    if deferred.len() <= max {
        return Ok(vec![]);
    }
    deferred.sort_by(|a, b| (a.since, &a.id).cmp(&(b.since, &b.id)));
    let over = deferred.len() - max;
    let message = format!(
        "more than errors.max_pending_edges = {max} edges of {} wait for endpoints; the oldest is rejected",
        ty.name
    );
    Ok(deferred
        .drain(..over)
        .map(|c| {
            Rejection::upsert(
                ty,
                &c.row.rows,
                c.row.index,
                RejectCode::PendingOverflow,
                message.clone(),
            )
        })
        .collect())
}

/// The new rows of the edge type's `_pending/` table, when its set changed
/// (ids or deferral times) or this fold rewrote a deferred edge.
fn pending_rewrite(
    ctx: &Ctx<'_>,
    ty: &GraphType,
    deferred: &[Candidate],
) -> Result<Option<RecordBatch>> {
    let before: BTreeSet<(String, i64)> = match ctx.view.pending.get(&ty.table) {
        Some(p) => (0..p.rows.num_rows())
            .map(|i| Ok((str_at(&p.rows, ID, i)?, p.since[i])))
            .collect::<Result<_>>()?,
        None => BTreeSet::new(),
    };
    let after: BTreeSet<(String, i64)> = deferred.iter().map(|c| (c.id.clone(), c.since)).collect();
    if before == after && !deferred.iter().any(|c| c.fresh) {
        return Ok(None);
    }
    let rows = rows_of(&ty.table_schema, deferred.iter().map(|c| &c.row))?;
    let mut cols: Vec<ArrayRef> = match rows {
        Some(r) => r.columns().to_vec(),
        None => ty
            .table_schema
            .fields()
            .iter()
            .map(|f| arrow::array::new_empty_array(f.data_type()))
            .collect(),
    };
    let since: TimestampMillisecondArray = deferred.iter().map(|c| Some(c.since)).collect();
    cols.push(Arc::new(since.with_timezone("UTC")));
    RecordBatch::try_new(pending_schema(ty), cols)
        .map(Some)
        .ctx(pending_table(&ty.table))
}
