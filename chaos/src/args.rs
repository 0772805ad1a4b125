//! The command line: what to break, how often, and where the brokers and
//! graphsink come from.

use std::path::PathBuf;

use clap::Parser;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "graphsink-chaos",
    about = "kill -9, broker outages and a full disk against graphsink, checked independently"
)]
pub(crate) struct Args {
    /// The graphsink binary (default: `graphsink` next to this binary).
    #[arg(long)]
    pub graphsink: Option<PathBuf>,
    /// The brokers to start: `kafka` (Apache Kafka 4.4, KRaft, from
    /// scripts/lib.sh's ensure_kafka) or `tansu` (the first rounds' broker).
    #[arg(long, default_value = "kafka")]
    pub broker_backend: String,
    /// The tansu binary (default: scripts/lib.sh's install), with
    /// `--broker-backend tansu`.
    #[arg(long)]
    pub tansu: Option<PathBuf>,
    /// moto's S3 server, for a persistent tansu (`--broker-backend tansu`).
    #[arg(long)]
    pub moto: Option<PathBuf>,
    /// Chooses every fault, moment and record; a failing run replays with it.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// kill -9 trials of the `kills` phase: every third at a random moment,
    /// the others at the failpoints in turn (33 reach each window once).
    #[arg(long, default_value_t = 33)]
    pub trials: u32,
    /// Broker freezes of the `freeze` phase, in seconds each.
    #[arg(long, value_delimiter = ',', default_value = "5")]
    pub freezes: Vec<u64>,
    /// How long the dead-letter broker is frozen, in seconds.
    #[arg(long, default_value_t = 5)]
    pub dead_letter_outage: u64,
    /// Schema changes of the `migrate` phase: each start that applies one
    /// is killed at one of its steps, or at a random moment.
    #[arg(long, default_value_t = 3)]
    pub migrations: u32,
    /// Rounds of the `members` phase (each: a kill -9, a freeze past the
    /// session, a graceful leave, and joins).
    #[arg(long, default_value_t = 1)]
    pub member_rounds: u32,
    /// The `members` phase's group protocol and assignor: `range` (the
    /// classic protocol, eager; graphsink's default under partition
    /// sharding), `cooperative-sticky` (classic, incremental) or
    /// `consumer` (KIP-848, the broker assigns with `range`).
    #[arg(long, default_value = "range")]
    pub group_protocol: String,
    /// Broker restarts (kill -9, data kept) of the `restarts` phase.
    #[arg(long, default_value_t = 2)]
    pub restarts: u32,
    /// Records per second of the continuous producer.
    #[arg(long, default_value_t = 300)]
    pub rate: u32,
    /// Percent of bad records (sync rejects).
    #[arg(long, default_value_t = 10)]
    pub bad_percent: u32,
    /// Phases to run (default: all of the set: the single-broker phases
    /// kills,freeze,dead-letters,restarts,disk,members,migrate; with
    /// `--cluster`, the cluster phases: RELIABILITY.md, "Kafka cluster").
    #[arg(long, value_delimiter = ',')]
    pub phases: Option<Vec<String>>,
    /// The `cluster` set: a secured Kafka cluster of this many nodes (3:
    /// replication factor 3, `min.insync.replicas=2`), started once for
    /// the run, and its faults (rolling restart, kills, cuts, a slow and
    /// flaky network, a zombie, `min.insync.replicas` not met, members on
    /// S3) instead of the single-broker phases.
    #[arg(long)]
    pub cluster: Option<u32>,
    /// Where graphs and logs go (default: a temporary directory, removed
    /// unless a check fails).
    #[arg(long)]
    pub work: Option<PathBuf>,
    /// Write the figures as JSON here.
    #[arg(long)]
    pub report: Option<PathBuf>,
}
