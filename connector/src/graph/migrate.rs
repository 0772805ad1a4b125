//! Applying a schema plan to the tables, then the schema commit: new
//! columns as all-null (`add_columns`), loosened nullability
//! (`alter_columns`), new tables with their MemWAL, and one graph commit
//! that pins them and moves the schema record to the new version, in one
//! write to `__manifest`.
//!
//! The caller has folded to quiescence first (`fold::migrate`): no row is
//! in a WAL or a flushed generation, and this process holds every shard.
//! Every step tolerates having run before: a crash before the commit is
//! finished by the next start with the new schema (a column already there
//! is not added again); until the commit, readers and a start with the old
//! schema see the old graph (the head pins the old versions).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_schema::{Field, Schema};
use lance::dataset::{ColumnAlteration, NewColumnTransform};

use crate::error::{Context, Error, Result};
use crate::failpoints;
use crate::schema::REJECTS_TABLE;
use crate::types::now_ms;

use super::layout::{SchemaRecord, SCHEMA_ID};
use super::manifest::{ManifestRow, ManifestRows, SchemaChange};
use super::{new_commit_id, Graph, GraphCommit};

const PUBLISH_ATTEMPTS: usize = 8;

impl Graph {
    /// Applies the waiting schema change (`evolving`) and publishes its
    /// schema commit; returns the graph under the new schema. Only after a
    /// fold to quiescence, by the holder of every shard.
    pub(crate) async fn evolve(&self, actor: &str) -> Result<(Graph, GraphCommit)> {
        let ev = self
            .evolving
            .clone()
            .ok_or_else(|| Error::Bug("no schema change to apply".into()))?;
        let record = self
            .record()
            .await?
            .ok_or_else(|| Error::Corrupt(format!("{}: no schema record", self.root)))?;
        let version = record.version + 1;
        let mut stored = BTreeMap::new();
        let mut versions = BTreeMap::new();
        let wal_tables = ev.schema.wal_tables();
        // The tables the head pins existed before this change.
        let pinned = self.head().await?.tables;
        for layout in ev.schema.tables() {
            let shards = ev.layout.counts.get(&layout.name).copied();
            if shards.is_none() && wal_tables.contains(&layout.name) {
                return Err(Error::config(format!(
                    "the new table {} needs its shard count: under partition sharding that is \
                     its topics' partition count, which graphsink run (or migrate) reads from \
                     the broker",
                    layout.name
                )));
            }
            let ds = match pinned.contains_key(&layout.name) {
                true => self.alter_table(&layout.name, &layout.schema).await?,
                false => self.init_table(&layout, shards).await?,
            };
            failpoints::hit(failpoints::MIGRATE_AFTER_TABLE)?;
            versions.insert(layout.name.clone(), ds.version().version);
            stored.insert(layout.name, Schema::from(ds.schema()));
        }
        failpoints::hit(failpoints::MIGRATE_BEFORE_COMMIT)?;
        let new_record = SchemaRecord {
            source: ev.schema.source.clone(),
            shard_counts: merged_counts(&record, &ev.layout.counts),
            sharding: record.sharding,
            partitions: if ev.layout.partitions.is_empty() {
                record.partitions.clone()
            } else {
                ev.layout.partitions.clone()
            },
            version,
        };
        let change = SchemaChange {
            before: record.source.clone(),
            after: ev.schema.source.clone(),
            changes: ev.plan.changes.iter().map(|c| c.to_string()).collect(),
        };
        let commit = self
            .publish_schema_commit(&versions, &new_record, change, actor)
            .await?;
        let mut graph = Graph {
            schema: Arc::new(ev.schema.clone()),
            evolving: None,
            ..self.clone()
        };
        graph.adopt_record().await?;
        graph.adopt_stored_order(&stored);
        Ok((graph, commit))
    }

    /// Adds the columns `want` has and the table lacks (all null: a row
    /// still in a WAL merges down with a null, so Lance allows it on a
    /// MemWAL table), then makes nullable what `want` makes nullable.
    async fn alter_table(&self, table: &str, want: &Schema) -> Result<lance::Dataset> {
        let mut ds = self.open_table(table, None).await?;
        let have: Schema = ds.schema().into();
        let added: Vec<Field> = (want.fields().iter())
            .filter(|f| have.field_with_name(f.name()).is_err())
            .map(|f| f.as_ref().clone())
            .collect();
        if let Some(f) = added.iter().find(|f| !f.is_nullable()) {
            return Err(Error::Bug(format!(
                "{table}: the plan adds required column {}, which no start allows",
                f.name()
            )));
        }
        if !added.is_empty() {
            let names: Vec<&str> = added.iter().map(|f| f.name().as_str()).collect();
            tracing::info!(table, columns = ?names, "adding all-null columns");
            ds.add_columns(
                NewColumnTransform::AllNulls(Arc::new(Schema::new(added.clone()))),
                None,
                None,
            )
            .await
            .ctx(format!("{table}: add columns {}", names.join(", ")))?;
        }
        let loosened: Vec<ColumnAlteration> = (want.fields().iter())
            .filter(|f| f.is_nullable())
            .filter(|f| {
                have.field_with_name(f.name())
                    .is_ok_and(|h| !h.is_nullable())
            })
            .map(|f| ColumnAlteration::new(f.name().clone()).set_nullable(true))
            .collect();
        if !loosened.is_empty() {
            tracing::info!(table, columns = loosened.len(), "making columns nullable");
            ds.alter_columns(&loosened)
                .await
                .ctx(format!("{table}: make columns nullable"))?;
        }
        Ok(ds)
    }

    /// The schema commit on the current head: its pins, with `versions`
    /// for the tables this change touched or created, and the new schema
    /// record in the same `__manifest` write. A publish that loses a race
    /// retries on the new head (a fold of an old-schema member cannot land
    /// after it: its publish sees the new version and stops).
    async fn publish_schema_commit(
        &self,
        versions: &BTreeMap<String, u64>,
        record: &SchemaRecord,
        change: SchemaChange,
        actor: &str,
    ) -> Result<GraphCommit> {
        let mut last = None;
        for _ in 0..PUBLISH_ATTEMPTS {
            let head = self.head().await?;
            if head.schema_version >= record.version {
                return Err(Error::Incompatible {
                    root: self.root.clone(),
                    message: format!(
                        "another process published schema version {} while this one applied it",
                        head.schema_version
                    ),
                });
            }
            let mut tables = head.tables.clone();
            tables.extend(versions.iter().map(|(t, v)| (t.clone(), *v)));
            let commit = GraphCommit {
                id: new_commit_id(),
                seq: head.seq + 1,
                parent: Some(head.id.clone()),
                actor: actor.to_string(),
                created_at: now_ms(),
                tables,
                folded: vec![],
                offsets: vec![],
                stats: BTreeMap::new(),
                dead_letters_delivered: head.dead_letters_delivered,
                folder: None,
                dead_letter_since: Default::default(),
                schema_version: record.version,
                schema_change: Some(change.clone()),
            };
            let mut rows = ManifestRows::default();
            rows.push(ManifestRow {
                object_id: SCHEMA_ID.into(),
                kind: "graph_schema",
                payload: Some(serde_json::to_string(record).expect("serializable")),
                ..Default::default()
            });
            match self.publish_with(&commit, rows).await {
                Ok(()) => return Ok(commit),
                Err(e @ Error::CommitConflict { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }
}

/// The shard counts after the change: the recorded ones, the new tables'
/// from the config, and under `partition` the rejects table's (one shard
/// per mapped topic partition, new topics included).
fn merged_counts(record: &SchemaRecord, want: &BTreeMap<String, u32>) -> BTreeMap<String, u32> {
    let mut out = record.shard_counts.clone();
    for (t, &n) in want {
        let rejects = t == REJECTS_TABLE && record.sharding == crate::config::Sharding::Partition;
        if rejects || !out.contains_key(t) {
            out.insert(t.clone(), n);
        }
    }
    out
}
