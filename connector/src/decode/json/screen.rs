//! The value screen, run on each value before arrow-json decodes its poll.
//! arrow-json is fast but forgiving: it takes some malformed JSON (a
//! missing comma, a raw tab in a string, a leading zero), reads a numeric
//! string into a numeric column (`"12"` → 12), truncates a fraction into an
//! integer column (3.5 → 3), and reads a number beyond F64 as infinity, all
//! silently. The screen parses each value with serde_json (the reference
//! parser; fields it does not check are skipped, not built) and refuses
//! those with a typed code. The number rules hold unless a mapping opts
//! into `coerce = "lenient"`.

use std::cell::RefCell;
use std::fmt;

use arrow_schema::Schema;
use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::rejects::RejectCode;

use super::fit::{judge, Fit, Misfit, Seen, Want};

/// The numeric (and temporal) top-level fields of a value schema, checked
/// only under strict coercion.
#[derive(Debug, Clone)]
pub(super) struct ValueScreen {
    fields: Vec<(String, Want)>,
}

impl ValueScreen {
    /// With `strict_numbers`, the number rules apply to `schema`'s fields;
    /// without, only the JSON itself is checked.
    pub(super) fn new(schema: &Schema, strict_numbers: bool) -> ValueScreen {
        let fields = schema
            .fields()
            .iter()
            .filter(|_| strict_numbers)
            .map(|f| (f.name().clone(), Want::of(f.data_type())))
            .filter(|(_, w)| w.screened())
            .collect();
        ValueScreen { fields }
    }

    /// Why `raw` cannot be decoded as it stands, if it cannot: not UTF-8,
    /// not JSON, not an object, or (strict) the first field whose number
    /// does not fit.
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
            Err(e) => Some(refusal(raw, &e)),
        }
    }

    fn want(&self, key: &str) -> Option<&Want> {
        self.fields.iter().find(|(k, _)| k == key).map(|(_, w)| w)
    }
}

struct ObjectVisitor<'a> {
    fields: &'a ValueScreen,
    found: &'a RefCell<Option<Misfit>>,
}

impl<'de> Visitor<'de> for ObjectVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            match self.fields.want(&key) {
                Some(want) => map.next_value_seed(Value {
                    field: &key,
                    want,
                    found: self.found,
                })?,
                None => {
                    map.next_value::<Skip>()?;
                }
            }
        }
        Ok(())
    }
}

/// An object's key, borrowed from the value unless it has escapes. serde's
/// plain `Cow<str>` always allocates (it deserializes the owned `String`),
/// which was a `String` per key per record on the run loop.
#[derive(serde::Deserialize)]
#[serde(transparent)]
struct Key<'a>(#[serde(borrow)] std::borrow::Cow<'a, str>);

/// Any JSON value, read and dropped. Unlike serde's `IgnoredAny` (which
/// serde_json skips without a depth limit), it goes through
/// `deserialize_any`, so serde_json's recursion limit (128 levels) holds:
/// arrow-json formats a deeply nested misfit recursively in its error
/// message and would overflow the stack at 10^5 levels.
struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Skip, D::Error> {
        d.deserialize_any(SkipVisitor)
    }
}

struct SkipVisitor;

impl<'de> Visitor<'de> for SkipVisitor {
    type Value = Skip;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_str<E>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_unit<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Skip)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(Skip)
    }
}

/// The code for a value serde_json refused.
fn refusal(raw: &[u8], e: &serde_json::Error) -> Misfit {
    if let Err(u) = std::str::from_utf8(raw) {
        return (RejectCode::NotUtf8, format!("value is not UTF-8: {u}"));
    }
    let text = e.to_string();
    if text.starts_with("number out of range") {
        // arrow-json would read it as an infinity.
        return (
            RejectCode::Overflow,
            format!("a number is beyond the range of F64 ({text})"),
        );
    }
    if e.is_data() {
        // Valid JSON of another kind (`null`, `[]`, `1`, `"s"`).
        return (RejectCode::NotAnObject, "value is not a JSON object".into());
    }
    (
        RejectCode::MalformedJson,
        format!("value is not JSON: {text}"),
    )
}

/// One property's value, checked against `want`.
struct Value<'a> {
    field: &'a str,
    want: &'a Want,
    found: &'a RefCell<Option<Misfit>>,
}

impl Value<'_> {
    /// Keeps the first misfit the screen refuses; the scan reads on to
    /// the end of the value.
    fn report<E>(&self, fit: Fit) -> Result<(), E> {
        match fit {
            Fit::Coerced(m) => self.keep(m),
            // A scalar for a list is refused here too; what else arrow-json
            // refuses (an integer out of range, say) is left to it, and
            // `classify` names it.
            Fit::Refused(m) if matches!(self.want, Want::List(_)) => self.keep(m),
            Fit::Refused(_) | Fit::Fits => Ok(()),
        }
    }

    fn keep<E>(&self, (code, why): Misfit) -> Result<(), E> {
        self.found
            .borrow_mut()
            .get_or_insert_with(|| (code, format!("{}: {why}", self.field)));
        Ok(())
    }

    fn number<E: de::Error>(
        &self,
        shown: &dyn fmt::Display,
        f: f64,
        exact: Option<i128>,
    ) -> Result<(), E> {
        self.report(judge(self.want, Seen::Number { shown, f, exact }, true))
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
        self.number(&v, v as f64, Some(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.number(&v, v as f64, Some(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.number(&v, v, None)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.report(judge(self.want, Seen::Str(v), true))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Want::List(item) = self.want else {
            // Not a list: arrow-json refuses it, and `classify` names it.
            while seq.next_element::<Skip>()?.is_some() {}
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

    // Anything else (null, booleans, objects) is arrow-json's to refuse,
    // and `classify`'s to name.
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::{DataType, Field};
    use std::sync::Arc;

    fn schema() -> Schema {
        let list = |t: DataType| DataType::List(Arc::new(Field::new("item", t, true)));
        Schema::new(vec![
            Field::new("name", DataType::Utf8, false),
            Field::new("qty", DataType::Int32, true),
            Field::new("big", DataType::UInt64, true),
            Field::new("price", DataType::Float64, true),
            Field::new("ratio", DataType::Float32, true),
            Field::new("sizes", list(DataType::Int64), true),
            Field::new("day", DataType::Date32, true),
        ])
    }

    fn fields() -> ValueScreen {
        ValueScreen::new(&schema(), true)
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
            r#"{"day":19000}"#,
        ] {
            assert_eq!(check(v), Some(RejectCode::WrongType), "{v}");
        }
    }

    #[test]
    fn numbers_beyond_f64_overflow() {
        assert_eq!(check(r#"{"price":1e400}"#), Some(RejectCode::Overflow));
        assert_eq!(check(r#"{"qty":-1e400}"#), Some(RejectCode::Overflow));
        // Integral, but beyond 2^53 written as a float: not exact.
        assert_eq!(
            check(r#"{"big":-9223372036854775809}"#),
            Some(RejectCode::Overflow)
        );
        assert_eq!(check(r#"{"qty":1e16}"#), Some(RejectCode::Overflow));
        assert_eq!(
            check(r#"{"qty":1e15}"#),
            None,
            "exact: the decoder says overflow for I32"
        );
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
    fn what_serde_json_refuses_is_refused_with_its_code() {
        let code = |v: &[u8]| fields().check(v).map(|(c, _)| c);
        for v in [
            "",
            "{\"qty\":",
            "{\"qty\":3.5",
            "{\"qty\":3.5}}",
            "\u{feff}{}",
            "{\"a\":1 \"b\":2}",
            "{\"s\":\"a\tb\"}",
            "{\"qty\":01}",
        ] {
            assert_eq!(code(v.as_bytes()), Some(RejectCode::MalformedJson), "{v:?}");
        }
        for v in ["null", "[1]", "1", "\"s\""] {
            assert_eq!(code(v.as_bytes()), Some(RejectCode::NotAnObject), "{v}");
        }
        assert_eq!(code(b"{\"s\":\"\xff\"}"), Some(RejectCode::NotUtf8));
        let deep = format!("{{\"s\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(
            code(deep.as_bytes()),
            Some(RejectCode::MalformedJson),
            "recursion limit"
        );
    }

    #[test]
    fn lenient_checks_only_the_json() {
        let lenient = ValueScreen::new(&schema(), false);
        assert_eq!(
            lenient.check(br#"{"qty":"12","price":"NaN","day":19000}"#),
            None
        );
        assert!(lenient.check(br#"{"qty":01}"#).is_some());
    }
}
