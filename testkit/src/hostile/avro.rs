//! The Avro corpus: good `Thing` records in the Confluent wire format,
//! mutated byte by byte. Encoded by hand, not with an Avro library: a
//! library writes only valid values, while each case here must hold exactly
//! the (invalid) bytes it names, and Avro's binary encoding is small (zigzag
//! varints, length-prefixed strings, a branch index per union, arrays in
//! counted blocks ending with 0).

use super::{
    framed, zigzag, Expect, FormatCorpus, Records, Registered, SchemaKind, VARINT_11, VARINT_4G,
    VARINT_OVER_64, VARINT_U64_MAX,
};

/// The writer every good record is framed with.
pub(super) const GOOD_ID: u32 = 1;
const LACKS_REQ: u32 = 3;
const REQ_BOOL: u32 = 4;
const A_PROTO: u32 = 5;
const NOT_JSON: u32 = 6;
/// GOOD plus a recursive record field the type does not declare.
const DEEP: u32 = 7;
/// GOOD with `req` nullable.
const REQ_NULLABLE: u32 = 8;
/// GOOD plus arrays nested [`NEST`] deep, a field the type does not declare.
const NESTED: u32 = 9;
/// GOOD plus an array of items that take no bytes (`null`).
const NULLS: u32 = 10;
/// GOOD plus an array of empty records.
const EMPTIES: u32 = 11;
/// How deep NESTED's arrays go: deep, yet within the 128 levels
/// serde_json reads a writer schema's JSON to.
const NEST: usize = 60;
/// The registry answers 404.
const MISSING: u32 = 404;

const MAL: &[&str] = &["malformed_avro"];
const FRAMING: &[&str] = &["bad_framing"];
/// Invalid UTF-8 in a string: the payload does not decode.
const UTF8: &[&str] = &["malformed_avro", "not_utf8"];

/// The fields after `id` and `req`, as the good writer declares them.
const REST: &str = r#"
    {"name":"s","type":["null","string"]},
    {"name":"b","type":["null","boolean"]},
    {"name":"i","type":["null","int"]},
    {"name":"u","type":["null","long"]},
    {"name":"l","type":["null","long"]},
    {"name":"ul","type":["null","long"]},
    {"name":"f","type":["null","float"]},
    {"name":"d","type":["null","double"]},
    {"name":"day","type":["null",{"type":"int","logicalType":"date"}]},
    {"name":"at","type":["null",{"type":"long","logicalType":"timestamp-millis"}]},
    {"name":"tags","type":["null",{"type":"array","items":"string"}]},
    {"name":"nums","type":["null",{"type":"array","items":"int"}]},
    {"name":"v","type":["null",{"type":"array","items":"float"}]},
    {"name":"e","type":["null",{"type":"enum","name":"Color","symbols":["red","green","blue"]}]}"#;

fn writer(req: &str, extra: &str) -> String {
    format!(
        r#"{{"type":"record","name":"Thing","namespace":"hostile","fields":[
    {{"name":"id","type":"string"}},
    {{"name":"req","type":{req}}},{REST}{extra}]}}"#
    )
}

/// The mapping's `unknown_fields = "ignore"` lets the DEEP writer carry a
/// field the type does not declare (and so must skip, however deep).
const MAPPING: &str = "node = \"Thing\"\nformat = \"avro\"\nunknown_fields = \"ignore\"";

fn schemas() -> Vec<(u32, Option<Registered>)> {
    let avro = |text: String| {
        Some(Registered {
            kind: SchemaKind::Avro,
            text,
        })
    };
    vec![
        (GOOD_ID, avro(writer("\"string\"", ""))),
        (
            LACKS_REQ,
            avro(
                r#"{"type":"record","name":"Thing","fields":[{"name":"id","type":"string"}]}"#
                    .into(),
            ),
        ),
        (REQ_BOOL, avro(writer("\"boolean\"", ""))),
        (
            A_PROTO,
            Some(Registered {
                kind: SchemaKind::Protobuf,
                text: "syntax = \"proto3\";\nmessage Thing { string id = 1; string req = 2; }\n"
                    .into(),
            }),
        ),
        (NOT_JSON, avro("{\"type\":\"record\",".into())),
        (
            DEEP,
            avro(writer(
                "\"string\"",
                r#",
    {"name":"deep","type":["null",{"type":"record","name":"Node","fields":[
        {"name":"next","type":["null","Node"]}]}]}"#,
            )),
        ),
        (REQ_NULLABLE, avro(writer("[\"null\",\"string\"]", ""))),
        (NESTED, avro(writer("\"string\"", &nested_field()))),
        (
            NULLS,
            avro(writer(
                "\"string\"",
                r#",{"name":"z","type":{"type":"array","items":"null"}}"#,
            )),
        ),
        (
            EMPTIES,
            avro(writer(
                "\"string\"",
                r#",{"name":"z","type":["null",{"type":"array","items":{"type":"record","name":"E","fields":[]}}]}"#,
            )),
        ),
        (MISSING, None),
    ]
}

/// `"nest"`: an array of arrays … of int, NEST levels.
fn nested_field() -> String {
    let mut t = "\"int\"".to_string();
    for _ in 0..NEST {
        t = format!(r#"{{"type":"array","items":{t}}}"#);
    }
    format!(r#",{{"name":"nest","type":{t}}}"#)
}

/// A NESTED value: one item per level down to the int `inner` holds.
fn nest(inner: &[u8]) -> Vec<u8> {
    let mut b = vec![2u8; NEST];
    b.extend_from_slice(inner);
    b.extend(std::iter::repeat_n(0u8, NEST));
    b
}

fn long(v: i64) -> Vec<u8> {
    let mut out = Vec::new();
    zigzag(&mut out, v);
    out
}

fn string(s: &[u8]) -> Vec<u8> {
    let mut out = long(s.len() as i64);
    out.extend_from_slice(s);
    out
}

/// The second branch of `["null", T]`, holding `inner`.
fn some(inner: &[u8]) -> Vec<u8> {
    let mut out = vec![2];
    out.extend_from_slice(inner);
    out
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// One array block of `items`, then the closing 0 (an empty array is the
/// 0 alone).
fn array(items: &[Vec<u8>]) -> Vec<u8> {
    if items.is_empty() {
        return vec![0];
    }
    let mut out = long(items.len() as i64);
    items.iter().for_each(|i| out.extend_from_slice(i));
    out.push(0);
    out
}

/// A Thing's fields, each as its encoded bytes, in the writer's order.
struct Thing(Vec<(&'static str, Vec<u8>)>);

impl Thing {
    fn good(id: &str) -> Thing {
        let floats =
            |xs: &[f32]| -> Vec<Vec<u8>> { xs.iter().map(|x| x.to_le_bytes().to_vec()).collect() };
        Thing(vec![
            ("id", string(id.as_bytes())),
            ("req", string(b"r")),
            ("s", some(&string(b"abc"))),
            ("b", some(&[1])),
            ("i", some(&long(5))),
            ("u", some(&long(7))),
            ("l", some(&long(-9))),
            ("ul", some(&long(11))),
            ("f", some(&1.5f32.to_le_bytes())),
            ("d", some(&0.5f64.to_le_bytes())),
            // 2024-02-29, and 2024-02-29T12:34:56Z in milliseconds.
            ("day", some(&long(19_782))),
            ("at", some(&long(1_709_210_096_000))),
            ("tags", some(&array(&[string(b"a"), string(b"b")]))),
            ("nums", some(&array(&[long(1), long(2)]))),
            ("v", some(&array(&floats(&[1.0, 2.0, 3.0])))),
            ("e", some(&long(0))),
        ])
    }

    fn set(mut self, field: &str, bytes: Vec<u8>) -> Thing {
        match self.0.iter_mut().find(|(k, _)| *k == field) {
            Some(slot) => slot.1 = bytes,
            None => self.0.push(("extra", bytes)),
        }
        self
    }

    fn payload(&self) -> Vec<u8> {
        self.0.iter().flat_map(|(_, b)| b.iter().copied()).collect()
    }

    fn framed(&self, id: u32) -> Vec<u8> {
        framed(id, &self.payload())
    }
}

// The corpus as it is made: [`Records`], and this format's ways of making
// a bad record from a good one (below).
super::records_corpus!(Corpus);

impl Corpus {
    /// A good Thing (fresh id) with `field` set to `bytes`, framed as GOOD.
    fn field(&mut self, field: &str, what: &str, bytes: Vec<u8>, expect: Expect) {
        self.field_as(GOOD_ID, field, what, bytes, expect);
    }

    fn field_as(&mut self, id: u32, field: &str, what: &str, bytes: Vec<u8>, expect: Expect) {
        let v = Thing::good(&self.id()).set(field, bytes).framed(id);
        self.push(format!("avro {field}: {what} (schema id {id})"), v, expect);
    }

    /// A good Thing (fresh id) framed as `id`, then changed by `f`.
    fn raw(&mut self, what: &str, id: u32, f: impl FnOnce(&mut Vec<u8>), expect: Expect) {
        let mut v = Thing::good(&self.id()).framed(id);
        f(&mut v);
        self.push(format!("avro {what}"), v, expect);
    }
}

/// Hundreds of bad Avro records and the good ones around them.
pub fn avro_corpus() -> FormatCorpus {
    let mut c = Corpus(Records::new("a"));
    accepted(&mut c);
    framing(&mut c);
    truncations(&mut c);
    varints(&mut c);
    lengths(&mut c);
    branches(&mut c);
    values(&mut c);
    deep(&mut c);
    FormatCorpus {
        mapping: MAPPING,
        schemas: schemas(),
        records: c.0.out,
    }
}

/// Good records, and valid encodings a reader must take: every optional
/// null, arrays in several blocks, a negative block count (which the spec
/// allows: |count| items after a byte size), empty arrays.
fn accepted(c: &mut Corpus) {
    let ok = || Expect::Accept;
    c.raw("a good record", GOOD_ID, |_| {}, ok());
    let all_null = {
        let id = c.id();
        let mut t = Thing::good(&id);
        for (_, b) in t.0.iter_mut().skip(2) {
            *b = vec![0];
        }
        t.framed(GOOD_ID)
    };
    c.push("avro every optional null".into(), all_null, ok());
    c.field(
        "tags",
        "two blocks",
        some(&cat(&[
            &long(1),
            &string(b"a"),
            &long(1),
            &string(b"b"),
            &[0],
        ])),
        ok(),
    );
    let items = cat(&[&string(b"a"), &string(b"b")]);
    c.field(
        "tags",
        "a negative block count with its byte size",
        some(&cat(&[&long(-2), &long(items.len() as i64), &items, &[0]])),
        ok(),
    );
    c.field("tags", "empty", some(&array(&[])), ok());
    c.field("nums", "empty", some(&array(&[])), ok());
    c.field_as(REQ_NULLABLE, "req", "set", some(&string(b"r")), ok());
    // Arrays NEST deep in a field the decoder skips.
    c.field_as(NESTED, "nest", "60 levels", nest(&long(7)), ok());
}

/// The prefix: no magic byte, short, ids the registry lacks or holds as
/// something else.
fn framing(c: &mut Corpus) {
    let rej = Expect::Reject;
    for first in [1u8, 0x7b, 0xff] {
        c.raw(
            &format!("first byte {first:#04x}"),
            GOOD_ID,
            |v| v[0] = first,
            rej(FRAMING),
        );
    }
    let id = c.id();
    c.push(
        "avro JSON text".into(),
        format!("{{\"id\":\"{id}\",\"req\":\"r\"}}").into_bytes(),
        rej(FRAMING),
    );
    c.raw(
        "unknown schema id",
        MISSING,
        |_| {},
        rej(&["unknown_schema_id"]),
    );
    for (id, what) in [
        (LACKS_REQ, "a writer lacking req"),
        (REQ_BOOL, "a writer with req boolean"),
        (A_PROTO, "a Protobuf schema's id"),
        (NOT_JSON, "a writer that is not JSON"),
    ] {
        c.raw(what, id, |_| {}, rej(&["schema_mismatch"]));
    }
    // A null into the required `req` (through REQ_NULLABLE).
    c.field_as(
        REQ_NULLABLE,
        "req",
        "null",
        vec![0],
        rej(&["missing_required"]),
    );
    // Trailing bytes: one, a few, a whole second record.
    for tail in [&[0u8][..], &[2], &[7, 7, 7]] {
        c.raw(
            &format!("trailing {tail:?}"),
            GOOD_ID,
            |v| v.extend_from_slice(tail),
            rej(MAL),
        );
    }
    let second = Thing::good("second").payload();
    c.raw(
        "a second record after the first",
        GOOD_ID,
        |v| v.extend_from_slice(&second),
        rej(MAL),
    );
}

/// A good record cut at every length: the prefix cut is bad framing, any
/// other cut is malformed (every Avro field is written, so no cut of a
/// record is a whole record).
fn truncations(c: &mut Corpus) {
    let len = Thing::good(&c.id()).framed(GOOD_ID).len();
    for cut in 0..len {
        let code = if cut < 5 { FRAMING } else { MAL };
        c.raw(
            &format!("truncated at {cut} of {len}"),
            GOOD_ID,
            |v| v.truncate(cut),
            Expect::Reject(code),
        );
    }
}

/// Varints past 64 bits, and int values past 32.
fn varints(c: &mut Corpus) {
    let rej = || Expect::Reject(MAL);
    for (what, bad) in [("11 bytes", VARINT_11), ("over 64 bits", VARINT_OVER_64)] {
        c.field("id", &format!("length varint {what}"), bad.to_vec(), rej());
        c.field("l", &format!("long varint {what}"), some(bad), rej());
        c.field(
            "s",
            &format!("union index varint {what}"),
            bad.to_vec(),
            rej(),
        );
        c.field(
            "tags",
            &format!("block count varint {what}"),
            some(bad),
            rej(),
        );
    }
    // An `int` holds 32 bits: a longer varint is not an int.
    for v in [1i64 << 31, -(1i64 << 31) - 1, 1 << 40, i64::MAX] {
        c.field("i", &format!("int varint of {v}"), some(&long(v)), rej());
        c.field("day", &format!("date varint of {v}"), some(&long(v)), rej());
    }
    c.field(
        "i",
        "int varint of 5 bytes past 32 bits",
        some(&[0xff, 0xff, 0xff, 0xff, 0x7f]),
        rej(),
    );
    // A varint cut short at the end of the value.
    let id = c.id();
    let mut t = Thing::good(&id).framed(GOOD_ID);
    t.push(0x80);
    c.push("avro a trailing unfinished varint".into(), t, rej());
}

/// Declared lengths and counts past the value: huge, negative, 4 GiB.
fn lengths(c: &mut Corpus) {
    let rej = || Expect::Reject(MAL);
    let lens: [(&str, Vec<u8>); 5] = [
        ("0xffffffff0f", VARINT_4G.to_vec()),
        ("2^40", long(1 << 40)),
        ("i64::MAX", long(i64::MAX)),
        ("-1", long(-1)),
        ("one past the end", long(1000)),
    ];
    for (what, len) in &lens {
        c.field("id", &format!("string length {what}"), len.clone(), rej());
        c.field("s", &format!("string length {what}"), some(len), rej());
        c.field(
            "tags",
            &format!("item length {what}"),
            some(&cat(&[&long(1), len])),
            rej(),
        );
    }
    for (what, count) in [
        ("0xffffffff0f", VARINT_4G.to_vec()),
        ("2^40", long(1 << 40)),
        ("i64::MAX", long(i64::MAX)),
        ("i64::MIN", VARINT_U64_MAX.to_vec()),
        ("-2^40", long(-(1 << 40))),
    ] {
        for f in ["tags", "nums", "v"] {
            c.field(f, &format!("block count {what}"), some(&count), rej());
        }
    }
    // A negative count whose byte size is huge or negative, then no items.
    for size in [long(i64::MAX), long(-5), VARINT_4G.to_vec()] {
        c.field(
            "nums",
            &format!("block count -1, byte size {size:?}"),
            some(&cat(&[&long(-1), &size])),
            rej(),
        );
    }
    // An array block that never closes.
    c.field(
        "nums",
        "no closing 0",
        some(&cat(&[&long(1), &long(1)])),
        rej(),
    );
}

/// Union branches and enum indexes out of range; invalid UTF-8.
fn branches(c: &mut Corpus) {
    let rej = || Expect::Reject(MAL);
    for (what, idx) in [("2", long(2)), ("-1", long(-1)), ("2^40", long(1 << 40))] {
        let mut b = idx.clone();
        b.extend(string(b"abc"));
        c.field("s", &format!("union branch {what}"), b, rej());
    }
    // Color has 3 symbols: 0..=2.
    for idx in [3i64, -1, 1 << 40] {
        c.field("e", &format!("enum index {idx}"), some(&long(idx)), rej());
    }
    for (n, bad) in [
        &b"\xff"[..],
        b"\xc3",
        b"\xc0\xaf",
        b"\xed\xa0\x80",
        b"ab\x80",
    ]
    .iter()
    .enumerate()
    {
        let u = Expect::Reject(UTF8);
        c.field(
            "s",
            &format!("invalid UTF-8 #{n}"),
            some(&string(bad)),
            u.clone(),
        );
        c.field(
            "req",
            &format!("invalid UTF-8 #{n}"),
            string(bad),
            u.clone(),
        );
        c.field(
            "tags",
            &format!("invalid UTF-8 #{n}"),
            some(&array(&[string(b"a"), string(bad)])),
            u.clone(),
        );
        let mut id = format!("{}-", c.id()).into_bytes();
        id.extend_from_slice(bad);
        c.field("id", &format!("invalid UTF-8 #{n}"), string(&id), u);
    }
}

/// Values the payload carries well but the type refuses, each with its
/// code (the type table: unsigned checks, the vector's length, the enum,
/// `@range`, `@check`).
fn values(c: &mut Corpus) {
    let rej = Expect::Reject;
    for v in [-1i64, 1 << 32, i64::MIN] {
        c.field(
            "u",
            &format!("U32 from {v}"),
            some(&long(v)),
            rej(&["wrong_type"]),
        );
    }
    for v in [-1i64, i64::MIN] {
        c.field(
            "ul",
            &format!("U64 from {v}"),
            some(&long(v)),
            rej(&["wrong_type"]),
        );
    }
    for n in [0usize, 2, 4] {
        let items: Vec<Vec<u8>> = (0..n).map(|_| 1f32.to_le_bytes().to_vec()).collect();
        c.field(
            "v",
            &format!("Vector(3) of {n}"),
            some(&array(&items)),
            rej(&["wrong_type"]),
        );
    }
    c.field("e", "symbol blue", some(&long(2)), rej(&["enum"]));
    for v in [-1i64, 101] {
        c.field(
            "i",
            &format!("{v} outside @range"),
            some(&long(v)),
            rej(&["range"]),
        );
    }
    for v in [f64::NAN, f64::INFINITY, -1.6] {
        c.field(
            "d",
            &format!("{v} outside @range"),
            some(&v.to_le_bytes()),
            rej(&["range"]),
        );
    }
    c.field(
        "s",
        "ABC fails @check",
        some(&string(b"ABC")),
        rej(&["check"]),
    );
}

/// Deep values. A recursive writer (a record holding itself) is the only
/// way to nest without bound; arrow-avro 58 does not take recursive named
/// types, so the DEEP writer is refused by id (`schema_mismatch`) and no
/// value can nest deeper than its writer's schema. What is left: a
/// NESTED value cut short or lying at its innermost level.
fn deep(c: &mut Corpus) {
    let mismatch = || Expect::Reject(&["schema_mismatch"]);
    for levels in [0usize, 1, 10_000, 100_000] {
        // Each level is branch 1 (a Node); the innermost `next` is null.
        let mut b = vec![2u8; levels];
        b.push(0);
        c.field_as(DEEP, "deep", &format!("{levels} levels"), b, mismatch());
    }
    let rej = || Expect::Reject(MAL);
    let mut cut = nest(&long(7));
    cut.truncate(NEST + 1);
    c.field_as(NESTED, "nest", "cut at the innermost item", cut, rej());
    c.field_as(
        NESTED,
        "nest",
        "innermost count 2^40",
        {
            let mut b = vec![2u8; NEST - 1];
            b.extend(long(1 << 40));
            b.extend(long(7));
            b
        },
        rej(),
    );
    c.field_as(
        NESTED,
        "nest",
        "innermost block count i64::MIN",
        {
            let mut b = vec![2u8; NEST - 1];
            b.extend_from_slice(VARINT_U64_MAX);
            b
        },
        rej(),
    );
    c.field_as(
        NESTED,
        "nest",
        "one level too many closed",
        {
            let mut b = nest(&long(7));
            b.push(0);
            b
        },
        rej(),
    );
    // Arrays of items that take no bytes: a block count of 2^62 alone
    // would be 2^62 items, which arrow-avro reads one by one.
    let huge = cat(&[&long(1 << 62), &[0]]);
    c.field_as(NULLS, "z", "2^62 nulls", huge.clone(), mismatch());
    c.field_as(EMPTIES, "z", "2^62 empty records", some(&huge), mismatch());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_good_record_is_the_avro_encoding_it_claims() {
        // Spot checks against the spec's examples: long 1 → 02, -1 → 01,
        // 64 → 80 01; "foo" → 06 66 6f 6f.
        assert_eq!(long(1), [2]);
        assert_eq!(long(-1), [1]);
        assert_eq!(long(64), [0x80, 0x01]);
        assert_eq!(string(b"foo"), [6, b'f', b'o', b'o']);
        let v = Thing::good("a00000").framed(GOOD_ID);
        assert_eq!(&v[..5], &[0, 0, 0, 0, 1]);
        // id "a00000": length 6 (zigzag 12), then the text, then req "r".
        assert_eq!(&v[5..12], b"\x0ca00000");
        assert_eq!(&v[12..14], b"\x02r");
        let mut u = Vec::new();
        super::super::varint(&mut u, 300);
        assert_eq!(u, [0xac, 0x02]);
    }
}
