//! kill -9 trials: at random moments and at every failpoint.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::{secs, FAILPOINTS};
use crate::check::Res;
use crate::cluster::Broker;
use crate::report::PhaseReport;
use crate::stage::{keep_on_failure, Env, Stage, SHORT_SESSION};

/// kill -9 trials: at random moments, and at a failpoint's Nth hit (a
/// SIGTERM after a while reaches the shutdown windows: drain, revoke).
pub(super) async fn kills(env: &Env, seed: u64, r: &mut PhaseReport) -> Res<()> {
    let mut main = Broker::memory(&env.backend, env.work.join("broker-main.log"))?;
    let dlq = Broker::memory(&env.backend, env.work.join("broker-dead-letters.log"))?;
    let mut st = Stage::with_session(env, "kills", seed, &main, &dlq, None, SHORT_SESSION).await?;
    let mut rng = StdRng::seed_from_u64(seed);
    // Every third trial kills at a random moment; the others take the
    // failpoints in a seeded order, so 33 trials reach every window once.
    let mut windows = FAILPOINTS.to_vec();
    windows.shuffle(&mut rng);
    let mut next_window = windows.iter().cycle();
    for trial in 1..=env.args.trials {
        let label = format!("trial {trial}");
        let failpoint = (trial % 3 != 0).then(|| {
            let fp = *next_window.next().expect("a cycle never ends");
            // A shutdown window is passed once per process: its 2nd hit
            // never comes (the short form missed all four at @2, @3).
            let hit = if is_once_per_process(fp) {
                1
            } else {
                rng.random_range(1..=3u32)
            };
            (fp, hit)
        });
        let mut p = st.spawn(env, failpoint.map(|(fp, n)| format!("{fp}=abort@{n}")))?;
        let exit = match failpoint {
            None => {
                let at = secs(&mut rng, 0.5, 9.0);
                match p.wait_for(at).await {
                    Some(e) => {
                        r.own_exits.push(format!("{label}: {e:?}: {}", p.tail(1)));
                        e
                    }
                    None => {
                        r.kills += 1;
                        p.kill().await
                    }
                }
            }
            Some((fp, _)) => {
                // A window passed while running gets a second, longer
                // wait before the stop: retention's windows need a few
                // folds first, which a fresh graph on a busy machine (CI
                // runs two harnesses side by side) can take past 8 s.
                let mut got = p.wait_for(secs(&mut rng, 2.0, 8.0)).await;
                if got.is_none() && !is_once_per_process(fp) {
                    got = p.wait_for(Duration::from_secs(15)).await;
                }
                let e = match got {
                    Some(e) => e,
                    // Not reached while running: stop, which passes the
                    // shutdown windows, then kill what is left.
                    None => p.stop(Duration::from_secs(30)).await,
                };
                match &e.fired {
                    Some(f) if f == fp => {
                        r.kills += 1;
                        *r.failpoints_fired.entry(fp.to_string()).or_default() += 1;
                    }
                    _ => {
                        *r.failpoints_missed.entry(fp.to_string()).or_default() += 1;
                        if e.code != Some(0) && e.signal != Some(libc::SIGKILL) {
                            r.own_exits
                                .push(format!("{label} ({fp}): {e:?}: {}", p.tail(1)));
                        }
                    }
                }
                e
            }
        };
        let killed_at = Instant::now();
        println!(
            "   {label}: {} -> {}",
            failpoint.map_or("kill -9 at a random moment".to_string(), |(fp, n)| format!(
                "{fp}@{n}"
            )),
            exit.fired.as_deref().map_or_else(
                || format!("{:?}/{:?}", exit.code, exit.signal),
                |f| format!("fired {f}")
            )
        );
        if rng.random_bool(0.5) {
            if let Err(e) = st.audit(env, r, &label).await {
                r.errors.push(format!("{label}: audit: {e}"));
            }
        }
        let waited = killed_at.elapsed();
        let settle = st.session + Duration::from_secs(1);
        if waited < settle {
            tokio::time::sleep(settle - waited).await;
        }
    }
    st.finish(env, Some(&mut main), r).await?;
    keep_on_failure(&st, r);
    Ok(())
}

/// Whether `fp` is hit at most once in a process's life: the drain and the
/// revoke of its last assignment happen once, at its stop.
fn is_once_per_process(fp: &str) -> bool {
    fp.starts_with("drain.") || fp.starts_with("revoke.")
}
