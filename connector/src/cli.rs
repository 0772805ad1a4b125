//! The command line: `check`, `run`, `fold`, `log`, `show`, `produce`.
//! Every error ends as one readable line and a non-zero exit.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::graph::{self, Graph, GraphCommit};
use crate::pipeline::{run_with, RunOptions};
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
    for (i, m) in config.mappings.iter().enumerate() {
        let ty = schema.get(&m.node).ok_or_else(|| {
            Error::config(format!(
                "mapping[{i}].node: type {:?} is not in the schema",
                m.node
            ))
        })?;
        if ty.kind != crate::schema::TypeKind::Node {
            return Err(Error::config(format!(
                "mapping[{i}].node: {} is an edge type; edge mappings are not supported yet",
                m.node
            )));
        }
        crate::decode::RecordDecoder::new(ty, m, 1)?;
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
    let cc = crate::consumer::client_config(&config);
    let mut pc = rdkafka::ClientConfig::new();
    for k in [
        "bootstrap.servers",
        "security.protocol",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
    ] {
        if let Some(v) = cc.get(k) {
            pc.set(k, v);
        }
    }
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
