//! What a start checks against the graph it opens: the schema plan
//! (`evolve`: what changed since the graph's recorded schema), the tables,
//! their columns and MemWAL, and the shard layout it was created with.

use arrow_schema::Schema;
use lance::dataset::mem_wal::DatasetMemWalExt;

use crate::config::Sharding;
use crate::error::{Context, Error, Result};
use crate::schema::{same_columns, GraphSchema, TableLayout};

use super::evolve::{self, Change, Class};
use super::Graph;

/// The plan of schema changes, as a start or `check` reads it.
#[derive(Debug, Clone, Default)]
pub struct SchemaPlan {
    /// Every change since the graph's recorded schema, in plan order.
    pub changes: Vec<Change>,
}

impl SchemaPlan {
    /// Changes a start refuses, each one line: destructive ones, and those
    /// that alter a table, which graphsink does not apply to an existing
    /// graph yet (docs/schema-evolution.md). Constraint changes apply.
    pub fn refused(&self) -> Vec<&Change> {
        self.changes
            .iter()
            .filter(|c| c.class == Class::Destructive || c.alters_table)
            .collect()
    }
}

impl Graph {
    /// What changed between the schema the graph recorded at creation and
    /// `schema`. Empty for a graph with no record, or a record this
    /// version cannot parse (the table checks then decide alone).
    pub async fn schema_plan(&self, schema: &GraphSchema) -> Result<SchemaPlan> {
        let Some(record) = self.record().await? else {
            return Ok(SchemaPlan::default());
        };
        if record.source == schema.source {
            return Ok(SchemaPlan::default());
        }
        let old = match GraphSchema::parse(&record.source, "the graph's recorded schema") {
            Ok(old) => old,
            Err(e) => {
                tracing::warn!(root = %self.root, "cannot parse the graph's recorded schema ({e}); checking tables only");
                return Ok(SchemaPlan::default());
            }
        };
        Ok(SchemaPlan {
            changes: evolve::diff(&old, schema),
        })
    }

    /// Refuses a graph whose tables, columns or bucket counts differ from
    /// what the schema and config now ask for: each refused schema change
    /// by name, one line each. Constraint changes (loosening, tightening)
    /// apply to records from now on, and are said once at start.
    pub(super) async fn check_compatible(&self) -> Result<()> {
        let head = self.head().await?;
        let incompatible = |message: String| Error::Incompatible {
            root: self.root.clone(),
            message,
        };
        let plan = self.schema_plan(&self.schema).await?;
        let refused = plan.refused();
        if !refused.is_empty() {
            return Err(refusal(&self.root, &refused));
        }
        for c in &plan.changes {
            tracing::info!(event = "schema_constraint_changed", class = c.class.as_str(), type_name = %c.type_name, "{}", c.what);
        }
        let all = self.schema.tables();
        let want: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
        let have: Vec<&str> = head.tables.keys().map(String::as_str).collect();
        let mut want_sorted = want.clone();
        want_sorted.sort();
        if want_sorted != have {
            return Err(incompatible(format!(
                "schema declares tables [{}] but the graph has [{}]",
                want_sorted.join(", "),
                have.join(", ")
            )));
        }
        for TableLayout {
            name: table,
            schema,
            ..
        } in &all
        {
            let ds = self.open_table(table, Some(head.tables[table])).await?;
            let actual: Schema = ds.schema().into();
            same_columns(schema, &actual)
                .map_err(|m| incompatible(format!("{table}: schema wants {m}")))?;
            if self.buckets.contains_key(table)
                && ds.mem_wal_index_details().await.ctx(table)?.is_none()
            {
                return Err(incompatible(format!("{table} has no MemWAL")));
            }
        }
        let Some(record) = self.record().await? else {
            return Ok(());
        };
        let want = &self.layout;
        if record.sharding != want.sharding {
            return Err(incompatible(format!(
                "the graph was created with wal.sharding = \"{}\", config asks for \"{}\"",
                record.sharding.as_str(),
                want.sharding.as_str()
            )));
        }
        if record.sharding == Sharding::Partition {
            for (topic, &n) in &want.partitions {
                match record.partitions.get(topic) {
                    Some(&was) if was == n => {}
                    Some(&was) => return Err(incompatible(format!(
                        "topic {topic} had {was} partitions when the graph was created and has {n} now; \
                         under partition sharding a topic's partitions are its shards and cannot change"
                    ))),
                    None => return Err(incompatible(format!(
                        "topic {topic} was not mapped when the graph was created (topics: {}); \
                         under partition sharding the mapped topics are fixed at creation",
                        record.partitions.keys().cloned().collect::<Vec<_>>().join(", ")
                    ))),
                }
            }
            // With the broker's counts (a run), the config must also map
            // every recorded topic: a member mapping fewer would be given
            // partition p of one topic without partition p of a topic
            // co-partitioned with it, and claiming shard p would fence the
            // member that holds the other (it stops on the split).
            let missing: Vec<&str> = (record.partitions.keys())
                .filter(|t| !want.partitions.is_empty() && !want.partitions.contains_key(*t))
                .map(String::as_str)
                .collect();
            if !missing.is_empty() {
                return Err(incompatible(format!(
                    "topics [{}] were mapped when the graph was created and are not in this \
                     config; under partition sharding every member maps every topic the graph \
                     was created with (the set is fixed: to drop a topic, create a new graph)",
                    missing.join(", ")
                )));
            }
            return Ok(());
        }
        for (table, &n) in &want.counts {
            match record.buckets.get(table) {
                Some(&was) if was != n => {
                    return Err(incompatible(format!(
                        "{table} was created with {was} buckets, config asks for {n}"
                    )))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// The refusal of a plan: each refused change by name.
pub(crate) fn refusal(root: &str, refused: &[&Change]) -> Error {
    Error::SchemaChanges {
        root: root.to_string(),
        changes: refused.iter().map(|c| c.to_string()).collect(),
    }
}
