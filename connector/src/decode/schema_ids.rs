//! What a registry format knows of each schema id framed in its values:
//! the id's writer, ready to read, or why its records are refused. The
//! registry formats (`avro`, `protobuf`, `json_schema`, and Debezium events
//! in Avro) share what they would each repeat: the id not learned yet, the
//! id the registry lacks (`unknown_schema_id`), and the id of another
//! format's schema (`schema_mismatch`).

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::Error;
use crate::registry::{wire, Schema, SchemaType};
use crate::rejects::RejectCode;

use super::format::Learned;
use super::{Fail, Step};

/// Why every record of a schema id is refused.
pub(super) type Refusal = (RejectCode, String);

/// The schema ids of one registry format, each with its writer `W` (what
/// the format keeps to read the id's values) or its refusal.
pub(super) struct SchemaIds<W> {
    /// The schema type the mapping's format reads.
    schema_type: SchemaType,
    /// The format's config name, for the refusal of another type's id.
    format: &'static str,
    /// By schema id, looked up for every record: a fast hash of a u32.
    ids: HashMap<u32, std::result::Result<W, Refusal>, foldhash::fast::RandomState>,
}

impl<W> SchemaIds<W> {
    pub(super) fn new(schema_type: SchemaType, format: &'static str) -> SchemaIds<W> {
        SchemaIds {
            schema_type,
            format,
            ids: HashMap::default(),
        }
    }

    /// The schema id framed in `value`, if it has not been learned yet.
    pub(super) fn unlearned(&self, value: &[u8]) -> Option<u32> {
        let id = wire::frame(value).ok()?.schema_id;
        (!self.ids.contains_key(&id)).then_some(id)
    }

    /// Learns what the registry holds for `id`: an id it lacks is
    /// `unknown_schema_id`, another type's schema is `schema_mismatch`;
    /// a schema of the format's type becomes its writer by `ready`, which
    /// may refuse it too.
    pub(super) fn learn(
        &mut self,
        id: u32,
        schema: Learned,
        ready: impl FnOnce(Arc<Schema>) -> std::result::Result<W, Refusal>,
    ) {
        let known = match schema {
            Err(m) => Err((RejectCode::UnknownSchemaId, m)),
            Ok(s) if s.schema_type != self.schema_type => Err((
                RejectCode::SchemaMismatch,
                format!(
                    "schema id {id} is a {:?} schema, and this mapping's format is {}",
                    s.schema_type, self.format
                ),
            )),
            Ok(s) => ready(s),
        };
        self.ids.insert(id, known);
    }

    /// A value's frame, and its id's writer if learned; or why the value is
    /// refused (`bad_framing`, or its id's refusal).
    pub(super) fn screen<'v>(
        &self,
        value: &'v [u8],
    ) -> std::result::Result<(wire::Frame<'v>, Option<&W>), Refusal> {
        let f = wire::frame(value).map_err(|e| (RejectCode::BadFraming, e.0))?;
        match self.ids.get(&f.schema_id) {
            Some(Err(refused)) => Err(refused.clone()),
            Some(Ok(w)) => Ok((f, Some(w))),
            None => Ok((f, None)),
        }
    }

    /// Why the records of `id` are refused, if they are.
    pub(super) fn refusal(&self, id: u32) -> Option<Refusal> {
        match self.ids.get(&id) {
            Some(Err(refused)) => Some(refused.clone()),
            _ => None,
        }
    }

    /// What is known of `id`, to read a value with (`None`: not learned).
    pub(super) fn get_mut(&mut self, id: u32) -> Option<std::result::Result<&mut W, &Refusal>> {
        self.ids.get_mut(&id).map(|k| k.as_mut().map_err(|r| &*r))
    }

    /// The writer of `id` for a batch decode: a refused id is its records'
    /// reject; an id not learned is graphsink's bug (`learn` comes first).
    pub(super) fn ready_mut(&mut self, id: u32) -> Step<&mut W> {
        match self.get_mut(id) {
            Some(Ok(w)) => Ok(w),
            Some(Err((code, m))) => Err(Fail::Record(*code, m.clone())),
            None => Err(Fail::System(Error::Bug(format!(
                "schema id {id} was not fetched before decoding"
            )))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(schema_type: SchemaType, text: &str) -> Learned {
        Ok(Arc::new(Schema {
            schema_type,
            text: text.into(),
            descriptor: None,
            references: vec![],
            imports: vec![],
        }))
    }

    #[test]
    fn an_id_is_unlearned_then_ready_unknown_of_another_type_or_refused_by_the_format() {
        let mut ids: SchemaIds<String> = SchemaIds::new(SchemaType::Avro, "avro");
        let value = |id| wire::framed(id, b"payload");
        assert_eq!(ids.unlearned(&value(1)), Some(1));
        assert_eq!(ids.unlearned(b"no frame"), None);
        ids.learn(1, schema(SchemaType::Avro, "\"string\""), |s| {
            Ok(s.text.clone())
        });
        ids.learn(2, Err("not found".into()), |_| unreachable!("no schema"));
        ids.learn(3, schema(SchemaType::Protobuf, "p"), |_| {
            unreachable!("not avro")
        });
        ids.learn(4, schema(SchemaType::Avro, "x"), |_| {
            Err((RejectCode::UnknownField, "refused by the format".into()))
        });
        for id in 1..=4 {
            assert_eq!(ids.unlearned(&value(id)), None, "{id} is learned");
        }
        let v = value(1);
        let (frame, writer) = ids.screen(&v).unwrap();
        assert_eq!(
            (frame.rest, writer),
            (&b"payload"[..], Some(&String::from("\"string\"")))
        );
        assert_eq!(ids.refusal(1), None);
        assert_eq!(
            ids.refusal(2),
            Some((RejectCode::UnknownSchemaId, "not found".into()))
        );
        assert_eq!(
            ids.screen(&value(3)).unwrap_err(),
            (
                RejectCode::SchemaMismatch,
                "schema id 3 is a Protobuf schema, and this mapping's format is avro".into()
            )
        );
        assert_eq!(ids.refusal(4).unwrap().0, RejectCode::UnknownField);
        assert_eq!(ids.screen(b"\x01").unwrap_err().0, RejectCode::BadFraming);
        assert!(ids.ready_mut(1).is_ok());
        assert!(matches!(
            ids.ready_mut(2),
            Err(Fail::Record(RejectCode::UnknownSchemaId, _))
        ));
        // `learn` comes before any decode: an id never learned is a bug.
        assert!(matches!(ids.ready_mut(9), Err(Fail::System(_))));
    }
}
