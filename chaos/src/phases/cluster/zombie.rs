//! A zombie made by the network: of three members on a partition-sharded
//! graph, the one folding is cut off from every node (not from the graph's
//! storage) while the others go on. The group moves its partitions after
//! its session; their new owners claim its shards, which fences whatever
//! it still writes there. It must find out (its partitions revoked as lost
//! when its session ends, or a write fenced: its log says which), rejoin
//! once healed, and double nothing (the checker's audit).

use std::time::Duration;

use graphsink_testkit::Cut;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

use super::super::members::shard_by_partition;
use super::members::Crew;
use super::meter::{now, RECOVER_WITHIN};
use super::{local_graph, log_line, Cluster, Keeper, Meter};
use crate::check::Res;
use crate::report::PhaseReport;
use crate::stage::{keep_on_failure, Env, SESSION};

/// How long the zombie is cut off: several sessions (6 s) and folds.
const CUT_FOR: Duration = Duration::from_secs(30);

pub(super) async fn zombie(env: &Env, c: &mut Cluster, seed: u64, r: &mut PhaseReport) -> Res<()> {
    let name = "zombie";
    let mut rng = StdRng::seed_from_u64(seed);
    let end = c.member_host("end")?;
    let preferred = *c.kc.node_ids().choose(&mut rng).expect("nodes");
    let mut st = c
        .stage(env, name, seed, &end, preferred, local_graph(env, name))
        .await?;
    shard_by_partition(&st, "range")?;
    let mut meter = Meter::start(c, &st)?;
    let mut crew = Crew::new(c)?;
    for _ in 0..3 {
        crew.spawn(c, &st, env)?;
    }
    meter.warm_up(&mut crew, &st, env, r).await?;

    // The folder, if a log says which: it writes the most when cut off.
    let i = crew
        .live
        .iter()
        .position(|m| log_line(&crew.log_of(&st, m.n), 0, "event=\"folded\"").is_some())
        .unwrap_or_else(|| rng.random_range(0..crew.live.len()));
    let n = crew.live[i].n;
    let log = crew.log_of(&st, n);
    let from = std::fs::metadata(&log).map_or(0, |m| m.len());
    println!(
        "   member {n} cut off from every node for {} s; its storage stays",
        CUT_FOR.as_secs()
    );
    let start = now();
    c.kc.partition(crew.live[i].host.host(), None, Cut::Blackhole)?;
    let held = crew.hold(&st, env, r, CUT_FOR).await;
    c.kc.heal(crew.live[i].host.host())?;
    held?;
    meter.fault(
        "a member cut off from the cluster (a zombie), 30 s",
        1,
        start,
        now(),
    );
    meter.settle(&mut crew, &st, env, r).await?;
    // It rejoins by itself: partitions assigned to it again. Until then
    // its connections may still be stalled by the cut (a connection begun
    // during it waits out socket.connection.setup.timeout.ms, 30 s), and a
    // stop there is a stop during a dead-letter outage (exit 1, RELIABILITY.md
    // finding 4), not what this phase tests.
    if !crew
        .hold_until(&st, env, r, RECOVER_WITHIN, || {
            log_line(&log, from, "event=\"assigned\"").is_some()
        })
        .await?
    {
        r.errors.push(format!(
            "the zombie (member {n}) was not assigned partitions again within {} s: {}",
            RECOVER_WITHIN.as_secs(),
            crew.tail()
        ));
    }
    // What the zombie learnt, in its own words: that its assignment was
    // lost (librdkafka ends its session while it is cut off) or that a
    // write was fenced by a shard's new owner; then its rejoin.
    let said = |needle: &str| log_line(&log, from, needle).map(|l| l.trim().to_string());
    let fenced = said("event=\"fenced\"");
    let lost = said("assignment lost");
    let revoked = said("event=\"revoked\"");
    if fenced.is_none() && lost.is_none() && revoked.is_none() {
        r.errors.push(format!(
            "the zombie (member {n}) never said it was fenced or lost its partitions: {}",
            crew.tail()
        ));
    }
    let seen: Vec<String> = [lost, fenced, revoked, said("event=\"assigned\"")]
        .into_iter()
        .flatten()
        .collect();
    r.notes.push(format!(
        "the zombie (member {n}) after the cut: {}",
        seen.join(" | ")
    ));
    meter.report(r);
    crew.stop_all(r).await;
    tokio::time::sleep(SESSION + Duration::from_secs(1)).await;
    st.finish(env, None, r).await?;
    keep_on_failure(&st, r);
    Ok(())
}
