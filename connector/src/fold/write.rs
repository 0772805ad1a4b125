//! Write: merges each table's checked change into the base table — a delete
//! pass and an upsert pass (merge-insert on the primary key), or an
//! overwrite for `_pending/*` — with the plan and the pass's stats in each
//! commit's transaction properties, the shards' compacted markers on the
//! last pass, and compaction of small fragments inside the fold.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow::compute::concat_batches;
use arrow_schema::{DataType, Field, Schema};
use lance::dataset::{
    CommitBuilder, InsertBuilder, MergeInsertBuilder, WhenMatched, WhenNotMatched, WriteMode,
    WriteParams,
};
use lance::Dataset;
use lance_index::mem_wal::CompactedSsTable;
use serde::{Deserialize, Serialize};

use super::checks::Change;
use super::plan::{FoldPlan, TablePlan};
use super::read::ReadSet;
use super::rows::{pk_of, strings};
use crate::error::{Context, Result};
use crate::failpoints;
use crate::graph::{Graph, TableStats};
use crate::offsets::WrittenSpans;
use crate::rejects::{self, Reject};
use crate::schema::{Provenance, ID, REJECTS_TABLE};
use crate::store::Store;
use crate::types::OffsetRange;

/// The fold plan, in every table commit of the fold (what `recover` reads).
pub(super) const PLAN_PROPERTY: &str = "graphsink.fold_plan";
/// One pass's `TableOutcome`, in the same commits.
const STATS_PROPERTY: &str = "graphsink.fold_stats";
/// A table is compacted inside the fold that leaves it with more fragments
/// than this: every fold adds one or two, and merge-insert, scans and
/// `__manifest` reads all grow with the fragment count, not with the rows.
pub const COMPACT_FRAGMENTS: usize = 16;

/// What one table's writes of a fold did, recorded with each pass.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct TableOutcome {
    #[serde(skip)]
    pub version: u64,
    pub stats: TableStats,
    /// Offsets of the folded upserts, from their provenance columns: covers
    /// rows replayed from the WAL, which the run loop never saw.
    pub offsets: Vec<OffsetRange>,
    /// The table's last pass of this fold: once committed, the table is done.
    #[serde(default)]
    pub last: bool,
}

/// Per table, what the fold's writes did.
pub(crate) type Outcomes = BTreeMap<String, TableOutcome>;

/// Adds `_ingest_rejects` to the changes: the sync rejects the fold read
/// (stamped with its commit) and its own fold rejects.
pub(crate) fn with_rejects(
    mut changes: BTreeMap<String, Change>,
    plan: &FoldPlan,
    read: &ReadSet,
    fold_rejects: &[Reject],
) -> Result<BTreeMap<String, Change>> {
    let mut rows = match read.get(REJECTS_TABLE).and_then(|r| r.upserts.as_ref()) {
        Some(r) => Some(stamp_commit(r, &plan.commit_id)?),
        None => None,
    };
    if !fold_rejects.is_empty() {
        let mine = rejects::to_batch(fold_rejects);
        rows = Some(match rows {
            Some(r) => concat_batches(&mine.schema(), &[r, mine]).ctx("rejects")?,
            None => mine,
        });
    }
    if rows.is_some() || plan.tables.iter().any(|t| t.table == REJECTS_TABLE) {
        let change = Change {
            upserts: rows,
            ..Default::default()
        };
        changes.insert(REJECTS_TABLE.to_string(), change);
    }
    Ok(changes)
}

/// Sync rejects get the commit that folds them.
fn stamp_commit(rows: &RecordBatch, commit_id: &str) -> Result<RecordBatch> {
    let i = rows.schema().index_of("graph_commit").ctx("rejects")?;
    let mut cols = rows.columns().to_vec();
    cols[i] = Arc::new(StringArray::from(vec![commit_id; rows.num_rows()]));
    RecordBatch::try_new(rows.schema(), cols).ctx("rejects")
}

/// Writes every change (BTreeMap order puts `_ingest_rejects` and
/// `_pending/*` first; order does not matter for correctness, since the
/// checks are done).
pub(crate) async fn write_all(
    graph: &Graph,
    plan: &FoldPlan,
    changes: BTreeMap<String, Change>,
) -> Result<Outcomes> {
    let mut outcomes = Outcomes::new();
    for (table, change) in changes {
        let tp = plan.tables.iter().find(|t| t.table == table);
        let outcome = write_table(graph, plan, &table, tp, change).await?;
        outcomes.insert(table, outcome);
    }
    Ok(outcomes)
}

/// The node ids each node table of `changes` gains and loses, for the
/// tables whose ids the fold keeps at the plan's base version.
pub(crate) fn node_id_changes(
    graph: &Graph,
    plan: &FoldPlan,
    changes: &BTreeMap<String, Change>,
) -> Result<Vec<NodeIdChange>> {
    let mut out = Vec::new();
    for ty in graph.schema.nodes() {
        let (Some(c), Some(&base)) = (changes.get(&ty.table), plan.base.get(&ty.table)) else {
            continue;
        };
        let Some(kept) = graph.known_ids.at(&ty.table, base) else {
            continue;
        };
        out.push(NodeIdChange {
            table: ty.table.clone(),
            base,
            added: added_ids(c.upserts.as_ref(), kept.is_homed())?,
            removed: c.deletes.clone(),
        });
    }
    Ok(out)
}

/// The ids of `upserts`, each with its source partition when `homed`.
fn added_ids(upserts: Option<&RecordBatch>, homed: bool) -> Result<Vec<(String, Option<u32>)>> {
    let Some(rows) = upserts else {
        return Ok(Vec::new());
    };
    let ids = strings(rows, ID)?;
    let parts = homed.then(|| Provenance::partitions(rows)).transpose()?;
    Ok((0..rows.num_rows())
        .filter(|&i| ids.is_valid(i))
        .map(|i| {
            let home = parts.and_then(|p| p.is_valid(i).then(|| p.value(i) as u32));
            (ids.value(i).to_string(), home)
        })
        .collect())
}

/// What one fold does to the ids of one node table.
pub(crate) struct NodeIdChange {
    table: String,
    base: u64,
    added: Vec<(String, Option<u32>)>,
    removed: Vec<String>,
}

/// Moves the kept node ids of each changed table to the version the fold
/// wrote, when every Lance commit since the base is this fold's (else a
/// commit the fold did not make could have changed the ids: forgotten).
pub(crate) async fn advance_node_ids(
    graph: &Graph,
    plan: &FoldPlan,
    changes: Vec<NodeIdChange>,
    outcomes: &Outcomes,
) {
    for c in changes {
        let Some(to) = outcomes.get(&c.table).map(|o| o.version) else {
            continue;
        };
        match only_ours(graph, &c.table, c.base, to, &plan.commit_id).await {
            Ok(true) => graph.known_ids.advance(
                &c.table,
                c.base,
                to,
                c.added.iter().map(|(id, home)| (id.as_str(), *home)),
                c.removed.iter().map(String::as_str),
            ),
            Ok(false) => graph.known_ids.forget(&c.table),
            Err(e) => {
                tracing::debug!(table = %c.table, error = %e, "cannot read the fold's commits; node ids forgotten");
                graph.known_ids.forget(&c.table);
            }
        }
    }
}

/// Whether every commit of `table` after version `from` up to `to` carries
/// plan `commit_id`.
async fn only_ours(
    graph: &Graph,
    table: &str,
    from: u64,
    to: u64,
    commit_id: &str,
) -> Result<bool> {
    let ds = graph.open_table(table, Some(to)).await?;
    for v in from + 1..=to {
        if pass_of(&ds, v, commit_id).await?.is_none() && !only_reserves(&ds, v).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// One table's writes: what every pass shares.
struct TableWrite<'a> {
    table: &'a str,
    store: &'a Store,
    pk: &'static str,
    plan_json: String,
    markers: Vec<CompactedSsTable>,
}

/// Writes one table's change; the last pass carries the compacted markers
/// of the plan's shards. Idempotent: a table whose last pass of this plan
/// is committed is not written again.
async fn write_table(
    graph: &Graph,
    plan: &FoldPlan,
    table: &str,
    tp: Option<&TablePlan>,
    change: Change,
) -> Result<TableOutcome> {
    let ds = graph.open_table(table, None).await?;
    if let Some(mut done) = committed_outcome(&ds, &plan.commit_id)
        .await?
        .filter(|o| o.last)
    {
        // Written by this plan before a crash: recover its stats.
        done.version = ds.version().version;
        return Ok(done);
    }
    let w = TableWrite {
        table,
        store: graph.store(),
        pk: pk_of(&graph.schema, table)?,
        plan_json: serde_json::to_string(plan).expect("serializable"),
        markers: tp
            .map(|tp| {
                tp.shards
                    .iter()
                    .map(|s| CompactedSsTable::new(s.shard, s.upto))
                    .collect()
            })
            .unwrap_or_default(),
    };
    let ds = Arc::new(ds);
    if let Some(rows) = change.replace {
        return w.overwrite(ds, rows).await;
    }
    let ds = w.merge(ds, change).await?;
    let ds = w.compact(ds).await?;
    // Sum every pass of this plan, including passes of a crashed attempt.
    let mut outcome = committed_outcome(&ds, &plan.commit_id)
        .await?
        .unwrap_or_default();
    outcome.version = ds.version().version;
    Ok(outcome)
}

impl TableWrite<'_> {
    /// Replaces the table's rows (a `_pending/` table) in one commit.
    async fn overwrite(&self, ds: Arc<Dataset>, rows: RecordBatch) -> Result<TableOutcome> {
        let pass = TableOutcome {
            stats: TableStats {
                upserted: rows.num_rows() as u64,
                ..Default::default()
            },
            last: true,
            ..Default::default()
        };
        let params = WriteParams {
            transaction_properties: Some(Arc::new(pass_properties(&self.plan_json, &pass))),
            ..self.store.write_params(WriteMode::Overwrite)
        };
        let written = InsertBuilder::new(ds)
            .with_params(&params)
            .execute(vec![rows])
            .await
            .ctx(format!("rewrite {}", self.table))?;
        let mut out = pass;
        out.version = written.version().version;
        Ok(out)
    }

    /// The delete pass, then the upsert pass.
    async fn merge(&self, mut ds: Arc<Dataset>, change: Change) -> Result<Arc<Dataset>> {
        let upserts = change.upserts.filter(|u| u.num_rows() > 0);
        // A table whose rows were all rejected still advances its markers: a
        // delete pass of no key that exists carries them.
        let deletes = if change.deletes.is_empty() && upserts.is_none() {
            vec![String::new()]
        } else {
            change.deletes
        };
        if !deletes.is_empty() {
            let last = upserts.is_none();
            let rejected = if last { change.rejected } else { 0 };
            ds = self.delete_pass(ds, deletes, last, rejected).await?;
            failpoints::hit(failpoints::FOLD_BETWEEN_PASSES)?;
        }
        if let Some(rows) = upserts {
            ds = self.upsert_pass(ds, rows, change.rejected).await?;
        }
        Ok(ds)
    }

    async fn delete_pass(
        &self,
        ds: Arc<Dataset>,
        deletes: Vec<String>,
        last: bool,
        rejected: u64,
    ) -> Result<Arc<Dataset>> {
        let keys = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new(
                self.pk,
                DataType::Utf8,
                false,
            )])),
            vec![Arc::new(StringArray::from(deletes)) as ArrayRef],
        )
        .ctx("delete keys")?;
        let mut b =
            MergeInsertBuilder::try_new(ds.clone(), vec![self.pk.into()]).ctx(self.table)?;
        // No scalar index: graphsink builds none, and looking for one logs a
        // spurious ERROR for the MemWAL index (Lance 14 `load_scalar_index`).
        b.when_matched(WhenMatched::Delete)
            .when_not_matched(WhenNotMatched::DoNothing)
            .use_index(false)
            .conflict_retries(0);
        if last && !self.markers.is_empty() {
            b.mark_sstables_as_compacted(self.markers.clone());
        }
        let staged = b
            .try_build()
            .ctx(self.table)?
            .execute_uncommitted_batches(vec![keys])
            .await
            .ctx(format!("fold deletes into {}", self.table))?;
        let pass = TableOutcome {
            stats: TableStats {
                deleted: staged.stats.num_deleted_rows,
                rejected,
                upserted: 0,
            },
            last,
            ..Default::default()
        };
        let ds = commit_staged(ds, staged.transaction, &self.plan_json, &pass).await?;
        Ok(Arc::new(ds))
    }

    async fn upsert_pass(
        &self,
        ds: Arc<Dataset>,
        rows: RecordBatch,
        rejected: u64,
    ) -> Result<Arc<Dataset>> {
        let offsets = if self.table == REJECTS_TABLE {
            vec![]
        } else {
            provenance_ranges(&rows)?
        };
        let mut b =
            MergeInsertBuilder::try_new(ds.clone(), vec![self.pk.into()]).ctx(self.table)?;
        b.when_matched(WhenMatched::UpdateAll)
            .when_not_matched(WhenNotMatched::InsertAll)
            .use_index(false)
            .conflict_retries(0);
        if !self.markers.is_empty() {
            b.mark_sstables_as_compacted(self.markers.clone());
        }
        let staged = b
            .try_build()
            .ctx(self.table)?
            .execute_uncommitted_batches(vec![rows])
            .await
            .ctx(format!("fold upserts into {}", self.table))?;
        let pass = TableOutcome {
            stats: TableStats {
                upserted: staged.stats.num_inserted_rows + staged.stats.num_updated_rows,
                deleted: 0,
                rejected,
            },
            offsets,
            last: true,
            ..Default::default()
        };
        let ds = commit_staged(ds, staged.transaction, &self.plan_json, &pass).await?;
        Ok(Arc::new(ds))
    }

    /// Keeps fold cost flat in history: small fragments are merged in a
    /// commit of this plan, so recovery knows it as the fold's own.
    async fn compact(&self, ds: Arc<Dataset>) -> Result<Arc<Dataset>> {
        if ds.get_fragments().len() <= COMPACT_FRAGMENTS {
            return Ok(ds);
        }
        let mut d = Arc::try_unwrap(ds).unwrap_or_else(|a| (*a).clone());
        let pass = TableOutcome {
            last: true,
            ..Default::default()
        };
        let options = lance::dataset::optimize::CompactionOptions::default()
            .transaction_properties(pass_properties(&self.plan_json, &pass));
        lance::dataset::optimize::compact_files(&mut d, options, None)
            .await
            .ctx(format!("compact {}", self.table))?;
        Ok(Arc::new(d))
    }
}

fn pass_properties(plan_json: &str, pass: &TableOutcome) -> HashMap<String, String> {
    HashMap::from([
        (PLAN_PROPERTY.to_string(), plan_json.to_string()),
        (
            STATS_PROPERTY.to_string(),
            serde_json::to_string(pass).expect("serializable"),
        ),
    ])
}

async fn commit_staged(
    ds: Arc<Dataset>,
    mut txn: lance::dataset::transaction::Transaction,
    plan_json: &str,
    pass: &TableOutcome,
) -> Result<Dataset> {
    txn.transaction_properties = Some(Arc::new(pass_properties(plan_json, pass)));
    CommitBuilder::new(ds.clone())
        .execute(txn)
        .await
        .ctx(format!("commit fold into {}", ds.uri()))
}

/// The sum of what every commit of fold `commit_id` recorded in this table
/// (its passes, including those of an attempt that crashed).
/// The transaction properties of version `v` of `ds`, when that commit is
/// a pass of plan `commit_id`.
pub(crate) async fn pass_of(
    ds: &Dataset,
    v: u64,
    commit_id: &str,
) -> Result<Option<HashMap<String, String>>> {
    let txn = ds.read_transaction_by_version(v).await.ctx(ds.uri())?;
    let props = txn.and_then(|t| t.transaction_properties);
    Ok(props.map(|p| (*p).clone()).filter(|p| {
        p.get(PLAN_PROPERTY)
            .and_then(|p| serde_json::from_str::<FoldPlan>(p).ok())
            .is_some_and(|p| p.commit_id == commit_id)
    }))
}

/// Lance's compaction reserves fragment ids in a commit of its own before
/// its rewrite commit, and that commit carries no properties. It changes
/// no rows, so folds and recovery pass over it; a crash between the two
/// left one behind that recovery refused as foreign (found by
/// graphsink-chaos).
pub(crate) async fn only_reserves(ds: &Dataset, v: u64) -> Result<bool> {
    let txn = ds.read_transaction_by_version(v).await.ctx(ds.uri())?;
    Ok(txn.is_some_and(|t| {
        matches!(
            t.operation,
            lance::dataset::transaction::Operation::ReserveFragments { .. }
        )
    }))
}

async fn committed_outcome(ds: &Dataset, commit_id: &str) -> Result<Option<TableOutcome>> {
    let mut total: Option<TableOutcome> = None;
    for v in (1..=ds.version().version).rev() {
        let Some(props) = pass_of(ds, v, commit_id).await? else {
            if only_reserves(ds, v).await? {
                continue;
            }
            break;
        };
        if let Some(pass) = props
            .get(STATS_PROPERTY)
            .and_then(|s| serde_json::from_str::<TableOutcome>(s).ok())
        {
            let t = total.get_or_insert_with(TableOutcome::default);
            t.stats.upserted += pass.stats.upserted;
            t.stats.deleted += pass.stats.deleted;
            t.stats.rejected += pass.stats.rejected;
            t.offsets.extend(pass.offsets);
            t.last |= pass.last;
        }
    }
    Ok(total)
}

/// The source offsets of folded rows, from their provenance.
fn provenance_ranges(rows: &RecordBatch) -> Result<Vec<OffsetRange>> {
    let prov = Provenance::of(rows)?;
    let mut spans = WrittenSpans::default();
    for s in (0..rows.num_rows()).filter_map(|i| prov.source(i)) {
        spans.record(&s.topic, s.partition, s.offset);
    }
    Ok(spans.ranges())
}
