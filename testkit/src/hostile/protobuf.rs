//! The Protobuf corpus: good `Thing` messages in the Confluent wire format
//! (message indexes included), mutated byte by byte. Encoded by hand, not
//! with a Protobuf library: a library writes only valid messages, while
//! each case here must hold exactly the (invalid) bytes it names, and the
//! wire format is small (a varint tag of field number and wire type, then a
//! varint, 4 or 8 bytes, or a length and that many bytes).

use super::{
    framed, varint, zigzag, Expect, FormatCorpus, Records, Registered, SchemaKind, VARINT_11,
    VARINT_4G, VARINT_OVER_64, VARINT_U64_MAX,
};

/// The schema every good record is framed with.
pub(super) const GOOD_ID: u32 = 11;
const AN_AVRO: u32 = 12;
const NOT_PROTO: u32 = 13;
const LACKS_REQ: u32 = 14;
/// `req` with presence (`optional`).
const REQ_OPTIONAL: u32 = 15;
/// The registry answers 404.
const MISSING: u32 = 405;

const MAL: &[&str] = &["malformed_protobuf"];
const FRAMING: &[&str] = &["bad_framing"];

/// `u` is an int64 and `ul` a sint64, wider than their properties (U32,
/// U64), so the decoder's checked conversions are on trial; `deep` (not a
/// property: the mapping ignores unknown fields) nests without end.
pub(super) const PROTO: &str = r#"syntax = "proto3";
package hostile;
import "google/protobuf/timestamp.proto";
enum Color { red = 0; green = 1; blue = 2; }
message Thing {
  string id = 1;
  string req = 2;
  optional string s = 3;
  optional bool b = 4;
  optional int32 i = 5;
  optional int64 u = 6;
  optional int64 l = 7;
  optional sint64 ul = 8;
  optional float f = 9;
  optional double d = 10;
  optional int32 day = 11;
  google.protobuf.Timestamp at = 12;
  repeated string tags = 13;
  repeated int32 nums = 14;
  repeated float v = 15;
  optional Color e = 16;
  Node deep = 17;
  message Node { Node next = 1; }
}
message Other { string x = 1; }
"#;

const MAPPING: &str = "node = \"Thing\"\nformat = \"protobuf\"\nunknown_fields = \"ignore\"";

fn schemas() -> Vec<(u32, Option<Registered>)> {
    let proto = |text: &str| {
        Some(Registered {
            kind: SchemaKind::Protobuf,
            text: text.into(),
        })
    };
    vec![
        (GOOD_ID, proto(PROTO)),
        (
            AN_AVRO,
            Some(Registered {
                kind: SchemaKind::Avro,
                text:
                    r#"{"type":"record","name":"Thing","fields":[{"name":"id","type":"string"}]}"#
                        .into(),
            }),
        ),
        (NOT_PROTO, proto("syntax = \"proto3\";\nmessage Thing {")),
        (
            LACKS_REQ,
            proto("syntax = \"proto3\";\nmessage Thing { string id = 1; }\n"),
        ),
        (
            REQ_OPTIONAL,
            proto(
                "syntax = \"proto3\";\nmessage Thing { string id = 1; optional string req = 2; }\n",
            ),
        ),
        (MISSING, None),
    ]
}

fn tag(field: u64, wire: u64) -> Vec<u8> {
    let mut out = Vec::new();
    varint(&mut out, field << 3 | wire);
    out
}

/// A varint field.
fn vi(field: u64, v: u64) -> Vec<u8> {
    let mut out = tag(field, 0);
    varint(&mut out, v);
    out
}

/// A length-delimited field.
fn ld(field: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = tag(field, 2);
    varint(&mut out, bytes.len() as u64);
    out.extend_from_slice(bytes);
    out
}

/// A field whose bytes after the tag are `raw` as given.
fn raw(field: u64, wire: u64, raw: &[u8]) -> Vec<u8> {
    let mut out = tag(field, wire);
    out.extend_from_slice(raw);
    out
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn varints(vs: &[u64]) -> Vec<u8> {
    let mut out = Vec::new();
    vs.iter().for_each(|&v| varint(&mut out, v));
    out
}

fn floats(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A Thing's fields, each as its encoded bytes (a repeated field as one
/// chunk per item), in field-number order.
struct Thing(Vec<(&'static str, Vec<u8>)>);

impl Thing {
    fn good(id: &str) -> Thing {
        let mut sz = Vec::new();
        zigzag(&mut sz, 11);
        Thing(vec![
            ("id", ld(1, id.as_bytes())),
            ("req", ld(2, b"r")),
            ("s", ld(3, b"abc")),
            ("b", vi(4, 1)),
            ("i", vi(5, 5)),
            ("u", vi(6, 7)),
            // A negative int64 takes ten bytes.
            ("l", vi(7, -9i64 as u64)),
            ("ul", raw(8, 0, &sz)),
            ("f", raw(9, 5, &1.5f32.to_le_bytes())),
            ("d", raw(10, 1, &0.5f64.to_le_bytes())),
            // 2024-02-29, and 2024-02-29T12:34:56Z as a Timestamp.
            ("day", vi(11, 19_782)),
            ("at", ld(12, &vi(1, 1_709_210_096))),
            ("tags", ld(13, b"a")),
            ("tags", ld(13, b"b")),
            // proto3 packs repeated scalars.
            ("nums", ld(14, &varints(&[1, 2]))),
            ("v", ld(15, &floats(&[1.0, 2.0, 3.0]))),
            ("e", vi(16, 0)),
        ])
    }

    /// `field`'s chunks replaced by one (or added at the end).
    fn set(mut self, field: &'static str, bytes: Vec<u8>) -> Thing {
        match self.0.iter().position(|(k, _)| *k == field) {
            Some(at) => {
                self.0.retain(|(k, _)| *k != field);
                self.0.insert(at.min(self.0.len()), (field, bytes));
            }
            None => self.0.push((field, bytes)),
        }
        self
    }

    fn payload(&self) -> Vec<u8> {
        self.0.iter().flat_map(|(_, b)| b.iter().copied()).collect()
    }

    /// Framed as `id`, with the message indexes `indexes`.
    fn framed_with(&self, id: u32, indexes: &[u8]) -> Vec<u8> {
        framed(id, &cat(&[indexes, &self.payload()]))
    }

    /// Framed as GOOD, message index [0] (the single 0 Confluent writes).
    fn framed(&self) -> Vec<u8> {
        self.framed_with(GOOD_ID, &[0])
    }
}

// The corpus as it is made: [`Records`], and this format's ways of making
// a bad record from a good one (below).
super::records_corpus!(Corpus);

impl Corpus {
    /// A good Thing (fresh id) with `field` set to `bytes`.
    fn field(&mut self, field: &'static str, what: &str, bytes: Vec<u8>, expect: Expect) {
        let v = Thing::good(&self.id()).set(field, bytes).framed();
        self.push(format!("protobuf {field}: {what}"), v, expect);
    }

    /// A good Thing (fresh id) with `bytes` appended to the payload.
    fn append(&mut self, what: &str, bytes: &[u8], expect: Expect) {
        let mut v = Thing::good(&self.id()).framed();
        v.extend_from_slice(bytes);
        self.push(format!("protobuf + {what}"), v, expect);
    }

    /// A good Thing (fresh id) framed as `id` with message indexes `indexes`.
    fn indexes(&mut self, what: &str, id: u32, indexes: &[u8], expect: Expect) {
        let v = Thing::good(&self.id()).framed_with(id, indexes);
        self.push(format!("protobuf {what}"), v, expect);
    }
}

/// Hundreds of bad Protobuf records and the good ones around them.
pub fn protobuf_corpus() -> FormatCorpus {
    let mut c = Corpus(Records::new("p"));
    accepted(&mut c);
    framing(&mut c);
    message_indexes(&mut c);
    truncations(&mut c);
    varint_overflows(&mut c);
    lengths(&mut c);
    wire_types(&mut c);
    utf8(&mut c);
    values(&mut c);
    deep(&mut c);
    FormatCorpus {
        mapping: MAPPING,
        schemas: schemas(),
        records: c.0.out,
    }
}

/// Good records, and valid encodings a reader must take.
fn accepted(c: &mut Corpus) {
    let ok = || Expect::Accept;
    c.indexes("a good record", GOOD_ID, &[0], ok());
    // [0] written long-hand: count 1, index 0.
    c.indexes("index [0] as count 1, index 0", GOOD_ID, &[2, 0], ok());
    // Unpacked repeated scalars: parsers must take both forms.
    c.field("nums", "unpacked", cat(&[&vi(14, 1), &vi(14, 2)]), ok());
    // A singular field twice: the last one wins.
    c.field("s", "twice", cat(&[&ld(3, b"xyz"), &ld(3, b"abc")]), ok());
    // An empty repeated field reads as a null vector.
    c.field("v", "absent", Vec::new(), ok());
    // Unknown fields of every wire type are kept and ignored.
    c.append("unknown varint field 99", &vi(99, 1), ok());
    c.append("unknown bytes field 99", &ld(99, b"zz"), ok());
    c.append("unknown fixed32 field 99", &raw(99, 5, &[1, 2, 3, 4]), ok());
    c.append("unknown fixed64 field 99", &raw(99, 1, &[0; 8]), ok());
    c.append(
        "unknown group field 99",
        &cat(&[&tag(99, 3), &vi(1, 1), &tag(99, 4)]),
        ok(),
    );
    c.append("field number 2^29 - 1", &vi((1 << 29) - 1, 1), ok());
    // Protobuf's rule for an int32 read from a wider varint: keep the low
    // 32 bits (2^40 → 0), as every parser does.
    c.field("i", "varint 2^40 into int32", vi(5, 1 << 40), ok());
    for levels in [1, 50] {
        c.field("deep", &format!("{levels} levels"), nodes(levels), ok());
    }
    c.append("unknown groups 10 deep", &groups(10), ok());
    // Unknown length-delimited fields are skipped whole, never parsed.
    c.append("unknown bytes nested 10^4 deep", &nested(99, 10_000), ok());
}

/// The prefix: no magic byte, short, ids the registry lacks or holds as
/// something else.
fn framing(c: &mut Corpus) {
    let rej = Expect::Reject;
    for first in [1u8, 0x7b, 0xff] {
        let mut v = Thing::good(&c.id()).framed();
        v[0] = first;
        c.push(format!("protobuf first byte {first:#04x}"), v, rej(FRAMING));
    }
    c.indexes(
        "unknown schema id",
        MISSING,
        &[0],
        rej(&["unknown_schema_id"]),
    );
    for (id, what) in [
        (AN_AVRO, "an Avro schema's id"),
        (NOT_PROTO, "a .proto that does not compile"),
        (LACKS_REQ, "a message lacking req"),
    ] {
        c.indexes(what, id, &[0], rej(&["schema_mismatch"]));
    }
    // An `optional` req: present is a row, absent a missing property.
    let id = c.id();
    let v = framed(
        REQ_OPTIONAL,
        &cat(&[&[0], &ld(1, id.as_bytes()), &ld(2, b"r")]),
    );
    c.push("protobuf optional req, present".into(), v, Expect::Accept);
    let id = c.id();
    let v = framed(REQ_OPTIONAL, &cat(&[&[0], &ld(1, id.as_bytes())]));
    c.push(
        "protobuf optional req, absent".into(),
        v,
        rej(&["missing_required"]),
    );
}

/// Message indexes: naming no message, or not indexes at all.
fn message_indexes(c: &mut Corpus) {
    let rej = Expect::Reject;
    let mismatch = || rej(&["schema_mismatch"]);
    // Encoded as wire.rs's `encode_message_indexes`: zigzag count, indexes.
    let path = |p: &[i64]| -> Vec<u8> {
        let mut out = Vec::new();
        zigzag(&mut out, p.len() as i64);
        p.iter().for_each(|&i| zigzag(&mut out, i));
        out
    };
    c.indexes(
        "index [1]: Other, lacking req",
        GOOD_ID,
        &path(&[1]),
        mismatch(),
    );
    c.indexes("index [7]: past the file", GOOD_ID, &path(&[7]), mismatch());
    c.indexes(
        "index [0, 0]: Thing.Node",
        GOOD_ID,
        &path(&[0, 0]),
        mismatch(),
    );
    c.indexes(
        "index [0, 5]: past Thing's",
        GOOD_ID,
        &path(&[0, 5]),
        mismatch(),
    );
    c.indexes("index [0, 0, 0]", GOOD_ID, &path(&[0, 0, 0]), mismatch());
    c.indexes("index [70000]", GOOD_ID, &path(&[70_000]), mismatch());
    // Not indexes: negative, past the value, overflowing.
    c.indexes("index count -1", GOOD_ID, &[1], rej(MAL));
    c.indexes("index [-1]", GOOD_ID, &path(&[-1]), rej(MAL));
    let mut million = Vec::new();
    zigzag(&mut million, 1_000_000);
    c.indexes("index count 10^6", GOOD_ID, &million, rej(MAL));
    c.indexes("index count 0xffffffff0f", GOOD_ID, VARINT_4G, rej(MAL));
    c.indexes("index count of 11 bytes", GOOD_ID, VARINT_11, rej(MAL));
    c.indexes(
        "index of 6 bytes",
        GOOD_ID,
        &[2, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        rej(MAL),
    );
    c.indexes(
        "index past 32 bits",
        GOOD_ID,
        &[2, 0xff, 0xff, 0xff, 0xff, 0x7f],
        rej(MAL),
    );
}

/// A good record cut at every length. The wire format has no end marker,
/// so a cut between two fields leaves a whole message with fewer fields,
/// which is a message like any other (accepted, once `id` is whole, as its
/// key: an empty message is all defaults, `id` ""); a cut inside a field
/// is malformed; inside the prefix, bad framing; before the indexes,
/// malformed.
fn truncations(c: &mut Corpus) {
    let t = Thing::good(&c.id());
    let len = t.framed().len();
    // Where each field ends, from the start of the value.
    let mut ends = vec![6];
    for (_, b) in &t.0 {
        ends.push(ends.last().copied().unwrap_or(6) + b.len());
    }
    for cut in 0..len {
        let expect = if cut < 5 {
            Expect::Reject(FRAMING)
        } else if ends.contains(&cut) {
            Expect::Accept
        } else {
            Expect::Reject(MAL)
        };
        let mut v = Thing::good(&c.id()).framed();
        v.truncate(cut);
        c.push(format!("protobuf truncated at {cut} of {len}"), v, expect);
    }
}

/// Varints past 64 bits: values and tags.
fn varint_overflows(c: &mut Corpus) {
    let rej = || Expect::Reject(MAL);
    for (what, bad) in [("11 bytes", VARINT_11), ("over 64 bits", VARINT_OVER_64)] {
        c.field("i", &format!("value varint {what}"), raw(5, 0, bad), rej());
        c.field("l", &format!("value varint {what}"), raw(7, 0, bad), rej());
        c.field(
            "id",
            &format!("length varint {what}"),
            raw(1, 2, bad),
            rej(),
        );
        c.append(&format!("a tag varint {what}"), bad, rej());
    }
    c.append("an unfinished tag varint", &[0x80], rej());
    c.append("an unfinished value varint", &[0x28, 0x80], rej());
}

/// Declared lengths past the value: huge, 4 GiB, one past the end.
fn lengths(c: &mut Corpus) {
    let rej = || Expect::Reject(MAL);
    let lens: [(&str, Vec<u8>); 4] = [
        ("0xffffffff0f", VARINT_4G.to_vec()),
        ("2^40", varints(&[1 << 40])),
        ("u64::MAX", VARINT_U64_MAX.to_vec()),
        ("one past the end", varints(&[1000])),
    ];
    for (what, len) in &lens {
        for (f, n) in [
            ("id", 1),
            ("s", 3),
            ("at", 12),
            ("tags", 13),
            ("nums", 14),
            ("v", 15),
            ("deep", 17),
        ] {
            c.field(f, &format!("length {what}"), raw(n, 2, len), rej());
        }
        c.append(
            &format!("unknown field 99, length {what}"),
            &raw(99, 2, len),
            rej(),
        );
    }
    // Packed contents that do not fill their length.
    c.field("v", "5 bytes of floats", ld(15, &[0; 5]), rej());
    c.field("nums", "an unfinished varint", ld(14, &[0x80]), rej());
    c.field("at", "a Timestamp of garbage", ld(12, &[0xff]), rej());
}

/// Wire types a field cannot have, and tags that are no tags.
fn wire_types(c: &mut Corpus) {
    let rej = || Expect::Reject(MAL);
    c.field("id", "as a varint", vi(1, 1), rej());
    c.field("i", "as fixed32", raw(5, 5, &[5, 0, 0, 0]), rej());
    c.field("at", "as a varint", vi(12, 1), rej());
    c.append("field number 0", &[0x00], rej());
    c.append("field number 0, bytes", &[0x02, 0x00], rej());
    c.append("wire type 6", &tag(99, 6), rej());
    c.append("wire type 7", &tag(99, 7), rej());
    c.append("an end group with no start", &tag(99, 4), rej());
    c.append("a group never ended", &tag(99, 3), rej());
    c.append(
        "a group ended by another field's end",
        &cat(&[&tag(99, 3), &tag(98, 4)]),
        rej(),
    );
    c.append("field number 2^29", &vi(1 << 29, 1), rej());
    c.append("a fixed64 cut short", &raw(99, 1, &[0; 3]), rej());
}

fn utf8(c: &mut Corpus) {
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
        let rej = || Expect::Reject(&["malformed_protobuf", "not_utf8"]);
        c.field("s", &format!("invalid UTF-8 #{n}"), ld(3, bad), rej());
        c.field("req", &format!("invalid UTF-8 #{n}"), ld(2, bad), rej());
        c.field(
            "tags",
            &format!("invalid UTF-8 #{n}"),
            cat(&[&ld(13, b"a"), &ld(13, bad)]),
            rej(),
        );
        let mut id = format!("{}-", c.id()).into_bytes();
        id.extend_from_slice(bad);
        c.field("id", &format!("invalid UTF-8 #{n}"), ld(1, &id), rej());
    }
}

/// Values the message carries well but the type refuses, each with its
/// code (the type table's checked conversions, the vector's length, the
/// enum, `@range`, `@check`).
fn values(c: &mut Corpus) {
    let rej = Expect::Reject;
    for v in [-1i64, 1 << 32, i64::MIN] {
        c.field(
            "u",
            &format!("U32 from int64 {v}"),
            vi(6, v as u64),
            rej(&["wrong_type"]),
        );
    }
    for v in [-1i64, i64::MIN] {
        let mut z = Vec::new();
        zigzag(&mut z, v);
        c.field(
            "ul",
            &format!("U64 from sint64 {v}"),
            raw(8, 0, &z),
            rej(&["wrong_type"]),
        );
    }
    for n in [1usize, 2, 4] {
        c.field(
            "v",
            &format!("Vector(3) of {n}"),
            ld(15, &floats(&vec![1.0; n])),
            rej(&["wrong_type"]),
        );
    }
    c.field(
        "at",
        "seconds i64::MAX",
        ld(12, &vi(1, i64::MAX as u64)),
        rej(&["wrong_type"]),
    );
    c.field("e", "blue", vi(16, 2), rej(&["enum"]));
    c.field(
        "e",
        "number 7, no value of Color",
        vi(16, 7),
        rej(&["enum"]),
    );
    c.field("e", "number -1", vi(16, -1i64 as u64), rej(&["enum"]));
    for v in [-1i64, 101] {
        c.field(
            "i",
            &format!("{v} outside @range"),
            vi(5, v as u64),
            rej(&["range"]),
        );
    }
    for v in [f64::NAN, f64::INFINITY, -1.6] {
        c.field(
            "d",
            &format!("{v} outside @range"),
            raw(10, 1, &v.to_le_bytes()),
            rej(&["range"]),
        );
    }
    c.field("s", "ABC fails @check", ld(3, b"ABC"), rej(&["check"]));
}

/// `levels` nested Nodes as field 17: each level a length-delimited
/// `next` (field 1) holding the next.
fn nodes(levels: usize) -> Vec<u8> {
    cat(&[&tag(17, 2), &nested_body(1, levels)])
}

/// Field `field` length-delimited, nested `levels` deep in itself.
fn nested(field: u64, levels: usize) -> Vec<u8> {
    cat(&[&tag(field, 2), &nested_body(field, levels)])
}

/// The length and body of `levels` nested levels, written outside in
/// (each level's length known from the inner ones), so a deep value costs
/// its size, not its size squared.
fn nested_body(field: u64, levels: usize) -> Vec<u8> {
    let t = tag(field, 2);
    // lens[k]: the body length of the level k from the inside (0: empty).
    let mut lens = vec![0usize];
    for k in 1..levels {
        let inner = lens[k - 1];
        lens.push(t.len() + varints(&[inner as u64]).len() + inner);
    }
    let mut out = Vec::new();
    for (k, len) in lens.iter().enumerate().rev() {
        varint(&mut out, *len as u64);
        if k > 0 {
            out.extend_from_slice(&t);
        }
    }
    out
}

/// Unknown group field 99 nested `levels` deep.
fn groups(levels: usize) -> Vec<u8> {
    let mut out = Vec::new();
    (0..levels).for_each(|_| out.extend(tag(99, 3)));
    (0..levels).for_each(|_| out.extend(tag(99, 4)));
    out
}

/// Nesting far past any parser's recursion limit: refused, never a stack
/// overflow.
fn deep(c: &mut Corpus) {
    let rej = || Expect::Reject(MAL);
    for levels in [10_000, 100_000] {
        c.field("deep", &format!("{levels} levels"), nodes(levels), rej());
        c.append(
            &format!("unknown groups {levels} deep"),
            &groups(levels),
            rej(),
        );
    }
    // Deep, then cut short: the outer lengths overrun.
    let mut cut = nodes(1000);
    cut.truncate(cut.len() / 2);
    c.field("deep", "1000 levels, cut", cut, rej());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_encodings_are_the_wire_formats_examples() {
        // The Protobuf guide's examples: field 1 = 150 → 08 96 01; field 2
        // = "testing" → 12 07 74 65 73 74 69 6e 67.
        assert_eq!(vi(1, 150), [0x08, 0x96, 0x01]);
        assert_eq!(ld(2, b"testing"), b"\x12\x07testing");
        let mut z = Vec::new();
        zigzag(&mut z, -2);
        assert_eq!(z, [3]);
        // Three nested levels: 17 { 1 { 1 {} } }.
        assert_eq!(nodes(3), [0x8a, 0x01, 4, 0x0a, 2, 0x0a, 0]);
        assert_eq!(nodes(1), [0x8a, 0x01, 0]);
    }
}
