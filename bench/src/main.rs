//! graphsink-bench: graphsink end to end against a bare consumer and a
//! direct Lance load, on the same broker and data, in one run.
//!
//! Phases, in order (each with its own consumer group):
//!   produce the backlog (not measured) → (a) bare → (b) direct →
//!   graphsink over the backlog → graphsink with folding off + one timed
//!   fold → graphsink, then the bare loop, under a paced producer (latency).

mod baselines;
mod broker;
mod history;
mod measure;
mod report;
mod sink;
mod workload;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use broker::{BoxError, Broker};
use measure::Target;
use report::{Latency, Report};
use workload::Shape;

#[derive(Parser, Debug)]
#[command(about = "Benchmark graphsink against a bare consumer and a direct Lance load")]
struct Args {
    /// Use this broker (host:port) instead of starting tansu.
    #[arg(long)]
    broker: Option<String>,
    /// The tansu binary (default ~/.cache/graphsink/tansu-0.6.0/bin/tansu).
    #[arg(long)]
    tansu_bin: Option<PathBuf>,
    /// Records in the backlog.
    #[arg(long, default_value_t = 200_000)]
    records: u64,
    /// Key space (distinct node ids); default records/2, so about half the
    /// records update an earlier key.
    #[arg(long)]
    keys: Option<u64>,
    /// Approximate JSON value size in bytes (a padded string property).
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
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
    /// Instead of the Kafka phases: fold cost against graph history. Times
    /// folds of `--history-rows` rows at these commit numbers (comma list,
    /// e.g. 10,1000), with folds of `--history-filler` rows in between.
    #[arg(long, value_delimiter = ',')]
    history: Vec<u64>,
    #[arg(long, default_value_t = 20_000)]
    history_rows: usize,
    #[arg(long, default_value_t = 100)]
    history_filler: usize,
    /// Offset commit cadence (ms) of graphsink and of the bare loop.
    #[arg(long, default_value_t = 1000)]
    commit_interval_ms: u64,
    /// Write the report as JSON here too.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Keep graphs and logs here (default: a temp dir, removed at the end).
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(Args::parse()).await {
        eprintln!("graphsink-bench: error: {e}");
        std::process::exit(1);
    }
}

async fn run(a: Args) -> Result<(), BoxError> {
    let tmp = tempfile::tempdir()?;
    let dir = match &a.work_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => tmp.path().to_path_buf(),
    };
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
    let broker = match &a.broker {
        Some(b) => Broker::external(b.clone()),
        None => Broker::start_tansu(a.tansu_bin.clone(), &dir)?,
    };
    // Unique names, so reruns against a shared broker never read old data.
    let run_id = chrono::Utc::now().format("%Y%m%d%H%M%S").to_string();
    let t = Target {
        bootstrap: broker.bootstrap.clone(),
        topic: format!("bench-items-{run_id}"),
        partitions: a.partitions,
        consumer_props: a.consumer_props.clone(),
        commit_every: Duration::from_millis(a.commit_interval_ms.max(1)),
    };
    let group = |name: &str| format!("bench-{name}-{run_id}");
    let shape = Shape {
        keys: a.keys.unwrap_or((a.records / 2).max(1)),
        value_bytes: a.value_bytes,
    };
    let every = Duration::from_millis(a.sample_ms);
    let mut r = Report {
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        broker: if a.broker.is_some() {
            t.bootstrap.clone()
        } else {
            format!("tansu 0.6.0 memory at {}", t.bootstrap)
        },
        workload: serde_json::json!({
            "records": a.records, "keys": shape.keys, "value_bytes": a.value_bytes,
            "partitions": a.partitions, "buckets": a.buckets, "fold_interval": a.fold_interval,
            "direct_batch": a.direct_batch, "edges": "none (node records only)", "commit_interval_ms": a.commit_interval_ms,
            "consumer_props": a.consumer_props, "latency_rate": a.latency_rate, "latency_secs": a.latency_secs,
        }),
        commit_sample_interval_ms: a.sample_ms,
        ..Default::default()
    };

    broker.create_topic(&t.topic, a.partitions).await?;
    eprintln!("producing {} records to {} ...", a.records, t.topic);
    {
        let (bs, topic) = (t.bootstrap.clone(), t.topic.clone());
        let n = a.records;
        r.produce_records_per_s =
            tokio::task::spawn_blocking(move || workload::produce_backlog(&bs, &topic, shape, n))
                .await??;
    }
    let ends = t.end_offsets()?;

    eprintln!("(a) bare consumer ...");
    measure::reset_peak_rss();
    let (tc, gb, e2) = (t.clone(), group("bare"), ends.clone());
    let bare = tokio::task::spawn_blocking(move || baselines::bare(&tc, &gb, &e2)).await??;
    r.bare_records_per_s = bare.rate();
    r.bare_peak_rss_mib = measure::peak_rss_mib();

    eprintln!("(b) direct load ...");
    measure::reset_peak_rss();
    let direct = baselines::direct(
        &t,
        &group("direct"),
        &ends,
        &sink::root_in(&dir, "direct.lance"),
        a.direct_batch,
    )
    .await?;
    r.direct_records_per_s = direct.rate();
    r.direct_batches = direct.batches;
    r.direct_peak_rss_mib = measure::peak_rss_mib();

    eprintln!("graphsink over the backlog ...");
    let gs_root = sink::root_in(&dir, "graph");
    let gs_cfg = || {
        measure::graphsink_config(
            &t,
            &dir,
            &gs_root,
            &group("graphsink"),
            a.buckets,
            &sink::fold_every(&a.fold_interval),
        )
    };
    let gs = sink::backlog(&t, gs_cfg()?, &ends, every).await?;
    r.graphsink_records_per_s = gs.timed_records as f64 / gs.secs;
    r.graphsink_timed_records = gs.timed_records;
    r.graphsink_secs = gs.secs;
    r.graphsink_commits_published = gs.published.seen.len();
    r.graphsink_peak_rss_mib = gs.peak_rss_mib;
    if gs.records != a.records {
        r.notes.push(format!(
            "graphsink consumed {} records, expected {}",
            gs.records, a.records
        ));
    }

    eprintln!("graphsink with folding off, then one timed fold ...");
    let nf_cfg = measure::graphsink_config(
        &t,
        &dir,
        &sink::root_in(&dir, "graph-nofold"),
        &group("nofold"),
        a.buckets,
        sink::FOLD_OFF,
    )?;
    // Before the paced phases, so it reads exactly the backlog.
    let fold = sink::fold_cost(&t, nf_cfg, &ends, every).await?;
    r.graphsink_nofold_records_per_s = fold.ingest_rate;
    r.fold_rows = fold.rows;
    r.fold_secs = fold.fold_secs;
    r.fold_rows_per_s = fold.rows as f64 / fold.fold_secs;
    r.fold_upserted = fold.upserted;
    r.graphsink_nofold_peak_rss_mib = fold.ingest_peak_rss_mib;
    r.fold_peak_rss_mib = fold.fold_peak_rss_mib;

    if a.latency_rate > 0 {
        eprintln!(
            "graphsink under a paced producer ({} records/s for {} s) ...",
            a.latency_rate, a.latency_secs
        );
        let settle = Duration::from_secs(60) + humantime_secs(&a.fold_interval) * 3;
        let live = sink::live(
            &t,
            gs_cfg()?,
            shape,
            a.latency_rate,
            a.latency_secs,
            every,
            settle,
        )
        .await?;
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
        let bare_ms = sink::bare_live(
            &t,
            &group("bare-live"),
            shape,
            a.latency_rate,
            a.latency_secs,
            every,
            settle,
        )
        .await?;
        r.bare_durable_ack_latency = Latency::of(bare_ms);
    }

    r.ratio_graphsink_bare = r.graphsink_records_per_s / r.bare_records_per_s;
    r.ratio_graphsink_direct = r.graphsink_records_per_s / r.direct_records_per_s;
    r.notes.push(format!(
        "records/s: first fetch → all offsets committed (committed offsets sampled every {} ms); for graphsink the clock starts when RunStats.consumed first moves and counts only the records after that first poll; durable-ack latency: record timestamp → first sample showing its offset committed (resolution {} ms + one OffsetFetch round trip; dominated by offsets.commit_interval, 1s default)",
        a.sample_ms, a.sample_ms
    ));
    r.notes.push("peak RSS: VmHWM after resetting it (clear_refs 5) at the start of each phase; includes memory the allocator kept from earlier phases and the bench's own samplers".into());
    r.notes.push("direct load: plain Lance table keyed on sku, no provenance columns, no graph commit; the bare and direct baselines read a backlog that earlier phases may have warmed in the broker".into());

    r.print();
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&r)?)?;
    }
    drop(broker);
    Ok(())
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
