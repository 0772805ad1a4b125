//! graphsink under test, through `run_with`: the backlog run (throughput,
//! peak RSS; in a child process of its own), the paced run (durable-ack and
//! graph-visible latency) and the fold-cost run (ingest with folding off,
//! then one timed `fold_offline`, each in a child).

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use graphsink::{Config, Metrics, RunOptions, RunTotals};

use crate::broker::BoxError;
use crate::formats::Codec;
use crate::measure::{self, CommitSampler, Target};
use crate::produce;
use crate::threads::{GroupCpu, ThreadCpu};
use crate::workload::Shape;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct BacklogRun {
    pub records: u64,
    /// Records after the first observed poll: the ones `secs` timed.
    pub timed_records: u64,
    pub secs: f64,
    pub commits_published: usize,
    pub peak_rss_mib: Option<f64>,
    /// RSS when the phase started: the child's binary and runtime, or, in
    /// process, also what the phases before it left (the peak includes it).
    pub start_rss_mib: Option<f64>,
    pub run_loop: LoopTimes,
    /// Ingest sessions restarted after a passing storage failure.
    pub restarts: u64,
    /// The process's CPU over the phase, in cores (the child's own when
    /// the phase ran in one), and per thread group (with the broker's).
    pub cpu_cores: Option<f64>,
    /// The same as CPU seconds: the whole phase (open, ingest, the final
    /// fold, close), not only the timed records.
    #[serde(default)]
    pub cpu_secs: Option<f64>,
    pub threads: Vec<GroupCpu>,
    /// First fetch → the graph commit that holds every record (seen by
    /// the publish watch): the rate "to visible" is `timed_records` over it.
    /// None with folding off.
    #[serde(default)]
    pub visible_secs: Option<f64>,
    /// The process's spawn (the phase's start in process) → the first
    /// record fetched.
    #[serde(default)]
    pub start_to_first_secs: f64,
    /// That last graph commit → `run --exit-at-end` returned.
    #[serde(default)]
    pub visible_to_exit_secs: Option<f64>,
    /// Spawn → exit: the run as a process, start included (the peers'
    /// "wall" figure). In process: phase start → return.
    #[serde(default)]
    pub wall_secs: f64,
}

/// Where graphsink's run loop spent the run (from `Metrics::totals`).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct LoopTimes {
    pub polls: u64,
    pub records_per_poll: f64,
    /// In polls, in all (batching + decode + puts).
    pub poll_secs: f64,
    pub decode_secs: f64,
    /// Handing rows to the shard writers (memtable inserts).
    pub put_secs: f64,
    /// Taking records from the consumer; putting rejects into their WAL.
    pub take_secs: f64,
    pub reject_secs: f64,
    /// Outside polls: the in-flight window full (waiting for an ack), and
    /// the fold's freeze cuts.
    pub window_full_secs: f64,
    pub cut_secs: f64,
    /// Records rejected before the WAL (decode, validate).
    pub rejected: u64,
    /// From the first fetch to the last poll's durability (the phase's
    /// `secs` runs on to the commit that covers it).
    #[serde(default)]
    pub durable_secs: f64,
}

impl LoopTimes {
    fn of(t: &RunTotals) -> LoopTimes {
        let secs = |ns: u64| ns as f64 / 1e9;
        LoopTimes {
            polls: t.polls,
            records_per_poll: t.consumed as f64 / t.polls.max(1) as f64,
            poll_secs: secs(t.poll_ns),
            decode_secs: secs(t.decode_ns),
            put_secs: secs(t.put_ns),
            take_secs: secs(t.take_ns),
            reject_secs: secs(t.reject_ns),
            window_full_secs: secs(t.window_full_ns),
            cut_secs: secs(t.cut_ns),
            rejected: t.rejected,
            durable_secs: 0.0,
        }
    }
}

/// Runs with `exit_at_end` over the pre-produced backlog; the clock runs
/// from the first fetch to the first sample showing every partition's
/// committed offset at its end offset.
pub(crate) async fn backlog(
    t: &Target,
    cfg: Config,
    ends: &[i64],
    every: Duration,
    started_ms: f64,
) -> Result<BacklogRun, BoxError> {
    measure::reset_peak_rss();
    let start_rss_mib = measure::rss_mib();
    let group = cfg.kafka["group.id"].clone();
    let stats = Arc::new(Metrics::default());
    let (tx, rx) = watch::channel(None);
    let (published, watcher) = measure::watch_published(rx);
    let sampler = CommitSampler::start(t, &group, every)?;
    let first = measure::first_fetch(stats.clone());
    let watch_durable = CancellationToken::new();
    let last_durable = measure::last_durable(stats.clone(), watch_durable.clone());
    let opts = RunOptions {
        exit_at_end: true,
        fold_now: None,
        published: Some(tx),
        metrics: Some(stats.clone()),
        kafka_statistics: false,
    };
    let summary = graphsink::run_with(cfg, opts, CancellationToken::new()).await?;
    let returned = measure::now_ms();
    let peak_rss_mib = measure::peak_rss_mib();
    let samples = sampler.finish()?;
    let (first, before) = first.await?;
    watch_durable.cancel();
    let last_durable = last_durable.await?;
    watcher.await?;
    let end = measure::all_committed_at(&samples, ends)
        .ok_or("graphsink ended but its committed offsets never reached the end offsets")?;
    let (commits_published, visible) = {
        let p = published.lock().unwrap();
        (p.seen.len(), measure::all_visible_at(&p, &t.topics, ends))
    };
    Ok(BacklogRun {
        records: summary.records,
        timed_records: summary.records.saturating_sub(before),
        secs: (end - first) / 1e3,
        commits_published,
        peak_rss_mib,
        start_rss_mib,
        run_loop: LoopTimes {
            durable_secs: (last_durable - first) / 1e3,
            ..LoopTimes::of(&stats.totals())
        },
        restarts: stats.totals().restarts,
        cpu_cores: None,
        cpu_secs: None,
        threads: Vec::new(),
        visible_secs: visible.map(|v| (v - first) / 1e3),
        start_to_first_secs: (first - started_ms) / 1e3,
        visible_to_exit_secs: visible.map(|v| (returned - v) / 1e3),
        wall_secs: (returned - started_ms) / 1e3,
    })
}

/// What a backlog phase needs, handed to its child process as JSON.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct BacklogSpec {
    /// The config file `measure::graphsink_config` wrote.
    pub config: PathBuf,
    pub target: Target,
    pub ends: Vec<i64>,
    pub every: Duration,
    /// The broker's pid, for the per-thread table.
    pub broker_pid: Option<u32>,
    /// The bench's `--background-nice`, passed on to the child's runtime.
    pub background_nice: i32,
    /// When the phase started (ms since the epoch): set as the child is
    /// spawned, so its figures count the process's start.
    #[serde(default)]
    pub started_ms: f64,
}

/// One backlog phase with its CPU, in a fresh process of the bench's own
/// binary (`--backlog-child`) unless `in_process` (the tests, whose binary
/// is not the bench's). In a child, the peak RSS and CPU are graphsink's
/// alone, not memory the allocator kept from the phases before, and its run
/// loop is that process's main thread, as in `graphsink run`.
pub(crate) async fn backlog_phase(
    spec: &BacklogSpec,
    in_process: bool,
) -> Result<BacklogRun, BoxError> {
    let mut spec = spec.clone();
    spec.started_ms = measure::now_ms();
    if in_process {
        return backlog_measured(&spec).await;
    }
    let path = spec.config.with_extension("backlog.json");
    std::fs::write(&path, serde_json::to_vec(&spec)?)?;
    let mut run: BacklogRun = child("--backlog-child", &path, spec.background_nice).await?;
    // The child's own clock stops as run_with returns; the process ends
    // after its drops and the JSON print: the parent's clock is the wall.
    run.wall_secs = (measure::now_ms() - spec.started_ms) / 1e3;
    Ok(run)
}

/// Runs the bench's own binary with `flag path` (and the bench's
/// background nice) and reads what it printed as JSON; its stderr passes
/// through.
async fn child<T: serde::de::DeserializeOwned>(
    flag: &str,
    path: &Path,
    background_nice: i32,
) -> Result<T, BoxError> {
    let out = tokio::process::Command::new(std::env::current_exe()?)
        .arg(flag)
        .arg(path)
        .arg("--background-nice")
        .arg(background_nice.to_string())
        .stderr(std::process::Stdio::inherit())
        .output()
        .await?;
    if !out.status.success() {
        return Err(format!("the bench's {flag} child failed: {}", out.status).into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The backlog run of `spec`, with this process's CPU over it.
pub(crate) async fn backlog_measured(spec: &BacklogSpec) -> Result<BacklogRun, BoxError> {
    let cfg = Config::load(&spec.config)?;
    let cpu = crate::s3::SelfCpu::start();
    let threads = ThreadCpu::start(spec.broker_pid);
    let mut run = backlog(&spec.target, cfg, &spec.ends, spec.every, spec.started_ms).await?;
    run.cpu_cores = cpu.cores();
    run.cpu_secs = cpu.secs();
    run.threads = threads.finish();
    Ok(run)
}

pub(crate) struct LiveRun {
    pub durable_ms: Vec<f64>,
    pub visible_ms: Vec<f64>,
    pub unseen: usize,
    pub missed: u64,
    pub records: usize,
    /// Where the folds' time went under the paced producer.
    pub fold_phases: Vec<measure::FoldPhase>,
}

/// Runs the connector without `exit_at_end` while a paced producer writes
/// records stamped with the time they were sent; every record's latency is
/// then (first commit sample covering it) − timestamp, and (first published
/// commit covering it) − timestamp. `catch_up`: records on the topics past
/// the group's committed offsets (earlier paced phases), consumed before
/// the primer counts, so the paced records find the pipeline caught up.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn live(
    t: &Target,
    cfg: Config,
    shape: Shape,
    rate: u64,
    secs: u64,
    every: Duration,
    settle: Duration,
    catch_up: u64,
) -> Result<LiveRun, BoxError> {
    let group = cfg.kafka["group.id"].clone();
    let stats = Arc::new(Metrics::default());
    let (tx, rx) = watch::channel(None);
    let (published, watcher) = measure::watch_published(rx);
    let stop = CancellationToken::new();
    let opts = RunOptions {
        exit_at_end: false,
        fold_now: None,
        published: Some(tx),
        metrics: Some(stats.clone()),
        kafka_statistics: false,
    };
    let run = tokio::spawn(graphsink::run_with(cfg, opts, stop.clone()));

    // A primer record proves the group has joined and the pipeline runs, so
    // the join time does not land in the first records' latency.
    {
        let (bs, topics) = (t.bootstrap.clone(), t.topics.clone());
        let codec = Codec::of(&t.values)?;
        tokio::task::spawn_blocking(move || {
            produce::produce_one(&bs, &topics, shape, 0xbeef, &codec)
        })
        .await??;
    }
    let deadline = Instant::now() + Duration::from_secs(90 + catch_up / 1000);
    while stats.totals().durable < catch_up + 1 {
        if run.is_finished() || Instant::now() > deadline {
            stop.cancel();
            run.await??;
            return Err("graphsink did not consume the primer record".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let sampler = CommitSampler::start(t, &group, every)?;
    let produce::Paced {
        records: recs,
        ends,
    } = paced(t, shape, rate, secs, 0x1a7e).await?;
    // Wait (bounded) until every record is committed and visible, so the
    // tail of the run is measured rather than cut off by the shutdown.
    let deadline = Instant::now() + settle;
    while Instant::now() < deadline {
        let committed = sampler.latest().iter().zip(&ends).all(|(c, e)| c >= e);
        let visible =
            measure::visible_latencies(&published.lock().unwrap(), &t.topics, &recs).1 == 0;
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
    let (visible_ms, unseen) = measure::visible_latencies(&published, &t.topics, &recs);
    Ok(LiveRun {
        durable_ms,
        visible_ms,
        unseen,
        missed: published.missed,
        records: recs.len(),
        fold_phases: measure::fold_phases(&stats),
    })
}

pub(crate) struct FoldRun {
    pub ingest_rate: f64,
    pub ingest_peak_rss_mib: Option<f64>,
    pub rows: u64,
    pub fold: FoldCost,
}

/// One offline fold, timed in a fresh process (`--fold-config`), so its
/// peak RSS is the fold's own and not memory the allocator kept from the
/// ingest phases.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct FoldCost {
    pub secs: f64,
    pub upserted: u64,
    pub peak_rss_mib: Option<f64>,
    /// RSS of the child before the fold started (the binary and runtime).
    pub start_rss_mib: Option<f64>,
}

/// Ingests the backlog into a fresh graph with folding off (so the WAL
/// holds every record), then times one `fold_offline` of all of it in a
/// child process. The fold time includes claiming the shards (an empty WAL
/// replay after the clean close), reading the flushed generations and the
/// merge-insert.
pub(crate) async fn fold_cost(spec: &BacklogSpec, in_process: bool) -> Result<FoldRun, BoxError> {
    let config_path = &spec.config;
    let ingest = backlog_phase(spec, in_process).await?;
    let fold = if in_process {
        fold_child(config_path).await?
    } else {
        child("--fold-config", config_path, spec.background_nice).await?
    };
    Ok(FoldRun {
        ingest_rate: ingest.timed_records as f64 / ingest.secs,
        ingest_peak_rss_mib: ingest.peak_rss_mib,
        rows: ingest.records,
        fold,
    })
}

/// The child's side of `fold_cost`: one `fold_offline` of the graph the
/// config names.
pub(crate) async fn fold_child(config_path: &Path) -> Result<FoldCost, BoxError> {
    let cfg = Config::load(config_path)?;
    let graph =
        graphsink::Graph::open_or_init(&cfg, graphsink::GraphSchema::load(&cfg.schema_path())?)
            .await?;
    let start_rss_mib = measure::rss_mib();
    measure::reset_peak_rss();
    let start = Instant::now();
    let commit = graphsink::testing::fold_offline(
        &graph,
        &graphsink::testing::Policies::from_config(&cfg),
        &cfg.wal,
        "graphsink-bench",
    )
    .await?;
    let secs = start.elapsed().as_secs_f64();
    Ok(FoldCost {
        secs,
        upserted: commit.map_or(0, |c| c.stats.values().map(|s| s.upserted).sum()),
        peak_rss_mib: measure::peak_rss_mib(),
        start_rss_mib,
    })
}

/// The `[fold]` section for the fold-cost run: no timer, no size triggers,
/// no final fold.
pub(crate) const FOLD_OFF: &str = "interval = \"0s\"\non_shutdown = false\nmax_pending_rows = 1000000000000\nmax_pending_bytes = 1000000000000";

pub(crate) fn fold_every(interval: &str) -> String {
    format!("interval = \"{interval}\"")
}

pub(crate) fn root_in(dir: &Path, name: &str) -> String {
    dir.join(name).to_string_lossy().into_owned()
}

async fn paced(
    t: &Target,
    shape: Shape,
    rate: u64,
    secs: u64,
    seed: u64,
) -> Result<produce::Paced, BoxError> {
    let (bs, topics) = (t.bootstrap.clone(), t.topics.clone());
    let codec = Codec::of(&t.values)?;
    tokio::task::spawn_blocking(move || {
        produce::produce_paced(&bs, &topics, shape, rate, secs, seed, &codec)
    })
    .await?
}

/// The bare consumer under the same paced producer: its durable-ack
/// latency is what the broker, librdkafka and the commit cadence cost by
/// themselves, the floor under graphsink's figure. `on_topics` is how many
/// records the topics hold before its primer (it reads from the earliest
/// offset, so it has joined and caught up once it has seen them all).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn bare_live(
    t: &Target,
    group: &str,
    shape: Shape,
    rate: u64,
    secs: u64,
    every: Duration,
    settle: Duration,
    on_topics: u64,
) -> Result<(Vec<f64>, usize), BoxError> {
    use std::sync::atomic::{AtomicBool, AtomicU64};
    let seen = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (tc, g, s2, st2) = (t.clone(), group.to_string(), seen.clone(), stop.clone());
    let run = tokio::task::spawn_blocking(move || {
        crate::baselines::bare_loop(&tc, &g, &s2, &|_| st2.load(Ordering::Relaxed))
    });
    {
        let (bs, topics) = (t.bootstrap.clone(), t.topics.clone());
        let codec = Codec::of(&t.values)?;
        tokio::task::spawn_blocking(move || {
            produce::produce_one(&bs, &topics, shape, 0xbee2, &codec)
        })
        .await??;
    }
    // Counted, not read off the high watermarks (too small on tansu when
    // producers batch).
    let total = on_topics + 1;
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.load(Ordering::Relaxed) < total {
        if run.is_finished() || Instant::now() > deadline {
            stop.store(true, Ordering::Relaxed);
            run.await??;
            return Err("bare consumer did not catch up before the paced phase".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let sampler = CommitSampler::start(t, group, every)?;
    let produce::Paced {
        records: recs,
        ends,
    } = paced(t, shape, rate, secs, 0xba2e).await?;
    let deadline = Instant::now() + settle;
    while Instant::now() < deadline && !sampler.latest().iter().zip(&ends).all(|(c, e)| c >= e) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    run.await??;
    let samples = sampler.finish()?;
    Ok((measure::commit_latencies(&samples, &recs), recs.len()))
}
