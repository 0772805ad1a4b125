//! The graph schema: `.pg` → types, table names and Arrow schemas, via
//! omnigraph-compiler. Owns the column layout of every table under the graph
//! root (`tables`); does not touch storage.

mod provenance;
mod tables;
mod values;

pub(crate) use provenance::{Provenance, Source};
pub(crate) use tables::*;
pub(crate) use values::{canonical_ids, row_json};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use omnigraph_compiler::catalog::{Catalog, EdgeType, NodeType};
use omnigraph_compiler::types::ScalarType;

use crate::error::{Error, PublicResult, Result};

pub(crate) const ID: &str = "id";
pub(crate) const SRC_TOPIC: &str = "_src_topic";
pub(crate) const SRC_PARTITION: &str = "_src_partition";
pub(crate) const SRC_OFFSET: &str = "_src_offset";
pub(crate) const SRC_TIMESTAMP: &str = "_src_timestamp";

/// Arrow field metadata that marks Lance's (unenforced) primary key.
pub(crate) const PK_METADATA: &str = "lance-schema:unenforced-primary-key";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeKind {
    Node,
    Edge,
}

/// One graph type and the table that stores it.
#[derive(Debug, Clone)]
pub struct GraphType {
    pub name: String,
    pub kind: TypeKind,
    /// Table path under the graph root: `nodes/<Type>` or `edges/<Type>`.
    pub table: String,
    /// `@key` property names in declaration order (nodes only).
    pub key: Vec<String>,
    /// The properties as the JSON value carries them (no `id`, no provenance).
    pub properties: SchemaRef,
    /// The full table schema: `id` (primary key) + properties + provenance.
    pub table_schema: SchemaRef,
    /// What sync validation and the fold check beyond the Arrow types.
    pub constraints: Constraints,
    /// Endpoint types and cardinality (edges only).
    pub ends: Option<EdgeEnds>,
    /// Edges: the `_pending` table's columns, in its stored order (see
    /// `adopt_order`).
    pub(crate) pending_schema: Option<SchemaRef>,
}

/// The `.pg` constraints of one type, as graphsink checks them.
#[derive(Debug, Clone, Default)]
pub struct Constraints {
    /// `enum(...)` properties (scalar or list) and their allowed values.
    pub enums: Vec<(String, Vec<String>)>,
    /// `@range(p, min..max)`: both bounds inclusive, either may be open.
    pub ranges: Vec<RangeCheck>,
    /// `@check(p, "regex")`: the whole string must match.
    pub checks: Vec<(String, String)>,
    /// `@unique(...)` tuples (edges may name `src`, `dst`).
    pub uniques: Vec<Vec<String>>,
}

#[derive(Debug, Clone)]
pub struct RangeCheck {
    pub property: String,
    pub min: Option<Bound>,
    pub max: Option<Bound>,
}

/// A `@range` bound as written: integers stay exact.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    Int(i64),
    Float(f64),
}

/// An edge's endpoint node types and `@card(min..max)` per `src`.
#[derive(Debug, Clone)]
pub struct EdgeEnds {
    pub from: String,
    pub to: String,
    pub card_min: u32,
    pub card_max: Option<u32>,
}

/// The parsed schema: every type, in a stable order (nodes before edges,
/// then by name) so folds and listings are deterministic.
#[derive(Debug, Clone)]
pub struct GraphSchema {
    pub types: Vec<GraphType>,
    /// The `.pg` source, kept so a graph records what it was created from.
    pub source: String,
}

impl GraphSchema {
    pub fn load(path: &std::path::Path) -> PublicResult<GraphSchema> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Schema {
            path: path.display().to_string(),
            message: format!("cannot read: {e}"),
        })?;
        Ok(Self::parse(&text, &path.display().to_string())?)
    }

    pub(crate) fn parse(text: &str, path: &str) -> Result<GraphSchema> {
        let catalog = parse_catalog(text, path)?;
        // omnigraph-compiler 0.8.0 stores the one bound of `..max` as a
        // minimum; the source text says which it was.
        let max_only: HashSet<String> =
            regex::Regex::new(r"@range\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,\s*\.\.")
                .expect("valid regex")
                .captures_iter(text)
                .map(|c| c[1].to_string())
                .collect();
        let mut nodes: Vec<_> = catalog.node_types.values().collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let mut edges: Vec<_> = catalog.edge_types.values().collect();
        edges.sort_by(|a, b| a.name.cmp(&b.name));
        let mut types = Vec::with_capacity(nodes.len() + edges.len());
        for n in nodes {
            types.push(node_type(n, path, &max_only)?);
        }
        for e in edges {
            types.push(edge_type(e, path)?);
        }
        Ok(GraphSchema {
            types,
            source: text.to_string(),
        })
    }

    pub fn get(&self, name: &str) -> Option<&GraphType> {
        self.types.iter().find(|t| t.name == name)
    }

    pub fn by_table(&self) -> HashMap<&str, &GraphType> {
        self.types.iter().map(|t| (t.table.as_str(), t)).collect()
    }
}

impl GraphType {
    fn new(name: &str, kind: TypeKind, key: Vec<String>, catalog_schema: &Schema) -> GraphType {
        // The catalog schema is `id` (+ `src`, `dst` for edges) + properties;
        // skip by position, since a node may declare a property named `id`.
        let skip = match kind {
            TypeKind::Node => 1,
            TypeKind::Edge => 3,
        };
        let props: Vec<Field> = catalog_schema
            .fields()
            .iter()
            .skip(skip)
            .map(|f| f.as_ref().clone())
            .collect();
        let mut fields = vec![Field::new(ID, DataType::Utf8, false)
            .with_metadata([(PK_METADATA.to_string(), "true".to_string())].into())];
        if kind == TypeKind::Edge {
            fields.push(Field::new("src", DataType::Utf8, false));
            fields.push(Field::new("dst", DataType::Utf8, false));
        }
        // A property `id` (only allowed as the single @key) is the id column.
        fields.extend(props.iter().filter(|f| f.name() != ID).cloned());
        fields.extend(provenance_fields());
        let dir = match kind {
            TypeKind::Node => "nodes",
            TypeKind::Edge => "edges",
        };
        GraphType {
            name: name.to_string(),
            kind,
            table: format!("{dir}/{name}"),
            key,
            properties: Arc::new(Schema::new(props)),
            table_schema: Arc::new(Schema::new(fields)),
            constraints: Constraints::default(),
            ends: None,
            pending_schema: None,
        }
    }

    /// Takes the column order of the stored tables: Lance's `add_columns`
    /// appends a new property after the provenance columns, and a MemWAL
    /// writer matches a batch's columns by position, so every batch must be
    /// built in the stored order (docs/schema-evolution.md). `stored` must
    /// hold the same columns (`same_columns`); `pending` is the edge's
    /// `_pending` table.
    pub(crate) fn adopt_order(&mut self, stored: &Schema, pending: Option<&Schema>) {
        let pending_wanted = crate::schema::tables::pending_schema(self);
        self.table_schema = in_order_of(&self.table_schema, stored);
        if let Some(p) = pending {
            self.pending_schema = Some(in_order_of(&pending_wanted, p));
        }
    }

    /// True for an edge type whose id is `(src, dst)`: `@unique(src, dst)`.
    pub fn unique_endpoints(&self) -> bool {
        self.constraints.uniques.iter().any(|u| {
            u.len() == 2 && u.contains(&"src".to_string()) && u.contains(&"dst".to_string())
        })
    }
}

/// `.pg` text → omnigraph's catalog, with errors as one line naming the
/// line and column.
fn parse_catalog(text: &str, path: &str) -> Result<Catalog> {
    let ast = omnigraph_compiler::schema::parser::parse_schema_diagnostic(text).map_err(|d| {
        let at = d
            .span
            .map(|s| {
                let (line, col) = line_col(text, s.start);
                format!("line {line}, column {col}: ")
            })
            .unwrap_or_default();
        Error::Schema {
            path: path.into(),
            // pest repeats the source line; keep only its verdict.
            message: format!(
                "{at}{}",
                d.message.rsplit("= ").next().unwrap_or(&d.message).trim()
            ),
        }
    })?;
    omnigraph_compiler::build_catalog(&ast).map_err(|e| Error::Schema {
        path: path.into(),
        message: e.to_string().replace('\n', " "),
    })
}

fn node_type(n: &NodeType, path: &str, max_only: &HashSet<String>) -> Result<GraphType> {
    let schema_err = |message: String| Error::Schema {
        path: path.into(),
        message,
    };
    let key = n.key.clone().ok_or_else(|| {
        schema_err(format!(
            "node {} has no @key: graphsink derives node ids from it",
            n.name
        ))
    })?;
    if n.properties.contains_key(ID) && key != [ID] {
        return Err(schema_err(format!(
            "node {}: a property named id must be the node's single @key (it becomes the id column)",
            n.name
        )));
    }
    check_reserved(path, &n.name, n.properties.keys())?;
    for k in &key {
        let t = &n.properties[k];
        if t.list || matches!(t.scalar, ScalarType::Vector(_) | ScalarType::Blob) {
            return Err(schema_err(format!(
                "node {}: @key property {k} must be a scalar",
                n.name
            )));
        }
    }
    let mut t = GraphType::new(&n.name, TypeKind::Node, key, &n.arrow_schema);
    t.constraints = Constraints {
        enums: enums(&n.properties),
        ranges: n
            .range_constraints
            .iter()
            .map(|r| {
                let (min, max) = (r.min.as_ref().map(bound), r.max.as_ref().map(bound));
                let (min, max) = match (min, max) {
                    (Some(b), None) if max_only.contains(&r.property) => (None, Some(b)),
                    other => other,
                };
                RangeCheck {
                    property: r.property.clone(),
                    min,
                    max,
                }
            })
            .collect(),
        checks: n
            .check_constraints
            .iter()
            .map(|c| (c.property.clone(), c.pattern.clone()))
            .collect(),
        uniques: n.unique_constraints.clone(),
    };
    Ok(t)
}

fn edge_type(e: &EdgeType, path: &str) -> Result<GraphType> {
    if let Some(bad) = e
        .properties
        .keys()
        .find(|p| [ID, "src", "dst"].contains(&p.as_str()))
    {
        return Err(Error::Schema {
            path: path.into(),
            message: format!("edge {}: property {bad} is reserved", e.name),
        });
    }
    check_reserved(path, &e.name, e.properties.keys())?;
    let mut t = GraphType::new(&e.name, TypeKind::Edge, vec![], &e.arrow_schema);
    t.constraints = Constraints {
        enums: enums(&e.properties),
        uniques: e.unique_constraints.clone(),
        ..Default::default()
    };
    t.ends = Some(EdgeEnds {
        from: e.from_type.clone(),
        to: e.to_type.clone(),
        card_min: e.cardinality.min,
        card_max: e.cardinality.max,
    });
    Ok(t)
}

fn enums(
    props: &HashMap<String, omnigraph_compiler::types::PropType>,
) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<_> = props
        .iter()
        .filter_map(|(name, t)| t.enum_values.clone().map(|v| (name.clone(), v)))
        .collect();
    out.sort();
    out
}

fn bound(v: &omnigraph_compiler::catalog::LiteralValue) -> Bound {
    match v {
        omnigraph_compiler::catalog::LiteralValue::Integer(i) => Bound::Int(*i),
        omnigraph_compiler::catalog::LiteralValue::Float(f) => Bound::Float(*f),
    }
}

/// Provenance column names are graphsink's; a property may not take one.
fn check_reserved<'a>(path: &str, ty: &str, props: impl Iterator<Item = &'a String>) -> Result<()> {
    for p in props {
        if provenance_fields().iter().any(|f| f.name() == p) {
            return Err(Error::Schema {
                path: path.into(),
                message: format!("{ty}: property {p} is reserved for provenance"),
            });
        }
    }
    Ok(())
}

pub(crate) fn provenance_fields() -> Vec<Field> {
    vec![
        Field::new(SRC_TOPIC, DataType::Utf8, false),
        Field::new(SRC_PARTITION, DataType::Int32, false),
        Field::new(SRC_OFFSET, DataType::Int64, false),
        Field::new(
            SRC_TIMESTAMP,
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            true,
        ),
    ]
}

/// `ours`' fields in `stored`'s order (those `stored` lacks last).
fn in_order_of(ours: &SchemaRef, stored: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = ours.fields().iter().map(|f| f.as_ref().clone()).collect();
    let at = |f: &Field| stored.index_of(f.name()).unwrap_or(usize::MAX);
    fields.sort_by_key(|f| at(f));
    Arc::new(Schema::new_with_metadata(fields, ours.metadata().clone()))
}

/// Compares column layouts (names, types, nullability), ignoring metadata
/// and order: a column added to a graph's table is stored last (see
/// `GraphType::adopt_order`).
pub(crate) fn same_columns(a: &Schema, b: &Schema) -> std::result::Result<(), String> {
    let mut b_fields: Vec<&Field> = b.fields().iter().map(|f| f.as_ref()).collect();
    b_fields.sort_by_key(|f| a.index_of(f.name()).unwrap_or(usize::MAX));
    let b = &Schema::new(b_fields.into_iter().cloned().collect::<Vec<_>>());
    if a.fields().len() != b.fields().len() {
        let names = |s: &Schema| {
            s.fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(format!("columns [{}] vs [{}]", names(a), names(b)));
    }
    for (x, y) in a.fields().iter().zip(b.fields()) {
        if x.name() != y.name()
            || x.data_type() != y.data_type()
            || x.is_nullable() != y.is_nullable()
        {
            return Err(format!(
                "column {}: {}{} vs {}: {}{}",
                x.name(),
                x.data_type(),
                if x.is_nullable() { "?" } else { "" },
                y.name(),
                y.data_type(),
                if y.is_nullable() { "?" } else { "" },
            ));
        }
    }
    Ok(())
}

fn line_col(text: &str, byte: usize) -> (usize, usize) {
    let upto = &text[..byte.min(text.len())];
    let line = upto.matches('\n').count() + 1;
    let col = upto
        .rsplit('\n')
        .next()
        .map(|l| l.chars().count())
        .unwrap_or(0)
        + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_table_layout() {
        let s = GraphSchema::parse(
            "node Person { name: String @key  age: I32? }\nnode M { t: String  s: U32  @key(t, s) }",
            "x.pg",
        )
        .unwrap();
        let p = s.get("Person").unwrap();
        assert_eq!(p.table, "nodes/Person");
        assert_eq!(p.key, vec!["name"]);
        let names: Vec<_> = p
            .table_schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(
            names,
            [
                "id",
                "name",
                "age",
                SRC_TOPIC,
                SRC_PARTITION,
                SRC_OFFSET,
                SRC_TIMESTAMP
            ]
        );
        assert_eq!(s.get("M").unwrap().key, vec!["t", "s"]);
    }

    #[test]
    fn parse_error_names_the_line() {
        let e = GraphSchema::parse("node A { a: String @key }\nnode B { b: Strin }", "x.pg")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn a_property_named_id_is_the_id_column() {
        let s = GraphSchema::parse("node U { id: I64 @key  n: String? }", "x.pg").unwrap();
        let u = s.get("U").unwrap();
        let names: Vec<_> = u
            .table_schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(&names[..2], ["id", "n"]);
        assert!(u.properties.field_with_name("id").is_ok());
        let e = GraphSchema::parse("node U { id: String  k: String @key }", "x.pg").unwrap_err();
        assert!(e.to_string().contains("single @key"), "{e}");
        let e =
            GraphSchema::parse("node U { k: String @key  _src_offset: I64 }", "x.pg").unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
    }

    #[test]
    fn open_range_ends_are_kept_apart() {
        let s = GraphSchema::parse(
            "node P { k: String @key  a: I32?  b: F64?  @range(a, 0..)  @range(b, ..1.5) }",
            "x.pg",
        )
        .unwrap();
        let r = &s.get("P").unwrap().constraints.ranges;
        let a = r.iter().find(|r| r.property == "a").unwrap();
        let b = r.iter().find(|r| r.property == "b").unwrap();
        assert_eq!((a.min, a.max), (Some(Bound::Int(0)), None));
        assert_eq!((b.min, b.max), (None, Some(Bound::Float(1.5))));
    }

    #[test]
    fn a_column_stored_last_is_the_same_layout_and_batches_take_the_stored_order() {
        let s = GraphSchema::parse(
            "node P { name: String @key  age: I32? }\nedge E: P -> P { w: F64? }",
            "x.pg",
        )
        .unwrap();
        let names = |s: &Schema| {
            s.fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
        };
        // As Lance's add_columns leaves it: the new column after provenance.
        let last = |s: &Schema, col: &str| {
            let mut f: Vec<Field> = (s.fields().iter())
                .filter(|f| f.name() != col)
                .map(|f| f.as_ref().clone())
                .collect();
            f.push(s.field_with_name(col).unwrap().clone());
            Schema::new(f)
        };
        let mut p = s.get("P").unwrap().clone();
        let stored = last(&p.table_schema, "age");
        assert_eq!(same_columns(&p.table_schema, &stored), Ok(()));
        p.adopt_order(&stored, None);
        assert_eq!(names(&p.table_schema), names(&stored));
        let fewer = Schema::new(stored.fields()[..stored.fields().len() - 1].to_vec());
        assert!(same_columns(&p.table_schema, &fewer).is_err());
        // An edge's pending table: the column after `_pending_since`.
        let mut e = s.get("E").unwrap().clone();
        let stored = last(&e.table_schema, "w");
        let pending = last(&crate::schema::pending_schema(&e), "w");
        e.adopt_order(&stored, Some(&pending));
        assert_eq!(names(&crate::schema::pending_schema(&e)), names(&pending));
        assert_eq!(names(&e.table_schema), names(&stored));
    }

    #[test]
    fn node_without_key_is_refused() {
        let e = GraphSchema::parse("node A { a: String }", "x.pg")
            .unwrap_err()
            .to_string();
        assert!(e.contains("@key"), "{e}");
    }
}

#[cfg(test)]
mod doc_schema_tests {
    use super::*;

    /// The example of SCHEMA.md: interfaces, composite keys, constraints,
    /// edges with cardinality and uniqueness.
    #[test]
    fn schema_md_example_parses() {
        let s = GraphSchema::parse(
            r#"
            interface Named { name: String @key }
            node Person implements Named { age: I32?  email: String? @unique  @range(age, 0..200) }
            node Order { code: String @key  @check(code, "^[A-Z]{3}-[0-9]+$") }
            node Membership { tenant: String  slot: U32  label: String  @key(tenant, slot) }
            node Decision { id_: String @key }
            node Actor { handle: String @key @description("who") }
            edge Knows: Person -> Person { since: Date? }
            edge OwnedBy: Decision -> Actor @card(1..1)
            edge Supersedes: Decision -> Decision { @unique(src, dst) }
            "#,
            "doc.pg",
        )
        .unwrap();
        let p = s.get("Person").unwrap();
        assert_eq!(p.key, vec!["name"]);
        assert!(p.properties.field_with_name("name").is_ok());
        assert_eq!(s.get("Membership").unwrap().key, vec!["tenant", "slot"]);
        let k = s.get("Knows").unwrap();
        assert_eq!(k.table, "edges/Knows");
        let cols: Vec<_> = k
            .table_schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(&cols[..4], ["id", "src", "dst", "since"]);
    }
}
