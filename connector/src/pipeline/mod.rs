//! The pipeline: a run is a series of ingest sessions, and a session is
//! the run loop beside its fold task.
//!
//! A session, in order:
//! 1. `open` — the graph (a schema change this config brings is applied
//!    first, `fold::migrate`), recovery, the decoders, the dead-letter
//!    producer, the shard writers;
//! 2. the consumer joins the group, then the fold task (`fold::FoldLoop`)
//!    starts;
//! 3. `run_loop` — serve until shutdown, the end or a failure: `poll`
//!    (take → decode → put into shards without waiting → queue the poll's
//!    durability), `acks` (durability resolved in poll order: watermarks,
//!    then commits), `group` (assignments claim shards, revokes release
//!    them; `role`: who folds under partition sharding), freeze cuts for
//!    the fold task between polls, `breaker` (the reject-rate pause),
//!    `schemas` (a record of an unknown schema id holds its partition);
//!    `end` (`--exit-at-end`) and `stall` (holding nothing while the group
//!    is stuck) are the loop's two watches;
//! 4. `drain` — a graceful stop: in-flight durability, a last commit, the
//!    final fold, the writers closed; or, after a failure, a stop that
//!    commits nothing more.
//!
//! `run_with` restarts a failed session in the process when `restart` says
//! the failure passes.

mod acks;
mod breaker;
mod cut;
mod drain;
mod end;
pub(crate) mod from_registry;
mod group;
mod open;
mod poll;
mod restart;
mod role;
mod run_loop;
mod schemas;
mod stall;

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::{ErrorKind, PublicResult, Result};
use crate::fold::FoldLoop;
use crate::graph::GraphCommit;
use crate::kafka::consumer;
use crate::kafka::DeadLetters;
use crate::metrics::Metrics;
use crate::offsets::TopicPartition;
use restart::{restart_for, Backoff};
use role::FoldRole;
use run_loop::RunLoop;

/// Knobs of one run that are not part of the config file.
#[derive(Clone, Default)]
pub struct RunOptions {
    /// Stop once every assigned partition is durable and committed up to the
    /// end offsets seen at assignment (like kafka-delta-ingest's `-e`).
    pub exit_at_end: bool,
    /// Notified to fold now (operators: SIGUSR1; tests).
    pub fold_now: Option<Arc<Notify>>,
    /// Receives every graph commit the fold loop publishes, as it is put in
    /// `__manifest` (before its dead letters go out).
    pub published: Option<watch::Sender<Option<GraphCommit>>>,
    /// Metrics, probe state and the run's totals (`Metrics::totals`),
    /// shared with the caller and whoever serves them (`http`).
    pub metrics: Option<Arc<Metrics>>,
    /// Collect librdkafka's statistics into the metrics (lag, broker round
    /// trips, the fetch queue), every 5 s unless `[kafka]` sets
    /// `statistics.interval.ms`: what `graphsink run` does when it serves
    /// `/metrics`. Off by default: a callback parses them.
    pub kafka_statistics: bool,
}

/// What a finished run reports.
#[derive(Debug, Default, Clone)]
pub struct RunSummary {
    pub records: u64,
    pub committed: BTreeMap<TopicPartition, i64>,
}

/// Runs the connector until `shutdown` is cancelled, then drains: stops
/// fetching, awaits in-flight durability, commits, closes the writers.
pub async fn run(config: Config, shutdown: CancellationToken) -> PublicResult<RunSummary> {
    run_with(config, RunOptions::default(), shutdown).await
}

pub async fn run_with(
    config: Config,
    options: RunOptions,
    shutdown: CancellationToken,
) -> PublicResult<RunSummary> {
    let mut total = RunSummary::default();
    let mut backoff = Backoff::new(config.graph.storage_retry_max_backoff);
    let kafka_stats = options.kafka_statistics;
    let metrics = options
        .metrics
        .clone()
        .unwrap_or_else(|| Arc::new(Metrics::new(config.http.stall_bound)));
    loop {
        let started = tokio::time::Instant::now();
        let result = session(
            &config,
            &options,
            &metrics,
            kafka_stats,
            &shutdown,
            &mut total,
        )
        .await;
        metrics.run_loop_stopped();
        let e = match result {
            Ok(()) => return Ok(total),
            Err(e) => e,
        };
        let restart = restart_for(&e, config.wal.sharding).filter(|_| !shutdown.is_cancelled());
        let Some(why) = restart else {
            if e.kind() == ErrorKind::Fenced {
                metrics.fenced();
                tracing::error!(event = "fenced", error = %e, "fenced: another writer claimed a shard; this run stops acking");
            }
            return Err(e.into());
        };
        let delay = backoff.next(why, started.elapsed());
        metrics.session_restarted();
        if e.kind() == ErrorKind::Fenced {
            metrics.fenced();
        }
        why.say(&e, delay);
        tokio::select! {
            _ = shutdown.cancelled() => return Err(e.into()),
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// One ingest session: open the graph, recover, open (claim) the shards,
/// start the fold task, join the group, and serve until shutdown, the end,
/// or a failure. A failed session has committed nothing past durability,
/// so a new session can start over from the group's committed offsets.
async fn session(
    config: &Config,
    options: &RunOptions,
    metrics: &Arc<Metrics>,
    kafka_stats: bool,
    shutdown: &CancellationToken,
    total: &mut RunSummary,
) -> Result<()> {
    metrics.session_started();
    let (graph, policies) = open::graph(config).await?;
    let decoding = open::decoding(config, &graph, metrics)?;
    let head = graph.head().await?;
    metrics.head(head.seq, head.created_at);
    let dead_letters = DeadLetters::connect(config, graph.root(), metrics.clone()).await?;
    let mut writers = open::writers(config, &graph, &dead_letters, shutdown).await?;
    metrics.writers_reopened();
    let (delivered, retention) = (writers.delivered, writers.retention.take());
    let duty = writers.role.as_ref().map(FoldRole::duty);
    let mut run = RunLoop::new(
        config,
        options,
        metrics,
        shutdown,
        decoding,
        writers,
        dead_letters.clone(),
    )?;
    let watch = graph.clone();
    let mut fold_loop = FoldLoop::new(
        config,
        graph,
        policies,
        dead_letters,
        metrics.clone(),
        shutdown,
    )
    .with_wake(run.wake.clone())
    .with_delivered(delivered)
    .with_retention(retention);
    if let Some(published) = &options.published {
        fold_loop = fold_loop.with_published(published.clone());
    }
    if let Some(duty) = duty {
        fold_loop = fold_loop.with_duty(duty);
    }
    // From here on, every exit closes the consumer through `consumer::close`.
    let (kafka, mut events) =
        consumer::subscribe(config, run.offsets.clone(), metrics.clone(), kafka_stats)?;
    let mut fold = fold_loop.spawn();
    if let Err(e) = run.serve(&kafka, &mut events, &mut fold).await {
        total.records += run.taken;
        let e = drain::stop_after_failure(kafka, fold, e).await;
        return Err(watch.or_schema_moved(e).await);
    }
    let summary = match run.drain(kafka, &mut events, fold).await {
        Ok(summary) => summary,
        Err(e) => return Err(watch.or_schema_moved(e).await),
    };
    total.records += summary.records;
    total.committed = summary.committed;
    Ok(())
}
