//! `--freshness SECS`: how long after its produce a record is visible to a
//! reader in another process, in a fresh read (`ReadAt::Fresh`: base +
//! unfolded generations + the WAL's tail) and in a head read (the graph
//! commit). The connector runs in this process under a paced producer;
//! the reader is a child (`--freshness-reader`), which alternates fresh and
//! head reads of the rows it has not seen yet and stamps each row with the
//! time the read that first returned it ended (so a figure includes that
//! read's own duration, reported beside it).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use graphsink::{Config, Graph, ReadAt, ReadRequest};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::broker::{BoxError, Broker};
use crate::measure::{now_ms, percentiles};

const SCHEMA: &str = "node F { key: String @key  seq: I64  sent_ms: I64 }\n";

/// What the reader child is told.
#[derive(Serialize, Deserialize)]
pub(crate) struct ReaderSpec {
    pub config: PathBuf,
    pub records: i64,
    /// Give up on rows not seen by then (ms after the start).
    pub deadline_ms: u64,
}

/// What the reader child measured: produce → visible, ms, per record.
#[derive(Serialize, Deserialize, Default)]
pub(crate) struct Visibility {
    pub fresh_ms: Vec<f64>,
    pub head_ms: Vec<f64>,
    pub fresh_read_ms: Vec<f64>,
    pub head_read_ms: Vec<f64>,
}

pub(crate) struct Params<'a> {
    /// An S3 root for the graph instead of the local filesystem.
    pub s3: Option<&'a crate::s3::S3Bench>,
    pub secs: u64,
    pub rate: u64,
    pub partitions: i32,
    pub buckets: u32,
    pub fold_interval: String,
    pub wal_flush_ms: u64,
}

/// The mode: the connector here, a paced producer, the reader a child.
pub(crate) async fn run(broker: &Broker, dir: &Path, p: &Params<'_>) -> Result<(), BoxError> {
    let topic = format!("fresh-{}", std::process::id());
    broker.create_topic(&topic, p.partitions).await?;
    std::fs::write(dir.join("f.pg"), SCHEMA)?;
    let root = match p.s3 {
        Some(s3) => s3.root(&topic),
        None => crate::s3::Root::local(dir, "graph"),
    };
    let toml = |root: &crate::s3::Root| {
        format!(
            "[graph]\nroot = \"{}\"\nschema = \"f.pg\"\n{}[kafka]\n\"bootstrap.servers\" = \"{}\"\n\
             \"group.id\" = \"{topic}\"\n[wal]\nbuckets = {}\nflush_interval = \"{}ms\"\n\
             [fold]\ninterval = \"{}\"\n[[mapping]]\ntopic = \"{topic}\"\nnode = \"F\"\n",
            root.uri,
            root.storage_toml,
            broker.bootstrap,
            p.buckets,
            p.wal_flush_ms,
            p.fold_interval
        )
    };
    let config_path = dir.join("fresh.toml");
    std::fs::write(&config_path, toml(&root))?;
    // The reader's own view of an S3 root goes through a proxy that
    // counts its requests (the writer's go to the server directly).
    let (proxy, reader_config) = match p.s3 {
        Some(s3) => {
            let upstream = s3
                .endpoint()
                .strip_prefix("http://")
                .ok_or("no http:// S3 endpoint")?
                .parse()?;
            let px = graphsink_testkit::FaultProxy::start(upstream)?;
            let path = dir.join("fresh-reader.toml");
            let via = format!("http://{}", px.addr());
            std::fs::write(&path, toml(&s3.root_via(&topic, &via)))?;
            (Some(px), path)
        }
        None => (None, config_path.clone()),
    };
    let cfg = Config::load(&config_path)?;
    let stop = CancellationToken::new();
    let run = tokio::spawn(graphsink::run_with(
        cfg.clone(),
        Default::default(),
        stop.clone(),
    ));
    let start = Instant::now();
    while Graph::open_configured(&cfg).await.is_err() {
        if start.elapsed() > Duration::from_secs(60) || run.is_finished() {
            stop.cancel();
            return Err("graphsink did not create the graph".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    primer(broker, &topic, &cfg).await?;
    let records = (p.secs * p.rate) as i64;
    let spec = ReaderSpec {
        config: reader_config,
        records,
        deadline_ms: (p.secs + 60) * 1000,
    };
    let spec_path = dir.join("reader.json");
    std::fs::write(&spec_path, serde_json::to_vec(&spec)?)?;
    let child = tokio::process::Command::new(std::env::current_exe()?)
        .arg("--freshness-reader")
        .arg(&spec_path)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let (bs, t, rate, secs) = (broker.bootstrap.clone(), topic.clone(), p.rate, p.secs);
    tokio::task::spawn_blocking(move || produce_paced(&bs, &t, rate, secs)).await??;
    let out = child.wait_with_output().await?;
    stop.cancel();
    run.await??;
    if !out.status.success() {
        return Err(format!("the reader child failed ({})", out.status).into());
    }
    let v: Visibility = serde_json::from_slice(&out.stdout)?;
    print(p, records, &v);
    if let Some(px) = proxy {
        reader_requests(&px.log(), v.fresh_read_ms.len() + v.head_read_ms.len());
    }
    Ok(())
}

/// The reader's S3 requests by method and kind, per read (fresh and head
/// reads together; the reader's opening of the graph included).
fn reader_requests(log: &[graphsink_testkit::Exchange], reads: usize) {
    let mut by: std::collections::BTreeMap<String, usize> = Default::default();
    for e in log {
        *by.entry(format!("{} {}", e.method, crate::s3::kind(&e.path)))
            .or_default() += 1;
    }
    println!(
        "reader's S3 requests: {} over {reads} reads ({:.1} per read)",
        log.len(),
        log.len() as f64 / reads.max(1) as f64
    );
    for (k, n) in by {
        println!(
            "  {k}: {n} ({:.1} per read)",
            n as f64 / reads.max(1) as f64
        );
    }
}

fn print(p: &Params<'_>, records: i64, v: &Visibility) {
    println!(
        "freshness: {records} records at {}/s over {} s, {} partitions, {} buckets, \
         fold.interval {}, wal.flush_interval {} ms; reader in another process; root {}",
        p.rate,
        p.secs,
        p.partitions,
        p.buckets,
        p.fold_interval,
        p.wal_flush_ms,
        if p.s3.is_some() { "S3 (moto)" } else { "local" }
    );
    println!(
        "| read | seen | produce→visible p50 ms | p99 ms | max ms | one read p50 ms | p99 ms |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, lat, reads) in [
        ("fresh", &v.fresh_ms, &v.fresh_read_ms),
        ("head", &v.head_ms, &v.head_read_ms),
    ] {
        let (a, b, c) = percentiles(lat.clone()).unwrap_or_default();
        let (r50, r99, _) = percentiles(reads.clone()).unwrap_or_default();
        println!(
            "| {name} | {} | {a:.0} | {b:.0} | {c:.0} | {r50:.0} | {r99:.0} |",
            lat.len()
        );
    }
}

/// A primer record, awaited until a fresh read shows it: the group has
/// joined and the pipeline runs, so its join is in no record's latency.
async fn primer(broker: &Broker, topic: &str, cfg: &Config) -> Result<(), BoxError> {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &broker.bootstrap)
        .create()?;
    let value = "{\"key\":\"primer\",\"seq\":-1,\"sent_ms\":0}";
    p.send(BaseRecord::to(topic).key("primer").payload(value))
        .map_err(|(e, _)| e)?;
    p.flush(Duration::from_secs(30))?;
    let g = Graph::open_configured(cfg).await?;
    let start = Instant::now();
    loop {
        let rows = g
            .read(&ReadRequest {
                type_name: "F".into(),
                ids: vec!["primer".into()],
                at: ReadAt::Fresh,
                ..Default::default()
            })
            .await?;
        if rows.num_rows() == 1 {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(120) {
            return Err("graphsink did not ingest the primer record".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `rate` records/s for `secs` s in 10 ms ticks, each carrying its send time.
fn produce_paced(bootstrap: &str, topic: &str, rate: u64, secs: u64) -> Result<(), BoxError> {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "1")
        .create()?;
    let per_tick = (rate / 100).max(1);
    let start = Instant::now();
    let mut seq = 0i64;
    for n in 0..secs * 100 {
        for _ in 0..per_tick {
            let sent = chrono::Utc::now().timestamp_millis();
            let key = format!("f{seq}");
            let value = format!("{{\"key\":\"{key}\",\"seq\":{seq},\"sent_ms\":{sent}}}");
            while let Err((e, _)) = p.send(BaseRecord::to(topic).key(&key).payload(&value)) {
                if !matches!(
                    e,
                    rdkafka::error::KafkaError::MessageProduction(
                        rdkafka::types::RDKafkaErrorCode::QueueFull
                    )
                ) {
                    return Err(e.into());
                }
                p.poll(Duration::from_millis(10));
            }
            seq += 1;
        }
        p.poll(Duration::ZERO);
        let next = start + Duration::from_millis(10) * (n as u32 + 1);
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    p.flush(Duration::from_secs(60))?;
    Ok(())
}

/// The child: alternate fresh and head reads until every record was seen
/// by both (or the deadline), then print the figures as JSON.
pub(crate) async fn reader(spec: &Path) -> Result<(), BoxError> {
    let spec: ReaderSpec = serde_json::from_slice(&std::fs::read(spec)?)?;
    let g = Graph::open_configured(&Config::load(&spec.config)?).await?;
    let start = Instant::now();
    let mut out = Visibility::default();
    let mut fresh = Seen::new(spec.records);
    let mut head = Seen::new(spec.records);
    while !(fresh.done() && head.done())
        && start.elapsed() < Duration::from_millis(spec.deadline_ms)
    {
        for (at, seen, lat, reads) in [
            (
                ReadAt::Fresh,
                &mut fresh,
                &mut out.fresh_ms,
                &mut out.fresh_read_ms,
            ),
            (
                ReadAt::Head,
                &mut head,
                &mut out.head_ms,
                &mut out.head_read_ms,
            ),
        ] {
            if seen.done() {
                continue;
            }
            let t0 = Instant::now();
            let rows = g
                .read(&ReadRequest {
                    type_name: "F".into(),
                    filter: Some(format!("seq >= {}", seen.low)),
                    columns: Some(vec!["seq".into(), "sent_ms".into()]),
                    at,
                    ..Default::default()
                })
                .await?;
            let now = now_ms();
            reads.push(t0.elapsed().as_secs_f64() * 1000.0);
            for b in &rows.batches {
                let col = |n: &str| {
                    b.column_by_name(n)
                        .and_then(|c| c.as_any().downcast_ref::<arrow_array::Int64Array>())
                        .cloned()
                        .ok_or("no Int64 column")
                };
                let (seq, sent) = (col("seq")?, col("sent_ms")?);
                for i in 0..b.num_rows() {
                    if seen.insert(seq.value(i)) {
                        lat.push(now - sent.value(i) as f64);
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

/// Which seqs a reader has seen; `low` is the lowest it has not.
struct Seen {
    low: i64,
    above: BTreeSet<i64>,
    records: i64,
}

impl Seen {
    fn new(records: i64) -> Seen {
        Seen {
            low: 0,
            above: BTreeSet::new(),
            records,
        }
    }

    fn insert(&mut self, seq: i64) -> bool {
        if seq < self.low || !self.above.insert(seq) {
            return false;
        }
        while self.above.remove(&self.low) {
            self.low += 1;
        }
        true
    }

    fn done(&self) -> bool {
        self.low >= self.records
    }
}
