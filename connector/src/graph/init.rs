//! First-start creation of a graph root: every table, its MemWAL index,
//! then the init commit in `__manifest`, which marks completion.

use std::collections::BTreeMap;
use std::time::Duration;

use arrow::array::RecordBatchIterator;
use lance::dataset::mem_wal::DatasetMemWalExt;
use lance::dataset::WriteMode;
use lance::Dataset;

use crate::config::{Config, Sharding};
use crate::error::{Context, Error, Result};
use crate::schema::{TableLayout, MANIFEST_TABLE, REJECTS_TABLE, SRC_PARTITION};
use crate::types::{now_ms, PartitionOffsets};

use super::layout::{SchemaRecord, SCHEMA_ID};
use super::manifest::{ManifestRow, ManifestRows};
use super::{is_lance_not_found, is_not_found, new_commit_id, Graph, GraphCommit};

impl Graph {
    /// Initialises a new graph once, however many processes start on it
    /// together. Two Lance creates racing on one path do not both fail:
    /// the loser's lands as an overwrite at the next version and drops what
    /// the winner built (its MemWAL index). So a process first claims the
    /// root with an atomic create of `_graphsink_init/<n>`; the one that
    /// gets it initialises, the others wait for its `__manifest` and open
    /// it. A claim older than `INIT_WAIT` with no manifest is a claimant
    /// that died: the next claim number takes over (init is idempotent).
    pub(super) async fn init_once(&mut self, config: &Config) -> Result<()> {
        const INIT_WAIT: Duration = Duration::from_secs(60);
        let me = new_commit_id();
        for n in 0u32.. {
            let claim = format!("{}/_graphsink_init/{n}", self.root);
            if self
                .store
                .create_if_absent(&claim, me.as_bytes())
                .await
                .ctx(format!("claim {claim}"))?
            {
                return self.init().await;
            }
            loop {
                match self.open_manifest().await {
                    Ok(_) => {
                        tracing::info!(root = %self.root, "another process initialised the graph; using it");
                        return self.check_compatible(config).await;
                    }
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e),
                }
                match self.store.age(&claim).await.ctx(format!("read {claim}"))? {
                    Some(age) if age < INIT_WAIT => {
                        tokio::time::sleep(Duration::from_millis(200)).await
                    }
                    _ => {
                        tracing::warn!(root = %self.root, %claim, "a claim to initialise the graph is older than {INIT_WAIT:?} with no graph: its process died; taking over");
                        break;
                    }
                }
            }
        }
        unreachable!("claim numbers do not run out")
    }

    /// Creates tables, MemWAL and shard manifests, then the init commit.
    /// Each step tolerates having run before, so a crash mid-init is redone
    /// on the next start; `__manifest` is written last and marks completion.
    async fn init(&self) -> Result<()> {
        if self.layout.sharding == Sharding::Partition && self.layout.partitions.is_empty() {
            return Err(Error::config(format!(
                "no graph at {} yet, and creating one with wal.sharding = \"partition\" needs \
                 the mapped topics' partition counts: start it with graphsink run",
                self.root
            )));
        }
        tracing::info!(root = %self.root, sharding = self.layout.sharding.as_str(), "initialising graph");
        let mut tables = BTreeMap::new();
        for layout in self.schema.tables() {
            let n = self.layout.counts.get(&layout.name).copied();
            let ds = self.init_table(&layout, n).await?;
            tables.insert(layout.name, ds.version().version);
        }
        let record = SchemaRecord {
            source: self.schema.source.clone(),
            shard_counts: self.layout.counts.clone(),
            sharding: self.layout.sharding,
            partitions: self.layout.partitions.clone(),
            version: 0,
        };
        let commit = GraphCommit {
            id: new_commit_id(),
            seq: 0,
            parent: None,
            actor: "graphsink init".into(),
            created_at: now_ms(),
            tables,
            folded: vec![],
            offsets: vec![],
            stats: BTreeMap::new(),
            dead_letters_delivered: 0,
            folder: None,
            dead_letter_since: PartitionOffsets::new(),
            schema_version: 0,
            schema_change: None,
        };
        let mut rows = ManifestRows::default();
        rows.push_commit(&commit);
        rows.push(ManifestRow {
            object_id: SCHEMA_ID.into(),
            kind: "graph_schema",
            payload: Some(serde_json::to_string(&record).expect("serializable")),
            ..Default::default()
        });
        let batch = rows.into_batch();
        let schema = batch.schema();
        let uri = self.table_uri(MANIFEST_TABLE);
        let params = self.store.write_params(WriteMode::Create);
        Dataset::write(
            RecordBatchIterator::new(vec![Ok(batch)], schema),
            &uri,
            Some(params),
        )
        .await
        .ctx(format!("create {uri}"))?;
        Ok(())
    }

    /// Creates one table; with a shard count, also its MemWAL index. Shard
    /// manifests are the writers' (`shards`), created when a pool opens.
    pub(super) async fn init_table(
        &self,
        layout: &TableLayout,
        shards: Option<u32>,
    ) -> Result<Dataset> {
        let (schema, pk) = (&layout.schema, layout.pk);
        let uri = self.table_uri(&layout.name);
        let mut ds = match self.store.open(&uri).await {
            Ok(ds) => ds,
            Err(e) if is_lance_not_found(&e) => {
                let empty = RecordBatchIterator::new(vec![], schema.clone());
                let params = self.store.write_params(WriteMode::Create);
                Dataset::write(empty, &uri, Some(params))
                    .await
                    .ctx(format!("create {uri}"))?
            }
            Err(e) => return Err(e).ctx(format!("open {uri}")),
        };
        let Some(shards) = shards else {
            return Ok(ds);
        };
        if ds.mem_wal_index_details().await.ctx(&uri)?.is_none() {
            // The spec describes the routing to readers; graphsink routes
            // (`shards`). Under `partition` a type's rows go by their source
            // partition (identity; Lance then reports 0 shards, so N is the
            // schema record's), and rejects by their (topic, partition),
            // which no spec expresses: none is recorded for them.
            // No base index in the memtables: the id index (`fold/index.rs`)
            // is the primary key's, which every generation keeps anyway.
            let builder = ds
                .initialize_mem_wal()
                .maintained_indexes(Vec::<String>::new());
            let builder = match (self.layout.sharding, layout.name == REJECTS_TABLE) {
                (Sharding::Bucket, _) => builder.bucket_sharding(pk, shards),
                (Sharding::Partition, false) => builder.identity_sharding(SRC_PARTITION),
                (Sharding::Partition, true) => builder,
            };
            builder
                .execute()
                .await
                .ctx(format!("initialise MemWAL on {uri}"))?;
        }
        Ok(ds)
    }
}
