//! `min.insync.replicas` not met: two of the three brokers down (each a
//! controlled shutdown), so no write that needs two replicas succeeds: the
//! producer's, the dead-letter produce, the group's offset commits. With
//! combined nodes the KRaft quorum goes too (one voter of three): the last
//! node can neither move leaders nor change an ISR (docs/kafka.md).
//! graphsink must hold, saying so (`/ready` false, a log line), and go on
//! by itself once one broker is back.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::meter::{now, RECOVER_WITHIN};
use super::{local_graph, ready, Cluster, Keeper, Meter, Supervised, HTTP, IN_SYNC_WITHIN};
use crate::check::Res;
use crate::report::PhaseReport;
use crate::stage::Env;

/// How long the two brokers stay down: long enough for `/ready` to say
/// so. It fails once the dead-letter producer has been failing for
/// `stall_bound`, and the first failed round is known only when its
/// transaction's abort gives up (30 s) after the produce timed out (10 s):
/// about 60 s in (docs/kafka.md, "Faults on the secured cluster").
const OUTAGE: Duration = Duration::from_secs(90);

/// `[http] stall_bound` for this phase: how long a stall lasts before
/// `/ready` says so (the default, 60 s, is as long as the outage).
const STALL_BOUND: &str = "15s";

/// `/ready` as seen during the outage and after it.
#[derive(Default)]
struct Looks {
    /// When it first answered 503 after the brokers went down, and its body.
    not_ready: Option<(f64, String)>,
    /// When it answered 200 again after a broker came back.
    ready_again: Option<f64>,
    /// Looks that got no answer at all.
    silent: u32,
}

pub(super) async fn min_isr(env: &Env, c: &mut Cluster, seed: u64, r: &mut PhaseReport) -> Res<()> {
    let name = "min-isr";
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ids = c.kc.node_ids();
    ids.shuffle(&mut rng);
    let m1 = c.member_host("m1")?;
    let mut st = c
        .stage(env, name, seed, &m1, ids[0], local_graph(env, name))
        .await?;
    let text = std::fs::read_to_string(&st.config).map_err(|e| e.to_string())?;
    std::fs::write(
        &st.config,
        format!("{text}\n[http]\nstall_bound = \"{STALL_BOUND}\"\n"),
    )
    .map_err(|e| e.to_string())?;
    let mut meter = Meter::start(c, &st)?;
    let mut g = Supervised::start(&st, env, &["--http", HTTP], None)?;
    meter.warm_up(&mut g, &st, env, r).await?;
    match ready(m1.host()) {
        Some((200, _)) => {}
        other => r
            .errors
            .push(format!("/ready before the outage: {other:?}, not 200")),
    }

    let down = [ids[1], ids[2]];
    println!(
        "   nodes {} and {} down (controlled shutdowns) for {} s",
        down[0],
        down[1],
        OUTAGE.as_secs()
    );
    let log_at = std::fs::metadata(&st.log).map_or(0, |m| m.len());
    let start = now();
    let t0 = Instant::now();
    c.kc.stop_node(down[0])?;
    c.kc.stop_node(down[1])?;
    let mut looks = Looks::default();
    g.hold_until(&st, env, r, OUTAGE, || {
        match ready(m1.host()) {
            Some((503, body)) if looks.not_ready.is_none() => {
                looks.not_ready = Some((t0.elapsed().as_secs_f64(), body));
            }
            None => looks.silent += 1,
            _ => {}
        }
        false
    })
    .await?;
    println!("   node {} starts again", down[0]);
    let back = Instant::now();
    c.kc.start_node(down[0])?;
    meter.fault(
        "two of three brokers down (min.insync.replicas not met)",
        1,
        start,
        now(),
    );
    g.hold_until(&st, env, r, RECOVER_WITHIN, || {
        let up = matches!(ready(m1.host()), Some((200, _)));
        if up && looks.ready_again.is_none() {
            looks.ready_again = Some(back.elapsed().as_secs_f64());
        }
        up && meter.recovered()
    })
    .await?;
    judge(&looks, &st.log, log_at, r);
    println!("   node {} starts again", down[1]);
    c.kc.start_node(down[1])?;
    c.kc.wait_in_sync(IN_SYNC_WITHIN)?;
    meter.settle(&mut g, &st, env, r).await?;
    meter.report(r);
    g.finish(&mut st, env, r).await
}

/// What `/ready` and the log said, into the report; an error where
/// graphsink did not hold visibly or did not come back by itself.
fn judge(looks: &Looks, log: &std::path::Path, from: u64, r: &mut PhaseReport) {
    match &looks.not_ready {
        Some((s, body)) => r.notes.push(format!(
            "/ready 503 {s:.1} s after the brokers went down: {body}"
        )),
        None => r.errors.push(format!(
            "/ready never said 503 during the {} s outage (stall_bound {STALL_BOUND}; {} looks unanswered)",
            OUTAGE.as_secs(),
            looks.silent
        )),
    }
    match looks.ready_again {
        Some(s) => r.notes.push(format!(
            "/ready 200 again {s:.1} s after the start of the first broker back (its JVM start included)"
        )),
        None => r.errors.push(format!(
            "/ready not 200 again within {} s of a broker's return",
            RECOVER_WITHIN.as_secs()
        )),
    }
    let text = std::fs::read(log).unwrap_or_default();
    let text = crate::cluster::strip_ansi(&String::from_utf8_lossy(
        &text[(from as usize).min(text.len())..],
    ));
    let mut said: Vec<String> = Vec::new();
    for l in text
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
    {
        // The message, without the time and the fields' values.
        let msg: String = l
            .split_whitespace()
            .skip(2)
            .take_while(|w| !w.contains('='))
            .collect::<Vec<_>>()
            .join(" ");
        if !said.contains(&msg) {
            said.push(msg);
        }
    }
    r.notes.push(format!(
        "graphsink's WARN/ERROR messages during the outage: {}",
        if said.is_empty() {
            "none".to_string()
        } else {
            said.iter().take(6).cloned().collect::<Vec<_>>().join(" | ")
        }
    ));
}
