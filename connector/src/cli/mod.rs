//! The command line: `check`, `run`, `fold`, `log`, `show`, `read`,
//! `neighbors`, `status`, `gc`, `rejects`, `replay-rejects`, `produce`. It parses arguments and prints;
//! the work is done by library functions (`commands`, `pipeline`). Every error
//! ends as one readable line and a non-zero exit.

mod args;
mod print;
mod rows;
mod run;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::commands;
use crate::config::{Config, LogFormat};
use crate::error::{Error, ErrorKind, Result};
use crate::redact;
use args::RejectFilterArgs;

#[derive(Parser)]
#[command(
    name = "graphsink",
    version,
    about = "Kafka sink connector for typed graphs on Lance"
)]
struct Cli {
    /// Log lines as text (default) or one JSON object per event; overrides
    /// the config's `[log] format`.
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormat>,
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
        /// Serve /metrics, /health and /ready here (overrides `[http] listen`).
        #[arg(long, value_name = "ADDR")]
        http: Option<SocketAddr>,
    },
    /// Fold everything durable into a graph commit and exit. Claims every
    /// shard, so it refuses while the consumer group has members.
    Fold {
        #[arg(long)]
        config: PathBuf,
        /// Fold even while the group has members: their writers are fenced
        /// (a connector in bucket mode stops; partition-mode members rejoin).
        #[arg(long)]
        force: bool,
    },
    /// Apply the config's schema change to the graph (a fold to
    /// quiescence, then one schema commit), as `run` does at start.
    /// Claims every shard, so it refuses while the group has members.
    Migrate {
        #[arg(long)]
        config: PathBuf,
        /// Print the plan and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Migrate even while the group has members: their writers are
        /// fenced, and a member still on the old schema is refused at its
        /// next start.
        #[arg(long)]
        force: bool,
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
    /// Rows of one type: at the head commit (default), at a past commit,
    /// or fresh (the head plus the WAL generations no fold has published;
    /// docs/reads.md).
    Read {
        #[arg(long)]
        config: PathBuf,
        #[command(flatten)]
        read: args::ReadArgs,
    },
    /// One hop from a node: its edges and the nodes at their other ends.
    Neighbors {
        #[arg(long)]
        config: PathBuf,
        #[command(flatten)]
        hop: args::NeighborsArgs,
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
        filter: RejectFilterArgs,
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
        filter: RejectFilterArgs,
        /// Replay at most this many (the oldest that match); default all.
        #[arg(long)]
        limit: Option<usize>,
        /// List what would be replayed; produce nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete what folding made garbage (WAL entries, flushed generations,
    /// Lance versions outside `[retention]`'s window); safe while the
    /// connector runs. Prints what it deleted per table and kind.
    Gc {
        #[arg(long)]
        config: PathBuf,
        /// Delete nothing; print what would be deleted.
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
    let format = cli
        .log_format
        .or_else(|| Config::log_format_of(cli.command.config()))
        .unwrap_or_default();
    init_tracing(format);
    // Only `run` has a critical path to protect (crate::runtime).
    let settings = match &cli.command {
        Command::Run { config, .. } => Config::runtime_of(config),
        _ => crate::config::RuntimeSettings { background_nice: 0 },
    };
    let rt = match crate::runtime::build(&settings) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("graphsink: error: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(dispatch(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Error::SchemaChanges { changes, .. } = &e {
                for c in changes {
                    eprintln!("  {c}");
                }
            }
            let text = e.to_string();
            eprintln!(
                "graphsink: error: {}",
                print::one_line(&redact::text(&text))
            );
            ExitCode::from(match e.kind() {
                ErrorKind::BadConfig => 2,
                ErrorKind::Fenced => 3,
                ErrorKind::NotFound => 4,
                _ => 1,
            })
        }
    }
}

/// `lance::index` logs a benign "Index __lance_mem_wal has no fields" at
/// ERROR on every merge into a MemWAL table; real index failures still
/// surface as errors of the operation.
const DEFAULT_LOG_FILTER: &str = "info,lance=warn,lance::index=off,datafusion=warn";

/// Logs go to stderr through `redact`, as text or as one JSON object per
/// event with stable top-level fields: `timestamp`, `level`, `target`,
/// `message`, and the event's own fields (`event`, `partitions`, `seq`, ...).
fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(redact::stderr);
    let _ = match format {
        LogFormat::Text => fmt.try_init(),
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
}

impl Command {
    fn config(&self) -> &Path {
        match self {
            Command::Check { config }
            | Command::Run { config, .. }
            | Command::Fold { config, .. }
            | Command::Migrate { config, .. }
            | Command::Log { config, .. }
            | Command::Show { config, .. }
            | Command::Read { config, .. }
            | Command::Neighbors { config, .. }
            | Command::Status { config, .. }
            | Command::Rejects { config, .. }
            | Command::ReplayRejects { config, .. }
            | Command::Gc { config, .. }
            | Command::Produce { config, .. } => config,
        }
    }
}

/// `graphsink read`: the rows, or with `--explain` the read's plan.
async fn read_rows(config: &Config, read: &args::ReadArgs) -> Result<()> {
    if read.explain {
        println!(
            "{}",
            commands::read::explain(config, &read.request()).await?
        );
        return Ok(());
    }
    let rows = commands::read::read(config, &read.request()).await?;
    rows::rows(&rows, read.format)
}

/// `graphsink fold`: refused while members run, unless forced.
async fn fold(config: &Path, force: bool) -> Result<()> {
    let config = Config::load(config)?;
    if !force {
        commands::refuse_if_members(&config).await?;
    }
    print::folded(commands::fold_offline(&config).await?.as_ref());
    Ok(())
}

/// `graphsink migrate`: refused while members run, unless forced or dry.
async fn migrate(config: &Path, dry_run: bool, force: bool) -> Result<()> {
    let config = Config::load(config)?;
    if !force && !dry_run {
        commands::refuse_if_members(&config).await?;
    }
    print::migrated(&commands::migrate(&config, dry_run).await?, dry_run);
    Ok(())
}

async fn dispatch(cmd: Command) -> Result<()> {
    match cmd {
        Command::Check { config } => {
            print::check(&commands::check(&Config::load(&config)?).await?);
            Ok(())
        }
        Command::Run {
            config,
            exit_at_end,
            http,
        } => run::run(&config, exit_at_end, http).await,
        Command::Fold { config, force } => fold(&config, force).await,
        Command::Migrate {
            config,
            dry_run,
            force,
        } => migrate(&config, dry_run, force).await,
        Command::Log { config, limit } => {
            for c in commands::commits(&Config::load(&config)?, limit).await? {
                print::commit(&c);
            }
            Ok(())
        }
        Command::Show { config, commit } => {
            let config = Config::load(&config)?;
            print::snapshot(&commands::snapshot(&config, commit.as_deref()).await?);
            Ok(())
        }
        Command::Read { config, read } => read_rows(&Config::load(&config)?, &read).await,
        Command::Neighbors { config, hop } => {
            let format = hop.format;
            let n = commands::read::neighbors(&Config::load(&config)?, &hop.request()).await?;
            rows::neighbors(&n, format)
        }
        Command::Status { config, json } => status(&Config::load(&config)?, json).await,
        Command::Gc { config, dry_run } => {
            print::gc(&commands::gc(&Config::load(&config)?, dry_run).await?);
            Ok(())
        }
        Command::Rejects {
            config,
            filter,
            limit,
            json,
        } => {
            let selected =
                commands::rejects::select(&Config::load(&config)?, &filter.into()).await?;
            print::rejects(&selected, limit, json);
            Ok(())
        }
        Command::ReplayRejects {
            config,
            to,
            filter,
            limit,
            dry_run,
        } => replay_rejects(&Config::load(&config)?, &to, filter, limit, dry_run).await,
        Command::Produce {
            config,
            topic,
            file,
            partitions,
        } => {
            let config = Config::load(&config)?;
            let sent = commands::produce::produce_file(&config, &topic, &file, partitions).await?;
            println!("produced {sent} records to {topic}");
            Ok(())
        }
    }
}

/// The graph part prints before Kafka is asked, so a broker that is down
/// still leaves the graph's status on screen.
async fn status(config: &Config, json: bool) -> Result<()> {
    let graph = commands::status::graph_status(config).await?;
    if !json {
        print::graph_status(&graph);
    }
    let kafka = commands::status::kafka_status(config).await;
    if json {
        print::status_json(&graph, &kafka);
    } else if let Ok(k) = &kafka {
        print::kafka_status(k);
    }
    kafka.map(|_| ())
}

async fn replay_rejects(
    config: &Config,
    to: &str,
    filter: RejectFilterArgs,
    limit: Option<usize>,
    dry_run: bool,
) -> Result<()> {
    let selection = commands::rejects::select_replay(config, &filter.into(), limit).await?;
    let (n, skipped) = (selection.replay.len(), selection.skipped);
    if dry_run {
        for r in &selection.replay {
            println!("{}", print::reject_line(r));
        }
        println!(
            "would replay {} to {to} (skipped {skipped})",
            print::rejects_n(n)
        );
        return Ok(());
    }
    commands::rejects::replay(config, to, &selection.replay).await?;
    println!(
        "replayed {} to {to} (skipped {skipped})",
        print::rejects_n(n)
    );
    Ok(())
}
