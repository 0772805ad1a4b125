//! The security mode (issue 55, "What it costs"): the bare loop and
//! graphsink over each protocol of `--tls`/`--sasl`/`--security` against
//! plaintext, on the same brokers and the same backlog, first on a single
//! node and then (`--cluster N`) on N nodes, where the backlog's producer
//! (`acks=all`) and graphsink's offset commits wait for the replicas.
//!
//! The parent ([`secured_mode`]) starts each cluster (`crate::cluster`),
//! makes the topics and ACLs, and runs the bench again in the cluster's
//! network namespace ([`secured_child`]: `--secured-child SPEC`), where
//! every client of the legs, and graphsink's own process, runs; it prints
//! its figures as JSON.

use std::path::Path;
use std::process::Stdio;

use super::{new_run_id, phases, topics, Run};
use crate::args::Args;
use crate::broker::{BoxError, Broker};
use crate::cluster::{loadavg, BenchCluster, Leg, Protocol, PASSWORD_VAR};
use crate::report::Report;
use crate::s3::SelfCpu;
use crate::{baselines, formats, produce, sink};

/// What the bench in the namespace is told (JSON; no secret: the SCRAM
/// password comes in [`PASSWORD_VAR`]).
#[derive(serde::Serialize, serde::Deserialize)]
struct ChildSpec {
    run_id: String,
    nodes: u32,
    describe: String,
    legs: Vec<Leg>,
    /// The nodes' JVMs (one pid namespace for all hosts), for their CPU.
    broker_pids: Vec<u32>,
}

/// One protocol's phases on one cluster.
#[derive(serde::Serialize, serde::Deserialize, Default, Debug)]
pub(crate) struct LegFigures {
    pub protocol: String,
    pub bare_records_per_s: f64,
    /// The bench's process over the bare loop (its consumer, librdkafka's
    /// threads, TLS), and the nodes' JVMs together.
    pub bare_cpu_secs: Option<f64>,
    pub bare_broker_cpu_secs: Option<f64>,
    pub bare_loadavg: [f64; 3],
    /// Records after the first poll over first fetch → all committed, as
    /// in the Kafka phases.
    pub graphsink_records_per_s: f64,
    pub graphsink_secs: f64,
    pub graphsink_timed_records: u64,
    /// graphsink's process over its whole run (open, ingest, final fold,
    /// close), and the nodes' JVMs over the same time.
    pub graphsink_cpu_secs: Option<f64>,
    pub graphsink_broker_cpu_secs: Option<f64>,
    pub graphsink_peak_rss_mib: Option<f64>,
    pub graphsink_loadavg: [f64; 3],
    pub graph_rows: std::collections::BTreeMap<String, usize>,
    pub count_mismatch: bool,
    pub notes: Vec<String>,
}

/// One cluster size: the backlog's production and every leg.
#[derive(serde::Serialize, serde::Deserialize, Default, Debug)]
pub(crate) struct ClusterFigures {
    pub nodes: u32,
    pub describe: String,
    /// From the first certificate to every node listed (the parent's).
    pub start_secs: f64,
    pub produce_records_per_s: f64,
    pub produce_broker_cpu_secs: Option<f64>,
    pub produce_loadavg: [f64; 3],
    pub legs: Vec<LegFigures>,
}

/// The security mode's report: every cluster of the run.
#[derive(serde::Serialize, Default)]
pub(crate) struct SecuredReport {
    pub build: &'static str,
    pub records: u64,
    pub workload: serde_json::Value,
    pub clusters: Vec<ClusterFigures>,
}

/// The CPU seconds of a set of processes (the nodes' JVMs).
struct PidsCpu(Vec<SelfCpu>);

impl PidsCpu {
    fn start(pids: &[u32]) -> PidsCpu {
        PidsCpu(pids.iter().map(|p| SelfCpu::of(Some(*p))).collect())
    }

    fn secs(&self) -> Option<f64> {
        self.0.iter().map(SelfCpu::secs).sum()
    }
}

/// The parent: for one node, then `--cluster N` nodes, a cluster, its
/// topics and ACLs, and the bench again in its namespace.
pub(crate) async fn secured_mode(
    a: &Args,
    protocols: &[Protocol],
    dir: &Path,
) -> Result<SecuredReport, BoxError> {
    refuse_other_modes(a)?;
    let mut sizes = vec![1];
    if a.cluster > 1 {
        sizes.push(a.cluster);
    }
    let mut report = SecuredReport {
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        records: a.records,
        workload: serde_json::json!({
            "records": a.records, "keys": a.keys, "value_bytes": a.value_bytes,
            "edge_fraction": a.edge_fraction, "partitions": a.partitions, "buckets": a.buckets,
            "fold_interval": a.fold_interval, "commit_interval_ms": a.commit_interval_ms,
            "wal_flush_ms": a.wal_flush_ms, "protocols": protocols.iter().map(|p| p.name()).collect::<Vec<_>>(),
        }),
        ..Default::default()
    };
    for nodes in sizes {
        eprintln!("starting the secured cluster of {nodes} node(s) ...");
        let mut c = BenchCluster::start(nodes)?;
        let spec = child_spec(a, protocols, &mut c)?;
        let path = dir.join(format!("secured-{nodes}.json"));
        std::fs::write(&path, serde_json::to_vec(&spec)?)?;
        let mut cmd = c.host().command(std::env::current_exe()?);
        cmd.args(std::env::args_os().skip(1))
            .arg("--secured-child")
            .arg(&path)
            .env(PASSWORD_VAR, c.password()?)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // spawn, not output(): output() would capture its stderr too.
        let out = tokio::process::Command::from(cmd)
            .spawn()?
            .wait_with_output()
            .await?;
        if !out.status.success() {
            return Err(format!(
                "the bench in the cluster's namespace failed ({})",
                out.status
            )
            .into());
        }
        let mut figures: ClusterFigures = serde_json::from_slice(&out.stdout)?;
        figures.start_secs = c.start_secs;
        report.clusters.push(figures);
    }
    Ok(report)
}

/// Makes the run's topics and ACLs on `c`, and says what the bench in its
/// namespace is to measure.
fn child_spec(
    a: &Args,
    protocols: &[Protocol],
    c: &mut BenchCluster,
) -> Result<ChildSpec, BoxError> {
    let run_id = new_run_id();
    c.prepare(&topics(a, &run_id).names(), a.partitions)?;
    Ok(ChildSpec {
        run_id,
        nodes: c.nodes(),
        describe: c.describe(),
        legs: protocols.iter().map(|p| c.leg(*p)).collect(),
        broker_pids: c.pids(),
    })
}

/// What the security mode does not combine with.
fn refuse_other_modes(a: &Args) -> Result<(), BoxError> {
    if a.format != formats::Format::Json {
        // The test registry listens on the machine's loopback, which the
        // cluster's namespaces do not reach.
        return Err("--tls/--sasl/--security/--cluster read JSON values only".into());
    }
    if a.broker.is_some() || a.s3 || a.s3_endpoint.is_some() {
        return Err(
            "--tls/--sasl/--security/--cluster start their own cluster, on the local disk: \
             drop --broker and --s3"
                .into(),
        );
    }
    Ok(())
}

/// The bench in the cluster's namespace: produce the backlog (plaintext,
/// `acks=all`), then for each leg in order the bare loop and graphsink.
pub(crate) async fn secured_child(
    a: &Args,
    spec: &Path,
    dir: &Path,
) -> Result<ClusterFigures, BoxError> {
    let spec: ChildSpec = serde_json::from_slice(&std::fs::read(spec)?)?;
    let plain = spec
        .legs
        .iter()
        .find(|l| l.protocol == Protocol::Plaintext)
        .ok_or("the legs have no plaintext one")?;
    let base = Run::with_id(
        a,
        &Broker::external(plain.bootstrap.clone()),
        spec.run_id.clone(),
    )?;
    let mut out = ClusterFigures {
        nodes: spec.nodes,
        describe: spec.describe.clone(),
        ..Default::default()
    };
    eprintln!(
        "[{} node(s)] producing {} records (acks=all) to {} ...",
        spec.nodes,
        a.records,
        base.t.topics.names().join(", ")
    );
    out.produce_loadavg = loadavg();
    let cpu = PidsCpu::start(&spec.broker_pids);
    let backlog = {
        let (bs, topics, shape) = (base.t.bootstrap.clone(), base.t.topics.clone(), base.shape);
        let (n, codec) = (a.records, formats::Codec::of(&base.t.values)?);
        tokio::task::spawn_blocking(move || {
            produce::produce_backlog(&bs, &topics, shape, n, &codec)
        })
        .await??
    };
    out.produce_broker_cpu_secs = cpu.secs();
    out.produce_records_per_s = backlog.records_per_s;
    let password = std::env::var(PASSWORD_VAR).ok();
    for leg in &spec.legs {
        let run = base.for_leg(leg, password.as_deref())?;
        let leg_dir = dir.join(format!("n{}-{}", spec.nodes, leg.protocol.name()));
        std::fs::create_dir_all(&leg_dir)?;
        let f = run
            .security_leg(a, &leg_dir, &backlog.ends, &spec.broker_pids, leg.protocol)
            .await?;
        out.legs.push(f);
    }
    Ok(out)
}

impl Run {
    /// This run read over `leg`: its bootstrap and security properties (the
    /// SCRAM password from the environment), and groups of its own.
    fn for_leg(&self, leg: &Leg, password: Option<&str>) -> Result<Run, BoxError> {
        let mut t = self.t.clone();
        t.bootstrap = leg.bootstrap.clone();
        t.security = leg.security.clone();
        if leg.protocol == Protocol::SaslSsl {
            let pw = password.ok_or_else(|| format!("{PASSWORD_VAR} is not set"))?;
            t.security.push(("sasl.password".into(), pw.into()));
        }
        Ok(Run {
            t,
            shape: self.shape,
            nodes: self.nodes,
            edges: self.edges,
            run_id: format!("{}-{}", self.run_id, leg.protocol.name()),
            every: self.every,
            broker_pid: None,
            broker_describe: self.broker_describe.clone(),
            _registry: None,
        })
    }

    /// The bare loop, then graphsink in its own process, over this run's
    /// protocol, each with the CPU of its process and of the nodes.
    async fn security_leg(
        &self,
        a: &Args,
        dir: &Path,
        ends: &[i64],
        pids: &[u32],
        protocol: Protocol,
    ) -> Result<LegFigures, BoxError> {
        let name = protocol.name();
        let nodes = self.t.bootstrap.split(',').count();
        let mut f = LegFigures {
            protocol: name.into(),
            ..Default::default()
        };
        let mut r = Report::default();
        eprintln!("[{nodes} node(s), {name}] bare consumer ...");
        f.bare_loadavg = loadavg();
        let (broker, own) = (PidsCpu::start(pids), SelfCpu::start());
        let (tc, group, e) = (self.t.clone(), self.group("bare"), ends.to_vec());
        let bare = tokio::task::spawn_blocking(move || baselines::bare(&tc, &group, &e)).await??;
        f.bare_cpu_secs = own.secs();
        f.bare_broker_cpu_secs = broker.secs();
        f.bare_records_per_s = bare.rate();
        r.counted("bare", bare.records, a.records);

        eprintln!("[{nodes} node(s), {name}] graphsink over the backlog ...");
        f.graphsink_loadavg = loadavg();
        let cfg = self.graphsink_config(a, dir)?;
        let spec = self.spec(a, dir, "graphsink", ends);
        let broker = PidsCpu::start(pids);
        let gs = sink::backlog_phase(&spec, a.in_process).await?;
        f.graphsink_broker_cpu_secs = broker.secs();
        f.graphsink_records_per_s = gs.timed_records as f64 / gs.secs;
        f.graphsink_secs = gs.secs;
        f.graphsink_timed_records = gs.timed_records;
        f.graphsink_cpu_secs = gs.cpu_secs;
        f.graphsink_peak_rss_mib = gs.peak_rss_mib;
        self.expected_rows(a, &mut r);
        f.graph_rows = phases::check_rows(&cfg, "", &mut r).await?;
        r.counted("graphsink", gs.records, a.records);
        f.count_mismatch = r.count_mismatch;
        f.notes = r.notes;
        Ok(f)
    }
}

impl SecuredReport {
    /// One row per cluster and protocol; CPU in µs per record.
    pub(crate) fn print(&self) {
        let per = |s: Option<f64>| {
            s.map_or("-".into(), |s| {
                format!("{:.2}", s * 1e6 / self.records.max(1) as f64)
            })
        };
        println!(
            "graphsink-bench ({} build), security mode: {}",
            self.build, self.workload
        );
        println!("| nodes | protocol | bare rec/s | bare CPU µs/rec | graphsink rec/s | ×bare | graphsink CPU µs/rec | broker CPU µs/rec (bare / graphsink) | load avg 1 min (bare / graphsink) |");
        println!("|---|---|---|---|---|---|---|---|---|");
        for c in &self.clusters {
            for l in &c.legs {
                println!(
                    "| {} | {} | {:.0} | {} | {:.0} | {:.3} | {} | {} / {} | {:.1} / {:.1} |",
                    c.nodes,
                    l.protocol,
                    l.bare_records_per_s,
                    per(l.bare_cpu_secs),
                    l.graphsink_records_per_s,
                    l.graphsink_records_per_s / l.bare_records_per_s,
                    per(l.graphsink_cpu_secs),
                    per(l.bare_broker_cpu_secs),
                    per(l.graphsink_broker_cpu_secs),
                    l.bare_loadavg[0],
                    l.graphsink_loadavg[0],
                );
            }
        }
        for c in &self.clusters {
            println!(
                "{} node(s): started in {:.1} s; produced {:.0} records/s (acks=all; broker CPU {} µs/rec; load {:.1})",
                c.nodes,
                c.start_secs,
                c.produce_records_per_s,
                per(c.produce_broker_cpu_secs),
                c.produce_loadavg[0]
            );
            for l in &c.legs {
                for n in &l.notes {
                    println!("  {} {}: {n}", c.nodes, l.protocol);
                }
            }
        }
    }

    pub(crate) fn count_mismatch(&self) -> bool {
        self.clusters
            .iter()
            .flat_map(|c| &c.legs)
            .any(|l| l.count_mismatch)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// The security mode small, in the debug build, on one node: the bare
    /// loop and graphsink count every record over every protocol, and each
    /// leg's graph holds one row per key. The bench's half in the
    /// namespace runs in this process, on a thread that entered it (this
    /// binary is the test's, not the bench's). Not a timed test.
    #[test]
    fn every_protocol_counts_every_record() {
        let a = Args::parse_from([
            "graphsink-bench",
            "--tls",
            "--sasl",
            "--security",
            "ssl",
            "--records",
            "3000",
            "--partitions",
            "2",
            "--fold-interval",
            "1s",
            "--in-process",
        ]);
        let protocols = a.protocols().unwrap();
        assert_eq!(
            protocols,
            [Protocol::Plaintext, Protocol::Ssl, Protocol::SaslSsl]
        );
        let mut c = BenchCluster::start(1).expect("a secured single node");
        let spec = child_spec(&a, &protocols, &mut c).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spec.json");
        std::fs::write(&path, serde_json::to_vec(&spec).unwrap()).unwrap();
        std::env::set_var(PASSWORD_VAR, c.password().unwrap());
        let figures = c
            .host()
            .enter(|| {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(secured_child(&a, &path, dir.path()))
                    .map_err(|e| e.to_string())
            })
            .unwrap()
            .expect("every leg");
        assert!(figures.produce_records_per_s > 0.0);
        let names: Vec<&str> = figures.legs.iter().map(|l| l.protocol.as_str()).collect();
        assert_eq!(names, ["plaintext", "ssl", "sasl_ssl"]);
        for l in &figures.legs {
            assert!(!l.count_mismatch, "{l:?}");
            // graphsink's rate may be 0 here: its first poll can take
            // every record of so small a backlog, and only later ones are
            // timed.
            assert!(l.bare_records_per_s > 0.0, "{l:?}");
            // The rows the keys make: a mismatch is in count_mismatch.
            assert!(l.graph_rows["nodes/Item"] > 0, "{l:?}");
        }
    }
}
