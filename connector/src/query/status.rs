//! `status`: the head commit, deferred edges per edge type, the reject
//! count, and the consumer group's committed offset, end offset and lag per
//! mapped partition. It reads; it never joins the group.

use crate::config::Config;
use crate::error::{Context, Result};
use crate::graph::{Graph, GraphCommit};
use crate::kafka::queries::MissingTopic;
use crate::kafka::OffsetQueries;
use crate::retention::{graph_storage, TableStorage};
use crate::schema::REJECTS_TABLE;
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
pub async fn graph_status(config: &Config) -> Result<GraphStatus> {
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
    Ok(GraphStatus {
        head,
        now,
        pending,
        rejects,
        storage,
    })
}

/// Committed offsets of the config's group and watermarks of every
/// partition of the mapped topics.
pub async fn kafka_status(config: &Config) -> Result<KafkaStatus> {
    let queries = OffsetQueries::connect(config)?;
    let mut topics: Vec<String> = config.mappings.iter().map(|m| m.topic.clone()).collect();
    topics.sort();
    topics.dedup();
    let found = queries.partitions(topics).await?;
    let committed = queries.committed(found.partitions.clone()).await?;
    let marks = queries.watermarks(found.partitions.clone()).await?;
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
            partitions: vec![p(Some(3), 0, 10), p(None, 4, 10)],
            missing: vec![],
        };
        assert_eq!(k.total_lag(), 13);
    }
}
