//! A fresh read: the table at the head's pinned version V merged with every
//! flushed generation above V's compacted markers and each shard's WAL
//! tail (`tail`), by Lance's `LsmScanner` (newest row per id, generation
//! order, tombstones hide rows). graphsink only builds the shard snapshots
//! (Lance builds none) and names the tier.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray, UInt64Array};
use futures::TryStreamExt;
use lance::dataset::mem_wal::scanner::exec::MEMTABLE_GEN_COLUMN;
use lance::dataset::mem_wal::scanner::InMemoryMemTables;
use lance::dataset::mem_wal::{LsmScanner, ShardSnapshot};
use lance::Dataset;

use super::{bad_filter, combined_filter, output_schema, reproject, ReadRequest, Rows};
use crate::error::{Context, Error, Result};
use crate::graph::{open_pinned, Graph, GraphCommit};
use crate::schema::ID;
use crate::shards;

/// How often a read starts again on a newer head when retention or a fold
/// removed a generation between the head read and the generations' read.
const ATTEMPTS: usize = 3;

/// The base of a table at a commit and the generations above its markers.
pub(crate) struct FreshSource {
    pub base: Arc<Dataset>,
    pub snapshots: Vec<ShardSnapshot>,
    /// Each shard's WAL tail, as a memtable.
    pub tails: Vec<(uuid::Uuid, InMemoryMemTables)>,
    /// Unfolded generations and tails in all (0: the read is the base alone).
    pub generations: usize,
}

pub(super) async fn read(
    graph: &Graph,
    mut commit: GraphCommit,
    table: String,
    req: &ReadRequest,
) -> Result<Rows> {
    let mut attempt = 1;
    loop {
        match read_once(graph, &commit, &table, req).await {
            Ok((schema, batches)) => {
                let batches = batches
                    .iter()
                    .map(|(b, t)| reproject(b, &schema, Some(t.clone())))
                    .collect::<Result<_>>()?;
                return Ok(Rows {
                    commit,
                    table,
                    schema,
                    batches,
                });
            }
            Err(Retry::Again(why)) if attempt < ATTEMPTS => {
                tracing::debug!(%why, attempt, "fresh read raced a fold or retention; reading again at the new head");
                attempt += 1;
                commit = graph.head().await?;
            }
            Err(Retry::Again(why)) => {
                return Err(Error::Broker(format!(
                "fresh read of {table}: generations kept moving under the read ({why}); try again"
            )))
            }
            Err(Retry::Fail(e)) => return Err(e),
        }
    }
}

/// Why one attempt failed: a race to read again, or an error.
enum Retry {
    Again(String),
    Fail(Error),
}

impl From<Error> for Retry {
    fn from(e: Error) -> Retry {
        match &e {
            Error::Lance { source, .. } if is_gone(source) => Retry::Again(e.to_string()),
            _ => Retry::Fail(e),
        }
    }
}

/// A generation (or its PK sidecar) deleted under the read.
fn is_gone(e: &lance::Error) -> bool {
    matches!(
        e,
        lance::Error::NotFound { .. } | lance::Error::DatasetNotFound { .. }
    ) || e.to_string().contains("Not found")
}

/// Rows, each batch with its tiers.
type Tiered = Vec<(RecordBatch, ArrayRef)>;

/// One attempt: the output's columns, and the rows read.
async fn read_once(
    graph: &Graph,
    commit: &GraphCommit,
    table: &str,
    req: &ReadRequest,
) -> std::result::Result<(arrow_schema::SchemaRef, Tiered), Retry> {
    let src = source(graph, commit, table)
        .await?
        .map_err(|why| Retry::Again(why.into()))?;
    // Checked up front so an unknown column is named, not left to Lance.
    let schema = output_schema(&src.base, req.columns.as_deref(), true)?;
    if let Some(f) = &req.filter {
        super::whole_filter(f)?;
    }
    if is_lookup(req) {
        return Ok((schema, lookup(&src, req).await?));
    }
    let sc = planned(&src, req)?;
    if let Some(f) = combined_filter(&req.ids, req.filter.as_deref()) {
        sc.create_plan().await.map_err(|e| bad_filter(&f, e))?;
    }
    let stream = sc.try_into_stream().await.ctx(table)?;
    let batches: Vec<RecordBatch> = stream
        .try_collect()
        .await
        .map_err(lance::Error::from)
        .ctx(table)?;
    let tiered = batches
        .into_iter()
        .map(|b| {
            let tiers = tiers_of(&b)?;
            Ok((b, tiers))
        })
        .collect::<Result<_>>()?;
    Ok((schema, tiered))
}

/// The plan of a fresh read (`Graph::explain`).
pub(super) async fn explain(
    graph: &Graph,
    commit: &GraphCommit,
    table: &str,
    req: &ReadRequest,
) -> Result<String> {
    let src = source(graph, commit, table)
        .await?
        .map_err(|why| Error::Broker(format!("fresh read of {table}: {why}; try again")))?;
    let sc = planned(&src, req)?;
    let plan = match combined_filter(&req.ids, req.filter.as_deref()) {
        Some(f) => sc.create_plan().await.map_err(|e| bad_filter(&f, e))?,
        None => sc.create_plan().await.ctx(table)?,
    };
    let shown = lance::deps::datafusion::physical_plan::displayable(plan.as_ref())
        .indent(true)
        .to_string();
    // The point-lookup route runs as one opaque stream (Lance's own tests
    // tell it by `OneShotStream`): name its sources, and show the base
    // arm's plan, which is a plain Lance scan with the same filter.
    if !(is_lookup(req) && shown.contains("OneShotStream")) {
        return Ok(shown);
    }
    let f = super::id_in(&req.ids);
    let mut base = src.base.scan();
    base.filter(&f).map_err(|e| bad_filter(&f, e))?;
    let base = base.explain_plan(true).await.ctx(table)?;
    Ok(format!(
        "LsmPointLookup ({shown}): newest source first, each stopping at the first match: \
         the WAL tails of {} shards (in-memory primary-key index), {} flushed generations \
         (bloom filter, then primary-key index), then the base table:\n{base}",
        src.tails.len(),
        src.generations - src.tails.len(),
        shown = shown.trim()
    ))
}

/// `--id` without a filter: a lookup by primary key.
fn is_lookup(req: &ReadRequest) -> bool {
    !req.ids.is_empty() && req.filter.is_none()
}

/// The scanner a read runs: for a lookup, a `pk IN (..)` filter with no
/// tier column, which routes to Lance's point-lookup planner (sources
/// newest first, each short-circuiting, generations behind their bloom
/// filters, the base through its id index); else a scan with the tier
/// column and the combined filter.
fn planned(src: &FreshSource, req: &ReadRequest) -> Result<LsmScanner> {
    if is_lookup(req) {
        let f = super::id_in(&req.ids);
        return scanner(src, req)?.filter(&f).map_err(|e| bad_filter(&f, e));
    }
    let mut sc = scanner(src, req)?.with_memtable_gen();
    if let Some(f) = combined_filter(&req.ids, req.filter.as_deref()) {
        sc = sc.filter(&f).map_err(|e| bad_filter(&f, e))?;
    }
    Ok(sc)
}

/// A lookup's rows, each with its tier from `contains_pks` over the same
/// snapshots: an id the WAL tier holds came from it.
async fn lookup(src: &FreshSource, req: &ReadRequest) -> Result<Vec<(RecordBatch, ArrayRef)>> {
    let sc = planned(src, req)?;
    let uri = src.base.uri().to_string();
    let batches: Vec<RecordBatch> = sc
        .try_into_stream()
        .await
        .ctx(&uri)?
        .try_collect()
        .await
        .map_err(lance::Error::from)
        .ctx(&uri)?;
    let mut out = Vec::new();
    for b in batches.into_iter().filter(|b| b.num_rows() > 0) {
        let in_wal = if src.generations == 0 {
            vec![false; b.num_rows()]
        } else {
            let ids = b
                .column_by_name(ID)
                .cloned()
                .ok_or_else(|| Error::Bug("a lookup lost the id column".into()))?;
            let keys = RecordBatch::try_from_iter([(ID, ids)]).ctx("lookup keys")?;
            sc.contains_pks(&keys).await.ctx(&uri)?
        };
        let tiers: StringArray = in_wal
            .iter()
            .map(|&w| Some(if w { "wal" } else { "base" }))
            .collect();
        out.push((b, Arc::new(tiers) as ArrayRef));
    }
    Ok(out)
}

/// The LSM scanner over a source, with the request's columns and limit.
fn scanner(src: &FreshSource, req: &ReadRequest) -> Result<LsmScanner> {
    let mut sc = LsmScanner::new(
        src.base.clone(),
        src.snapshots.clone(),
        vec![ID.to_string()],
    );
    for (shard, tail) in &src.tails {
        sc = sc.with_in_memory_memtables(*shard, tail.clone());
    }
    if let Some(cols) = &req.columns {
        // The id too: a lookup's tier is asked by id (dropped at the end).
        let mut cols = cols.clone();
        if !cols.iter().any(|c| c == ID) {
            cols.push(ID.to_string());
        }
        sc = sc.project(&cols).ctx("--columns")?;
    }
    if let Some(n) = req.limit {
        sc = sc.limit(Some(n as i64), None).ctx("--limit")?;
    }
    Ok(sc)
}

/// `_memtable_gen` (0: the base; a generation otherwise) as `_tier`.
fn tiers_of(b: &RecordBatch) -> Result<ArrayRef> {
    let gens = b
        .column_by_name(MEMTABLE_GEN_COLUMN)
        .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
        .ok_or_else(|| Error::Bug(format!("a fresh read without {MEMTABLE_GEN_COLUMN}")))?;
    let tiers: StringArray = (0..gens.len())
        .map(|i| Some(if gens.value(i) == 0 { "base" } else { "wal" }))
        .collect();
    Ok(Arc::new(tiers))
}

/// The table at the commit's version and, per shard, the flushed
/// generations above that version's compacted marker and the WAL's tail.
/// `Err(why)` when the read must start again at a newer head: a shard's
/// generations have a gap above its marker (retention trimmed what a newer
/// head folded), or flushes kept moving its replay mark through
/// `SHARD_ATTEMPTS` reads of its tail.
pub(crate) async fn source(
    graph: &Graph,
    commit: &GraphCommit,
    table: &str,
) -> Result<std::result::Result<FreshSource, &'static str>> {
    let base = Arc::new(open_pinned(graph, commit, table).await?);
    let markers = shards::compacted_markers(&base).await?;
    // Shards are read at once: each is its own manifest and WAL.
    let reads = (0..shards::shard_count_or(graph, table, 0)).map(|bucket| {
        let sid = shards::shard_id(table, bucket);
        let upto = markers.get(&sid).copied().unwrap_or(0);
        shard(&base, sid, upto)
    });
    let mut src = FreshSource {
        snapshots: Vec::new(),
        tails: Vec::new(),
        generations: 0,
        base: base.clone(),
    };
    for s in futures::future::try_join_all(reads).await? {
        match s {
            Shard::Absent => {}
            Shard::Gap => return Ok(Err("a shard's generations have a gap")),
            Shard::Moving => return Ok(Err("flushes kept moving a shard's replay mark")),
            Shard::Read { snap, tail, count } => {
                if let Some(t) = tail {
                    src.tails.push((snap.shard_id, t));
                }
                src.snapshots.push(snap);
                src.generations += count;
            }
        }
    }
    Ok(Ok(src))
}

/// What one shard adds to a fresh read.
enum Shard {
    /// No manifest: the shard was never written.
    Absent,
    /// Generations above the head's marker are missing (retention trimmed
    /// what a newer head folded): read again at the new head.
    Gap,
    /// Flushes kept moving the replay mark through every attempt.
    Moving,
    Read {
        snap: ShardSnapshot,
        tail: Option<InMemoryMemTables>,
        /// Generations plus the tail, if any.
        count: usize,
    },
}

/// How often one shard is read again when a flush moved its replay mark
/// while its tail was read. The flush's generation is then in the
/// shard's manifest, above the same marker, so the head need not move.
const SHARD_ATTEMPTS: usize = 10;

/// One shard's generations above `upto` and its WAL tail.
async fn shard(base: &Dataset, sid: uuid::Uuid, upto: u64) -> Result<Shard> {
    for _ in 0..SHARD_ATTEMPTS {
        if let Some(s) = shard_once(base, sid, upto).await? {
            return Ok(s);
        }
    }
    Ok(Shard::Moving)
}

/// One attempt, with the shard's manifest read before and after: a moved
/// replay mark or generation means a flush landed in between (`None`).
async fn shard_once(base: &Dataset, sid: uuid::Uuid, upto: u64) -> Result<Option<Shard>> {
    let Some(m) = shards::latest_manifest(base, sid).await? else {
        return Ok(Some(Shard::Absent));
    };
    let listed: HashSet<u64> = m.sstables.iter().map(|g| g.generation).collect();
    // Generations flush in order (g, then g+1): every one from the
    // marker up to the writer's current one is listed, unless trimmed.
    if (upto + 1..m.current_generation).any(|g| !listed.contains(&g)) {
        return Ok(Some(Shard::Gap));
    }
    let mut snap = ShardSnapshot::new(sid)
        .with_spec_id(m.shard_spec_id)
        .with_current_generation(m.current_generation);
    let mut count = 0;
    for g in m.sstables.iter().filter(|g| g.generation > upto) {
        snap = snap.with_sstable(g.generation, g.path.clone());
        count += 1;
    }
    // An entry a retention run deleted after a flush reads as gone: the
    // manifest below has moved then, and the shard is read again.
    let tail = match super::tail::wal_memtable(base, sid, &m).await {
        Ok(t) => Some(t),
        Err(Error::Lance { source, .. }) if is_gone(&source) => None,
        Err(e) => return Err(e),
    };
    let Some(after) = shards::latest_manifest(base, sid).await? else {
        return Ok(None);
    };
    let mark = |m: &lance_index::mem_wal::ShardManifest| {
        (m.replay_after_wal_entry_position, m.current_generation)
    };
    if mark(&after) != mark(&m) {
        return Ok(None);
    }
    let Some(tail) = tail else {
        return Err(Error::Corrupt(format!(
            "shard {sid}: a WAL entry past the replay mark is gone and the mark has not moved"
        )));
    };
    count += usize::from(tail.is_some());
    Ok(Some(Shard::Read { snap, tail, count }))
}
