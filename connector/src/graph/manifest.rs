//! The `__manifest` commit log: the head, immutable commits, table
//! versions, and the dead-letter delivery mark. Publishing is a
//! compare-and-swap on the head.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, Int64Array, RecordBatch, RecordBatchIterator, StringArray,
    TimestampMillisecondArray, UInt64Array,
};
use futures::TryStreamExt;
use lance::dataset::{MergeInsertBuilder, WhenMatched, WhenNotMatched};
use lance::Dataset;
use serde::{Deserialize, Serialize};

use crate::error::{Context, Error, PublicResult, Result};
use crate::schema::{manifest_schema, MANIFEST_PK, MANIFEST_TABLE};
pub(super) use crate::types::OffsetRange;
use crate::types::{now_ms, PartitionOffsets};

use super::Graph;

const HEAD_ID: &str = "graph_head:main";
/// Newest commit whose fold rejects all reached the dead-letter topic.
const DELIVERED_ID: &str = "dead_letters:main";

/// One published graph commit: a version of every table, and what the fold
/// that produced it folded.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GraphCommit {
    pub id: String,
    pub seq: u64,
    pub parent: Option<String>,
    pub actor: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    /// Table path → pinned Lance version (every table of the graph).
    pub tables: BTreeMap<String, u64>,
    #[serde(default)]
    pub folded: Vec<FoldedShard>,
    #[serde(default)]
    pub offsets: Vec<OffsetRange>,
    #[serde(default)]
    pub stats: BTreeMap<String, TableStats>,
    /// Newest commit (seq) whose fold rejects all reached the dead-letter topic.
    #[serde(default)]
    pub dead_letters_delivered: u64,
    /// The process that folded it (`<host> pid <pid>`): with several
    /// members, which one folded (`graphsink status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
    /// Dead-letter offsets known before this commit was published: every
    /// produce of its fold rejects lands at or past them, so a re-delivery
    /// reads from here to skip what a crashed folder already produced.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub dead_letter_since: PartitionOffsets,
    /// The schema version every row of this commit was written under: 0
    /// is the schema the graph was created with, each schema commit adds
    /// one (docs/schema-evolution.md).
    #[serde(default)]
    pub schema_version: u32,
    /// Set on a schema commit only: what it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_change: Option<SchemaChange>,
}

/// What a schema commit changed: the `.pg` before and after, and the plan
/// it applied, one line per change (`graphsink log` prints them).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SchemaChange {
    pub before: String,
    pub after: String,
    pub changes: Vec<String>,
}

/// Generations `(after, upto]` of one shard merged by a commit.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FoldedShard {
    pub table: String,
    pub bucket: u32,
    pub shard: uuid::Uuid,
    pub after_generation: u64,
    pub upto_generation: u64,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TableStats {
    pub upserted: u64,
    pub deleted: u64,
    /// Rows this commit refused at fold time (fold rejects).
    #[serde(default)]
    pub rejected: u64,
}

impl Graph {
    pub async fn head(&self) -> PublicResult<GraphCommit> {
        let ds = self.open_manifest().await?;
        Ok(self.head_at(&ds).await?)
    }

    async fn head_at(&self, ds: &Dataset) -> Result<GraphCommit> {
        let head = read_rows(ds, &format!("object_id = '{HEAD_ID}'")).await?;
        let row = head
            .first()
            .ok_or_else(|| Error::Corrupt(format!("{}: no graph head", self.root)))?;
        if row.payload.is_some() {
            return parse_commit(row);
        }
        let id = row
            .commit_id
            .clone()
            .ok_or_else(|| Error::Corrupt(format!("{}: graph head names no commit", self.root)))?;
        self.commit_at(ds, &id).await
    }

    pub async fn commit(&self, id: &str) -> PublicResult<GraphCommit> {
        let ds = self.open_manifest().await?;
        Ok(self.commit_at(&ds, id).await?)
    }

    async fn commit_at(&self, ds: &Dataset, id: &str) -> Result<GraphCommit> {
        let id = id.replace('\'', "");
        let rows = read_rows(ds, &format!("object_id = 'graph_commit:{id}'")).await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::NotFound(format!("graph commit {id}")))?;
        parse_commit(row)
    }

    /// The dead-letter delivery mark: every fold reject of commits up to
    /// this seq was produced.
    pub async fn dead_letters_delivered(&self) -> PublicResult<u64> {
        let ds = self.open_manifest().await?;
        let head = self.head_at(&ds).await?;
        let rows = read_rows(&ds, &format!("object_id = '{DELIVERED_ID}'")).await?;
        let mark = rows
            .first()
            .and_then(|r| r.payload.as_deref())
            .and_then(|p| p.parse::<u64>().ok())
            .unwrap_or(0);
        Ok(mark.max(head.dead_letters_delivered))
    }

    /// Records the delivery mark (not a graph commit: readers never see it).
    pub(crate) async fn set_dead_letters_delivered(&self, seq: u64) -> Result<()> {
        let ds = self.open_manifest().await?;
        let mut rows = ManifestRows::default();
        rows.push(ManifestRow {
            object_id: DELIVERED_ID.into(),
            kind: "dead_letters",
            seq: Some(seq as i64),
            created_at: Some(now_ms()),
            payload: Some(seq.to_string()),
            ..Default::default()
        });
        let batch = rows.into_batch();
        let mut b = MergeInsertBuilder::try_new(Arc::new(ds), vec![MANIFEST_PK.into()])
            .ctx("dead-letter mark")?;
        b.when_matched(WhenMatched::UpdateAll)
            .when_not_matched(WhenNotMatched::InsertAll);
        b.try_build()
            .ctx("dead-letter mark")?
            .execute_reader(RecordBatchIterator::new(
                vec![Ok(batch.clone())],
                batch.schema(),
            ))
            .await
            .ctx("record dead-letter mark")?;
        Ok(())
    }

    /// All commits, newest first.
    pub async fn commits(&self) -> PublicResult<Vec<GraphCommit>> {
        let ds = self.open_manifest().await?;
        let mut out: Vec<GraphCommit> = read_rows(&ds, "kind = 'graph_commit'")
            .await?
            .iter()
            .map(parse_commit)
            .collect::<Result<_>>()?;
        out.sort_by_key(|c| std::cmp::Reverse(c.seq));
        Ok(out)
    }

    /// Publishes `commit` as the new head if the head is still its parent.
    /// Lance's merge-insert runs with no conflict retries, so a publisher
    /// racing on the head row loses with a conflict instead of overwriting.
    pub(crate) async fn publish(&self, commit: &GraphCommit) -> Result<()> {
        let ds = self.open_manifest().await?;
        self.publish_on(ds, commit, ManifestRows::default()).await
    }

    /// `publish`, writing `more` rows in the same Lance commit (a schema
    /// commit and its schema record move together).
    pub(super) async fn publish_with(
        &self,
        commit: &GraphCommit,
        more: ManifestRows,
    ) -> Result<()> {
        let ds = self.open_manifest().await?;
        self.publish_on(ds, commit, more).await
    }

    /// `publish` against `__manifest` as of `version`, as a publisher that
    /// read the head there would. Lets tests race two publishers exactly
    /// (`testing::publish_from_version`).
    pub(crate) async fn publish_from_version(
        &self,
        version: u64,
        commit: &GraphCommit,
    ) -> Result<()> {
        let ds = self.open_table(MANIFEST_TABLE, Some(version)).await?;
        self.publish_on(ds, commit, ManifestRows::default()).await
    }

    /// Merges `__manifest`'s small fragments once there are more than
    /// `over`. Only the fold loop calls it, right after its own publish, so
    /// it never races a publisher of this process; another publisher that
    /// loses to it rebases like any lost race.
    pub(crate) async fn compact_manifest(&self, over: usize) -> Result<()> {
        let mut ds = self.open_manifest().await?;
        if ds.get_fragments().len() <= over {
            return Ok(());
        }
        lance::dataset::optimize::compact_files(
            &mut ds,
            lance::dataset::optimize::CompactionOptions::default(),
            None,
        )
        .await
        .ctx("compact __manifest")?;
        Ok(())
    }

    /// The manifest's current version (`testing::manifest_version`).
    pub(crate) async fn manifest_version(&self) -> Result<u64> {
        Ok(self.open_manifest().await?.version().version)
    }

    async fn publish_on(
        &self,
        ds: Dataset,
        commit: &GraphCommit,
        more: ManifestRows,
    ) -> Result<()> {
        let head = self.head_at(&ds).await?;
        if Some(&head.id) != commit.parent.as_ref() {
            return Err(Error::CommitConflict {
                expected: commit.parent.clone().unwrap_or_default(),
                found: head.id,
            });
        }
        let mut rows = more;
        rows.push_commit(commit);
        let batch = rows.into_batch();
        let mut b =
            MergeInsertBuilder::try_new(Arc::new(ds), vec![MANIFEST_PK.into()]).ctx("publish")?;
        b.when_matched(WhenMatched::UpdateAll)
            .when_not_matched(WhenNotMatched::InsertAll)
            .conflict_retries(0);
        let job = b.try_build().ctx("publish")?;
        job.execute_reader(RecordBatchIterator::new(
            vec![Ok(batch.clone())],
            batch.schema(),
        ))
        .await
        .map_err(|e| {
            if is_commit_conflict(&e) {
                Error::CommitConflict {
                    expected: head.id.clone(),
                    found: "a concurrent publish".into(),
                }
            } else {
                Error::Lance {
                    context: "publish graph commit".into(),
                    source: e,
                }
            }
        })?;
        Ok(())
    }
}

pub fn new_commit_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

fn is_commit_conflict(e: &lance::Error) -> bool {
    matches!(
        e,
        lance::Error::CommitConflict { .. }
            | lance::Error::RetryableCommitConflict { .. }
            | lance::Error::TooMuchWriteContention { .. }
    )
}

#[derive(Debug, Default, Clone)]
pub(super) struct ManifestRow {
    pub(super) object_id: String,
    pub(super) kind: &'static str,
    pub(super) commit_id: Option<String>,
    pub(super) seq: Option<i64>,
    pub(super) table_name: Option<String>,
    pub(super) table_version: Option<u64>,
    pub(super) created_at: Option<i64>,
    pub(super) payload: Option<String>,
}

#[derive(Debug, Default)]
pub(super) struct ManifestRows(Vec<ManifestRow>);

impl ManifestRows {
    pub(super) fn push(&mut self, r: ManifestRow) {
        self.0.push(r);
    }

    /// The head pointer, the immutable commit row, and one row per table version.
    pub(super) fn push_commit(&mut self, c: &GraphCommit) {
        let base = ManifestRow {
            commit_id: Some(c.id.clone()),
            seq: Some(c.seq as i64),
            created_at: Some(c.created_at),
            ..Default::default()
        };
        // The head carries a copy of its commit, so reading it is one lookup.
        let payload = Some(serde_json::to_string(c).expect("serializable"));
        self.push(ManifestRow {
            object_id: HEAD_ID.into(),
            kind: "graph_head",
            payload: payload.clone(),
            ..base.clone()
        });
        self.push(ManifestRow {
            object_id: format!("graph_commit:{}", c.id),
            kind: "graph_commit",
            payload,
            ..base.clone()
        });
        for (table, version) in &c.tables {
            self.push(ManifestRow {
                object_id: format!("table_version:{table}:{version}"),
                kind: "table_version",
                table_name: Some(table.clone()),
                table_version: Some(*version),
                ..base.clone()
            });
        }
    }

    pub(super) fn into_batch(self) -> RecordBatch {
        let r = &self.0;
        let strs = |f: &dyn Fn(&ManifestRow) -> Option<&str>| -> ArrayRef {
            Arc::new(r.iter().map(f).collect::<StringArray>())
        };
        let cols: Vec<ArrayRef> = vec![
            strs(&|x| Some(x.object_id.as_str())),
            strs(&|x| Some(x.kind)),
            strs(&|x| x.commit_id.as_deref()),
            Arc::new(r.iter().map(|x| x.seq).collect::<Int64Array>()),
            strs(&|x| x.table_name.as_deref()),
            Arc::new(r.iter().map(|x| x.table_version).collect::<UInt64Array>()),
            Arc::new(
                r.iter()
                    .map(|x| x.created_at)
                    .collect::<TimestampMillisecondArray>()
                    .with_timezone("UTC"),
            ),
            strs(&|x| x.payload.as_deref()),
        ];
        RecordBatch::try_new(manifest_schema(), cols).expect("manifest columns match")
    }
}

/// Every row of `ds` that passes `filter` (SQL, pushed into the scan),
/// with only `columns` when given.
pub(crate) async fn scan(
    ds: &Dataset,
    filter: Option<&str>,
    columns: Option<&[&str]>,
) -> Result<Vec<RecordBatch>> {
    let what = || format!("scan {} where {}", ds.uri(), filter.unwrap_or("true"));
    let mut scan = ds.scan();
    if let Some(f) = filter {
        scan.filter(f).ctx(what())?;
    }
    if let Some(c) = columns {
        scan.project(c).ctx(what())?;
    }
    scan.try_into_stream()
        .await
        .ctx(what())?
        .try_collect()
        .await
        .ctx(what())
}

pub(super) async fn read_rows(ds: &Dataset, filter: &str) -> Result<Vec<ManifestRow>> {
    let columns = [MANIFEST_PK, "commit_id", "payload"];
    let batches = scan(ds, Some(filter), Some(&columns)).await?;
    let mut out = Vec::new();
    for b in batches {
        let col = |name: &str| -> Result<&StringArray> {
            b.column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<StringArray>())
                .ok_or_else(|| Error::Corrupt(format!("__manifest lacks column {name}")))
        };
        let (ids, commits, payloads) = (col(MANIFEST_PK)?, col("commit_id")?, col("payload")?);
        for i in 0..b.num_rows() {
            let opt = |a: &StringArray| (!a.is_null(i)).then(|| a.value(i).to_string());
            out.push(ManifestRow {
                object_id: ids.value(i).to_string(),
                commit_id: opt(commits),
                payload: opt(payloads),
                ..Default::default()
            });
        }
    }
    Ok(out)
}

fn parse_commit(row: &ManifestRow) -> Result<GraphCommit> {
    let payload = row
        .payload
        .as_deref()
        .ok_or_else(|| Error::Corrupt(format!("{} has no payload", row.object_id)))?;
    serde_json::from_str(payload)
        .map_err(|e| Error::Corrupt(format!("{}: unreadable commit: {e}", row.object_id)))
}
