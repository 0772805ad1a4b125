//! A rolling restart of every broker, as an upgrade does it: one node at a
//! time a controlled shutdown (SIGTERM: it hands its leaderships over
//! first), a start on its kept data, and a wait until every replica is in
//! sync again before the next; graphsink and the producer go on.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::super::secs;
use super::meter::now;
use super::{local_graph, Cluster, Keeper, Meter, Supervised, IN_SYNC_WITHIN};
use crate::check::Res;
use crate::report::PhaseReport;
use crate::stage::Env;

pub(super) async fn rolling_restart(
    env: &Env,
    c: &mut Cluster,
    seed: u64,
    r: &mut PhaseReport,
) -> Res<()> {
    let name = "rolling-restart";
    let mut rng = StdRng::seed_from_u64(seed);
    let mut order = c.kc.node_ids();
    order.shuffle(&mut rng);
    let m1 = c.member_host("m1")?;
    let mut st = c
        .stage(env, name, seed, &m1, order[0], local_graph(env, name))
        .await?;
    let mut meter = Meter::start(c, &st)?;
    let mut g = Supervised::start(&st, env, &[], None)?;
    meter.warm_up(&mut g, &st, env, r).await?;
    let start = now();
    for id in &order {
        println!("   node {id}: controlled shutdown, start, in sync");
        c.kc.stop_node(*id)?;
        // Down as long as an upgrade's binary swap takes.
        g.hold(&st, env, r, secs(&mut rng, 1.0, 5.0)).await?;
        c.kc.start_node(*id)?;
        c.kc.wait_in_sync(IN_SYNC_WITHIN)?;
        r.restarts += 1;
    }
    meter.fault(
        "rolling restart (controlled shutdown, start, in sync; each node)",
        order.len() as u32,
        start,
        now(),
    );
    meter.settle(&mut g, &st, env, r).await?;
    meter.report(r);
    g.finish(&mut st, env, r).await
}
