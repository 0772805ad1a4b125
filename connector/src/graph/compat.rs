//! What a start checks against the graph it opens: the schema plan
//! (`evolve`: what changed since the graph's recorded schema), the tables,
//! their columns and MemWAL, and the shard layout it was created with.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_schema::Schema;
use lance::dataset::mem_wal::DatasetMemWalExt;

use crate::config::{Config, Evolve, Sharding};
use crate::error::{Context, Error, PublicResult, Result};
use crate::schema::{pending_table, same_columns, GraphSchema, TableLayout};

use super::evolve::{self, Change, Class};
use super::layout::{SchemaRecord, ShardLayout};
use super::{Evolution, Graph};

/// The plan of schema changes, as a start or `check` reads it.
#[derive(Debug, Clone, Default)]
pub struct SchemaPlan {
    /// Every change since the graph's recorded schema, in plan order.
    pub changes: Vec<Change>,
}

impl SchemaPlan {
    /// Changes a start refuses, each one line: destructive ones always;
    /// under `[graph] evolve = "none"` every change (`graphsink migrate`
    /// applies them).
    pub fn refused(&self, evolve: Evolve) -> Vec<&Change> {
        self.changes
            .iter()
            .filter(|c| c.class == Class::Destructive || evolve == Evolve::None)
            .collect()
    }

    /// Whether a table must change (a column, its nullability, a table).
    pub fn alters_tables(&self) -> bool {
        self.changes.iter().any(|c| c.alters_table)
    }
}

impl Graph {
    /// What changed between the schema the graph recorded at creation and
    /// `schema`. Empty for a graph with no record, or a record this
    /// version cannot parse (the table checks then decide alone).
    pub async fn schema_plan(&self, schema: &GraphSchema) -> PublicResult<SchemaPlan> {
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
        if let Some(k) = self.older_version(&schema.source).await? {
            return Err(Error::Incompatible {
                root: self.root.clone(),
                message: format!(
                    "the graph's schema is version {}, this config's is older (version {k}): a \
                     member with a newer schema changed it; start this member with the graph's \
                     schema (graphsink log shows each schema commit)",
                    self.head().await?.schema_version
                ),
            }
            .into());
        }
        Ok(SchemaPlan {
            changes: evolve::diff(&old, schema),
        })
    }

    /// Refuses a graph whose tables, columns or bucket counts differ from
    /// what the schema and config now ask for, and each refused schema
    /// change by name, one line each. An allowed change is left waiting
    /// (`evolving`): the graph opens with its own schema, and a start
    /// applies the change after a fold to quiescence (`fold::migrate`).
    pub(super) async fn check_compatible(&mut self, config: &Config) -> Result<()> {
        let record = self.record().await?;
        self.plan_the_start(config, record.as_ref()).await?;
        self.check_tables().await?;
        match record {
            Some(record) => self.check_layout(&record),
            None => Ok(()),
        }
    }

    fn incompatible(&self, message: String) -> Error {
        Error::Incompatible {
            root: self.root.clone(),
            message,
        }
    }

    /// The schema plan: refused changes are an error; allowed ones wait in
    /// `evolving`, and the graph keeps its own schema until they apply.
    async fn plan_the_start(
        &mut self,
        config: &Config,
        record: Option<&SchemaRecord>,
    ) -> Result<()> {
        let plan = self.schema_plan(&self.schema).await?;
        let refused = plan.refused(config.graph.evolve);
        if !refused.is_empty() {
            return Err(refusal(&self.root, &refused));
        }
        if plan.changes.is_empty() {
            return Ok(());
        }
        let record = record.expect("a plan comes from a record");
        let old = GraphSchema::parse(&record.source, "the graph's recorded schema")?;
        let new = std::mem::replace(&mut self.schema, Arc::new(old));
        let new = Arc::try_unwrap(new).unwrap_or_else(|a| (*a).clone());
        check_new_topics(&self.layout, record, &new, config).map_err(|m| self.incompatible(m))?;
        self.evolving = Some(Arc::new(Evolution {
            schema: new,
            plan,
            layout: (*self.layout).clone(),
        }));
        Ok(())
    }

    /// The head's tables are the schema's, each with its columns (at the
    /// head's pin, and at its latest version unless a change waits) and its
    /// MemWAL; then batches take the stored column order.
    async fn check_tables(&mut self) -> Result<()> {
        let head = self.head().await?;
        let all = self.schema.tables();
        let mut want: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
        want.sort();
        let have: Vec<&str> = head.tables.keys().map(String::as_str).collect();
        if want != have {
            return Err(self.incompatible(format!(
                "schema declares tables [{}] but the graph has [{}]",
                want.join(", "),
                have.join(", ")
            )));
        }
        let mut stored = BTreeMap::new();
        for TableLayout {
            name: table,
            schema,
            ..
        } in &all
        {
            let latest = self.open_table(table, None).await?;
            let pinned = head.tables[table];
            let ds = match latest.version().version == pinned {
                true => latest.clone(),
                false => self.open_table(table, Some(pinned)).await?,
            };
            let actual: Schema = ds.schema().into();
            same_columns(schema, &actual)
                .map_err(|m| self.incompatible(format!("{table}: schema wants {m}")))?;
            if self.evolving.is_none() {
                let now: Schema = latest.schema().into();
                if let Err(m) = same_columns(schema, &now) {
                    // A start with a newer schema altered it and stopped
                    // before its schema commit (`graph/migrate.rs`).
                    return Err(self.incompatible(format!(
                        "{table} carries an unfinished schema change ({m}): a start with a newer \
                         schema was applying it; start with that schema to finish it"
                    )));
                }
            }
            if self.layout.counts.contains_key(table)
                && ds.mem_wal_index_details().await.ctx(table)?.is_none()
            {
                return Err(self.incompatible(format!("{table} has no MemWAL")));
            }
            stored.insert(table.clone(), actual);
        }
        self.adopt_stored_order(&stored);
        Ok(())
    }

    /// The shard layout the graph was created with against the config's:
    /// the mode, and the partition or bucket counts.
    fn check_layout(&self, record: &SchemaRecord) -> Result<()> {
        let incompatible = |m: String| self.incompatible(m);
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
                    // A new type's topic (`check_new_topics`).
                    None if self.evolving.is_some() => {}
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
            match record.shard_counts.get(table) {
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

impl Graph {
    /// Builds batches in the stored tables' column order
    /// (`GraphType::adopt_order`); `stored` holds each table's columns.
    pub(super) fn adopt_stored_order(&mut self, stored: &BTreeMap<String, Schema>) {
        let mut schema = (*self.schema).clone();
        for t in &mut schema.types {
            let Some(table) = stored.get(&t.table) else {
                continue;
            };
            let pending = stored.get(&pending_table(&t.table));
            t.adopt_order(table, pending);
        }
        self.schema = Arc::new(schema);
    }

    /// The schema the graph records (its `.pg` as of its schema version),
    /// if it has one this version can parse.
    pub(crate) async fn recorded_schema(&self) -> Result<Option<GraphSchema>> {
        Ok(match self.record().await? {
            Some(r) => GraphSchema::parse(&r.source, "the graph's recorded schema").ok(),
            None => None,
        })
    }

    /// The schema version whose `.pg` was `source` before a later schema
    /// commit replaced it: a config that is older than the graph.
    async fn older_version(&self, source: &str) -> Result<Option<u32>> {
        let mut commits = self.commits().await?;
        commits.sort_by_key(|c| c.seq);
        Ok(commits.iter().find_map(|c| {
            let change = c.schema_change.as_ref()?;
            (change.before == source).then(|| c.schema_version - 1)
        }))
    }
}

/// Under `partition` sharding a topic the graph was created without may
/// feed only a new type: an existing type's shards are its topics'
/// partitions, fixed at creation (docs/schema-evolution.md).
fn check_new_topics(
    want: &ShardLayout,
    record: &SchemaRecord,
    new: &GraphSchema,
    config: &Config,
) -> std::result::Result<(), String> {
    if record.sharding != Sharding::Partition {
        return Ok(());
    }
    let old = GraphSchema::parse(&record.source, "the graph's recorded schema")
        .map_err(|e| e.to_string())?;
    for topic in want
        .partitions
        .keys()
        .filter(|t| !record.partitions.contains_key(*t))
    {
        for m in config.mappings.iter().filter(|m| &m.topic == topic) {
            if old.get(m.type_name()).is_some() && new.get(m.type_name()).is_some() {
                return Err(format!(
                    "topic {topic} is new and maps to {}, which the graph already has: under \
                     partition sharding a type's topics are fixed when it is created (its shards \
                     are their partitions); a new topic may feed a new type",
                    m.type_name()
                ));
            }
        }
    }
    Ok(())
}

/// The refusal of a plan: each refused change by name.
pub(crate) fn refusal(root: &str, refused: &[&Change]) -> Error {
    Error::SchemaChanges {
        root: root.to_string(),
        changes: refused.iter().map(|c| c.to_string()).collect(),
    }
}

impl Graph {
    /// The refusal of a process whose schema the graph's has moved past:
    /// a member with a newer schema changed the tables (and fenced this
    /// one's writers).
    pub(crate) fn schema_moved(&self, head_version: u32) -> Error {
        Error::Incompatible {
            root: self.root.clone(),
            message: format!(
                "the graph's schema is version {head_version}, this process's is version {}: a \
                 member with a newer schema changed it; restart this member with that schema",
                self.schema_version()
            ),
        }
    }

    /// `e`, a failure of this process's session, or the refusal by name
    /// when the graph's schema moved past this process's meanwhile: then a
    /// write or a fold failed against the changed tables (a claim can land
    /// between another member's table change and its schema commit), and
    /// the schema is what to fix.
    pub(crate) async fn or_schema_moved(&self, e: Error) -> Error {
        match self.head().await {
            Ok(head) if head.schema_version > self.schema_version() => {
                self.schema_moved(head.schema_version)
            }
            _ => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under partition sharding a new topic may feed a new type only.
    #[test]
    fn a_new_topic_under_partition_sharding_feeds_only_a_new_type() {
        let dir = tempfile::tempdir().unwrap();
        let config = |mappings: &str| {
            let toml = format!(
                "[graph]\nroot = \"g\"\nschema = \"x.pg\"\n[kafka]\n\"bootstrap.servers\" = \"127.0.0.1:1\"\n\
                 \"group.id\" = \"g\"\n[wal]\nsharding = \"partition\"\n{mappings}"
            );
            Config::from_toml(&toml, dir.path()).unwrap()
        };
        let old = "node P { name: String @key }";
        let new =
            GraphSchema::parse(&format!("{old}\nnode C {{ name: String @key }}"), "x.pg").unwrap();
        let record = SchemaRecord {
            source: old.into(),
            shard_counts: BTreeMap::new(),
            sharding: Sharding::Partition,
            partitions: BTreeMap::from([("p".to_string(), 2)]),
            version: 0,
        };
        let want = ShardLayout {
            sharding: Sharding::Partition,
            counts: BTreeMap::new(),
            partitions: BTreeMap::from([("p".to_string(), 2), ("more".to_string(), 2)]),
        };
        let to_new = config("[[mapping]]\ntopic = \"p\"\nnode = \"P\"\n[[mapping]]\ntopic = \"more\"\nnode = \"C\"\n");
        assert_eq!(check_new_topics(&want, &record, &new, &to_new), Ok(()));
        let to_old = config("[[mapping]]\ntopic = \"p\"\nnode = \"P\"\n[[mapping]]\ntopic = \"more\"\nnode = \"P\"\n");
        let e = check_new_topics(&want, &record, &new, &to_old).unwrap_err();
        assert!(
            e.starts_with("topic more is new and maps to P, which the graph already has"),
            "{e}"
        );
    }
}
