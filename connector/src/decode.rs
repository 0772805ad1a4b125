//! Decode: Kafka records of one mapping → one Arrow batch of upserts in the
//! table's schema plus one batch of tombstone keys, per poll. Ids come from
//! the `@key`; provenance columns come from the record's coordinates. It
//! knows nothing of shards or offsets.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    new_null_array, Array, ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMillisecondArray, UInt32Array,
};
use arrow::compute::{cast_with_options, take, CastOptions};
use arrow_json::reader::Decoder;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::config::{KeyOrigin, KeySource, Mapping};
use crate::error::{Context, Error, Result};
use crate::schema::{GraphType, ID};

/// One consumed record, borrowed from the poll.
#[derive(Debug, Clone, Copy)]
pub struct SourceRecord<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Option<i64>,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

/// What one poll of one mapping becomes. A key appears in at most one of
/// the two batches: within a poll the last record per key wins.
#[derive(Debug, Default)]
pub struct Decoded {
    /// Rows in the table schema.
    pub upserts: Option<RecordBatch>,
    /// A single `id` column.
    pub deletes: Option<RecordBatch>,
}

/// Turns records of one topic into rows of its node type.
pub struct RecordDecoder {
    ty: GraphType,
    key: KeySource,
    /// Schema the JSON value is decoded into (properties, key ones relaxed
    /// to nullable when the key comes from elsewhere).
    value_schema: SchemaRef,
    decoder: Decoder,
    batch_size: usize,
}

impl RecordDecoder {
    pub fn new(ty: &GraphType, mapping: &Mapping, batch_size: usize) -> Result<RecordDecoder> {
        let relax = !matches!(mapping.key, KeySource::Named(KeyOrigin::Value));
        let mut fields: Vec<Field> = ty
            .properties
            .fields()
            .iter()
            .map(|f| {
                let f = f.as_ref().clone();
                if relax && ty.key.contains(f.name()) {
                    f.with_nullable(true)
                } else {
                    f
                }
            })
            .collect();
        if let KeySource::Field { field } = &mapping.key {
            if ty.properties.field_with_name(field).is_err() {
                if ty.key.len() != 1 {
                    return Err(Error::config(format!(
                        "mapping for topic {}: key field {field:?} must name a property when {} has a composite @key",
                        mapping.topic, ty.name
                    )));
                }
                let kt = ty
                    .properties
                    .field_with_name(&ty.key[0])
                    .expect("key is a property");
                fields.push(Field::new(field, kt.data_type().clone(), true));
            } else if ty.key.len() != 1 || &ty.key[0] != field {
                return Err(Error::config(format!(
                    "mapping for topic {}: key field {field:?} is a property but not the @key of {}",
                    mapping.topic, ty.name
                )));
            }
        }
        let value_schema = Arc::new(Schema::new(fields));
        let batch_size = batch_size + 1;
        Ok(RecordDecoder {
            decoder: build_decoder(&value_schema, batch_size)?,
            ty: ty.clone(),
            key: mapping.key.clone(),
            value_schema,
            batch_size,
        })
    }

    pub fn graph_type(&self) -> &GraphType {
        &self.ty
    }

    /// Decodes a whole poll. On a bad record, returns the error for the
    /// first bad one (found by re-decoding one at a time), naming its
    /// coordinates; nothing of the poll is returned then.
    pub fn decode(&mut self, records: &[SourceRecord<'_>]) -> Result<Decoded> {
        match self.decode_all(records) {
            Ok(d) => Ok(d),
            Err(batch_err) => {
                // Rebuild: a failed decoder may hold half a record.
                self.decoder = build_decoder(&self.value_schema, self.batch_size)?;
                for r in records {
                    self.decode_all(std::slice::from_ref(r))
                        .map_err(|e| match e {
                            Error::Decode { .. } => e,
                            other => decode_error(r, other.to_string()),
                        })?;
                }
                Err(batch_err)
            }
        }
    }

    fn decode_all(&mut self, records: &[SourceRecord<'_>]) -> Result<Decoded> {
        let upsert_idx: Vec<usize> = (0..records.len())
            .filter(|&i| records[i].value.is_some())
            .collect();
        let delete_idx: Vec<usize> = (0..records.len())
            .filter(|&i| records[i].value.is_none())
            .collect();

        let mut upserts = None;
        let mut upsert_ids = None;
        if !upsert_idx.is_empty() {
            let batch = self.decode_values(records, &upsert_idx)?;
            let ups: Vec<SourceRecord> = upsert_idx.iter().map(|&i| records[i]).collect();
            let (rows, ids) = self.finish_rows(&ups, batch)?;
            upserts = Some(rows);
            upsert_ids = Some(ids);
        }
        let mut delete_ids = None;
        if !delete_idx.is_empty() {
            let dels: Vec<SourceRecord> = delete_idx.iter().map(|&i| records[i]).collect();
            let parts = self.key_from_kafka(&dels)?;
            delete_ids = Some(canonical_ids(&parts)?);
        }

        // The last record per id wins within the poll.
        let mut last: HashMap<&str, usize> = HashMap::new();
        let mut order: Vec<(&str, usize)> = Vec::new();
        if let Some(ids) = &upsert_ids {
            order.extend(
                upsert_idx
                    .iter()
                    .zip(0..ids.len())
                    .map(|(&r, i)| (ids.value(i), r)),
            );
        }
        if let Some(ids) = &delete_ids {
            order.extend(
                delete_idx
                    .iter()
                    .zip(0..ids.len())
                    .map(|(&r, i)| (ids.value(i), r)),
            );
        }
        for (id, r) in &order {
            let e = last.entry(id).or_insert(*r);
            if *r > *e {
                *e = *r;
            }
        }
        let keep = |idx: &[usize], ids: &StringArray| -> UInt32Array {
            (0..ids.len())
                .filter(|&i| last[ids.value(i)] == idx[i])
                .map(|i| i as u32)
                .collect()
        };
        let mut out = Decoded::default();
        if let (Some(rows), Some(ids)) = (upserts, &upsert_ids) {
            let k = keep(&upsert_idx, ids);
            out.upserts = Some(if k.len() == rows.num_rows() {
                rows
            } else {
                take_rows(&rows, &k)?
            });
        }
        if let Some(ids) = &delete_ids {
            let k = keep(&delete_idx, ids);
            if !k.is_empty() {
                let col = take(ids, &k, None).ctx("select tombstones")?;
                let schema = Arc::new(Schema::new(vec![Field::new(ID, DataType::Utf8, false)]));
                out.deletes = Some(RecordBatch::try_new(schema, vec![col]).ctx("tombstones")?);
            }
        }
        Ok(out)
    }

    /// arrow-json over the values of `idx`; each value must be exactly one
    /// JSON object.
    fn decode_values(&mut self, records: &[SourceRecord], idx: &[usize]) -> Result<RecordBatch> {
        for &i in idx {
            let r = &records[i];
            let value = r.value.expect("upserts have values");
            let before = self.decoder.len();
            let read = self
                .decoder
                .decode(value)
                .map_err(|e| decode_error(r, e.to_string()))?;
            if read != value.len()
                || self.decoder.has_partial_record()
                || self.decoder.len() != before + 1
            {
                return Err(decode_error(
                    r,
                    "value is not exactly one JSON object".into(),
                ));
            }
        }
        let batch = self
            .decoder
            .flush()
            .map_err(|e| Error::Other(e.to_string()))?
            .ok_or_else(|| Error::Other("decoder produced no rows".into()))?;
        Ok(batch)
    }

    /// Fills the key properties, derives `id`, appends provenance, and
    /// orders the columns as the table declares them.
    fn finish_rows(
        &self,
        recs: &[SourceRecord],
        batch: RecordBatch,
    ) -> Result<(RecordBatch, StringArray)> {
        let mut cols: HashMap<String, ArrayRef> = batch
            .schema()
            .fields()
            .iter()
            .zip(batch.columns())
            .map(|(f, c)| (f.name().clone(), c.clone()))
            .collect();
        let from_elsewhere = match &self.key {
            KeySource::Named(KeyOrigin::Value) => None,
            KeySource::Named(KeyOrigin::Kafka) => Some(self.key_from_kafka(recs)?),
            KeySource::Field { field } if !self.ty.key.contains(field) => {
                let c = cols.remove(field).expect("decoded");
                Some(vec![c])
            }
            KeySource::Field { .. } => None,
        };
        if let Some(parts) = from_elsewhere {
            for (k, part) in self.ty.key.iter().zip(parts) {
                let decoded = &cols[k];
                for (i, rec) in recs.iter().enumerate() {
                    if part.is_null(i) {
                        return Err(decode_error(rec, format!("missing key for @key {k}")));
                    }
                    if decoded.is_valid(i) && !same_value(decoded, &part, i)? {
                        return Err(decode_error(
                            rec,
                            format!("value's {k} disagrees with the record key"),
                        ));
                    }
                }
                cols.insert(k.clone(), part);
            }
        }
        let parts: Vec<ArrayRef> = self.ty.key.iter().map(|k| cols[k].clone()).collect();
        for (k, p) in self.ty.key.iter().zip(&parts) {
            if let Some(i) = (0..p.len()).find(|&i| p.is_null(i)) {
                return Err(decode_error(&recs[i], format!("missing @key property {k}")));
            }
        }
        let ids = canonical_ids(&parts)?;
        cols.insert(ID.into(), Arc::new(ids.clone()));
        let n = recs.len();
        cols.insert(
            crate::schema::SRC_TOPIC.into(),
            Arc::new(StringArray::from_iter_values(recs.iter().map(|r| r.topic))),
        );
        cols.insert(
            crate::schema::SRC_PARTITION.into(),
            Arc::new(Int32Array::from_iter_values(
                recs.iter().map(|r| r.partition),
            )),
        );
        cols.insert(
            crate::schema::SRC_OFFSET.into(),
            Arc::new(Int64Array::from_iter_values(recs.iter().map(|r| r.offset))),
        );
        cols.insert(
            crate::schema::SRC_TIMESTAMP.into(),
            Arc::new(
                recs.iter()
                    .map(|r| r.timestamp)
                    .collect::<TimestampMillisecondArray>()
                    .with_timezone("UTC"),
            ),
        );
        let schema = self.ty.table_schema.clone();
        let columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|f| {
                cols.remove(f.name())
                    .unwrap_or_else(|| new_null_array(f.data_type(), n))
            })
            .collect();
        let rows = RecordBatch::try_new(schema, columns).map_err(|e| {
            // Nullability is the only way this can fail on decoded data.
            Error::Other(format!("{}: {e}", self.ty.name))
        })?;
        Ok((rows, ids))
    }

    /// The typed `@key` parts from Kafka keys: a string (optionally a JSON
    /// string) for a single key, a JSON array for a composite one.
    fn key_from_kafka(&self, recs: &[SourceRecord]) -> Result<Vec<ArrayRef>> {
        let width = self.ty.key.len();
        let mut texts: Vec<Vec<String>> = vec![Vec::with_capacity(recs.len()); width];
        for r in recs {
            let key = r.key.ok_or_else(|| {
                decode_error(r, "record has no key, and the key is needed".into())
            })?;
            let parts = split_key(key, width).map_err(|m| decode_error(r, m))?;
            for (t, p) in texts.iter_mut().zip(parts) {
                t.push(p);
            }
        }
        let mut out = Vec::with_capacity(width);
        for (k, t) in self.ty.key.iter().zip(texts) {
            let target = self
                .ty
                .properties
                .field_with_name(k)
                .expect("key")
                .data_type();
            let strings: ArrayRef = Arc::new(StringArray::from(t));
            let typed = cast_with_options(&strings, target, &CastOptions::default())
                .ctx(format!("cast key {k}"))?;
            if let Some(i) = (0..typed.len()).find(|&i| typed.is_null(i)) {
                return Err(decode_error(
                    &recs[i],
                    format!("key part {k} is not a valid {target}"),
                ));
            }
            out.push(typed);
        }
        Ok(out)
    }
}

fn build_decoder(schema: &SchemaRef, batch_size: usize) -> Result<Decoder> {
    arrow_json::ReaderBuilder::new(schema.clone())
        .with_batch_size(batch_size)
        .build_decoder()
        .ctx("build JSON decoder")
}

fn decode_error(r: &SourceRecord, reason: String) -> Error {
    Error::Decode {
        topic: r.topic.to_string(),
        partition: r.partition,
        offset: r.offset,
        reason,
    }
}

fn take_rows(batch: &RecordBatch, idx: &UInt32Array) -> Result<RecordBatch> {
    let cols = batch
        .columns()
        .iter()
        .map(|c| take(c, idx, None))
        .collect::<std::result::Result<Vec<_>, _>>()
        .ctx("select rows")?;
    RecordBatch::try_new(batch.schema(), cols).ctx("select rows")
}

fn same_value(a: &ArrayRef, b: &ArrayRef, i: usize) -> Result<bool> {
    let s = |x: &ArrayRef| -> Result<String> {
        let c = arrow::compute::cast(&x.slice(i, 1), &DataType::Utf8).ctx("compare key")?;
        Ok(c.as_any()
            .downcast_ref::<StringArray>()
            .map(|c| c.value(0).to_string())
            .unwrap_or_default())
    };
    Ok(s(a)? == s(b)?)
}

/// Splits a Kafka key into `width` textual parts.
fn split_key(key: &[u8], width: usize) -> std::result::Result<Vec<String>, String> {
    let text = std::str::from_utf8(key).map_err(|_| "record key is not UTF-8".to_string())?;
    let scalar = |v: &serde_json::Value| -> std::result::Result<String, String> {
        match v {
            serde_json::Value::String(s) => Ok(s.clone()),
            serde_json::Value::Number(n) => Ok(n.to_string()),
            serde_json::Value::Bool(b) => Ok(b.to_string()),
            other => Err(format!("key part {other} is not a scalar")),
        }
    };
    if width == 1 {
        if text.starts_with('"') {
            if let Ok(serde_json::Value::String(s)) = serde_json::from_str(text) {
                return Ok(vec![s]);
            }
        }
        return Ok(vec![text.to_string()]);
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Array(items)) if items.len() == width => {
            items.iter().map(scalar).collect()
        }
        _ => Err(format!(
            "composite key must be a JSON array of {width} values, got {text:?}"
        )),
    }
}

/// `id` from the key parts: the canonical string of a single key, the JSON
/// array of canonical strings of a composite one.
pub fn canonical_ids(parts: &[ArrayRef]) -> Result<StringArray> {
    let texts: Vec<ArrayRef> = parts
        .iter()
        .map(|p| arrow::compute::cast(p, &DataType::Utf8).ctx("key to text"))
        .collect::<Result<_>>()?;
    let texts: Vec<&StringArray> = texts
        .iter()
        .map(|t| t.as_any().downcast_ref::<StringArray>().expect("utf8"))
        .collect();
    if texts.len() == 1 {
        return Ok(texts[0].clone());
    }
    let n = texts.first().map(|t| t.len()).unwrap_or(0);
    Ok((0..n)
        .map(|i| {
            let v: Vec<&str> = texts.iter().map(|t| t.value(i)).collect();
            Some(serde_json::to_string(&v).expect("strings serialize"))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::GraphSchema;

    fn decoder(key: KeySource) -> RecordDecoder {
        let s = GraphSchema::parse(
            "node P { name: String @key  age: I32? }\nnode M { t: String  s: U32  @key(t, s) }",
            "t.pg",
        )
        .unwrap();
        let m = Mapping {
            topic: "t".into(),
            node: "P".into(),
            key,
            buckets: None,
        };
        RecordDecoder::new(s.get("P").unwrap(), &m, 100).unwrap()
    }

    fn rec<'a>(offset: i64, key: Option<&'a str>, value: Option<&'a str>) -> SourceRecord<'a> {
        SourceRecord {
            topic: "t",
            partition: 0,
            offset,
            timestamp: Some(1),
            key: key.map(str::as_bytes),
            value: value.map(str::as_bytes),
        }
    }

    #[test]
    fn last_write_per_key_wins_within_a_poll() {
        let mut d = decoder(KeySource::default());
        let out = d
            .decode(&[
                rec(0, None, Some(r#"{"name":"a","age":1}"#)),
                rec(1, None, Some(r#"{"name":"b","age":2}"#)),
                rec(2, None, Some(r#"{"name":"a","age":3}"#)),
                rec(3, Some("b"), None),
            ])
            .unwrap();
        let ups = out.upserts.unwrap();
        assert_eq!(ups.num_rows(), 1);
        assert_eq!(
            ups.column(0)
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .value(0),
            "a"
        );
        assert_eq!(out.deletes.unwrap().num_rows(), 1);
    }

    #[test]
    fn bad_record_is_named() {
        let mut d = decoder(KeySource::default());
        let e = d
            .decode(&[
                rec(7, None, Some(r#"{"name":"a"}"#)),
                rec(8, None, Some(r#"{"name":"b","age":"x"}"#)),
            ])
            .unwrap_err()
            .to_string();
        assert!(e.contains("t/0@8"), "{e}");
        let e = d
            .decode(&[rec(9, None, Some(r#"{"name":"a"}{"name":"b"}"#))])
            .unwrap_err();
        assert!(e.to_string().contains("t/0@9"), "{e}");
        let e = d.decode(&[rec(10, None, Some(r#"{"name":"#))]).unwrap_err();
        assert!(e.to_string().contains("t/0@10"), "{e}");
    }

    #[test]
    fn key_from_kafka_fills_the_property() {
        let mut d = decoder(KeySource::Named(KeyOrigin::Kafka));
        let out = d
            .decode(&[rec(0, Some("zed"), Some(r#"{"age":4}"#))])
            .unwrap();
        let ups = out.upserts.unwrap();
        let name = ups.column_by_name("name").unwrap();
        assert_eq!(
            name.as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .value(0),
            "zed"
        );
        let e = d
            .decode(&[rec(1, Some("zed"), Some(r#"{"name":"other"}"#))])
            .unwrap_err();
        assert!(e.to_string().contains("disagrees"), "{e}");
    }

    #[test]
    fn an_id_property_key_becomes_the_canonical_id() {
        let s = GraphSchema::parse("node U { id: I64 @key  n: String? }", "t.pg").unwrap();
        let m = Mapping {
            topic: "t".into(),
            node: "U".into(),
            key: KeySource::default(),
            buckets: None,
        };
        let mut d = RecordDecoder::new(s.get("U").unwrap(), &m, 10).unwrap();
        let out = d
            .decode(&[rec(0, None, Some(r#"{"id": 42, "n": "x"}"#))])
            .unwrap();
        let rows = out.upserts.unwrap();
        assert_eq!(rows.schema().fields().len(), 1 + 1 + 4);
        let id = rows
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(id.value(0), "42");
    }

    #[test]
    fn composite_ids_are_json_arrays() {
        let parts: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec!["acme"])),
            Arc::new(arrow::array::UInt32Array::from(vec![7])),
        ];
        assert_eq!(canonical_ids(&parts).unwrap().value(0), r#"["acme","7"]"#);
        assert_eq!(split_key(br#"["acme",7]"#, 2).unwrap(), vec!["acme", "7"]);
        assert!(split_key(b"acme", 2).is_err());
    }
}

#[cfg(test)]
mod type_tests {
    use super::*;
    use crate::schema::GraphSchema;

    /// Every `.pg` type decodes from the JSON a producer would naturally send.
    #[test]
    fn every_schema_type_decodes() {
        let s = GraphSchema::parse(
            r#"node T {
                k: I64 @key
                s: String  b: Bool  i: I32  u: U32  ul: U64  f: F32  d: F64
                day: Date  at: DateTime  tags: [String]  v: Vector(3)?  blob: Blob?
                e: enum(red, green)
            }"#,
            "t.pg",
        )
        .unwrap();
        let m = Mapping {
            topic: "t".into(),
            node: "T".into(),
            key: KeySource::default(),
            buckets: None,
        };
        let mut d = RecordDecoder::new(s.get("T").unwrap(), &m, 10).unwrap();
        let v = r#"{"k": 9007199254740993, "s": "x", "b": true, "i": -5, "u": 7, "ul": 18446744073709551615,
                    "f": 1.5, "d": 2.25, "day": "2024-02-29", "at": "2024-02-29T12:34:56Z",
                    "tags": ["a", "b"], "v": [1.0, 2.0, 3.0], "e": "red"}"#;
        let r = SourceRecord {
            topic: "t",
            partition: 0,
            offset: 0,
            timestamp: None,
            key: None,
            value: Some(v.as_bytes()),
        };
        let out = d.decode(&[r]).unwrap();
        let rows = out.upserts.unwrap();
        assert_eq!(rows.num_rows(), 1);
        let id = rows
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!(id.value(0), "9007199254740993");
    }
}
