//! The pause of a schema change (docs/schema-evolution.md): a start with a
//! schema that adds an optional property folds to quiescence, adds the
//! all-null column to every table, and publishes the schema commit; no
//! record is written meanwhile. Timed at each graph size, with nothing
//! unfolded and with `unfolded` rows durable in the WAL, beside the
//! baseline of the same rows folded with no schema change, in the same
//! run. In process, without Kafka, on the size bench's graph (`Item` nodes
//! grown to each size; the edge tables stay empty).

use std::path::Path;
use std::time::Instant;

use graphsink::Graph;
use serde::Serialize;

use crate::broker::BoxError;
use crate::history::timed_fold;
use crate::size::{config_toml, Writer, SCHEMA};

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Probe {
    /// `Item` rows before the change.
    pub size: u64,
    /// Rows durable in the WAL, not yet folded, when the change starts.
    pub unfolded: usize,
    /// Opening the graph with the new schema (the plan).
    pub open_secs: f64,
    /// The pause: quiescence fold + columns + schema commit.
    pub pause_secs: f64,
    pub folds: usize,
    /// The same rows folded by the fold loop, no schema change (0 rows: 0).
    pub baseline_fold_secs: f64,
}

pub(crate) struct Params {
    pub sizes: Vec<u64>,
    pub unfolded: usize,
    pub chunk: u64,
    pub buckets: u32,
    pub value_bytes: usize,
}

/// The size schema with `n` optional properties added to `Item`.
fn schema(n: usize) -> String {
    let extra: String = (0..n).map(|i| format!("    note{i}: String?\n")).collect();
    SCHEMA.replacen(
        "    pad: String\n}",
        &format!("    pad: String\n{extra}}}"),
        1,
    )
}

pub(crate) async fn run(dir: &Path, p: &Params) -> Result<Vec<Probe>, BoxError> {
    let mut version = 0;
    std::fs::write(dir.join("size.pg"), schema(version))?;
    let cfg = graphsink::Config::from_toml(&config_toml(p.buckets, usize::MAX >> 1), dir)?;
    let policies = graphsink::testing::Policies::from_config(&cfg);
    let open = || async {
        let schema = graphsink::GraphSchema::load(&cfg.schema_path())?;
        Ok::<_, BoxError>(Graph::open_or_init(&cfg, schema).await?)
    };
    let batch = p.chunk.max(p.unfolded as u64) as usize;
    let mut graph = open().await?;
    let mut w = Writer::open(&graph, &cfg, batch, p.value_bytes).await?;
    let mut have = 0u64;
    let mut out = Vec::new();
    for &size in &p.sizes {
        let t = Instant::now();
        while have < size {
            let n = p.chunk.min(size - have);
            let recs = (have..have + n).map(|i| w.record(0, i, 1)).collect();
            w.put(0, recs).await?;
            timed_fold(&graph, &policies, &w.pool).await?;
            have += n;
        }
        eprintln!(
            "  grown to {have} rows in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        for unfolded in [0, p.unfolded] {
            // The baseline: the same rows, folded with no schema change.
            let mut baseline = 0.0;
            if unfolded > 0 {
                let recs = (have..have + unfolded as u64)
                    .map(|i| w.record(0, i, 1))
                    .collect();
                w.put(0, recs).await?;
                baseline = timed_fold(&graph, &policies, &w.pool).await?.fold_secs;
                have += unfolded as u64;
                let recs = (have..have + unfolded as u64)
                    .map(|i| w.record(0, i, 1))
                    .collect();
                w.put(0, recs).await?;
                have += unfolded as u64;
            }
            // Stop writing (as a restart does), then start with one more
            // optional property.
            let offset = w.offset();
            w.pool.close().await?;
            version += 1;
            std::fs::write(dir.join("size.pg"), schema(version))?;
            let t = Instant::now();
            let waiting = open().await?;
            let open_secs = t.elapsed().as_secs_f64();
            let m = graphsink::testing::migrate(&waiting, &cfg)
                .await?
                .ok_or("the new schema brought no change")?;
            graph = m.graph;
            let probe = Probe {
                size: have - unfolded as u64,
                unfolded,
                open_secs,
                pause_secs: m.paused.as_secs_f64(),
                folds: m.folds,
                baseline_fold_secs: baseline,
            };
            eprintln!("  {probe:?}");
            out.push(probe);
            w = Writer::open(&graph, &cfg, batch, p.value_bytes)
                .await?
                .starting_at(offset);
        }
    }
    w.pool.close().await?;
    Ok(out)
}
