//! graphsink under test, in-process through `run_with`: the backlog run
//! (throughput, peak RSS), the paced run (durable-ack and graph-visible
//! latency) and the fold-cost run (ingest with folding off, then one timed
//! `fold_offline`).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use graphsink::{Config, RunOptions, RunStats};

use crate::broker::BoxError;
use crate::measure::{self, CommitSampler, Published, Target};
use crate::workload::{self, Shape};

pub struct BacklogRun {
    pub records: u64,
    /// Records after the first observed poll: the ones `secs` timed.
    pub timed_records: u64,
    pub secs: f64,
    pub published: Published,
    pub peak_rss_mib: Option<f64>,
}

/// Runs with `exit_at_end` over the pre-produced backlog; the clock runs
/// from the first fetch to the first sample showing every partition's
/// committed offset at its end offset.
pub async fn backlog(
    t: &Target,
    cfg: Config,
    ends: &[i64],
    every: Duration,
) -> Result<BacklogRun, BoxError> {
    measure::reset_peak_rss();
    let group = cfg.kafka["group.id"].clone();
    let stats = Arc::new(RunStats::default());
    let (tx, rx) = watch::channel(None);
    let (published, watcher) = measure::watch_published(rx);
    let sampler = CommitSampler::start(t, &group, every)?;
    let first = measure::first_fetch(stats.clone());
    let opts = RunOptions {
        exit_at_end: true,
        fold_now: None,
        published: Some(tx),
        stats: Some(stats.clone()),
    };
    let summary = graphsink::run_with(cfg, opts, CancellationToken::new()).await?;
    let peak_rss_mib = measure::peak_rss_mib();
    let samples = sampler.finish()?;
    let (first, before) = first.await?;
    watcher.await?;
    let end = measure::all_committed_at(&samples, ends)
        .ok_or("graphsink ended but its committed offsets never reached the end offsets")?;
    let published = published.lock().unwrap().clone();
    Ok(BacklogRun {
        records: summary.records,
        timed_records: summary.records.saturating_sub(before),
        secs: (end - first) / 1e3,
        published,
        peak_rss_mib,
    })
}

pub struct LiveRun {
    pub durable_ms: Vec<f64>,
    pub visible_ms: Vec<f64>,
    pub unseen: usize,
    pub missed: u64,
    pub records: usize,
}

/// Runs the connector without `exit_at_end` while a paced producer writes
/// records stamped with the time they were sent; every record's latency is
/// then (first commit sample covering it) − timestamp, and (first published
/// commit covering it) − timestamp.
pub async fn live(
    t: &Target,
    cfg: Config,
    shape: Shape,
    rate: u64,
    secs: u64,
    every: Duration,
    settle: Duration,
) -> Result<LiveRun, BoxError> {
    let group = cfg.kafka["group.id"].clone();
    let stats = Arc::new(RunStats::default());
    let (tx, rx) = watch::channel(None);
    let (published, watcher) = measure::watch_published(rx);
    let stop = CancellationToken::new();
    let opts = RunOptions {
        exit_at_end: false,
        fold_now: None,
        published: Some(tx),
        stats: Some(stats.clone()),
    };
    let run = tokio::spawn(graphsink::run_with(cfg, opts, stop.clone()));

    // A primer record proves the group has joined and the pipeline runs, so
    // the join time does not land in the first records' latency.
    let (p, _) = workload::producer(&t.bootstrap, false)?;
    let (k, v) = workload::record(shape, 0xbeef, 0);
    workload::send(&p, &t.topic, &k, &v, None)?;
    rdkafka::producer::Producer::flush(&p, Duration::from_secs(10))?;
    let deadline = Instant::now() + Duration::from_secs(90);
    while stats.durable.load(Ordering::Relaxed) == 0 {
        if run.is_finished() || Instant::now() > deadline {
            stop.cancel();
            run.await??;
            return Err("graphsink did not consume the primer record".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let sampler = CommitSampler::start(t, &group, every)?;
    let (bs, topic) = (t.bootstrap.clone(), t.topic.clone());
    let recs = tokio::task::spawn_blocking(move || {
        workload::produce_paced(&bs, &topic, shape, rate, secs, 0)
    })
    .await??;
    let mut ends = vec![0i64; t.partitions as usize];
    for &(p, off, _) in &recs {
        ends[p as usize] = ends[p as usize].max(off + 1);
    }
    // Wait (bounded) until every record is committed and visible, so the
    // tail of the run is measured rather than cut off by the shutdown.
    let deadline = Instant::now() + settle;
    while Instant::now() < deadline {
        let committed = sampler.latest().iter().zip(&ends).all(|(c, e)| c >= e);
        let visible =
            measure::visible_latencies(&published.lock().unwrap(), &t.topic, &recs).1 == 0;
        if committed && visible {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    run.await??;
    watcher.await?;
    let samples = sampler.finish()?;
    let published = published.lock().unwrap().clone();
    let durable_ms = measure::commit_latencies(&samples, &recs);
    let (visible_ms, unseen) = measure::visible_latencies(&published, &t.topic, &recs);
    Ok(LiveRun {
        durable_ms,
        visible_ms,
        unseen,
        missed: published.missed,
        records: recs.len(),
    })
}

pub struct FoldRun {
    pub ingest_rate: f64,
    pub ingest_peak_rss_mib: Option<f64>,
    pub fold_peak_rss_mib: Option<f64>,
    pub rows: u64,
    pub fold_secs: f64,
    pub upserted: u64,
}

/// Ingests the backlog into a fresh graph with folding off (so the WAL
/// holds every record), then times one `fold_offline` of all of it. The
/// fold time includes claiming the shards (an empty WAL replay after the
/// clean close), reading the flushed generations and the merge-insert.
pub async fn fold_cost(
    t: &Target,
    cfg: Config,
    ends: &[i64],
    every: Duration,
) -> Result<FoldRun, BoxError> {
    let wal = cfg.wal.clone();
    let schema_path = cfg.schema_path();
    let cfg2 = cfg.clone();
    let ingest = backlog(t, cfg, ends, every).await?;
    let graph = graphsink::graph::Graph::open_or_init(
        &cfg2,
        graphsink::schema::GraphSchema::load(&schema_path)?,
    )
    .await?;
    measure::reset_peak_rss();
    let start = Instant::now();
    let commit = graphsink::fold::fold_offline(&graph, &wal, "graphsink-bench").await?;
    let fold_secs = start.elapsed().as_secs_f64();
    let fold_peak_rss_mib = measure::peak_rss_mib();
    let upserted = commit.map_or(0, |c| c.stats.values().map(|s| s.upserted).sum());
    Ok(FoldRun {
        ingest_rate: ingest.timed_records as f64 / ingest.secs,
        ingest_peak_rss_mib: ingest.peak_rss_mib,
        fold_peak_rss_mib,
        rows: ingest.records,
        fold_secs,
        upserted,
    })
}

/// The `[fold]` section for the fold-cost run: no timer, no size triggers,
/// no final fold.
pub const FOLD_OFF: &str = "interval = \"0s\"\non_shutdown = false\nmax_pending_rows = 1000000000000\nmax_pending_bytes = 1000000000000";

pub fn fold_every(interval: &str) -> String {
    format!("interval = \"{interval}\"")
}

pub fn root_in(dir: &Path, name: &str) -> String {
    dir.join(name).to_string_lossy().into_owned()
}

/// The bare consumer under the same paced producer: its durable-ack
/// latency is what the broker, librdkafka and a 1 s commit cadence cost by
/// themselves, the floor under graphsink's figure.
pub async fn bare_live(
    t: &Target,
    group: &str,
    shape: Shape,
    rate: u64,
    secs: u64,
    every: Duration,
    settle: Duration,
) -> Result<Vec<f64>, BoxError> {
    use std::sync::atomic::{AtomicBool, AtomicU64};
    let seen = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (tc, g, s2, st2) = (t.clone(), group.to_string(), seen.clone(), stop.clone());
    let run = tokio::task::spawn_blocking(move || {
        crate::baselines::bare_loop(&tc, &g, &s2, &|_| st2.load(Ordering::Relaxed))
    });
    let (p, _) = workload::producer(&t.bootstrap, false)?;
    let (k, v) = workload::record(shape, 0xbeef, 1);
    workload::send(&p, &t.topic, &k, &v, None)?;
    rdkafka::producer::Producer::flush(&p, Duration::from_secs(10))?;
    // It starts at the earliest offset, so "joined" = it has caught up
    // with what is on the topic now.
    let total: i64 = t.end_offsets()?.iter().sum();
    let deadline = Instant::now() + Duration::from_secs(120);
    while (seen.load(Ordering::Relaxed) as i64) < total {
        if run.is_finished() || Instant::now() > deadline {
            stop.store(true, Ordering::Relaxed);
            run.await??;
            return Err("bare consumer did not catch up before the paced phase".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let sampler = CommitSampler::start(t, group, every)?;
    let (bs, topic) = (t.bootstrap.clone(), t.topic.clone());
    let recs = tokio::task::spawn_blocking(move || {
        workload::produce_paced(&bs, &topic, shape, rate, secs, 1 << 40)
    })
    .await??;
    let mut ends = vec![0i64; t.partitions as usize];
    for &(p, off, _) in &recs {
        ends[p as usize] = ends[p as usize].max(off + 1);
    }
    let deadline = Instant::now() + settle;
    while Instant::now() < deadline && !sampler.latest().iter().zip(&ends).all(|(c, e)| c >= e) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    run.await??;
    let samples = sampler.finish()?;
    Ok(measure::commit_latencies(&samples, &recs))
}
