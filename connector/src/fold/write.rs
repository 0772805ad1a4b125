//! Write: merges each table's checked change into the base table — a delete
//! pass and an upsert pass (merge-insert on the primary key), or an
//! overwrite for `_pending/*` — with the plan and the pass's stats in each
//! commit's transaction properties, the shards' compacted markers on the
//! last pass, and compaction of small fragments inside the fold.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow::compute::concat_batches;
use arrow_schema::{DataType, Field, Schema};
use lance::dataset::transaction::{Operation, Transaction, UpdateMode};
use lance::dataset::{
    CommitBuilder, InsertBuilder, MergeInsertBuilder, ProjectionRequest, WhenMatched,
    WhenNotMatched, WriteMode, WriteParams,
};
use lance::Dataset;
use lance_index::mem_wal::CompactedSsTable;
use lance_table::format::Fragment;
use serde::{Deserialize, Serialize};

use super::checks::Change;
use super::keys::{follow_compaction, known_ids_at, tags};
use super::plan::{FoldPlan, TablePlan};
use super::read::ReadSet;
use super::rows::{pk_of, strings};
use super::StageTimes;
use crate::error::{Context, Error, Result};
use crate::failpoints;
use crate::graph::{Graph, TableStats};
use crate::known_ids::{IdSet, KnownIds};
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
    known: &KnownIds,
    plan: &FoldPlan,
    changes: BTreeMap<String, Change>,
    times: &mut StageTimes,
) -> Result<Outcomes> {
    let mut outcomes = Outcomes::new();
    for (table, change) in changes {
        let tp = plan.tables.iter().find(|t| t.table == table);
        let outcome = write_table(graph, known, plan, &table, tp, change, times).await?;
        outcomes.insert(table, outcome);
    }
    Ok(outcomes)
}

/// One table's writes: what every pass shares.
struct TableWrite<'a> {
    table: &'a str,
    store: &'a Store,
    pk: &'static str,
    plan_json: String,
    markers: Vec<CompactedSsTable>,
}

/// What an addressed write did to the table's known ids.
struct Moved {
    /// Upserted ids with their tags (`keys::tags`) and new addresses.
    added: Vec<(String, u64, u64)>,
    removed: Vec<String>,
}

/// What an addressed write replaces: see `TableWrite::replaced`.
struct Replaced<'c> {
    /// Row address → the id it holds, of every row replaced or deleted.
    gone: BTreeMap<u64, &'c str>,
    /// How many of those the deletes name.
    deleted: u64,
    /// Upserted ids with their tags (addresses 0 until written).
    added: Vec<(String, u64, u64)>,
}

/// The addresses of `written`'s rows in the fragments not in `before`: an
/// addressed write's upserts, in order.
fn new_addresses(written: &Dataset, before: &HashSet<u64>) -> Vec<u64> {
    let mut addrs = Vec::new();
    for f in written.get_fragments() {
        let id = f.id() as u64;
        if before.contains(&id) {
            continue;
        }
        let n = f.metadata().physical_rows.unwrap_or_default() as u64;
        addrs.extend((0..n).map(|i| (id << 32) | i));
    }
    addrs
}

/// Writes one table's change; the last pass carries the compacted markers
/// of the plan's shards. Idempotent: a table whose last pass of this plan
/// is committed is not written again.
async fn write_table(
    graph: &Graph,
    known: &KnownIds,
    plan: &FoldPlan,
    table: &str,
    tp: Option<&TablePlan>,
    change: Change,
    times: &mut StageTimes,
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
    let w = TableWrite::new(graph, plan, table, tp)?;
    let ds = Arc::new(ds);
    if let Some(rows) = change.replace {
        return w.overwrite(ds, rows).await;
    }
    let from = ds.version().version;
    let set = if w.pk == ID {
        known_ids_at(graph, known, table, from).await?
    } else {
        None
    };
    let addressed = match &set {
        Some(set) => w.addressed(ds.clone(), known, set, &change).await?,
        None => None,
    };
    let (ds, moved) = match addressed {
        Some((ds, moved)) => {
            // The table's one data commit: a crash here leaves it written
            // and the rest of the fold (compaction, other tables) to redo.
            failpoints::hit(failpoints::FOLD_BETWEEN_PASSES)?;
            (ds, moved)
        }
        None => (w.merge(ds, change).await?, None),
    };
    // The set's one holder is then the known ids, so `advance` moves it in
    // place instead of copying every id.
    drop(set);
    let written = ds.clone();
    let t = Instant::now();
    let ds = w.compact(ds).await?;
    times.compact += t.elapsed().as_secs_f64();
    let t = Instant::now();
    let ds = w.index(ds).await?;
    times.index += t.elapsed().as_secs_f64();
    let moved = moved.filter(|_| written.version().version == from + 1);
    move_known(graph, known, plan, table, moved, &written, &ds).await?;
    // Sum every pass of this plan, including passes of a crashed attempt.
    let mut outcome = committed_outcome(&ds, &plan.commit_id)
        .await?
        .unwrap_or_default();
    outcome.version = ds.version().version;
    Ok(outcome)
}

/// Moves `table`'s known ids with the one commit made from them (to
/// `written`, one version on), then over the fold's own compaction (to
/// `ds`); a merge-insert (row addresses unknown) or a commit of someone
/// else's in between (`moved` is then `None`) leaves them behind:
/// forgotten, and rescanned by the next fold that needs them.
async fn move_known(
    graph: &Graph,
    known: &KnownIds,
    plan: &FoldPlan,
    table: &str,
    moved: Option<Moved>,
    written: &Dataset,
    ds: &Dataset,
) -> Result<()> {
    let from = written.version().version - 1;
    let Some(m) = moved else {
        known.forget(table);
        return Ok(());
    };
    known.advance(
        table,
        from,
        from + 1,
        m.added.iter().map(|(id, tag, a)| (id.as_str(), *tag, *a)),
        m.removed.iter().map(String::as_str),
    );
    let to = ds.version().version;
    if to > from + 1 {
        if only_ours(ds, from + 2, to, &plan.commit_id).await? {
            follow_compaction(graph, known, table, written, ds).await?;
        } else {
            known.forget(table);
        }
    }
    Ok(())
}

impl<'a> TableWrite<'a> {
    /// The write of `table` for `plan`, whose last pass carries the
    /// compacted markers of the plan's shards of it (`tp`).
    fn new(
        graph: &'a Graph,
        plan: &FoldPlan,
        table: &'a str,
        tp: Option<&TablePlan>,
    ) -> Result<TableWrite<'a>> {
        Ok(TableWrite {
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
        })
    }

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

    /// Deletes and upserts in one commit by the row addresses known for the
    /// table's ids: each replaced or deleted row gets a deletion-vector bit,
    /// the upserts a new fragment (what merge-insert commits, without its
    /// hash join over every key of the table). `None` when the known
    /// addresses do not hold the ids they should: a bug, never a guess.
    async fn addressed(
        &self,
        ds: Arc<Dataset>,
        known: &KnownIds,
        set: &IdSet,
        change: &Change,
    ) -> Result<Option<(Arc<Dataset>, Option<Moved>)>> {
        let upserts = change.upserts.as_ref().filter(|u| u.num_rows() > 0);
        let Replaced {
            gone,
            deleted,
            added,
        } = self.replaced(known, set, change, upserts)?;
        let clock = std::time::Instant::now();
        if !self.holds(&ds, &gone).await? {
            return Ok(None);
        }
        let take_s = clock.elapsed().as_secs_f64();
        let new_fragments = self.stage_upserts(&ds, upserts).await?;
        let insert_s = clock.elapsed().as_secs_f64() - take_s;
        let op = self.update(&ds, &gone, new_fragments).await?;
        let pass = TableOutcome {
            stats: TableStats {
                upserted: added.len() as u64,
                deleted,
                rejected: change.rejected,
            },
            offsets: match upserts {
                Some(rows) if self.table != REJECTS_TABLE => provenance_ranges(rows)?,
                _ => vec![],
            },
            last: true,
            ..Default::default()
        };
        let delete_s = clock.elapsed().as_secs_f64() - take_s - insert_s;
        let txn = Transaction::new(ds.version().version, op, None);
        let before: HashSet<u64> = ds.get_fragments().iter().map(|f| f.id() as u64).collect();
        let written = commit_staged(ds, txn, &self.plan_json, &pass).await?;
        tracing::debug!(
            table = %self.table,
            take_s,
            insert_s,
            delete_s,
            commit_s = clock.elapsed().as_secs_f64() - take_s - insert_s - delete_s,
            replaced = gone.len(),
            "written by address"
        );
        let addrs = new_addresses(&written, &before);
        // Not what was written: `advance` must not file these addresses.
        let moved = (addrs.len() == added.len()).then(|| Moved {
            removed: change.deletes.clone(),
            added: added
                .into_iter()
                .zip(addrs)
                .map(|((id, tag, _), a)| (id, tag, a))
                .collect(),
        });
        Ok(Some((Arc::new(written), moved)))
    }

    /// The known addresses `change` replaces or deletes, and its upserts'
    /// ids with their tags (addresses still to come).
    fn replaced<'c>(
        &self,
        known: &KnownIds,
        set: &IdSet,
        change: &'c Change,
        upserts: Option<&'c RecordBatch>,
    ) -> Result<Replaced<'c>> {
        let mut gone: BTreeMap<u64, &str> = BTreeMap::new();
        for id in &change.deletes {
            if let Some(a) = known.addr(set, id) {
                gone.insert(a, id);
            }
        }
        let deleted = gone.len() as u64;
        let mut added = Vec::new();
        if let Some(rows) = upserts {
            let ids = strings(rows, ID)?;
            let tags = tags(known, set.kind(), rows)?;
            for (i, tag) in tags.into_iter().enumerate() {
                if !ids.is_valid(i) {
                    return Err(Error::Corrupt(format!("{}: a row without id", self.table)));
                }
                let id = ids.value(i);
                if let Some(a) = known.addr(set, id) {
                    gone.insert(a, id);
                }
                added.push((id.to_string(), tag, 0u64));
            }
        }
        Ok(Replaced {
            gone,
            deleted,
            added,
        })
    }

    /// The upserts written as new fragments, not yet committed.
    async fn stage_upserts(
        &self,
        ds: &Arc<Dataset>,
        upserts: Option<&RecordBatch>,
    ) -> Result<Vec<Fragment>> {
        let Some(rows) = upserts else {
            return Ok(Vec::new());
        };
        let params = self.store.write_params(WriteMode::Append);
        let txn = InsertBuilder::new(ds.clone())
            .with_params(&params)
            .execute_uncommitted(vec![rows.clone()])
            .await
            .ctx(format!("write upserts of {}", self.table))?;
        match txn.operation {
            Operation::Append { fragments } => Ok(fragments),
            op => Err(Error::Corrupt(format!(
                "{}: insert staged {op}",
                self.table
            ))),
        }
    }

    /// The one commit's operation: a deletion-vector bit for each row at
    /// `gone`'s addresses (fragments left empty are removed), and
    /// `new_fragments` added.
    async fn update(
        &self,
        ds: &Dataset,
        gone: &BTreeMap<u64, &str>,
        new_fragments: Vec<Fragment>,
    ) -> Result<Operation> {
        let mut by_fragment: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for &a in gone.keys() {
            by_fragment
                .entry((a >> 32) as u32)
                .or_default()
                .push(a as u32);
        }
        let (mut updated, mut removed) = (Vec::new(), Vec::new());
        for (f, offsets) in by_fragment {
            let frag = ds.get_fragment(f as usize).ok_or_else(|| {
                Error::Corrupt(format!("{}: no fragment {f} for a known id", self.table))
            })?;
            match frag
                .extend_deletions(offsets)
                .await
                .ctx(format!("delete rows of {}", self.table))?
            {
                Some(frag) => updated.push(frag.metadata().clone()),
                None => removed.push(u64::from(f)),
            }
        }
        Ok(Operation::Update {
            removed_fragment_ids: removed,
            updated_fragments: updated,
            new_fragments,
            fields_modified: vec![],
            compacted_sstables: self.markers.clone(),
            fields_for_preserving_frag_bitmap: ds
                .schema()
                .fields_pre_order()
                .map(|f| f.id as u32)
                .collect(),
            update_mode: Some(UpdateMode::RewriteRows),
            inserted_rows_filter: None,
            updated_fragment_offsets: None,
        })
    }

    /// Whether the rows at `gone`'s addresses hold the ids known for them
    /// (one take of the rows this fold replaces or deletes): known ids that
    /// drifted from the table are forgotten, never used to delete a row.
    async fn holds(&self, ds: &Dataset, gone: &BTreeMap<u64, &str>) -> Result<bool> {
        if gone.is_empty() {
            return Ok(true);
        }
        let addrs: Vec<u64> = gone.keys().copied().collect();
        let proj = ProjectionRequest::from_columns([ID], ds.schema());
        let rows = ds
            .take_rows(&addrs, proj)
            .await
            .ctx(format!("read the rows a fold replaces in {}", self.table))?;
        let ids = strings(&rows, ID)?;
        let held = rows.num_rows() == gone.len()
            && gone
                .values()
                .enumerate()
                .all(|(i, id)| ids.is_valid(i) && ids.value(i) == *id);
        if !held {
            tracing::warn!(table = %self.table, "known row addresses do not match the table; rescanning");
        }
        Ok(held)
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
        // Not the id index (`fold/index.rs`): on random keys its probe
        // touches every page, slower than the hash join; and looking for
        // one logs a spurious ERROR for the MemWAL index (Lance 14
        // `load_scalar_index`).
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

    /// Keeps lookups by id off a full scan (`index`), for node and edge
    /// tables, in a commit of this plan.
    async fn index(&self, ds: Arc<Dataset>) -> Result<Arc<Dataset>> {
        if self.pk != ID {
            return Ok(ds);
        }
        let pass = TableOutcome {
            last: true,
            ..Default::default()
        };
        let properties = pass_properties(&self.plan_json, &pass);
        super::index::keep(ds, self.table, properties).await
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

/// Whether every commit of `ds` from version `from` to `to` is a pass of
/// plan `commit_id` (or a compaction's fragment reservation).
async fn only_ours(ds: &Dataset, from: u64, to: u64, commit_id: &str) -> Result<bool> {
    for v in from..=to {
        if pass_of(ds, v, commit_id).await?.is_none() && !only_reserves(ds, v).await? {
            return Ok(false);
        }
    }
    Ok(true)
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
