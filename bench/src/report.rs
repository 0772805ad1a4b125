//! The result of one bench run: a table on stdout and the same figures as
//! JSON. Owns formatting only.

use serde::Serialize;

#[derive(Serialize, Default, Clone, Copy)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub samples: usize,
}

impl Latency {
    pub fn of(v: Vec<f64>) -> Option<Latency> {
        let samples = v.len();
        crate::measure::percentiles(v).map(|(p50_ms, p99_ms, max_ms)| Latency {
            p50_ms,
            p99_ms,
            max_ms,
            samples,
        })
    }
}

#[derive(Serialize, Default)]
pub struct Report {
    pub build: &'static str,
    pub broker: String,
    pub workload: serde_json::Value,
    pub produce_records_per_s: f64,
    pub graphsink_records_per_s: f64,
    pub graphsink_secs: f64,
    pub graphsink_timed_records: u64,
    pub graphsink_commits_published: usize,
    pub graphsink_peak_rss_mib: Option<f64>,
    pub graphsink_run_loop: crate::sink::LoopTimes,
    pub graphsink_nofold_records_per_s: f64,
    pub graphsink_nofold_peak_rss_mib: Option<f64>,
    pub fold_peak_rss_mib: Option<f64>,
    pub fold_start_rss_mib: Option<f64>,
    pub bare_records_per_s: f64,
    pub bare_peak_rss_mib: Option<f64>,
    pub direct_records_per_s: f64,
    pub direct_batches: u64,
    pub direct_peak_rss_mib: Option<f64>,
    pub ratio_graphsink_bare: f64,
    pub ratio_graphsink_direct: f64,
    pub latency_rate_records_per_s: u64,
    pub latency_records: usize,
    pub durable_ack_latency: Option<Latency>,
    pub graph_visible_latency: Option<Latency>,
    pub bare_durable_ack_latency: Option<Latency>,
    pub graph_visible_unseen: usize,
    pub published_missed: u64,
    pub commit_sample_interval_ms: u64,
    pub fold_rows: u64,
    pub fold_secs: f64,
    pub fold_rows_per_s: f64,
    pub fold_upserted: u64,
    /// A phase consumed a different number of records than were produced:
    /// its rate is not comparable.
    pub count_mismatch: bool,
    /// Rows in the graph after the backlog run, per table, and what the
    /// workload says they must be (distinct node keys, distinct edge ids).
    pub graph_rows: std::collections::BTreeMap<String, usize>,
    pub expected_rows: std::collections::BTreeMap<String, usize>,
    pub notes: Vec<String>,
}

impl Report {
    /// Checks a phase's record count against what was produced.
    pub fn counted(&mut self, phase: &str, got: u64, produced: u64) {
        if got != produced {
            self.count_mismatch = true;
            self.notes.push(format!(
                "COUNT MISMATCH: {phase} consumed {got} records, {produced} were produced"
            ));
        }
    }
}

fn lat(l: &Option<Latency>) -> String {
    match l {
        Some(l) => format!(
            "p50 {:>8.1} ms   p99 {:>8.1} ms   max {:>8.1} ms   (n={})",
            l.p50_ms, l.p99_ms, l.max_ms, l.samples
        ),
        None => "n/a".into(),
    }
}

fn rss(m: Option<f64>) -> String {
    m.map_or("n/a".into(), |m| format!("{m:.0} MiB"))
}

impl Report {
    pub fn print(&self) {
        println!(
            "graphsink-bench ({} build) broker {}",
            self.build, self.broker
        );
        println!("workload {}", self.workload);
        println!("{:-<78}", "");
        println!(
            "{:<34} {:>14} {:>12} {:>14}",
            "", "records/s", "vs bare", "peak RSS"
        );
        let row = |name: &str, r: f64, m: Option<f64>| {
            let vs = if self.bare_records_per_s > 0.0 {
                r / self.bare_records_per_s
            } else {
                f64::NAN
            };
            println!("{name:<34} {r:>14.0} {vs:>12.3} {:>14}", rss(m));
        };
        row(
            "(a) bare rdkafka consume+commit",
            self.bare_records_per_s,
            self.bare_peak_rss_mib,
        );
        row(
            "(b) direct load (Lance, no WAL)",
            self.direct_records_per_s,
            self.direct_peak_rss_mib,
        );
        row(
            "graphsink end to end (durable)",
            self.graphsink_records_per_s,
            self.graphsink_peak_rss_mib,
        );
        println!(
            "  ({} records timed in {:.2} s, {} graph commits published)",
            self.graphsink_timed_records, self.graphsink_secs, self.graphsink_commits_published
        );
        let l = &self.graphsink_run_loop;
        println!(
            "  (run loop: {} polls of {:.0} records; in polls {:.2} s, of which decode {:.2} s, puts {:.2} s)",
            l.polls, l.records_per_poll, l.poll_secs, l.decode_secs, l.put_secs
        );
        row(
            "graphsink, folding off",
            self.graphsink_nofold_records_per_s,
            self.graphsink_nofold_peak_rss_mib,
        );
        println!("{:-<78}", "");
        self.print_ratios_and_latency();
    }

    /// The part below the throughput table: ratios, latency, fold, counts.
    fn print_ratios_and_latency(&self) {
        println!("ratio graphsink/bare    {:.3}", self.ratio_graphsink_bare);
        println!("ratio graphsink/direct  {:.3}", self.ratio_graphsink_direct);
        println!("durable-ack latency     {}", lat(&self.durable_ack_latency));
        println!(
            "graph-visible latency   {}",
            lat(&self.graph_visible_latency)
        );
        println!(
            "bare commit latency     {}",
            lat(&self.bare_durable_ack_latency)
        );
        println!("  (paced {} records/s, {} records; {} never seen visible; {} published commits missed by the watch)",
            self.latency_rate_records_per_s, self.latency_records, self.graph_visible_unseen, self.published_missed);
        println!(
            "fold                    {} rows in {:.2} s = {:.0} rows/s ({} upserted), peak RSS {} (child process, {} before the fold)",
            self.fold_rows,
            self.fold_secs,
            self.fold_rows_per_s,
            self.fold_upserted,
            rss(self.fold_peak_rss_mib),
            rss(self.fold_start_rss_mib)
        );
        println!(
            "producer (not measured) {:.0} records/s",
            self.produce_records_per_s
        );
        println!(
            "graph rows after the backlog {:?} (expected {:?})",
            self.graph_rows, self.expected_rows
        );
        if self.count_mismatch {
            println!("WARNING: a phase's record count differs from the produced count; see notes");
        }
        for n in &self.notes {
            println!("note: {n}");
        }
    }
}
