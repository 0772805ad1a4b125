//! The JSON corpus: good `Thing`, `Pair` and `Rel` records in plain JSON,
//! mutated across every `.pg` type and constraint of [`SCHEMA`](super::SCHEMA):
//! wrong types and overflows, constraints, shapes, bytes, truncations,
//! sizes, keys and edges, and the few accepted on purpose.

use super::{Expect, Feed, Hostile, MAX_RECORD_BYTES, MIN_RECORD_BYTES};

const WRONG: &[&str] = &["wrong_type"];
const OVER: &[&str] = &["overflow"];
const WRONG_OR_OVER: &[&str] = &["wrong_type", "overflow"];
const MALFORMED: &[&str] = &["malformed_json", "not_an_object"];

/// The good Thing record's fields, in order, as raw JSON text.
fn good_fields(id: &str) -> Vec<(String, String)> {
    [
        ("id", format!("\"{id}\"")),
        ("req", "\"r\"".into()),
        ("s", "\"abc\"".into()),
        ("b", "true".into()),
        ("i", "5".into()),
        ("u", "7".into()),
        ("l", "-9".into()),
        ("ul", "11".into()),
        ("f", "1.5".into()),
        ("d", "0.5".into()),
        ("day", "\"2024-02-29\"".into()),
        ("at", "\"2024-02-29T12:34:56Z\"".into()),
        ("tags", "[\"a\",\"b\"]".into()),
        ("nums", "[1,2]".into()),
        ("v", "[1.0,2.0,3.0]".into()),
        ("e", "\"red\"".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn object(fields: &[(String, String)]) -> Vec<u8> {
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    format!("{{{}}}", body.join(",")).into_bytes()
}

/// Builds the corpus.
struct Corpus {
    out: Vec<Hostile>,
}

impl Corpus {
    fn id(&self) -> String {
        format!("h{}", self.out.len())
    }

    fn push(
        &mut self,
        name: String,
        feed: Feed,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        expect: Expect,
    ) {
        self.out.push(Hostile {
            name,
            feed,
            key,
            value,
            headers: vec![("trace".into(), format!("t{}", self.out.len()).into_bytes())],
            expect,
        });
    }

    /// A Thing whose `field` holds `raw` (or is left out when `raw` is None).
    fn thing(&mut self, field: &str, raw: Option<&str>, expect: Expect) {
        let id = self.id();
        let mut fields = good_fields(&id);
        match raw {
            Some(raw) => match fields.iter_mut().find(|(k, _)| k == field) {
                Some(slot) => slot.1 = raw.to_string(),
                None => fields.push((field.to_string(), raw.to_string())),
            },
            None => fields.retain(|(k, _)| k != field),
        }
        let name = format!("Thing.{field} = {}", raw.map_or("<absent>".into(), short));
        self.push(name, Feed::Things, None, Some(object(&fields)), expect);
    }

    fn raw_thing(&mut self, name: &str, value: Vec<u8>, expect: Expect) {
        self.push(name.to_string(), Feed::Things, None, Some(value), expect);
    }

    fn pair(&mut self, name: &str, key: Option<&[u8]>, value: &str, expect: Expect) {
        self.push(
            format!("Pair {name}"),
            Feed::Pairs,
            key.map(<[u8]>::to_vec),
            Some(value.as_bytes().to_vec()),
            expect,
        );
    }

    fn rel(&mut self, name: &str, value: &str, expect: Expect) {
        self.push(
            format!("Rel {name}"),
            Feed::Rels,
            None,
            Some(value.as_bytes().to_vec()),
            expect,
        );
    }
}

fn short(raw: &str) -> String {
    if raw.len() > 40 {
        format!(
            "{}… ({} bytes)",
            &raw[..raw.char_indices().nth(30).map_or(raw.len(), |(i, _)| i)],
            raw.len()
        )
    } else {
        raw.to_string()
    }
}

/// The corpus for graphsink's default `errors.max_record_bytes`.
pub fn corpus() -> Vec<Hostile> {
    corpus_for(MAX_RECORD_BYTES)
}

/// The corpus for `errors.max_record_bytes = max` (at least
/// [`MIN_RECORD_BYTES`]): at least 300 distinct bad records, plus the few
/// accepted on purpose. A smaller `max` keeps the oversized records within
/// what a broker takes by default (1 MB).
pub fn corpus_for(max: usize) -> Vec<Hostile> {
    assert!(
        max >= MIN_RECORD_BYTES,
        "the deep values need {MIN_RECORD_BYTES} bytes"
    );
    let mut c = Corpus { out: Vec::new() };
    scalar_mutations(&mut c);
    constraint_mutations(&mut c);
    shape_mutations(&mut c);
    byte_mutations(&mut c);
    truncations(&mut c);
    size_mutations(&mut c, max);
    pair_mutations(&mut c);
    rel_mutations(&mut c);
    accepted_on_purpose(&mut c);
    c.out
}

/// Wrong JSON types, boundary and overflow numbers, coercions strict
/// mode refuses, NaN and infinities where a type forbids them.
fn scalar_mutations(c: &mut Corpus) {
    let rej = Expect::Reject;
    for f in ["req", "s", "day", "at", "e"] {
        for raw in ["1", "1.5", "true", "[]", "{}", "[\"a\"]"] {
            c.thing(f, Some(raw), rej(WRONG));
        }
    }
    c.thing("b", Some("\"true\""), rej(WRONG));
    for raw in ["1", "0", "\"yes\"", "[]", "{}", "1.0"] {
        c.thing("b", Some(raw), rej(WRONG));
    }
    for f in ["i", "u", "l", "ul"] {
        for raw in [
            "\"12\"", "\"x\"", "3.5", "0.5", "1e-3", "true", "[]", "{}", "[1]", "\"\"",
        ] {
            c.thing(f, Some(raw), rej(WRONG));
        }
        c.thing(f, Some("1e30"), rej(OVER));
        c.thing(f, Some("-1e30"), rej(OVER));
        c.thing(f, Some("1e400"), rej(OVER));
    }
    for raw in ["2147483648", "-2147483649", "9223372036854775807"] {
        c.thing("i", Some(raw), rej(OVER));
    }
    for raw in ["-1", "4294967296", "-4294967296"] {
        c.thing("u", Some(raw), rej(OVER));
    }
    for raw in [
        "9223372036854775808",
        "-9223372036854775809",
        "18446744073709551616",
    ] {
        c.thing("l", Some(raw), rej(OVER));
    }
    for raw in ["-1", "18446744073709551616", "-9223372036854775808"] {
        c.thing("ul", Some(raw), rej(OVER));
    }
    for f in ["f", "d"] {
        for raw in [
            "\"1.5\"",
            "\"NaN\"",
            "\"nan\"",
            "\"Infinity\"",
            "\"-inf\"",
            "\"inf\"",
            "true",
            "[]",
            "{}",
            "\"\"",
        ] {
            c.thing(f, Some(raw), rej(WRONG));
        }
        c.thing(f, Some("1e400"), rej(OVER));
        c.thing(f, Some("-1e400"), rej(OVER));
    }
    c.thing("f", Some("3.5e38"), rej(OVER));
    c.thing("f", Some("-1e39"), rej(OVER));
    // Lists and the vector.
    for raw in ["\"a\"", "1", "{}", "[1]", "[true]", "[[\"a\"]]", "[{}]"] {
        c.thing("tags", Some(raw), rej(WRONG));
    }
    for raw in ["[1.5]", "[\"1\"]", "1", "\"[1]\"", "[[1]]", "[true]"] {
        c.thing("nums", Some(raw), rej(WRONG));
    }
    c.thing("nums", Some("[2147483648]"), rej(OVER));
    c.thing("nums", Some("[1,-2147483649]"), rej(OVER));
    for raw in [
        "[1,2]",
        "[1,2,3,4]",
        "[]",
        "[\"a\",1,2]",
        "1",
        "[1,2,\"NaN\"]",
        "[[1],2,3]",
        "{}",
    ] {
        c.thing("v", Some(raw), rej(WRONG));
    }
    c.thing("v", Some("[1,2,1e39]"), rej(WRONG_OR_OVER));
}

/// enum, @range (both bounds inclusive, NaN refused), @check, required
/// properties and the key.
fn constraint_mutations(c: &mut Corpus) {
    let rej = Expect::Reject;
    for raw in ["\"blue\"", "\"RED\"", "\"\"", "\" red\"", "\"red \""] {
        c.thing("e", Some(raw), rej(&["enum"]));
    }
    for raw in ["-1", "101", "100000"] {
        c.thing("i", Some(raw), rej(&["range"]));
    }
    for raw in ["-1.6", "1.5000001", "1e300", "-1e300"] {
        c.thing("d", Some(raw), rej(&["range"]));
    }
    for raw in [
        "\"ABC\"",
        "\"ab1\"",
        "\"\"",
        "\"a b\"",
        "\"é\"",
        "\"abc\\n\"",
    ] {
        c.thing("s", Some(raw), rej(&["check"]));
    }
    c.thing("req", None, rej(&["missing_required"]));
    c.thing("req", Some("null"), rej(&["missing_required"]));
    c.thing("zzz", Some("1"), rej(&["unknown_field"]));
    c.thing("ID", Some("\"x\""), rej(&["unknown_field"]));
    c.thing("id", Some("5"), rej(WRONG));
    c.thing("id", Some("[\"a\"]"), rej(WRONG));
    c.thing("id", Some("{}"), rej(WRONG));
    c.thing("id", Some("true"), rej(WRONG));
    for raw in [None, Some("null")] {
        let mut fields = good_fields("x");
        match raw {
            None => fields.retain(|(k, _)| k != "id"),
            Some(r) => fields[0].1 = r.to_string(),
        }
        c.raw_thing(
            &format!("Thing.id = {raw:?}"),
            object(&fields),
            rej(&["missing_key"]),
        );
    }
}

/// Not exactly one JSON object.
fn shape_mutations(c: &mut Corpus) {
    let m = Expect::Reject(MALFORMED);
    let good = |c: &Corpus| object(&good_fields(&c.id()));
    for raw in [
        "null",
        "[]",
        "[{}]",
        "1",
        "\"s\"",
        "true",
        "",
        " ",
        "\n",
        "{",
        "}",
        "{}{}",
        "{} {}",
        "{\"id\":\"a\",\"req\":\"r\"} x",
        "{\"id\":\"a\",}",
        "{\"id\" \"a\"}",
        "{'id':'a'}",
        "{id:\"a\"}",
        "{\"id\":\"a\",\"req\":\"r\"\"s\":\"x\"}",
        "{\"id\":\"a\",\"req\":\"r\",\"s\":\"tab\there\"}",
        "{\"id\":\"a\",\"req\":\"r\",\"s\":\"nl\nhere\"}",
        "{\"id\":\"a\",\"req\":\"r\",\"i\":01}",
        "{\"id\":\"a\",\"req\":\"r\",\"i\":+1}",
        "{\"id\":\"a\",\"req\":\"r\",\"i\":.5}",
        "{\"id\":\"a\",\"req\":\"r\",\"d\":NaN}",
        "{\"id\":\"a\",\"req\":\"r\",\"d\":Infinity}",
        "{\"id\":\"a\",\"req\":\"r\",\"d\":-Infinity}",
        "{\"id\":\"a\",\"req\":\"r\",\"b\":True}",
        "{\"id\":\"a\",\"req\":\"r\",\"s\":undefined}",
        "{\"id\":\"a\"/*c*/,\"req\":\"r\"}",
        "{\"id\":\"a\",\"req\":\"r\",\"s\":\"\\x41\"}",
        "{\"id\":\"a\",\"req\":\"r\",\"s\":\"\\u12\"}",
    ] {
        c.raw_thing(
            &format!("value {}", short(raw)),
            raw.as_bytes().to_vec(),
            m.clone(),
        );
    }
    // A byte-order mark, and NUL bytes around a good object.
    let mut bom = b"\xef\xbb\xbf".to_vec();
    bom.extend(good(c));
    c.raw_thing("BOM + good object", bom, m.clone());
    let mut nul = good(c);
    nul.push(0);
    c.raw_thing("good object + NUL", nul, m.clone());
    let mut lead = vec![0u8];
    lead.extend(good(c));
    c.raw_thing("NUL + good object", lead, m.clone());
    // Deep nesting (10^5 levels) in a typed field, an unknown one, the top.
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    c.thing(
        "tags",
        Some(&deep(100_000)),
        Expect::Reject(&["wrong_type", "malformed_json"]),
    );
    c.thing(
        "s",
        Some(&deep(100_000)),
        Expect::Reject(&["wrong_type", "malformed_json"]),
    );
    c.thing(
        "deep",
        Some(&deep(100_000)),
        Expect::Reject(&["unknown_field", "malformed_json"]),
    );
    let objs = format!("{}{}", "{\"a\":".repeat(50_000), "}".repeat(50_000));
    c.thing(
        "s",
        Some(&objs),
        Expect::Reject(&["wrong_type", "malformed_json"]),
    );
    c.raw_thing("top-level nesting 10^5", deep(100_000).into_bytes(), m);
}

/// Invalid UTF-8 in values and keys, and overlong or surrogate encodings.
fn byte_mutations(c: &mut Corpus) {
    let utf8 = Expect::Reject(&["not_utf8"]);
    let bad_bytes: [&[u8]; 8] = [
        b"\xff",
        b"\xc3",
        b"\xc0\xaf",
        b"\xed\xa0\x80",
        b"\x80",
        b"\xf5\x80\x80\x80",
        b"\xe2\x82",
        b"\xf0\x9f\x98",
    ];
    for (n, bytes) in bad_bytes.iter().enumerate() {
        // In a string value, in a key, and as a whole value.
        let id = c.id();
        let mut v = format!("{{\"id\":\"{id}\",\"req\":\"r\",\"s\":\"ab").into_bytes();
        v.extend_from_slice(bytes);
        v.extend_from_slice(b"\"}");
        c.raw_thing(&format!("invalid UTF-8 #{n} in a string"), v, utf8.clone());
        let id = c.id();
        let mut v = format!("{{\"id\":\"{id}\",\"req\":\"r\",\"").into_bytes();
        v.extend_from_slice(bytes);
        v.extend_from_slice(b"\":1}");
        c.raw_thing(
            &format!("invalid UTF-8 #{n} in a field name"),
            v,
            utf8.clone(),
        );
        c.raw_thing(
            &format!("invalid UTF-8 #{n} alone"),
            bytes.to_vec(),
            Expect::Reject(&["not_utf8", "malformed_json"]),
        );
    }
    // A lone surrogate written as an escape is not a Unicode scalar.
    let id = c.id();
    c.raw_thing(
        "escaped lone surrogate",
        format!("{{\"id\":\"{id}\",\"req\":\"\\ud800\"}}").into_bytes(),
        Expect::Reject(&["malformed_json", "not_utf8", "wrong_type"]),
    );
}

/// The good record cut short at 40 places.
fn truncations(c: &mut Corpus) {
    let id = c.id();
    let good = object(&good_fields(&format!("{id}-cut")));
    let step = (good.len() / 40).max(1);
    for cut in (1..good.len()).step_by(step).take(40) {
        c.raw_thing(
            &format!("truncated at {cut}"),
            good[..cut].to_vec(),
            Expect::Reject(MALFORMED),
        );
    }
}

/// Huge values, strings and keys.
fn size_mutations(c: &mut Corpus, max: usize) {
    let over = Expect::Reject(&["oversized"]);
    let id = c.id();
    let huge = format!(
        "{{\"id\":\"{id}\",\"req\":\"r\",\"s\":\"{}\"}}",
        "a".repeat(max)
    );
    c.raw_thing(
        "value over max_record_bytes",
        huge.into_bytes(),
        over.clone(),
    );
    let id = c.id();
    let huge_id = format!("{{\"id\":\"{id}{}\",\"req\":\"r\"}}", "k".repeat(max));
    c.raw_thing(
        "key property over max_record_bytes",
        huge_id.into_bytes(),
        over.clone(),
    );
    c.raw_thing(
        "whitespace over max_record_bytes",
        vec![b' '; max + 1],
        over.clone(),
    );
    // Within the limit, but failing the check.
    let id = c.id();
    let big = format!(
        "{{\"id\":\"{id}\",\"req\":\"r\",\"s\":\"{}\"}}",
        "A".repeat(max / 2)
    );
    c.raw_thing(
        "a big string failing @check",
        big.into_bytes(),
        Expect::Reject(&["check"]),
    );
    // A Kafka key over the limit (the key counts toward the record's size).
    let key = format!("[\"{}\",1]", "t".repeat(max));
    c.pair(
        "a key over max_record_bytes",
        Some(key.as_bytes()),
        "{\"label\":\"x\"}",
        over,
    );
}

/// Composite keys from the Kafka key: wrong arity and types, mismatches.
fn pair_mutations(c: &mut Corpus) {
    let key = Expect::Reject(&["missing_key", "wrong_type", "overflow"]);
    for k in [
        "[\"acme\"]",
        "[\"acme\",1,2]",
        "[]",
        "\"acme\"",
        "acme",
        "[\"acme\",\"x\"]",
        "[\"acme\",-1]",
        "[\"acme\",4294967296]",
        "[\"acme\",1.5]",
        "{\"t\":\"a\",\"n\":1}",
        "[\"acme\",1",
        "[null,1]",
        "[\"acme\",null]",
        "[[\"a\"],1]",
        "",
    ] {
        c.pair(
            &format!("key {k:?}"),
            Some(k.as_bytes()),
            "{\"label\":\"x\"}",
            key.clone(),
        );
    }
    c.pair("no key", None, "{\"label\":\"x\"}", key.clone());
    c.pair(
        "key not UTF-8",
        Some(b"[\"ac\xffme\",1]"),
        "{\"label\":\"x\"}",
        Expect::Reject(&["missing_key", "not_utf8"]),
    );
    c.pair(
        "value disagrees with the key",
        Some(b"[\"acme\",1]"),
        "{\"t\":\"other\",\"n\":1}",
        Expect::Reject(&["key_mismatch"]),
    );
    c.pair(
        "label wrong type",
        Some(b"[\"acme\",2]"),
        "{\"label\":5}",
        Expect::Reject(WRONG),
    );
    c.pair(
        "unknown field",
        Some(b"[\"acme\",3]"),
        "{\"zz\":5}",
        Expect::Reject(&["unknown_field"]),
    );
    c.push(
        "Pair tombstone without a key".into(),
        Feed::Pairs,
        None,
        None,
        Expect::Reject(&["bad_tombstone"]),
    );
    c.push(
        "Pair tombstone with a one-part key".into(),
        Feed::Pairs,
        Some(b"[\"acme\"]".to_vec()),
        None,
        Expect::Reject(&["bad_tombstone", "missing_key"]),
    );
    c.push(
        "Thing tombstone without a key".into(),
        Feed::Things,
        None,
        None,
        Expect::Reject(&["bad_tombstone"]),
    );
}

/// Edges: endpoints missing, null, of the wrong type; property types.
fn rel_mutations(c: &mut Corpus) {
    let end = Expect::Reject(&["missing_endpoint", "wrong_type"]);
    for v in [
        "{\"dst\":\"b\"}",
        "{\"src\":\"a\"}",
        "{\"src\":null,\"dst\":\"b\"}",
        "{\"src\":\"a\",\"dst\":null}",
        "{\"src\":1,\"dst\":\"b\"}",
        "{\"src\":\"a\",\"dst\":[\"b\"]}",
        "{\"src\":{},\"dst\":\"b\"}",
    ] {
        c.rel(&format!("endpoints {v}"), v, end.clone());
    }
    for raw in ["1.5", "\"7\"", "true", "2147483648"] {
        c.rel(
            &format!("w = {raw}"),
            &format!("{{\"src\":\"a\",\"dst\":\"b\",\"w\":{raw}}}"),
            Expect::Reject(WRONG_OR_OVER),
        );
    }
    c.rel(
        "unknown field",
        "{\"src\":\"a\",\"dst\":\"b\",\"x\":1}",
        Expect::Reject(&["unknown_field"]),
    );
    c.push(
        "Rel tombstone with an empty key".into(),
        Feed::Rels,
        Some(Vec::new()),
        None,
        Expect::Reject(&["bad_tombstone"]),
    );
}

/// What graphsink accepts on purpose (docs/rejects.md).
fn accepted_on_purpose(c: &mut Corpus) {
    // Duplicate JSON keys: the last one wins.
    let id = c.id();
    c.raw_thing(
        "duplicate JSON keys",
        format!("{{\"id\":\"{id}\",\"req\":\"r\",\"i\":1,\"i\":2}}").into_bytes(),
        Expect::Accept,
    );
    // An integral number written as a float is an integer.
    c.thing("i", Some("3.0"), Expect::Accept);
    c.thing("l", Some("1e3"), Expect::Accept);
    // Headers are never read: invalid UTF-8 in one is carried, not judged.
    let id = c.id();
    c.raw_thing("a good record", object(&good_fields(&id)), Expect::Accept);
    if let Some(h) = c.out.last_mut() {
        h.name = "invalid UTF-8 in a header of a good record".into();
        h.headers.push(("bin".into(), b"\xff\xfe".to_vec()));
    }
    // An empty string is a key like any other (the fold checks the endpoint).
    c.rel("empty src", "{\"src\":\"\",\"dst\":\"b\"}", Expect::Accept);
    // Optional properties absent or null; whitespace around the object.
    c.thing("s", None, Expect::Accept);
    c.thing("nums", Some("null"), Expect::Accept);
    let id = c.id();
    let mut padded = b" \n\t".to_vec();
    padded.extend(object(&good_fields(&id)));
    padded.extend(b" \n");
    c.raw_thing("whitespace around the object", padded, Expect::Accept);
    // A bad record whose header is not UTF-8: one reject that carries it.
    c.thing("i", Some("3.5"), Expect::Reject(WRONG));
    if let Some(h) = c.out.last_mut() {
        h.headers.push(("bin".into(), b"\xff\xfe".to_vec()));
    }
}
