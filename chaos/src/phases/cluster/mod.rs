//! The `cluster` set of phases (`--cluster 3`, issue 55): the faults of a
//! production Kafka under the continuous producer, each phase ending with
//! the checker's full audit. One secured cluster (the testkit's
//! `KafkaCluster`: three KRaft nodes in network namespaces, RF 3,
//! `min.insync.replicas=2`, SASL_SSL, deny-by-default ACLs, a Toxiproxy
//! per client host) serves every phase of a run. Each phase has its own
//! topics, group, graph, ACLs and client hosts (graphsink's members, each a
//! namespace of its own), and leaves the cluster whole for the next.
//!
//! The files: `restarts` (a rolling restart), `kills` (kill -9 of the
//! partitions' leader, of the active controller, of the transaction
//! coordinator inside a delivery), `cuts` (graphsink cut off from its
//! leader, from the whole cluster), `network` (a slow, then a flaky
//! network), `zombie` (a member cut off while the others go on), `quorum`
//! (two brokers down: `min.insync.replicas` not met), `members` (members
//! on an `s3://` root under partition sharding), and `meter` (how long
//! ingest paused, and how long it took to recover).

mod cuts;
mod kills;
mod members;
mod meter;
mod network;
mod quorum;
mod restarts;
mod zombie;

use std::path::Path;
use std::time::{Duration, Instant};

use graphsink_testkit::cluster::ADMIN;
use graphsink_testkit::{Acl, ClientHost, KafkaCluster, Operation, ResourceType};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};

use crate::check::{GraphRoot, Res};
use crate::cluster::{Exit, Process};
use crate::reach::Reach;
use crate::report::PhaseReport;
use crate::stage::{self, Env, Launch, Site, Stage, SESSION};

pub(crate) use meter::Meter;

/// The phases of the set, in the order a full run takes them.
pub(crate) const PHASES: &[&str] = &[
    "rolling-restart",
    "kill-leader",
    "kill-controller",
    "kill-coordinator",
    "cut-leader",
    "cut-cluster",
    "slow-network",
    "zombie",
    "min-isr",
    "members-consumer",
    "members-classic",
];

/// Where graphsink serves `/ready` and `/metrics` in its own namespace.
pub(super) const HTTP: &str = "127.0.0.1:9464";

/// The environment variable graphsink's config names for its password.
const PASSWORD_VAR: &str = "GRAPHSINK_KAFKA_PASSWORD";

/// How long a node may take to rejoin every ISR after its start.
const IN_SYNC_WITHIN: Duration = Duration::from_secs(300);

/// The cluster of a run and the harness's clients of it: the admin (a
/// super user on the cluster's own admin host, never poisoned) reads
/// topics and offsets; the producer writes from a host of its own.
pub(crate) struct Cluster {
    pub kc: KafkaCluster,
    pub admin: Reach,
    pub producer: Reach,
    _producer_host: ClientHost,
}

impl Cluster {
    /// Starts `n` nodes (the testkit's cluster, its heap small: three JVMs
    /// share the machine with graphsink and the harness).
    pub(crate) fn start(n: u32) -> Res<Cluster> {
        let kc = KafkaCluster::start(n)?;
        let admin = Reach::sasl(kc.admin_host(), ADMIN)?;
        let producer_host = kc.client("producer")?;
        let producer = Reach::sasl(&producer_host, "producer")?;
        Ok(Cluster {
            kc,
            admin,
            producer,
            _producer_host: producer_host,
        })
    }

    /// Makes the cluster whole again after a phase, whatever it left:
    /// every node running and thawed, no cut, every replica in sync.
    pub(crate) fn restore(&mut self) -> Res<()> {
        self.kc.network().heal_all()?;
        for id in self.kc.node_ids() {
            if self.kc.pid(id)?.is_none() {
                self.kc.start_node(id)?;
            } else {
                self.kc.thaw_node(id)?;
            }
        }
        self.kc.wait_in_sync(IN_SYNC_WITHIN)
    }

    /// A client host for one graphsink member.
    pub(super) fn member_host(&self, label: &str) -> Res<ClientHost> {
        self.kc.client(label)
    }

    /// A stage on the cluster: the phase's mapped topics (RF 3) with every
    /// partition's preferred leader on node `leader`, so "the leader of
    /// graphsink's partitions" is one node; the dead-letter topic (RF 3);
    /// the producer's and graphsink's ACLs; graphsink on `member`; the
    /// producer at `--rate`.
    pub(super) async fn stage(
        &self,
        env: &Env,
        name: &str,
        seed: u64,
        member: &ClientHost,
        leader: u32,
        graph: (GraphRoot, String),
    ) -> Res<Stage> {
        self.stage_at(env, name, seed, member, leader, graph, env.args.rate)
            .await
    }

    /// [`Cluster::stage`] with the producer at `rate` records a second.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn stage_at(
        &self,
        env: &Env,
        name: &str,
        seed: u64,
        member: &ClientHost,
        leader: u32,
        graph: (GraphRoot, String),
        rate: u32,
    ) -> Res<Stage> {
        let topics = stage::topics_for(name, seed);
        let group = stage::group_for(name, seed);
        for (t, p) in topics.mapped() {
            self.create_topic(t, p, Some(leader)).await?;
        }
        self.create_topic(&topics.dead_letters, 1, None).await?;
        let mapped: Vec<&str> = topics.mapped().iter().map(|(t, _)| *t).collect();
        let mut acls = Vec::new();
        for t in &mapped {
            for op in [Operation::Write, Operation::Describe] {
                acls.push(Acl::allow("producer", op, ResourceType::Topic, t));
            }
        }
        acls.extend(Acl::graphsink_needs(
            "graphsink",
            &mapped,
            &group,
            &topics.dead_letters,
        ));
        self.kc.grant(&acls)?;
        let site = Site {
            source: self.admin.clone(),
            producer: self.producer.clone(),
            dead_letters: self.admin.clone(),
            kafka_lines: self.kafka_lines(member)?,
            producer_lines: String::new(),
            tansu: false,
            launch: self.launch(member)?,
            session: SESSION,
        };
        Stage::on(env, name, seed, site, graph.0, &graph.1, rate).await
    }

    /// How graphsink starts on `member`: in its namespace, its password
    /// in the environment.
    pub(super) fn launch(&self, member: &ClientHost) -> Res<Launch> {
        Ok(Launch {
            host: Some(member.host().clone()),
            env: self.launch_env()?,
        })
    }

    /// The environment graphsink needs here: its password.
    pub(super) fn launch_env(&self) -> Res<Vec<(String, String)>> {
        Ok(vec![(PASSWORD_VAR.into(), self.kc.password("graphsink")?)])
    }

    /// graphsink's `[kafka]` connection lines: SASL_SSL as `graphsink`
    /// through the member host's proxies, the password a `${VAR}`, as a
    /// user's file would have it.
    fn kafka_lines(&self, member: &ClientHost) -> Res<String> {
        let mut lines = String::new();
        for (k, v) in member.sasl_properties("graphsink")? {
            let v = if k == "sasl.password" {
                format!("${{{PASSWORD_VAR}}}")
            } else {
                v
            };
            lines.push_str(&format!("\"{k}\" = \"{v}\"\n"));
        }
        Ok(lines)
    }

    /// Creates `topic`, replicated on every node; with `leader`, each
    /// partition's replica list starts with it (its preferred leader).
    async fn create_topic(&self, topic: &str, partitions: i32, leader: Option<u32>) -> Res<()> {
        let ids: Vec<i32> = self.kc.node_ids().iter().map(|i| *i as i32).collect();
        let replicas: Vec<i32> = match leader {
            Some(l) => std::iter::once(l as i32)
                .chain(ids.iter().copied().filter(|i| *i != l as i32))
                .collect(),
            None => Vec::new(),
        };
        let lists: Vec<&[i32]> = (0..partitions).map(|_| replicas.as_slice()).collect();
        let replication = match leader {
            Some(_) => TopicReplication::Variable(&lists),
            None => TopicReplication::Fixed(ids.len() as i32),
        };
        let new = NewTopic::new(topic, partitions, replication);
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for r in self
            .kc
            .admin()
            .create_topics([&new], &opts)
            .await
            .map_err(|e| format!("create topic {topic}: {e}"))?
        {
            r.map_err(|(t, e)| format!("create topic {t}: {e}"))?;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        for p in 0..partitions {
            while self.kc.leader(topic, p).ok().flatten().is_none() {
                if Instant::now() > deadline {
                    return Err(format!("{topic}/{p} has no leader 60 s after its creation"));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }

    /// The node leading partition 0 of the stage's items topic now.
    pub(super) fn leader_of(&self, st: &Stage) -> Res<u32> {
        self.kc
            .leader(&st.topics.items, 0)?
            .map(|l| l as u32)
            .ok_or_else(|| format!("{}/0 has no leader", st.topics.items))
    }

    /// Waits until `topic`/0 is led by a node other than `gone`; returns
    /// the seconds that took.
    pub(super) async fn new_leader(&self, topic: &str, gone: u32, within: Duration) -> Res<f64> {
        let t = Instant::now();
        loop {
            if let Ok(Some(l)) = self.kc.leader(topic, 0) {
                if l as u32 != gone {
                    return Ok(t.elapsed().as_secs_f64());
                }
            }
            if t.elapsed() > within {
                return Err(format!(
                    "{topic}/0 still led by node {gone} {} s after it died",
                    within.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A local graph root in the phase's directory.
pub(super) fn local_graph(env: &Env, name: &str) -> (GraphRoot, String) {
    let root = env.work.join(name).join("graph");
    (GraphRoot::local(&root.display().to_string()), String::new())
}

/// Runs the cluster phase `phase`, then makes the cluster whole again.
pub(crate) async fn run(
    env: &Env,
    c: &mut Cluster,
    phase: &str,
    seed: u64,
    r: &mut PhaseReport,
) -> Res<()> {
    let ran = match phase {
        "rolling-restart" => restarts::rolling_restart(env, c, seed, r).await,
        "kill-leader" => kills::kill_leader(env, c, seed, r).await,
        "kill-controller" => kills::kill_controller(env, c, seed, r).await,
        "kill-coordinator" => kills::kill_coordinator(env, c, seed, r).await,
        "cut-leader" => cuts::cut_leader(env, c, seed, r).await,
        "cut-cluster" => cuts::cut_cluster(env, c, seed, r).await,
        "slow-network" => network::slow_network(env, c, seed, r).await,
        "zombie" => zombie::zombie(env, c, seed, r).await,
        "min-isr" => quorum::min_isr(env, c, seed, r).await,
        "members-consumer" => members::members(env, c, seed, "consumer", r).await,
        "members-classic" => members::members(env, c, seed, "range", r).await,
        other => Err(format!(
            "unknown cluster phase {other} (the set: {})",
            PHASES.join(",")
        )),
    };
    let restored = c.restore();
    ran.and(restored)
}

/// What keeps graphsink running while a phase waits: one process
/// ([`Supervised`]) or several members ([`members::Crew`]), each restarted
/// as an orchestrator would when it exits on its own (each such exit is
/// reported).
pub(super) trait Keeper {
    /// Waits until `done` says yes (asked every 500 ms) or `limit`
    /// passes, restarting what exits; whether it said yes.
    async fn hold_until(
        &mut self,
        st: &Stage,
        env: &Env,
        r: &mut PhaseReport,
        limit: Duration,
        done: impl FnMut() -> bool,
    ) -> Res<bool>;

    /// The last lines graphsink wrote, for an error.
    fn tail(&self) -> String;

    /// Waits `d`, restarting what exits.
    async fn hold(&mut self, st: &Stage, env: &Env, r: &mut PhaseReport, d: Duration) -> Res<()> {
        self.hold_until(st, env, r, d, || false).await.map(|_| ())
    }
}

/// One graphsink on a phase's stage.
pub(super) struct Supervised {
    pub p: Process,
    extra: Vec<String>,
}

impl Supervised {
    /// `graphsink run` (with `extra` arguments and a failpoint, if any).
    pub(super) fn start(
        st: &Stage,
        env: &Env,
        extra: &[&str],
        failpoint: Option<String>,
    ) -> Res<Supervised> {
        Ok(Supervised {
            p: st.spawn_with(env, extra, failpoint)?,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        })
    }

    fn restart(&mut self, st: &Stage, env: &Env, r: &mut PhaseReport, e: Exit) -> Res<()> {
        r.own_exits.push(format!("{e:?}: {}", self.p.tail(1)));
        println!("   graphsink exited on its own ({e:?}); started again");
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        self.p = st.spawn_with(env, &extra, None)?;
        Ok(())
    }

    /// The end of the phase: a graceful stop, the final run and the full
    /// check.
    pub(super) async fn finish(self, st: &mut Stage, env: &Env, r: &mut PhaseReport) -> Res<()> {
        st.stop_and_finish(self.p, env, None, r).await
    }
}

impl Keeper for Supervised {
    async fn hold_until(
        &mut self,
        st: &Stage,
        env: &Env,
        r: &mut PhaseReport,
        limit: Duration,
        mut done: impl FnMut() -> bool,
    ) -> Res<bool> {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if done() {
                return Ok(true);
            }
            let left = until.saturating_duration_since(Instant::now());
            if let Some(e) = self.p.wait_for(left.min(Duration::from_millis(500))).await {
                self.restart(st, env, r, e)?;
            }
        }
        Ok(done())
    }

    fn tail(&self) -> String {
        self.p.tail(5)
    }
}

/// The `/ready` answer of graphsink serving on [`HTTP`] in `host`'s
/// namespace: (HTTP status, body); `None` if nothing answered.
pub(super) fn ready(host: &graphsink_testkit::Host) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let addr = HTTP.parse().ok()?;
    let mut s = host.connect(addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /ready HTTP/1.0\r\nHost: graphsink\r\n\r\n")
        .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Some((status, body.trim().to_string()))
}

/// The first line of `log` (from byte `from` on) that contains `needle`.
pub(super) fn log_line(log: &Path, from: u64, needle: &str) -> Option<String> {
    let text = std::fs::read(log).ok()?;
    let start = (from as usize).min(text.len());
    let text = crate::cluster::strip_ansi(&String::from_utf8_lossy(&text[start..]));
    text.lines()
        .find(|l| l.contains(needle))
        .map(str::to_string)
}
