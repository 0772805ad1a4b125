//! `[graph] evolve = "from_registry"` (docs/schema-evolution.md): the schema
//! a session runs with is the config's `.pg`, plus every optional property
//! an earlier start took from the registry (the graph records it, the file
//! does not declare it), plus each new optional field of the mapped
//! subjects' latest writer schemas, as the Iceberg sink's
//! `evolve-schema-enabled` adds columns. The session start then applies
//! the additions like any additive change (one schema commit). A session
//! that meets a writer schema with such a field ends (`grown`), and the
//! next one adds it.

use std::collections::{BTreeMap, HashSet};

use crate::config::{Config, Mapping};
use crate::decode::{writer_fields, RecordDecoder, WriterField};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::registry::{Lookup, Registry, Schema};
use crate::schema::{provenance_fields, GraphSchema, GraphType, TypeKind};

/// Properties to add: type name → (property, `.pg` type), in order.
type Additions = BTreeMap<String, Vec<(String, &'static str)>>;

/// The schema a session under `from_registry` runs with.
pub(crate) async fn schema(config: &Config, file: GraphSchema) -> Result<GraphSchema> {
    let mut add = Additions::new();
    // What earlier starts took from the registry stays.
    if let Ok(graph) = Graph::open_configured(config).await {
        if let Some(recorded) = graph.recorded_schema().await? {
            for t in &file.types {
                let Some(old) = recorded.get(&t.name) else {
                    continue;
                };
                for f in old.properties.fields() {
                    let known = t.properties.field_with_name(f.name()).is_ok();
                    if let (false, true, Some(pg)) = (known, f.is_nullable(), pg_type(f)) {
                        add.entry(t.name.clone())
                            .or_default()
                            .push((f.name().clone(), pg));
                    }
                }
            }
        }
    }
    let registry = Registry::new(&config.schema_registry)?;
    for m in config.mappings.iter().filter(|m| m.format.uses_registry()) {
        let subject = format!("{}-value", m.topic);
        let latest = match registry.version(&subject, "latest").await {
            Ok(v) => v,
            Err(Lookup::NotFound(_)) => continue, // nothing written yet
            Err(Lookup::Unavailable(why)) => {
                tracing::warn!(topic = %m.topic, %subject, "cannot read the subject's latest schema ({why}); its new fields are added when a record brings them");
                continue;
            }
        };
        let schema = match registry.with_imports(latest.schema.clone()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(topic = %m.topic, %subject, "cannot read the schemas the subject imports ({e}); its new fields are added when a record brings them");
                continue;
            }
        };
        let Some(ty) = file.get(m.type_name()) else {
            continue;
        };
        let have: HashSet<String> = (add.get(&ty.name).into_iter().flatten())
            .map(|(n, _)| n.clone())
            .collect();
        for (name, pg) in new_fields(m, ty, &schema)? {
            if !have.contains(&name) {
                add.entry(ty.name.clone()).or_default().push((name, pg));
            }
        }
    }
    if add.is_empty() {
        return Ok(file);
    }
    let text = with_properties(&file.source, &file, &add);
    GraphSchema::parse(
        &text,
        &format!(
            "{} (with properties from the schema registry)",
            config.schema_path().display()
        ),
    )
}

/// `schema`'s optional fields with a `.pg` type that `ty` lacks and could
/// take as a property (a name `.pg` accepts, not reserved); others are
/// said once.
fn new_fields(m: &Mapping, ty: &GraphType, schema: &Schema) -> Result<Vec<(String, &'static str)>> {
    let fields = writer_fields(m.format, schema, m.message.as_deref())
        .map_err(|e| Error::config(format!("topic {}: the writer schema: {e}", m.topic)))?;
    let mut out = Vec::new();
    for WriterField {
        name,
        pg_type,
        optional,
    } in fields
    {
        if ty.properties.field_with_name(&name).is_ok() || ty.key.contains(&name) {
            continue;
        }
        let reserved = ["id", "src", "dst"].contains(&name.as_str())
            || provenance_fields().iter().any(|f| f.name() == &name);
        match pg_type {
            Some(pg) if optional && !reserved && is_identifier(&name) => out.push((name, pg)),
            _ => {
                tracing::info!(topic = %m.topic, type_name = %ty.name, field = %name, "a writer field the type lacks is not added (evolve = \"from_registry\" adds optional fields of a scalar type with a .pg name)")
            }
        }
    }
    Ok(out)
}

/// Whether the registry's writer schema `schema` for `m` (decoded into
/// `decoder`'s type) has a field `new_fields` would add: the session ends
/// so that the next one adds it (`Error::RegistrySchemaGrew`).
pub(super) fn grown(m: &Mapping, decoder: &RecordDecoder, id: u32, schema: &Schema) -> Result<()> {
    let fields = new_fields(m, decoder.graph_type(), schema)?;
    if fields.is_empty() {
        return Ok(());
    }
    Err(Error::RegistrySchemaGrew {
        topic: m.topic.clone(),
        id,
        fields: fields.into_iter().map(|(n, _)| n).collect(),
    })
}

fn is_identifier(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// The `.pg` type of a property column, for the scalars `from_registry`
/// adds.
fn pg_type(f: &arrow_schema::Field) -> Option<&'static str> {
    use arrow_schema::{DataType, TimeUnit};
    Some(match f.data_type() {
        DataType::Utf8 => "String",
        DataType::Int32 => "I32",
        DataType::Int64 => "I64",
        DataType::UInt32 => "U32",
        DataType::UInt64 => "U64",
        DataType::Float32 => "F32",
        DataType::Float64 => "F64",
        DataType::Boolean => "Bool",
        DataType::Date32 => "Date",
        DataType::Timestamp(TimeUnit::Millisecond, _) => "DateTime",
        _ => return None,
    })
}

/// `source` with `add`'s properties declared in each type's body (a body
/// is opened for an edge declared without one).
fn with_properties(source: &str, schema: &GraphSchema, add: &Additions) -> String {
    let mut text = source.to_string();
    let next = regex::Regex::new(r"(?m)^\s*(node|edge)\s").expect("valid regex");
    for (ty, props) in add {
        let Some(t) = schema.get(ty) else { continue };
        let lines: String = props
            .iter()
            .map(|(n, pg)| format!("  {n}: {pg}?\n"))
            .collect();
        let kw = match t.kind {
            TypeKind::Node => "node",
            TypeKind::Edge => "edge",
        };
        let decl = regex::Regex::new(&format!(r"(?m)^\s*{kw}\s+{}\b", regex::escape(ty)))
            .expect("valid regex");
        let Some(at) = decl.find(&text).map(|m| m.end()) else {
            continue;
        };
        let end = next.find_at(&text, at).map_or(text.len(), |m| m.start());
        match text[at..end].find('{') {
            Some(open) => {
                let mut depth = 0;
                let close = text[at + open..end].char_indices().find_map(|(i, c)| {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                return Some(at + open + i);
                            }
                        }
                        _ => {}
                    }
                    None
                });
                if let Some(close) = close {
                    text.insert_str(close, &format!("\n{lines}"));
                }
            }
            None => {
                let eol = text[at..end].find('\n').map_or(end, |i| at + i);
                text.insert_str(eol, &format!(" {{\n{lines}}}"));
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_go_into_each_body_and_open_one_for_a_bare_edge() {
        let src = "node Person { name: String @key }\n\
                   edge Knows: Person -> Person @card(0..5) { since: I32? }\n\
                   edge Likes: Person -> Person\n";
        let s = GraphSchema::parse(src, "x.pg").unwrap();
        let mut add = Additions::new();
        add.insert("Person".into(), vec![("nick".into(), "String")]);
        add.insert("Knows".into(), vec![("w".into(), "F64")]);
        add.insert(
            "Likes".into(),
            vec![("at".into(), "DateTime"), ("n".into(), "I64")],
        );
        let text = with_properties(src, &s, &add);
        let t = GraphSchema::parse(&text, "x.pg").unwrap_or_else(|e| panic!("{e}\n{text}"));
        let nullable = |ty: &str, p: &str| {
            t.get(ty)
                .unwrap()
                .properties
                .field_with_name(p)
                .unwrap()
                .is_nullable()
        };
        assert!(nullable("Person", "nick") && nullable("Knows", "w"));
        assert!(nullable("Likes", "at") && nullable("Likes", "n"));
        assert!(nullable("Knows", "since"));
        assert_eq!(
            t.get("Knows").unwrap().ends.as_ref().unwrap().card_max,
            Some(5)
        );
        assert!(is_identifier("nick_2") && !is_identifier("first-name") && !is_identifier("2x"));
    }
}
