//! kill -9 of a node that matters to graphsink: the leader of its
//! partitions, the active controller (the KRaft quorum's leader; its
//! broker goes with it, as the nodes are combined), and the transaction
//! coordinator of the fold-reject producer's `transactional.id` in the
//! middle of a delivery. Each node comes back on its kept data once
//! graphsink has recovered without it.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::SeedableRng;

use super::meter::now;
use super::{local_graph, log_line, Cluster, Keeper, Meter, Supervised, IN_SYNC_WITHIN};
use crate::check::Res;
use crate::report::PhaseReport;
use crate::stage::{Env, Stage};

/// How long the cluster may take to elect a new leader or controller.
const ELECTION_WITHIN: Duration = Duration::from_secs(120);

/// The failpoint that makes graphsink stop (SIGSTOP) inside its first
/// fold-reject delivery: every reject produced in the transaction, the
/// commit not yet sent.
const INSIDE_A_DELIVERY: &str = "fold.dead_letters_before_commit=stop";

pub(super) async fn kill_leader(
    env: &Env,
    c: &mut Cluster,
    seed: u64,
    r: &mut PhaseReport,
) -> Res<()> {
    let name = "kill-leader";
    let mut rng = StdRng::seed_from_u64(seed);
    let preferred = *c.kc.node_ids().choose(&mut rng).expect("nodes");
    let m1 = c.member_host("m1")?;
    let mut st = c
        .stage(env, name, seed, &m1, preferred, local_graph(env, name))
        .await?;
    let mut meter = Meter::start(c, &st)?;
    let mut g = Supervised::start(&st, env, &[], None)?;
    meter.warm_up(&mut g, &st, env, r).await?;
    let leader = c.leader_of(&st)?;
    println!("   kill -9 of node {leader}, the leader of every partition graphsink reads");
    c.kc.kill_node(leader)?;
    r.kills += 1;
    let at = now();
    meter.fault("kill -9 of the partitions' leader", 1, at, at);
    let took = c
        .new_leader(&st.topics.items, leader, ELECTION_WITHIN)
        .await?;
    r.notes.push(format!(
        "a new leader of {}/0 {took:.1} s after the kill",
        st.topics.items
    ));
    back_after_recovery(c, &meter, &mut g, &st, env, r, leader).await?;
    meter.report(r);
    g.finish(&mut st, env, r).await
}

pub(super) async fn kill_controller(
    env: &Env,
    c: &mut Cluster,
    seed: u64,
    r: &mut PhaseReport,
) -> Res<()> {
    let name = "kill-controller";
    let controller = c.kc.active_controller()?;
    // graphsink's partitions led elsewhere: this kill is the controller's
    // (and its broker's followers and coordinators), not their leader's.
    let mut rng = StdRng::seed_from_u64(seed);
    let others: Vec<u32> =
        c.kc.node_ids()
            .into_iter()
            .filter(|i| *i != controller)
            .collect();
    let preferred = *others.choose(&mut rng).expect("three nodes");
    let m1 = c.member_host("m1")?;
    let mut st = c
        .stage(env, name, seed, &m1, preferred, local_graph(env, name))
        .await?;
    let mut meter = Meter::start(c, &st)?;
    let mut g = Supervised::start(&st, env, &[], None)?;
    meter.warm_up(&mut g, &st, env, r).await?;
    let controller = c.kc.active_controller()?;
    println!("   kill -9 of node {controller}, the active controller");
    c.kc.kill_node(controller)?;
    r.kills += 1;
    let at = now();
    meter.fault("kill -9 of the active controller", 1, at, at);
    let t = Instant::now();
    let elected = loop {
        // Kafka's own tool; it fails while the quorum has no leader.
        match c.kc.active_controller() {
            Ok(id) if id != controller => break id,
            _ if t.elapsed() > ELECTION_WITHIN => {
                return Err(format!(
                    "no new active controller {} s after node {controller} died",
                    ELECTION_WITHIN.as_secs()
                ))
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    r.notes.push(format!(
        "node {elected} became the active controller; seen {:.1} s after the kill (each look is a JVM start, ~3 s)",
        t.elapsed().as_secs_f64()
    ));
    back_after_recovery(c, &meter, &mut g, &st, env, r, controller).await?;
    meter.report(r);
    g.finish(&mut st, env, r).await
}

/// graphsink stops itself (SIGSTOP, its failpoint) inside its first
/// fold-reject delivery, with the rejects produced in the transaction and
/// the commit not sent; the coordinator of its `transactional.id` (named
/// in its log) is killed -9, then graphsink resumes (SIGCONT) and must
/// finish the delivery at the coordinator that takes over, or abort it and
/// deliver again: a `read_committed` reader sees each reject once.
pub(super) async fn kill_coordinator(
    env: &Env,
    c: &mut Cluster,
    seed: u64,
    r: &mut PhaseReport,
) -> Res<()> {
    let name = "kill-coordinator";
    let mut rng = StdRng::seed_from_u64(seed);
    let preferred = *c.kc.node_ids().choose(&mut rng).expect("nodes");
    let m1 = c.member_host("m1")?;
    let mut st = c
        .stage(env, name, seed, &m1, preferred, local_graph(env, name))
        .await?;
    let mut meter = Meter::start(c, &st)?;
    // A first graphsink gives the lag a baseline; the one that replaces it
    // stops in its first delivery, which comes within seconds of its start.
    let mut g = Supervised::start(&st, env, &[], None)?;
    meter.warm_up(&mut g, &st, env, r).await?;
    let e = g.p.stop(Duration::from_secs(60)).await;
    if e.code != Some(0) {
        r.own_exits
            .push(format!("stop before the failpoint's run: {e:?}"));
    }
    let mut g = Supervised::start(&st, env, &[], Some(INSIDE_A_DELIVERY.into()))?;
    let pid = g.p.pid();
    if !g
        .hold_until(&st, env, r, Duration::from_secs(180), || stopped(pid))
        .await?
    {
        return Err(format!(
            "graphsink did not reach a fold-reject delivery within 180 s: {}",
            g.p.tail(5)
        ));
    }
    let id = transactional_id(&st)?;
    let coordinator =
        c.kc.transaction_coordinator(&id)?
            .ok_or_else(|| format!("{id} has no coordinator"))? as u32;
    println!("   graphsink stopped inside a delivery; kill -9 of node {coordinator}, the coordinator of {id}");
    c.kc.kill_node(coordinator)?;
    r.kills += 1;
    let at = now();
    let log_at = std::fs::metadata(&st.log).map_or(0, |m| m.len());
    g.p.signal(libc::SIGCONT);
    meter.fault(
        "kill -9 of the dead-letter transaction coordinator inside a delivery",
        1,
        at,
        at,
    );
    back_after_recovery(c, &meter, &mut g, &st, env, r, coordinator).await?;
    r.notes.push(
        match log_line(&st.log, log_at, "fold-reject transaction failed") {
            Some(l) => format!(
                "graphsink's first failed fold-reject round after the kill (it retries): {}",
                l.trim()
            ),
            None => "no fold-reject round failed after the kill".into(),
        },
    );
    meter.report(r);
    g.finish(&mut st, env, r).await
}

/// After a kill: graphsink recovers without node `id`, then the node
/// starts again on its kept data and catches up, and graphsink goes on.
async fn back_after_recovery(
    c: &mut Cluster,
    meter: &Meter,
    g: &mut Supervised,
    st: &Stage,
    env: &Env,
    r: &mut PhaseReport,
    id: u32,
) -> Res<()> {
    meter.settle(g, st, env, r).await?;
    println!("   node {id} starts again");
    c.kc.start_node(id)?;
    c.kc.wait_in_sync(IN_SYNC_WITHIN)?;
    g.hold(st, env, r, Duration::from_secs(10)).await
}

/// Whether process `pid` is stopped (state `T` in /proc/PID/stat).
fn stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
        .unwrap_or(false)
}

/// The fold-reject producer's `transactional.id`, as graphsink logged it
/// when it initialised the producer.
fn transactional_id(st: &Stage) -> Res<String> {
    let line = log_line(&st.log, 0, "fold-reject producer initialised")
        .ok_or("graphsink logged no fold-reject producer")?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("transactional_id="))
        .map(|s| s.trim_matches('"').to_string())
        .ok_or_else(|| format!("no transactional_id in: {line}"))
}
