//! The hostile-input generator: hundreds of distinct bad records, made by
//! mutating good ones across every `.pg` type and constraint of
//! [`SCHEMA`], each with what graphsink must make of it. Shared by the
//! decoder's unit test, the e2e test through a real broker, and the chaos
//! tool. Every record has its own id, so accepted ones never collapse into
//! one row by last-write-wins.
//!
//! The corpora: `json` (plain JSON values, [`corpus`]), `avro` and
//! `protobuf` (the Confluent wire format, [`avro_corpus`],
//! [`protobuf_corpus`]); this file holds what they share.

mod avro;
mod json;
mod protobuf;

pub use avro::avro_corpus;
pub use json::{corpus, corpus_for};
pub use protobuf::protobuf_corpus;

/// Every scalar type, a list of each kind, a vector, an enum, `@range`
/// (integer and float), `@check`, a composite `@key` and an edge.
pub const SCHEMA: &str = r#"
node Thing {
    id: String @key
    req: String
    s: String?
    b: Bool?
    i: I32?
    u: U32?
    l: I64?
    ul: U64?
    f: F32?
    d: F64?
    day: Date?
    at: DateTime?
    tags: [String]?
    nums: [I32]?
    v: Vector(3)?
    e: enum(red, green)?
    @range(i, 0..100)
    @range(d, -1.5..1.5)
    @check(s, "^[a-z]+$")
}
node Pair {
    t: String
    n: U32
    label: String?
    @key(t, n)
}
edge Rel: Thing -> Thing { w: I32? }
"#;

/// `errors.max_record_bytes` of [`corpus`] (graphsink's default).
pub const MAX_RECORD_BYTES: usize = 1_000_000;

/// The smallest limit the corpus fits: its deepest value (5 × 10^4 nested
/// objects) is about 300 kB.
pub const MIN_RECORD_BYTES: usize = 400_000;

/// Which mapping (topic) a record goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Feed {
    /// `node = "Thing"`, key from the value.
    Things,
    /// `node = "Pair"`, `key = "kafka"` (a JSON array `[t, n]`).
    Pairs,
    /// `edge = "Rel"`, endpoints in `src`/`dst`.
    Rels,
}

impl Feed {
    pub const ALL: [Feed; 3] = [Feed::Things, Feed::Pairs, Feed::Rels];

    /// The `[[mapping]]` body, without its `topic` line.
    pub fn mapping(self) -> &'static str {
        match self {
            Feed::Things => "node = \"Thing\"",
            Feed::Pairs => "node = \"Pair\"\nkey = \"kafka\"",
            Feed::Rels => "edge = \"Rel\"",
        }
    }
}

/// What graphsink must make of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Exactly one reject, with one of these codes.
    Reject(&'static [&'static str]),
    /// Accepted on purpose (README says so): a row, no reject.
    Accept,
}

#[derive(Debug, Clone)]
pub struct Hostile {
    /// What was mutated, for failure messages.
    pub name: String,
    pub feed: Feed,
    pub key: Option<Vec<u8>>,
    /// `None` is a tombstone.
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub expect: Expect,
}

/// `struct $name(Records)` that derefs to its [`Records`], for a format's
/// corpus to add its own ways of making records (hostile/avro.rs,
/// hostile/protobuf.rs).
macro_rules! records_corpus {
    ($name:ident) => {
        struct $name(Records);

        impl std::ops::Deref for $name {
            type Target = Records;
            fn deref(&self) -> &Records {
                &self.0
            }
        }

        impl std::ops::DerefMut for $name {
            fn deref_mut(&mut self) -> &mut Records {
                &mut self.0
            }
        }
    };
}
use records_corpus;

/// One format corpus's records as they are made (hostile/avro.rs,
/// hostile/protobuf.rs): Things with fresh ids of a fixed width (so the
/// records of a truncation series share one layout), each with a trace
/// header.
struct Records {
    prefix: &'static str,
    out: Vec<Hostile>,
}

impl Records {
    fn new(prefix: &'static str) -> Records {
        Records {
            prefix,
            out: Vec::new(),
        }
    }

    fn id(&self) -> String {
        format!("{}{:05}", self.prefix, self.out.len())
    }

    fn push(&mut self, name: String, value: Vec<u8>, expect: Expect) {
        let trace = format!("{}{}", self.prefix, self.out.len()).into_bytes();
        self.out.push(Hostile {
            name,
            feed: Feed::Things,
            key: None,
            value: Some(value),
            headers: vec![("trace".into(), trace)],
            expect,
        });
    }
}

/// A registry format's hostile corpus: what the registry holds by schema
/// id, the `[[mapping]]` body (without `topic`) for [`SCHEMA`]'s `Thing`,
/// and the records, every one of [`Feed::Things`].
#[derive(Debug, Clone)]
pub struct FormatCorpus {
    pub mapping: &'static str,
    /// `None`: the registry answers 404 for the id.
    pub schemas: Vec<(u32, Option<Registered>)>,
    pub records: Vec<Hostile>,
}

/// A schema as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub kind: SchemaKind,
    pub text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaKind {
    Avro,
    Protobuf,
}

/// Appends `u` as a base-128 varint (Protobuf's, and Avro's after zigzag).
fn varint(out: &mut Vec<u8>, mut u: u64) {
    loop {
        let b = (u & 0x7f) as u8;
        u >>= 7;
        if u == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// Appends `v` zigzag-encoded (Avro's int and long, Protobuf's sint64).
fn zigzag(out: &mut Vec<u8>, v: i64) {
    varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// The Confluent wire format's prefix: magic byte 0, the big-endian id.
fn framed(id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A varint of ten 0xff bytes and a 0x01: eleven bytes, past what any
/// 64-bit varint may take.
const VARINT_11: &[u8] = &[
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
];
/// A ten-byte varint whose last byte carries bits past 64.
const VARINT_OVER_64: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
/// 0xffffffff0f: 2^32 − 1 as a varint (a length of 4 GiB; zigzag −2^31).
const VARINT_4G: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0x0f];
/// u64::MAX as a ten-byte varint: zigzag i64::MIN, a count whose
/// negation overflows.
const VARINT_U64_MAX: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_corpora_are_distinct_and_name_only_their_schemas() {
        for (name, c) in [("avro", avro_corpus()), ("protobuf", protobuf_corpus())] {
            let bad = c
                .records
                .iter()
                .filter(|h| h.expect != Expect::Accept)
                .count();
            assert!(bad >= 190, "{name}: {bad} bad records");
            let mut seen = std::collections::HashSet::new();
            for h in &c.records {
                assert!(seen.insert(h.value.clone()), "{name}: duplicate {}", h.name);
                // Every framed id is one the corpus says the registry
                // answers for (a decoder must learn it before decoding).
                if let Some([0, a, b, c2, d, ..]) = h.value.as_deref() {
                    let id = u32::from_be_bytes([*a, *b, *c2, *d]);
                    assert!(
                        c.schemas.iter().any(|(i, _)| *i == id),
                        "{name}: {} names id {id}",
                        h.name
                    );
                }
            }
        }
    }

    #[test]
    fn the_corpus_has_300_distinct_bad_records() {
        let all = corpus();
        let bad = all.iter().filter(|h| h.expect != Expect::Accept).count();
        assert!(bad >= 300, "{bad} bad records");
        let mut seen = std::collections::HashSet::new();
        for h in &all {
            assert!(
                seen.insert((h.feed, h.key.clone(), h.value.clone(), h.headers.clone())),
                "duplicate: {}",
                h.name
            );
        }
    }
}
