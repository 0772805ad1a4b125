//! Every table a graph commit pins, by name, layout and primary key: the
//! type tables, `_pending/<Edge>`, `_ingest_rejects` and `__manifest`.
//! Layouts only; opening and writing them is `graph`'s.

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::{GraphSchema, GraphType, TypeKind, ID, PK_METADATA};

/// The graph's commit log.
pub(crate) const MANIFEST_TABLE: &str = "__manifest";
/// Its primary key.
pub(crate) const MANIFEST_PK: &str = "object_id";
/// Table of rejects under the graph root.
pub(crate) const REJECTS_TABLE: &str = "_ingest_rejects";
/// Its primary key.
pub(crate) const REJECT_ID: &str = "reject_id";
/// Column of `_pending/<Edge>` tables: when the edge was first deferred.
pub(crate) const PENDING_SINCE: &str = "_pending_since";
/// Prefix of the deferred-edge tables.
pub(crate) const PENDING_PREFIX: &str = "_pending/";

/// One table of the graph: where it lives, its columns, its primary key.
#[derive(Debug, Clone)]
pub struct TableLayout {
    pub name: String,
    pub schema: SchemaRef,
    pub pk: &'static str,
}

/// The table of deferred edges of an edge table (`edges/X` → `_pending/X`).
pub(crate) fn pending_table(edge_table: &str) -> String {
    format!(
        "{PENDING_PREFIX}{}",
        edge_table.trim_start_matches("edges/")
    )
}

/// A pending table's layout: the edge table's plus `_pending_since`.
pub(crate) fn pending_schema(edge: &GraphType) -> SchemaRef {
    if let Some(stored) = &edge.pending_schema {
        return stored.clone();
    }
    let mut fields: Vec<Field> = edge
        .table_schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(PENDING_SINCE, utc_millis(), false));
    Arc::new(Schema::new(fields))
}

fn utc_millis() -> DataType {
    DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
}

fn pk_field(name: &str) -> Field {
    Field::new(name, DataType::Utf8, false)
        .with_metadata([(PK_METADATA.to_string(), "true".to_string())].into())
}

/// Columns of `_ingest_rejects` (README documents each).
pub(crate) fn rejects_schema() -> SchemaRef {
    let ts = utc_millis();
    Arc::new(Schema::new(vec![
        pk_field(REJECT_ID),
        Field::new("stage", DataType::Utf8, false),
        Field::new("code", DataType::Utf8, false),
        Field::new("message", DataType::Utf8, false),
        Field::new("type_name", DataType::Utf8, true),
        Field::new("topic", DataType::Utf8, true),
        Field::new("partition", DataType::Int32, true),
        Field::new("offset", DataType::Int64, true),
        Field::new("timestamp", ts.clone(), true),
        Field::new("key", DataType::Binary, true),
        Field::new("value", DataType::Binary, true),
        // JSON: [[name, base64 value or null], ...], in the original order.
        Field::new("headers", DataType::Utf8, true),
        Field::new("row", DataType::Utf8, true),
        Field::new("graph_commit", DataType::Utf8, true),
        Field::new("rejected_at", ts, false),
    ]))
}

/// Columns of `__manifest`: one row per object (head, commits, table versions).
pub(crate) fn manifest_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        pk_field(MANIFEST_PK),
        Field::new("kind", DataType::Utf8, false),
        Field::new("commit_id", DataType::Utf8, true),
        Field::new("seq", DataType::Int64, true),
        Field::new("table_name", DataType::Utf8, true),
        Field::new("table_version", DataType::UInt64, true),
        Field::new("created_at", utc_millis(), true),
        Field::new("payload", DataType::Utf8, true),
    ]))
}

impl GraphSchema {
    /// Every table a graph commit pins (not `__manifest`, which holds the
    /// commits): type tables, pending tables, rejects.
    pub fn tables(&self) -> Vec<TableLayout> {
        let mut out: Vec<TableLayout> = self
            .types
            .iter()
            .map(|t| TableLayout {
                name: t.table.clone(),
                schema: t.table_schema.clone(),
                pk: ID,
            })
            .collect();
        out.extend(self.edges().map(|t| TableLayout {
            name: pending_table(&t.table),
            schema: pending_schema(t),
            pk: ID,
        }));
        out.push(TableLayout {
            name: REJECTS_TABLE.to_string(),
            schema: rejects_schema(),
            pk: REJECT_ID,
        });
        out
    }

    /// Tables with MemWAL shards, in fold order: nodes, edges, rejects.
    pub fn wal_tables(&self) -> Vec<String> {
        let mut types: Vec<&GraphType> = self.types.iter().collect();
        types.sort_by_key(|t| (t.kind == TypeKind::Edge, t.name.clone()));
        let mut out: Vec<String> = types.iter().map(|t| t.table.clone()).collect();
        out.push(REJECTS_TABLE.to_string());
        out
    }

    pub fn nodes(&self) -> impl Iterator<Item = &GraphType> {
        self.types.iter().filter(|t| t.kind == TypeKind::Node)
    }

    pub fn edges(&self) -> impl Iterator<Item = &GraphType> {
        self.types.iter().filter(|t| t.kind == TypeKind::Edge)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pinned_table_has_a_layout_and_a_primary_key() {
        let s =
            GraphSchema::parse("node P { name: String @key }\nedge Knows: P -> P", "t.pg").unwrap();
        let names: Vec<String> = s.tables().into_iter().map(|t| t.name).collect();
        assert_eq!(
            names,
            [
                "nodes/P",
                "edges/Knows",
                "_pending/Knows",
                "_ingest_rejects"
            ]
        );
        assert_eq!(
            s.wal_tables(),
            ["nodes/P", "edges/Knows", "_ingest_rejects"]
        );
        let pending = pending_schema(s.get("Knows").unwrap());
        assert_eq!(pending.fields().last().unwrap().name(), PENDING_SINCE);
        for t in s.tables() {
            assert!(t.schema.field_with_name(t.pk).is_ok(), "{}", t.name);
        }
        assert!(manifest_schema().field_with_name(MANIFEST_PK).is_ok());
    }
}
