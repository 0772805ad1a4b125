//! `run --exit-at-end` beside a ghost: a member the coordinator still
//! counts after it stopped without leaving (issue 49). Seen after a broker
//! freeze, when a member's leave never reached the coordinator: a fresh
//! run was assigned half the partitions, finished those and exited 0 with
//! the other half unread. Here the ghost is made without a freeze: a plain
//! consumer in a process of its own (this test binary, run again) joins the
//! group, shares the partitions with graphsink, and is then SIGSTOPped, so
//! it neither commits nor leaves until its 6 s session expires. The run
//! must end only with every partition at its end and every key exact,
//! under both shardings and both group protocols.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use serde_json::json;

use crate::harness::*;

const PARTITIONS: i32 = 4;
const IDS: i32 = 200;
const GHOST_VAR: &str = "GRAPHSINK_E2E_GHOST";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_at_end_waits_for_a_ghosts_partitions_bucket_classic() {
    beside_a_ghost("bucket", "classic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_at_end_waits_for_a_ghosts_partitions_bucket_kip848() {
    beside_a_ghost("bucket", "consumer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_at_end_waits_for_a_ghosts_partitions_partition_classic() {
    beside_a_ghost("partition", "classic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_at_end_waits_for_a_ghosts_partitions_partition_kip848() {
    beside_a_ghost("partition", "consumer").await;
}

async fn beside_a_ghost(sharding: &str, protocol: &str) {
    crate::init_logs();
    let extra = format!(
        "[wal]\nsharding = \"{sharding}\"\n[fold]\ninterval = \"1s\"\n[offsets]\ncommit_interval = \"200ms\""
    );
    let tg = TestGraph::new(&["node = \"Person\""], &extra);
    if protocol == "consumer" {
        // KIP-848 keeps the session on the broker (6 s in the test broker's
        // server.properties); librdkafka refuses a client-side one with it.
        let cfg = std::fs::read_to_string(tg.config_path()).unwrap();
        let cfg = cfg.replace(
            "\"session.timeout.ms\" = \"6000\"",
            "\"group.protocol\" = \"consumer\"",
        );
        std::fs::write(tg.config_path(), cfg).unwrap();
    }
    let topic = tg.topics[0].clone();
    create_topic(&topic, PARTITIONS).await;
    // Two versions of every id, each id on one partition (keyed by id):
    // the graph must end with the second of each.
    let mut recs = Vec::new();
    for round in [1, 2] {
        recs.extend((0..IDS).map(|i| {
            let n = format!("p{i}");
            rec(
                i % PARTITIONS,
                Some(&n),
                Some(json!({"name": n, "age": round})),
            )
        }));
    }
    produce(&topic, &recs).await;
    let ends = end_offsets(&topic, PARTITIONS);

    // The same assignor as graphsink's, so the two share the partitions.
    let assignor = if sharding == "partition" {
        "range"
    } else {
        "cooperative-sticky"
    };
    let mut ghost = Ghost::start(&tg.group, &topic, protocol, assignor);
    ghost.wait_holding(PARTITIONS as usize);

    let mut cmd = crate::binary::graphsink();
    cmd.args(["run", "--exit-at-end", "--config"])
        .arg(tg.config_path())
        .env("RUST_LOG", "info,lance=warn")
        .stdout(Stdio::null());
    graphsink_testkit::tie_to_parent(&mut cmd);
    let mut run = crate::binary::Running::spawn(cmd);

    // graphsink has joined once it has committed some partitions to their
    // end (the ghost commits nothing): the partitions are split. Now the
    // ghost stops without leaving, still holding the rest.
    let group = tg.group.clone();
    let t = topic.clone();
    wait_until(
        "graphsink committed its share of the partitions",
        Duration::from_secs(60),
        || {
            let c = committed(&group, &t, PARTITIONS);
            c.iter().filter(|(p, n)| **n >= ends[p]).count() >= 1
        },
    )
    .await;
    // A run that has already exited took its share for the whole job: the
    // checks below fail it. Otherwise the partitions must be split now.
    if run.try_wait().unwrap().is_none() {
        let held = ghost.holding();
        assert!(
            held > 0 && held < PARTITIONS as usize,
            "the ghost holds {held} of {PARTITIONS} partitions: not a split"
        );
    }
    ghost.stop();

    let started = Instant::now();
    let status = tokio::task::block_in_place(|| wait_exit(&mut run, Duration::from_secs(120)));
    let stderr = run.stderr().to_string();
    ghost.kill();
    assert_eq!(status, Some(0), "the run did not end well:\n{stderr}");
    assert_eq!(
        committed(&tg.group, &topic, PARTITIONS),
        ends,
        "exit 0 with a partition short of its end ({sharding}, {protocol}):\n{stderr}"
    );
    assert!(
        stderr.contains("assigned to another member"),
        "the wait for the ghost's partitions was not said:\n{stderr}"
    );
    let rows = tg.rows("nodes/Person").await;
    assert_eq!(rows.len(), IDS as usize);
    for (id, row) in &rows {
        assert_eq!(row["age"], json!(2), "{id}: {row}");
    }
    eprintln!(
        "{sharding}/{protocol}: ended {:?} after the ghost stopped",
        started.elapsed()
    );
    for line in stderr
        .lines()
        .filter(|l| l.contains("exit-at-end") || l.contains("assigned"))
    {
        eprintln!("  {line}");
    }
}

/// Waits for `run` to exit, at most `limit` (then kills it): its code.
fn wait_exit(run: &mut crate::binary::Running, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = run.try_wait().unwrap() {
            return s.code();
        }
        if Instant::now() > deadline {
            let _ = run.kill();
            let _ = run.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The ghost member's process: this test binary, running
/// [`ghost_member_process`].
struct Ghost {
    child: Child,
    lines: std::sync::mpsc::Receiver<usize>,
    holding: usize,
}

impl Ghost {
    fn start(group: &str, topic: &str, protocol: &str, assignor: &str) -> Ghost {
        let exe = std::env::current_exe().expect("the test binary");
        let mut cmd = Command::new(exe);
        cmd.args([
            "--exact",
            "ghost::ghost_member_process",
            "--ignored",
            "--nocapture",
        ])
        .env(
            GHOST_VAR,
            format!("{}|{group}|{topic}|{protocol}|{assignor}", broker()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        graphsink_testkit::tie_to_parent(&mut cmd);
        let mut child = cmd.spawn().expect("spawn the ghost");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(n) = line.strip_prefix("GHOST holds ") {
                    let _ = tx.send(n.trim().parse().unwrap_or(0));
                }
            }
        });
        Ghost {
            child,
            lines,
            holding: 0,
        }
    }

    /// How many partitions the ghost held at its last report.
    fn holding(&mut self) -> usize {
        while let Ok(n) = self.lines.try_recv() {
            self.holding = n;
        }
        self.holding
    }

    fn wait_holding(&mut self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.holding() != n {
            assert!(Instant::now() < deadline, "the ghost never held {n}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGSTOP: no heartbeat, no commit, no leave.
    fn stop(&self) {
        // SAFETY: a plain syscall on our own child's pid.
        let r = unsafe { libc::kill(self.child.id() as i32, libc::SIGSTOP) };
        assert_eq!(r, 0, "SIGSTOP the ghost");
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Not a test: the body of the ghost's process ([`Ghost::start`] runs this
/// binary again with `GRAPHSINK_E2E_GHOST` set). It joins the group and
/// polls forever, committing nothing, and prints `GHOST holds N` whenever
/// its assignment changes.
#[test]
#[ignore = "the ghost member's process body, run by the ghost tests"]
fn ghost_member_process() {
    let spec = std::env::var(GHOST_VAR).expect("run by Ghost::start");
    let f: Vec<&str> = spec.split('|').collect();
    let [servers, group, topic, protocol, assignor] = f[..] else {
        panic!("{GHOST_VAR}={spec}");
    };
    let mut cc = rdkafka::ClientConfig::new();
    cc.set("bootstrap.servers", servers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest");
    if protocol == "consumer" {
        if assignor == "range" {
            cc.set("group.protocol", "consumer")
                .set("group.remote.assignor", "range");
        } else {
            cc.set("group.protocol", "consumer");
        }
    } else {
        cc.set("partition.assignment.strategy", assignor)
            .set("session.timeout.ms", "6000");
    }
    let c: BaseConsumer = cc.create().expect("ghost consumer");
    c.subscribe(&[topic]).expect("subscribe");
    let mut said = usize::MAX;
    loop {
        let _ = c.poll(Duration::from_millis(50));
        let n = c.assignment().map(|a| a.count()).unwrap_or(0);
        if n != said {
            println!("GHOST holds {n}");
            said = n;
        }
    }
}
