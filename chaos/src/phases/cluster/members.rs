//! Members in namespaces of their own writing one graph on an `s3://`
//! root (moto, on a host of its own) under partition sharding, with
//! KIP-848 (`group.protocol = "consumer"`) or the classic protocol: a
//! kill -9 of one member (a replacement starts at once, as an orchestrator
//! does), a partition of one member (cut off from every host, the cluster
//! and S3 alike, for 30 s), and a rolling restart of the brokers beneath
//! them. `Crew` (the members, each on its host) serves the zombie phase
//! too.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use graphsink_testkit::{ClientHost, Cut, S3Server};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};

use super::super::members::shard_by_partition;
use super::super::secs;
use super::meter::now;
use super::{Cluster, Keeper, Meter, IN_SYNC_WITHIN};
use crate::check::{GraphRoot, Res};
use crate::cluster::Process;
use crate::report::PhaseReport;
use crate::stage::{Env, Stage, SESSION};

/// How many members run at once.
const MEMBERS: usize = 3;

/// How long a member stays cut off.
const PARTITION_FOR: Duration = Duration::from_secs(30);

/// The bucket of the graphs on S3.
const BUCKET: &str = "graphsink-chaos";

/// A member: its number, its host, its process.
pub(super) struct Member {
    pub n: usize,
    pub host: ClientHost,
    pub p: Process,
}

/// The members of one group, each on a client host of its own, restarted
/// on their host when they exit on their own.
pub(super) struct Crew {
    pub live: Vec<Member>,
    spawned: usize,
    env_vars: Vec<(String, String)>,
}

impl Crew {
    pub(super) fn new(c: &Cluster) -> Res<Crew> {
        Ok(Crew {
            live: Vec::new(),
            spawned: 0,
            env_vars: c.launch_env()?,
        })
    }

    fn log(st: &Stage, n: usize) -> PathBuf {
        st.dir.join(format!("graphsink-{n}.log"))
    }

    fn start_on(&self, host: &ClientHost, st: &Stage, env: &Env, n: usize) -> Res<Process> {
        let vars: Vec<(&str, String)> = self
            .env_vars
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        let cfg = st.config.display().to_string();
        Process::spawn_on(
            Some(host.host()),
            &env.graphsink,
            &["run", "--config", &cfg],
            &vars,
            &Crew::log(st, n),
        )
    }

    /// A new member on a new host.
    pub(super) fn spawn(&mut self, c: &Cluster, st: &Stage, env: &Env) -> Res<usize> {
        self.spawned += 1;
        let n = self.spawned;
        let host = c.member_host(&format!("m{n}"))?;
        let p = self.start_on(&host, st, env, n)?;
        self.live.push(Member { n, host, p });
        Ok(n)
    }

    /// Member `n`'s log.
    pub(super) fn log_of(&self, st: &Stage, n: usize) -> PathBuf {
        Crew::log(st, n)
    }

    /// Every member stopped (SIGTERM); an unclean stop is reported.
    pub(super) async fn stop_all(self, r: &mut PhaseReport) {
        for mut m in self.live {
            let e = m.p.stop(Duration::from_secs(30)).await;
            if e.code != Some(0) && e.signal.is_none() {
                r.own_exits
                    .push(format!("member {} at the end: {e:?}: {}", m.n, m.p.tail(3)));
            }
        }
    }
}

impl Keeper for Crew {
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
            for i in 0..self.live.len() {
                if let Some(e) = self.live[i].p.wait_for(Duration::ZERO).await {
                    let m = &self.live[i];
                    r.own_exits
                        .push(format!("member {}: {e:?}: {}", m.n, m.p.tail(1)));
                    println!("   member {} exited on its own ({e:?}); started again", m.n);
                    let p = self.start_on(&self.live[i].host, st, env, m.n)?;
                    self.live[i].p = p;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(done())
    }

    fn tail(&self) -> String {
        self.live
            .iter()
            .map(|m| format!("member {}: {}", m.n, m.p.tail(2)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// An `s3://` root on a moto server of its own host: the `[graph]`
/// lines for graphsink, and how the checker reads it (from the admin's
/// host, which no fault cuts off).
fn s3_graph(c: &Cluster, s3: &S3Server, name: &str, seed: u64) -> (GraphRoot, String) {
    let options = [
        ("aws_endpoint", s3.endpoint.as_str()),
        ("aws_region", graphsink_testkit::s3::REGION),
        ("aws_access_key_id", graphsink_testkit::s3::ACCESS_KEY),
        ("aws_secret_access_key", graphsink_testkit::s3::SECRET_KEY),
        ("aws_allow_http", "true"),
    ];
    let mut lines = String::from("\n[graph.storage_options]\n");
    for (k, v) in options {
        lines.push_str(&format!("{k} = \"{v}\"\n"));
    }
    let storage: HashMap<String, String> = options
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let root = GraphRoot {
        uri: format!("s3://{BUCKET}/{name}-{seed}"),
        storage,
        host: Some(c.kc.admin_host().host().clone()),
    };
    (root, lines)
}

/// The phase: `protocol` is `consumer` (KIP-848) or `range` (classic).
pub(super) async fn members(
    env: &Env,
    c: &mut Cluster,
    seed: u64,
    protocol: &str,
    r: &mut PhaseReport,
) -> Res<()> {
    let name = format!(
        "members-{}",
        if protocol == "consumer" {
            "consumer"
        } else {
            "classic"
        }
    );
    r.group_protocol = protocol.to_string();
    let mut rng = StdRng::seed_from_u64(seed);
    let s3_host = c.kc.network().add_host("s3")?;
    let s3 = S3Server::start_on(
        &s3_host,
        env.args.moto.clone(),
        Some(&env.work.join(format!("moto-{name}.log"))),
    )?;
    let endpoint = s3.endpoint.clone();
    s3.reach(move || {
        graphsink_testkit::s3::create_bucket(&endpoint, BUCKET)?;
        graphsink_testkit::s3::check_conditional_puts(&endpoint, BUCKET)
    })??;
    // The final run and the checker's folds run on a host of their own.
    let end = c.member_host("end")?;
    let preferred = *c.kc.node_ids().choose(&mut rng).expect("nodes");
    let graph = s3_graph(c, &s3, &name, seed);
    // moto, on the 2 busy cores, keeps up with three members folding a
    // third of the usual rate (the final run's fold must end in 3 minutes).
    let rate = (env.args.rate / 3).max(20);
    let mut st = c
        .stage_at(env, &name, seed, &end, preferred, graph, rate)
        .await?;
    shard_by_partition(&st, protocol)?;
    let mut meter = Meter::start(c, &st)?;
    let mut crew = Crew::new(c)?;
    for _ in 0..MEMBERS {
        crew.spawn(c, &st, env)?;
    }
    meter.warm_up(&mut crew, &st, env, r).await?;

    // A kill -9, and a replacement at once.
    let i = rng.random_range(0..crew.live.len());
    let mut gone = crew.live.remove(i);
    println!("   kill -9 of member {}", gone.n);
    let at = now();
    gone.p.kill().await;
    r.kills += 1;
    drop(gone);
    crew.spawn(c, &st, env)?;
    meter.fault("kill -9 of one member (a replacement starts)", 1, at, at);
    meter.settle(&mut crew, &st, env, r).await?;

    // One member cut off from every host.
    let i = rng.random_range(0..crew.live.len());
    let n = crew.live[i].n;
    println!(
        "   member {n} cut off from every host (the cluster and S3) for {} s",
        PARTITION_FOR.as_secs()
    );
    let start = now();
    c.kc.network()
        .isolate(crew.live[i].host.host(), Cut::Blackhole)?;
    let held = crew.hold(&st, env, r, PARTITION_FOR).await;
    c.kc.network().rejoin(crew.live[i].host.host())?;
    held?;
    meter.fault(
        "one member cut off from the cluster and S3, 30 s",
        1,
        start,
        now(),
    );
    meter.settle(&mut crew, &st, env, r).await?;

    // A rolling restart of the brokers beneath them.
    let mut order = c.kc.node_ids();
    order.shuffle(&mut rng);
    let start = now();
    for id in &order {
        println!("   node {id}: controlled shutdown, start, in sync");
        c.kc.stop_node(*id)?;
        crew.hold(&st, env, r, secs(&mut rng, 1.0, 5.0)).await?;
        c.kc.start_node(*id)?;
        c.kc.wait_in_sync(IN_SYNC_WITHIN)?;
        r.restarts += 1;
    }
    meter.fault(
        "rolling restart of the brokers beneath the members",
        order.len() as u32,
        start,
        now(),
    );
    meter.settle(&mut crew, &st, env, r).await?;
    meter.report(r);
    crew.stop_all(r).await;
    tokio::time::sleep(SESSION + Duration::from_secs(1)).await;
    st.finish(env, None, r).await?;
    crate::stage::keep_on_failure(&st, r);
    drop(s3);
    Ok(())
}
