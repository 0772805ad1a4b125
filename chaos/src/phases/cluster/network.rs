//! A slow, then a flaky network between graphsink and the cluster, made by
//! the Toxiproxy of graphsink's host (the kernel here has no `netem`):
//! 200 ms ± 50 ms more on every answer from every node for a minute, then
//! for another minute connections that stall (`timeout`: no byte passes,
//! closed after a few seconds) or are reset (`reset_peer`), a random share
//! of them, at a random node, changing every few seconds.

use std::time::{Duration, Instant};

use graphsink_testkit::{Stream, Toxic};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use super::super::secs;
use super::meter::now;
use super::{local_graph, Cluster, Keeper, Meter, Supervised};
use crate::check::Res;
use crate::report::PhaseReport;
use crate::stage::Env;

/// How long each half lasts.
const SLOW_FOR: Duration = Duration::from_secs(60);
const FLAKY_FOR: Duration = Duration::from_secs(60);

pub(super) async fn slow_network(
    env: &Env,
    c: &mut Cluster,
    seed: u64,
    r: &mut PhaseReport,
) -> Res<()> {
    let name = "slow-network";
    let mut rng = StdRng::seed_from_u64(seed);
    let ids = c.kc.node_ids();
    let preferred = *ids.choose(&mut rng).expect("nodes");
    let m1 = c.member_host("m1")?;
    let mut st = c
        .stage(env, name, seed, &m1, preferred, local_graph(env, name))
        .await?;
    let mut meter = Meter::start(c, &st)?;
    let mut g = Supervised::start(&st, env, &[], None)?;
    meter.warm_up(&mut g, &st, env, r).await?;

    let latency = Toxic::Latency {
        latency: Duration::from_millis(200),
        jitter: Duration::from_millis(50),
    };
    println!(
        "   200 ms ± 50 ms on every answer to graphsink, {} s",
        SLOW_FOR.as_secs()
    );
    let start = now();
    m1.add_toxic(None, "slow", &latency, Stream::Downstream, 1.0)?;
    let held = g.hold(&st, env, r, SLOW_FOR).await;
    m1.remove_toxic(None, "slow")?;
    held?;
    meter.fault(
        "latency 200 ms ± 50 ms between graphsink and every node, 60 s",
        1,
        start,
        now(),
    );
    meter.settle(&mut g, &st, env, r).await?;

    println!(
        "   stalled and reset connections at random, {} s",
        FLAKY_FOR.as_secs()
    );
    let start = now();
    let t = Instant::now();
    let mut delivered = 0;
    let mut kinds = (0, 0);
    while t.elapsed() < FLAKY_FOR {
        let node = *ids.choose(&mut rng).expect("nodes");
        let toxic = if rng.random_bool(0.5) {
            kinds.0 += 1;
            Toxic::Timeout {
                after: secs(&mut rng, 1.0, 8.0),
            }
        } else {
            kinds.1 += 1;
            Toxic::ResetPeer {
                after: secs(&mut rng, 0.0, 2.0),
            }
        };
        let share = rng.random_range(0.3..0.8);
        m1.add_toxic(Some(node), "flaky", &toxic, Stream::Upstream, share)?;
        delivered += 1;
        let held = g.hold(&st, env, r, secs(&mut rng, 2.0, 6.0)).await;
        m1.remove_toxic(Some(node), "flaky")?;
        held?;
    }
    r.notes.push(format!(
        "{} stall (`timeout`) and {} `reset_peer` toxics, each on 30-80 % of the connections to one node",
        kinds.0, kinds.1
    ));
    meter.fault(
        "stalled (timeout) and reset (reset_peer) connections at random, 60 s",
        delivered,
        start,
        now(),
    );
    meter.settle(&mut g, &st, env, r).await?;
    meter.report(r);
    g.finish(&mut st, env, r).await
}
