//! Fold cost against graph history: the same fold (rows, buckets) timed at
//! about commit 10 and at about commit 1,000 of one graph, with small filler
//! folds in between. Runs in process, without Kafka: rows go through the
//! decoder and the shard writers exactly as the run loop sends them, and
//! each fold is the fold loop's own cut → plan → execute → publish.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use graphsink::testing::ShardPool;
use graphsink::testing::WrittenSpans;
use graphsink::testing::{RecordDecoder, SourceRecord};
use graphsink::Graph;
use serde::Serialize;

use crate::broker::BoxError;
use crate::workload::{self, Shape};

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Probe {
    /// The seq of the measured commit.
    pub commit: u64,
    pub rows: usize,
    /// cut (freeze + flush) → published.
    pub fold_secs: f64,
    /// Of which: reading the head commit (`__manifest`).
    pub head_secs: f64,
    /// Of which: planning.
    pub plan_secs: f64,
    pub manifest_fragments: usize,
    pub table_fragments: usize,
}

/// Builds a graph of `upto` commits: measured folds of `rows` rows at each
/// commit in `probes`, filler folds of `filler` rows otherwise.
pub(crate) async fn run(
    dir: &Path,
    buckets: u32,
    rows: usize,
    filler: usize,
    probes: &[u64],
    upto: u64,
) -> Result<Vec<Probe>, BoxError> {
    std::fs::write(dir.join("bench.pg"), workload::SCHEMA)?;
    let cfg = graphsink::Config::from_toml(
        &format!(
            "[graph]\nroot = \"history\"\nschema = \"bench.pg\"\n[kafka]\n\"bootstrap.servers\" = \"unused:1\"\n\"group.id\" = \"unused\"\n[wal]\nbuckets = {buckets}\n[[mapping]]\ntopic = \"items\"\nnode = \"{}\"\n",
            workload::NODE
        ),
        dir,
    )?;
    let schema = graphsink::GraphSchema::load(&cfg.schema_path())?;
    let graph = Graph::open_or_init(&cfg, schema).await?;
    let policies = graphsink::testing::Policies::from_config(&cfg);
    let mut decoder =
        RecordDecoder::new(graph.schema(), &cfg.mappings[0], rows.max(filler), 1 << 20)?;
    let pool = ShardPool::open(&graph, &cfg.wal, &graph.wal_tables()).await?;
    let table = graph.schema().types[0].table.clone();
    let shape = Shape::nodes_only((rows as u64 * 4).max(1), 100);
    let mut offset = 0i64;
    let mut out = Vec::new();
    for seq in 1..=upto {
        let n = if probes.contains(&seq) { rows } else { filler };
        write_records(&mut decoder, &pool, &table, shape, offset, n).await?;
        offset += n as i64;
        let fold = timed_fold(&graph, &policies, &pool).await?;
        if probes.contains(&seq) {
            let manifest = graph.open_table("__manifest", None).await?;
            let data = graph.open_table(&table, None).await?;
            let p = Probe {
                commit: fold.commit.seq,
                rows: n,
                fold_secs: fold.fold_secs,
                head_secs: fold.head_secs,
                plan_secs: fold.plan_secs,
                manifest_fragments: manifest.get_fragments().len(),
                table_fragments: data.get_fragments().len(),
            };
            eprintln!("  {p:?}");
            out.push(p);
        }
    }
    pool.close().await?;
    Ok(out)
}

/// Decodes `n` node records from `offset` on and waits until their WAL
/// writes are durable.
async fn write_records(
    decoder: &mut RecordDecoder,
    pool: &ShardPool,
    table: &str,
    shape: Shape,
    offset: i64,
    n: usize,
) -> Result<(), BoxError> {
    let values: Vec<String> = (0..n)
        .map(|i| workload::node_record(shape, 7, offset as u64 + i as u64).1)
        .collect();
    let recs: Vec<SourceRecord<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| SourceRecord {
            topic: "items",
            partition: 0,
            offset: offset + i as i64,
            timestamp: None,
            key: None,
            value: Some(v.as_bytes()),
            message: None,
        })
        .collect();
    let decoded = decoder.decode(&recs)?;
    let mut writes = Vec::new();
    if let Some(u) = decoded.upserts {
        writes.extend(pool.tables[table].put(u).await?);
    }
    for w in writes {
        w.wait().await?;
    }
    Ok(())
}

/// One fold as the fold loop makes it (cut, plan, execute, publish), timed.
pub(crate) struct TimedFold {
    pub commit: graphsink::GraphCommit,
    pub rejects: usize,
    pub fold_secs: f64,
    pub head_secs: f64,
    pub plan_secs: f64,
    pub stages: graphsink::testing::StageTimes,
}

pub(crate) async fn timed_fold(
    graph: &Graph,
    policies: &graphsink::testing::Policies,
    pool: &ShardPool,
) -> Result<TimedFold, BoxError> {
    let start = Instant::now();
    let mut limits = HashMap::new();
    for f in pool.freeze_all().await? {
        limits.insert(f.shard, f.upto_generation);
        f.fence.wait().await?;
    }
    let t_head = Instant::now();
    let head = graph.head().await?;
    let head_secs = t_head.elapsed().as_secs_f64();
    let t_plan = Instant::now();
    let plan = graphsink::testing::plan(
        graph,
        policies,
        &head,
        &Some(limits),
        &WrittenSpans::default(),
        "bench",
    )
    .await?
    .ok_or("nothing to fold")?;
    let plan_secs = t_plan.elapsed().as_secs_f64();
    let folded = graphsink::testing::execute(graph, policies, &plan).await?;
    Ok(TimedFold {
        commit: folded.commit,
        rejects: folded.rejects.len(),
        stages: folded.stages,
        fold_secs: start.elapsed().as_secs_f64(),
        head_secs,
        plan_secs,
    })
}
