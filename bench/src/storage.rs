//! Storage against time: a steady stream of updates over a fixed key space,
//! folded `folds` times, with the bytes on disk measured after every fold,
//! once with retention after every fold and once without. Runs in process,
//! without Kafka, like `history`: rows go through the decoder and the shard
//! writers as the run loop sends them, each fold is the fold loop's own cut
//! → plan → execute → publish, and retention is the fold loop's own
//! (`collect` with the live writers' manifest stores).

use std::collections::HashMap;
use std::path::Path;

use graphsink::testing::{RecordDecoder, ShardPool, SourceRecord, Window, WrittenSpans};
use graphsink::Graph;
use serde::Serialize;

use crate::broker::BoxError;
use crate::workload::{self, Shape};

/// Bytes after one fold, by kind, over every table and `__manifest`.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Point {
    pub fold: u64,
    pub total: u64,
    pub base: u64,
    pub wal: u64,
    pub generations: u64,
    pub old_versions: u64,
    /// Lance versions over all tables.
    pub versions: u64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Curve {
    pub retention: bool,
    pub points: Vec<Point>,
}

/// What one storage run does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params {
    pub folds: u64,
    pub keys: u64,
    /// Records per fold (updates: the key space is written over and over).
    pub rows: usize,
    /// Polls per fold (each one durable WAL write per shard).
    pub polls: usize,
    pub buckets: u32,
    pub keep_commits: usize,
}

/// The curve with retention on, then off, each on a fresh graph.
pub(crate) async fn run(dir: &Path, p: Params) -> Result<Vec<Curve>, BoxError> {
    let mut out = Vec::new();
    for retention in [true, false] {
        let sub = dir.join(if retention {
            "storage-on"
        } else {
            "storage-off"
        });
        std::fs::create_dir_all(&sub)?;
        eprintln!(
            "storage run, retention {}",
            if retention { "on" } else { "off" }
        );
        out.push(Curve {
            retention,
            points: one_run(&sub, p, retention).await?,
        });
    }
    Ok(out)
}

async fn one_run(dir: &Path, p: Params, retention: bool) -> Result<Vec<Point>, BoxError> {
    std::fs::write(dir.join("bench.pg"), workload::SCHEMA)?;
    let cfg = graphsink::Config::from_toml(
        &format!(
            "[graph]\nroot = \"graph\"\nschema = \"bench.pg\"\n[kafka]\n\"bootstrap.servers\" = \"unused:1\"\n\"group.id\" = \"unused\"\n[wal]\nbuckets = {}\n[retention]\nkeep_commits = {}\nkeep_for = \"0s\"\n[[mapping]]\ntopic = \"items\"\nnode = \"{}\"\n",
            p.buckets,
            p.keep_commits,
            workload::NODE
        ),
        dir,
    )?;
    let schema = graphsink::GraphSchema::load(&cfg.schema_path())?;
    let graph = Graph::open_or_init(&cfg, schema).await?;
    let policies = graphsink::testing::Policies::from_config(&cfg);
    let per_poll = p.rows.div_ceil(p.polls.max(1));
    let mut decoder = RecordDecoder::new(graph.schema(), &cfg.mappings[0], per_poll, 1 << 20)?;
    let pool = ShardPool::open(&graph, &cfg.wal, &graph.wal_tables()).await?;
    let table = graph.schema().types[0].table.clone();
    let shape = Shape::nodes_only(p.keys, 100);
    let window = Window::from(&cfg.retention);
    let mut offset = 0u64;
    let mut points = Vec::new();
    for fold in 1..=p.folds {
        for _ in 0..p.polls {
            write(&mut decoder, &pool, &table, shape, offset, per_poll).await?;
            offset += per_poll as u64;
        }
        fold_once(&graph, &policies, &pool).await?;
        if retention {
            graphsink::testing::collect_garbage(&graph, &window, &pool).await?;
        }
        let point = measure(&graph, fold).await?;
        if fold % 25 == 0 || fold == 1 {
            eprintln!("  {point:?}");
        }
        points.push(point);
    }
    pool.close().await?;
    Ok(points)
}

async fn measure(graph: &Graph, fold: u64) -> Result<Point, BoxError> {
    let mut p = Point {
        fold,
        ..Default::default()
    };
    for s in graphsink::testing::graph_storage(graph).await? {
        p.total += s.total();
        p.base += s.base;
        p.wal += s.wal;
        p.generations += s.generations;
        p.old_versions += s.old_versions;
        p.versions += s.versions;
    }
    Ok(p)
}

/// `n` node records from `offset` on (keys cycle through the key space),
/// awaited until durable.
async fn write(
    decoder: &mut RecordDecoder,
    pool: &ShardPool,
    table: &str,
    shape: Shape,
    offset: u64,
    n: usize,
) -> Result<(), BoxError> {
    let values: Vec<String> = (0..n as u64)
        .map(|i| workload::node_record(shape, 7, offset + i).1)
        .collect();
    let recs: Vec<SourceRecord<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| SourceRecord {
            topic: "items",
            partition: 0,
            offset: (offset + i as u64) as i64,
            timestamp: None,
            key: None,
            value: Some(v.as_bytes()),
            message: None,
        })
        .collect();
    let decoded = decoder.decode(&recs)?;
    if let Some(u) = decoded.upserts {
        for w in pool.tables[table].put(u).await? {
            w.wait().await?;
        }
    }
    Ok(())
}

async fn fold_once(
    graph: &Graph,
    policies: &graphsink::testing::Policies,
    pool: &ShardPool,
) -> Result<(), BoxError> {
    let mut limits = HashMap::new();
    for f in pool.freeze_all().await? {
        limits.insert(f.shard, f.upto_generation);
        f.fence.wait().await?;
    }
    let head = graph.head().await?;
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
    graphsink::testing::execute(graph, policies, &plan).await?;
    Ok(())
}

/// The two curves side by side, every `step` folds, as a Markdown table.
pub(crate) fn print(curves: &[Curve], step: u64) {
    let (on, off) = (&curves[0].points, &curves[1].points);
    println!("| fold | on: total | base | wal | generations | old versions | versions | off: total | off: versions |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (a, b) in on.iter().zip(off) {
        if a.fold % step != 0 && a.fold != 1 {
            continue;
        }
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            a.fold,
            kib(a.total),
            kib(a.base),
            kib(a.wal),
            kib(a.generations),
            kib(a.old_versions),
            a.versions,
            kib(b.total),
            b.versions
        );
    }
}

fn kib(b: u64) -> String {
    format!("{:.0} KiB", b as f64 / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The storage mode, tiny: both curves measured, and retention keeps
    /// the graph smaller than no retention from the second fold on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_storage_run_measures_both_curves() {
        let dir = tempfile::tempdir().unwrap();
        let p = Params {
            folds: 4,
            keys: 50,
            rows: 100,
            polls: 2,
            buckets: 2,
            keep_commits: 1,
        };
        let curves = run(dir.path(), p).await.unwrap();
        let (on, off) = (&curves[0].points, &curves[1].points);
        assert_eq!((on.len(), off.len()), (4, 4));
        assert!(curves[0].retention && !curves[1].retention);
        for (a, b) in on.iter().zip(off).skip(1) {
            assert!(a.total < b.total, "fold {}: {a:?} vs {b:?}", a.fold);
            assert_eq!(a.generations, 0, "{a:?}");
            assert!(b.generations > 0, "{b:?}");
        }
    }
}
