//! Selecting rejects at the head commit (`rejects`, `replay-rejects`), with
//! the filters pushed into the Lance scan, and replaying their original
//! records. It knows the table's columns through `rejects`, not by hand.

use crate::config::Config;
use crate::error::{PublicResult, Result};
use crate::graph::{Graph, GraphCommit};
use crate::rejects::{self, Reject, Stage};
use crate::schema::REJECTS_TABLE;

/// Which rejects to select; every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RejectFilter {
    pub stage: Option<Stage>,
    pub type_name: Option<String>,
    /// At or after this time, epoch ms.
    pub since: Option<i64>,
}

impl RejectFilter {
    /// The filter as a Lance scan predicate (DataFusion SQL), if any.
    fn to_sql(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(s) = self.stage {
            parts.push(format!("stage = {}", sql_string(s.as_str())));
        }
        if let Some(t) = &self.type_name {
            parts.push(format!("type_name = {}", sql_string(t)));
        }
        if let Some(ms) = self.since {
            parts.push(format!("rejected_at >= {}", sql_timestamp(ms)));
        }
        (!parts.is_empty()).then(|| parts.join(" AND "))
    }
}

/// A SQL string literal.
fn sql_string(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A SQL timestamp literal of epoch milliseconds, in UTC. Lance parses it as
/// a zone-less timestamp, which DataFusion compares with the UTC column as
/// UTC.
fn sql_timestamp(ms: i64) -> String {
    let t = chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default();
    format!("TIMESTAMP '{}'", t.format("%Y-%m-%d %H:%M:%S%.3f"))
}

/// The rejects at the head commit that match `filter`, oldest first (by
/// `rejected_at`, then source coordinates).
pub async fn select(config: &Config, filter: &RejectFilter) -> PublicResult<Vec<Reject>> {
    let graph = Graph::open_configured(config).await?;
    let head = graph.head().await?;
    Ok(select_at(&graph, &head, filter).await?)
}

async fn select_at(
    graph: &Graph,
    head: &GraphCommit,
    filter: &RejectFilter,
) -> Result<Vec<Reject>> {
    let Some(&version) = head.tables.get(REJECTS_TABLE) else {
        return Ok(vec![]);
    };
    let ds = graph.open_table(REJECTS_TABLE, Some(version)).await?;
    scan_rejects(&ds, filter).await
}

async fn scan_rejects(ds: &lance::Dataset, filter: &RejectFilter) -> Result<Vec<Reject>> {
    let sql = filter.to_sql();
    let batches = crate::graph::scan(ds, sql.as_deref(), None).await?;
    let mut out = Vec::new();
    for b in &batches {
        out.extend(rejects::from_batch(b)?);
    }
    out.sort_by(|a, b| {
        (a.rejected_at, a.offset, &a.topic, a.partition, &a.reject_id).cmp(&(
            b.rejected_at,
            b.offset,
            &b.topic,
            b.partition,
            &b.reject_id,
        ))
    });
    Ok(out)
}

/// What `replay-rejects` would produce.
#[derive(Debug, Clone, Default)]
pub struct ReplaySelection {
    /// Oldest first.
    pub replay: Vec<Reject>,
    /// Selected but without an original record (fold rejects of deletes).
    pub skipped: usize,
}

/// The oldest `limit` (default all) rejects matching `filter`, split into
/// those with an original record and the rest.
pub async fn select_replay(
    config: &Config,
    filter: &RejectFilter,
    limit: Option<usize>,
) -> PublicResult<ReplaySelection> {
    let mut selected = select(config, filter).await?;
    if let Some(n) = limit {
        selected.truncate(n);
    }
    let (replay, skipped): (Vec<Reject>, Vec<Reject>) = selected
        .into_iter()
        .partition(|r| r.key.is_some() || r.value.is_some());
    Ok(ReplaySelection {
        replay,
        skipped: skipped.len(),
    })
}

/// Re-produces the original records of `rejects` to `topic`; every
/// delivery is awaited.
pub async fn replay(config: &Config, topic: &str, rejects: &[Reject]) -> PublicResult<()> {
    if rejects.is_empty() {
        return Ok(());
    }
    Ok(crate::kafka::produce::replay(config, topic, rejects).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rejects::{Origin, RejectCode};

    const NOW: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    #[test]
    fn filters_become_one_quoted_predicate() {
        assert_eq!(RejectFilter::default().to_sql(), None);
        let f = RejectFilter {
            stage: Some(Stage::Fold),
            type_name: Some("O'Brien".into()),
            since: Some(NOW + 5),
        };
        assert_eq!(
            f.to_sql().unwrap(),
            "stage = 'fold' AND type_name = 'O''Brien' \
             AND rejected_at >= TIMESTAMP '2026-01-01 00:00:00.005'"
        );
    }

    fn reject(offset: i64, ty: &str, code: RejectCode, at: i64) -> Reject {
        let mut r = Reject::of_record(
            Origin {
                topic: "t".into(),
                partition: 0,
                offset,
                key: Some(b"k".to_vec()),
                value: Some(vec![0xff]),
                ..Default::default()
            },
            ty,
            code,
            "m",
            None,
        );
        r.rejected_at = at;
        r
    }

    /// The predicate runs as a Lance scan filter against the table layout,
    /// including the timestamp literal against the UTC column.
    #[tokio::test]
    async fn filters_push_down_into_a_lance_scan() {
        let dir = tempfile::tempdir().unwrap();
        let uri = dir.path().join("rejects").to_str().unwrap().to_string();
        let rows = vec![
            reject(3, "Person", RejectCode::Range, NOW + 2),
            reject(1, "Person", RejectCode::MalformedJson, NOW),
            reject(2, "Knows", RejectCode::Enum, NOW + 1),
            reject(0, "Person", RejectCode::Check, NOW - 1),
        ];
        let batch = rejects::to_batch(&rows);
        let schema = batch.schema();
        let ds = lance::Dataset::write(
            arrow::array::RecordBatchIterator::new(vec![Ok(batch)], schema),
            &uri,
            None,
        )
        .await
        .unwrap();
        let offsets = |v: Vec<Reject>| v.iter().map(|r| r.offset.unwrap()).collect::<Vec<_>>();
        let all = scan_rejects(&ds, &RejectFilter::default()).await.unwrap();
        assert_eq!(offsets(all), vec![0, 1, 2, 3]);
        let f = RejectFilter {
            stage: Some(Stage::Validate),
            type_name: Some("Person".into()),
            since: Some(NOW),
        };
        assert_eq!(offsets(scan_rejects(&ds, &f).await.unwrap()), vec![3]);
        let f = RejectFilter {
            since: Some(NOW + 1),
            ..Default::default()
        };
        assert_eq!(offsets(scan_rejects(&ds, &f).await.unwrap()), vec![2, 3]);
    }
}
