//! Recover: finds table versions committed by a fold that was never
//! published (after the versions the head pins) and finishes that fold from
//! the plan its commits carry, with the same rejects. Anything else after
//! the pins is refused, never guessed at.

use super::plan::FoldPlan;
use super::write::{only_reserves, PLAN_PROPERTY};
use super::{execute, Policies};
use crate::error::{Context, Error, Result};
use crate::graph::{Graph, GraphCommit};

/// Finishes an interrupted fold. Call before opening writers or folding anew.
pub(crate) async fn recover(graph: &Graph, policies: &Policies) -> Result<Option<GraphCommit>> {
    let Some(plan) = unpublished_plan(graph).await? else {
        return Ok(None);
    };
    tracing::warn!(commit = %plan.commit_id, "rolling forward a fold interrupted before its publish");
    execute(graph, policies, &plan)
        .await
        .map(|f| Some(f.commit))
}

/// The plan of the one unpublished fold, if any.
async fn unpublished_plan(graph: &Graph) -> Result<Option<FoldPlan>> {
    let head = graph.head().await?;
    let mut found: Option<FoldPlan> = None;
    for (table, &pinned) in &head.tables {
        let ds = graph.open_table(table, None).await?;
        let latest = ds.version().version;
        for v in (pinned + 1)..=latest {
            let txn = ds
                .read_transaction_by_version(v)
                .await
                .ctx(format!("read transaction {table}@{v}"))?;
            let plan_json = txn
                .as_ref()
                .and_then(|t| t.transaction_properties.as_ref())
                .and_then(|p| p.get(PLAN_PROPERTY).cloned());
            let Some(j) = plan_json else {
                if only_reserves(&ds, v).await? {
                    continue; // compaction's fragment-id reservation: no rows
                }
                return Err(Error::Corrupt(format!(
                    "{table} has version {v} after the published {pinned} that graphsink did not write; refusing to guess"
                )));
            };
            let p: FoldPlan = serde_json::from_str(&j)
                .map_err(|e| Error::Corrupt(format!("{table}@{v}: unreadable fold plan: {e}")))?;
            match &found {
                Some(f) if f.commit_id != p.commit_id => {
                    return Err(Error::Corrupt(format!(
                    "{table}@{v} belongs to unpublished fold {} while fold {} is also unpublished",
                    p.commit_id, f.commit_id
                )))
                }
                _ => found = Some(p),
            }
        }
    }
    Ok(found)
}
