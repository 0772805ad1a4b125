//! Fold cost against graph size: the same fold (`rows` rows, half updates
//! of existing ids, half new) timed into one graph as its tables grow to
//! each of `sizes` rows. Three folds per size, one per type:
//! - `Item` nodes (a merge-insert, no checks that need the base);
//! - `Link` edges: endpoints only (every edge needs both ends to exist);
//! - `Tied` edges: endpoints, `@card(0..64)` per `src` and `@unique(src, dst)`.
//!
//! Runs in process without Kafka, like `history`: rows go through the
//! decoder and the shard writers as the run loop sends them, and each fold
//! is the fold loop's cut → plan → execute → publish. The graph grows by
//! folds of `--size-chunk` rows of each type, which are not measured.

use std::path::Path;
use std::time::Instant;

use graphsink::testing::{RecordDecoder, ShardPool, SourceRecord, StageTimes};
use graphsink::Graph;
use serde::Serialize;

use crate::broker::BoxError;
use crate::history::timed_fold;

/// The schema: `Link` has no constraint past its endpoints; `Tied` has both
/// fold-time constraints. `@card`'s bound is far above the random
/// out-degree (about 1 per node), so the measured folds reject nothing.
pub(crate) const SCHEMA: &str = "node Item {\n    sku: String @key\n    seq: I64\n    pad: String\n}\nedge Link: Item -> Item {\n    seq: I64\n    pad: String\n}\nedge Tied: Item -> Item @card(0..64) {\n    seq: I64\n    pad: String\n    @unique(src, dst)\n}\n";

const TYPES: [(&str, &str); 3] = [("items", "Item"), ("links", "Link"), ("ties", "Tied")];

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Probe {
    /// Rows of the table before the fold.
    pub size: u64,
    /// The type folded.
    pub kind: &'static str,
    pub rows: usize,
    pub rejects: usize,
    /// cut (freeze + flush) → published.
    pub fold_secs: f64,
    pub stages: StageTimes,
    pub table_fragments: usize,
}

pub(crate) struct Params {
    pub sizes: Vec<u64>,
    pub rows: usize,
    pub chunk: u64,
    pub buckets: u32,
    pub value_bytes: usize,
    /// `fold.known_ids_max`: what fits is replaced by address, the rest
    /// by Lance's merge-insert, whose cost grows with the table.
    pub known_ids_max: usize,
}

/// The config of the size graph (root `size`, schema `size.pg`), no broker.
pub(crate) fn config_toml(buckets: u32, known_ids_max: usize) -> String {
    let mut toml = format!(
        "[graph]\nroot = \"size\"\nschema = \"size.pg\"\n[kafka]\n\"bootstrap.servers\" = \"unused:1\"\n\"group.id\" = \"unused\"\n[wal]\nbuckets = {buckets}\n[errors]\nmax_pending_edges = 100000000\n[fold]\nknown_ids_max = {known_ids_max}\n",
    );
    for (topic, ty) in TYPES {
        let (kind, key) = if ty == "Item" {
            ("node", "value")
        } else {
            ("edge", "kafka")
        };
        toml += &format!("[[mapping]]\ntopic = \"{topic}\"\n{kind} = \"{ty}\"\nkey = \"{key}\"\n");
    }
    toml
}

/// Grows the graph to each size in turn and times one fold per type there.
pub(crate) async fn run(dir: &Path, p: &Params) -> Result<Vec<Probe>, BoxError> {
    std::fs::write(dir.join("size.pg"), SCHEMA)?;
    let toml = config_toml(p.buckets, p.known_ids_max);
    let cfg = graphsink::Config::from_toml(&toml, dir)?;
    let schema = graphsink::GraphSchema::load(&cfg.schema_path())?;
    let graph = Graph::open_or_init(&cfg, schema).await?;
    let policies = graphsink::testing::Policies::from_config(&cfg);
    let batch = p.chunk.max(p.rows as u64) as usize;
    let mut w = Writer::open(&graph, &cfg, batch, p.value_bytes).await?;
    // Rows per type: ids `0..have` exist in every table.
    let mut have = 0u64;
    let mut out = Vec::new();
    for &size in &p.sizes {
        let t = Instant::now();
        while have < size {
            let n = p.chunk.min(size - have);
            let nodes = have + n;
            for k in 0..TYPES.len() {
                let recs = (have..have + n).map(|i| w.record(k, i, nodes)).collect();
                w.put(k, recs).await?;
            }
            timed_fold(&graph, &policies, &w.pool).await?;
            have += n;
        }
        eprintln!(
            "  grown to {have} rows per type in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        for (k, (_, kind)) in TYPES.iter().enumerate() {
            // Half updates of existing ids, half new ones.
            let half = p.rows as u64 / 2;
            let mut recs: Vec<_> = (0..half)
                .map(|_| {
                    let i = w.next() % have;
                    w.record(k, i, have)
                })
                .collect();
            recs.extend((have..have + (p.rows as u64 - half)).map(|i| w.record(k, i, have)));
            w.put(k, recs).await?;
            let f = timed_fold(&graph, &policies, &w.pool).await?;
            let data = graph.open_table(&w.tables[k], None).await?;
            let probe = Probe {
                size: have,
                kind,
                rows: p.rows,
                rejects: f.rejects,
                fold_secs: f.fold_secs,
                stages: f.stages,
                table_fragments: data.get_fragments().len(),
            };
            eprintln!("  {probe:?}");
            out.push(probe);
        }
        // The new ids of the measured folds exist in their own tables only;
        // the next chunk starts past them in every table.
        have += p.rows as u64 - p.rows as u64 / 2;
    }
    w.pool.close().await?;
    Ok(out)
}

/// Makes records of the three types and writes them durably.
pub(crate) struct Writer {
    decoders: Vec<RecordDecoder>,
    pub(crate) pool: ShardPool,
    tables: Vec<String>,
    pad: String,
    offset: i64,
    rng: u64,
}

impl Writer {
    /// Claims every shard of `graph` (configured as `run` writes it).
    pub(crate) async fn open(
        graph: &Graph,
        cfg: &graphsink::Config,
        batch: usize,
        value_bytes: usize,
    ) -> Result<Writer, BoxError> {
        Ok(Writer {
            decoders: cfg
                .mappings
                .iter()
                .map(|m| RecordDecoder::new(graph.schema(), m, batch, 1 << 20))
                .collect::<Result<_, _>>()?,
            pool: ShardPool::open(graph, &cfg.wal, &graph.wal_tables()).await?,
            tables: TYPES
                .iter()
                .map(|(_, ty)| graph.schema().get(ty).expect("in the schema").table.clone())
                .collect(),
            pad: "x".repeat(value_bytes.saturating_sub(60)),
            offset: 0,
            rng: 0x5eed_5123,
        })
    }

    /// Source offsets continue from `offset` (a writer reopened on the
    /// same graph).
    pub(crate) fn starting_at(mut self, offset: i64) -> Writer {
        self.offset = offset;
        self
    }

    pub(crate) fn offset(&self) -> i64 {
        self.offset
    }

    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Record `i` of type `k` (key, value); edges point at nodes `0..nodes`.
    pub(crate) fn record(&mut self, k: usize, i: u64, nodes: u64) -> (String, String) {
        if k == 0 {
            let v = format!(
                "{{\"sku\":\"k{i:010}\",\"seq\":{i},\"pad\":\"{}\"}}",
                self.pad
            );
            return (String::new(), v);
        }
        let (src, dst) = (self.next() % nodes, self.next() % nodes);
        let v = format!(
            "{{\"src\":\"k{src:010}\",\"dst\":\"k{dst:010}\",\"seq\":{i},\"pad\":\"{}\"}}",
            self.pad
        );
        (format!("e{i:010}"), v)
    }

    /// Decodes `recs` of type `k` and waits until their WAL writes are durable.
    pub(crate) async fn put(
        &mut self,
        k: usize,
        recs: Vec<(String, String)>,
    ) -> Result<(), BoxError> {
        let topic = TYPES[k].0;
        let src: Vec<SourceRecord<'_>> = recs
            .iter()
            .enumerate()
            .map(|(j, (key, v))| SourceRecord {
                topic,
                partition: 0,
                offset: self.offset + j as i64,
                timestamp: None,
                key: (!key.is_empty()).then_some(key.as_bytes()),
                value: Some(v.as_bytes()),
                message: None,
            })
            .collect();
        self.offset += recs.len() as i64;
        let mut writes = Vec::new();
        for part in src.chunks(50_000) {
            let decoded = self.decoders[k].decode(part)?;
            if !decoded.rejects.is_empty() {
                return Err(
                    format!("{} rejects while decoding {topic}", decoded.rejects.len()).into(),
                );
            }
            if let Some(u) = decoded.upserts {
                writes.extend(self.pool.tables[&self.tables[k]].put(u).await?);
            }
        }
        for w in writes {
            w.wait().await?;
        }
        Ok(())
    }
}
