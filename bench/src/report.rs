//! The result of one bench run: a table on stdout and the same figures as
//! JSON. Owns formatting only.

use serde::Serialize;

#[derive(Serialize, Default, Clone, Copy)]
pub(crate) struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub samples: usize,
}

impl Latency {
    pub(crate) fn of(v: Vec<f64>) -> Option<Latency> {
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
pub(crate) struct Report {
    pub build: &'static str,
    pub broker: String,
    pub workload: serde_json::Value,
    pub produce_records_per_s: f64,
    /// Mean value size as produced (JSON text, or the framed Avro or
    /// Protobuf bytes).
    pub value_bytes_mean: f64,
    /// graphsink's run loop's decode time (`RecordDecoder::decode` of every
    /// poll: the format, rows, checks, last write wins) per record, wall
    /// clock on the run loop's thread.
    pub decode_us_per_record: f64,
    /// First record → the graph commit that holds the last one (to
    /// *visible*, as every peer is timed): the headline rate.
    pub graphsink_records_per_s: f64,
    pub graphsink_visible_secs: f64,
    /// First record → the offset commit that covers the last one (durable
    /// in the WAL, not yet in a graph commit); `graphsink_secs` is its span.
    pub graphsink_durable_records_per_s: f64,
    pub graphsink_secs: f64,
    /// Every record over the process's spawn → exit (`run --exit-at-end`
    /// as a process, start and final fold included), and its parts.
    pub graphsink_wall_records_per_s: f64,
    pub graphsink_wall_secs: f64,
    pub graphsink_start_to_first_secs: f64,
    pub graphsink_visible_to_exit_secs: f64,
    pub graphsink_timed_records: u64,
    pub graphsink_commits_published: usize,
    pub graphsink_peak_rss_mib: Option<f64>,
    /// The process's RSS when the graphsink phase started: the child's
    /// binary and runtime when `graphsink_own_process`, else also what the
    /// phases before it left (the peak includes it).
    pub graphsink_start_rss_mib: Option<f64>,
    /// The backlog phases ran in child processes of their own.
    pub graphsink_own_process: bool,
    pub graphsink_run_loop: crate::sink::LoopTimes,
    /// graphsink's process's CPU over the backlog phase, in cores (the
    /// child's when the phase ran in one).
    pub graphsink_cpu_cores: Option<f64>,
    /// CPU per thread group (and the broker's) over the backlog phase.
    pub graphsink_threads: Vec<crate::threads::GroupCpu>,
    pub graphsink_nofold_records_per_s: f64,
    pub graphsink_nofold_peak_rss_mib: Option<f64>,
    pub fold_peak_rss_mib: Option<f64>,
    pub fold_start_rss_mib: Option<f64>,
    pub bare_records_per_s: f64,
    /// The broker's CPU in each phase, in cores (a broker the bench
    /// started; none for `--broker`).
    pub broker_cpu_cores: std::collections::BTreeMap<String, f64>,
    pub bare_peak_rss_mib: Option<f64>,
    pub direct_records_per_s: f64,
    pub direct_batches: u64,
    pub direct_peak_rss_mib: Option<f64>,
    /// To visible over the bare loop; and durable over the bare loop.
    pub ratio_graphsink_bare: f64,
    pub ratio_graphsink_bare_durable: f64,
    pub ratio_graphsink_direct: f64,
    pub latency_rate_records_per_s: u64,
    pub latency_records: usize,
    pub durable_ack_latency: Option<Latency>,
    pub graph_visible_latency: Option<Latency>,
    pub bare_durable_ack_latency: Option<Latency>,
    pub graph_visible_unseen: usize,
    pub published_missed: u64,
    /// The folds' phases under the paced producer (mean per fold).
    pub fold_phases_paced: Vec<crate::measure::FoldPhase>,
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
    /// The graphsink phases again on an `s3://` root (`--s3`,
    /// `--s3-endpoint`), in the same run.
    pub s3: Option<S3Report>,
    pub notes: Vec<String>,
}

/// graphsink's backlog and paced phases on S3, beside the same phases on
/// the local filesystem (the report's main figures).
#[derive(Serialize, Default)]
pub(crate) struct S3Report {
    pub server: String,
    pub requests_counted_by: String,
    /// First record → the graph commit holding the last (to visible).
    pub records_per_s: f64,
    /// First record → the offset commit covering the last (durable).
    pub durable_records_per_s: f64,
    pub ratio_bare: f64,
    /// S3 ÷ local filesystem, same run, same backlog.
    pub ratio_local: f64,
    pub secs: f64,
    pub timed_records: u64,
    pub commits_published: usize,
    pub peak_rss_mib: Option<f64>,
    pub run_loop: crate::sink::LoopTimes,
    /// Ingest sessions restarted after a storage failure (should be 0).
    pub restarts: u64,
    pub durable_ack_latency: Option<Latency>,
    pub graph_visible_latency: Option<Latency>,
    /// Records the paced S3 run consumed before its primer (the local and
    /// bare paced phases' records), not measured.
    pub live_catch_up: u64,
    /// Server load over the whole backlog phase (open, ingest, final fold,
    /// close) and over the paced phase (primer to shutdown).
    pub backlog_load: crate::s3::Load,
    pub live_load: Option<crate::s3::Load>,
    /// Local-filesystem phases' bench CPU, for the same comparison.
    pub local_backlog_cpu_cores: Option<f64>,
    pub local_live_cpu_cores: Option<f64>,
    pub wal_flush_ms: u64,
    pub shards: u64,
    pub graph_rows: std::collections::BTreeMap<String, usize>,
}

impl Report {
    /// Checks a phase's record count against what was produced.
    pub(crate) fn counted(&mut self, phase: &str, got: u64, produced: u64) {
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
    /// Records the broker's CPU over `phase`. The broker shares the 2
    /// cores: its share says how much of the machine the measured code had.
    pub(crate) fn broker_cpu(&mut self, phase: &str, cpu: &crate::s3::SelfCpu) {
        if let Some(c) = cpu.cores() {
            self.broker_cpu_cores.insert(phase.to_string(), c);
        }
    }

    pub(crate) fn print(&self) {
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
        self.row(
            "(a) bare rdkafka consume+commit",
            self.bare_records_per_s,
            self.bare_peak_rss_mib,
        );
        if self.direct_records_per_s > 0.0 {
            self.row(
                "(b) direct load (Lance, no WAL)",
                self.direct_records_per_s,
                self.direct_peak_rss_mib,
            );
        } else {
            println!(
                "{:<34} {:>14}",
                "(b) direct load (Lance, no WAL)", "not run"
            );
        }
        self.row(
            "graphsink to visible",
            self.graphsink_records_per_s,
            self.graphsink_peak_rss_mib,
        );
        self.row(
            "graphsink to durable (WAL)",
            self.graphsink_durable_records_per_s,
            None,
        );
        self.row(
            "graphsink wall, start included",
            self.graphsink_wall_records_per_s,
            None,
        );
        self.print_graphsink_run();
        self.row(
            "graphsink, folding off",
            self.graphsink_nofold_records_per_s,
            self.graphsink_nofold_peak_rss_mib,
        );
        if !self.broker_cpu_cores.is_empty() {
            let phases: Vec<String> = self
                .broker_cpu_cores
                .iter()
                .map(|(p, c)| format!("{p} {c:.2}"))
                .collect();
            println!("broker CPU, cores: {}", phases.join(", "));
        }
        println!("{:-<78}", "");
        self.print_ratios_and_latency();
    }

    /// One row of the throughput table: records/s, the ratio to the bare
    /// consumer, peak RSS.
    fn row(&self, name: &str, r: f64, m: Option<f64>) {
        let vs = if self.bare_records_per_s > 0.0 {
            r / self.bare_records_per_s
        } else {
            f64::NAN
        };
        println!("{name:<34} {r:>14.0} {vs:>12.3} {:>14}", rss(m));
    }

    /// The lines under graphsink's row: where its run loop spent the run,
    /// and its CPU per thread group.
    fn print_graphsink_run(&self) {
        println!(
            "  ({} records timed in {:.2} s, {} graph commits published)",
            self.graphsink_timed_records, self.graphsink_secs, self.graphsink_commits_published
        );
        match (self.graphsink_start_rss_mib, self.graphsink_own_process) {
            (Some(start), true) => {
                println!(
                    "  (in a process of its own, at {start:.0} MiB RSS when the phase started)"
                )
            }
            (Some(start), false) => {
                println!("  (RSS at the phase's start, left by the phases before: {start:.0} MiB)")
            }
            (None, _) => {}
        }
        let l = &self.graphsink_run_loop;
        println!(
            "  (run loop: {} polls of {:.0} records; in polls {:.2} s, of which take {:.2} s, decode {:.2} s, puts {:.2} s, rejects {:.2} s; window full {:.2} s, freeze cuts {:.2} s; {} rejected)",
            l.polls, l.records_per_poll, l.poll_secs, l.take_secs, l.decode_secs, l.put_secs, l.reject_secs, l.window_full_secs, l.cut_secs, l.rejected
        );
        println!(
            "  (decode {:.3} µs/record; values {:.1} bytes on average as produced)",
            self.decode_us_per_record, self.value_bytes_mean
        );
        println!(
            "  (first fetch → last poll durable {:.3} s, → all offsets committed {:.3} s: {:.0} ms waiting for the commit; → all visible {:.3} s)",
            l.durable_secs, self.graphsink_secs, (self.graphsink_secs - l.durable_secs) * 1e3, self.graphsink_visible_secs
        );
        println!(
            "  (as a process: spawn → first record {:.3} s, last graph commit → run returned {:.3} s, spawn → exit {:.3} s)",
            self.graphsink_start_to_first_secs, self.graphsink_visible_to_exit_secs, self.graphsink_wall_secs
        );
        let n = self.graphsink_timed_records.max(1) as f64;
        for g in &self.graphsink_threads {
            println!(
                "  (cpu: {:<28} {:>3} threads {:>6.2} s = {:>5.2} µs/record; waited for a cpu {:.2} s)",
                g.group,
                g.threads,
                g.cpu_secs,
                g.cpu_secs * 1e6 / n,
                g.wait_secs
            );
        }
    }

    /// The part below the throughput table: ratios, latency, fold, counts.
    fn print_ratios_and_latency(&self) {
        println!(
            "ratio graphsink/bare    {:.3} to visible, {:.3} to durable",
            self.ratio_graphsink_bare, self.ratio_graphsink_bare_durable
        );
        if self.direct_records_per_s > 0.0 {
            println!("ratio graphsink/direct  {:.3}", self.ratio_graphsink_direct);
        } else {
            println!("ratio graphsink/direct  n/a (the direct load was not run)");
        }
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
        if let Some(first) = self.fold_phases_paced.first() {
            let phases: Vec<String> = self
                .fold_phases_paced
                .iter()
                .map(|p| format!("{} {:.3}", p.phase, p.mean_s))
                .collect();
            println!(
                "fold phases, paced      mean s per fold over {} folds: {} (sum {:.3})",
                first.folds,
                phases.join(", "),
                self.fold_phases_paced.iter().map(|p| p.mean_s).sum::<f64>()
            );
        }
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
        if let Some(s3) = &self.s3 {
            self.print_s3(s3);
        }
        if self.count_mismatch {
            println!("WARNING: a phase's record count differs from the produced count; see notes");
        }
        for n in &self.notes {
            println!("note: {n}");
        }
    }
}

fn p50_99(l: &Option<Latency>) -> String {
    l.map_or("n/a".into(), |l| {
        format!("{:.1} / {:.1} ms", l.p50_ms, l.p99_ms)
    })
}

fn opt(v: Option<f64>, unit: &str) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.2}{unit}"))
}

impl Report {
    fn print_s3(&self, s3: &S3Report) {
        println!("{:-<78}", "");
        println!(
            "S3: {} (requests counted by {})",
            s3.server, s3.requests_counted_by
        );
        println!(
            "{:<26} {:>12} {:>9} {:>24} {:>24}",
            "", "records/s", "vs bare", "durable ack p50 / p99", "graph-visible p50 / p99"
        );
        let vis = |l: &Option<Latency>| {
            l.map_or("n/a".into(), |l| {
                format!("{:.2} / {:.2} s", l.p50_ms / 1e3, l.p99_ms / 1e3)
            })
        };
        println!(
            "{:<26} {:>12.0} {:>9.3} {:>24} {:>24}",
            "graphsink (local fs)",
            self.graphsink_records_per_s,
            self.ratio_graphsink_bare,
            p50_99(&self.durable_ack_latency),
            vis(&self.graph_visible_latency)
        );
        println!(
            "{:<26} {:>12.0} {:>9.3} {:>24} {:>24}",
            "graphsink (s3, moto)",
            s3.records_per_s,
            s3.ratio_bare,
            p50_99(&s3.durable_ack_latency),
            vis(&s3.graph_visible_latency)
        );
        println!(
            "  s3/local {:.3}; {} records timed; durable {:.0} records/s in {:.2} s; {} graph commits, {} restarts, peak RSS {}",
            s3.ratio_local,
            s3.timed_records,
            s3.durable_records_per_s,
            s3.secs,
            s3.commits_published,
            s3.restarts,
            rss(s3.peak_rss_mib)
        );
        println!("  graph rows on S3 {:?}", s3.graph_rows);
        let l = &s3.run_loop;
        println!(
            "  (run loop: {} polls of {:.0} records; in polls {:.2} s, of which decode {:.2} s, puts {:.2} s)",
            l.polls, l.records_per_poll, l.poll_secs, l.decode_secs, l.put_secs
        );
        println!(
            "  bench CPU, cores: local backlog {}, s3 backlog {}; local paced {}, s3 paced {}",
            opt(s3.local_backlog_cpu_cores, ""),
            opt(s3.backlog_load.bench_cpu_cores, ""),
            opt(s3.local_live_cpu_cores, ""),
            opt(s3.live_load.as_ref().and_then(|l| l.bench_cpu_cores), "")
        );
        let flush_s = s3.wal_flush_ms as f64 / 1e3;
        for (name, load) in [
            ("backlog", Some(&s3.backlog_load)),
            ("paced", s3.live_load.as_ref()),
        ] {
            let Some(load) = load else { continue };
            print_s3_load(s3, name, load, flush_s);
        }
        if s3.live_catch_up > 0 {
            println!(
                "  (the paced S3 run first caught up {} records of the earlier paced phases, unmeasured)",
                s3.live_catch_up
            );
        }
    }
}

/// One S3 phase's requests: their rate, per flush interval, by kind and by
/// status, and the server's CPU.
fn print_s3_load(s3: &S3Report, name: &str, load: &crate::s3::Load, flush_s: f64) {
    println!(
            "  {name} phase: {:.2} s, {} requests = {:.0}/s = {:.1} per flush interval ({} ms, {} shards); WAL PUTs {:.0}/s; server CPU {} s = {} cores",
            load.secs,
            load.total_requests,
            load.requests_per_s,
            load.requests_per_s * flush_s,
            s3.wal_flush_ms,
            s3.shards,
            load.count("PUT wal entry") as f64 / load.secs.max(1e-9),
            opt(load.server_cpu_secs, ""),
            opt(load.server_cpu_cores, "")
        );
    let mut by: Vec<_> = load.requests.iter().collect();
    by.sort_by(|a, b| b.1.cmp(a.1));
    let shown: Vec<String> = by.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!("    by kind: {}", shown.join(", "));
    println!("    by status: {:?}", load.statuses);
}
