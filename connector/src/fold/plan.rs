//! Plan: decides everything one fold will do before its first table commit —
//! which flushed generations of which shards it merges, which deferred edges
//! it retries, and which table versions (the parent commit's) it checks
//! against. The plan travels in every table commit of the fold.

use std::collections::{BTreeMap, HashMap};

use lance::Dataset;
use serde::{Deserialize, Serialize};

use super::rows::{pending_since, read_all};
use super::Policies;
use crate::error::{Context, PublicResult, Result};
use crate::graph::{new_commit_id, Graph, GraphCommit};
use crate::offsets::WrittenSpans;
use crate::schema::{pending_table, PENDING_SINCE};
use crate::shards;
use crate::types::{now_ms, OffsetRange, PartitionOffsets};

/// Everything one fold will do, decided before its first table commit.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FoldPlan {
    pub commit_id: String,
    pub parent: String,
    pub actor: String,
    pub created_at: i64,
    /// Nodes before edges, so edge checks can see this fold's nodes.
    pub tables: Vec<TablePlan>,
    pub offsets: Vec<OffsetRange>,
    /// Table versions of the parent commit: what validation reads.
    #[serde(default)]
    pub base: BTreeMap<String, u64>,
    /// Edge tables whose deferred edges this fold retries.
    #[serde(default)]
    pub retry_pending: Vec<String>,
    /// Newest commit whose fold rejects all reached the dead-letter topic.
    #[serde(default)]
    pub dead_letters_delivered: u64,
    /// The process that planned it (`shards::holder`).
    #[serde(default)]
    pub folder: Option<String>,
    /// `GraphCommit::dead_letter_since`: the parent's, raised by the
    /// folder to the dead-letter offsets it has seen.
    #[serde(default)]
    pub dead_letter_since: PartitionOffsets,
    /// The grace for which `on_missing_endpoint = "reject"` was deferred
    /// (`Policies::deferring_rejects`: partition sharding, the folder not
    /// holding every partition). Part of the plan because every execution
    /// of it, a roll-forward by another member included, must check alike:
    /// tables written before an interruption are not written again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defer_rejects_ms: Option<u64>,
}

impl FoldPlan {
    /// The policies this plan is checked under: `config`'s, with rejects
    /// deferred when the folder that planned it deferred them.
    pub(crate) fn policies<'a>(&self, config: &'a Policies) -> std::borrow::Cow<'a, Policies> {
        match self.defer_rejects_ms {
            Some(ms) => std::borrow::Cow::Owned(
                config.deferring_rejects(std::time::Duration::from_millis(ms)),
            ),
            None => std::borrow::Cow::Borrowed(config),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TablePlan {
    pub table: String,
    pub shards: Vec<ShardPlan>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShardPlan {
    pub bucket: u32,
    pub shard: uuid::Uuid,
    /// The compacted marker before this fold.
    pub after: u64,
    /// Highest generation this fold merges (the new marker).
    pub upto: u64,
    /// `(generation, path under _mem_wal/<shard>/)`, ascending.
    pub generations: Vec<(u64, String)>,
}

/// Which generations a fold may take: everything flushed (`None`), or, in
/// the running connector, what its last freeze cut covered.
pub(super) type Cut = Option<HashMap<uuid::Uuid, u64>>;

/// Plans a fold of every flushed, not yet compacted generation (within the
/// cut). `None` when there is nothing to fold.
pub async fn plan(
    graph: &Graph,
    policies: &Policies,
    head: &GraphCommit,
    cut: &Cut,
    spans: &WrittenSpans,
    actor: &str,
) -> PublicResult<Option<FoldPlan>> {
    let mut tables = Vec::new();
    for table in graph.wal_tables() {
        let shards = plan_table(graph, &table, cut).await?;
        if !shards.is_empty() {
            tables.push(TablePlan { table, shards });
        }
    }
    let now = now_ms();
    let retry_pending = pending_to_retry(graph, policies, head, &tables, now).await?;
    if tables.is_empty() && retry_pending.is_empty() {
        return Ok(None);
    }
    Ok(Some(FoldPlan {
        commit_id: new_commit_id(),
        parent: head.id.clone(),
        actor: actor.to_string(),
        created_at: now,
        tables,
        offsets: spans.ranges(),
        base: head.tables.clone(),
        retry_pending,
        dead_letters_delivered: head.dead_letters_delivered,
        folder: Some(shards::holder()),
        dead_letter_since: head.dead_letter_since.clone(),
        defer_rejects_ms: None,
    }))
}

/// The shards of `table` with flushed generations past their compacted
/// marker (and within the cut).
async fn plan_table(graph: &Graph, table: &str, cut: &Cut) -> Result<Vec<ShardPlan>> {
    let ds = graph.open_table(table, None).await?;
    let compacted = shards::compacted_markers(&ds).await?;
    let mut out = Vec::new();
    for bucket in 0..graph.layout().counts[table] {
        let shard = shards::shard_id(table, bucket);
        let limit = match cut {
            Some(c) => match c.get(&shard) {
                Some(&u) => u,
                None => continue,
            },
            None => u64::MAX,
        };
        let after = compacted.get(&shard).copied().unwrap_or(0);
        let Some(m) = shards::latest_manifest(&ds, shard).await? else {
            continue;
        };
        let mut generations: Vec<(u64, String)> = m
            .sstables
            .iter()
            .filter(|s| s.generation > after && s.generation <= limit)
            .map(|s| (s.generation, s.path.clone()))
            .collect();
        generations.sort();
        if let Some(&(upto, _)) = generations.last() {
            out.push(ShardPlan {
                bucket,
                shard,
                after,
                upto,
                generations,
            });
        }
    }
    Ok(out)
}

/// Deferred edges are retried when nodes changed, when their own table is
/// folded, or when one is due.
async fn pending_to_retry(
    graph: &Graph,
    policies: &Policies,
    head: &GraphCommit,
    tables: &[TablePlan],
    now: i64,
) -> Result<Vec<String>> {
    let nodes_changed = tables.iter().any(|t| t.table.starts_with("nodes/"));
    let mut out = Vec::new();
    for e in graph.schema.edges() {
        let pt = pending_table(&e.table);
        let Some(&v) = head.tables.get(&pt) else {
            continue;
        };
        let ds = graph.open_table(&pt, Some(v)).await?;
        if ds.count_rows(None).await.ctx(&pt)? == 0 {
            continue;
        }
        let deadline = policies.of(&e.name).deadline_ms;
        let oldest = oldest_pending(&ds).await?;
        let due = oldest.is_some_and(|o| o + deadline <= now);
        if nodes_changed || due || tables.iter().any(|t| t.table == e.table) {
            out.push(e.table.clone());
        }
    }
    Ok(out)
}

/// When the oldest edge of a `_pending/<Edge>` table was first deferred.
pub(crate) async fn oldest_pending(ds: &Dataset) -> Result<Option<i64>> {
    let mut oldest: Option<i64> = None;
    for b in read_all(ds, Some(&[PENDING_SINCE])).await? {
        if let Some(m) = arrow::compute::min(pending_since(&b)?) {
            oldest = Some(oldest.map_or(m, |o| o.min(m)));
        }
    }
    Ok(oldest)
}
