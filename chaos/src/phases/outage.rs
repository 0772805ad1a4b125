//! Broker outages while graphsink runs: the broker frozen, the dead-letter
//! broker frozen, the broker restarted with its data kept.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::secs;
use crate::check::Res;
use crate::cluster::{Broker, Exit, Process};
use crate::report::PhaseReport;
use crate::stage::{unwedge, Env, Stage, SESSION};

#[derive(Clone, Copy)]
pub(super) enum Outage {
    Freeze,
    DeadLetters,
    Restarts,
}

impl Outage {
    /// The phase's name (`--phases`).
    fn name(self) -> &'static str {
        match self {
            Outage::Freeze => "freeze",
            Outage::DeadLetters => "dead-letters",
            Outage::Restarts => "restarts",
        }
    }

    /// One entry per outage: its length in seconds (0 for a restart).
    fn steps(self, env: &Env) -> Vec<u64> {
        match self {
            Outage::Freeze => env.args.freezes.clone(),
            Outage::DeadLetters => vec![env.args.dead_letter_outage],
            Outage::Restarts => vec![0; env.args.restarts as usize],
        }
    }

    /// Outage `i` of `d` seconds: a freeze of the broker or of the
    /// dead-letter broker, or a restart of the broker.
    async fn apply(
        self,
        i: usize,
        d: &u64,
        main: &mut Broker,
        dlq: &Broker,
        rng: &mut StdRng,
        r: &mut PhaseReport,
    ) -> Res<()> {
        match self {
            Outage::Freeze => {
                println!("   freezing the broker for {d} s");
                main.freeze();
                tokio::time::sleep(Duration::from_secs(*d)).await;
                main.thaw();
                r.freezes.push(*d);
            }
            Outage::DeadLetters => {
                println!("   freezing the dead-letter broker for {d} s");
                dlq.freeze();
                tokio::time::sleep(Duration::from_secs(*d)).await;
                dlq.thaw();
                r.dead_letter_outage = *d;
            }
            Outage::Restarts => {
                let down = secs(rng, 0.5, 3.0);
                println!(
                    "   restart {} of the broker (down {:.1} s)",
                    i + 1,
                    down.as_secs_f64()
                );
                main.restart(down)?;
                r.restarts += 1;
            }
        }
        Ok(())
    }
}

/// A broker outage while graphsink runs (restarted whenever it exits).
pub(super) async fn outage(env: &Env, seed: u64, kind: Outage, r: &mut PhaseReport) -> Res<()> {
    let name = kind.name();
    let (mut main, dlq) = brokers(env, kind)?;
    let mut st = Stage::new(env, name, seed, &main, &dlq, None).await?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut p = st.spawn(env, None)?;
    let steps = kind.steps(env);
    for (i, d) in steps.iter().enumerate() {
        if let Some(e) = p.wait_for(secs(&mut rng, 3.0, 8.0)).await {
            tokio::time::sleep(SESSION).await;
            p = supervise(env, &mut p, &st, r, &mut main, e)?;
        }
        kind.apply(i, d, &mut main, &dlq, &mut rng, r).await?;
        if matches!(kind, Outage::Freeze) && i + 1 == steps.len() {
            // Issue 49's schedule: a SIGTERM 3 s after the last freeze
            // ends, while the coordinator may still count the member (its
            // leave can fail with NotCoordinator), then a fresh
            // `--exit-at-end` run at once, which must not end before the
            // partitions the departed member held are at their end.
            tokio::time::sleep(Duration::from_secs(3)).await;
            return st.stop_and_finish_at_once(p, env, Some(&mut main), r).await;
        }
        // Let it recover while the producer goes on; restart it if it gave up.
        let recover = Instant::now() + Duration::from_secs(15);
        while Instant::now() < recover {
            if let Some(e) = p.wait_for(Duration::from_secs(1)).await {
                tokio::time::sleep(SESSION).await;
                p = supervise(env, &mut p, &st, r, &mut main, e)?;
            }
        }
    }
    st.stop_and_finish(p, env, Some(&mut main), r).await
}

/// The phase's broker and dead-letter broker.
fn brokers(env: &Env, kind: Outage) -> Res<(Broker, Broker)> {
    let name = kind.name();
    let main = match kind {
        // A freeze can wedge tansu 0.6's group coordinator (RELIABILITY.md):
        // the remedy is a broker restart, which needs the data kept.
        Outage::Restarts | Outage::Freeze => Broker::persistent(
            &env.backend,
            env.args.moto.clone(),
            env.work.join(format!("broker-{name}.log")),
        )?,
        _ => Broker::memory(&env.backend, env.work.join(format!("broker-{name}.log")))?,
    };
    let dlq = Broker::memory(
        &env.backend,
        env.work.join(format!("broker-{name}-dead-letters.log")),
    )?;
    Ok((main, dlq))
}

/// graphsink exited on its own: reported, the broker unwedged if it said
/// so, and graphsink started again.
fn supervise(
    env: &Env,
    p: &mut Process,
    st: &Stage,
    r: &mut PhaseReport,
    main: &mut Broker,
    e: Exit,
) -> Res<Process> {
    let tail = p.tail(1);
    r.own_exits.push(format!("{e:?}: {tail}"));
    unwedge(main, &tail, r)?;
    st.spawn(env, None)
}
