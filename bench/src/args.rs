//! The command line. Flags that choose a mode (`--history`, `--sizes`,
//! `--evolve-sizes`, `--storage`) replace the Kafka phases; the hidden
//! ones run a backlog phase or a fold in a child process.

use std::path::PathBuf;

use clap::Parser;

use crate::formats;

#[derive(Parser, Debug)]
#[command(about = "Benchmark graphsink against a bare consumer and a direct Lance load")]
pub(crate) struct Args {
    /// Use this broker (host:port) instead of starting one.
    #[arg(long)]
    pub broker: Option<String>,
    /// The private broker to start: `kafka` (Apache Kafka 4.4, KRaft, from
    /// scripts/lib.sh's ensure_kafka) or `tansu` (the first rounds' broker).
    #[arg(long, default_value = "kafka")]
    pub broker_backend: String,
    /// The tansu binary (default ~/.cache/graphsink/tansu-0.6.0/bin/tansu).
    #[arg(long)]
    pub tansu_bin: Option<PathBuf>,
    /// Records in the backlog.
    #[arg(long, default_value_t = 1_000_000)]
    pub records: u64,
    /// Key space (distinct node ids); default records/2, so about half the
    /// records update an earlier key.
    #[arg(long)]
    pub keys: Option<u64>,
    /// Approximate JSON value size in bytes (a padded string property).
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// The values' format: `json` (plain JSON, as always), or `avro` or
    /// `protobuf` in the Confluent wire format, with the schemas registered
    /// in the testkit's in-process registry. The same records' fields and
    /// values in each; the direct-load baseline reads JSON only and is
    /// skipped for the others.
    #[arg(long, value_enum, default_value_t = formats::Format::Json)]
    pub format: formats::Format,
    /// JSON values wrapped as Debezium change events (`debezium`: the bare
    /// event; `debezium-schema`: in the JSON converter's `{schema,
    /// payload}`), read by graphsink with `envelope = "debezium"` and one
    /// field path (docs/cdc.md); `none` (default) is today's plain values.
    #[arg(long, value_enum, default_value_t = formats::Envelope::None)]
    pub envelope: formats::Envelope,
    /// Fraction of the records that are edges (`Link: Item -> Item`, on a
    /// second topic, endpoints drawn from the backlog's node records); 0
    /// produces node records only.
    #[arg(long, default_value_t = 0.0)]
    pub edge_fraction: f64,
    /// Partitions of each topic.
    #[arg(long, default_value_t = 8)]
    pub partitions: i32,
    /// Buckets N per type (`wal.buckets`).
    #[arg(long, default_value_t = 4)]
    pub buckets: u32,
    /// Records per batch of the direct-load baseline.
    #[arg(long, default_value_t = 50_000)]
    pub direct_batch: usize,
    /// `fold.interval` of the measured graphsink runs.
    #[arg(long, default_value = "5s")]
    pub fold_interval: String,
    /// Paced producer rate for the latency phase (records/s); 0 skips it.
    #[arg(long, default_value_t = 5_000)]
    pub latency_rate: u64,
    #[arg(long, default_value_t = 10)]
    pub latency_secs: u64,
    /// Committed-offset sampling interval (the durable-ack resolution).
    #[arg(long, default_value_t = 10)]
    pub sample_ms: u64,
    /// Extra librdkafka property KEY=VALUE for every measured consumer
    /// (graphsink and both baselines); repeatable.
    #[arg(long = "consumer-prop", value_parser = parse_prop)]
    pub consumer_props: Vec<(String, String)>,
    /// Extra librdkafka property KEY=VALUE for graphsink's dead-letter
    /// producer (`[errors.producer]`); repeatable.
    #[arg(long = "dead-letter-prop", value_parser = parse_prop)]
    pub dead_letter_props: Vec<(String, String)>,
    /// Extra graphsink `[wal]` setting KEY=VALUE, VALUE in TOML (e.g.
    /// `max_poll_records=20000`; a duration needs quotes: `'"50ms"'`);
    /// repeatable. `buckets` and `flush_interval` have their own flags
    /// (`--buckets`, `--wal-flush-ms`) and are refused here.
    #[arg(long = "wal-prop", value_parser = parse_prop)]
    pub wal_props: Vec<(String, String)>,
    /// Fraction of node records that are bad (reject storms): alternately
    /// a decode reject (`wrong_type`) and a validate reject (`range`). The
    /// direct load skips them (a JSON parse per record, only when > 0).
    #[arg(long, default_value_t = 0.0)]
    pub bad_fraction: f64,
    /// The mappings' `coerce`: "strict" (the default) checks each value's
    /// numbers in the value screen; "lenient" checks only its JSON.
    #[arg(long, default_value = "strict", value_parser = ["strict", "lenient"])]
    pub coerce: String,
    /// `fetch.wait.max.ms` of every measured consumer; 0 keeps librdkafka's
    /// 500 ms. tansu 0.6 holds each fetch for the whole wait even when data
    /// is there, so at 500 ms every consumer measures the broker's wait.
    #[arg(long, default_value_t = 5)]
    pub fetch_wait_ms: u64,
    /// Instead of the Kafka phases: fold cost against graph history. Times
    /// folds of `--history-rows` rows at these commit numbers (comma list,
    /// e.g. 10,1000), with folds of `--history-filler` rows in between.
    #[arg(long, value_delimiter = ',')]
    pub history: Vec<u64>,
    #[arg(long, default_value_t = 20_000)]
    pub history_rows: usize,
    #[arg(long, default_value_t = 100)]
    pub history_filler: usize,
    /// Instead of the Kafka phases: fold cost against graph size. Grows one
    /// graph to each of these sizes (rows per type, comma list, e.g.
    /// 100000,1000000,10000000) and times a fold of `--size-rows` rows of
    /// each type there (nodes; edges; edges with `@card` and `@unique`).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<u64>,
    #[arg(long, default_value_t = 20_000)]
    pub size_rows: usize,
    /// Rows per type of each (unmeasured) fold that grows the graph.
    #[arg(long, default_value_t = 500_000)]
    pub size_chunk: u64,
    /// `fold.known_ids_max` of the size graph: 40M keeps every id of three
    /// 10M-row tables, so folds replace rows by address; 0 keeps none
    /// (every fold scans its tables' keys: the merge-insert baseline).
    #[arg(long, default_value_t = 40_000_000)]
    pub size_known_ids: usize,
    /// Instead of the Kafka phases: the pause of a schema change. Grows
    /// the size graph's `Item` table to each of these sizes (comma list)
    /// and times a start that adds an optional property, with nothing
    /// unfolded and with `--evolve-unfolded` rows in the WAL, beside a fold
    /// of as many rows with no change (docs/schema-evolution.md).
    #[arg(long, value_delimiter = ',')]
    pub evolve_sizes: Vec<u64>,
    #[arg(long, default_value_t = 100_000)]
    pub evolve_unfolded: usize,
    /// Instead of the Kafka phases: storage against time. Folds this many
    /// times a steady stream of `--storage-rows` updates per fold over
    /// `--storage-keys` keys, measuring bytes on disk after each fold, with
    /// retention (keep `--storage-keep-commits`, `keep_for = 0s`) and without.
    #[arg(long, default_value_t = 0)]
    pub storage: u64,
    #[arg(long, default_value_t = 5_000)]
    pub storage_keys: u64,
    #[arg(long, default_value_t = 2_000)]
    pub storage_rows: usize,
    /// Polls (durable WAL writes) per fold.
    #[arg(long, default_value_t = 4)]
    pub storage_polls: usize,
    #[arg(long, default_value_t = 10)]
    pub storage_keep_commits: usize,
    /// Print every this many folds of the curve.
    #[arg(long, default_value_t = 25)]
    pub storage_step: u64,
    /// Offset commit cadence (ms) of graphsink and of the bare loop. Short,
    /// so a run's end is not rounded up to a commit tick.
    #[arg(long, default_value_t = 100)]
    pub commit_interval_ms: u64,
    /// graphsink's `wal.flush_interval` (ms): the longest a put waits for
    /// its WAL entry to be durable.
    #[arg(long, default_value_t = 20)]
    pub wal_flush_ms: u64,
    /// graphsink's `runtime.background_nice`: how many nice levels the
    /// runtime's workers and blocking pool run below the main thread, which
    /// runs every phase's consume loop (0: off). Every phase shares the
    /// runtime, so the baselines run with it too.
    #[arg(long, default_value_t = graphsink::RuntimeSettings::default().background_nice)]
    pub background_nice: i32,
    /// Internal: fold the graph of this config once and print the cost as
    /// JSON (the fold-cost phase runs it as a child process).
    #[arg(long, hide = true)]
    pub fold_config: Option<PathBuf>,
    /// Internal: run graphsink's backlog phase described by this JSON spec
    /// and print what it measured as JSON (the backlog phases run it as a
    /// child process, so their memory and CPU are their own).
    #[arg(long, hide = true)]
    pub backlog_child: Option<PathBuf>,
    /// Internal: run the backlog phases and the fold in this process
    /// instead of children (the tests, whose binary is not the bench's).
    #[arg(long, hide = true, alias = "fold-in-process")]
    pub in_process: bool,
    /// Instead of the Kafka phases: for this many seconds of a paced
    /// producer (`--freshness-rate`/s), produce → visible latency for a
    /// reader in another process, in a fresh read and in a head read.
    #[arg(long, default_value_t = 0)]
    pub freshness: u64,
    #[arg(long, default_value_t = 200)]
    pub freshness_rate: u64,
    /// Instead of the Kafka phases: the cost of `neighbors`' access path
    /// (a Lance scan filtered on `src`/`dst`) on an edge table of N rows.
    #[arg(long, default_value_t = 0)]
    pub hop_edges: u64,
    /// Internal: the reader child of `--freshness`.
    #[arg(long, hide = true)]
    pub freshness_reader: Option<PathBuf>,
    /// Write the report as JSON here too.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Keep graphs and logs here (default: a temp dir, removed at the end).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Also run graphsink's backlog and paced phases on an `s3://` root on a
    /// private moto server (graphsink-testkit's S3Server), right after the
    /// same phases on the local filesystem.
    #[arg(long)]
    pub s3: bool,
    /// Like --s3, on this S3 server (http://host:port) instead of a private
    /// moto; it must enforce conditional PUTs.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// moto_server for --s3 (default ~/.cache/graphsink/moto-venv/bin/moto_server).
    #[arg(long)]
    pub moto_bin: Option<PathBuf>,
    /// With --s3-endpoint: the server's pid, so its CPU time is sampled.
    #[arg(long)]
    pub s3_pid: Option<u32>,
    /// Count S3 requests through a rule-less FaultProxy in front of the
    /// server (an extra loopback hop) instead of moto's request log.
    #[arg(long)]
    pub s3_count_proxy: bool,
    /// Instead of the Kafka phases: what security costs (issue 55). The
    /// bare loop and graphsink read one backlog over TLS (`SSL`, with a
    /// client certificate) as well as over plaintext, on the secured test
    /// cluster (docs/security.md). With `--sasl`: over `SASL_SSL`
    /// (SCRAM-SHA-512) instead.
    #[arg(long)]
    pub tls: bool,
    /// With `--tls`: `SASL_SSL` with SCRAM-SHA-512 against plaintext. (The
    /// test cluster serves SASL over TLS only, as production clusters do.)
    #[arg(long)]
    pub sasl: bool,
    /// The protocols to compare, in the order measured (comma list of
    /// `plaintext`, `ssl`, `sasl_ssl`); plaintext is always measured, first
    /// when not listed. Adds to what `--tls` and `--sasl` choose.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub security: Vec<crate::cluster::Protocol>,
    /// Also measure on a cluster of this many nodes (replication factor
    /// N, `min.insync.replicas=2`, the producer's `acks=all` waiting for
    /// the replicas) after the single node, in the same run and on the same
    /// records. Alone, it compares the two over plaintext.
    #[arg(long, default_value_t = 0)]
    pub cluster: u32,
    /// Internal: the security legs of one cluster, run by the bench in the
    /// cluster's network namespace (the spec is JSON).
    #[arg(long, hide = true)]
    pub secured_child: Option<PathBuf>,
}

impl Args {
    /// The security mode's protocols in the order measured, or none when
    /// no flag of that mode is given.
    pub(crate) fn protocols(&self) -> Result<Vec<crate::cluster::Protocol>, String> {
        use crate::cluster::Protocol;
        if !self.tls && !self.sasl && self.security.is_empty() && self.cluster == 0 {
            return Ok(Vec::new());
        }
        if self.sasl && !self.tls {
            return Err(
                "--sasl needs --tls: the test cluster serves SASL over TLS only (SASL_SSL)".into(),
            );
        }
        let mut out = self.security.clone();
        match (self.tls, self.sasl) {
            (true, true) => out.push(Protocol::SaslSsl),
            (true, false) => out.push(Protocol::Ssl),
            _ => {}
        }
        if !out.contains(&Protocol::Plaintext) {
            out.insert(0, Protocol::Plaintext);
        }
        let mut seen = Vec::new();
        out.retain(|p| {
            let new = !seen.contains(p);
            seen.push(*p);
            new
        });
        Ok(out)
    }
}

fn parse_prop(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::Args;

    /// `--security` takes the names the report prints (and clap's
    /// kebab-case spelling), in the order given, plaintext first if absent.
    #[test]
    fn security_takes_the_reports_names() {
        use clap::Parser;
        for list in ["ssl,sasl_ssl", "ssl,sasl-ssl"] {
            let a = Args::parse_from(["graphsink-bench", "--security", list]);
            assert_eq!(
                a.protocols().unwrap(),
                [
                    crate::cluster::Protocol::Plaintext,
                    crate::cluster::Protocol::Ssl,
                    crate::cluster::Protocol::SaslSsl
                ]
            );
        }
        let a = Args::parse_from(["graphsink-bench", "--security", "sasl_ssl,plaintext"]);
        assert_eq!(
            a.protocols().unwrap(),
            [
                crate::cluster::Protocol::SaslSsl,
                crate::cluster::Protocol::Plaintext
            ]
        );
    }
}
