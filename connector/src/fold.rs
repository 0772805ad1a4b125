//! Fold: merges flushed WAL generations into the base tables, checks what
//! needs graph state (edge endpoints, `@card`, `@unique`, deletes of
//! referenced nodes), and publishes exactly one graph commit per fold.
//!
//! A fold reads, then validates, then writes. Reading and validating see only
//! the WAL generations of the plan and the tables at the versions the parent
//! commit pins, so they give the same answer every time. The plan travels
//! inside each Lance commit the fold makes (transaction properties), so a
//! crash between the table commits and the publish is finished, with the
//! same rejects, on the next start.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMillisecondArray,
};
use arrow::compute::{concat_batches, filter_record_batch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::TryStreamExt;
use lance::dataset::mem_wal::DatasetMemWalExt;
use lance::dataset::{
    CommitBuilder, InsertBuilder, MergeInsertBuilder, WhenMatched, WhenNotMatched, WriteMode,
    WriteParams,
};
use lance::Dataset;
use lance_index::mem_wal::CompactedSsTable;
use serde::{Deserialize, Serialize};

use crate::config::{Config, DeletePolicy, EndpointPolicy, Tolerance};
use crate::error::{Context, Error, Result};
use crate::failpoints;
use crate::graph::{
    new_commit_id, FoldedShard, Graph, GraphCommit, OffsetRange, TableStats,
};
use crate::kafka::DeadLetters;
use crate::offsets::WrittenSpans;
use crate::rejects::{self, Reject, RejectCode};
use crate::schema::{
    pending_schema, pending_table, GraphType, TypeKind, ID, PENDING_SINCE, REJECTS_TABLE,
    REJECT_ID, SRC_OFFSET, SRC_PARTITION, SRC_TIMESTAMP, SRC_TOPIC,
};
use crate::types::now_ms;
use crate::shards;

const PLAN_PROPERTY: &str = "graphsink.fold_plan";
const STATS_PROPERTY: &str = "graphsink.fold_stats";
const TOMBSTONE: &str = "_tombstone";
const PUBLISH_ATTEMPTS: usize = 8;
/// A table is compacted inside the fold that leaves it with more fragments
/// than this: every fold adds one or two, and merge-insert, scans and
/// `__manifest` reads all grow with the fragment count, not with the rows.
pub const COMPACT_FRAGMENTS: usize = 16;
/// The fold-time policies of the config, per graph type.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    pub tolerance: Tolerance,
    /// Per edge type.
    pub max_pending_edges: usize,
    pub types: HashMap<String, TypePolicy>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct TypePolicy {
    pub endpoint: EndpointPolicy,
    pub deadline_ms: i64,
    pub delete: DeletePolicy,
}

impl Policies {
    pub fn from_config(config: &Config) -> Policies {
        let types = config
            .mappings
            .iter()
            .map(|m| {
                (
                    m.type_name().to_string(),
                    TypePolicy {
                        endpoint: m.on_missing_endpoint,
                        deadline_ms: m.endpoint_deadline.as_millis() as i64,
                        delete: m.on_delete_referenced,
                    },
                )
            })
            .collect();
        Policies {
            tolerance: config.errors.tolerance,
            max_pending_edges: config.errors.max_pending_edges,
            types,
        }
    }

    fn of(&self, ty: &str) -> TypePolicy {
        self.types.get(ty).copied().unwrap_or(TypePolicy {
            deadline_ms: 600_000,
            ..Default::default()
        })
    }
}

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
    policies: &Policies,
    head: &GraphCommit,
    cut: &Cut,
    spans: &WrittenSpans,
    actor: &str,
) -> Result<Option<FoldPlan>> {
    let mut tables = Vec::new();
    for table in graph.wal_tables() {
        let ds = graph.open_table(&table, None).await?;
        let compacted = compacted_markers(&ds).await?;
        let mut shard_plans = Vec::new();
        for bucket in 0..graph.buckets[&table] {
            let shard = shards::shard_id(&table, bucket);
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
                table: table.clone(),
                shards: shard_plans,
            });
        }
    }
    // Deferred edges are retried when nodes changed, or when one is due.
    let now = now_ms();
    let nodes_changed = tables.iter().any(|t| t.table.starts_with("nodes/"));
    let mut retry_pending = Vec::new();
    for e in graph
        .schema
        .types
        .iter()
        .filter(|t| t.kind == TypeKind::Edge)
    {
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
            retry_pending.push(e.table.clone());
        }
    }
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
    }))
}

/// What one table's writes of a fold did, recorded with each pass.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct TableOutcome {
    #[serde(skip)]
    version: u64,
    stats: TableStats,
    /// Offsets of the folded upserts, from their provenance columns: covers
    /// rows replayed from the WAL, which the run loop never saw.
    offsets: Vec<OffsetRange>,
    /// The table's last pass of this fold: once committed, the table is done.
    #[serde(default)]
    last: bool,
}

/// The rows one fold changes in one table, after validation.
#[derive(Default)]
struct Change {
    upserts: Option<RecordBatch>,
    deletes: Vec<String>,
    /// Rejected rows of this table (for its stats).
    rejected: u64,
    /// Overwrite instead of merge (pending tables).
    replace: Option<RecordBatch>,
}

/// What a fold read from the WAL, per table: newest row per id.
struct Read {
    upserts: Option<RecordBatch>,
    deletes: Vec<String>,
}

/// Executes a plan and publishes its graph commit. Idempotent: tables whose
/// last pass of this plan is committed are not written again. Returns the
/// commit and the fold's rejects (now in `_ingest_rejects`), which the
/// caller delivers to the dead-letter topic.
pub async fn execute(
    graph: &Graph,
    policies: &Policies,
    plan: &FoldPlan,
) -> Result<(GraphCommit, Vec<Reject>)> {
    // 1. Read.
    let mut read: BTreeMap<String, Read> = BTreeMap::new();
    for tp in &plan.tables {
        let (upserts, deletes) = read_generations(graph, tp).await?;
        read.insert(tp.table.clone(), Read { upserts, deletes });
    }
    // 2. Validate.
    let (mut changes, fold_rejects) = validate(graph, policies, plan, &mut read).await?;
    if policies.tolerance == Tolerance::None {
        if let Some(r) = fold_rejects.first() {
            return Err(r.intolerable());
        }
    }
    let mut rejects_rows = read.remove(REJECTS_TABLE).and_then(|r| r.upserts);
    if let Some(rows) = rejects_rows.take() {
        rejects_rows = Some(stamp_commit(&rows, &plan.commit_id)?);
    }
    if !fold_rejects.is_empty() {
        let mine = rejects::to_batch(&fold_rejects);
        rejects_rows = Some(match rejects_rows {
            Some(r) => concat_batches(&mine.schema(), &[r, mine]).ctx("rejects")?,
            None => mine,
        });
    }
    if rejects_rows.is_some() || plan.tables.iter().any(|t| t.table == REJECTS_TABLE) {
        changes.insert(
            REJECTS_TABLE.to_string(),
            Change {
                upserts: rejects_rows,
                ..Default::default()
            },
        );
    }
    // 3. Write: nodes, edges, pending, rejects (BTreeMap order puts
    // `_ingest_rejects` and `_pending/*` first; order does not matter for
    // correctness, since validation is already done).
    let mut outcomes = BTreeMap::new();
    for (table, change) in changes {
        let tp = plan.tables.iter().find(|t| t.table == table);
        let outcome = write_table(graph, plan, &table, tp, change).await?;
        outcomes.insert(table, outcome);
    }
    failpoints::hit(failpoints::FOLD_BEFORE_PUBLISH)?;
    let commit = publish(graph, plan, &outcomes).await?;
    Ok((commit, fold_rejects))
}

/// Sync rejects get the commit that folds them.
fn stamp_commit(rows: &RecordBatch, commit_id: &str) -> Result<RecordBatch> {
    let i = rows.schema().index_of("graph_commit").ctx("rejects")?;
    let mut cols = rows.columns().to_vec();
    cols[i] = Arc::new(StringArray::from(vec![commit_id; rows.num_rows()]));
    RecordBatch::try_new(rows.schema(), cols).ctx("rejects")
}

/// Node checks (`@unique`, referenced deletes), then edge checks
/// (endpoints, `@card`, `@unique`, deferral), against the parent commit's
/// tables plus this fold.
async fn validate(
    graph: &Graph,
    policies: &Policies,
    plan: &FoldPlan,
    read: &mut BTreeMap<String, Read>,
) -> Result<(BTreeMap<String, Change>, Vec<Reject>)> {
    let mut out: BTreeMap<String, Change> = BTreeMap::new();
    let mut rejects: Vec<Reject> = Vec::new();
    let mut cascade: HashMap<String, Vec<String>> = HashMap::new();
    // Node ids this fold adds and removes, per node table.
    let mut added: HashMap<String, HashSet<String>> = HashMap::new();
    let mut removed: HashMap<String, HashSet<String>> = HashMap::new();

    for ty in graph
        .schema
        .types
        .iter()
        .filter(|t| t.kind == TypeKind::Node)
    {
        let Some(r) = read.remove(&ty.table) else {
            continue;
        };
        let mut change = Change::default();
        let mut upserts = r.upserts;
        if let Some(rows) = &upserts {
            let bad = unique_violations(graph, plan, ty, rows, &r.deletes).await?;
            if !bad.is_empty() {
                for (i, msg) in &bad {
                    rejects.push(fold_reject(
                        plan,
                        ty,
                        rows,
                        *i,
                        RejectCode::Unique,
                        msg.clone(),
                    ));
                }
                change.rejected += bad.len() as u64;
                upserts = Some(drop_rows(rows, bad.iter().map(|b| b.0))?);
            }
        }
        let mut deletes = r.deletes;
        if !deletes.is_empty() {
            let policy = policies.of(&ty.name).delete;
            let refs = referencing_edges(graph, plan, ty, &deletes, read).await?;
            let mut refused = HashSet::new();
            for (node_id, edges) in refs {
                match policy {
                    DeletePolicy::Cascade => {
                        for (edge_table, edge_id) in edges {
                            cascade.entry(edge_table).or_default().push(edge_id);
                        }
                    }
                    DeletePolicy::Reject => {
                        let sample: Vec<&str> = edges
                            .iter()
                            .take(3)
                            .map(|(t, id)| {
                                let _ = t;
                                id.as_str()
                            })
                            .collect();
                        rejects.push(Reject::of_fold(
                            &plan.commit_id,
                            &format!("{}:delete:{node_id}", ty.table),
                            &ty.name,
                            RejectCode::Referenced,
                            format!(
                                "delete of {} {node_id:?} refused: {} committed edge(s) reference it (e.g. {}); on_delete_referenced = \"reject\"",
                                ty.name,
                                edges.len(),
                                sample.join(", ")
                            ),
                            Some(serde_json::json!({ "id": node_id }).to_string()),
                            None,
                            plan.created_at,
                        ));
                        change.rejected += 1;
                        refused.insert(node_id);
                    }
                }
            }
            deletes.retain(|d| !refused.contains(d));
        }
        added.insert(ty.table.clone(), id_set(upserts.as_ref()));
        removed.insert(ty.table.clone(), deletes.iter().cloned().collect());
        change.upserts = upserts;
        change.deletes = deletes;
        out.insert(ty.table.clone(), change);
    }

    for ty in graph
        .schema
        .types
        .iter()
        .filter(|t| t.kind == TypeKind::Edge)
    {
        let r = read.remove(&ty.table);
        let retry = plan.retry_pending.contains(&ty.table);
        let cascaded = cascade.remove(&ty.table).unwrap_or_default();
        if r.is_none() && !retry && cascaded.is_empty() {
            continue;
        }
        let (new_rows, mut deletes) = match r {
            Some(r) => (r.upserts, r.deletes),
            None => (None, vec![]),
        };
        let ends = ty.ends.as_ref().expect("edges have ends");
        let policy = policies.of(&ty.name);
        let pt = pending_table(&ty.table);
        let old_pending = match plan.base.get(&pt) {
            Some(&v) => {
                let ds = graph.open_table(&pt, Some(v)).await?;
                concat_all(&pending_schema(ty), read_all(&ds, None).await?)?
            }
            None => None,
        };
        let mut change = Change::default();
        // Candidates: pending first, then this fold's rows (newer wins).
        // (rows, row, pending since, from this fold's WAL)
        let mut cand: Vec<(RecordBatch, usize, i64, bool)> = Vec::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        let explicit_deletes: HashSet<String> = deletes.iter().cloned().collect();
        let mut push = |b: &RecordBatch, i: usize, since: i64, fresh: bool| {
            let id = str_at(b, ID, i);
            if explicit_deletes.contains(&id) {
                return;
            }
            match seen.get(&id) {
                Some(&k) => {
                    let keep_since = cand[k].2;
                    cand[k] = (b.clone(), i, keep_since.min(since), fresh);
                }
                None => {
                    seen.insert(id, cand.len());
                    cand.push((b.clone(), i, since, fresh));
                }
            }
        };
        if let Some(p) = &old_pending {
            let since = p
                .column_by_name(PENDING_SINCE)
                .and_then(|c| c.as_any().downcast_ref::<TimestampMillisecondArray>())
                .cloned()
                .ok_or_else(|| Error::Corrupt(format!("{pt} lacks {PENDING_SINCE}")))?;
            let p = p
                .project(&(0..ty.table_schema.fields().len()).collect::<Vec<_>>())
                .ctx(&pt)?;
            for i in 0..p.num_rows() {
                push(&p, i, since.value(i), false);
            }
        }
        if let Some(b) = &new_rows {
            for i in 0..b.num_rows() {
                push(b, i, plan.created_at, true);
            }
        }
        // Endpoints: base at the parent commit ∪ this fold's nodes − its deletes.
        let mut want: HashMap<&str, HashSet<String>> = HashMap::new();
        for (b, i, _, _) in &cand {
            want.entry(ends.from.as_str())
                .or_default()
                .insert(str_at(b, "src", *i));
            want.entry(ends.to.as_str())
                .or_default()
                .insert(str_at(b, "dst", *i));
        }
        let mut exists: HashMap<&str, HashSet<String>> = HashMap::new();
        for (node, ids) in &want {
            let nt = graph.schema.get(node).expect("endpoint types exist");
            let mut found = existing_ids(graph, plan, &nt.table, ids).await?;
            if let Some(rm) = removed.get(&nt.table) {
                found.retain(|id| !rm.contains(id));
            }
            if let Some(add) = added.get(&nt.table) {
                found.extend(ids.iter().filter(|id| add.contains(*id)).cloned());
            }
            exists.insert(node, found);
        }
        let mut resolved: Vec<(RecordBatch, usize)> = Vec::new();
        let mut pending: Vec<(RecordBatch, usize, i64, bool)> = Vec::new();
        for (b, i, since, fresh) in cand {
            let src = str_at(&b, "src", i);
            let dst = str_at(&b, "dst", i);
            let src_ok = exists[ends.from.as_str()].contains(&src);
            let dst_ok = exists[ends.to.as_str()].contains(&dst);
            if src_ok && dst_ok {
                resolved.push((b, i));
                continue;
            }
            let missing = match (src_ok, dst_ok) {
                (false, false) => format!("src {} {src:?} and dst {} {dst:?}", ends.from, ends.to),
                (false, true) => format!("src {} {src:?}", ends.from),
                _ => format!("dst {} {dst:?}", ends.to),
            };
            let overdue = plan.created_at - since >= policy.deadline_ms;
            if policy.endpoint == EndpointPolicy::Reject || overdue {
                let why = if policy.endpoint == EndpointPolicy::Reject {
                    "on_missing_endpoint = \"reject\"".to_string()
                } else {
                    format!(
                        "still missing after the endpoint_deadline of {} ms",
                        policy.deadline_ms
                    )
                };
                rejects.push(fold_reject(
                    plan,
                    ty,
                    &b,
                    i,
                    RejectCode::EndpointNotFound,
                    format!(
                        "edge {} {:?}: {missing} not found ({why})",
                        ty.name,
                        str_at(&b, ID, i)
                    ),
                ));
                change.rejected += 1;
            } else {
                pending.push((b, i, since, fresh));
            }
        }
        // Bounded pending: the oldest go first.
        if pending.len() > policies.max_pending_edges {
            pending.sort_by_key(|(b, i, since, _)| (*since, str_at(b, ID, *i)));
            let over = pending.len() - policies.max_pending_edges;
            for (b, i, _, _) in pending.drain(..over) {
                rejects.push(fold_reject(
                    plan,
                    ty,
                    &b,
                    i,
                    RejectCode::PendingOverflow,
                    format!(
                        "more than errors.max_pending_edges = {} edges of {} wait for endpoints; the oldest is rejected",
                        policies.max_pending_edges, ty.name
                    ),
                ));
                change.rejected += 1;
            }
        }
        let resolved = rows_of(&ty.table_schema, &resolved)?;
        // @card and @unique over the base at the parent commit.
        let mut upserts = resolved;
        if let Some(rows) = &upserts {
            let mut bad = card_violations(
                graph,
                plan,
                ty,
                rows,
                &mut deletes,
                &cascaded,
                &mut rejects,
                &mut change,
            )
            .await?;
            let all_deletes: Vec<String> = deletes.iter().chain(&cascaded).cloned().collect();
            let already: HashSet<usize> = bad.iter().map(|b| b.0).collect();
            for (i, m) in unique_violations(graph, plan, ty, rows, &all_deletes).await? {
                if !already.contains(&i) {
                    bad.push((i, m));
                }
            }
            for (i, code, msg) in bad.iter().map(|(i, m)| {
                let code = if m.starts_with("@card") {
                    RejectCode::Cardinality
                } else {
                    RejectCode::Unique
                };
                (*i, code, m.clone())
            }) {
                rejects.push(fold_reject(plan, ty, rows, i, code, msg));
                change.rejected += 1;
            }
            if !bad.is_empty() {
                upserts = Some(drop_rows(rows, bad.iter().map(|b| b.0))?);
            }
        } else if !deletes.is_empty() {
            card_violations(
                graph,
                plan,
                ty,
                &RecordBatch::new_empty(ty.table_schema.clone()),
                &mut deletes,
                &cascaded,
                &mut rejects,
                &mut change,
            )
            .await?;
        }
        deletes.extend(cascaded);
        change.upserts = upserts.filter(|u| u.num_rows() > 0);
        change.deletes = deletes;
        out.insert(ty.table.clone(), change);
        // The pending table is rewritten when its set changed.
        let before: BTreeSet<(String, i64)> = match &old_pending {
            Some(p) => {
                let since = p
                    .column_by_name(PENDING_SINCE)
                    .unwrap()
                    .as_any()
                    .downcast_ref::<TimestampMillisecondArray>()
                    .unwrap();
                (0..p.num_rows())
                    .map(|i| (str_at(p, ID, i), since.value(i)))
                    .collect()
            }
            None => BTreeSet::new(),
        };
        let after: BTreeSet<(String, i64)> = pending
            .iter()
            .map(|(b, i, s, _)| (str_at(b, ID, *i), *s))
            .collect();
        // A pending edge rewritten by this fold changes the table too.
        if before != after || pending.iter().any(|p| p.3) {
            let schema = pending_schema(ty);
            let picks: Vec<(RecordBatch, usize)> =
                pending.iter().map(|(b, i, _, _)| (b.clone(), *i)).collect();
            let rows = rows_of(&ty.table_schema, &picks)?;
            let mut cols: Vec<ArrayRef> = match rows {
                Some(r) => r.columns().to_vec(),
                None => ty
                    .table_schema
                    .fields()
                    .iter()
                    .map(|f| arrow::array::new_empty_array(f.data_type()))
                    .collect(),
            };
            cols.push(Arc::new(
                pending
                    .iter()
                    .map(|(_, _, s, _)| Some(*s))
                    .collect::<TimestampMillisecondArray>()
                    .with_timezone("UTC"),
            ));
            let batch = RecordBatch::try_new(schema, cols).ctx(&pt)?;
            out.insert(
                pt,
                Change {
                    replace: Some(batch),
                    ..Default::default()
                },
            );
        }
    }
    Ok((out, rejects))
}

/// `@card(min..max)` per `src`: new edges past `max` are rejected (the
/// earliest are kept), and explicit deletes that would take a `src` below
/// `min` are refused (cascaded deletes are not: their node is gone).
/// Returns the violating rows of `rows`; refused deletes leave `deletes`.
#[allow(clippy::too_many_arguments)]
async fn card_violations(
    graph: &Graph,
    plan: &FoldPlan,
    ty: &GraphType,
    rows: &RecordBatch,
    deletes: &mut Vec<String>,
    cascaded: &[String],
    rejects: &mut Vec<Reject>,
    change: &mut Change,
) -> Result<Vec<(usize, String)>> {
    let ends = ty.ends.as_ref().expect("edge");
    if ends.card_max.is_none() && ends.card_min == 0 {
        return Ok(vec![]);
    }
    let card = format!(
        "@card({}..{})",
        ends.card_min,
        ends.card_max.map(|m| m.to_string()).unwrap_or_default()
    );
    let base = match plan.base.get(&ty.table) {
        Some(&v) => {
            read_all(
                &graph.open_table(&ty.table, Some(v)).await?,
                Some(&[ID, "src"]),
            )
            .await?
        }
        None => vec![],
    };
    let mut src_of: HashMap<String, String> = HashMap::new();
    let mut count: HashMap<String, u64> = HashMap::new();
    for b in &base {
        for i in 0..b.num_rows() {
            let (id, src) = (str_at(b, ID, i), str_at(b, "src", i));
            *count.entry(src.clone()).or_default() += 1;
            src_of.insert(id, src);
        }
    }
    for id in cascaded {
        if let Some(src) = src_of.remove(id) {
            *count.get_mut(&src).expect("counted") -= 1;
        }
    }
    let mut refused = HashSet::new();
    for id in deletes.iter() {
        let Some(src) = src_of.get(id).cloned() else {
            continue;
        };
        let c = count.get_mut(&src).expect("counted");
        if *c <= ends.card_min as u64 {
            refused.insert(id.clone());
            rejects.push(Reject::of_fold(
                &plan.commit_id,
                &format!("{}:delete:{id}", ty.table),
                &ty.name,
                RejectCode::Cardinality,
                format!("delete of edge {} {id:?} refused: src {src:?} would have fewer than {card} allows", ty.name),
                Some(serde_json::json!({ "id": id, "src": src }).to_string()),
                None,
                plan.created_at,
            ));
            change.rejected += 1;
        } else {
            *c -= 1;
            src_of.remove(id);
        }
    }
    deletes.retain(|d| !refused.contains(d));
    let mut bad = Vec::new();
    if let Some(max) = ends.card_max {
        let mut order: Vec<usize> = (0..rows.num_rows()).collect();
        order.sort_by_key(|&i| provenance_key(rows, i));
        for i in order {
            let (id, src) = (str_at(rows, ID, i), str_at(rows, "src", i));
            if src_of.get(&id) == Some(&src) {
                continue; // an update that keeps its src
            }
            let c = count.entry(src.clone()).or_default();
            if *c >= max as u64 {
                bad.push((
                    i,
                    format!("{card}: src {src:?} already has {c} edge(s) of {}", ty.name),
                ));
                continue;
            }
            *c += 1;
            if let Some(old) = src_of.insert(id, src) {
                *count.get_mut(&old).expect("counted") -= 1;
            }
        }
    }
    Ok(bad)
}

/// Rows of `rows` whose `@unique` tuple another row holds: another row of
/// this fold (the first keeps it) or a base row at the parent commit that
/// this fold neither deletes nor rewrites.
async fn unique_violations(
    graph: &Graph,
    plan: &FoldPlan,
    ty: &GraphType,
    rows: &RecordBatch,
    deletes: &[String],
) -> Result<Vec<(usize, String)>> {
    let mut bad: BTreeMap<usize, String> = BTreeMap::new();
    if ty.constraints.uniques.is_empty() {
        return Ok(vec![]);
    }
    let gone: HashSet<&String> = deletes.iter().collect();
    // Claimants in Kafka order per partition (provenance), so the earliest
    // record keeps a contested tuple whatever shard it came through.
    let mut order: Vec<usize> = (0..rows.num_rows()).collect();
    order.sort_by_key(|&i| provenance_key(rows, i));
    for u in &ty.constraints.uniques {
        let cols: Vec<&str> = u.iter().map(String::as_str).collect();
        let mut new_tuple: HashMap<String, Option<String>> = HashMap::new();
        for i in 0..rows.num_rows() {
            new_tuple.insert(str_at(rows, ID, i), tuple(rows, &cols, i)?);
        }
        // Base holders that still hold their tuple after this fold.
        let mut held: HashMap<String, String> = HashMap::new();
        if let Some(&v) = plan.base.get(&ty.table) {
            let mut proj = vec![ID];
            proj.extend(&cols);
            let ds = graph.open_table(&ty.table, Some(v)).await?;
            for b in read_all(&ds, Some(&proj)).await? {
                for i in 0..b.num_rows() {
                    let id = str_at(&b, ID, i);
                    if gone.contains(&id) {
                        continue;
                    }
                    let Some(t) = tuple(&b, &cols, i)? else {
                        continue;
                    };
                    let keeps = new_tuple.get(&id).is_none_or(|n| n.as_ref() == Some(&t));
                    if keeps {
                        held.insert(t, id);
                    }
                }
            }
        }
        for &i in &order {
            let Some(t) = tuple(rows, &cols, i)? else {
                continue;
            };
            let id = str_at(rows, ID, i);
            match held.get(&t) {
                Some(other) if *other != id => {
                    bad.entry(i).or_insert_with(|| {
                        format!(
                            "@unique({}) = {t} is already held by {} {other:?}",
                            u.join(", "),
                            ty.name
                        )
                    });
                }
                Some(_) => {}
                None => {
                    held.insert(t, id);
                }
            }
        }
    }
    Ok(bad.into_iter().collect())
}

/// A row's source coordinates, for ordering claimants.
fn provenance_key(rows: &RecordBatch, i: usize) -> (String, i32, i64) {
    let p = rows
        .column_by_name(SRC_PARTITION)
        .and_then(|c| c.as_any().downcast_ref::<Int32Array>())
        .filter(|c| c.is_valid(i))
        .map_or(-1, |c| c.value(i));
    let o = rows
        .column_by_name(SRC_OFFSET)
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
        .filter(|c| c.is_valid(i))
        .map_or(-1, |c| c.value(i));
    (str_at(rows, SRC_TOPIC, i), p, o)
}

/// The JSON array of a row's values in `cols`, or None when one is null.
fn tuple(b: &RecordBatch, cols: &[&str], i: usize) -> Result<Option<String>> {
    let mut parts = Vec::with_capacity(cols.len());
    for c in cols {
        let col = b
            .column_by_name(c)
            .ok_or_else(|| Error::Corrupt(format!("no column {c} for @unique")))?;
        if col.is_null(i) {
            return Ok(None);
        }
        let text = arrow::compute::cast(&col.slice(i, 1), &DataType::Utf8).ctx("unique tuple")?;
        let text = text.as_any().downcast_ref::<StringArray>().expect("utf8");
        parts.push(text.value(0).to_string());
    }
    Ok(Some(serde_json::to_string(&parts).expect("strings")))
}

/// Committed edges (at the parent commit) that reference any of `nodes`,
/// minus edges this fold deletes, grouped by node id.
async fn referencing_edges(
    graph: &Graph,
    plan: &FoldPlan,
    node: &GraphType,
    nodes: &[String],
    read: &BTreeMap<String, Read>,
) -> Result<BTreeMap<String, Vec<(String, String)>>> {
    let wanted: HashSet<&str> = nodes.iter().map(String::as_str).collect();
    let mut out: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for e in graph
        .schema
        .types
        .iter()
        .filter(|t| t.kind == TypeKind::Edge)
    {
        let ends = e.ends.as_ref().expect("edge");
        let (by_src, by_dst) = (ends.from == node.name, ends.to == node.name);
        if !by_src && !by_dst {
            continue;
        }
        let Some(&v) = plan.base.get(&e.table) else {
            continue;
        };
        let deleted: HashSet<&str> = read
            .get(&e.table)
            .map(|r| r.deletes.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let ds = graph.open_table(&e.table, Some(v)).await?;
        for b in read_all(&ds, Some(&[ID, "src", "dst"])).await? {
            for i in 0..b.num_rows() {
                let id = str_at(&b, ID, i);
                if deleted.contains(id.as_str()) {
                    continue;
                }
                let mut hit = BTreeSet::new();
                if by_src {
                    hit.insert(str_at(&b, "src", i));
                }
                if by_dst {
                    hit.insert(str_at(&b, "dst", i));
                }
                for n in hit {
                    if wanted.contains(n.as_str()) {
                        out.entry(n)
                            .or_default()
                            .push((e.table.clone(), id.clone()));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Which of `ids` exist in `table` at the parent commit.
async fn existing_ids(
    graph: &Graph,
    plan: &FoldPlan,
    table: &str,
    ids: &HashSet<String>,
) -> Result<HashSet<String>> {
    let Some(&v) = plan.base.get(table) else {
        return Ok(HashSet::new());
    };
    let ds = graph.open_table(table, Some(v)).await?;
    let mut found = HashSet::new();
    for b in read_all(&ds, Some(&[ID])).await? {
        let col = b
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .expect("id");
        for id in col.iter().flatten() {
            if ids.contains(id) {
                found.insert(id.to_string());
            }
        }
    }
    Ok(found)
}

/// When the oldest edge of a `_pending/<Edge>` table was first deferred.
pub async fn oldest_pending(ds: &Dataset) -> Result<Option<i64>> {
    Ok(read_all(ds, Some(&[PENDING_SINCE]))
        .await?
        .iter()
        .filter_map(|b| {
            arrow::compute::min(
                b.column(0)
                    .as_any()
                    .downcast_ref::<TimestampMillisecondArray>()?,
            )
        })
        .min())
}

async fn read_all(ds: &Dataset, cols: Option<&[&str]>) -> Result<Vec<RecordBatch>> {
    let mut scan = ds.scan();
    if let Some(c) = cols {
        scan.project(c).ctx(ds.uri())?;
    }
    scan.try_into_stream()
        .await
        .ctx(ds.uri())?
        .try_collect()
        .await
        .ctx(ds.uri())
}

fn concat_all(schema: &SchemaRef, batches: Vec<RecordBatch>) -> Result<Option<RecordBatch>> {
    let batches: Vec<RecordBatch> = batches.into_iter().filter(|b| b.num_rows() > 0).collect();
    if batches.is_empty() {
        return Ok(None);
    }
    let _ = schema;
    concat_batches(&batches[0].schema(), &batches)
        .map(Some)
        .ctx("concat")
}

fn str_at(b: &RecordBatch, col: &str, i: usize) -> String {
    b.column_by_name(col)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .map(|c| c.value(i).to_string())
        .unwrap_or_default()
}

fn id_set(rows: Option<&RecordBatch>) -> HashSet<String> {
    rows.map(|r| (0..r.num_rows()).map(|i| str_at(r, ID, i)).collect())
        .unwrap_or_default()
}

/// Selected rows of several batches (all in `schema`), as one batch.
fn rows_of(schema: &SchemaRef, picks: &[(RecordBatch, usize)]) -> Result<Option<RecordBatch>> {
    if picks.is_empty() {
        return Ok(None);
    }
    let parts: Vec<RecordBatch> = picks
        .iter()
        .map(|(b, i)| {
            let cols = (0..schema.fields().len()).collect::<Vec<_>>();
            b.project(&cols).map(|p| p.slice(*i, 1))
        })
        .collect::<std::result::Result<_, _>>()
        .ctx("pick rows")?;
    let one = concat_batches(&parts[0].schema(), &parts).ctx("pick rows")?;
    RecordBatch::try_new(schema.clone(), one.columns().to_vec())
        .map(Some)
        .ctx("pick rows")
}

fn drop_rows(rows: &RecordBatch, bad: impl Iterator<Item = usize>) -> Result<RecordBatch> {
    let mut keep = vec![true; rows.num_rows()];
    for i in bad {
        keep[i] = false;
    }
    filter_record_batch(rows, &BooleanArray::from(keep)).ctx("drop rejected rows")
}

/// A fold reject of row `i` of `rows` (a table's rows, with provenance).
fn fold_reject(
    plan: &FoldPlan,
    ty: &GraphType,
    rows: &RecordBatch,
    i: usize,
    code: RejectCode,
    message: String,
) -> Reject {
    let id = str_at(rows, ID, i);
    let topic = rows
        .column_by_name(SRC_TOPIC)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .filter(|c| c.is_valid(i))
        .map(|c| c.value(i).to_string());
    let part = rows
        .column_by_name(SRC_PARTITION)
        .and_then(|c| c.as_any().downcast_ref::<Int32Array>())
        .filter(|c| c.is_valid(i))
        .map(|c| c.value(i));
    let off = rows
        .column_by_name(SRC_OFFSET)
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
        .filter(|c| c.is_valid(i))
        .map(|c| c.value(i));
    let ts = rows
        .column_by_name(SRC_TIMESTAMP)
        .and_then(|c| c.as_any().downcast_ref::<TimestampMillisecondArray>())
        .filter(|c| c.is_valid(i))
        .map(|c| c.value(i));
    let source = match (topic, part, off) {
        (Some(t), Some(p), Some(o)) => Some((t, p, o, ts)),
        _ => None,
    };
    Reject::of_fold(
        &plan.commit_id,
        &format!("{}:upsert:{id}", ty.table),
        &ty.name,
        code,
        message,
        crate::schema::row_json(rows, i),
        source,
        plan.created_at,
    )
}

/// Writes one table's change: a delete pass and an upsert pass (merge-insert
/// on the primary key) or an overwrite, each commit carrying the plan. The
/// last pass carries the compacted markers of the plan's shards.
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
    let markers: Vec<CompactedSsTable> = tp
        .map(|tp| {
            tp.shards
                .iter()
                .map(|s| CompactedSsTable::new(s.shard, s.upto))
                .collect()
        })
        .unwrap_or_default();
    let plan_json = serde_json::to_string(plan).expect("serializable");
    let pk = if table == REJECTS_TABLE {
        REJECT_ID
    } else {
        ID
    };
    let mut ds = Arc::new(ds);

    if let Some(rows) = change.replace {
        let pass = TableOutcome {
            stats: TableStats {
                upserted: rows.num_rows() as u64,
                ..Default::default()
            },
            last: true,
            ..Default::default()
        };
        let params = WriteParams {
            mode: WriteMode::Overwrite,
            transaction_properties: Some(Arc::new(pass_properties(&plan_json, &pass))),
            ..Default::default()
        };
        let written = InsertBuilder::new(ds.clone())
            .with_params(&params)
            .execute(vec![rows])
            .await
            .ctx(format!("rewrite {table}"))?;
        let mut out = pass;
        out.version = written.version().version;
        return Ok(out);
    }

    let has_upserts = change.upserts.as_ref().is_some_and(|u| u.num_rows() > 0);
    // A table whose rows were all rejected still advances its markers: a
    // delete pass of no key that exists carries them.
    let deletes = if change.deletes.is_empty() && !has_upserts {
        vec![String::new()]
    } else {
        change.deletes
    };
    if !deletes.is_empty() {
        let last = !has_upserts;
        let keys = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new(pk, DataType::Utf8, false)])),
            vec![Arc::new(StringArray::from(deletes)) as ArrayRef],
        )
        .ctx("delete keys")?;
        let mut b = MergeInsertBuilder::try_new(ds.clone(), vec![pk.into()]).ctx(table)?;
        b.when_matched(WhenMatched::Delete)
            .when_not_matched(WhenNotMatched::DoNothing)
            .conflict_retries(0);
        if last && !markers.is_empty() {
            b.mark_sstables_as_compacted(markers.clone());
        }
        let staged = b
            .try_build()
            .ctx(table)?
            .execute_uncommitted_batches(vec![keys])
            .await
            .ctx(format!("fold deletes into {table}"))?;
        let pass = TableOutcome {
            stats: TableStats {
                deleted: staged.stats.num_deleted_rows,
                rejected: if last { change.rejected } else { 0 },
                upserted: 0,
            },
            last,
            ..Default::default()
        };
        ds = Arc::new(commit_staged(ds, staged.transaction, &plan_json, &pass).await?);
        failpoints::hit(failpoints::FOLD_BETWEEN_PASSES)?;
    }
    if let Some(rows) = change.upserts.filter(|u| u.num_rows() > 0) {
        let offsets = if table == REJECTS_TABLE {
            vec![]
        } else {
            provenance_ranges(&rows)?
        };
        let mut b = MergeInsertBuilder::try_new(ds.clone(), vec![pk.into()]).ctx(table)?;
        b.when_matched(WhenMatched::UpdateAll)
            .when_not_matched(WhenNotMatched::InsertAll)
            .conflict_retries(0);
        if !markers.is_empty() {
            b.mark_sstables_as_compacted(markers);
        }
        let staged = b
            .try_build()
            .ctx(table)?
            .execute_uncommitted_batches(vec![rows])
            .await
            .ctx(format!("fold upserts into {table}"))?;
        let pass = TableOutcome {
            stats: TableStats {
                upserted: staged.stats.num_inserted_rows + staged.stats.num_updated_rows,
                deleted: 0,
                rejected: change.rejected,
            },
            offsets,
            last: true,
            ..Default::default()
        };
        ds = Arc::new(commit_staged(ds, staged.transaction, &plan_json, &pass).await?);
    }
    // Keep fold cost flat in history: small fragments are merged in a
    // commit of this plan, so recovery knows it as the fold's own.
    if ds.get_fragments().len() > COMPACT_FRAGMENTS {
        let mut d = Arc::try_unwrap(ds).unwrap_or_else(|a| (*a).clone());
        let pass = TableOutcome {
            last: true,
            ..Default::default()
        };
        let options = lance::dataset::optimize::CompactionOptions::default()
            .transaction_properties(pass_properties(&plan_json, &pass));
        lance::dataset::optimize::compact_files(&mut d, options, None)
            .await
            .ctx(format!("compact {table}"))?;
        ds = Arc::new(d);
    }
    // Sum every pass of this plan, including passes of a crashed attempt.
    let mut outcome = committed_outcome(&ds, &plan.commit_id)
        .await?
        .unwrap_or_default();
    outcome.version = ds.version().version;
    Ok(outcome)
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

/// The newest row per key across the planned generations (ascending), split
/// into upserts (base columns) and deleted keys.
async fn read_generations(
    graph: &Graph,
    tp: &TablePlan,
) -> Result<(Option<RecordBatch>, Vec<String>)> {
    let pk = if tp.table == REJECTS_TABLE {
        REJECT_ID
    } else {
        ID
    };
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
    if batches.is_empty() {
        return Ok((None, vec![]));
    }
    // The newest row per key, as (batch, row) in WAL order, without first
    // concatenating the generations: the fold holds the rows it read plus
    // the rows it keeps, not several copies of everything.
    let mut last: HashMap<&str, (usize, usize)> = HashMap::new();
    for (b, batch) in batches.iter().enumerate() {
        let ids = batch
            .column_by_name(pk)
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .ok_or_else(|| Error::Corrupt(format!("{}: generation without {pk}", tp.table)))?;
        for r in 0..ids.len() {
            last.insert(ids.value(r), (b, r));
        }
    }
    let mut newest: Vec<(usize, usize)> = last.into_values().collect();
    newest.sort_unstable();
    // Looked up once per batch, not once per row.
    let tombstones: Vec<Option<&BooleanArray>> = batches
        .iter()
        .map(|b| {
            b.column_by_name(TOMBSTONE)
                .and_then(|c| c.as_any().downcast_ref::<BooleanArray>())
        })
        .collect();
    let is_tombstone =
        |b: usize, r: usize| tombstones[b].is_some_and(|t| t.is_valid(r) && t.value(r));
    let (deleted, upserted): (Vec<_>, Vec<_>) =
        newest.into_iter().partition(|&(b, r)| is_tombstone(b, r));
    let deletes: Vec<String> = deleted
        .iter()
        .map(|&(b, r)| str_at(&batches[b], pk, r))
        .collect();
    if upserted.is_empty() {
        return Ok((None, deletes));
    }
    // Only the base columns, so the interleave copies nothing it drops.
    // Tombstone rows hold nulls in required columns, so the sources are
    // typed as nullable; the picked upserts must fit the base schema.
    let loose: SchemaRef = Arc::new(Schema::new(
        base_schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ));
    let projected: Vec<RecordBatch> = batches
        .iter()
        .map(|batch| {
            let cols: Vec<ArrayRef> = base_schema
                .fields()
                .iter()
                .map(|f| {
                    batch.column_by_name(f.name()).cloned().ok_or_else(|| {
                        Error::Corrupt(format!("generation lacks column {}", f.name()))
                    })
                })
                .collect::<Result<_>>()?;
            RecordBatch::try_new(loose.clone(), cols).ctx("generation columns")
        })
        .collect::<Result<_>>()?;
    drop(batches);
    let picked =
        arrow::compute::interleave_record_batch(&projected.iter().collect::<Vec<_>>(), &upserted)
            .ctx("newest per id")?;
    let upserts = RecordBatch::try_new(base_schema, picked.columns().to_vec())
        .ctx("upserts in base schema")?;
    Ok((Some(upserts), deletes))
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
            dead_letters_delivered: plan.dead_letters_delivered,
        };
        match graph.publish(&commit).await {
            Ok(()) => {
                tracing::info!(commit = %commit.id, seq = commit.seq, "published graph commit");
                // Reading the head scans __manifest: keep its fragments few.
                if let Err(e) = graph.compact_manifest(COMPACT_FRAGMENTS).await {
                    tracing::warn!(error = %e, "could not compact __manifest; the next fold retries");
                }
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
pub async fn recover(graph: &Graph, policies: &Policies) -> Result<Option<GraphCommit>> {
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
    execute(graph, policies, &plan).await.map(|(c, _)| Some(c))
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
            t.stats.rejected += pass.stats.rejected;
            t.offsets.extend(pass.offsets);
            t.last |= pass.last;
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
    pub policies: Policies,
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
    /// Where fold rejects go once their commit is published.
    pub(crate) dead_letters: DeadLetters,
    /// Newest commit whose fold rejects are all delivered.
    pub delivered: u64,
    /// Gives up a dead-letter delivery that keeps failing (shutdown).
    pub stop_delivery: tokio_util::sync::CancellationToken,
}

impl FoldLoop {
    pub async fn run(mut self) -> Result<()> {
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
    async fn fold_once(&mut self, spans: &mut WrittenSpans) -> Result<bool> {
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
        if let Some(mut plan) = plan(
            &self.graph,
            &self.policies,
            &head,
            &Some(limits),
            spans,
            &self.actor,
        )
        .await?
        {
            plan.dead_letters_delivered = plan.dead_letters_delivered.max(self.delivered);
            let (commit, rejects) = execute(&self.graph, &self.policies, &plan).await?;
            *spans = WrittenSpans::default();
            // Published first, then produced: a crash in between re-delivers
            // on the next start (at least once, by reject_id).
            failpoints::hit(failpoints::FOLD_BEFORE_DEAD_LETTERS)?;
            if !rejects.is_empty() {
                self.dead_letters
                    .deliver(&rejects, &self.stop_delivery)
                    .await?;
                self.graph.set_dead_letters_delivered(commit.seq).await?;
            }
            // Every earlier commit's rejects went out before this fold.
            self.delivered = commit.seq;
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
    policies: &Policies,
    wal: &crate::config::WalSettings,
    actor: &str,
) -> Result<Option<GraphCommit>> {
    recover(graph, policies).await?;
    let pool = shards::ShardPool::open(graph, wal, &graph.wal_tables()).await?;
    pool.close().await?;
    let head = graph.head().await?;
    // Its fold rejects reach the dead-letter topic when the connector next
    // starts (`redeliver`): this tool has no producer.
    match plan(graph, policies, &head, &None, &WrittenSpans::default(), actor).await? {
        Some(p) => execute(graph, policies, &p).await.map(|(c, _)| Some(c)),
        None => Ok(None),
    }
}

/// Fold rejects of published commits newer than the head's delivery mark:
/// what a crash between a publish and its dead-letter produce left undelivered.
pub async fn undelivered(graph: &Graph) -> Result<(u64, Vec<Reject>)> {
    let head = graph.head().await?;
    let mark = graph.dead_letters_delivered().await?;
    if head.seq <= mark {
        return Ok((head.seq, vec![]));
    }
    let commits: Vec<GraphCommit> = graph
        .commits()
        .await?
        .into_iter()
        .filter(|c| c.seq > mark)
        .filter(|c| c.stats.values().any(|s| s.rejected > 0))
        .collect();
    if commits.is_empty() {
        return Ok((head.seq, vec![]));
    }
    let ds = graph
        .open_table(REJECTS_TABLE, head.tables.get(REJECTS_TABLE).copied())
        .await?;
    let ids: Vec<String> = commits.iter().map(|c| format!("'{}'", c.id)).collect();
    let mut scan = ds.scan();
    scan.filter(&format!(
        "stage = 'fold' AND graph_commit IN ({})",
        ids.join(", ")
    ))
    .ctx("undelivered rejects")?;
    let batches: Vec<RecordBatch> = scan
        .try_into_stream()
        .await
        .ctx("undelivered rejects")?
        .try_collect()
        .await
        .ctx("undelivered rejects")?;
    let mut out = Vec::new();
    for b in &batches {
        out.extend(rejects::from_batch(b)?);
    }
    out.sort_by(|a, b| a.reject_id.cmp(&b.reject_id));
    Ok((head.seq, out))
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
