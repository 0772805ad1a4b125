//! Strict JSON numbers. arrow-json reads a numeric string into a numeric
//! column (`"12"` → 12) and truncates a fraction into an integer column
//! (3.5 → 3), silently. Unless a mapping opts into `coerce = "lenient"`,
//! each value is first scanned for its numeric properties, and such a value
//! is a typed reject instead. The scan reads only the top-level fields that
//! hold numbers and skips the rest unparsed.

use std::cell::RefCell;
use std::fmt;

use arrow_schema::{DataType, Schema};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::rejects::RejectCode;

/// What a numeric property accepts.
#[derive(Debug, Clone, PartialEq)]
enum Want {
    /// An integral JSON number (`3` or `3.0`; never `3.5` or `"3"`).
    Int,
    /// Any JSON number; `f32_range` also refuses one beyond ±f32::MAX.
    Float { f32_range: bool },
    /// A JSON array of such values.
    List(Box<Want>),
}

impl Want {
    fn of(t: &DataType) -> Option<Want> {
        match t {
            DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64 => Some(Want::Int),
            DataType::Float16 | DataType::Float32 => Some(Want::Float { f32_range: true }),
            DataType::Float64 => Some(Want::Float { f32_range: false }),
            DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
                Want::of(f.data_type()).map(|w| Want::List(Box::new(w)))
            }
            _ => None,
        }
    }
}

/// The numeric top-level fields of a value schema.
#[derive(Debug, Clone)]
pub(super) struct NumberFields {
    fields: Vec<(String, Want)>,
}

/// Why a value's number does not fit its property.
pub(super) type Misfit = (RejectCode, String);

impl NumberFields {
    /// `None` when the schema has no numeric field (nothing to scan).
    pub(super) fn of(schema: &Schema) -> Option<NumberFields> {
        let fields: Vec<(String, Want)> = schema
            .fields()
            .iter()
            .filter_map(|f| Want::of(f.data_type()).map(|w| (f.name().clone(), w)))
            .collect();
        (!fields.is_empty()).then_some(NumberFields { fields })
    }

    /// The first numeric field of `raw` whose value does not fit. A value
    /// that is not a JSON object, or not JSON, passes: the decoder refuses
    /// it with the right code.
    pub(super) fn check(&self, raw: &[u8]) -> Option<Misfit> {
        let found = RefCell::new(None);
        let mut de = serde_json::Deserializer::from_slice(raw);
        // The whole value is read, so a truncated or malformed one keeps
        // its own code (`malformed_json`) rather than a misfit's.
        let read = de.deserialize_map(ObjectVisitor {
            fields: self,
            found: &found,
        });
        match read.and_then(|()| de.end()) {
            Ok(()) => found.into_inner(),
            Err(_) => None,
        }
    }

    fn want(&self, key: &str) -> Option<&Want> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, w)| w)
    }
}

struct ObjectVisitor<'a> {
    fields: &'a NumberFields,
    found: &'a RefCell<Option<Misfit>>,
}

impl<'de> Visitor<'de> for ObjectVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // Keys with escapes arrive owned, the rest borrowed.
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match self.fields.want(&key) {
                Some(want) => map.next_value_seed(Value {
                    field: &key,
                    want,
                    found: self.found,
                })?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// One property's value, checked against `want`.
struct Value<'a> {
    field: &'a str,
    want: &'a Want,
    found: &'a RefCell<Option<Misfit>>,
}

impl Value<'_> {
    /// Keeps the first misfit; the scan reads on to the end of the value.
    fn misfit<E>(&self, code: RejectCode, why: String) -> Result<(), E> {
        self.found
            .borrow_mut()
            .get_or_insert_with(|| (code, format!("{}: {why}", self.field)));
        Ok(())
    }

    fn number<E: de::Error>(&self, text: &dyn fmt::Display, f: f64) -> Result<(), E> {
        match self.want {
            Want::Int if f.fract() != 0.0 => self.misfit(
                RejectCode::WrongType,
                format!("{text} is not an integer (set coerce = \"lenient\" to truncate)"),
            ),
            Want::Float { f32_range: true } if f.is_finite() && f.abs() > f32::MAX as f64 => {
                self.misfit(RejectCode::Overflow, format!("{text} does not fit F32"))
            }
            Want::List(_) => self.misfit(
                RejectCode::WrongType,
                format!("expected a list, got {text}"),
            ),
            _ => Ok(()),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Value<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Value<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.number(&v, v as f64)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.number(&v, v as f64)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.number(&v, v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        let shown: String = v.chars().take(40).collect();
        match self.want {
            Want::List(_) => self.misfit(
                RejectCode::WrongType,
                format!("expected a list, got a string {shown:?}"),
            ),
            _ => self.misfit(
                RejectCode::WrongType,
                format!(
                    "expected a number, got the string {shown:?} (set coerce = \"lenient\" to parse numeric strings)"
                ),
            ),
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Want::List(item) = self.want else {
            // Not a number: the decoder says wrong_type with its own text.
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(());
        };
        while seq
            .next_element_seed(Value {
                field: self.field,
                want: item,
                found: self.found,
            })?
            .is_some()
        {}
        Ok(())
    }

    // Anything else (null, booleans, objects) is the decoder's to judge.
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::Field;
    use std::sync::Arc;

    fn fields() -> NumberFields {
        let list = |t: DataType| DataType::List(Arc::new(Field::new("item", t, true)));
        NumberFields::of(&Schema::new(vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("qty", DataType::Int32, true),
            Field::new("big", DataType::UInt64, true),
            Field::new("price", DataType::Float64, true),
            Field::new("ratio", DataType::Float32, true),
            Field::new("sizes", list(DataType::Int64), true),
        ]))
        .expect("numeric fields")
    }

    fn check(v: &str) -> Option<RejectCode> {
        fields().check(v.as_bytes()).map(|(c, _)| c)
    }

    #[test]
    fn fitting_numbers_pass() {
        for v in [
            r#"{"name":"a","qty":3,"big":18446744073709551615,"price":1.5,"ratio":-2,"sizes":[1,2]}"#,
            r#"{"qty":3.0,"price":1e300,"ratio":3.4e38}"#,
            r#"{"qty":null,"sizes":null,"name":"3.5"}"#,
            r#"{"other":"x","nested":{"qty":"12"}}"#,
            r#"{"q\u0074y":4}"#,
        ] {
            assert_eq!(check(v), None, "{v}");
        }
    }

    #[test]
    fn fractions_and_strings_are_wrong_type() {
        for v in [
            r#"{"qty":3.5}"#,
            r#"{"qty":"12"}"#,
            r#"{"qty":1e-3}"#,
            r#"{"price":"NaN"}"#,
            r#"{"price":"inf"}"#,
            r#"{"price":"1.5"}"#,
            r#"{"sizes":[1,2.5]}"#,
            r#"{"sizes":["1"]}"#,
            r#"{"sizes":7}"#,
            r#"{"q\u0074y":"4"}"#,
        ] {
            assert_eq!(check(v), Some(RejectCode::WrongType), "{v}");
        }
    }

    #[test]
    fn an_f32_beyond_its_range_overflows() {
        assert_eq!(check(r#"{"ratio":3.5e38}"#), Some(RejectCode::Overflow));
        assert_eq!(check(r#"{"ratio":-1e39}"#), Some(RejectCode::Overflow));
    }

    #[test]
    fn the_message_names_the_field() {
        let (_, m) = fields().check(br#"{"name":"a","qty":3.5}"#).unwrap();
        assert!(m.starts_with("qty: 3.5 is not an integer"), "{m}");
    }

    #[test]
    fn not_json_is_left_to_the_decoder() {
        for v in [
            "",
            "null",
            "[1]",
            "{\"qty\":",
            "{\"qty\":3.5",
            "{\"qty\":3.5}}",
            "\u{feff}{\"qty\":3.5}",
        ] {
            assert_eq!(check(v), None, "{v}");
        }
    }

    #[test]
    fn a_schema_without_numbers_needs_no_scan() {
        let s = Schema::new(vec![Field::new("name", DataType::Utf8, false)]);
        assert!(NumberFields::of(&s).is_none());
    }
}
