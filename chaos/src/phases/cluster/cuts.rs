//! graphsink's host cut off by the router (a silent `blackhole`: packets
//! of both directions dropped, as a lost link; connections stall) from the
//! leader of its partitions for 30 s, or from the whole cluster for 60 s,
//! while the producer, on a host of its own, goes on.

use std::time::Duration;

use graphsink_testkit::Cut;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::SeedableRng;

use super::meter::now;
use super::{local_graph, Cluster, Keeper, Meter, Supervised};
use crate::check::Res;
use crate::report::PhaseReport;
use crate::stage::Env;

/// How long graphsink is cut off from its partitions' leader.
const FROM_LEADER: Duration = Duration::from_secs(30);

/// How long graphsink is cut off from every node.
const FROM_CLUSTER: Duration = Duration::from_secs(60);

pub(super) async fn cut_leader(
    env: &Env,
    c: &mut Cluster,
    seed: u64,
    r: &mut PhaseReport,
) -> Res<()> {
    cut(env, c, seed, r, "cut-leader", true).await
}

pub(super) async fn cut_cluster(
    env: &Env,
    c: &mut Cluster,
    seed: u64,
    r: &mut PhaseReport,
) -> Res<()> {
    cut(env, c, seed, r, "cut-cluster", false).await
}

async fn cut(
    env: &Env,
    c: &mut Cluster,
    seed: u64,
    r: &mut PhaseReport,
    name: &str,
    leader_only: bool,
) -> Res<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    let preferred = *c.kc.node_ids().choose(&mut rng).expect("nodes");
    let m1 = c.member_host("m1")?;
    let mut st = c
        .stage(env, name, seed, &m1, preferred, local_graph(env, name))
        .await?;
    let mut meter = Meter::start(c, &st)?;
    let mut g = Supervised::start(&st, env, &[], None)?;
    meter.warm_up(&mut g, &st, env, r).await?;
    let (node, length, what) = if leader_only {
        let leader = c.leader_of(&st)?;
        (
            Some(leader),
            FROM_LEADER,
            format!("graphsink cut off from its partitions' leader (node {leader})"),
        )
    } else {
        (
            None,
            FROM_CLUSTER,
            "graphsink cut off from every node".into(),
        )
    };
    println!("   {what} for {} s", length.as_secs());
    let start = now();
    c.kc.partition(m1.host(), node, Cut::Blackhole)?;
    let held = g.hold(&st, env, r, length).await;
    c.kc.heal(m1.host())?;
    held?;
    let what = format!("{what}, {} s", length.as_secs());
    meter.fault(&what, 1, start, now());
    meter.settle(&mut g, &st, env, r).await?;
    meter.report(r);
    g.finish(&mut st, env, r).await
}
