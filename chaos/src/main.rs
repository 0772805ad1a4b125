//! graphsink-chaos: the reliability harness. Against real brokers it runs
//! `graphsink run` under a continuous producer and breaks things, chosen by
//! seed so a failing trial can be replayed:
//!
//! - `kills`: kill -9 at random moments, and at each named failpoint
//!   (`GRAPHSINK_FAILPOINTS=<name>=abort@N`);
//! - `freeze`: the broker stopped (SIGSTOP) for a while, then resumed;
//! - `dead-letters`: the dead-letter broker stopped for a while;
//! - `restarts`: the broker killed and restarted with its data kept
//!   (tansu on `s3://` storage);
//! - `disk`: the graph root on a small tmpfs that fills up;
//! - `members`: three `graphsink run` members of one group on a
//!   partition-sharded graph: one killed -9, one stopped past its session
//!   (SIGSTOP, then SIGCONT), one leaving (SIGTERM), members joining;
//! - `migrate`: schema changes (an optional property more each time),
//!   each start that applies one killed -9 at a step of it
//!   (`MIGRATE_FAILPOINTS`) or at a random moment, then finished by the
//!   next start.
//!
//! After crashes (half of them, by seed) and at the end of each phase the
//! checker in `check.rs` compares the graph, read with plain Lance, with
//! the stream read back from Kafka. Any difference is a finding, printed
//! with the seed and trial; the exit status is non-zero.

mod check;
mod cluster;
mod workload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use graphsink_testkit::BrokerBackend;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use check::{Res, Tail, Tally};
use cluster::{Broker, Exit, Process};
use workload::{Generator, Out, Topics};

/// The crash windows graphsink names (docs/ARCHITECTURE.md, "Failpoints").
/// A test below keeps this list and that table the same.
const FAILPOINTS: &[&str] = &[
    "fold.before_publish",
    "fold.between_passes",
    "fold.before_dead_letters",
    "fold.before_delivered_mark",
    "fold.dead_letters_before_produce",
    "fold.dead_letters_before_commit",
    "commit.before",
    "commit.after",
    "rejects.before_dead_letters",
    "rejects.after_dead_letters",
    "revoke.before_commit",
    "revoke.after_commit",
    "drain.before_commit",
    "drain.before_fold",
    "drain.before_close",
    "gc.wal_partial",
    "gc.after_wal",
    "gc.after_trim",
    "gc.generation_partial",
    "gc.after_generations",
    "gc.versions_partial",
    "gc.after_versions",
];

/// The crash windows of a schema change (`migrate`), aimed at by the
/// `migrate` phase only: nothing else reaches them.
const MIGRATE_FAILPOINTS: &[&str] = &["migrate.after_table", "migrate.before_commit"];

/// A member that died holds its partitions until its session (6 s here)
/// expires; a restart waits that out (tansu 0.6 gives a member that joins
/// meanwhile nothing, see the e2e kill test).
const SESSION: Duration = Duration::from_secs(6);

#[derive(Parser, Debug, Clone)]
#[command(
    name = "graphsink-chaos",
    about = "kill -9, broker outages and a full disk against graphsink, checked independently"
)]
struct Args {
    /// The graphsink binary (default: `graphsink` next to this binary).
    #[arg(long)]
    graphsink: Option<PathBuf>,
    /// The brokers to start: `kafka` (Apache Kafka 4.4, KRaft, from
    /// scripts/lib.sh's ensure_kafka) or `tansu` (the first rounds' broker).
    #[arg(long, default_value = "kafka")]
    broker_backend: String,
    /// The tansu binary (default: scripts/lib.sh's install), with
    /// `--broker-backend tansu`.
    #[arg(long)]
    tansu: Option<PathBuf>,
    /// moto's S3 server, for a persistent tansu (`--broker-backend tansu`).
    #[arg(long)]
    moto: Option<PathBuf>,
    /// Chooses every fault, moment and record; a failing run replays with it.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// kill -9 trials of the `kills` phase: every third at a random moment,
    /// the others at the failpoints in turn (33 reach each window once).
    #[arg(long, default_value_t = 33)]
    trials: u32,
    /// Broker freezes of the `freeze` phase, in seconds each.
    #[arg(long, value_delimiter = ',', default_value = "5")]
    freezes: Vec<u64>,
    /// How long the dead-letter broker is frozen, in seconds.
    #[arg(long, default_value_t = 5)]
    dead_letter_outage: u64,
    /// Schema changes of the `migrate` phase: each start that applies one
    /// is killed at one of its steps, or at a random moment.
    #[arg(long, default_value_t = 3)]
    migrations: u32,
    /// Rounds of the `members` phase (each: a kill -9, a freeze past the
    /// session, a graceful leave, and joins).
    #[arg(long, default_value_t = 1)]
    member_rounds: u32,
    /// The `members` phase's group protocol and assignor: `range` (the
    /// classic protocol, eager; graphsink's default under partition
    /// sharding), `cooperative-sticky` (classic, incremental) or
    /// `consumer` (KIP-848, the broker assigns with `range`).
    #[arg(long, default_value = "range")]
    group_protocol: String,
    /// Broker restarts (kill -9, data kept) of the `restarts` phase.
    #[arg(long, default_value_t = 2)]
    restarts: u32,
    /// Records per second of the continuous producer.
    #[arg(long, default_value_t = 300)]
    rate: u32,
    /// Percent of bad records (sync rejects).
    #[arg(long, default_value_t = 10)]
    bad_percent: u32,
    /// Phases to run (default: all).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kills,freeze,dead-letters,restarts,disk,members,migrate"
    )]
    phases: Vec<String>,
    /// Where graphs and logs go (default: a temporary directory, removed
    /// unless a check fails).
    #[arg(long)]
    work: Option<PathBuf>,
    /// Write the figures as JSON here.
    #[arg(long)]
    report: Option<PathBuf>,
}

#[derive(Debug, Default, serde::Serialize)]
struct PhaseReport {
    phase: String,
    seconds: f64,
    produced: u64,
    produce_failures: u64,
    kills: u32,
    failpoints_fired: BTreeMap<String, u32>,
    failpoints_missed: BTreeMap<String, u32>,
    freezes: Vec<u64>,
    restarts: u32,
    dead_letter_outage: u64,
    /// `graphsink run` exits nobody asked for (a stall give-up, a full disk…).
    own_exits: Vec<String>,
    /// Times graphsink exited because the group coordinator gave no member
    /// any partition (tansu 0.6's wedge), and the broker was restarted.
    wedges: u32,
    /// `members`: seconds from a member's kill -9 (or freeze) until a
    /// survivor claimed shards again, per event.
    handoffs: Vec<(String, f64)>,
    /// `members`: the group protocol, and per event (kill, freeze, leave,
    /// join) the records/s the group committed in the 20 s after it and
    /// the longest stretch of those 20 s in which it committed nothing,
    /// and the most records produced but not committed in them.
    group_protocol: String,
    rebalances: Vec<(String, f64, f64, i64)>,
    /// The final `--exit-at-end` run: attempts, and seconds of the last.
    final_run: Option<(u32, f64)>,
    audits: u32,
    last_audit: Option<Tally>,
    final_check: Option<Tally>,
    errors: Vec<String>,
    not_run: Option<String>,
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let code = rt.block_on(async {
        match chaos(args).await {
            Ok(true) => 0,
            Ok(false) => 1,
            Err(e) => {
                eprintln!("graphsink-chaos: {e}");
                2
            }
        }
    });
    std::process::exit(code);
}

async fn chaos(args: Args) -> Res<bool> {
    let t0 = Instant::now();
    let graphsink = match &args.graphsink {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .with_file_name("graphsink"),
    };
    if !graphsink.exists() {
        return Err(format!(
            "{} not found (build it: cargo build -p graphsink, or pass --graphsink)",
            graphsink.display()
        ));
    }
    let backend = match args.broker_backend.as_str() {
        "kafka" => BrokerBackend::Kafka,
        "tansu" => BrokerBackend::Tansu(
            args.tansu
                .clone()
                .unwrap_or_else(graphsink_testkit::tansu::default_bin),
        ),
        other => return Err(format!("--broker-backend {other}: expected kafka or tansu")),
    };
    backend.check_installed()?;
    let mut tmp = None;
    let work = match &args.work {
        Some(w) => w.clone(),
        None => {
            let t = tempfile::Builder::new()
                .prefix("graphsink-chaos.")
                .tempdir()
                .map_err(|e| e.to_string())?;
            let path = t.path().to_path_buf();
            tmp = Some(t);
            path
        }
    };
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    println!(
        "graphsink-chaos seed {} work {} broker {}",
        args.seed,
        work.display(),
        backend.describe()
    );
    let env = Env {
        graphsink,
        backend,
        work: work.clone(),
        args: args.clone(),
    };
    let mut reports = Vec::new();
    for (i, phase) in args.phases.iter().enumerate() {
        let seed = args.seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
        let t = Instant::now();
        let mut r = PhaseReport {
            phase: phase.clone(),
            ..Default::default()
        };
        println!("== phase {phase} (seed {seed})");
        let run = match phase.as_str() {
            "kills" => kills(&env, seed, &mut r).await,
            "freeze" => outage(&env, seed, Outage::Freeze, &mut r).await,
            "dead-letters" => outage(&env, seed, Outage::DeadLetters, &mut r).await,
            "restarts" => outage(&env, seed, Outage::Restarts, &mut r).await,
            "disk" => disk(&env, seed, &mut r).await,
            "members" => members(&env, seed, &mut r).await,
            "migrate" => migrate(&env, seed, &mut r).await,
            other => Err(format!("unknown phase {other}")),
        };
        if let Err(e) = run {
            r.errors.push(format!("phase failed: {e}"));
        }
        r.seconds = t.elapsed().as_secs_f64();
        print_phase(&r);
        reports.push(r);
    }
    let ok = reports.iter().all(|r| r.errors.is_empty());
    println!(
        "graphsink-chaos seed {}: {} in {:.0} s",
        args.seed,
        if ok { "PASS" } else { "FAIL" },
        t0.elapsed().as_secs_f64()
    );
    if let Some(p) = &args.report {
        let json = serde_json::json!({"seed": args.seed, "seconds": t0.elapsed().as_secs_f64(), "phases": reports});
        std::fs::write(p, serde_json::to_string_pretty(&json).unwrap())
            .map_err(|e| e.to_string())?;
    }
    if !ok {
        // Keep the evidence.
        if let Some(t) = tmp {
            println!("graphs and logs kept in {}", t.keep().display());
        }
    }
    Ok(ok)
}

fn print_phase(r: &PhaseReport) {
    if let Some(why) = &r.not_run {
        println!("   NOT RUN: {why}");
        return;
    }
    println!(
        "   {:.0} s, {} records produced ({} produce failures), {} kills, failpoints fired {:?}, missed {:?}",
        r.seconds, r.produced, r.produce_failures, r.kills, r.failpoints_fired, r.failpoints_missed
    );
    if !r.freezes.is_empty() || r.restarts > 0 || r.dead_letter_outage > 0 {
        println!(
            "   broker freezes {:?} s, broker restarts {}, dead-letter outage {} s",
            r.freezes, r.restarts, r.dead_letter_outage
        );
    }
    for (what, s) in &r.handoffs {
        println!("   hand-off after {what}: {s:.1} s until a survivor was assigned its partitions (session.timeout.ms 6 s)");
    }
    for (what, rate, pause, lag) in &r.rebalances {
        println!(
            "   {} after {what}: {rate:.0} records/s committed over 20 s, longest pause {pause:.1} s, lag at most {lag}",
            r.group_protocol
        );
    }
    if let Some((attempts, s)) = r.final_run {
        println!("   final run --exit-at-end: {s:.0} s, attempt {attempts}");
    }
    println!(
        "   {} audits after crashes; own exits: {}; wedged groups unwedged by a broker restart: {}",
        r.audits,
        r.own_exits.len(),
        r.wedges
    );
    for e in &r.own_exits {
        println!("     own exit: {e}");
    }
    if let Some(t) = &r.final_check {
        println!(
            "   final: graph commit {}, {} nodes, {} edges, {} rejects, {} on the dead-letter topic ({} duplicate deliveries)",
            t.head_seq, t.nodes, t.edges, t.rejects, t.dead_letters, t.dead_letter_duplicates
        );
    }
    for e in r.errors.iter().take(30) {
        println!("   ERROR {e}");
    }
    if r.errors.len() > 30 {
        println!("   ... {} more errors", r.errors.len() - 30);
    }
}

struct Env {
    graphsink: PathBuf,
    backend: BrokerBackend,
    work: PathBuf,
    args: Args,
}

/// One phase's graph, topics, group and producer.
struct Stage {
    dir: PathBuf,
    config: PathBuf,
    root: String,
    group: String,
    topics: Topics,
    log: PathBuf,
    tails: Vec<Tail>,
    dead_letters: Tail,
    feed: Option<Feed>,
}

impl Stage {
    async fn new(
        env: &Env,
        name: &str,
        seed: u64,
        main: &Broker,
        dlq: &Broker,
        root: Option<PathBuf>,
    ) -> Res<Stage> {
        let dir = env.work.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let root = root.unwrap_or_else(|| dir.join("graph"));
        let topics = Topics::new(&format!("{name}-{seed}"));
        for (t, p) in topics.mapped() {
            main.create_topic(t, p).await?;
        }
        dlq.create_topic(&topics.dead_letters, 1).await?;
        let group = format!("chaos-{name}-{seed}");
        std::fs::write(dir.join("chaos.pg"), workload::SCHEMA).map_err(|e| e.to_string())?;
        let config = dir.join("graphsink.toml");
        std::fs::write(&config, config_text(&root, &group, &topics, main, dlq))
            .map_err(|e| e.to_string())?;
        let mut tails = Vec::new();
        for (t, p) in topics.mapped() {
            tails.push(Tail::new(&main.bootstrap, t, p)?);
        }
        let dead_letters = Tail::new(&dlq.bootstrap, &topics.dead_letters, 1)?;
        let gen = Generator::new(seed, topics.clone(), env.args.bad_percent);
        Ok(Stage {
            log: dir.join("graphsink.log"),
            dir,
            config,
            root: root.display().to_string(),
            group,
            topics,
            tails,
            dead_letters,
            feed: Some(Feed::start(&main.bootstrap, gen, env.args.rate)?),
        })
    }

    fn spawn(&self, env: &Env, failpoint: Option<String>) -> Res<Process> {
        let mut vars = vec![];
        if let Some(fp) = failpoint {
            vars.push(("GRAPHSINK_FAILPOINTS", fp));
        }
        let cfg = self.config.display().to_string();
        Process::spawn(&env.graphsink, &["run", "--config", &cfg], &vars, &self.log)
    }

    /// Reads the topics back, at least to `at_least` (topic → partition →
    /// offset), and the dead-letter topic.
    fn catch_up(
        &mut self,
        at_least: &BTreeMap<String, BTreeMap<i32, i64>>,
    ) -> Res<Vec<check::Msg>> {
        let mut all = Vec::new();
        let none = BTreeMap::new();
        for (t, (name, _)) in self.tails.iter_mut().zip(self.topics.mapped()) {
            t.catch_up(at_least.get(name).unwrap_or(&none))?;
            all.extend(t.msgs.iter().cloned());
        }
        self.dead_letters.catch_up(&none)?;
        Ok(all)
    }

    /// Folds everything durable with `graphsink fold` and checks that what
    /// the group committed is in the graph.
    async fn audit(
        &mut self,
        env: &Env,
        main: &Broker,
        r: &mut PhaseReport,
        label: &str,
    ) -> Res<()> {
        if !Path::new(&self.root).join("__manifest").exists() {
            return Ok(()); // killed before the graph was created: nothing acked
        }
        let mut committed = BTreeMap::new();
        for (t, p) in self.topics.mapped() {
            committed.insert(
                t.to_string(),
                check::committed(&main.bootstrap, &self.group, t, p)?,
            );
        }
        let cfg = self.config.display().to_string();
        let mut fold = Process::spawn(
            &env.graphsink,
            &["fold", "--force", "--config", &cfg],
            &[],
            &self.log,
        )?;
        match fold.wait_for(Duration::from_secs(300)).await {
            Some(Exit { code: Some(0), .. }) => {}
            other => {
                if other.is_none() {
                    fold.kill().await;
                }
                r.errors.push(format!(
                    "{label}: graphsink fold failed ({other:?}): {}",
                    fold.tail(20)
                ));
                return Ok(());
            }
        }
        let snap = check::snapshot(&self.root).await?;
        let mut need = snap.offsets_seen();
        for (topic, parts) in &committed {
            for (p, c) in parts {
                let e = need
                    .entry(topic.clone())
                    .or_default()
                    .entry(*p)
                    .or_insert(0);
                *e = (*e).max(*c);
            }
        }
        let msgs = self.catch_up(&need)?;
        let exp = check::expected(&msgs, &self.topics);
        let mut errors = Vec::new();
        let t = check::check_committed(
            &snap,
            &exp,
            &committed,
            &self.dead_letters.msgs,
            &mut errors,
        );
        r.errors
            .extend(errors.into_iter().map(|e| format!("{label}: {e}")));
        r.audits += 1;
        r.last_audit = Some(t);
        Ok(())
    }

    /// Stops the producer, produces a fresh value of every edge endpoint,
    /// runs graphsink to the end (restarting it like an orchestrator if it
    /// exits on its own) and checks the whole graph.
    async fn finish(&mut self, env: &Env, main: &mut Broker, r: &mut PhaseReport) -> Res<()> {
        let feed = self.feed.take().expect("a feed");
        let (mut gen, produced, failed) = feed.stop().await;
        let closing = gen.closing();
        let (n, f) = produce_all(&main.bootstrap, closing).await?;
        r.produced = produced + n;
        r.produce_failures = failed + f;
        if f > 0 {
            return Err(format!(
                "{f} closing records failed to produce: the check would blame graphsink"
            ));
        }
        let cfg = self.config.display().to_string();
        let mut done = false;
        for attempt in 1..=6 {
            let started = Instant::now();
            let mut p = Process::spawn(
                &env.graphsink,
                &["run", "--config", &cfg, "--exit-at-end"],
                &[],
                &self.log,
            )?;
            match p.wait_for(Duration::from_secs(300)).await {
                Some(Exit { code: Some(0), .. }) => {
                    done = true;
                    r.final_run = Some((attempt, started.elapsed().as_secs_f64()));
                    break;
                }
                Some(e) => {
                    let tail = p.tail(1);
                    r.own_exits
                        .push(format!("final run, attempt {attempt}: {e:?}: {tail}"));
                    unwedge(main, &tail, r)?;
                }
                None => {
                    let e = p.kill().await;
                    r.own_exits.push(format!(
                        "final run, attempt {attempt}: no end in 300 s ({e:?}): {}",
                        p.tail(5)
                    ));
                }
            }
            tokio::time::sleep(SESSION + Duration::from_secs(1)).await;
        }
        if !done {
            r.errors
                .push("graphsink run --exit-at-end never finished".into());
        }
        // On Apache Kafka a fresh run must end by itself, within 3 minutes,
        // after any outage of the phase (issue 33); tansu 0.6 may need the
        // retries and a broker restart (RELIABILITY.md).
        if !main.is_tansu() {
            match r.final_run {
                Some((1, s)) if s <= 180.0 => {}
                Some((a, s)) => r.errors.push(format!(
                    "final run --exit-at-end ended at attempt {a} after {s:.0} s; on Kafka the first must end within 180 s"
                )),
                None => {}
            }
        }
        let snap = check::snapshot(&self.root).await?;
        let mut need = snap.offsets_seen();
        let mut committed = BTreeMap::new();
        for (topic, p) in self.topics.mapped() {
            let c = check::committed(&main.bootstrap, &self.group, topic, p)?;
            for (part, n) in &c {
                let e = need
                    .entry(topic.to_string())
                    .or_default()
                    .entry(*part)
                    .or_insert(0);
                *e = (*e).max(*n);
            }
            committed.insert(topic.to_string(), c);
        }
        let msgs = self.catch_up(&need)?;
        let exp = check::expected(&msgs, &self.topics);
        let mut errors = Vec::new();
        let t = check::check_final(&snap, &exp, &self.dead_letters.msgs, &mut errors);
        for (i, (topic, p)) in self.topics.mapped().into_iter().enumerate() {
            for part in 0..p {
                let end = self.tails[i].ends().get(&part).copied().unwrap_or(0);
                let c = committed[topic].get(&part).copied().unwrap_or(0);
                if c != end {
                    errors.push(format!("{topic}/{part}: committed {c}, end {end}"));
                }
            }
        }
        r.errors
            .extend(errors.into_iter().map(|e| format!("final: {e}")));
        r.final_check = Some(t);
        Ok(())
    }
}

fn config_text(root: &Path, group: &str, t: &Topics, main: &Broker, dlq: &Broker) -> String {
    format!(
        r#"# Written by graphsink-chaos.
[graph]
root = "{root}"
schema = "chaos.pg"
actor = "graphsink-chaos"

[kafka]
"bootstrap.servers" = "{main}"
"group.id" = "{group}"
"session.timeout.ms" = "6000"

[wal]
buckets = 2

[fold]
interval = "1s"

[offsets]
commit_interval = "200ms"
exit_at_end_quiet = "{quiet}"

[retention]
interval = "0s"
keep_commits = 2
keep_for = "0s"

[[mapping]]
topic = "{items}"
node = "Item"
key = "kafka"

[[mapping]]
topic = "{links}"
edge = "Link"
key = "kafka"
on_missing_endpoint = "defer"
endpoint_deadline = "1h"

[[mapping]]
topic = "{dangles}"
edge = "Dangle"
key = "kafka"
on_missing_endpoint = "reject"

[errors]
tolerance = "all"
dead_letter_topic = "{dlq_topic}"
dead_letter_transactions = {transactions}

[errors.producer]
"bootstrap.servers" = "{dlq}"
"#,
        root = root.display(),
        main = main.bootstrap,
        dlq = dlq.bootstrap,
        items = t.items,
        links = t.links,
        dangles = t.dangles,
        dlq_topic = t.dead_letters,
        // tansu 0.6's high watermark can read low, and it cannot abort a
        // transaction (docs/kafka.md).
        quiet = if main.is_tansu() { "1s" } else { "0s" },
        transactions = !main.is_tansu(),
    )
}

/// The continuous producer: `rate` records a second until stopped.
struct Feed {
    stop: Arc<AtomicBool>,
    handle: tokio::task::JoinHandle<(Generator, u64, u64)>,
}

fn producer(bootstrap: &str) -> Res<FutureProducer> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "5")
        // Outages last up to a minute: keep retrying rather than failing.
        .set("message.timeout.ms", "600000")
        .set("log_level", "3")
        .create()
        .map_err(|e| format!("producer: {e}"))
}

fn record(o: &Out) -> FutureRecord<'_, [u8], [u8]> {
    let mut r: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&o.topic)
        .partition(o.partition)
        .headers(OwnedHeaders::new().insert(Header {
            key: workload::EXPECT,
            value: Some(o.expect.as_bytes()),
        }));
    if let Some(k) = &o.key {
        r = r.key(k.as_slice());
    }
    if let Some(v) = &o.value {
        r = r.payload(v.as_slice());
    }
    r
}

impl Feed {
    fn start(bootstrap: &str, mut gen: Generator, rate: u32) -> Res<Feed> {
        let producer = producer(bootstrap)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let handle = tokio::spawn(async move {
            let (sent, failed) = (AtomicU64::new(0), AtomicU64::new(0));
            let mut inflight = FuturesUnordered::new();
            let per_tick = (rate / 20).max(1);
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            while !stop2.load(Ordering::Relaxed) {
                tick.tick().await;
                for _ in 0..per_tick {
                    let o = gen.next();
                    match producer.send_result(record(&o)) {
                        Ok(f) => inflight.push(f),
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                while let Some(Some(r)) = inflight.next().now_or_never() {
                    tally(r, &sent, &failed);
                }
            }
            while let Some(r) = inflight.next().await {
                tally(r, &sent, &failed);
            }
            (gen, sent.into_inner(), failed.into_inner())
        });
        Ok(Feed { stop, handle })
    }

    async fn stop(mut self) -> (Generator, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        (&mut self.handle).await.expect("producer task")
    }
}

impl Drop for Feed {
    /// A phase that failed early must not leave its producer running.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.abort();
    }
}

type Delivered = Result<
    rdkafka::producer::future_producer::OwnedDeliveryResult,
    futures::channel::oneshot::Canceled,
>;

fn tally(r: Delivered, sent: &AtomicU64, failed: &AtomicU64) {
    match r {
        Ok(Ok(_)) => sent.fetch_add(1, Ordering::Relaxed),
        _ => failed.fetch_add(1, Ordering::Relaxed),
    };
}

async fn produce_all(bootstrap: &str, recs: Vec<Out>) -> Res<(u64, u64)> {
    let producer = producer(bootstrap)?;
    let (sent, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    let mut inflight = FuturesUnordered::new();
    for o in &recs {
        match producer.send_result(record(o)) {
            Ok(f) => inflight.push(f),
            Err(_) => {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    while let Some(r) = inflight.next().await {
        tally(r, &sent, &failed);
    }
    Ok((sent.into_inner(), failed.into_inner()))
}

fn secs(rng: &mut StdRng, lo: f64, hi: f64) -> Duration {
    Duration::from_secs_f64(rng.random_range(lo..hi))
}

/// kill -9 trials: at random moments, and at a failpoint's Nth hit (a
/// SIGTERM after a while reaches the shutdown windows: drain, revoke).
async fn kills(env: &Env, seed: u64, r: &mut PhaseReport) -> Res<()> {
    let mut main = Broker::memory(&env.backend, env.work.join("broker-main.log"))?;
    let dlq = Broker::memory(&env.backend, env.work.join("broker-dead-letters.log"))?;
    let mut st = Stage::new(env, "kills", seed, &main, &dlq, None).await?;
    let mut rng = StdRng::seed_from_u64(seed);
    // Every third trial kills at a random moment; the others take the
    // failpoints in a seeded order, so 33 trials reach every window once.
    let mut windows = FAILPOINTS.to_vec();
    windows.shuffle(&mut rng);
    let mut next_window = windows.iter().cycle();
    for trial in 1..=env.args.trials {
        let label = format!("trial {trial}");
        let failpoint = (trial % 3 != 0).then(|| {
            let fp = *next_window.next().expect("a cycle never ends");
            (fp, rng.random_range(1..=3u32))
        });
        let mut p = st.spawn(env, failpoint.map(|(fp, n)| format!("{fp}=abort@{n}")))?;
        let exit = match failpoint {
            None => {
                let at = secs(&mut rng, 0.5, 9.0);
                match p.wait_for(at).await {
                    Some(e) => {
                        r.own_exits.push(format!("{label}: {e:?}: {}", p.tail(1)));
                        e
                    }
                    None => {
                        r.kills += 1;
                        p.kill().await
                    }
                }
            }
            Some((fp, _)) => {
                let e = match p.wait_for(secs(&mut rng, 2.0, 8.0)).await {
                    Some(e) => e,
                    // Not reached while running: stop, which passes the
                    // shutdown windows, then kill what is left.
                    None => p.stop(Duration::from_secs(30)).await,
                };
                match &e.fired {
                    Some(f) if f == fp => {
                        r.kills += 1;
                        *r.failpoints_fired.entry(fp.to_string()).or_default() += 1;
                    }
                    _ => {
                        *r.failpoints_missed.entry(fp.to_string()).or_default() += 1;
                        if e.code != Some(0) && e.signal != Some(libc::SIGKILL) {
                            r.own_exits
                                .push(format!("{label} ({fp}): {e:?}: {}", p.tail(1)));
                        }
                    }
                }
                e
            }
        };
        let killed_at = Instant::now();
        println!(
            "   {label}: {} -> {}",
            failpoint.map_or("kill -9 at a random moment".to_string(), |(fp, n)| format!(
                "{fp}@{n}"
            )),
            exit.fired.as_deref().map_or_else(
                || format!("{:?}/{:?}", exit.code, exit.signal),
                |f| format!("fired {f}")
            )
        );
        if rng.random_bool(0.5) {
            if let Err(e) = st.audit(env, &main, r, &label).await {
                r.errors.push(format!("{label}: audit: {e}"));
            }
        }
        let waited = killed_at.elapsed();
        if waited < SESSION + Duration::from_secs(1) {
            tokio::time::sleep(SESSION + Duration::from_secs(1) - waited).await;
        }
    }
    st.finish(env, &mut main, r).await?;
    keep_on_failure(&st, r);
    Ok(())
}

/// Schema changes under the continuous producer: trial i adds an optional
/// property to `Item`, and the start that applies it is killed -9 at a
/// step of the change (`MIGRATE_FAILPOINTS`, in turn) or at a random
/// moment; the next start must finish it. After each, the graph is audited
/// against what the group committed and must be at schema version i; the
/// phase ends with the usual final run and check.
async fn migrate(env: &Env, seed: u64, r: &mut PhaseReport) -> Res<()> {
    let mut main = Broker::memory(&env.backend, env.work.join("broker-migrate.log"))?;
    let dlq = Broker::memory(&env.backend, env.work.join("broker-dead-letters.log"))?;
    let mut st = Stage::new(env, "migrate", seed, &main, &dlq, None).await?;
    let mut rng = StdRng::seed_from_u64(seed);
    // A graph at version 0 with rows in it first.
    let mut p = st.spawn(env, None)?;
    match p.wait_for(secs(&mut rng, 3.0, 5.0)).await {
        Some(e) => r.own_exits.push(format!("version 0: {e:?}: {}", p.tail(1))),
        None => {
            p.stop(Duration::from_secs(30)).await;
        }
    }
    let pg = st.dir.join("chaos.pg");
    for trial in 1..=env.args.migrations {
        let label = format!("migration {trial}");
        let notes: String = (1..=trial)
            .map(|i| format!("    note{i}: String?\n"))
            .collect();
        let schema =
            workload::SCHEMA.replacen("    qty: I32\n", &format!("    qty: I32\n{notes}"), 1);
        std::fs::write(&pg, schema).map_err(|e| e.to_string())?;
        // Every third at a random moment; the others at the steps in turn
        // (`after_table` at one of the first tables).
        let window = MIGRATE_FAILPOINTS[(trial as usize - 1) % MIGRATE_FAILPOINTS.len()];
        let failpoint = (trial % 3 != 0).then(|| match window {
            "migrate.after_table" => format!("{window}=abort@{}", rng.random_range(1..=3u32)),
            w => format!("{w}=abort"),
        });
        let mut p = st.spawn(env, failpoint.clone())?;
        let exit = match &failpoint {
            None => match p.wait_for(secs(&mut rng, 0.1, 2.0)).await {
                Some(e) => e,
                None => {
                    r.kills += 1;
                    p.kill().await
                }
            },
            Some(_) => {
                let e = match p.wait_for(Duration::from_secs(60)).await {
                    Some(e) => e,
                    None => p.stop(Duration::from_secs(30)).await,
                };
                if e.fired.as_deref() == Some(window) {
                    r.kills += 1;
                    *r.failpoints_fired.entry(window.to_string()).or_default() += 1;
                } else {
                    *r.failpoints_missed.entry(window.to_string()).or_default() += 1;
                    r.own_exits
                        .push(format!("{label} ({window}): {e:?}: {}", p.tail(1)));
                }
                e
            }
        };
        println!(
            "   {label}: {} -> {}",
            failpoint.as_deref().unwrap_or("kill -9 at a random moment"),
            exit.fired.as_deref().map_or_else(
                || format!("{:?}/{:?}", exit.code, exit.signal),
                |f| format!("fired {f}")
            )
        );
        tokio::time::sleep(SESSION + Duration::from_secs(1)).await;
        // The next start finishes the change and ingests under it.
        let mut p = st.spawn(env, None)?;
        match p.wait_for(secs(&mut rng, 4.0, 8.0)).await {
            Some(e) => r
                .own_exits
                .push(format!("{label}, finishing: {e:?}: {}", p.tail(1))),
            None => {
                p.stop(Duration::from_secs(30)).await;
            }
        }
        if let Err(e) = st.audit(env, &main, r, &label).await {
            r.errors.push(format!("{label}: audit: {e}"));
        }
        match check::schema_version(&st.root).await {
            Ok(v) if v == u64::from(trial) => {}
            Ok(v) => r.errors.push(format!(
                "{label}: the graph is at schema version {v} after the start that finishes the change"
            )),
            Err(e) => r.errors.push(format!("{label}: {e}")),
        }
    }
    st.finish(env, &mut main, r).await?;
    keep_on_failure(&st, r);
    Ok(())
}

/// Several members of one group on a partition-sharded graph, under the
/// continuous producer: kill -9 of one (its partitions move after the
/// session timeout), SIGSTOP of another past its session then SIGCONT (it
/// must find itself fenced and rejoin, never writing a shard it lost), a
/// graceful leave (SIGTERM) and joins. Then every member stops and the
/// usual final run and check judge the graph against the stream.
async fn members(env: &Env, seed: u64, r: &mut PhaseReport) -> Res<()> {
    // Members leaving and joining can wedge tansu 0.6's group coordinator
    // (RELIABILITY.md): the remedy is a broker restart, which needs the
    // data kept.
    let mut main = Broker::persistent(
        &env.backend,
        env.args.moto.clone(),
        env.work.join("broker-members.log"),
    )?;
    let dlq = Broker::memory(&env.backend, env.work.join("broker-dead-letters.log"))?;
    let mut st = Stage::new(env, "members", seed, &main, &dlq, None).await?;
    let text = std::fs::read_to_string(&st.config).map_err(|e| e.to_string())?;
    let text = text.replace("[wal]\nbuckets = 2", "[wal]\nsharding = \"partition\"");
    let session = "\"session.timeout.ms\" = \"6000\"";
    let text = match env.args.group_protocol.as_str() {
        "range" => text,
        "cooperative-sticky" => text.replace(
            session,
            &format!("{session}\n\"partition.assignment.strategy\" = \"cooperative-sticky\""),
        ),
        // The session is the broker's (6 s in scripts/kafka/server.properties).
        "consumer" => text.replace(session, "\"group.protocol\" = \"consumer\""),
        other => {
            return Err(format!(
                "--group-protocol {other}: range, cooperative-sticky or consumer"
            ))
        }
    };
    std::fs::write(&st.config, text).map_err(|e| e.to_string())?;
    r.group_protocol = env.args.group_protocol.clone();
    let sampler = check::CommitSampler::start(
        &main.bootstrap,
        &st.group,
        st.topics
            .mapped()
            .into_iter()
            .map(|(t, p)| (t.to_string(), p))
            .collect(),
    )?;
    let mut events: Vec<(String, std::time::SystemTime)> = Vec::new();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut spawned = 0usize;
    let mut spawn = |st: &Stage| -> Res<(usize, Process)> {
        spawned += 1;
        let log = st.dir.join(format!("graphsink-{spawned}.log"));
        let cfg = st.config.display().to_string();
        Ok((
            spawned,
            Process::spawn(&env.graphsink, &["run", "--config", &cfg], &[], &log)?,
        ))
    };
    let mut live: Vec<(usize, Process)> = Vec::new();
    for _ in 0..3 {
        live.push(spawn(&st)?);
    }
    tokio::time::sleep(secs(&mut rng, 8.0, 12.0)).await;
    for round in 1..=env.args.member_rounds {
        respawn_exited(&st, &mut live, &mut spawn, &mut main, r).await?;
        // kill -9 of one member; a replacement joins after its session.
        let i = rng.random_range(0..live.len());
        let (n, mut p) = live.remove(i);
        let at = std::time::SystemTime::now();
        p.kill().await;
        r.kills += 1;
        events.push((format!("kill -9 of member {n}"), at));
        println!("   round {round}: member {n} killed -9");
        r.handoffs.push((
            format!("kill -9 of member {n}"),
            handoff(&st, n, &live, at).await,
        ));
        live.push(spawn(&st)?);
        tokio::time::sleep(secs(&mut rng, 6.0, 10.0)).await;

        // One member frozen past its session, then resumed.
        respawn_exited(&st, &mut live, &mut spawn, &mut main, r).await?;
        let i = rng.random_range(0..live.len());
        let n = live[i].0;
        live[i].1.signal(libc::SIGSTOP);
        let at = std::time::SystemTime::now();
        events.push((format!("SIGSTOP of member {n}"), at));
        println!("   round {round}: member {n} frozen (SIGSTOP)");
        let others: Vec<&(usize, Process)> = live.iter().filter(|(m, _)| *m != n).collect();
        let took = handoff_of(&st, n, &others, at).await;
        r.handoffs.push((format!("SIGSTOP of member {n}"), took));
        tokio::time::sleep((SESSION + Duration::from_secs(4)).saturating_sub(
            Duration::from_secs_f64(if took.is_finite() { took } else { 0.0 }),
        ))
        .await;
        live[i].1.signal(libc::SIGCONT);
        r.freezes.push(SESSION.as_secs() + 4);
        println!("   round {round}: member {n} resumed (SIGCONT)");
        tokio::time::sleep(secs(&mut rng, 8.0, 12.0)).await;

        // A graceful leave, then a join.
        respawn_exited(&st, &mut live, &mut spawn, &mut main, r).await?;
        let i = rng.random_range(0..live.len());
        let (n, mut p) = live.remove(i);
        events.push((format!("leave of member {n}"), std::time::SystemTime::now()));
        let e = p.stop(Duration::from_secs(30)).await;
        println!("   round {round}: member {n} left (SIGTERM): {e:?}");
        if e.code != Some(0) {
            r.own_exits
                .push(format!("member {n} on SIGTERM: {e:?}: {}", p.tail(3)));
        }
        tokio::time::sleep(secs(&mut rng, 4.0, 8.0)).await;
        let at = std::time::SystemTime::now();
        let joined = spawn(&st)?;
        events.push((format!("join of member {}", joined.0), at));
        let log = st.dir.join(format!("graphsink-{}.log", joined.0));
        live.push(joined);
        tokio::time::sleep(secs(&mut rng, 8.0, 12.0)).await;
        let took = group_events(&log)
            .into_iter()
            .find(|(t, assigned, parts)| *assigned && !parts.is_empty() && *t >= at)
            .map_or(f64::NAN, |(t, _, _)| {
                t.duration_since(at).unwrap_or_default().as_secs_f64()
            });
        r.handoffs
            .push((format!("join of member {}", live.last().unwrap().0), took));
    }
    // The 20 s after the last event have passed (the sleeps above).
    for (what, at) in events {
        let (rate, pause, lag) = sampler.around(at, Duration::from_secs(20));
        r.rebalances.push((what, rate, pause, lag));
    }
    drop(sampler);
    respawn_exited(&st, &mut live, &mut spawn, &mut main, r).await?;
    for (n, mut p) in live {
        let e = p.stop(Duration::from_secs(30)).await;
        if e.code != Some(0) && e.signal.is_none() {
            r.own_exits
                .push(format!("member {n} at the end: {e:?}: {}", p.tail(3)));
        }
    }
    tokio::time::sleep(SESSION + Duration::from_secs(1)).await;
    st.finish(env, &mut main, r).await?;
    keep_on_failure(&st, r);
    Ok(())
}

/// Members that exited on their own are reported, and restarted as an
/// orchestrator would (after unwedging the broker if they said it was stuck).
async fn respawn_exited(
    st: &Stage,
    live: &mut [(usize, Process)],
    spawn: &mut impl FnMut(&Stage) -> Res<(usize, Process)>,
    main: &mut Broker,
    r: &mut PhaseReport,
) -> Res<()> {
    for slot in live.iter_mut() {
        if let Some(e) = slot.1.wait_for(Duration::ZERO).await {
            let tail = slot.1.tail(1);
            r.own_exits
                .push(format!("member {}: {e:?}: {tail}", slot.0));
            unwedge(main, &tail, r)?;
            *slot = spawn(st)?;
        }
    }
    Ok(())
}

/// Seconds from `at` until a member of `live` was assigned one of the
/// partitions member `gone` held then (its shards are claimed before its
/// next record), at most two minutes; NaN if none was.
async fn handoff(
    st: &Stage,
    gone: usize,
    live: &[(usize, Process)],
    at: std::time::SystemTime,
) -> f64 {
    let refs: Vec<&(usize, Process)> = live.iter().collect();
    handoff_of(st, gone, &refs, at).await
}

async fn handoff_of(
    st: &Stage,
    gone: usize,
    live: &[&(usize, Process)],
    at: std::time::SystemTime,
) -> f64 {
    let log = |n: usize| st.dir.join(format!("graphsink-{n}.log"));
    let held = held_partitions(&log(gone));
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline && !held.is_empty() {
        let first = live
            .iter()
            .filter_map(|(n, _)| first_assignment_after(&log(*n), at, &held))
            .min();
        if let Some(t) = first {
            return t.duration_since(at).unwrap_or_default().as_secs_f64();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    f64::NAN
}

/// A graphsink log's `assigned`/`revoked` lines: (time, assigned?, partitions).
fn group_events(log: &Path) -> Vec<(std::time::SystemTime, bool, Vec<String>)> {
    let text = cluster::strip_ansi(&std::fs::read_to_string(log).unwrap_or_default());
    text.lines()
        .filter_map(|l| {
            let assigned = l.contains("event=\"assigned\"");
            if !assigned && !l.contains("event=\"revoked\"") {
                return None;
            }
            let stamp = l.split_whitespace().next()?;
            let t = std::time::SystemTime::from(chrono::DateTime::parse_from_rfc3339(stamp).ok()?);
            let parts = l
                .split("partitions=")
                .nth(1)?
                .split_whitespace()
                .next()
                .unwrap_or("");
            let parts = parts
                .split(',')
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect();
            Some((t, assigned, parts))
        })
        .collect()
}

/// The partitions a member's log says it holds at its end.
fn held_partitions(log: &Path) -> std::collections::BTreeSet<String> {
    let mut held = std::collections::BTreeSet::new();
    for (_, assigned, parts) in group_events(log) {
        for p in parts {
            if assigned {
                held.insert(p);
            } else {
                held.remove(&p);
            }
        }
    }
    held
}

/// When a log first shows an assignment after `at` naming one of `wanted`.
fn first_assignment_after(
    log: &Path,
    at: std::time::SystemTime,
    wanted: &std::collections::BTreeSet<String>,
) -> Option<std::time::SystemTime> {
    group_events(log)
        .into_iter()
        .find(|(t, assigned, parts)| {
            *assigned && *t > at && parts.iter().any(|p| wanted.contains(p))
        })
        .map(|(t, _, _)| t)
}

#[derive(Clone, Copy)]
enum Outage {
    Freeze,
    DeadLetters,
    Restarts,
}

/// A broker outage while graphsink runs (restarted whenever it exits).
async fn outage(env: &Env, seed: u64, kind: Outage, r: &mut PhaseReport) -> Res<()> {
    let name = match kind {
        Outage::Freeze => "freeze",
        Outage::DeadLetters => "dead-letters",
        Outage::Restarts => "restarts",
    };
    let mut main = match kind {
        // A freeze can wedge tansu 0.6's group coordinator (RELIABILITY.md):
        // the remedy is a broker restart, which needs the data kept.
        Outage::Restarts | Outage::Freeze => Broker::persistent(
            &env.backend,
            env.args.moto.clone(),
            env.work.join(format!("broker-{name}.log")),
        )?,
        _ => Broker::memory(&env.backend, env.work.join(format!("broker-{name}.log")))?,
    };
    let dlq = Broker::memory(
        &env.backend,
        env.work.join(format!("broker-{name}-dead-letters.log")),
    )?;
    let mut st = Stage::new(env, name, seed, &main, &dlq, None).await?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut p = st.spawn(env, None)?;
    let supervise = |p: &mut Process,
                     st: &Stage,
                     r: &mut PhaseReport,
                     main: &mut Broker,
                     e: Exit|
     -> Res<Process> {
        let tail = p.tail(1);
        r.own_exits.push(format!("{e:?}: {tail}"));
        unwedge(main, &tail, r)?;
        st.spawn(env, None)
    };
    let steps: Vec<u64> = match kind {
        Outage::Freeze => env.args.freezes.clone(),
        Outage::DeadLetters => vec![env.args.dead_letter_outage],
        Outage::Restarts => vec![0; env.args.restarts as usize],
    };
    for (i, d) in steps.iter().enumerate() {
        if let Some(e) = p.wait_for(secs(&mut rng, 3.0, 8.0)).await {
            tokio::time::sleep(SESSION).await;
            p = supervise(&mut p, &st, r, &mut main, e)?;
        }
        match kind {
            Outage::Freeze => {
                println!("   freezing the broker for {d} s");
                main.freeze();
                tokio::time::sleep(Duration::from_secs(*d)).await;
                main.thaw();
                r.freezes.push(*d);
            }
            Outage::DeadLetters => {
                println!("   freezing the dead-letter broker for {d} s");
                dlq.freeze();
                tokio::time::sleep(Duration::from_secs(*d)).await;
                dlq.thaw();
                r.dead_letter_outage = *d;
            }
            Outage::Restarts => {
                let down = secs(&mut rng, 0.5, 3.0);
                println!(
                    "   restart {} of the broker (down {:.1} s)",
                    i + 1,
                    down.as_secs_f64()
                );
                main.restart(down)?;
                r.restarts += 1;
            }
        }
        // Let it recover while the producer goes on; restart it if it gave up.
        let recover = Instant::now() + Duration::from_secs(15);
        while Instant::now() < recover {
            if let Some(e) = p.wait_for(Duration::from_secs(1)).await {
                tokio::time::sleep(SESSION).await;
                p = supervise(&mut p, &st, r, &mut main, e)?;
            }
        }
    }
    let e = p.stop(Duration::from_secs(60)).await;
    if e.code != Some(0) {
        r.own_exits.push(format!("stop: {e:?}: {}", p.tail(1)));
    }
    tokio::time::sleep(SESSION).await;
    st.finish(env, &mut main, r).await?;
    keep_on_failure(&st, r);
    Ok(())
}

/// The graph root on a small tmpfs, filled to the brim by a ballast file
/// while graphsink runs; then the ballast goes and everything must land.
async fn disk(env: &Env, seed: u64, r: &mut PhaseReport) -> Res<()> {
    let mnt = env.work.join("disk-tmpfs");
    std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
    let out = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m", "chaos-disk"])
        .arg(&mnt)
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            r.not_run = Some(format!(
                "cannot mount a size-limited tmpfs here (needs root or CAP_SYS_ADMIN): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
            return Ok(());
        }
        Err(e) => {
            r.not_run = Some(format!("cannot run mount: {e}"));
            return Ok(());
        }
    }
    let result = disk_phase(env, seed, &mnt, r).await;
    let unmounted = std::process::Command::new("umount").arg(&mnt).status();
    if !unmounted.is_ok_and(|s| s.success()) {
        let lazy = std::process::Command::new("umount")
            .arg("-l")
            .arg(&mnt)
            .status();
        if !lazy.is_ok_and(|s| s.success()) {
            r.errors
                .push(format!("could not unmount the tmpfs at {}", mnt.display()));
        }
    }
    result
}

async fn disk_phase(env: &Env, seed: u64, mnt: &Path, r: &mut PhaseReport) -> Res<()> {
    let mut main = Broker::memory(&env.backend, env.work.join("broker-disk.log"))?;
    let dlq = Broker::memory(&env.backend, env.work.join("broker-disk-dead-letters.log"))?;
    let mut st = Stage::new(env, "disk", seed, &main, &dlq, Some(mnt.join("graph"))).await?;
    let mut p = st.spawn(env, None)?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Leave 64 KiB free: WAL entries, flushes and folds soon hit ENOSPC.
    let ballast = mnt.join("ballast");
    let free = free_bytes(mnt)?;
    let fill = free.saturating_sub(64 << 10);
    // graphsink writes meanwhile: a ballast cut short by ENOSPC is a full disk too.
    if let Err(e) = std::fs::write(&ballast, vec![0u8; fill as usize]) {
        if e.raw_os_error() != Some(libc::ENOSPC) {
            return Err(format!("ballast: {e}"));
        }
    }
    println!("   disk full: {} KiB left", free_bytes(mnt)? / 1024);
    let full_until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < full_until {
        if let Some(e) = p.wait_for(Duration::from_secs(1)).await {
            r.own_exits.push(format!("disk full: {e:?}: {}", p.tail(1)));
            tokio::time::sleep(SESSION).await;
            p = st.spawn(env, None)?;
        }
    }
    std::fs::remove_file(&ballast).map_err(|e| e.to_string())?;
    println!("   disk freed: {} KiB left", free_bytes(mnt)? / 1024);
    let recover = Instant::now() + Duration::from_secs(15);
    while Instant::now() < recover {
        if let Some(e) = p.wait_for(Duration::from_secs(1)).await {
            r.own_exits
                .push(format!("after freeing: {e:?}: {}", p.tail(1)));
            tokio::time::sleep(SESSION).await;
            p = st.spawn(env, None)?;
        }
    }
    let e = p.stop(Duration::from_secs(60)).await;
    if e.code != Some(0) {
        r.own_exits.push(format!("stop: {e:?}: {}", p.tail(1)));
    }
    tokio::time::sleep(SESSION).await;
    st.finish(env, &mut main, r).await?;
    keep_on_failure(&st, r);
    Ok(())
}

/// graphsink exits non-zero, saying so, when its group is wedged (tansu 0.6:
/// after a freeze no member gets a partition again). The operator's remedy
/// is a broker restart; done here when the broker keeps its data.
fn unwedge(main: &mut Broker, tail: &str, r: &mut PhaseReport) -> Res<()> {
    if !tail.contains("the group coordinator is stuck") || !main.restartable() {
        return Ok(());
    }
    println!("   the group is wedged (graphsink said so and exited): restarting the broker");
    r.wedges += 1;
    main.restart(Duration::from_secs(1))
}

fn free_bytes(p: &Path) -> Res<u64> {
    let c = std::ffi::CString::new(p.display().to_string()).map_err(|e| e.to_string())?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a zeroed out-struct of the right type.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(format!(
            "statvfs {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}

fn keep_on_failure(st: &Stage, r: &PhaseReport) {
    if !r.errors.is_empty() {
        println!("   evidence: graph and log under {}", st.dir.display());
    }
}

#[cfg(test)]
mod tests {
    /// The failpoints aimed at are the ones docs/ARCHITECTURE.md names.
    #[test]
    fn failpoints_match_the_architecture_page() {
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/ARCHITECTURE.md"
        ))
        .unwrap();
        let section = doc
            .split("## Failpoints")
            .nth(1)
            .unwrap()
            .split("\n## ")
            .next()
            .unwrap();
        let mut named: Vec<&str> = Vec::new();
        for line in section.lines().filter(|l| l.starts_with("| `")) {
            let cell = line.split('|').nth(1).unwrap();
            named.extend(cell.split('`').skip(1).step_by(2));
        }
        let mut ours = super::FAILPOINTS.to_vec();
        ours.extend(super::MIGRATE_FAILPOINTS);
        ours.sort();
        named.sort();
        assert_eq!(ours, named);
    }
}
