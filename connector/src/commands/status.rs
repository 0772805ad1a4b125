//! `status`: the head commit, deferred edges per edge type, the reject
//! count, storage, each MemWAL shard's writer epoch and fold progress; the
//! consumer group's members with their partitions, and its committed
//! offset, end offset and lag per mapped partition. It reads; it never
//! joins the group or claims a shard.

use crate::config::Config;
use crate::error::{Context, PublicResult, Result};
use crate::graph::{Graph, GraphCommit};
use crate::kafka::queries::{GroupMembers, MissingTopic};
use crate::kafka::OffsetQueries;
use crate::retention::{graph_storage, TableStorage};
use crate::schema::REJECTS_TABLE;
use crate::shards::{self, latest_manifest, shard_owner, ShardOwner};
use crate::types::now_ms;

/// The graph side of `status`, at the head commit.
#[derive(Debug, Clone)]
pub struct GraphStatus {
    pub head: GraphCommit,
    /// When the status was taken (epoch ms), for ages.
    pub now: i64,
    pub pending: Vec<PendingStatus>,
    /// Rows of `_ingest_rejects`.
    pub rejects: usize,
    /// Bytes per table by kind (base, WAL, generations, old versions),
    /// `__manifest` last.
    pub storage: Vec<TableStorage>,
    /// Every MemWAL shard, by table then bucket.
    pub shards: Vec<ShardState>,
    /// Each folding process's newest commit, newest first (commits from
    /// before the folder was recorded are left out).
    pub last_folds: Vec<LastFold>,
}

/// The newest commit one process folded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LastFold {
    pub folder: String,
    pub seq: u64,
    pub created_at: i64,
}

/// One MemWAL shard: who last claimed it (its epoch) and how far the
/// published graph has folded it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ShardState {
    pub table: String,
    pub bucket: u32,
    pub shard: uuid::Uuid,
    /// The epoch of the shard's last writer: each claim (a `run` session
    /// opening its writers, an offline `fold`) raises it by one.
    pub writer_epoch: u64,
    /// The generation its live memtable will flush as.
    pub current_generation: u64,
    /// Generations up to this one are in the head commit's tables.
    pub folded_upto: u64,
    /// Flushed generations the head has not folded yet.
    pub unfolded: usize,
    /// The process that claimed the shard at `writer_epoch`, when it left
    /// a note (`None`: no note, one from an older epoch, or unreadable).
    /// It may have exited since: nothing clears a note.
    pub owner: Option<ShardOwner>,
}

impl GraphStatus {
    pub fn pending_total(&self) -> usize {
        self.pending.iter().map(|p| p.count).sum()
    }
}

/// Deferred edges of one edge type.
#[derive(Debug, Clone)]
pub struct PendingStatus {
    pub edge: String,
    pub table: String,
    pub count: usize,
    /// `_pending_since` of the oldest, epoch ms.
    pub oldest: Option<i64>,
}

/// One mapped partition as the group sees it.
#[derive(Debug, Clone)]
pub struct PartitionStatus {
    pub topic: String,
    pub partition: i32,
    pub committed: Option<i64>,
    pub low: i64,
    pub end: i64,
}

impl PartitionStatus {
    /// Records the group has yet to commit; all retained ones before its
    /// first commit (`auto.offset.reset = earliest`).
    pub fn lag(&self) -> i64 {
        (self.end - self.committed.unwrap_or(self.low)).max(0)
    }
}

/// The Kafka side of `status`.
#[derive(Debug, Clone)]
pub struct KafkaStatus {
    pub group: String,
    /// The group's members and what each holds; the error text if the
    /// coordinator could not be asked (offsets and lag still show).
    pub members: std::result::Result<GroupMembers, String>,
    pub partitions: Vec<PartitionStatus>,
    /// Mapped topics the broker does not know.
    pub missing: Vec<MissingTopic>,
}

impl KafkaStatus {
    pub fn total_lag(&self) -> i64 {
        self.partitions.iter().map(PartitionStatus::lag).sum()
    }
}

/// The head commit, its deferred edges and its reject count.
pub async fn graph_status(config: &Config) -> PublicResult<GraphStatus> {
    let graph = Graph::open_configured(config).await?;
    let head = graph.head().await?;
    let now = now_ms();
    let mut pending = Vec::new();
    for (table, &version) in head
        .tables
        .iter()
        .filter(|(t, _)| t.starts_with("_pending/"))
    {
        let ds = graph.open_table(table, Some(version)).await?;
        let count = ds.count_rows(None).await.ctx(table)?;
        let oldest = if count > 0 {
            crate::fold::oldest_pending(&ds).await?
        } else {
            None
        };
        pending.push(PendingStatus {
            edge: table.trim_start_matches("_pending/").to_string(),
            table: table.clone(),
            count,
            oldest,
        });
    }
    let rejects = match head.tables.get(REJECTS_TABLE) {
        Some(&v) => graph
            .open_table(REJECTS_TABLE, Some(v))
            .await?
            .count_rows(None)
            .await
            .ctx(REJECTS_TABLE)?,
        None => 0,
    };
    let storage = graph_storage(&graph).await?;
    let shards = shard_states(&graph, &head).await?;
    let last_folds = last_folds(&graph.commits().await?);
    Ok(GraphStatus {
        head,
        now,
        pending,
        rejects,
        storage,
        shards,
        last_folds,
    })
}

/// The newest commit of each folder, from commits newest first.
fn last_folds(commits: &[GraphCommit]) -> Vec<LastFold> {
    let mut seen = std::collections::BTreeSet::new();
    commits
        .iter()
        .filter_map(|c| {
            let f = c.folder.as_ref()?;
            seen.insert(f.clone()).then(|| LastFold {
                folder: f.clone(),
                seq: c.seq,
                created_at: c.created_at,
            })
        })
        .collect()
}

/// Each MemWAL shard of the head's tables, from its stored manifest (not a
/// writer's view) and the marker at the head's pinned version.
async fn shard_states(graph: &Graph, head: &GraphCommit) -> Result<Vec<ShardState>> {
    let mut out = Vec::new();
    for t in shards::of_commit(graph, head).await? {
        for s in t.shards() {
            let (bucket, shard) = (s.bucket, s.id);
            let folded_upto = s.folded_upto.unwrap_or(0);
            let m = latest_manifest(&t.ds, shard).await?;
            let writer_epoch = m.as_ref().map_or(0, |m| m.writer_epoch);
            // A note is informational: one that cannot be read is shown as
            // unknown rather than failing the whole status.
            let owner = match shard_owner(graph, shard).await {
                Ok(o) => o.filter(|o| o.epoch == writer_epoch),
                Err(e) => {
                    tracing::warn!(%shard, error = %e, "cannot read the shard's owner note");
                    None
                }
            };
            out.push(ShardState {
                table: t.table.clone(),
                bucket,
                shard,
                writer_epoch,
                current_generation: m.as_ref().map_or(0, |m| m.current_generation),
                folded_upto,
                unfolded: m.as_ref().map_or(0, |m| {
                    m.sstables
                        .iter()
                        .filter(|g| g.generation > folded_upto)
                        .count()
                }),
                owner,
            });
        }
    }
    Ok(out)
}

/// Committed offsets of the config's group and watermarks of every
/// partition of the mapped topics.
pub async fn kafka_status(config: &Config) -> PublicResult<KafkaStatus> {
    let queries = OffsetQueries::connect(config)?;
    let mut topics: Vec<String> = config.mappings.iter().map(|m| m.topic.clone()).collect();
    topics.sort();
    topics.dedup();
    let found = queries.partitions(topics).await?;
    let committed = queries.committed(found.partitions.clone()).await?;
    let marks = queries.watermarks(found.partitions.clone()).await?;
    let members = queries.members().await.map_err(|e| e.to_string());
    let partitions = found
        .partitions
        .into_iter()
        .filter_map(|tp| {
            let w = marks.get(&tp)?;
            Some(PartitionStatus {
                committed: committed.get(&tp).copied(),
                low: w.low,
                end: w.high,
                topic: tp.0,
                partition: tp.1,
            })
        })
        .collect();
    Ok(KafkaStatus {
        group: queries.group().to_string(),
        members,
        partitions,
        missing: found.missing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_counts_from_the_commit_or_the_first_retained_record() {
        let p = |committed, low, end| PartitionStatus {
            topic: "t".into(),
            partition: 0,
            committed,
            low,
            end,
        };
        assert_eq!(p(Some(3), 0, 10).lag(), 7);
        assert_eq!(p(None, 4, 10).lag(), 6);
        // tansu 0.6 can report an end below the commit.
        assert_eq!(p(Some(12), 0, 10).lag(), 0);
        let k = KafkaStatus {
            group: "g".into(),
            members: Ok(Default::default()),
            partitions: vec![p(Some(3), 0, 10), p(None, 4, 10)],
            missing: vec![],
        };
        assert_eq!(k.total_lag(), 13);
    }
}
