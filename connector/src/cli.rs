//! The command line: `check`, `run`, `fold`, `log`, `show`, `status`,
//! `rejects`, `replay-rejects`, `produce`.
//! Every error ends as one readable line and a non-zero exit.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use clap::{Parser, Subcommand};
use futures::TryStreamExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::{Context, Error, Result};
use crate::graph::{self, Graph, GraphCommit};
use crate::pipeline::{run_with, RunOptions};
use crate::rejects::{self, Reject, Stage, REJECTS_TABLE};
use crate::schema::GraphSchema;

#[derive(Parser)]
#[command(
    name = "graphsink",
    version,
    about = "Kafka sink connector for typed graphs on Lance"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the config and the schema, then exit.
    Check {
        #[arg(long)]
        config: PathBuf,
    },
    /// Run the connector until SIGINT/SIGTERM (SIGUSR1 folds now).
    Run {
        #[arg(long)]
        config: PathBuf,
        /// Exit once every assigned partition is durable and committed up to
        /// the end offsets seen at start.
        #[arg(long)]
        exit_at_end: bool,
    },
    /// Fold everything durable into a graph commit and exit. Claims every
    /// shard: a running connector on the same graph is fenced and stops.
    Fold {
        #[arg(long)]
        config: PathBuf,
    },
    /// Graph commits, newest first.
    Log {
        #[arg(long)]
        config: PathBuf,
        /// Show at most this many commits.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Row counts per table at the head (or the given commit).
    Show {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        commit: Option<String>,
    },
    /// The head commit, deferred edges, rejects, and the consumer group's
    /// lag per partition of the mapped topics.
    Status {
        #[arg(long)]
        config: PathBuf,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Rows of `_ingest_rejects` at the head commit, oldest first.
    Rejects {
        #[arg(long)]
        config: PathBuf,
        #[command(flatten)]
        filter: RejectFilter,
        /// Show at most this many (the oldest that match).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// One JSON object per line instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Re-produce the original records of rejects (key, value, headers
    /// without graphsink's, timestamp) to a topic, oldest first.
    ReplayRejects {
        #[arg(long)]
        config: PathBuf,
        /// Topic to produce to (e.g. a mapped source topic, after a fix).
        #[arg(long, value_name = "TOPIC")]
        to: String,
        #[command(flatten)]
        filter: RejectFilter,
        /// Replay at most this many (the oldest that match); default all.
        #[arg(long)]
        limit: Option<usize>,
        /// List what would be replayed; produce nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Produce JSON-lines records (`{"key": .., "value": ..}`) to a topic,
    /// creating it if missing. For samples and tests.
    Produce {
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        topic: String,
        #[arg(long)]
        file: PathBuf,
        /// Partitions of the topic if it has to be created.
        #[arg(long, default_value_t = 4)]
        partitions: i32,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("graphsink: error: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(dispatch(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("graphsink: error: {}", one_line(&e.to_string()));
            ExitCode::from(match e.kind() {
                crate::ErrorKind::BadConfig => 2,
                crate::ErrorKind::Fenced => 3,
                _ => 1,
            })
        }
    }
}

/// `lance::index` logs a benign "Index __lance_mem_wal has no fields" at
/// ERROR on every merge into a MemWAL table; real index failures still
/// surface as errors of the operation.
const DEFAULT_LOG_FILTER: &str = "info,lance=warn,lance::index=off,datafusion=warn";

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

async fn dispatch(cmd: Command) -> Result<()> {
    match cmd {
        Command::Check { config } => check(&config),
        Command::Run {
            config,
            exit_at_end,
        } => run(&config, exit_at_end).await,
        Command::Fold { config } => {
            let config = Config::load(&config)?;
            let graph = open_graph(&config).await?;
            match crate::fold::fold_offline(&graph, &config.wal, &config.graph.actor).await? {
                Some(c) => println!("published {} (seq {})", c.id, c.seq),
                None => println!("nothing to fold"),
            }
            Ok(())
        }
        Command::Log { config, limit } => {
            let config = Config::load(&config)?;
            let graph = Graph::open_readonly(config.root_uri()).await?;
            for c in graph.commits().await?.iter().take(limit) {
                print_commit(c);
            }
            Ok(())
        }
        Command::Show { config, commit } => {
            let config = Config::load(&config)?;
            let graph = Graph::open_readonly(config.root_uri()).await?;
            let c = match commit {
                Some(id) => graph.commit(&id).await?,
                None => graph.head().await?,
            };
            println!("commit {} (seq {})", c.id, c.seq);
            let counts = graph::row_counts(&graph, &c).await?;
            for (table, version) in &c.tables {
                println!(
                    "  {table:<32} {:>10} rows  (version {version})",
                    counts[table]
                );
            }
            Ok(())
        }
        Command::Status { config, json } => status(&config, json).await,
        Command::Rejects {
            config,
            filter,
            limit,
            json,
        } => list_rejects(&config, &filter, limit, json).await,
        Command::ReplayRejects {
            config,
            to,
            filter,
            limit,
            dry_run,
        } => replay_rejects(&config, &to, &filter, limit, dry_run).await,
        Command::Produce {
            config,
            topic,
            file,
            partitions,
        } => produce(&config, &topic, &file, partitions).await,
    }
}

fn check(path: &std::path::Path) -> Result<()> {
    let config = Config::load(path)?;
    let schema = GraphSchema::load(&config.schema_path())?;
    for m in &config.mappings {
        crate::decode::RecordDecoder::new(&schema, m, 1, config.errors.max_record_bytes)?;
    }
    println!(
        "ok: {} mappings, {} types, graph root {}",
        config.mappings.len(),
        schema.types.len(),
        config.root_uri()
    );
    Ok(())
}

async fn open_graph(config: &Config) -> Result<Graph> {
    let schema = GraphSchema::load(&config.schema_path())?;
    Graph::open_or_init(config, schema).await
}

async fn run(path: &std::path::Path, exit_at_end: bool) -> Result<()> {
    check(path)?;
    let config = Config::load(path)?;
    let shutdown = CancellationToken::new();
    let fold_now = Arc::new(tokio::sync::Notify::new());
    spawn_signal_handlers(shutdown.clone(), fold_now.clone())?;
    let options = RunOptions {
        exit_at_end,
        fold_now: Some(fold_now),
        published: None,
        stats: None,
    };
    let summary = run_with(config, options, shutdown).await?;
    println!(
        "stopped after {} records; committed {} partitions",
        summary.records,
        summary.committed.len()
    );
    Ok(())
}

fn spawn_signal_handlers(
    shutdown: CancellationToken,
    fold_now: Arc<tokio::sync::Notify>,
) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let sig = |k| signal(k).map_err(|e| Error::Other(format!("signal handler: {e}")));
    let mut term = sig(SignalKind::terminate())?;
    let mut int = sig(SignalKind::interrupt())?;
    let mut usr1 = sig(SignalKind::user_defined1())?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                _ = usr1.recv() => { fold_now.notify_one(); continue; }
            }
        }
        tracing::info!("shutdown requested: draining");
        shutdown.cancel();
    });
    Ok(())
}

fn print_commit(c: &GraphCommit) {
    let when = chrono::DateTime::from_timestamp_millis(c.created_at)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default();
    println!("commit {}  seq {}  {}  by {}", c.id, c.seq, when, c.actor);
    if let Some(p) = &c.parent {
        println!("  parent  {p}");
    }
    for (table, s) in &c.stats {
        println!(
            "  {table:<32} +{} upserted  -{} deleted",
            s.upserted, s.deleted
        );
    }
    for r in &c.offsets {
        println!(
            "  offsets {}/{}  {}..={}",
            r.topic, r.partition, r.first, r.last
        );
    }
}

/// One line of a `produce` file.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LineRecord {
    #[serde(default)]
    key: Option<serde_json::Value>,
    #[serde(default)]
    value: Option<serde_json::Value>,
}

async fn produce(
    path: &std::path::Path,
    topic: &str,
    file: &std::path::Path,
    partitions: i32,
) -> Result<()> {
    let config = Config::load(path)?;
    let mut pc = connection_config(&config);
    let admin: AdminClient<_> = pc.create()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let res = admin.create_topics([&new], &AdminOptions::new()).await?;
    for r in res {
        match r {
            Ok(_) => tracing::info!(topic, partitions, "created topic"),
            Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => return Err(Error::Other(format!("create topic {t}: {e}"))),
        }
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| Error::config(format!("cannot read {}: {e}", file.display())))?;
    let producer: FutureProducer = pc.set("enable.idempotence", "true").create()?;
    let mut sent = 0usize;
    let mut pending = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let rec: LineRecord = serde_json::from_str(line)
            .map_err(|e| Error::config(format!("{}:{}: {e}", file.display(), n + 1)))?;
        let key = rec.key.map(|k| match k {
            serde_json::Value::String(s) => s,
            other => other.to_string(),
        });
        let value = rec.value.filter(|v| !v.is_null()).map(|v| v.to_string());
        let mut r: FutureRecord<String, String> = FutureRecord::to(topic);
        if let Some(k) = &key {
            r = r.key(k);
        }
        if let Some(v) = &value {
            r = r.payload(v);
        }
        pending.push(producer.send_result(r).map_err(|(e, _)| Error::Kafka(e))?);
        sent += 1;
    }
    for p in pending {
        p.await
            .map_err(|_| Error::Other("producer dropped a delivery".into()))?
            .map_err(|(e, _)| Error::Kafka(e))?;
    }
    producer.flush(Duration::from_secs(30))?;
    println!("produced {sent} records to {topic}");
    Ok(())
}

fn connection_config(config: &Config) -> rdkafka::ClientConfig {
    crate::kafka::client::producer_config(&config.kafka)
}

fn fmt_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

/// `3m 12s`, to the second.
fn fmt_age(ms: i64) -> String {
    let secs = u64::try_from(ms.max(0) / 1000).unwrap_or(0);
    humantime_serde::re::humantime::format_duration(Duration::from_secs(secs)).to_string()
}

use crate::kafka::client::QuietContext;

// ---- rejects, replay-rejects ----------------------------------------------

/// Which rejects `rejects` and `replay-rejects` select.
#[derive(clap::Args, Debug, Clone, Default)]
struct RejectFilter {
    /// Only rejects of this stage: decode, validate or fold.
    #[arg(long, value_parser = parse_stage)]
    stage: Option<Stage>,
    /// Only rejects of this graph type.
    #[arg(long = "type", value_name = "TYPE")]
    type_name: Option<String>,
    /// Only rejects at or after this time: RFC 3339 (`2026-01-01T00:00:00Z`)
    /// or a duration ago (`10m`, `2h 30m`, `1d`).
    #[arg(long, value_name = "TIME", value_parser = parse_since)]
    since: Option<i64>,
}

impl RejectFilter {
    /// The filter as a Lance scan predicate (DataFusion SQL), if any.
    fn to_sql(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(s) = self.stage {
            parts.push(format!("stage = {}", sql_string(s.as_str())));
        }
        if let Some(t) = &self.type_name {
            parts.push(format!("type_name = {}", sql_string(t)));
        }
        if let Some(ms) = self.since {
            parts.push(format!("rejected_at >= {}", sql_timestamp(ms)));
        }
        (!parts.is_empty()).then(|| parts.join(" AND "))
    }
}

fn parse_stage(s: &str) -> std::result::Result<Stage, String> {
    match s {
        "decode" => Ok(Stage::Decode),
        "validate" => Ok(Stage::Validate),
        "fold" => Ok(Stage::Fold),
        _ => Err("expected decode, validate or fold".into()),
    }
}

fn parse_since(s: &str) -> std::result::Result<i64, String> {
    parse_since_at(s, graph::now_ms())
}

/// `--since` as epoch milliseconds: an RFC 3339 time, or `now` minus a
/// humantime duration.
fn parse_since_at(s: &str, now_ms: i64) -> std::result::Result<i64, String> {
    let s = s.trim();
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.timestamp_millis());
    }
    match humantime_serde::re::humantime::parse_duration(s) {
        Ok(d) => i64::try_from(d.as_millis())
            .ok()
            .and_then(|d| now_ms.checked_sub(d))
            .filter(|&ms| chrono::DateTime::from_timestamp_millis(ms).is_some())
            .ok_or_else(|| format!("duration {s:?} reaches too far back")),
        Err(e) => Err(format!(
            "expected an RFC 3339 time (2026-01-01T00:00:00Z) or a duration ago (10m, 2h): {e}"
        )),
    }
}

/// A SQL string literal.
fn sql_string(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A SQL timestamp literal of epoch milliseconds, in UTC. Lance parses it as
/// a zone-less timestamp, which DataFusion compares with the UTC column as
/// UTC.
fn sql_timestamp(ms: i64) -> String {
    let t = chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default();
    format!("TIMESTAMP '{}'", t.format("%Y-%m-%d %H:%M:%S%.3f"))
}

/// The rejects the head commit pins that match `filter`, oldest first (by
/// `rejected_at`, then source coordinates).
async fn select_rejects(
    graph: &Graph,
    head: &GraphCommit,
    filter: &RejectFilter,
) -> Result<Vec<Reject>> {
    let Some(&version) = head.tables.get(REJECTS_TABLE) else {
        return Ok(vec![]);
    };
    let ds = graph.open_table(REJECTS_TABLE, Some(version)).await?;
    scan_rejects(&ds, filter).await
}

async fn scan_rejects(ds: &lance::Dataset, filter: &RejectFilter) -> Result<Vec<Reject>> {
    let mut scan = ds.scan();
    if let Some(sql) = filter.to_sql() {
        scan.filter(&sql)
            .ctx(format!("{REJECTS_TABLE} filter {sql}"))?;
    }
    let batches: Vec<RecordBatch> = scan
        .try_into_stream()
        .await
        .ctx(REJECTS_TABLE)?
        .try_collect()
        .await
        .ctx(REJECTS_TABLE)?;
    let mut out = Vec::new();
    for b in &batches {
        out.extend(rejects::from_batch(b)?);
    }
    out.sort_by(|a, b| {
        (a.rejected_at, a.offset, &a.topic, a.partition, &a.reject_id).cmp(&(
            b.rejected_at,
            b.offset,
            &b.topic,
            b.partition,
            &b.reject_id,
        ))
    });
    Ok(out)
}

/// `1 reject`, `3 rejects`.
fn rejects_n(n: usize) -> String {
    format!("{n} reject{}", if n == 1 { "" } else { "s" })
}

/// One readable line: time, stage, code, type, source, id, message.
fn reject_line(r: &Reject) -> String {
    let source = match (&r.topic, r.partition, r.offset) {
        (Some(t), Some(p), Some(o)) => format!("{t}/{p}@{o}"),
        _ => "-".to_string(),
    };
    format!(
        "{}  {:<8}  {:<18}  {:<12}  {}  {}  {}",
        fmt_ms(r.rejected_at),
        r.stage.as_str(),
        r.code.as_str(),
        r.type_name.as_deref().unwrap_or("-"),
        source,
        r.reject_id,
        one_line(&r.message)
    )
}

/// Bytes as JSON: a string when they are UTF-8, else `{"base64": ".."}`.
fn bytes_json(b: &[u8]) -> serde_json::Value {
    use base64::Engine;
    match std::str::from_utf8(b) {
        Ok(s) => serde_json::Value::String(s.to_string()),
        Err(_) => serde_json::json!({
            "base64": base64::engine::general_purpose::STANDARD.encode(b)
        }),
    }
}

/// A reject as JSON: its serde form, with key, value and header values as
/// text (or base64) instead of byte arrays.
fn reject_json(r: &Reject) -> serde_json::Value {
    let mut v = serde_json::to_value(r).expect("a reject serializes");
    let o = v.as_object_mut().expect("a reject is an object");
    let opt = |b: &Option<Vec<u8>>| b.as_deref().map_or(serde_json::Value::Null, bytes_json);
    o.insert("key".into(), opt(&r.key));
    o.insert("value".into(), opt(&r.value));
    o.insert(
        "headers".into(),
        r.headers
            .iter()
            .map(|(k, v)| serde_json::json!([k, opt(v)]))
            .collect(),
    );
    v
}

async fn list_rejects(
    path: &std::path::Path,
    filter: &RejectFilter,
    limit: usize,
    json: bool,
) -> Result<()> {
    let config = Config::load(path)?;
    let graph = Graph::open_readonly(config.root_uri()).await?;
    let head = graph.head().await?;
    let selected = select_rejects(&graph, &head, filter).await?;
    for r in selected.iter().take(limit) {
        if json {
            println!("{}", reject_json(r));
        } else {
            println!("{}", reject_line(r));
        }
    }
    if selected.len() > limit {
        eprintln!(
            "{limit} of {} (oldest first; raise --limit for more)",
            rejects_n(selected.len())
        );
    } else {
        eprintln!("{}", rejects_n(selected.len()));
    }
    Ok(())
}

async fn replay_rejects(
    path: &std::path::Path,
    to: &str,
    filter: &RejectFilter,
    limit: Option<usize>,
    dry_run: bool,
) -> Result<()> {
    let config = Config::load(path)?;
    let graph = Graph::open_readonly(config.root_uri()).await?;
    let head = graph.head().await?;
    let mut selected = select_rejects(&graph, &head, filter).await?;
    if let Some(n) = limit {
        selected.truncate(n);
    }
    // Fold rejects of deletes carry no original record.
    let (replay, skipped): (Vec<Reject>, Vec<Reject>) = selected
        .into_iter()
        .partition(|r| r.key.is_some() || r.value.is_some());
    let skipped = skipped.len();
    if dry_run {
        for r in &replay {
            println!("{}", reject_line(r));
        }
        println!(
            "would replay {} to {to} (skipped {skipped})",
            rejects_n(replay.len())
        );
        return Ok(());
    }
    if !replay.is_empty() {
        crate::kafka::produce::replay(&config, to, &replay).await?;
    }
    println!(
        "replayed {} to {to} (skipped {skipped})",
        rejects_n(replay.len())
    );
    Ok(())
}

// ---- status -----------------------------------------------------------------

struct PendingStatus {
    edge: String,
    table: String,
    count: usize,
    oldest: Option<i64>,
}

struct PartitionStatus {
    topic: String,
    partition: i32,
    committed: Option<i64>,
    low: i64,
    end: i64,
}

impl PartitionStatus {
    /// Records the group has yet to commit; all retained ones before its
    /// first commit (`auto.offset.reset = earliest`).
    fn lag(&self) -> i64 {
        (self.end - self.committed.unwrap_or(self.low)).max(0)
    }
}

struct KafkaStatus {
    group: String,
    partitions: Vec<PartitionStatus>,
    /// Mapped topics the broker does not know, with its error.
    missing: Vec<(String, String)>,
}

async fn status(path: &std::path::Path, json: bool) -> Result<()> {
    let config = Config::load(path)?;
    let graph = Graph::open_readonly(config.root_uri()).await?;
    let head = graph.head().await?;
    let now = graph::now_ms();
    let mut pending = Vec::new();
    for (table, &version) in head
        .tables
        .iter()
        .filter(|(t, _)| t.starts_with("_pending/"))
    {
        let ds = graph.open_table(table, Some(version)).await?;
        let count = ds.count_rows(None).await.ctx(table)?;
        let oldest = if count > 0 {
            crate::fold::oldest_pending(&ds).await?
        } else {
            None
        };
        pending.push(PendingStatus {
            edge: table.trim_start_matches("_pending/").to_string(),
            table: table.clone(),
            count,
            oldest,
        });
    }
    let pending_total: usize = pending.iter().map(|p| p.count).sum();
    let rejects = match head.tables.get(REJECTS_TABLE) {
        Some(&v) => graph
            .open_table(REJECTS_TABLE, Some(v))
            .await?
            .count_rows(None)
            .await
            .ctx(REJECTS_TABLE)?,
        None => 0,
    };
    if !json {
        println!(
            "head     {}  seq {}  {}  ({} ago)",
            head.id,
            head.seq,
            fmt_ms(head.created_at),
            fmt_age(now - head.created_at)
        );
        for p in &pending {
            match p.oldest {
                Some(o) => println!(
                    "pending  {:<24} {:>8}  oldest {} ({} ago)",
                    p.edge,
                    p.count,
                    fmt_ms(o),
                    fmt_age(now - o)
                ),
                None => println!("pending  {:<24} {:>8}", p.edge, p.count),
            }
        }
        println!("pending  {:<24} {:>8}", "total", pending_total);
        println!("rejects  {rejects}");
    }
    let kafka = {
        let config = config.clone();
        tokio::task::spawn_blocking(move || kafka_status(&config))
            .await
            .map_err(|e| Error::Other(format!("kafka status: {e}")))?
    };
    if json {
        let mut out = serde_json::json!({
            "head": {
                "id": head.id,
                "seq": head.seq,
                "created_at": head.created_at,
                "age_ms": now - head.created_at,
            },
            "pending": pending.iter().map(|p| serde_json::json!({
                "edge": p.edge,
                "table": p.table,
                "count": p.count,
                "oldest_pending_since": p.oldest,
                "oldest_age_ms": p.oldest.map(|o| now - o),
            })).collect::<Vec<_>>(),
            "pending_total": pending_total,
            "rejects": rejects,
            "kafka": null,
        });
        match &kafka {
            Ok(k) => {
                out["kafka"] = serde_json::json!({
                    "group": k.group,
                    "partitions": k.partitions.iter().map(|p| serde_json::json!({
                        "topic": p.topic,
                        "partition": p.partition,
                        "committed": p.committed,
                        "end": p.end,
                        "lag": p.lag(),
                    })).collect::<Vec<_>>(),
                    "total_lag": k.partitions.iter().map(PartitionStatus::lag).sum::<i64>(),
                    "missing_topics": k.missing.iter().map(|(t, e)| serde_json::json!({
                        "topic": t, "error": e,
                    })).collect::<Vec<_>>(),
                });
            }
            Err(e) => out["kafka_error"] = one_line(&e.to_string()).into(),
        }
        println!("{out}");
    } else if let Ok(k) = &kafka {
        println!("kafka    group {}", k.group);
        for p in &k.partitions {
            let committed = p.committed.map_or("-".to_string(), |c| c.to_string());
            println!(
                "  {:<28} committed {:>10}  end {:>10}  lag {:>8}",
                format!("{}/{}", p.topic, p.partition),
                committed,
                p.end,
                p.lag()
            );
        }
        for (t, e) in &k.missing {
            println!("  {t:<28} {e}");
        }
        println!(
            "  total lag {}",
            k.partitions.iter().map(PartitionStatus::lag).sum::<i64>()
        );
    }
    kafka.map(|_| ())
}

/// Committed offsets of the config's group and watermarks of every
/// partition of the mapped topics. Blocking; does not join the group.
fn kafka_status(config: &Config) -> Result<KafkaStatus> {
    let timeout = Duration::from_secs(10);
    let servers = config
        .kafka
        .get("bootstrap.servers")
        .cloned()
        .unwrap_or_default();
    let group = config.kafka.get("group.id").cloned().unwrap_or_default();
    let fail = |what: String, e: rdkafka::error::KafkaError| {
        Error::Other(format!("kafka at {servers}: cannot {what}: {e}"))
    };
    let consumer: BaseConsumer<QuietContext> =
        crate::kafka::client::consumer_config(config).create_with_context(QuietContext)?;
    let mut topics: Vec<&str> = config.mappings.iter().map(|m| m.topic.as_str()).collect();
    topics.sort();
    topics.dedup();
    let mut partitions = Vec::new();
    let mut missing = Vec::new();
    for t in topics {
        let md = consumer
            .fetch_metadata(Some(t), timeout)
            .map_err(|e| fail(format!("fetch metadata of {t}"), e))?;
        match md.topics().iter().find(|x| x.name() == t) {
            Some(mt) if mt.error().is_none() => {
                let mut ids: Vec<i32> = mt.partitions().iter().map(|p| p.id()).collect();
                ids.sort();
                partitions.extend(ids.into_iter().map(|p| (t.to_string(), p)));
            }
            Some(mt) => {
                let code: rdkafka::types::RDKafkaErrorCode = mt.error().expect("checked").into();
                missing.push((t.to_string(), code.to_string()));
            }
            None => missing.push((t.to_string(), "not in the broker's metadata".into())),
        }
    }
    let mut tpl = TopicPartitionList::new();
    for (t, p) in &partitions {
        tpl.add_partition(t, *p);
    }
    let committed = if partitions.is_empty() {
        TopicPartitionList::new()
    } else {
        consumer
            .committed_offsets(tpl, timeout)
            .map_err(|e| fail(format!("fetch committed offsets of group {group}"), e))?
    };
    let mut out = Vec::with_capacity(partitions.len());
    for (t, p) in partitions {
        let (low, end) = consumer
            .fetch_watermarks(&t, p, timeout)
            .map_err(|e| fail(format!("fetch watermarks of {t}/{p}"), e))?;
        let committed = committed
            .find_partition(&t, p)
            .and_then(|e| match e.offset() {
                Offset::Offset(n) => Some(n),
                _ => None,
            });
        out.push(PartitionStatus {
            topic: t,
            partition: p,
            committed,
            low,
            end,
        });
    }
    Ok(KafkaStatus {
        group,
        partitions: out,
        missing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rejects::{Origin, RejectCode};

    const NOW: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    #[test]
    fn since_takes_rfc3339_or_a_duration_ago() {
        assert_eq!(parse_since_at("2026-01-01T00:00:00Z", 0), Ok(NOW));
        assert_eq!(
            parse_since_at("2026-01-01T01:00:00.5+01:00", 0),
            Ok(NOW + 500)
        );
        assert_eq!(parse_since_at("10m", NOW), Ok(NOW - 600_000));
        assert_eq!(parse_since_at("1h 30m", NOW), Ok(NOW - 5_400_000));
        assert!(parse_since_at("yesterday", NOW).is_err());
        assert!(parse_since_at("2026-01-01", NOW).is_err());
    }

    #[test]
    fn filters_become_one_quoted_predicate() {
        assert_eq!(RejectFilter::default().to_sql(), None);
        let f = RejectFilter {
            stage: Some(Stage::Fold),
            type_name: Some("O'Brien".into()),
            since: Some(NOW + 5),
        };
        assert_eq!(
            f.to_sql().unwrap(),
            "stage = 'fold' AND type_name = 'O''Brien' \
             AND rejected_at >= TIMESTAMP '2026-01-01 00:00:00.005'"
        );
        assert_eq!(parse_stage("validate"), Ok(Stage::Validate));
        assert!(parse_stage("Fold").is_err());
    }

    fn reject(offset: i64, ty: &str, code: RejectCode, at: i64) -> Reject {
        let mut r = Reject::of_record(
            Origin {
                topic: "t".into(),
                partition: 0,
                offset,
                key: Some(b"k".to_vec()),
                value: Some(vec![0xff]),
                ..Default::default()
            },
            ty,
            code,
            "m",
            None,
        );
        r.rejected_at = at;
        r
    }

    /// The predicate runs as a Lance scan filter against the table layout,
    /// including the timestamp literal against the UTC column.
    #[tokio::test]
    async fn filters_push_down_into_a_lance_scan() {
        let dir = tempfile::tempdir().unwrap();
        let uri = dir.path().join("rejects").to_str().unwrap().to_string();
        let rows = vec![
            reject(3, "Person", RejectCode::Range, NOW + 2),
            reject(1, "Person", RejectCode::MalformedJson, NOW),
            reject(2, "Knows", RejectCode::Enum, NOW + 1),
            reject(0, "Person", RejectCode::Check, NOW - 1),
        ];
        let batch = rejects::to_batch(&rows);
        let schema = batch.schema();
        let ds = lance::Dataset::write(
            arrow::array::RecordBatchIterator::new(vec![Ok(batch)], schema),
            &uri,
            None,
        )
        .await
        .unwrap();
        let offsets = |v: Vec<Reject>| v.iter().map(|r| r.offset.unwrap()).collect::<Vec<_>>();
        let all = scan_rejects(&ds, &RejectFilter::default()).await.unwrap();
        assert_eq!(offsets(all), vec![0, 1, 2, 3]);
        let f = RejectFilter {
            stage: Some(Stage::Validate),
            type_name: Some("Person".into()),
            since: Some(NOW),
        };
        assert_eq!(offsets(scan_rejects(&ds, &f).await.unwrap()), vec![3]);
        let f = RejectFilter {
            since: Some(NOW + 1),
            ..Default::default()
        };
        assert_eq!(offsets(scan_rejects(&ds, &f).await.unwrap()), vec![2, 3]);
        let json = reject_json(&rows[0]);
        assert_eq!(json["key"], "k");
        assert_eq!(json["value"]["base64"], "/w==");
    }
}
