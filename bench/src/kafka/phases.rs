//! The measured phases, in the order `kafka_phases` runs them: (a) the
//! bare consumer and (b) the direct load, graphsink over the backlog (on
//! the local filesystem, then on S3), graphsink with folding off and one
//! timed fold, and the paced latency phases.

use std::path::Path;
use std::time::Duration;

use super::Run;
use crate::args::Args;
use crate::broker::BoxError;
use crate::report::{Latency, Report, S3Report};
use crate::s3::{Root, S3Bench, SelfCpu};
use crate::{baselines, formats, measure, sink};

impl Run {
    /// (a) the bare consumer and (b) the direct Lance load.
    pub(super) async fn baselines(
        &self,
        a: &Args,
        dir: &Path,
        ends: &[i64],
        r: &mut Report,
    ) -> Result<(), BoxError> {
        eprintln!("(a) bare consumer ...");
        measure::reset_peak_rss();
        let (tc, gb, e2) = (self.t.clone(), self.group("bare"), ends.to_vec());
        let cpu = crate::s3::SelfCpu::of(self.broker_pid);
        let bare = tokio::task::spawn_blocking(move || baselines::bare(&tc, &gb, &e2)).await??;
        r.broker_cpu("bare", &cpu);
        r.counted("bare", bare.records, a.records);
        r.bare_records_per_s = bare.rate();
        r.bare_peak_rss_mib = measure::peak_rss_mib();

        if a.format != formats::Format::Json || a.envelope != formats::Envelope::None {
            r.notes
                .push("direct load not run: it reads plain JSON values only".into());
            return Ok(());
        }
        eprintln!("(b) direct load ...");
        measure::reset_peak_rss();
        let cpu = crate::s3::SelfCpu::of(self.broker_pid);
        let direct = baselines::direct(
            &self.t,
            &self.group("direct"),
            ends,
            &sink::root_in(dir, "direct"),
            a.direct_batch,
            a.bad_fraction > 0.0,
        )
        .await?;
        r.broker_cpu("direct", &cpu);
        r.counted("direct", direct.records, a.records);
        r.direct_records_per_s = direct.rate();
        r.direct_batches = direct.batches;
        r.direct_peak_rss_mib = measure::peak_rss_mib();
        Ok(())
    }

    /// graphsink over the backlog, then its graph's row counts checked.
    pub(super) async fn graphsink(
        &self,
        a: &Args,
        dir: &Path,
        ends: &[i64],
        r: &mut Report,
    ) -> Result<(), BoxError> {
        eprintln!("graphsink over the backlog ...");
        let cfg = self.graphsink_config(a, dir)?;
        let spec = self.spec(a, dir, "graphsink", ends);
        let gs = sink::backlog_phase(&spec, a.in_process).await?;
        r.graphsink_cpu_cores = gs.cpu_cores;
        r.graphsink_threads = gs.threads.clone();
        // Like for like with the peers (BENCHMARKS, "How graphsink is
        // timed"): to the graph commit that holds the last record, with the
        // durable rate (to the last offset commit) beside it.
        let visible = gs
            .visible_secs
            .ok_or("graphsink ended but no graph commit seen holds every record")?;
        r.graphsink_records_per_s = gs.timed_records as f64 / visible;
        r.graphsink_visible_secs = visible;
        r.graphsink_durable_records_per_s = gs.timed_records as f64 / gs.secs;
        r.graphsink_wall_records_per_s = gs.records as f64 / gs.wall_secs;
        r.graphsink_wall_secs = gs.wall_secs;
        r.graphsink_start_to_first_secs = gs.start_to_first_secs;
        r.graphsink_visible_to_exit_secs = gs.visible_to_exit_secs.unwrap_or(f64::NAN);
        r.graphsink_timed_records = gs.timed_records;
        r.graphsink_secs = gs.secs;
        r.graphsink_commits_published = gs.commits_published;
        r.graphsink_peak_rss_mib = gs.peak_rss_mib;
        r.graphsink_start_rss_mib = gs.start_rss_mib;
        r.graphsink_own_process = !a.in_process;
        r.graphsink_run_loop = gs.run_loop.clone();
        // Over every record the run loop decoded (the first poll too).
        r.decode_us_per_record = gs.run_loop.decode_secs * 1e6 / gs.records.max(1) as f64;
        self.expected_rows(a, r);
        r.graph_rows = check_rows(&cfg, "", r).await?;
        r.counted("graphsink", gs.records, a.records);
        Ok(())
    }

    /// The same backlog run on an `s3://` root, with the server's load.
    pub(super) async fn graphsink_s3(
        &self,
        a: &Args,
        dir: &Path,
        s3: &S3Bench,
        ends: &[i64],
        r: &mut Report,
    ) -> Result<S3Report, BoxError> {
        eprintln!("graphsink over the backlog, on S3 ...");
        let cfg = self.s3_config(a, dir, s3)?;
        let spec = self.spec(a, dir, "graphsink-s3", ends);
        let mark = s3.mark();
        let gs = sink::backlog_phase(&spec, a.in_process).await?;
        let mut backlog_load = s3.since(&mark);
        if !a.in_process {
            // The phase ran in a child: the parent's own CPU was idle.
            backlog_load.bench_cpu_cores = gs.cpu_cores;
        }
        let mut out = S3Report {
            server: s3.describe.clone(),
            requests_counted_by: s3.counted_by().into(),
            // To visible, as the local row (the durable rate beside it).
            records_per_s: gs.timed_records as f64
                / gs.visible_secs
                    .ok_or("no graph commit seen holds every record (S3)")?,
            durable_records_per_s: gs.timed_records as f64 / gs.secs,
            secs: gs.secs,
            timed_records: gs.timed_records,
            commits_published: gs.commits_published,
            peak_rss_mib: gs.peak_rss_mib,
            run_loop: gs.run_loop.clone(),
            restarts: gs.restarts,
            backlog_load,
            local_backlog_cpu_cores: r.graphsink_cpu_cores,
            wal_flush_ms: a.wal_flush_ms,
            shards: a.buckets as u64 * if self.has_edges() { 2 } else { 1 },
            ..Default::default()
        };
        out.graph_rows = check_rows(&cfg, "s3 ", r).await?;
        r.counted("graphsink (s3)", gs.records, a.records);
        Ok(out)
    }

    /// graphsink with folding off, then one timed fold. Before the paced
    /// phases, so it reads exactly the backlog.
    pub(super) async fn fold(
        &self,
        a: &Args,
        dir: &Path,
        ends: &[i64],
        r: &mut Report,
    ) -> Result<(), BoxError> {
        eprintln!("graphsink with folding off, then one timed fold ...");
        measure::graphsink_config(
            &self.t,
            dir,
            &Root::local(dir, "graph-nofold"),
            &self.group("nofold"),
            a.buckets,
            sink::FOLD_OFF,
        )?;
        let fold = sink::fold_cost(&self.spec(a, dir, "nofold", ends), a.in_process).await?;
        r.counted("graphsink (folding off)", fold.rows, a.records);
        r.graphsink_nofold_records_per_s = fold.ingest_rate;
        r.fold_rows = fold.rows;
        r.fold_secs = fold.fold.secs;
        r.fold_rows_per_s = fold.rows as f64 / fold.fold.secs;
        r.fold_upserted = fold.fold.upserted;
        r.graphsink_nofold_peak_rss_mib = fold.ingest_peak_rss_mib;
        r.fold_peak_rss_mib = fold.fold.peak_rss_mib;
        r.fold_start_rss_mib = fold.fold.start_rss_mib;
        Ok(())
    }

    /// graphsink, then the bare consumer, under a paced producer; then
    /// graphsink on S3 when there is an S3 run.
    pub(super) async fn latency(
        &self,
        a: &Args,
        dir: &Path,
        r: &mut Report,
        s3: Option<(&S3Bench, &mut S3Report)>,
    ) -> Result<(), BoxError> {
        eprintln!(
            "graphsink under a paced producer ({} records/s for {} s) ...",
            a.latency_rate, a.latency_secs
        );
        let settle = Duration::from_secs(60) + humantime_secs(&a.fold_interval) * 3;
        let cpu = SelfCpu::start();
        let live = sink::live(
            &self.t,
            self.graphsink_config(a, dir)?,
            self.shape,
            a.latency_rate,
            a.latency_secs,
            self.every,
            settle,
            0,
        )
        .await?;
        let local_live_cpu = cpu.cores();
        r.latency_rate_records_per_s = a.latency_rate;
        r.latency_records = live.records;
        if live.durable_ms.len() < live.records {
            r.notes.push(format!(
                "{} paced records never seen committed",
                live.records - live.durable_ms.len()
            ));
        }
        r.durable_ack_latency = Latency::of(live.durable_ms);
        r.graph_visible_latency = Latency::of(live.visible_ms);
        r.graph_visible_unseen = live.unseen;
        r.published_missed = live.missed;
        r.fold_phases_paced = live.fold_phases;
        let bare_records = self.bare_latency(a, settle, live.records, r).await?;

        let Some((s3, out)) = s3 else { return Ok(()) };
        out.local_live_cpu_cores = local_live_cpu;
        // The S3 group committed the backlog; the two paced phases before
        // (each a primer and its paced records) come first.
        out.live_catch_up = (1 + live.records + 1 + bare_records) as u64;
        self.s3_latency(a, dir, s3, out, settle, r).await
    }

    /// The bare consumer under the same paced producer, after graphsink's
    /// `paced` records; the records it timed.
    async fn bare_latency(
        &self,
        a: &Args,
        settle: Duration,
        paced: usize,
        r: &mut Report,
    ) -> Result<usize, BoxError> {
        eprintln!("bare consumer under the same paced producer ...");
        let (bare_ms, bare_records) = sink::bare_live(
            &self.t,
            &self.group("bare-live"),
            self.shape,
            a.latency_rate,
            a.latency_secs,
            self.every,
            settle,
            // The backlog, graphsink's primer and its paced records.
            a.records + 1 + paced as u64,
        )
        .await?;
        r.bare_durable_ack_latency = Latency::of(bare_ms);
        Ok(bare_records)
    }

    /// graphsink on S3 under the same paced producer, with the server's
    /// load.
    async fn s3_latency(
        &self,
        a: &Args,
        dir: &Path,
        s3: &S3Bench,
        out: &mut S3Report,
        settle: Duration,
        r: &mut Report,
    ) -> Result<(), BoxError> {
        eprintln!("graphsink on S3 under the same paced producer ...");
        let mark = s3.mark();
        let s3_live = sink::live(
            &self.t,
            self.s3_config(a, dir, s3)?,
            self.shape,
            a.latency_rate,
            a.latency_secs,
            self.every,
            settle,
            out.live_catch_up,
        )
        .await?;
        let load = s3.since(&mark);
        if s3_live.durable_ms.len() < s3_live.records {
            r.notes.push(format!(
                "s3: {} paced records never seen committed",
                s3_live.records - s3_live.durable_ms.len()
            ));
        }
        if s3_live.unseen > 0 {
            r.notes.push(format!(
                "s3: {} paced records never seen visible",
                s3_live.unseen
            ));
        }
        out.durable_ack_latency = Latency::of(s3_live.durable_ms);
        out.graph_visible_latency = Latency::of(s3_live.visible_ms);
        out.live_load = Some(load);
        Ok(())
    }
}

/// Compares the rows at the head of `cfg`'s graph with `r.expected_rows`
/// and returns them; a difference is a COUNT MISMATCH note (`label` names
/// the run).
pub(super) async fn check_rows(
    cfg: &graphsink::Config,
    label: &str,
    r: &mut Report,
) -> Result<std::collections::BTreeMap<String, usize>, BoxError> {
    let store = graphsink::Store::new(&cfg.graph.storage_options);
    let g = graphsink::Graph::open_readonly(cfg.root_uri(), store).await?;
    let head = g.head().await?;
    let rows = graphsink::row_counts(&g, &head).await?;
    let mut seen = std::collections::BTreeMap::new();
    for (table, want) in &r.expected_rows {
        let got = rows.get(table).copied().unwrap_or(0);
        seen.insert(table.clone(), got);
        if got != *want {
            r.count_mismatch = true;
            r.notes.push(format!(
                "COUNT MISMATCH: {label}{table} holds {got} rows, expected {want}"
            ));
        }
    }
    Ok(seen)
}

/// Seconds of a humantime-like "5s"/"500ms" string, for the settle bound.
fn humantime_secs(s: &str) -> Duration {
    let s = s.trim();
    if let Some(ms) = s.strip_suffix("ms") {
        return Duration::from_millis(ms.parse().unwrap_or(5000));
    }
    Duration::from_secs(s.trim_end_matches('s').parse().unwrap_or(5))
}
