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

mod baselines;
mod broker;
mod evolve;
mod formats;
mod history;
mod measure;
mod report;
mod s3;
mod sink;
mod size;
mod storage;
mod threads;
mod workload;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;

use broker::{BoxError, Broker};
use measure::Target;
use report::{Latency, Report, S3Report};
use s3::{Root, S3Bench, SelfCpu};
use workload::Shape;

#[derive(Parser, Debug)]
#[command(about = "Benchmark graphsink against a bare consumer and a direct Lance load")]
struct Args {
    /// Use this broker (host:port) instead of starting one.
    #[arg(long)]
    broker: Option<String>,
    /// The private broker to start: `kafka` (Apache Kafka 4.4, KRaft, from
    /// scripts/lib.sh's ensure_kafka) or `tansu` (the first rounds' broker).
    #[arg(long, default_value = "kafka")]
    broker_backend: String,
    /// The tansu binary (default ~/.cache/graphsink/tansu-0.6.0/bin/tansu).
    #[arg(long)]
    tansu_bin: Option<PathBuf>,
    /// Records in the backlog.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Key space (distinct node ids); default records/2, so about half the
    /// records update an earlier key.
    #[arg(long)]
    keys: Option<u64>,
    /// Approximate JSON value size in bytes (a padded string property).
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// The values' format: `json` (plain JSON, as always), or `avro` or
    /// `protobuf` in the Confluent wire format, with the schemas registered
    /// in the testkit's in-process registry. The same records' fields and
    /// values in each; the direct-load baseline reads JSON only and is
    /// skipped for the others.
    #[arg(long, value_enum, default_value_t = formats::Format::Json)]
    format: formats::Format,
    /// Fraction of the records that are edges (`Link: Item -> Item`, on a
    /// second topic, endpoints drawn from the backlog's node records); 0
    /// produces node records only.
    #[arg(long, default_value_t = 0.0)]
    edge_fraction: f64,
    /// Partitions of each topic.
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    /// Buckets N per type (`wal.buckets`).
    #[arg(long, default_value_t = 4)]
    buckets: u32,
    /// Records per batch of the direct-load baseline.
    #[arg(long, default_value_t = 50_000)]
    direct_batch: usize,
    /// `fold.interval` of the measured graphsink runs.
    #[arg(long, default_value = "5s")]
    fold_interval: String,
    /// Paced producer rate for the latency phase (records/s); 0 skips it.
    #[arg(long, default_value_t = 5_000)]
    latency_rate: u64,
    #[arg(long, default_value_t = 10)]
    latency_secs: u64,
    /// Committed-offset sampling interval (the durable-ack resolution).
    #[arg(long, default_value_t = 10)]
    sample_ms: u64,
    /// Extra librdkafka property KEY=VALUE for every measured consumer
    /// (graphsink and both baselines); repeatable.
    #[arg(long = "consumer-prop", value_parser = parse_prop)]
    consumer_props: Vec<(String, String)>,
    /// Extra librdkafka property KEY=VALUE for graphsink's dead-letter
    /// producer (`[errors.producer]`); repeatable.
    #[arg(long = "dead-letter-prop", value_parser = parse_prop)]
    dead_letter_props: Vec<(String, String)>,
    /// Extra graphsink `[wal]` setting KEY=VALUE, VALUE in TOML (e.g.
    /// `max_poll_records=20000`; a duration needs quotes: `'"50ms"'`);
    /// repeatable. `buckets` and `flush_interval` have their own flags
    /// (`--buckets`, `--wal-flush-ms`) and are refused here.
    #[arg(long = "wal-prop", value_parser = parse_prop)]
    wal_props: Vec<(String, String)>,
    /// Fraction of node records that are bad (reject storms): alternately
    /// a decode reject (`wrong_type`) and a validate reject (`range`). The
    /// direct load skips them (a JSON parse per record, only when > 0).
    #[arg(long, default_value_t = 0.0)]
    bad_fraction: f64,
    /// The mappings' `coerce`: "strict" (the default) checks each value's
    /// numbers in the value screen; "lenient" checks only its JSON.
    #[arg(long, default_value = "strict", value_parser = ["strict", "lenient"])]
    coerce: String,
    /// `fetch.wait.max.ms` of every measured consumer; 0 keeps librdkafka's
    /// 500 ms. tansu 0.6 holds each fetch for the whole wait even when data
    /// is there, so at 500 ms every consumer measures the broker's wait.
    #[arg(long, default_value_t = 5)]
    fetch_wait_ms: u64,
    /// Instead of the Kafka phases: fold cost against graph history. Times
    /// folds of `--history-rows` rows at these commit numbers (comma list,
    /// e.g. 10,1000), with folds of `--history-filler` rows in between.
    #[arg(long, value_delimiter = ',')]
    history: Vec<u64>,
    #[arg(long, default_value_t = 20_000)]
    history_rows: usize,
    #[arg(long, default_value_t = 100)]
    history_filler: usize,
    /// Instead of the Kafka phases: fold cost against graph size. Grows one
    /// graph to each of these sizes (rows per type, comma list, e.g.
    /// 100000,1000000,10000000) and times a fold of `--size-rows` rows of
    /// each type there (nodes; edges; edges with `@card` and `@unique`).
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<u64>,
    #[arg(long, default_value_t = 20_000)]
    size_rows: usize,
    /// Rows per type of each (unmeasured) fold that grows the graph.
    #[arg(long, default_value_t = 500_000)]
    size_chunk: u64,
    /// `fold.known_ids_max` of the size graph: 40M keeps every id of three
    /// 10M-row tables, so folds replace rows by address; 0 keeps none
    /// (every fold scans its tables' keys: the merge-insert baseline).
    #[arg(long, default_value_t = 40_000_000)]
    size_known_ids: usize,
    /// Instead of the Kafka phases: the pause of a schema change. Grows
    /// the size graph's `Item` table to each of these sizes (comma list)
    /// and times a start that adds an optional property, with nothing
    /// unfolded and with `--evolve-unfolded` rows in the WAL, beside a fold
    /// of as many rows with no change (docs/schema-evolution.md).
    #[arg(long, value_delimiter = ',')]
    evolve_sizes: Vec<u64>,
    #[arg(long, default_value_t = 100_000)]
    evolve_unfolded: usize,
    /// Instead of the Kafka phases: storage against time. Folds this many
    /// times a steady stream of `--storage-rows` updates per fold over
    /// `--storage-keys` keys, measuring bytes on disk after each fold, with
    /// retention (keep `--storage-keep-commits`, `keep_for = 0s`) and without.
    #[arg(long, default_value_t = 0)]
    storage: u64,
    #[arg(long, default_value_t = 5_000)]
    storage_keys: u64,
    #[arg(long, default_value_t = 2_000)]
    storage_rows: usize,
    /// Polls (durable WAL writes) per fold.
    #[arg(long, default_value_t = 4)]
    storage_polls: usize,
    #[arg(long, default_value_t = 10)]
    storage_keep_commits: usize,
    /// Print every this many folds of the curve.
    #[arg(long, default_value_t = 25)]
    storage_step: u64,
    /// Offset commit cadence (ms) of graphsink and of the bare loop. Short,
    /// so a run's end is not rounded up to a commit tick.
    #[arg(long, default_value_t = 100)]
    commit_interval_ms: u64,
    /// graphsink's `wal.flush_interval` (ms): the longest a put waits for
    /// its WAL entry to be durable.
    #[arg(long, default_value_t = 20)]
    wal_flush_ms: u64,
    /// graphsink's `runtime.background_nice`: how many nice levels the
    /// runtime's workers and blocking pool run below the main thread, which
    /// runs every phase's consume loop (0: off). Every phase shares the
    /// runtime, so the baselines run with it too.
    #[arg(long, default_value_t = graphsink::RuntimeSettings::default().background_nice)]
    background_nice: i32,
    /// Internal: fold the graph of this config once and print the cost as
    /// JSON (the fold-cost phase runs it as a child process).
    #[arg(long, hide = true)]
    fold_config: Option<PathBuf>,
    /// Internal: run graphsink's backlog phase described by this JSON spec
    /// and print what it measured as JSON (the backlog phases run it as a
    /// child process, so their memory and CPU are their own).
    #[arg(long, hide = true)]
    backlog_child: Option<PathBuf>,
    /// Internal: run the backlog phases and the fold in this process
    /// instead of children (the tests, whose binary is not the bench's).
    #[arg(long, hide = true, alias = "fold-in-process")]
    in_process: bool,
    /// Write the report as JSON here too.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Keep graphs and logs here (default: a temp dir, removed at the end).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Also run graphsink's backlog and paced phases on an `s3://` root on a
    /// private moto server (graphsink-testkit's S3Server), right after the
    /// same phases on the local filesystem.
    #[arg(long)]
    s3: bool,
    /// Like --s3, on this S3 server (http://host:port) instead of a private
    /// moto; it must enforce conditional PUTs.
    #[arg(long)]
    s3_endpoint: Option<String>,
    /// moto_server for --s3 (default ~/.cache/graphsink/moto-venv/bin/moto_server).
    #[arg(long)]
    moto_bin: Option<PathBuf>,
    /// With --s3-endpoint: the server's pid, so its CPU time is sampled.
    #[arg(long)]
    s3_pid: Option<u32>,
    /// Count S3 requests through a rule-less FaultProxy in front of the
    /// server (an extra loopback hop) instead of moto's request log.
    #[arg(long)]
    s3_count_proxy: bool,
}

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

async fn run(a: Args) -> Result<(), BoxError> {
    if let Some(cfg) = &a.fold_config {
        let cost = sink::fold_child(cfg).await?;
        println!("{}", serde_json::to_string(&cost)?);
        return Ok(());
    }
    if let Some(spec) = &a.backlog_child {
        let spec: sink::BacklogSpec = serde_json::from_slice(&std::fs::read(spec)?)?;
        let run = sink::backlog_measured(&spec).await?;
        println!("{}", serde_json::to_string(&run)?);
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
    if a.storage > 0 {
        let p = storage::Params {
            folds: a.storage,
            keys: a.storage_keys,
            rows: a.storage_rows,
            polls: a.storage_polls,
            buckets: a.buckets,
            keep_commits: a.storage_keep_commits,
        };
        eprintln!("storage against folds: {p:?}");
        let curves = storage::run(&dir, p).await?;
        storage::print(&curves, a.storage_step.max(1));
        if let Some(path) = &a.json {
            std::fs::write(path, serde_json::to_string_pretty(&curves)?)?;
        }
        return Ok(());
    }
    if !a.evolve_sizes.is_empty() {
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
        let probes = evolve::run(&dir, &p).await?;
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
        return Ok(());
    }
    if !a.sizes.is_empty() {
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
        let probes = size::run(&dir, &p).await?;
        println!("| rows before | type | fold s | read | view | check | write | publish | rejects | fragments |");
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for p in &probes {
            let s = &p.stages;
            println!(
                "| {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {} |",
                p.size,
                p.kind,
                p.fold_secs,
                s.read,
                s.view,
                s.check,
                s.write,
                s.publish,
                p.rejects,
                p.table_fragments
            );
        }
        if let Some(path) = &a.json {
            std::fs::write(path, serde_json::to_string_pretty(&probes)?)?;
        }
        return Ok(());
    }
    if !a.history.is_empty() {
        let upto = *a.history.iter().max().expect("non-empty");
        eprintln!(
            "fold cost against history: {} rows at commits {:?}, {} rows otherwise, {} buckets",
            a.history_rows, a.history, a.history_filler, a.buckets
        );
        let probes = history::run(
            &dir,
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
        return Ok(());
    }
    let r = kafka_phases(&a, &dir).await?;
    r.print();
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&r)?)?;
    }
    Ok(())
}

/// The Kafka phases, in order, on one broker: produce, (a) bare, (b)
/// direct, graphsink, graphsink with folding off + the fold, and the paced
/// latency phases.
async fn kafka_phases(a: &Args, dir: &Path) -> Result<Report, BoxError> {
    let broker = match &a.broker {
        Some(b) => Broker::external(b.clone()),
        None => Broker::start(&a.broker_backend, a.tansu_bin.clone(), dir)?,
    };
    let s3 = if a.s3 || a.s3_endpoint.is_some() {
        let s = S3Bench::start(
            a.s3_endpoint.as_deref(),
            a.moto_bin.clone(),
            a.s3_pid,
            a.s3_count_proxy,
            dir,
        )?;
        eprintln!("S3 phases on {}", s.describe);
        Some(s)
    } else {
        None
    };
    let run = Run::new(a, &broker)?;
    let mut r = run.report(a);
    for topic in run.t.topics.names() {
        broker.create_topic(topic, a.partitions).await?;
    }
    eprintln!(
        "producing {} records ({} nodes, {} edges) to {} ...",
        a.records,
        run.nodes,
        run.edges,
        run.t.topics.names().join(", ")
    );
    let backlog = {
        let (bs, topics, shape) = (run.t.bootstrap.clone(), run.t.topics.clone(), run.shape);
        let n = a.records;
        let codec = formats::Codec::of(&run.t.values)?;
        tokio::task::spawn_blocking(move || {
            workload::produce_backlog(&bs, &topics, shape, n, &codec)
        })
        .await??
    };
    r.produce_records_per_s = backlog.records_per_s;
    r.value_bytes_mean = backlog.value_bytes_mean;
    // Every phase stops at these ends, taken from the broker's acks, and
    // must have consumed exactly this many records.
    let ends = backlog.ends.clone();
    run.baselines(a, dir, &ends, &mut r).await?;
    let mut s3r = None;
    let cpu = crate::s3::SelfCpu::of(run.broker_pid);
    run.graphsink(a, dir, &ends, &mut r).await?;
    r.broker_cpu("graphsink", &cpu);
    if let Some(s) = &s3 {
        s3r = Some(run.graphsink_s3(a, dir, s, &ends, &mut r).await?);
    }
    let cpu = crate::s3::SelfCpu::of(run.broker_pid);
    run.fold(a, dir, &ends, &mut r).await?;
    r.broker_cpu("graphsink folding off", &cpu);
    if a.latency_rate > 0 {
        let on_s3 = s3.as_ref().zip(s3r.as_mut());
        let cpu = crate::s3::SelfCpu::of(run.broker_pid);
        run.latency(a, dir, &mut r, on_s3).await?;
        r.broker_cpu("latency (paced)", &cpu);
    }
    r.ratio_graphsink_bare = r.graphsink_records_per_s / r.bare_records_per_s;
    if r.direct_records_per_s > 0.0 {
        r.ratio_graphsink_direct = r.graphsink_records_per_s / r.direct_records_per_s;
    }
    if let Some(s) = s3r.as_mut() {
        s.ratio_bare = s.records_per_s / r.bare_records_per_s;
        s.ratio_local = s.records_per_s / r.graphsink_records_per_s;
    }
    r.s3 = s3r;
    add_notes(a, &mut r);
    drop(broker);
    Ok(r)
}

/// What every phase of one bench run shares.
struct Run {
    t: Target,
    shape: Shape,
    nodes: u64,
    edges: u64,
    /// Unique per run, so reruns against a shared broker never read old data.
    run_id: String,
    every: Duration,
    /// The broker's pid when the bench started it (its CPU is reported).
    broker_pid: Option<u32>,
    /// Which broker ran it, for the report.
    broker_describe: String,
    /// The registry the registry formats' schemas are in (served by this
    /// process's thread, so children reach it for as long as the run).
    _registry: Option<graphsink_testkit::TestRegistry>,
}

impl Run {
    fn new(a: &Args, broker: &Broker) -> Result<Run, BoxError> {
        let run_id = chrono::Utc::now().format("%Y%m%d%H%M%S").to_string();
        if !(0.0..=1.0).contains(&a.edge_fraction) {
            return Err("--edge-fraction must be within 0..=1".into());
        }
        if let Some((k, _)) = a
            .wal_props
            .iter()
            .find(|(k, _)| k == "buckets" || k == "flush_interval")
        {
            return Err(format!("--wal-prop {k}: use --buckets or --wal-flush-ms").into());
        }
        let has_edges = a.edge_fraction > 0.0;
        let mut consumer_props = a.consumer_props.clone();
        if a.fetch_wait_ms > 0 && !consumer_props.iter().any(|(k, _)| k == "fetch.wait.max.ms") {
            consumer_props.push(("fetch.wait.max.ms".into(), a.fetch_wait_ms.to_string()));
        }
        let mut t = Target {
            bootstrap: broker.bootstrap.clone(),
            topics: workload::Topics {
                nodes: format!("bench-items-{run_id}"),
                edges: has_edges.then(|| format!("bench-links-{run_id}")),
                partitions: a.partitions,
            },
            consumer_props,
            dead_letter_props: a.dead_letter_props.clone(),
            wal_props: a.wal_props.clone(),
            commit_every: Duration::from_millis(a.commit_interval_ms.max(1)),
            wal_flush: Duration::from_millis(a.wal_flush_ms.max(1)),
            coerce: a.coerce.clone(),
            values: formats::Values::json(),
        };
        if a.format != formats::Format::Json && a.bad_fraction > 0.0 {
            return Err(
                "--bad-fraction needs --format json (its `seq: \"x\"` is JSON only)".into(),
            );
        }
        let registry = match a.format {
            formats::Format::Json => None,
            f => {
                let reg = graphsink_testkit::TestRegistry::start()?;
                t.values =
                    formats::Values::register(f, &reg, &t.topics.nodes, t.topics.edges.as_deref());
                Some(reg)
            }
        };
        let mut shape = Shape {
            keys: a.keys.unwrap_or((a.records / 2).max(1)),
            value_bytes: a.value_bytes,
            edge_fraction: a.edge_fraction,
            edge_keys: 1,
            endpoints: 1,
            bad_fraction: a.bad_fraction,
        };
        if !(0.0..=1.0).contains(&a.bad_fraction) || (a.bad_fraction > 0.0 && has_edges) {
            // An edge whose endpoint's only record was bad would wait forever.
            return Err("--bad-fraction must be within 0..=1, and needs --edge-fraction 0".into());
        }
        let edges = shape.edges_in(a.records);
        let nodes = a.records - edges;
        // Edge ids repeat as often as node keys do; endpoints are any backlog
        // node record's key.
        shape.edge_keys = (edges / 2).max(1);
        shape.endpoints = nodes.max(1);
        if has_edges && nodes == 0 {
            return Err("an edge mix needs node records for its endpoints".into());
        }
        Ok(Run {
            t,
            shape,
            nodes,
            edges,
            run_id,
            every: Duration::from_millis(a.sample_ms),
            broker_pid: broker.pid(),
            broker_describe: broker.describe.clone(),
            _registry: registry,
        })
    }

    fn group(&self, name: &str) -> String {
        format!("bench-{name}-{}", self.run_id)
    }

    /// The backlog phase of group `name`, whose config file
    /// `measure::graphsink_config` wrote into `dir`.
    fn spec(&self, a: &Args, dir: &Path, name: &str, ends: &[i64]) -> sink::BacklogSpec {
        sink::BacklogSpec {
            config: dir.join(format!("{}.toml", self.group(name))),
            target: self.t.clone(),
            ends: ends.to_vec(),
            every: self.every,
            broker_pid: self.broker_pid,
            background_nice: a.background_nice,
        }
    }

    fn has_edges(&self) -> bool {
        self.t.topics.edges.is_some()
    }

    fn report(&self, a: &Args) -> Report {
        let (t, shape) = (&self.t, &self.shape);
        Report {
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            broker: self.broker_describe.clone(),
            workload: serde_json::json!({
                "records": a.records, "node_records": self.nodes, "edge_records": self.edges,
                "keys": shape.keys, "edge_keys": if self.has_edges() { shape.edge_keys } else { 0 },
                "value_bytes": a.value_bytes, "format": a.format,
                "partitions": a.partitions, "buckets": a.buckets, "fold_interval": a.fold_interval,
                "direct_batch": a.direct_batch, "commit_interval_ms": a.commit_interval_ms, "wal_flush_ms": a.wal_flush_ms, "background_nice": a.background_nice,
                "consumer_props": t.consumer_props, "dead_letter_props": t.dead_letter_props, "wal_props": t.wal_props, "coerce": t.coerce, "bad_fraction": a.bad_fraction, "latency_rate": a.latency_rate, "latency_secs": a.latency_secs,
            }),
            commit_sample_interval_ms: a.sample_ms,
            ..Default::default()
        }
    }

    fn graphsink_config(&self, a: &Args, dir: &Path) -> Result<graphsink::Config, BoxError> {
        self.config_on(a, dir, &Root::local(dir, "graph"), "graphsink")
    }

    /// The measured graphsink's config on `root`, in consumer group `name`.
    fn config_on(
        &self,
        a: &Args,
        dir: &Path,
        root: &Root,
        name: &str,
    ) -> Result<graphsink::Config, BoxError> {
        measure::graphsink_config(
            &self.t,
            dir,
            root,
            &self.group(name),
            a.buckets,
            &sink::fold_every(&a.fold_interval),
        )
    }

    /// The S3 run's root: one prefix per bench run.
    fn s3_config(&self, a: &Args, dir: &Path, s3: &S3Bench) -> Result<graphsink::Config, BoxError> {
        let root = s3.root(&format!("{}/graph", self.run_id));
        self.config_on(a, dir, &root, "graphsink-s3")
    }

    /// The expected rows of the backlog's graph: one per distinct key, and
    /// no edge left waiting (every endpoint is a backlog node).
    fn expected_rows(&self, a: &Args, r: &mut Report) {
        let (want_nodes, want_edges) = workload::distinct_keys(self.shape, a.records);
        r.expected_rows
            .insert(format!("nodes/{}", workload::NODE), want_nodes);
        if self.has_edges() {
            r.expected_rows
                .insert(format!("edges/{}", workload::EDGE), want_edges);
            r.expected_rows
                .insert(format!("_pending/{}", workload::EDGE), 0);
        }
    }

    /// (a) the bare consumer and (b) the direct Lance load.
    async fn baselines(
        &self,
        a: &Args,
        dir: &Path,
        ends: &[i64],
        r: &mut Report,
    ) -> Result<(), BoxError> {
        eprintln!("(a) bare consumer ...");
        measure::reset_peak_rss();
        let (tc, gb, e2) = (self.t.clone(), self.group("bare"), ends.to_vec());
        let cpu = crate::s3::SelfCpu::of(self.broker_pid);
        let bare = tokio::task::spawn_blocking(move || baselines::bare(&tc, &gb, &e2)).await??;
        r.broker_cpu("bare", &cpu);
        r.counted("bare", bare.records, a.records);
        r.bare_records_per_s = bare.rate();
        r.bare_peak_rss_mib = measure::peak_rss_mib();

        if a.format != formats::Format::Json {
            r.notes
                .push("direct load not run: it reads JSON values only".into());
            return Ok(());
        }
        eprintln!("(b) direct load ...");
        measure::reset_peak_rss();
        let cpu = crate::s3::SelfCpu::of(self.broker_pid);
        let direct = baselines::direct(
            &self.t,
            &self.group("direct"),
            ends,
            &sink::root_in(dir, "direct"),
            a.direct_batch,
            a.bad_fraction > 0.0,
        )
        .await?;
        r.broker_cpu("direct", &cpu);
        r.counted("direct", direct.records, a.records);
        r.direct_records_per_s = direct.rate();
        r.direct_batches = direct.batches;
        r.direct_peak_rss_mib = measure::peak_rss_mib();
        Ok(())
    }

    /// graphsink over the backlog, then its graph's row counts checked.
    async fn graphsink(
        &self,
        a: &Args,
        dir: &Path,
        ends: &[i64],
        r: &mut Report,
    ) -> Result<(), BoxError> {
        eprintln!("graphsink over the backlog ...");
        let cfg = self.graphsink_config(a, dir)?;
        let spec = self.spec(a, dir, "graphsink", ends);
        let gs = sink::backlog_phase(&spec, a.in_process).await?;
        r.graphsink_cpu_cores = gs.cpu_cores;
        r.graphsink_threads = gs.threads.clone();
        r.graphsink_records_per_s = gs.timed_records as f64 / gs.secs;
        r.graphsink_timed_records = gs.timed_records;
        r.graphsink_secs = gs.secs;
        r.graphsink_commits_published = gs.commits_published;
        r.graphsink_peak_rss_mib = gs.peak_rss_mib;
        r.graphsink_start_rss_mib = gs.start_rss_mib;
        r.graphsink_own_process = !a.in_process;
        r.graphsink_run_loop = gs.run_loop.clone();
        // Over every record the run loop decoded (the first poll too).
        r.decode_us_per_record = gs.run_loop.decode_secs * 1e6 / gs.records.max(1) as f64;
        self.expected_rows(a, r);
        r.graph_rows = check_rows(&cfg, "", r).await?;
        r.counted("graphsink", gs.records, a.records);
        Ok(())
    }

    /// The same backlog run on an `s3://` root, with the server's load.
    async fn graphsink_s3(
        &self,
        a: &Args,
        dir: &Path,
        s3: &S3Bench,
        ends: &[i64],
        r: &mut Report,
    ) -> Result<S3Report, BoxError> {
        eprintln!("graphsink over the backlog, on S3 ...");
        let cfg = self.s3_config(a, dir, s3)?;
        let spec = self.spec(a, dir, "graphsink-s3", ends);
        let mark = s3.mark();
        let gs = sink::backlog_phase(&spec, a.in_process).await?;
        let mut backlog_load = s3.since(&mark);
        if !a.in_process {
            // The phase ran in a child: the parent's own CPU was idle.
            backlog_load.bench_cpu_cores = gs.cpu_cores;
        }
        let mut out = S3Report {
            server: s3.describe.clone(),
            requests_counted_by: s3.counted_by().into(),
            records_per_s: gs.timed_records as f64 / gs.secs,
            secs: gs.secs,
            timed_records: gs.timed_records,
            commits_published: gs.commits_published,
            peak_rss_mib: gs.peak_rss_mib,
            run_loop: gs.run_loop.clone(),
            restarts: gs.restarts,
            backlog_load,
            local_backlog_cpu_cores: r.graphsink_cpu_cores,
            wal_flush_ms: a.wal_flush_ms,
            shards: a.buckets as u64 * if self.has_edges() { 2 } else { 1 },
            ..Default::default()
        };
        out.graph_rows = check_rows(&cfg, "s3 ", r).await?;
        r.counted("graphsink (s3)", gs.records, a.records);
        Ok(out)
    }

    /// graphsink with folding off, then one timed fold. Before the paced
    /// phases, so it reads exactly the backlog.
    async fn fold(
        &self,
        a: &Args,
        dir: &Path,
        ends: &[i64],
        r: &mut Report,
    ) -> Result<(), BoxError> {
        eprintln!("graphsink with folding off, then one timed fold ...");
        measure::graphsink_config(
            &self.t,
            dir,
            &Root::local(dir, "graph-nofold"),
            &self.group("nofold"),
            a.buckets,
            sink::FOLD_OFF,
        )?;
        let fold = sink::fold_cost(&self.spec(a, dir, "nofold", ends), a.in_process).await?;
        r.counted("graphsink (folding off)", fold.rows, a.records);
        r.graphsink_nofold_records_per_s = fold.ingest_rate;
        r.fold_rows = fold.rows;
        r.fold_secs = fold.fold.secs;
        r.fold_rows_per_s = fold.rows as f64 / fold.fold.secs;
        r.fold_upserted = fold.fold.upserted;
        r.graphsink_nofold_peak_rss_mib = fold.ingest_peak_rss_mib;
        r.fold_peak_rss_mib = fold.fold.peak_rss_mib;
        r.fold_start_rss_mib = fold.fold.start_rss_mib;
        Ok(())
    }

    /// graphsink, then the bare consumer, under a paced producer; then
    /// graphsink on S3 when there is an S3 run.
    async fn latency(
        &self,
        a: &Args,
        dir: &Path,
        r: &mut Report,
        s3: Option<(&S3Bench, &mut S3Report)>,
    ) -> Result<(), BoxError> {
        eprintln!(
            "graphsink under a paced producer ({} records/s for {} s) ...",
            a.latency_rate, a.latency_secs
        );
        let settle = Duration::from_secs(60) + humantime_secs(&a.fold_interval) * 3;
        let cpu = SelfCpu::start();
        let live = sink::live(
            &self.t,
            self.graphsink_config(a, dir)?,
            self.shape,
            a.latency_rate,
            a.latency_secs,
            self.every,
            settle,
            0,
        )
        .await?;
        let local_live_cpu = cpu.cores();
        r.latency_rate_records_per_s = a.latency_rate;
        r.latency_records = live.records;
        if live.durable_ms.len() < live.records {
            r.notes.push(format!(
                "{} paced records never seen committed",
                live.records - live.durable_ms.len()
            ));
        }
        r.durable_ack_latency = Latency::of(live.durable_ms);
        r.graph_visible_latency = Latency::of(live.visible_ms);
        r.graph_visible_unseen = live.unseen;
        r.published_missed = live.missed;

        eprintln!("bare consumer under the same paced producer ...");
        let (bare_ms, bare_records) = sink::bare_live(
            &self.t,
            &self.group("bare-live"),
            self.shape,
            a.latency_rate,
            a.latency_secs,
            self.every,
            settle,
            // The backlog, graphsink's primer and its paced records.
            a.records + 1 + live.records as u64,
        )
        .await?;
        r.bare_durable_ack_latency = Latency::of(bare_ms);

        let Some((s3, out)) = s3 else { return Ok(()) };
        eprintln!("graphsink on S3 under the same paced producer ...");
        out.local_live_cpu_cores = local_live_cpu;
        // The S3 group committed the backlog; the two paced phases before
        // (each a primer and its paced records) come first.
        out.live_catch_up = (1 + live.records + 1 + bare_records) as u64;
        let mark = s3.mark();
        let s3_live = sink::live(
            &self.t,
            self.s3_config(a, dir, s3)?,
            self.shape,
            a.latency_rate,
            a.latency_secs,
            self.every,
            settle,
            out.live_catch_up,
        )
        .await?;
        let load = s3.since(&mark);
        if s3_live.durable_ms.len() < s3_live.records {
            r.notes.push(format!(
                "s3: {} paced records never seen committed",
                s3_live.records - s3_live.durable_ms.len()
            ));
        }
        if s3_live.unseen > 0 {
            r.notes.push(format!(
                "s3: {} paced records never seen visible",
                s3_live.unseen
            ));
        }
        out.durable_ack_latency = Latency::of(s3_live.durable_ms);
        out.graph_visible_latency = Latency::of(s3_live.visible_ms);
        out.live_load = Some(load);
        Ok(())
    }
}

/// Compares the rows at the head of `cfg`'s graph with `r.expected_rows`
/// and returns them; a difference is a COUNT MISMATCH note (`label` names
/// the run).
async fn check_rows(
    cfg: &graphsink::Config,
    label: &str,
    r: &mut Report,
) -> Result<std::collections::BTreeMap<String, usize>, BoxError> {
    let store = graphsink::Store::new(&cfg.graph.storage_options);
    let g = graphsink::Graph::open_readonly(cfg.root_uri(), store).await?;
    let head = g.head().await?;
    let rows = graphsink::row_counts(&g, &head).await?;
    let mut seen = std::collections::BTreeMap::new();
    for (table, want) in &r.expected_rows {
        let got = rows.get(table).copied().unwrap_or(0);
        seen.insert(table.clone(), got);
        if got != *want {
            r.count_mismatch = true;
            r.notes.push(format!(
                "COUNT MISMATCH: {label}{table} holds {got} rows, expected {want}"
            ));
        }
    }
    Ok(seen)
}

fn add_notes(a: &Args, r: &mut Report) {
    r.notes.push(format!(
        "records/s: first fetch → all offsets committed (committed offsets sampled every {} ms); for graphsink the clock starts when the run's consumed total first moves and counts only the records after that first poll; durable-ack latency: record timestamp → first sample showing its offset committed (resolution {} ms + one OffsetFetch round trip; bounded below by offsets.commit_interval and wal.flush_interval)",
        a.sample_ms, a.sample_ms
    ));
    r.notes.push(format!("peak RSS: VmHWM after resetting it (clear_refs 5) at the start of each phase; {}; the fold runs in a fresh child process, so its peak is its own (start = the child's RSS before folding)", if a.in_process {
        "graphsink's phases ran in the bench's process, so their peaks include memory the allocator kept from earlier phases and the bench's own samplers"
    } else {
        "graphsink's backlog phases ran in child processes, so their peaks are their own (with the commit sampler); the baselines' include what earlier phases left"
    }));
    r.notes.push("direct load: plain Lance tables keyed on sku (nodes) and the Kafka key (edges), no provenance columns, no endpoint checks, no graph commit; the bare and direct baselines read a backlog that earlier phases may have warmed in the broker".into());
    r.notes.push("every phase stops at end offsets taken from the producer's acks (not the broker's high watermarks) and is checked to have consumed exactly the produced records".into());
}

fn parse_prop(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

/// Seconds of a humantime-like "5s"/"500ms" string, for the settle bound.
fn humantime_secs(s: &str) -> Duration {
    let s = s.trim();
    if let Some(ms) = s.strip_suffix("ms") {
        return Duration::from_millis(ms.parse().unwrap_or(5000));
    }
    Duration::from_secs(s.trim_end_matches('s').parse().unwrap_or(5))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(r.bare_durable_ack_latency.is_some());
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
