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
//! With `--cluster 3` it runs the `cluster` set instead (`phases/cluster/`):
//! a secured three-node Kafka in network namespaces, and its faults
//! (rolling restart, kill -9 of a leader, the controller, a transaction
//! coordinator, network cuts, a slow and flaky network, a zombie member,
//! `min.insync.replicas` not met, members on S3), each phase timing how
//! long ingest paused and took to recover.
//!
//! After crashes (half of them, by seed) and at the end of each phase the
//! checker in `check/` compares the graph, read with plain Lance, with
//! the stream read back from Kafka. Any difference is a finding, printed
//! with the seed and trial; the exit status is non-zero.
//!
//! The parts: `args` (the command line), `stage` (a phase's graph, topics,
//! producer, audit and final check), `feed` (the producers), `phases/` (one
//! file per phase; `phases/cluster/` the cluster set), `cluster` (single
//! brokers and graphsink processes), `reach` (how the harness's Kafka
//! clients reach a broker or the cluster), `workload` (the records),
//! `check/` (the checker), `report` (what a phase found).

mod args;
mod check;
mod cluster;
mod feed;
mod phases;
mod reach;
mod report;
mod stage;
mod workload;

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use graphsink_testkit::BrokerBackend;

use args::Args;
use check::Res;
use report::{print_phase, PhaseReport};
use stage::Env;

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

/// Runs the phases in turn; `Ok(false)` when a check failed.
async fn chaos(args: Args) -> Res<bool> {
    let t0 = Instant::now();
    let graphsink = graphsink_binary(&args)?;
    let backend = broker_backend(&args)?;
    backend.check_installed()?;
    let phases = chosen_phases(&args)?;
    let (work, tmp) = work_dir(&args)?;
    println!(
        "graphsink-chaos seed {} work {} broker {}",
        args.seed,
        work.display(),
        match args.cluster {
            Some(n) => format!("a secured Apache Kafka cluster of {n} nodes"),
            None => backend.describe(),
        }
    );
    let env = Env {
        graphsink,
        backend,
        work: work.clone(),
        args: args.clone(),
    };
    let mut reports = Vec::new();
    if let Some(n) = args.cluster {
        tear_down_on_signal();
        let started = Instant::now();
        let mut c = phases::cluster::Cluster::start(n)?;
        println!(
            "   cluster of {n} ready in {:.0} s",
            started.elapsed().as_secs_f64()
        );
        for phase in &phases {
            let i = place(phases::cluster::PHASES, phase);
            reports.push(run_phase(&env, Some(&mut c), i, phase).await);
        }
    } else {
        for phase in &phases {
            let i = place(phases::SINGLE, phase);
            reports.push(run_phase(&env, None, i, phase).await);
        }
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

/// `--graphsink`, or `graphsink` next to this binary; it must exist.
fn graphsink_binary(args: &Args) -> Res<PathBuf> {
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
    Ok(graphsink)
}

/// The brokers `--broker-backend` names.
fn broker_backend(args: &Args) -> Res<BrokerBackend> {
    Ok(match args.broker_backend.as_str() {
        "kafka" => BrokerBackend::Kafka,
        "tansu" => BrokerBackend::Tansu(
            args.tansu
                .clone()
                .unwrap_or_else(graphsink_testkit::tansu::default_bin),
        ),
        other => return Err(format!("--broker-backend {other}: expected kafka or tansu")),
    })
}

/// `--work`, or a temporary directory (returned too, so it can be kept).
fn work_dir(args: &Args) -> Res<(PathBuf, Option<tempfile::TempDir>)> {
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
    Ok((work, tmp))
}

/// The phases `--phases` names, or the whole set; cluster phases only
/// with `--cluster`, and the others only without.
fn chosen_phases(args: &Args) -> Res<Vec<String>> {
    let cluster = phases::cluster::PHASES;
    let Some(named) = &args.phases else {
        return Ok(match args.cluster {
            Some(_) => cluster.iter().map(|s| s.to_string()).collect(),
            None => phases::SINGLE.iter().map(|s| s.to_string()).collect(),
        });
    };
    for p in named {
        let in_cluster = cluster.contains(&p.as_str());
        match (args.cluster.is_some(), in_cluster) {
            (true, false) => {
                return Err(format!(
                    "--phases {p}: with --cluster the phases are {}",
                    cluster.join(",")
                ))
            }
            (false, true) => return Err(format!("--phases {p} needs --cluster 3")),
            _ => {}
        }
    }
    Ok(named.clone())
}

/// A SIGINT or SIGTERM tears the cluster down before the process goes:
/// its namespaces are deleted with every process inside (the JVMs, the
/// proxies, graphsink). The drops do the same on every other way out.
fn tear_down_on_signal() {
    tokio::spawn(async {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        let gone = graphsink_testkit::netns::delete_own();
        eprintln!(
            "graphsink-chaos: stopped by a signal; deleted {} network namespaces and what ran in them",
            gone.len()
        );
        std::process::exit(130);
    });
}

/// A phase's place in its set, which its seed is derived from: the same
/// seed whether the whole set runs or `--phases` picks it out, so a
/// failing phase replays alone (and CI can run the set in two processes).
fn place(set: &[&str], phase: &str) -> usize {
    set.iter().position(|p| *p == phase).unwrap_or(set.len())
}

/// Phase `i` of its set, with a seed of its own, timed and printed.
async fn run_phase(
    env: &Env,
    cluster: Option<&mut phases::cluster::Cluster>,
    i: usize,
    phase: &str,
) -> PhaseReport {
    let seed = env.args.seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
    let t = Instant::now();
    let mut r = PhaseReport {
        phase: phase.to_string(),
        ..Default::default()
    };
    println!("== phase {phase} (seed {seed})");
    let ran = match cluster {
        Some(c) => phases::cluster::run(env, c, phase, seed, &mut r).await,
        None => phases::run(env, phase, seed, &mut r).await,
    };
    if let Err(e) = ran {
        r.errors.push(format!("phase failed: {e}"));
    }
    r.seconds = t.elapsed().as_secs_f64();
    print_phase(&r);
    r
}

/// No import circle among the harness's files (the check every crate of
/// the workspace runs).
#[test]
fn no_import_circle() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    graphsink_testkit::imports::assert_no_circle(&src);
}
