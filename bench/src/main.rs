//! graphsink-bench: graphsink end to end against a bare consumer and a
//! direct Lance load, on the same broker and data, in one run.
//!
//! Phases, in order (each with its own consumer group):
//!   produce the backlog (not measured) → (a) bare → (b) direct →
//!   graphsink over the backlog → graphsink with folding off + one timed
//!   fold → graphsink, then the bare loop, under a paced producer (latency).
//! `--history` (fold cost against graph history) and `--storage` (bytes on
//! disk against folds, retention on and off) replace the Kafka phases.
//! With `--s3` / `--s3-endpoint`, graphsink's backlog and paced phases run
//! again on an `s3://` root (after their local-filesystem runs, in the same
//! run, on the same backlog).
//!
//! The parts: `args` (the command line), `kafka/` (the Kafka phases and
//! what they share), `measure` (samplers and arithmetic), `sink`
//! (graphsink in process or in a child), `baselines`, `workload` (the
//! records), `formats` (their encodings), `produce` (sending them),
//! `report`; one file per other mode (`history`, `size`, `evolve`,
//! `storage`) and per environment (`broker`, `s3`, `threads`).

mod args;
mod baselines;
mod broker;
mod cluster;
mod evolve;
mod formats;
mod freshness;
mod history;
mod hop;
mod kafka;
mod measure;
mod produce;
mod report;
mod s3;
mod sink;
mod size;
mod storage;
mod threads;
mod workload;

use std::path::Path;

use clap::Parser;

use args::Args;
use broker::BoxError;
use kafka::kafka_phases;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    // graphsink's own runtime, so its run loop sits where `graphsink run`
    // puts it: on the main thread, above the workers.
    let settings = graphsink::RuntimeSettings {
        background_nice: args.background_nice,
    };
    let rt = graphsink::build_runtime(&settings).expect("tokio runtime");
    if let Err(e) = rt.block_on(run(args)) {
        eprintln!("graphsink-bench: error: {e}");
        std::process::exit(1);
    }
}

/// Runs the mode the flags choose: a child's phase, one of the modes
/// that replace the Kafka phases, or the Kafka phases.
async fn run(a: Args) -> Result<(), BoxError> {
    if child(&a).await? {
        return Ok(());
    }
    let tmp = tempfile::tempdir()?;
    let dir = match &a.work_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => tmp.path().to_path_buf(),
    };
    let protocols = a.protocols()?;
    if !protocols.is_empty() {
        return security_mode(&a, &protocols, &dir).await;
    }
    if a.storage > 0 {
        return storage_mode(&a, &dir).await;
    }
    if a.hop_edges > 0 {
        return hop::run(&dir, a.hop_edges).await;
    }
    if a.freshness > 0 {
        let broker = match &a.broker {
            Some(b) => broker::Broker::external(b.clone()),
            None => broker::Broker::start(&a.broker_backend, a.tansu_bin.clone(), &dir)?,
        };
        // With --s3: the graph on a private moto, the reader's requests
        // counted through a proxy of its own.
        let s3 = if a.s3 {
            Some(s3::S3Bench::start(
                None,
                a.moto_bin.clone(),
                None,
                false,
                &dir,
            )?)
        } else {
            None
        };
        let p = freshness::Params {
            s3: s3.as_ref(),
            secs: a.freshness,
            rate: a.freshness_rate,
            partitions: a.partitions,
            buckets: a.buckets,
            fold_interval: a.fold_interval.clone(),
            wal_flush_ms: a.wal_flush_ms,
        };
        return freshness::run(&broker, &dir, &p).await;
    }
    if !a.evolve_sizes.is_empty() {
        return evolve_mode(&a, &dir).await;
    }
    if !a.sizes.is_empty() {
        return sizes_mode(&a, &dir).await;
    }
    if !a.history.is_empty() {
        return history_mode(&a, &dir).await;
    }
    let r = kafka_phases(&a, &dir).await?;
    r.print();
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&r)?)?;
    }
    Ok(())
}

/// `--fold-config` and `--backlog-child`: a phase the bench runs in a
/// child process, its figures printed as JSON. False when neither is set.
async fn child(a: &Args) -> Result<bool, BoxError> {
    if let Some(cfg) = &a.fold_config {
        let cost = sink::fold_child(cfg).await?;
        println!("{}", serde_json::to_string(&cost)?);
        return Ok(true);
    }
    if let Some(spec) = &a.freshness_reader {
        freshness::reader(spec).await?;
        return Ok(true);
    }
    if let Some(spec) = &a.secured_child {
        let tmp = tempfile::tempdir()?;
        let dir = a.work_dir.as_deref().unwrap_or(tmp.path());
        let figures = kafka::secured_child(a, spec, dir).await?;
        println!("{}", serde_json::to_string(&figures)?);
        return Ok(true);
    }
    if let Some(spec) = &a.backlog_child {
        let spec: sink::BacklogSpec = serde_json::from_slice(&std::fs::read(spec)?)?;
        let run = sink::backlog_measured(&spec).await?;
        println!("{}", serde_json::to_string(&run)?);
        return Ok(true);
    }
    Ok(false)
}

/// `--tls`, `--sasl`, `--security`, `--cluster`: what security and
/// replication cost.
async fn security_mode(
    a: &Args,
    protocols: &[cluster::Protocol],
    dir: &Path,
) -> Result<(), BoxError> {
    let r = kafka::secured_mode(a, protocols, dir).await?;
    r.print();
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&r)?)?;
    }
    if r.count_mismatch() {
        return Err(
            "a leg consumed a different number of records than were produced, or its graph \
                    holds other rows (COUNT MISMATCH above)"
                .into(),
        );
    }
    Ok(())
}

/// `--storage`: bytes on disk against folds, retention on and off.
async fn storage_mode(a: &Args, dir: &Path) -> Result<(), BoxError> {
    let p = storage::Params {
        folds: a.storage,
        keys: a.storage_keys,
        rows: a.storage_rows,
        polls: a.storage_polls,
        buckets: a.buckets,
        keep_commits: a.storage_keep_commits,
    };
    eprintln!("storage against folds: {p:?}");
    let curves = storage::run(dir, p).await?;
    storage::print(&curves, a.storage_step.max(1));
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&curves)?)?;
    }
    Ok(())
}

/// `--evolve-sizes`: the pause of a schema change against graph size.
async fn evolve_mode(a: &Args, dir: &Path) -> Result<(), BoxError> {
    let p = evolve::Params {
        sizes: a.evolve_sizes.clone(),
        unfolded: a.evolve_unfolded,
        chunk: a.size_chunk.max(1),
        buckets: a.buckets,
        value_bytes: a.value_bytes,
    };
    eprintln!(
        "schema change pause against graph size: sizes {:?}, {} rows unfolded, {} buckets",
        p.sizes, p.unfolded, p.buckets
    );
    let probes = evolve::run(dir, &p).await?;
    println!("| Item rows | unfolded rows | open s | pause s | folds | baseline fold s |");
    println!("|---|---|---|---|---|---|");
    for p in &probes {
        println!(
            "| {} | {} | {:.3} | {:.3} | {} | {:.3} |",
            p.size, p.unfolded, p.open_secs, p.pause_secs, p.folds, p.baseline_fold_secs
        );
    }
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&probes)?)?;
    }
    Ok(())
}

/// `--sizes`: fold cost against graph size.
async fn sizes_mode(a: &Args, dir: &Path) -> Result<(), BoxError> {
    let p = size::Params {
        sizes: a.sizes.clone(),
        rows: a.size_rows,
        chunk: a.size_chunk.max(1),
        buckets: a.buckets,
        value_bytes: a.value_bytes,
        known_ids_max: a.size_known_ids,
    };
    eprintln!(
        "fold cost against graph size: {} rows per fold at sizes {:?}, {} buckets",
        p.rows, p.sizes, p.buckets
    );
    let probes = size::run(dir, &p).await?;
    // `write` is the passes alone; `compact` and `index` were in it before
    // 2026-12-07 (graphsink_fold_phase_seconds split them out).
    println!("| rows before | type | fold s | read | view | check | write | compact | index | publish | rejects | fragments |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for p in &probes {
        let s = &p.stages;
        println!(
            "| {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {} |",
            p.size,
            p.kind,
            p.fold_secs,
            s.read,
            s.view,
            s.check,
            s.write,
            s.compact,
            s.index,
            s.publish,
            p.rejects,
            p.table_fragments
        );
    }
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&probes)?)?;
    }
    Ok(())
}

/// `--history`: fold cost against graph history.
async fn history_mode(a: &Args, dir: &Path) -> Result<(), BoxError> {
    let upto = *a.history.iter().max().expect("non-empty");
    eprintln!(
        "fold cost against history: {} rows at commits {:?}, {} rows otherwise, {} buckets",
        a.history_rows, a.history, a.history_filler, a.buckets
    );
    let probes = history::run(
        dir,
        a.buckets,
        a.history_rows,
        a.history_filler,
        &a.history,
        upto,
    )
    .await?;
    println!("| commit | rows | fold s | of which head s | plan s | __manifest fragments | table fragments |");
    println!("|---|---|---|---|---|---|---|");
    for p in &probes {
        println!(
            "| {} | {} | {:.3} | {:.3} | {:.3} | {} | {} |",
            p.commit,
            p.rows,
            p.fold_secs,
            p.head_secs,
            p.plan_secs,
            p.manifest_fragments,
            p.table_fragments
        );
    }
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&probes)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Shape;

    /// No import circle among the bench's files (the check every crate of
    /// the workspace runs).
    #[test]
    fn no_import_circle() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        graphsink_testkit::imports::assert_no_circle(&src);
    }

    /// The whole bench, small, in the debug build: every phase must count
    /// exactly the records produced and the graph must hold one row per
    /// distinct key, with a node/edge mix. Not a timed test: it asserts
    /// what was measured, never how fast.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_small_mixed_run_counts_every_record_in_every_phase() {
        small_mixed_run("json").await;
    }

    /// The same run with Avro and with Protobuf values: graphsink reads
    /// every record the bench's encoders framed (backlog, primers, paced)
    /// into the same rows. One test, so the two brokers run one at a time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn registry_formats_count_every_record_in_every_phase() {
        small_mixed_run("avro").await;
        small_mixed_run("protobuf").await;
    }

    async fn small_mixed_run(format: &str) {
        let mut argv = vec![
            "graphsink-bench",
            "--format",
            format,
            "--records",
            "4000",
            "--edge-fraction",
            "0.25",
            "--partitions",
            "3",
            "--latency-rate",
            "500",
            "--latency-secs",
            "2",
            "--fold-interval",
            "1s",
            "--in-process",
        ];
        // scripts/test.sh's broker when there is one; else the bench starts
        // its own Apache Kafka (and fails saying how to install it).
        let broker = std::env::var("GRAPHSINK_TEST_BROKER").ok();
        if let Some(b) = &broker {
            argv.extend(["--broker", b.as_str()]);
        }
        let a = Args::parse_from(argv);
        let dir = tempfile::tempdir().unwrap();
        let r = kafka_phases(&a, dir.path()).await.expect("bench run");
        assert!(!r.count_mismatch, "{:#?}", r.notes);
        assert_eq!(r.graph_rows, r.expected_rows);
        assert_eq!(r.expected_rows.len(), 3, "nodes, edges and pending");
        assert!(r.expected_rows["edges/Link"] > 0);
        let lat = r.durable_ack_latency.expect("durable-ack latency measured");
        assert_eq!(lat.samples, 1000, "every paced record seen committed");
        assert_eq!(r.graph_visible_unseen, 0);
        // The paced folds' phases, every one of them, from graphsink's metrics.
        let phases: Vec<&str> = r
            .fold_phases_paced
            .iter()
            .map(|p| p.phase.as_str())
            .collect();
        assert_eq!(phases.len(), 10, "{phases:?}");
        assert!(
            r.fold_phases_paced.iter().all(|p| p.folds >= 1),
            "{:?}",
            r.fold_phases_paced
        );
        assert!(r.bare_durable_ack_latency.is_some());
        // To visible: the graph commit holding every record was seen, and
        // the run's parts add up within its wall (start included).
        // (A tiny backlog can arrive whole in the first poll, which the
        // rates leave out: zero timed records is a rate of 0, not a fault.)
        assert!(r.graphsink_visible_secs > 0.0 && r.graphsink_records_per_s.is_finite());
        assert!(r.graphsink_durable_records_per_s.is_finite());
        assert!(r.graphsink_start_to_first_secs >= 0.0);
        assert!(r.graphsink_visible_to_exit_secs >= 0.0);
        assert!(
            r.graphsink_start_to_first_secs
                + r.graphsink_visible_secs
                + r.graphsink_visible_to_exit_secs
                <= r.graphsink_wall_secs + 0.01,
            "{} + {} + {} > {}",
            r.graphsink_start_to_first_secs,
            r.graphsink_visible_secs,
            r.graphsink_visible_to_exit_secs,
            r.graphsink_wall_secs
        );
        assert!(r.fold_rows == 4000 && r.fold_upserted > 0);
        assert_eq!(r.graphsink_run_loop.rejected, 0, "{format}");
        assert!(r.decode_us_per_record > 0.0);
    }

    #[test]
    fn the_mix_spreads_edges_evenly_and_exactly() {
        let shape = Shape {
            keys: 100,
            value_bytes: 100,
            edge_fraction: 0.3,
            edge_keys: 10,
            endpoints: 70,
            bad_fraction: 0.0,
        };
        let kinds: Vec<_> = (0..1000).map(|i| workload::kind_of(shape, i)).collect();
        let edges = kinds
            .iter()
            .filter(|(k, _)| *k == workload::Kind::Edge)
            .count() as u64;
        assert_eq!(edges, shape.edges_in(1000));
        // Indices within a kind count up from 0 without gaps.
        for kind in [workload::Kind::Node, workload::Kind::Edge] {
            let idx: Vec<u64> = kinds
                .iter()
                .filter(|(k, _)| *k == kind)
                .map(|(_, i)| *i)
                .collect();
            assert!(idx.iter().enumerate().all(|(n, i)| *i == n as u64));
        }
        // Any 10 consecutive records hold 3 edges.
        for w in kinds.windows(10) {
            let e = w.iter().filter(|(k, _)| *k == workload::Kind::Edge).count();
            assert_eq!(e, 3);
        }
        let v = workload::edge_fields(shape, 1, 5).1.json();
        let v: serde_json::Value = serde_json::from_str(&v).unwrap();
        assert!(v["src"].as_str().unwrap().starts_with('k'));
        assert_eq!(workload::node_record(shape, 1, 5).1.len(), 100);
    }
}
