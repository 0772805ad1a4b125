//! Recover: finds table versions committed by a fold that was never
//! published (after the versions the head pins) and finishes that fold from
//! the plan its commits carry, with the same rejects. A fold another folder
//! superseded (it published first, from the same generations or with
//! checks that now decide otherwise) cannot be finished: its writes are
//! reverted instead, and the next fold takes what is left. Anything else
//! after the pins is refused, never guessed at.

use lance::dataset::transaction::Operation;

use super::plan::FoldPlan;
use super::write::{only_reserves, pass_of, PLAN_PROPERTY};
use super::{execute, Policies};
use crate::error::{Context, Error, Result};
use crate::graph::{Graph, GraphCommit};

/// Finishes an interrupted fold. Call before opening writers or folding anew.
pub(crate) async fn recover(graph: &Graph, policies: &Policies) -> Result<Option<GraphCommit>> {
    let Some(plan) = unpublished_plan(graph).await? else {
        return Ok(None);
    };
    let head = graph.head().await?;
    if head.id != plan.parent && superseded(graph, &head, &plan).await? {
        // Another folder published a fold of some of the same generations
        // (two folders at once; a frozen one's late write). They may be
        // deleted since (retention), and rolling forward would be refused.
        tracing::warn!(
            commit = %plan.commit_id,
            "an interrupted fold was superseded: another folder published a fold of its generations; \
             reverting its table writes (the next fold takes what is left on the new head)"
        );
        revert_to_head(graph, &plan).await?;
        return Ok(None);
    }
    tracing::warn!(commit = %plan.commit_id, "rolling forward a fold interrupted before its publish");
    match execute(graph, policies, &plan).await.map_err(Error::from) {
        Ok(f) => Ok(Some(f.commit)),
        // Two folders at once (a hand-off, a folder that was frozen): the
        // other published first. Rolling forward would meet the same
        // refusal on every start (a stale compaction marker, or checks that
        // disagree on the new head), so its writes go; its generations stay
        // unfolded under the head's markers. A race on an unmoved head is
        // passing: the error stands, and the next start rolls forward.
        Err(e) if e.is_commit_race() && graph.head().await?.id != plan.parent => {
            tracing::warn!(
                commit = %plan.commit_id, error = %e,
                "another folder published first and this interrupted fold cannot follow it; \
                 reverting its table writes (the next fold takes its rows on the new head)"
            );
            revert_to_head(graph, &plan).await?;
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Whether the head has folded past where `plan` started on any of its
/// shards: its markers there are above the plan's `after`.
async fn superseded(graph: &Graph, head: &GraphCommit, plan: &FoldPlan) -> Result<bool> {
    for tp in &plan.tables {
        let Some(&pinned) = head.tables.get(&tp.table) else {
            continue;
        };
        let ds = graph.open_table(&tp.table, Some(pinned)).await?;
        let markers = crate::shards::compacted_markers(&ds).await?;
        if tp
            .shards
            .iter()
            .any(|s| markers.get(&s.shard).copied().unwrap_or(0) > s.after)
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Restores every table that `plan` wrote past the head's pins to its
/// pinned version (Lance `Restore`: a new version with the old content).
/// Only the plan's own versions are reverted: any other past the pins (the
/// winner's next fold) makes it refuse. Lance rebases a Restore over a
/// concurrent commit, which would wipe that commit from the content: if one
/// landed meanwhile (a stopped folder resuming), the restore is undone and
/// recovery refuses, loudly.
async fn revert_to_head(graph: &Graph, plan: &FoldPlan) -> Result<()> {
    let head = graph.head().await?;
    for (table, &pinned) in &head.tables {
        let ds = graph.open_table(table, None).await?;
        let latest = ds.version().version;
        if latest <= pinned {
            continue;
        }
        for v in (pinned + 1)..=latest {
            if pass_of(&ds, v, &plan.commit_id).await?.is_none() && !only_reserves(&ds, v).await? {
                return Err(Error::Corrupt(format!(
                    "{table}@{v} is not a write of superseded fold {}; refusing to revert it",
                    plan.commit_id
                )));
            }
        }
        let mut at = graph.open_table(table, Some(pinned)).await?;
        at.restore()
            .await
            .ctx(format!("revert {table} to version {pinned}"))?;
        let restored = at.version().version;
        if restored != latest + 1 {
            let mut back = graph.open_table(table, Some(restored - 1)).await?;
            back.restore()
                .await
                .ctx(format!("undo the revert of {table}"))?;
            return Err(Error::Corrupt(format!(
                "{table}: versions {}..={} were committed while a superseded fold was reverted; \
                 the revert is undone, refusing to guess",
                latest + 1,
                restored - 1
            )));
        }
        tracing::info!(table = %table, pinned, voided = latest - pinned, "reverted a superseded fold's writes");
    }
    Ok(())
}

/// The plan of the one unpublished fold, if any.
async fn unpublished_plan(graph: &Graph) -> Result<Option<FoldPlan>> {
    let head = graph.head().await?;
    let mut found: Option<FoldPlan> = None;
    for (table, &pinned) in &head.tables {
        let ds = graph.open_table(table, None).await?;
        let latest = ds.version().version;
        // This table's unpublished plan, as of its latest version.
        let mut here: Option<FoldPlan> = None;
        for v in (pinned + 1)..=latest {
            let txn = ds
                .read_transaction_by_version(v)
                .await
                .ctx(format!("read transaction {table}@{v}"))?;
            // `revert_to_head`: everything before it is void.
            if let Some(Operation::Restore { version }) = txn.as_ref().map(|t| &t.operation) {
                if *version == pinned {
                    here = None;
                    continue;
                }
                return Err(Error::Corrupt(format!(
                    "{table}@{v} restores unpublished version {version}; refusing to guess"
                )));
            }
            let plan_json = txn
                .as_ref()
                .and_then(|t| t.transaction_properties.as_ref())
                .and_then(|p| p.get(PLAN_PROPERTY).cloned());
            let Some(j) = plan_json else {
                if only_reserves(&ds, v).await? {
                    continue; // compaction's fragment-id reservation: no rows
                }
                if is_schema_change(txn.as_ref().map(|t| &t.operation)) {
                    // A schema change not yet committed (`graph/migrate.rs`):
                    // no rows; the next start with the new schema finishes it.
                    continue;
                }
                return Err(Error::Corrupt(format!(
                    "{table} has version {v} after the published {pinned} that graphsink did not write; refusing to guess"
                )));
            };
            let p: FoldPlan = serde_json::from_str(&j)
                .map_err(|e| Error::Corrupt(format!("{table}@{v}: unreadable fold plan: {e}")))?;
            only_one(&mut here, p, &format!("{table}@{v}"))?;
        }
        if let Some(p) = here {
            only_one(&mut found, p, table)?;
        }
    }
    Ok(found)
}

/// Whether a table version only changed its schema: `add_columns` of
/// all-null columns (a `Merge`) or a nullability change (a `Project`), the
/// two a schema change makes.
fn is_schema_change(op: Option<&Operation>) -> bool {
    matches!(
        op,
        Some(Operation::Merge { .. } | Operation::Project { .. })
    )
}

/// Keeps `p` as the one unpublished plan, refusing a second one.
fn only_one(held: &mut Option<FoldPlan>, p: FoldPlan, at: &str) -> Result<()> {
    if let Some(f) = held.as_ref().filter(|f| f.commit_id != p.commit_id) {
        return Err(Error::Corrupt(format!(
            "{at} belongs to unpublished fold {} while fold {} is also unpublished",
            p.commit_id, f.commit_id
        )));
    }
    *held = Some(p);
    Ok(())
}
