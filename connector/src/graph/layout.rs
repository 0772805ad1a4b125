//! The shard layout: how a graph's MemWAL tables are sharded, fixed at
//! creation and recorded in the schema record, which later starts adopt.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::{Config, Sharding};
use crate::error::{Error, Result};
use crate::schema::{GraphSchema, REJECTS_TABLE};

use super::manifest::read_rows;
use super::Graph;

/// The `__manifest` row of the schema record.
pub(super) const SCHEMA_ID: &str = "graph_schema";

/// Schema facts recorded at init, so later starts can explain a mismatch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct SchemaRecord {
    pub(super) source: String,
    /// Shards N per MemWAL table (bucket counts under `bucket`; under
    /// `partition` the partition counts of `partitions`).
    // Stored as `buckets` by every graph so far: the name keeps them opening.
    #[serde(rename = "buckets")]
    pub(super) shard_counts: BTreeMap<String, u32>,
    /// Absent in graphs from before partition sharding: `bucket`.
    #[serde(default)]
    pub(super) sharding: Sharding,
    /// Under `partition`: each mapped topic's partition count at creation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) partitions: BTreeMap<String, u32>,
    /// The schema version `source` is (0 until a schema commit).
    #[serde(default)]
    pub(super) version: u32,
}

/// How a graph's MemWAL tables are sharded, fixed at its creation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardLayout {
    pub sharding: Sharding,
    /// Shards N per MemWAL table path (graph types and `_ingest_rejects`).
    pub counts: BTreeMap<String, u32>,
    /// Under `partition`: partition count per mapped topic. The rejects
    /// table has one shard per (topic, partition), topics in name order.
    pub partitions: BTreeMap<String, u32>,
}

impl ShardLayout {
    /// Under `partition`: the rejects shard of `(topic, partition)`.
    pub fn source_shard(&self, topic: &str, partition: i32) -> Option<u32> {
        let mut base = 0;
        for (t, &n) in &self.partitions {
            if t == topic {
                return u32::try_from(partition)
                    .ok()
                    .filter(|&p| p < n)
                    .map(|p| base + p);
            }
            base += n;
        }
        None
    }

    /// Under `partition`: the (topic, partition) of rejects shard `shard`.
    pub fn shard_source(&self, shard: u32) -> Option<(&str, i32)> {
        let mut base = 0;
        for (t, &n) in &self.partitions {
            if shard < base + n {
                return Some((t.as_str(), (shard - base) as i32));
            }
            base += n;
        }
        None
    }
}

impl Graph {
    /// Takes the shard layout from the stored schema record: what the
    /// graph was created with is what routing and folds must follow.
    pub(super) async fn adopt_record(&mut self) -> Result<()> {
        let Some(record) = self.record().await? else {
            return Ok(());
        };
        self.schema_version = record.version;
        self.layout = Arc::new(ShardLayout {
            sharding: record.sharding,
            counts: record.shard_counts,
            partitions: record.partitions,
        });
        Ok(())
    }

    /// The schema record written at init (absent only in a graph whose
    /// init is not finished, which has no `__manifest` either).
    pub(super) async fn record(&self) -> Result<Option<SchemaRecord>> {
        let ds = self.open_manifest().await?;
        let rows = read_rows(&ds, &format!("object_id = '{SCHEMA_ID}'")).await?;
        let Some(payload) = rows.first().and_then(|r| r.payload.as_deref()) else {
            return Ok(None);
        };
        serde_json::from_str(payload)
            .map(Some)
            .map_err(|e| Error::Corrupt(format!("{}: schema record: {e}", self.root)))
    }
}

/// The shard layout a config asks for. Under `partition`, a mapped type's
/// N is its topics' partition count (they must agree: co-partitioned), an
/// unmapped type's 1, and the rejects table has one shard per mapped
/// (topic, partition).
pub(super) fn shard_layout(
    config: &Config,
    schema: &GraphSchema,
    partitions: Option<&BTreeMap<String, u32>>,
) -> Result<ShardLayout> {
    let mut counts = buckets_per_table(config, schema)?;
    let sharding = config.wal.sharding;
    if sharding == Sharding::Bucket {
        return Ok(ShardLayout {
            sharding,
            counts,
            partitions: BTreeMap::new(),
        });
    }
    let Some(partitions) = partitions else {
        // An existing graph brings its own (`adopt_record`); a new one
        // cannot be created without them (`init` refuses).
        return Ok(ShardLayout {
            sharding,
            counts: BTreeMap::new(),
            partitions: BTreeMap::new(),
        });
    };
    let mut mapped = BTreeMap::new();
    for t in &schema.types {
        counts.insert(t.table.clone(), 1);
    }
    for m in &config.mappings {
        let n = *partitions.get(&m.topic).ok_or_else(|| {
            Error::config(format!(
                "topic {} has no partition count (does it exist?); partition sharding needs \
                 every mapped topic created first, with its final partition count",
                m.topic
            ))
        })?;
        mapped.insert(m.topic.clone(), n);
        let table = &schema.get(m.type_name()).expect("checked above").table;
        let other = config
            .mappings
            .iter()
            .filter(|o| o.type_name() == m.type_name() && o.topic != m.topic)
            .find(|o| partitions.get(&o.topic).is_some_and(|&k| k != n));
        if let Some(o) = other {
            return Err(Error::config(format!(
                "topics {} ({n} partitions) and {} ({} partitions) both feed {}: under partition \
                 sharding they must be co-partitioned (equal partition counts, one key, one \
                 partitioner)",
                m.topic,
                o.topic,
                partitions[&o.topic],
                m.type_name()
            )));
        }
        counts.insert(table.clone(), n);
    }
    counts.insert(
        REJECTS_TABLE.to_string(),
        mapped.values().sum::<u32>().max(1),
    );
    Ok(ShardLayout {
        sharding,
        counts,
        partitions: mapped,
    })
}

fn buckets_per_table(config: &Config, schema: &GraphSchema) -> Result<BTreeMap<String, u32>> {
    let mut out = BTreeMap::new();
    for t in &schema.types {
        out.insert(t.table.clone(), config.buckets_for_type());
    }
    // Rejects are few: one shard keeps their WAL small.
    out.insert(REJECTS_TABLE.to_string(), 1);
    for (i, m) in config.mappings.iter().enumerate() {
        let t = schema.get(m.type_name()).ok_or_else(|| {
            Error::config(format!(
                "mapping[{i}]: type {:?} is not in the schema (types: {})",
                m.type_name(),
                schema
                    .types
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        out.insert(t.table.clone(), config.buckets_for(m));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stored name of the shard counts is `buckets`, as every graph
    /// written so far spells it.
    #[test]
    fn the_schema_record_keeps_its_stored_field_names() {
        let stored = r#"{"source":"node P { name: String @key }","buckets":{"nodes/P":4}}"#;
        let record: SchemaRecord = serde_json::from_str(stored).unwrap();
        assert_eq!(record.shard_counts["nodes/P"], 4);
        assert_eq!(record.sharding, Sharding::Bucket);
        let again = serde_json::to_value(&record).unwrap();
        assert_eq!(again["buckets"]["nodes/P"], 4);
    }
}
