//! Several members of one group: kill -9, a freeze past the session, a
//! graceful leave and joins, and how long each hand-off took (read from
//! the members' logs).

use std::path::Path;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::secs;
use crate::check::{self, Res};
use crate::cluster::{self, Broker, Process};
use crate::report::PhaseReport;
use crate::stage::{keep_on_failure, unwedge, Env, Stage, SESSION};

/// Several members of one group on a partition-sharded graph, under the
/// continuous producer: kill -9 of one (its partitions move after the
/// session timeout), SIGSTOP of another past its session then SIGCONT (it
/// must find itself fenced and rejoin, never writing a shard it lost), a
/// graceful leave (SIGTERM) and joins. Then every member stops and the
/// usual final run and check judge the graph against the stream.
pub(super) async fn members(env: &Env, seed: u64, r: &mut PhaseReport) -> Res<()> {
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
    shard_by_partition(&st, &env.args.group_protocol)?;
    r.group_protocol = env.args.group_protocol.clone();
    let sampler = check::CommitSampler::start(
        &main.reach(),
        &st.group,
        st.topics
            .mapped()
            .into_iter()
            .map(|(t, p)| (t.to_string(), p))
            .collect(),
    )?;
    let mut g = Group {
        env,
        live: Vec::new(),
        spawned: 0,
        events: Vec::new(),
        rng: StdRng::seed_from_u64(seed),
    };
    for _ in 0..3 {
        let m = g.spawn(&st)?;
        g.live.push(m);
    }
    tokio::time::sleep(secs(&mut g.rng, 8.0, 12.0)).await;
    for round in 1..=env.args.member_rounds {
        g.kill_one(&st, &mut main, r, round).await?;
        g.freeze_one(&st, &mut main, r, round).await?;
        g.leave_and_join(&st, &mut main, r, round).await?;
    }
    // The 20 s after the last event have passed (the sleeps above).
    for (what, at) in std::mem::take(&mut g.events) {
        let (rate, pause, lag) = sampler.around(at, Duration::from_secs(20));
        r.rebalances.push((what, rate, pause, lag));
    }
    drop(sampler);
    g.respawn_exited(&st, &mut main, r).await?;
    g.stop_all(r).await;
    tokio::time::sleep(SESSION + Duration::from_secs(1)).await;
    st.finish(env, Some(&mut main), r).await?;
    keep_on_failure(&st, r);
    Ok(())
}

/// The stage's config with partition sharding and the group protocol
/// `protocol` (`--group-protocol`).
pub(super) fn shard_by_partition(st: &Stage, protocol: &str) -> Res<()> {
    let text = std::fs::read_to_string(&st.config).map_err(|e| e.to_string())?;
    let text = text.replace("[wal]\nbuckets = 2", "[wal]\nsharding = \"partition\"");
    let session = "\"session.timeout.ms\" = \"6000\"";
    let text = match protocol {
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
    std::fs::write(&st.config, text).map_err(|e| e.to_string())
}

/// The phase's members: the live ones, numbered in the order they
/// started, and the group's events so far, for the commit rate after each.
struct Group<'a> {
    env: &'a Env,
    live: Vec<(usize, Process)>,
    spawned: usize,
    events: Vec<(String, std::time::SystemTime)>,
    rng: StdRng,
}

impl Group<'_> {
    /// Starts the next member, with a log of its own.
    fn spawn(&mut self, st: &Stage) -> Res<(usize, Process)> {
        self.spawned += 1;
        let log = st.dir.join(format!("graphsink-{}.log", self.spawned));
        let cfg = st.config.display().to_string();
        Ok((
            self.spawned,
            Process::spawn(&self.env.graphsink, &["run", "--config", &cfg], &[], &log)?,
        ))
    }

    /// kill -9 of one member; a replacement joins after its session.
    async fn kill_one(
        &mut self,
        st: &Stage,
        main: &mut Broker,
        r: &mut PhaseReport,
        round: u32,
    ) -> Res<()> {
        self.respawn_exited(st, main, r).await?;
        let i = self.rng.random_range(0..self.live.len());
        let (n, mut p) = self.live.remove(i);
        let at = std::time::SystemTime::now();
        p.kill().await;
        r.kills += 1;
        self.events.push((format!("kill -9 of member {n}"), at));
        println!("   round {round}: member {n} killed -9");
        r.handoffs.push((
            format!("kill -9 of member {n}"),
            handoff(st, n, &self.live, at).await,
        ));
        let m = self.spawn(st)?;
        self.live.push(m);
        tokio::time::sleep(secs(&mut self.rng, 6.0, 10.0)).await;
        Ok(())
    }

    /// One member frozen past its session, then resumed.
    async fn freeze_one(
        &mut self,
        st: &Stage,
        main: &mut Broker,
        r: &mut PhaseReport,
        round: u32,
    ) -> Res<()> {
        self.respawn_exited(st, main, r).await?;
        let live = &mut self.live;
        let i = self.rng.random_range(0..live.len());
        let n = live[i].0;
        live[i].1.signal(libc::SIGSTOP);
        let at = std::time::SystemTime::now();
        self.events.push((format!("SIGSTOP of member {n}"), at));
        println!("   round {round}: member {n} frozen (SIGSTOP)");
        let others: Vec<&(usize, Process)> = live.iter().filter(|(m, _)| *m != n).collect();
        let took = handoff_of(st, n, &others, at).await;
        r.handoffs.push((format!("SIGSTOP of member {n}"), took));
        tokio::time::sleep((SESSION + Duration::from_secs(4)).saturating_sub(
            Duration::from_secs_f64(if took.is_finite() { took } else { 0.0 }),
        ))
        .await;
        live[i].1.signal(libc::SIGCONT);
        r.freezes.push(SESSION.as_secs() + 4);
        println!("   round {round}: member {n} resumed (SIGCONT)");
        tokio::time::sleep(secs(&mut self.rng, 8.0, 12.0)).await;
        Ok(())
    }

    /// A graceful leave, then a join.
    async fn leave_and_join(
        &mut self,
        st: &Stage,
        main: &mut Broker,
        r: &mut PhaseReport,
        round: u32,
    ) -> Res<()> {
        self.respawn_exited(st, main, r).await?;
        let i = self.rng.random_range(0..self.live.len());
        let (n, mut p) = self.live.remove(i);
        self.events
            .push((format!("leave of member {n}"), std::time::SystemTime::now()));
        let e = p.stop(Duration::from_secs(30)).await;
        println!("   round {round}: member {n} left (SIGTERM): {e:?}");
        if e.code != Some(0) {
            r.own_exits
                .push(format!("member {n} on SIGTERM: {e:?}: {}", p.tail(3)));
        }
        tokio::time::sleep(secs(&mut self.rng, 4.0, 8.0)).await;
        let at = std::time::SystemTime::now();
        let joined = self.spawn(st)?;
        self.events
            .push((format!("join of member {}", joined.0), at));
        let log = st.dir.join(format!("graphsink-{}.log", joined.0));
        self.live.push(joined);
        tokio::time::sleep(secs(&mut self.rng, 8.0, 12.0)).await;
        let took = group_events(&log)
            .into_iter()
            .find(|(t, assigned, parts)| *assigned && !parts.is_empty() && *t >= at)
            .map_or(f64::NAN, |(t, _, _)| {
                t.duration_since(at).unwrap_or_default().as_secs_f64()
            });
        r.handoffs.push((
            format!("join of member {}", self.live.last().unwrap().0),
            took,
        ));
        Ok(())
    }

    /// Members that exited on their own are reported, and restarted as an
    /// orchestrator would (after unwedging the broker if they said it was
    /// stuck).
    async fn respawn_exited(
        &mut self,
        st: &Stage,
        main: &mut Broker,
        r: &mut PhaseReport,
    ) -> Res<()> {
        for i in 0..self.live.len() {
            let slot = &mut self.live[i];
            if let Some(e) = slot.1.wait_for(Duration::ZERO).await {
                let tail = slot.1.tail(1);
                r.own_exits
                    .push(format!("member {}: {e:?}: {tail}", slot.0));
                unwedge(main, &tail, r)?;
                self.live[i] = self.spawn(st)?;
            }
        }
        Ok(())
    }

    /// Every member stopped (SIGTERM); one that fails to stop cleanly is
    /// reported.
    async fn stop_all(self, r: &mut PhaseReport) {
        for (n, mut p) in self.live {
            let e = p.stop(Duration::from_secs(30)).await;
            if e.code != Some(0) && e.signal.is_none() {
                r.own_exits
                    .push(format!("member {n} at the end: {e:?}: {}", p.tail(3)));
            }
        }
    }
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
