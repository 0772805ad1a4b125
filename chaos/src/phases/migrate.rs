//! Schema changes, each start that applies one killed -9 at a step of it.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{secs, MIGRATE_FAILPOINTS};
use crate::check::{self, Res};
use crate::cluster::Broker;
use crate::report::PhaseReport;
use crate::stage::{keep_on_failure, Env, Stage, SESSION};
use crate::workload;

/// Schema changes under the continuous producer: trial i adds an optional
/// property to `Item`, and the start that applies it is killed -9 at a
/// step of the change (`MIGRATE_FAILPOINTS`, in turn) or at a random
/// moment; the next start must finish it. After each, the graph is audited
/// against what the group committed and must be at schema version i; the
/// phase ends with the usual final run and check.
pub(super) async fn migrate(env: &Env, seed: u64, r: &mut PhaseReport) -> Res<()> {
    let mut main = Broker::memory(&env.backend, env.work.join("broker-migrate.log"))?;
    let dlq = Broker::memory(&env.backend, env.work.join("broker-dead-letters.log"))?;
    let mut st = Stage::new(env, "migrate", seed, &main, &dlq, None).await?;
    let mut rng = StdRng::seed_from_u64(seed);
    // A graph at version 0 with rows in it first.
    let mut p = st.spawn(env, None)?;
    match p.wait_for(secs(&mut rng, 3.0, 5.0)).await {
        Some(e) => r.own_exits.push(format!("version 0: {e:?}: {}", p.tail(1))),
        None => {
            p.stop(Duration::from_secs(30)).await;
        }
    }
    for trial in 1..=env.args.migrations {
        let label = format!("migration {trial}");
        write_schema(&st, trial)?;
        kill_change(env, &st, trial, &label, &mut rng, r).await?;
        tokio::time::sleep(SESSION + Duration::from_secs(1)).await;
        finish_change(env, &mut st, trial, &label, &mut rng, r).await?;
    }
    st.finish(env, Some(&mut main), r).await?;
    keep_on_failure(&st, r);
    Ok(())
}

/// The schema of change `trial`: `Item` with `trial` optional properties
/// more.
fn write_schema(st: &Stage, trial: u32) -> Res<()> {
    let pg = st.dir.join("chaos.pg");
    let notes: String = (1..=trial)
        .map(|i| format!("    note{i}: String?\n"))
        .collect();
    let schema = workload::SCHEMA.replacen("    qty: I32\n", &format!("    qty: I32\n{notes}"), 1);
    std::fs::write(&pg, schema).map_err(|e| e.to_string())?;
    Ok(())
}

/// The start that applies change `trial`, killed at a step of it (in
/// turn) or, every third, at a random moment.
async fn kill_change(
    env: &Env,
    st: &Stage,
    trial: u32,
    label: &str,
    rng: &mut StdRng,
    r: &mut PhaseReport,
) -> Res<()> {
    // Every third at a random moment; the others at the steps in turn
    // (`after_table` at one of the first tables).
    let window = MIGRATE_FAILPOINTS[(trial as usize - 1) % MIGRATE_FAILPOINTS.len()];
    let failpoint = (!trial.is_multiple_of(3)).then(|| match window {
        "migrate.after_table" => format!("{window}=abort@{}", rng.random_range(1..=3u32)),
        w => format!("{w}=abort"),
    });
    let mut p = st.spawn(env, failpoint.clone())?;
    let exit = match &failpoint {
        None => match p.wait_for(secs(rng, 0.1, 2.0)).await {
            Some(e) => e,
            None => {
                r.kills += 1;
                p.kill().await
            }
        },
        Some(_) => {
            let e = match p.wait_for(Duration::from_secs(60)).await {
                Some(e) => e,
                None => p.stop(Duration::from_secs(30)).await,
            };
            if e.fired.as_deref() == Some(window) {
                r.kills += 1;
                *r.failpoints_fired.entry(window.to_string()).or_default() += 1;
            } else {
                *r.failpoints_missed.entry(window.to_string()).or_default() += 1;
                r.own_exits
                    .push(format!("{label} ({window}): {e:?}: {}", p.tail(1)));
            }
            e
        }
    };
    println!(
        "   {label}: {} -> {}",
        failpoint.as_deref().unwrap_or("kill -9 at a random moment"),
        exit.fired.as_deref().map_or_else(
            || format!("{:?}/{:?}", exit.code, exit.signal),
            |f| format!("fired {f}")
        )
    );
    Ok(())
}

/// The next start finishes the change; the graph is audited and must be
/// at schema version `trial`.
async fn finish_change(
    env: &Env,
    st: &mut Stage,
    trial: u32,
    label: &str,
    rng: &mut StdRng,
    r: &mut PhaseReport,
) -> Res<()> {
    // The next start finishes the change and ingests under it.
    let mut p = st.spawn(env, None)?;
    match p.wait_for(secs(rng, 4.0, 8.0)).await {
        Some(e) => r
            .own_exits
            .push(format!("{label}, finishing: {e:?}: {}", p.tail(1))),
        None => {
            p.stop(Duration::from_secs(30)).await;
        }
    }
    if let Err(e) = st.audit(env, r, label).await {
        r.errors.push(format!("{label}: audit: {e}"));
    }
    match check::schema_version(&st.graph).await {
        Ok(v) if v == u64::from(trial) => {}
        Ok(v) => r.errors.push(format!(
            "{label}: the graph is at schema version {v} after the start that finishes the change"
        )),
        Err(e) => r.errors.push(format!("{label}: {e}")),
    }
    Ok(())
}
