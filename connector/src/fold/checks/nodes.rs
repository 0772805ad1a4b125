//! Node table checks: `@unique` of upserts, and deletes of nodes that
//! committed edges still reference (refused under `reject`, cascaded to the
//! edges under `cascade`).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::unique::unique_violations;
use super::view::no_ends;
use super::{Change, Ctx, Rejection};
use crate::config::DeletePolicy;
use crate::error::Result;
use crate::fold::read::Read;
use crate::fold::rows::id_set;
use crate::rejects::{refuse_rows, RejectCode};
use crate::schema::GraphType;

/// What the checks decided for one node table.
#[derive(Debug, Default)]
pub(crate) struct NodeOutcome {
    pub change: Change,
    pub rejections: Vec<Rejection>,
    /// Ids this fold upserts and deletes (after the checks).
    pub added: HashSet<String>,
    pub removed: HashSet<String>,
    /// Edge ids to delete with their nodes, per edge table.
    pub cascade: BTreeMap<String, Vec<String>>,
}

/// A committed edge referencing a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EdgeKey {
    pub table: String,
    pub id: String,
}

pub(crate) fn check_node_table(ctx: &Ctx<'_>, ty: &GraphType, r: &Read) -> Result<NodeOutcome> {
    let mut out = NodeOutcome::default();
    let mut upserts = r.upserts.clone();
    if let Some(rows) = &r.upserts {
        let base = ctx
            .view
            .uniques
            .get(&ty.table)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let bad = unique_violations(ty, rows, &r.deletes, base)?;
        if !bad.is_empty() {
            let refused = refuse_rows(rows, bad, |v| Rejection::of_row(ty, rows, v))?;
            out.change.rejected += refused.refused.len() as u64;
            out.rejections.extend(refused.refused);
            upserts = Some(refused.kept);
        }
    }
    let mut deletes = r.deletes.clone();
    if !deletes.is_empty() {
        let refs = referencing_edges(ctx, ty, &deletes)?;
        let mut refused = HashSet::new();
        for (node_id, edges) in refs {
            match ctx.policies.of(&ty.name).delete {
                DeletePolicy::Cascade => {
                    for e in edges {
                        out.cascade.entry(e.table).or_default().push(e.id);
                    }
                }
                DeletePolicy::Reject => {
                    out.rejections.push(referenced(ty, &node_id, &edges));
                    out.change.rejected += 1;
                    refused.insert(node_id);
                }
            }
        }
        deletes.retain(|d| !refused.contains(d));
    }
    out.added = id_set(upserts.as_ref())?;
    out.removed = deletes.iter().cloned().collect();
    out.change.upserts = upserts;
    out.change.deletes = deletes;
    Ok(out)
}

/// The refusal of a delete of `node_id`, which `edges` reference.
fn referenced(ty: &GraphType, node_id: &str, edges: &[EdgeKey]) -> Rejection {
    let sample: Vec<&str> = edges.iter().take(3).map(|e| e.id.as_str()).collect();
    let message = format!(
        "delete of {} {node_id:?} refused: {} committed edge(s) reference it (e.g. {}); on_delete_referenced = \"reject\"",
        ty.name,
        edges.len(),
        sample.join(", ")
    );
    let row = serde_json::json!({ "id": node_id });
    Rejection::delete(ty, node_id, row, RejectCode::Referenced, message)
}

/// Committed edges (in the view) that reference any of `nodes` of type
/// `node`, minus edges this fold deletes, grouped by node id.
pub(crate) fn referencing_edges(
    ctx: &Ctx<'_>,
    node: &GraphType,
    nodes: &[String],
) -> Result<BTreeMap<String, Vec<EdgeKey>>> {
    let wanted: HashSet<&str> = nodes.iter().map(String::as_str).collect();
    let mut out: BTreeMap<String, Vec<EdgeKey>> = BTreeMap::new();
    for e in ctx.schema.edges() {
        let ends = e.ends.as_ref().ok_or_else(|| no_ends(e))?;
        let (by_src, by_dst) = (ends.from == node.name, ends.to == node.name);
        if !by_src && !by_dst {
            continue;
        }
        let Some(links) = ctx.view.links.get(&e.table) else {
            continue;
        };
        let deleted: HashSet<&str> = ctx
            .read
            .get(&e.table)
            .map(|r| r.deletes.iter().map(String::as_str).collect())
            .unwrap_or_default();
        for l in links.iter().filter(|l| !deleted.contains(l.id.as_str())) {
            let mut hit = BTreeSet::new();
            if by_src {
                hit.insert(&l.src);
            }
            if by_dst {
                hit.insert(&l.dst);
            }
            for n in hit.into_iter().filter(|n| wanted.contains(n.as_str())) {
                let key = EdgeKey {
                    table: e.table.clone(),
                    id: l.id.clone(),
                };
                out.entry(n.clone()).or_default().push(key);
            }
        }
    }
    Ok(out)
}
