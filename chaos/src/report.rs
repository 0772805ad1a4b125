//! What one phase did and found: the figures of the JSON report and the
//! lines printed after the phase.

use std::collections::BTreeMap;

use crate::check::Tally;

#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct PhaseReport {
    pub phase: String,
    pub seconds: f64,
    pub produced: u64,
    pub produce_failures: u64,
    pub kills: u32,
    pub failpoints_fired: BTreeMap<String, u32>,
    pub failpoints_missed: BTreeMap<String, u32>,
    pub freezes: Vec<u64>,
    pub restarts: u32,
    pub dead_letter_outage: u64,
    /// `graphsink run` exits nobody asked for (a stall give-up, a full disk…).
    pub own_exits: Vec<String>,
    /// Times graphsink exited because the group coordinator gave no member
    /// any partition (tansu 0.6's wedge), and the broker was restarted.
    pub wedges: u32,
    /// `members`: seconds from a member's kill -9 (or freeze) until a
    /// survivor claimed shards again, per event.
    pub handoffs: Vec<(String, f64)>,
    /// `members`: the group protocol, and per event (kill, freeze, leave,
    /// join) the records/s the group committed in the 20 s after it and
    /// the longest stretch of those 20 s in which it committed nothing,
    /// and the most records produced but not committed in them.
    pub group_protocol: String,
    pub rebalances: Vec<(String, f64, f64, i64)>,
    /// `--cluster`: each fault delivered and what it did to ingest.
    pub faults: Vec<FaultReport>,
    /// What a phase saw besides (e.g. `/ready` during an outage).
    pub notes: Vec<String>,
    /// The final `--exit-at-end` run: attempts, and seconds of the last.
    pub final_run: Option<(u32, f64)>,
    pub audits: u32,
    pub last_audit: Option<Tally>,
    pub final_check: Option<Tally>,
    pub errors: Vec<String>,
    pub not_run: Option<String>,
}

/// One fault of a `--cluster` phase: what, how many times, how long it
/// lasted, the longest stretch with no commit progress from its start, and
/// how long after its end ingest was normal again (`None`: not within the
/// phase; `CommitSampler::recovery` says what normal is).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct FaultReport {
    pub what: String,
    pub delivered: u32,
    pub seconds: f64,
    pub longest_pause: f64,
    pub recovered_after: Option<f64>,
}

/// The phase's lines on stdout, after it ran.
pub(crate) fn print_phase(r: &PhaseReport) {
    if let Some(why) = &r.not_run {
        println!("   NOT RUN: {why}");
        return;
    }
    println!(
        "   {:.0} s, {} records produced ({} produce failures), {} kills, failpoints fired {:?}, missed {:?}",
        r.seconds, r.produced, r.produce_failures, r.kills, r.failpoints_fired, r.failpoints_missed
    );
    if !r.freezes.is_empty() || r.restarts > 0 || r.dead_letter_outage > 0 {
        println!(
            "   broker freezes {:?} s, broker restarts {}, dead-letter outage {} s",
            r.freezes, r.restarts, r.dead_letter_outage
        );
    }
    for f in &r.faults {
        println!(
            "   fault: {} (x{}, {:.1} s): longest ingest pause {:.1} s, recovered {}",
            f.what,
            f.delivered,
            f.seconds,
            f.longest_pause,
            f.recovered_after
                .map_or("not within the phase".to_string(), |s| format!(
                    "{s:.1} s after it ended"
                ))
        );
    }
    for n in &r.notes {
        println!("   note: {n}");
    }
    for (what, s) in &r.handoffs {
        println!("   hand-off after {what}: {s:.1} s until a survivor was assigned its partitions (session.timeout.ms 6 s)");
    }
    for (what, rate, pause, lag) in &r.rebalances {
        println!(
            "   {} after {what}: {rate:.0} records/s committed over 20 s, longest pause {pause:.1} s, lag at most {lag}",
            r.group_protocol
        );
    }
    if let Some((attempts, s)) = r.final_run {
        println!("   final run --exit-at-end: {s:.0} s, attempt {attempts}");
    }
    println!(
        "   {} audits after crashes; own exits: {}; wedged groups unwedged by a broker restart: {}",
        r.audits,
        r.own_exits.len(),
        r.wedges
    );
    for e in &r.own_exits {
        println!("     own exit: {e}");
    }
    if let Some(t) = &r.final_check {
        println!(
            "   final: graph commit {}, {} nodes, {} edges, {} rejects, {} on the dead-letter topic ({} duplicate deliveries)",
            t.head_seq, t.nodes, t.edges, t.rejects, t.dead_letters, t.dead_letter_duplicates
        );
    }
    for e in r.errors.iter().take(30) {
        println!("   ERROR {e}");
    }
    if r.errors.len() > 30 {
        println!("   ... {} more errors", r.errors.len() - 30);
    }
}
