//! Storage per table, by kind, from one listing of the table through
//! Lance's object store (so it measures `s3://` roots the same way): the
//! MemWAL's WAL and shard manifests, its flushed generations, and the Lance
//! dataset split into what the latest version needs (base) and what only
//! older versions hold (Lance's own cleanup, explained, says which).

use futures::TryStreamExt;
use lance::dataset::cleanup::CleanupPolicy;
use serde::Serialize;

use super::generations::parse_generation;
use crate::error::{Context, PublicResult, Result};
use crate::graph::Graph;
use crate::schema::MANIFEST_TABLE;

/// Bytes of one table, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TableStorage {
    pub table: String,
    /// The files the latest version references (plus files no version
    /// references yet, such as a write in flight).
    pub base: u64,
    /// WAL entries and shard manifests (`_mem_wal/<shard>/wal|manifest`).
    pub wal: u64,
    /// Flushed generations (`_mem_wal/<shard>/<8hex>_gen_<g>/`).
    pub generations: u64,
    /// What only versions older than the latest hold.
    pub old_versions: u64,
    /// Lance versions of the table.
    pub versions: u64,
}

impl TableStorage {
    pub fn total(&self) -> u64 {
        self.base + self.wal + self.generations + self.old_versions
    }
}

/// Where a file of a table belongs, by its path relative to the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Wal,
    Generation,
    Dataset,
}

pub(super) fn kind_of(relative: &str) -> Kind {
    let mut parts = relative.split('/');
    if parts.next() != Some("_mem_wal") {
        return Kind::Dataset;
    }
    let _shard = parts.next();
    match parts.next() {
        Some(d) if parse_generation(d).is_some() => Kind::Generation,
        _ => Kind::Wal,
    }
}

/// Storage of every table of the head commit and of `__manifest`.
pub async fn graph_storage(graph: &Graph) -> PublicResult<Vec<TableStorage>> {
    let head = graph.head().await?;
    let mut out = Vec::new();
    for table in head.tables.keys().chain([&MANIFEST_TABLE.to_string()]) {
        out.push(table_storage(graph, table).await?);
    }
    Ok(out)
}

/// Storage of one table as it is now.
async fn table_storage(graph: &Graph, table: &str) -> Result<TableStorage> {
    let ds = graph.open_table(table, None).await?;
    let store = ds.object_store(None).await.ctx("object store")?;
    let root = ds.branch_location().path;
    let files: Vec<_> = store
        .list(Some(root.clone()))
        .try_collect()
        .await
        .ctx(format!("list {table}"))?;
    let mut s = TableStorage {
        table: table.to_string(),
        ..Default::default()
    };
    let mut dataset = 0;
    for f in files {
        let rel: Vec<_> = match f.location.prefix_match(&root) {
            Some(parts) => parts.map(|p| p.as_ref().to_string()).collect(),
            None => continue,
        };
        match kind_of(&rel.join("/")) {
            Kind::Wal => s.wal += f.size,
            Kind::Generation => s.generations += f.size,
            Kind::Dataset => dataset += f.size,
        }
    }
    let latest = ds.version().version;
    s.versions = ds.versions().await.ctx(table)?.len() as u64;
    // What cleaning every version but the latest would free.
    let policy = CleanupPolicy {
        before_version: Some(latest),
        error_if_tagged_old_versions: false,
        ..Default::default()
    };
    let old = ds
        .cleanup(policy)
        .with_max_candidate_files(0)
        .explain()
        .await
        .ctx(format!("measure old versions of {table}"))?;
    s.old_versions = old.stats.bytes_removed.min(dataset);
    s.base = dataset - s.old_versions;
    Ok(s)
}
