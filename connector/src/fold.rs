//! Fold: merges flushed WAL generations into the base tables and publishes
//! exactly one graph commit per fold. The plan of a fold travels inside each
//! Lance commit it makes (transaction properties), so a crash between the
//! table commits and the publish is finished on the next start.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, StringArray, UInt32Array};
use arrow::compute::{concat_batches, filter_record_batch, take};
use arrow_schema::{Schema, SchemaRef};
use futures::TryStreamExt;
use lance::dataset::mem_wal::DatasetMemWalExt;
use lance::dataset::{CommitBuilder, MergeInsertBuilder, WhenMatched, WhenNotMatched};
use lance::Dataset;
use lance_index::mem_wal::CompactedSsTable;
use serde::{Deserialize, Serialize};

use crate::error::{Context, Error, Result};
use crate::failpoints;
use crate::graph::{
    new_commit_id, now_ms, FoldedShard, Graph, GraphCommit, OffsetRange, TableStats,
};
use crate::offsets::WrittenSpans;
use crate::schema::{TypeKind, ID};
use crate::shards;

const PLAN_PROPERTY: &str = "graphsink.fold_plan";
const STATS_PROPERTY: &str = "graphsink.fold_stats";
const TOMBSTONE: &str = "_tombstone";
const PUBLISH_ATTEMPTS: usize = 8;

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
pub type Cut = Option<HashMap<uuid::Uuid, u64>>;

/// Plans a fold of every flushed, not yet compacted generation (within the
/// cut). `None` when there is nothing to fold.
pub async fn plan(
    graph: &Graph,
    head: &GraphCommit,
    cut: &Cut,
    spans: &WrittenSpans,
    actor: &str,
) -> Result<Option<FoldPlan>> {
    let mut tables = Vec::new();
    let mut types: Vec<_> = graph.schema.types.iter().collect();
    types.sort_by_key(|t| (t.kind == TypeKind::Edge, t.name.clone()));
    for t in types {
        let ds = graph.open_table(&t.table, None).await?;
        let compacted = compacted_markers(&ds).await?;
        let mut shard_plans = Vec::new();
        for bucket in 0..graph.buckets[&t.table] {
            let shard = shards::shard_id(&t.table, bucket);
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
            let mut gens: Vec<(u64, String)> = m
                .sstables
                .iter()
                .filter(|s| s.generation > after && s.generation <= limit)
                .map(|s| (s.generation, s.path.clone()))
                .collect();
            gens.sort();
            if let Some(&(upto, _)) = gens.last() {
                shard_plans.push(ShardPlan {
                    bucket,
                    shard,
                    after,
                    upto,
                    generations: gens,
                });
            }
        }
        if !shard_plans.is_empty() {
            tables.push(TablePlan {
                table: t.table.clone(),
                shards: shard_plans,
            });
        }
    }
    if tables.is_empty() {
        return Ok(None);
    }
    Ok(Some(FoldPlan {
        commit_id: new_commit_id(),
        parent: head.id.clone(),
        actor: actor.to_string(),
        created_at: now_ms(),
        tables,
        offsets: spans.ranges(),
    }))
}

/// Result of merging one table.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct TableOutcome {
    #[serde(skip)]
    version: u64,
    stats: TableStats,
    /// Offsets of the folded upserts, from their provenance columns: covers
    /// rows replayed from the WAL, which the run loop never saw.
    offsets: Vec<OffsetRange>,
}

/// Executes a plan and publishes its graph commit. Idempotent: tables whose
/// marker already covers the plan are not merged again.
pub async fn execute(graph: &Graph, plan: &FoldPlan) -> Result<GraphCommit> {
    let mut outcomes = BTreeMap::new();
    for tp in &plan.tables {
        let outcome = fold_table(graph, plan, tp).await?;
        outcomes.insert(tp.table.clone(), outcome);
    }
    failpoints::hit(failpoints::FOLD_BEFORE_PUBLISH)?;
    publish(graph, plan, &outcomes).await
}

async fn fold_table(graph: &Graph, plan: &FoldPlan, tp: &TablePlan) -> Result<TableOutcome> {
    let ds = graph.open_table(&tp.table, None).await?;
    let compacted = compacted_markers(&ds).await?;
    if tp
        .shards
        .iter()
        .all(|s| compacted.get(&s.shard).copied().unwrap_or(0) >= s.upto)
    {
        // Already merged by this plan before a crash: recover its stats.
        let mut outcome = committed_outcome(&ds, &plan.commit_id)
            .await?
            .unwrap_or_default();
        outcome.version = ds.version().version;
        return Ok(outcome);
    }
    let (upserts, deletes) = read_generations(graph, tp).await?;
    let markers: Vec<CompactedSsTable> = tp
        .shards
        .iter()
        .map(|s| CompactedSsTable::new(s.shard, s.upto))
        .collect();
    let plan_json = serde_json::to_string(plan).expect("serializable");
    let mut ds = Arc::new(ds);

    // Only the final data-changing pass may carry the compacted marker.
    if let Some(keys) = deletes.filter(|k| k.num_rows() > 0) {
        let last = upserts.is_none();
        let mut b = MergeInsertBuilder::try_new(ds.clone(), vec![ID.into()]).ctx(&tp.table)?;
        b.when_matched(WhenMatched::Delete)
            .when_not_matched(WhenNotMatched::DoNothing)
            .conflict_retries(0);
        if last {
            b.mark_sstables_as_compacted(markers.clone());
        }
        let staged = b
            .try_build()
            .ctx(&tp.table)?
            .execute_uncommitted_batches(vec![keys])
            .await
            .ctx(format!("fold deletes into {}", tp.table))?;
        let pass = TableOutcome {
            stats: TableStats {
                deleted: staged.stats.num_deleted_rows,
                upserted: 0,
            },
            ..Default::default()
        };
        ds = Arc::new(commit_staged(ds, staged.transaction, &plan_json, &pass).await?);
        failpoints::hit(failpoints::FOLD_BETWEEN_PASSES)?;
    }
    if let Some(rows) = upserts {
        let offsets = provenance_ranges(&rows)?;
        let mut b = MergeInsertBuilder::try_new(ds.clone(), vec![ID.into()]).ctx(&tp.table)?;
        b.when_matched(WhenMatched::UpdateAll)
            .when_not_matched(WhenNotMatched::InsertAll)
            .conflict_retries(0)
            .mark_sstables_as_compacted(markers);
        let staged = b
            .try_build()
            .ctx(&tp.table)?
            .execute_uncommitted_batches(vec![rows])
            .await
            .ctx(format!("fold upserts into {}", tp.table))?;
        let pass = TableOutcome {
            stats: TableStats {
                upserted: staged.stats.num_inserted_rows + staged.stats.num_updated_rows,
                deleted: 0,
            },
            offsets,
            ..Default::default()
        };
        ds = Arc::new(commit_staged(ds, staged.transaction, &plan_json, &pass).await?);
    }
    // Sum every pass of this plan, including passes of a crashed attempt.
    let mut outcome = committed_outcome(&ds, &plan.commit_id)
        .await?
        .unwrap_or_default();
    outcome.version = ds.version().version;
    Ok(outcome)
}

async fn commit_staged(
    ds: Arc<Dataset>,
    mut txn: lance::dataset::transaction::Transaction,
    plan_json: &str,
    pass: &TableOutcome,
) -> Result<Dataset> {
    let props = HashMap::from([
        (PLAN_PROPERTY.to_string(), plan_json.to_string()),
        (
            STATS_PROPERTY.to_string(),
            serde_json::to_string(pass).expect("serializable"),
        ),
    ]);
    txn.transaction_properties = Some(Arc::new(props));
    CommitBuilder::new(ds.clone())
        .execute(txn)
        .await
        .ctx(format!("commit fold into {}", ds.uri()))
}

/// The newest row per id across the planned generations (ascending), split
/// into upserts (base columns) and deleted keys.
async fn read_generations(
    graph: &Graph,
    tp: &TablePlan,
) -> Result<(Option<RecordBatch>, Option<RecordBatch>)> {
    let base = graph.open_table(&tp.table, None).await?;
    let base_schema: SchemaRef = Arc::new(Schema::from(base.schema()));
    let mut batches = Vec::new();
    for s in &tp.shards {
        for (_, path) in &s.generations {
            let uri = format!(
                "{}/_mem_wal/{}/{}",
                graph.table_uri(&tp.table),
                s.shard,
                path
            );
            let gen = Dataset::open(&uri)
                .await
                .ctx(format!("open generation {uri}"))?;
            let mut got: Vec<RecordBatch> = gen
                .scan()
                .try_into_stream()
                .await
                .ctx(&uri)?
                .try_collect()
                .await
                .ctx(&uri)?;
            batches.append(&mut got);
        }
    }
    batches.retain(|b| b.num_rows() > 0);
    let Some(first) = batches.first() else {
        return Ok((None, None));
    };
    let all = concat_batches(&first.schema(), &batches).ctx("concat generations")?;
    let ids = all
        .column_by_name(ID)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or_else(|| Error::Corrupt(format!("{}: generation without id", tp.table)))?;
    let mut last: HashMap<&str, u32> = HashMap::with_capacity(ids.len());
    for i in 0..ids.len() {
        last.insert(ids.value(i), i as u32);
    }
    let mut keep: Vec<u32> = last.into_values().collect();
    keep.sort_unstable();
    let keep = UInt32Array::from(keep);
    let newest: Vec<ArrayRef> = all
        .columns()
        .iter()
        .map(|c| take(c, &keep, None))
        .collect::<std::result::Result<_, _>>()
        .ctx("newest per id")?;
    let newest = RecordBatch::try_new(all.schema(), newest).ctx("newest per id")?;
    let tomb = newest
        .column_by_name(TOMBSTONE)
        .and_then(|c| c.as_any().downcast_ref::<BooleanArray>().cloned())
        .unwrap_or_else(|| BooleanArray::from(vec![false; newest.num_rows()]));
    let is_delete: BooleanArray = tomb.iter().map(|v| Some(v == Some(true))).collect();
    let is_upsert = arrow::compute::not(&is_delete).ctx("mask")?;

    let deleted = filter_record_batch(&newest, &is_delete).ctx("deletes")?;
    let deletes = (deleted.num_rows() > 0)
        .then(|| deleted.project(&[deleted.schema().index_of(ID).expect("id")]))
        .transpose()
        .ctx("delete keys")?;
    let upserted = filter_record_batch(&newest, &is_upsert).ctx("upserts")?;
    let upserts = if upserted.num_rows() > 0 {
        let cols: Vec<ArrayRef> = base_schema
            .fields()
            .iter()
            .map(|f| {
                upserted
                    .column_by_name(f.name())
                    .cloned()
                    .ok_or_else(|| Error::Corrupt(format!("generation lacks column {}", f.name())))
            })
            .collect::<Result<_>>()?;
        Some(RecordBatch::try_new(base_schema, cols).ctx("upserts in base schema")?)
    } else {
        None
    };
    Ok((upserts, deletes))
}

async fn publish(
    graph: &Graph,
    plan: &FoldPlan,
    outcomes: &BTreeMap<String, TableOutcome>,
) -> Result<GraphCommit> {
    let mut last_err = None;
    for attempt in 0..PUBLISH_ATTEMPTS {
        let head = graph.head().await?;
        if head.id == plan.commit_id {
            return Ok(head); // published before a crash
        }
        if attempt == 0 && head.id != plan.parent {
            tracing::warn!(expected = %plan.parent, found = %head.id, "head moved before publish; rebasing");
        }
        let mut tables = head.tables.clone();
        for (t, o) in outcomes {
            let v = tables.entry(t.clone()).or_insert(o.version);
            *v = (*v).max(o.version);
        }
        let folded = plan
            .tables
            .iter()
            .flat_map(|tp| {
                tp.shards.iter().map(|s| FoldedShard {
                    table: tp.table.clone(),
                    bucket: s.bucket,
                    shard: s.shard,
                    after_generation: s.after,
                    upto_generation: s.upto,
                })
            })
            .collect();
        let commit = GraphCommit {
            id: plan.commit_id.clone(),
            seq: head.seq + 1,
            parent: Some(head.id.clone()),
            actor: plan.actor.clone(),
            created_at: plan.created_at,
            tables,
            folded,
            offsets: merged_offsets(plan, outcomes),
            stats: outcomes.iter().map(|(t, o)| (t.clone(), o.stats)).collect(),
        };
        match graph.publish(&commit).await {
            Ok(()) => {
                tracing::info!(commit = %commit.id, seq = commit.seq, "published graph commit");
                return Ok(commit);
            }
            Err(e @ Error::CommitConflict { .. }) => {
                tracing::info!(error = %e, "publish lost a race; retrying from the new head");
                last_err = Some(e);
                tokio::time::sleep(std::time::Duration::from_millis(20 << attempt.min(5))).await;
            }
            Err(e) => return Err(e),
        }
    }
    Err(last_err.expect("at least one attempt"))
}

/// Finds table versions committed by a fold that was never published and
/// finishes that fold. Call before opening writers or folding anew.
pub async fn recover(graph: &Graph) -> Result<Option<GraphCommit>> {
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
            match plan_json {
                Some(j) => {
                    let p: FoldPlan = serde_json::from_str(&j).map_err(|e| {
                        Error::Corrupt(format!("{table}@{v}: unreadable fold plan: {e}"))
                    })?;
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
                None => {
                    return Err(Error::Corrupt(format!(
                        "{table} has version {v} after the published {pinned} that graphsink did not write; refusing to guess"
                    )))
                }
            }
        }
    }
    let Some(plan) = found else {
        return Ok(None);
    };
    tracing::warn!(commit = %plan.commit_id, "rolling forward a fold interrupted before its publish");
    execute(graph, &plan).await.map(Some)
}

async fn compacted_markers(ds: &Dataset) -> Result<HashMap<uuid::Uuid, u64>> {
    let details = ds.mem_wal_index_details().await.ctx(ds.uri())?;
    Ok(details
        .map(|d| {
            d.compacted_sstables
                .iter()
                .map(|c| (c.shard_id, c.generation))
                .collect()
        })
        .unwrap_or_default())
}

/// The sum of what every commit of fold `commit_id` recorded in this table
/// (its passes, including those of an attempt that crashed).
async fn committed_outcome(ds: &Dataset, commit_id: &str) -> Result<Option<TableOutcome>> {
    let mut total: Option<TableOutcome> = None;
    for v in (1..=ds.version().version).rev() {
        let txn = ds.read_transaction_by_version(v).await.ctx(ds.uri())?;
        let props = txn.as_ref().and_then(|t| t.transaction_properties.clone());
        let Some(props) = props else { break };
        let ours = props
            .get(PLAN_PROPERTY)
            .and_then(|p| serde_json::from_str::<FoldPlan>(p).ok())
            .is_some_and(|p| p.commit_id == commit_id);
        if !ours {
            break;
        }
        if let Some(pass) = props
            .get(STATS_PROPERTY)
            .and_then(|s| serde_json::from_str::<TableOutcome>(s).ok())
        {
            let t = total.get_or_insert_with(TableOutcome::default);
            t.stats.upserted += pass.stats.upserted;
            t.stats.deleted += pass.stats.deleted;
            t.offsets.extend(pass.offsets);
        }
    }
    Ok(total)
}

/// What the run loop hands the fold loop at a cut: the frozen memtables and
/// the offsets written since the previous cut.
pub struct FreezeCut {
    pub frozen: Vec<shards::FrozenShard>,
    pub spans: WrittenSpans,
}

pub type CutRequest = tokio::sync::oneshot::Sender<Result<FreezeCut>>;

/// The background fold loop of a running connector: serial, one fold at a
/// time, triggered by its interval, by `wake` (pending rows/bytes, or an
/// operator's request), and stopped by `stop`.
pub struct FoldLoop {
    pub graph: Graph,
    pub interval: std::time::Duration,
    pub actor: String,
    pub cuts: tokio::sync::mpsc::Sender<CutRequest>,
    pub wake: Arc<tokio::sync::Notify>,
    pub stop: tokio_util::sync::CancellationToken,
    /// Fold once more when stopped, so a graceful shutdown leaves the graph
    /// current (and its offsets exactly attributed).
    pub final_fold: bool,
    /// Receives each published commit (tests and latency measurements).
    pub published: tokio::sync::watch::Sender<Option<GraphCommit>>,
}

impl FoldLoop {
    pub async fn run(self) -> Result<()> {
        let period = if self.interval.is_zero() {
            std::time::Duration::from_secs(3600 * 24 * 365)
        } else {
            self.interval
        };
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        // Offsets of cuts whose fold has not been published yet.
        let mut spans = WrittenSpans::default();
        loop {
            let last = tokio::select! {
                biased;
                _ = self.stop.cancelled() => {
                    if !self.final_fold {
                        return Ok(());
                    }
                    true
                }
                _ = self.wake.notified() => false,
                _ = tick.tick() => false,
            };
            if !self.fold_once(&mut spans).await? || last {
                return Ok(());
            }
        }
    }

    /// Cuts, waits for the flushes, folds and publishes. Returns false when
    /// the run loop is gone.
    async fn fold_once(&self, spans: &mut WrittenSpans) -> Result<bool> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.cuts.send(tx).await.is_err() {
            return Ok(false);
        }
        let Ok(cut) = rx.await else { return Ok(false) };
        let cut = cut?;
        spans.merge(&cut.spans);
        let mut limits = HashMap::new();
        for f in cut.frozen {
            limits.insert(f.shard, f.upto_generation);
            f.fence
                .wait()
                .await
                .map_err(|e| shards::fenced_or(e, &f.table, f.bucket, f.shard, "flush"))?;
        }
        let head = self.graph.head().await?;
        if let Some(plan) = plan(&self.graph, &head, &Some(limits), spans, &self.actor).await? {
            let commit = execute(&self.graph, &plan).await?;
            *spans = WrittenSpans::default();
            let _ = self.published.send(Some(commit));
        }
        Ok(true)
    }
}

/// One fold outside a running connector (`graphsink fold`): claims every
/// shard (replaying its WAL), closes it so everything durable is flushed,
/// then folds all flushed generations. A running connector is fenced by this.
pub async fn fold_offline(
    graph: &Graph,
    wal: &crate::config::WalSettings,
    actor: &str,
) -> Result<Option<GraphCommit>> {
    recover(graph).await?;
    let tables: Vec<String> = graph.schema.types.iter().map(|t| t.table.clone()).collect();
    let pool = shards::ShardPool::open(graph, wal, &tables).await?;
    pool.close().await?;
    let head = graph.head().await?;
    match plan(graph, &head, &None, &WrittenSpans::default(), actor).await? {
        Some(p) => execute(graph, &p).await.map(Some),
        None => Ok(None),
    }
}

/// The plan's written spans united with the folded rows' provenance.
fn merged_offsets(plan: &FoldPlan, outcomes: &BTreeMap<String, TableOutcome>) -> Vec<OffsetRange> {
    let mut spans = WrittenSpans::default();
    for r in plan
        .offsets
        .iter()
        .chain(outcomes.values().flat_map(|o| o.offsets.iter()))
    {
        spans.record(&r.topic, r.partition, r.first);
        spans.record(&r.topic, r.partition, r.last);
    }
    spans.ranges()
}

fn provenance_ranges(rows: &RecordBatch) -> Result<Vec<OffsetRange>> {
    use crate::schema::{SRC_OFFSET, SRC_PARTITION, SRC_TOPIC};
    use arrow::array::{Int32Array, Int64Array};
    let col = |n: &str| {
        rows.column_by_name(n)
            .ok_or_else(|| Error::Corrupt(format!("folded rows lack {n}")))
    };
    let topics = col(SRC_TOPIC)?
        .as_any()
        .downcast_ref::<StringArray>()
        .cloned();
    let parts = col(SRC_PARTITION)?
        .as_any()
        .downcast_ref::<Int32Array>()
        .cloned();
    let offs = col(SRC_OFFSET)?
        .as_any()
        .downcast_ref::<Int64Array>()
        .cloned();
    let (Some(t), Some(p), Some(o)) = (topics, parts, offs) else {
        return Err(Error::Corrupt(
            "provenance columns have unexpected types".into(),
        ));
    };
    let mut spans = WrittenSpans::default();
    for i in 0..rows.num_rows() {
        if t.is_valid(i) && p.is_valid(i) && o.is_valid(i) {
            spans.record(t.value(i), p.value(i), o.value(i));
        }
    }
    Ok(spans.ranges())
}
