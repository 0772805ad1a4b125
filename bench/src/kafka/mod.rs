//! The Kafka phases of one bench run, on one broker: what they share
//! ([`Run`]: the target, the workload's shape, the groups) and their order
//! ([`kafka_phases`]). The phases themselves are in `phases.rs`.

mod phases;
mod secured;

pub(crate) use secured::{secured_child, secured_mode};

use std::path::Path;
use std::time::Duration;

use crate::args::Args;
use crate::broker::{BoxError, Broker};
use crate::measure::{self, Target};
use crate::produce;
use crate::report::Report;
use crate::s3::{Root, S3Bench};
use crate::workload::{self, Shape};
use crate::{formats, sink};

/// The Kafka phases, in order, on one broker: produce, (a) bare, (b)
/// direct, graphsink, graphsink with folding off + the fold, and the paced
/// latency phases.
pub(crate) async fn kafka_phases(a: &Args, dir: &Path) -> Result<Report, BoxError> {
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
            produce::produce_backlog(&bs, &topics, shape, n, &codec)
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
    r.ratio_graphsink_bare_durable = r.graphsink_durable_records_per_s / r.bare_records_per_s;
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
        Run::with_id(a, broker, new_run_id())
    }

    /// A run whose topics and groups carry `run_id`.
    fn with_id(a: &Args, broker: &Broker, run_id: String) -> Result<Run, BoxError> {
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
        let has_edges = topics(a, &run_id).edges.is_some();
        let mut consumer_props = a.consumer_props.clone();
        if a.fetch_wait_ms > 0 && !consumer_props.iter().any(|(k, _)| k == "fetch.wait.max.ms") {
            consumer_props.push(("fetch.wait.max.ms".into(), a.fetch_wait_ms.to_string()));
        }
        let mut t = Target {
            bootstrap: broker.bootstrap.clone(),
            security: Vec::new(),
            topics: topics(a, &run_id),
            consumer_props,
            dead_letter_props: a.dead_letter_props.clone(),
            wal_props: a.wal_props.clone(),
            commit_every: Duration::from_millis(a.commit_interval_ms.max(1)),
            wal_flush: Duration::from_millis(a.wal_flush_ms.max(1)),
            coerce: a.coerce.clone(),
            values: formats::Values::json(),
        };
        t.values.envelope = checked_envelope(a)?;
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
            started_ms: 0.0,
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
}

/// Unique per run, so reruns against a shared broker never read old data:
/// the second, then this process and its count of runs (two runs started
/// in one second, as the bench's own tests do on parallel threads, made
/// one topic twice: `TopicAlreadyExists`).
fn new_run_id() -> String {
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "{}-{}-{n}",
        chrono::Utc::now().format("%Y%m%d%H%M%S"),
        std::process::id()
    )
}

/// The workload's topics of run `run_id`: nodes, and edges with an edge mix.
fn topics(a: &Args, run_id: &str) -> workload::Topics {
    workload::Topics {
        nodes: format!("bench-items-{run_id}"),
        edges: (a.edge_fraction > 0.0).then(|| format!("bench-links-{run_id}")),
        partitions: a.partitions,
    }
}

/// How the figures were taken, for the report's notes.
fn add_notes(a: &Args, r: &mut Report) {
    r.notes.push(format!(
        "records/s: the baselines, first fetch → all offsets committed (committed offsets sampled every {} ms); graphsink to visible, first fetch → the graph commit holding every record (seen by the publish watch as it enters __manifest), to durable, → all offsets committed; graphsink's clock starts when the run's consumed total first moves and counts only the records after that first poll; durable-ack latency: record timestamp → first sample showing its offset committed (resolution {} ms + one OffsetFetch round trip; bounded below by offsets.commit_interval and wal.flush_interval)",
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

/// `--envelope`, which wraps JSON values only.
fn checked_envelope(a: &Args) -> Result<formats::Envelope, BoxError> {
    if a.envelope != formats::Envelope::None && a.format != formats::Format::Json {
        return Err("--envelope wraps JSON values: it needs --format json".into());
    }
    Ok(a.envelope)
}
