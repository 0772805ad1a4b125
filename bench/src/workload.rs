//! The workload: deterministic node records (`Item`) and, in a node/edge
//! mix, edge records (`Link`) on a second topic, and the topics they go
//! to. Owns what the records are; `formats` encodes them and `produce`
//! sends them.

/// The graph schema the bench writes: one node type keyed by `sku`, and one
/// edge type between its nodes. `pad` carries the bulk of `--value-bytes`.
pub(crate) const SCHEMA: &str = "node Item {\n    sku: String @key\n    seq: I64\n    pad: String\n    @range(seq, 0..)\n}\nedge Link: Item -> Item {\n    seq: I64\n    pad: String\n}\n";
pub(crate) const NODE: &str = "Item";
pub(crate) const EDGE: &str = "Link";
/// The seed of the backlog's node records: edges point at these.
pub(crate) const BACKLOG_SEED: u64 = 0x5eed;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// Node key space (distinct `sku`s).
    pub keys: u64,
    pub value_bytes: usize,
    /// Fraction of records that are edges (0 = nodes only).
    pub edge_fraction: f64,
    /// Edge id space (distinct Kafka keys of edge records).
    pub edge_keys: u64,
    /// Edges point at node records `0..endpoints` of the backlog, so every
    /// endpoint exists once the backlog's nodes are folded.
    pub endpoints: u64,
    /// Fraction of node records that are bad: alternately a decode reject
    /// (`seq` a string: `wrong_type`) and a validate reject (`seq` below
    /// `@range(seq, 0..)`: `range`). 0 = none.
    pub bad_fraction: f64,
}

impl Shape {
    pub(crate) fn nodes_only(keys: u64, value_bytes: usize) -> Shape {
        Shape {
            keys,
            value_bytes,
            edge_fraction: 0.0,
            edge_keys: 1,
            endpoints: 1,
            bad_fraction: 0.0,
        }
    }

    /// How many of records `0..records` are edges.
    pub(crate) fn edges_in(&self, records: u64) -> u64 {
        edges_before(*self, records)
    }
}

/// Which topic a record goes to: the node topic or the edge topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Node = 0,
    Edge = 1,
}

/// Edges among records `0..i`: ⌊i·f⌋, in integer parts per million so the
/// count is exact.
fn edges_before(shape: Shape, i: u64) -> u64 {
    let ppm = (shape.edge_fraction * 1e6).round() as u128;
    (i as u128 * ppm / 1_000_000) as u64
}

/// The kind of record `i` of a stream: edges spread evenly among nodes
/// (record i is an edge when ⌊(i+1)·f⌋ > ⌊i·f⌋), plus the index of the
/// record within its kind.
pub(crate) fn kind_of(shape: Shape, i: u64) -> (Kind, u64) {
    let before = edges_before(shape, i);
    if edges_before(shape, i + 1) > before {
        (Kind::Edge, before)
    } else {
        (Kind::Node, i - before)
    }
}

fn mix(seed: u64, i: u64) -> u64 {
    let mut x = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

fn sku(shape: Shape, seed: u64, n: u64) -> String {
    format!("k{:010}", mix(seed, n) % shape.keys.max(1))
}

fn pad_for(head: &str, value_bytes: usize) -> String {
    "x".repeat(value_bytes.saturating_sub(head.len() + 2))
}

/// One record's fields, before the run's format encodes them: every format
/// carries the same values (the pad is sized so the JSON value is about
/// `--value-bytes`; the binary formats are smaller for the same fields).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Fields {
    Node {
        sku: String,
        seq: Seq,
        pad: String,
    },
    Edge {
        src: String,
        dst: String,
        seq: i64,
        pad: String,
    },
}

/// A node's `seq`: a number, or the text `"x"` (the bad records' decode
/// reject, which only JSON can carry).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Seq {
    N(i64),
    Text,
}

impl Fields {
    /// The JSON value, byte for byte what the bench produced before
    /// `--format`, so the JSON figures stay comparable.
    pub(crate) fn json(&self) -> String {
        match self {
            Fields::Node { sku, seq, pad } => {
                format!("{}{pad}\"}}", node_head(sku, *seq))
            }
            Fields::Edge { src, dst, seq, pad } => {
                format!("{}{pad}\"}}", edge_head(src, dst, *seq))
            }
        }
    }
}

fn node_head(sku: &str, seq: Seq) -> String {
    let seq = match seq {
        Seq::N(n) => n.to_string(),
        Seq::Text => "\"x\"".to_string(),
    };
    format!("{{\"sku\":\"{sku}\",\"seq\":{seq},\"pad\":\"")
}

fn edge_head(src: &str, dst: &str, seq: i64) -> String {
    format!("{{\"src\":\"{src}\",\"dst\":\"{dst}\",\"seq\":{seq},\"pad\":\"")
}

/// Node record `n`'s key and fields. Keys are drawn pseudo-randomly from
/// the key space (a fixed-seed xorshift), so with `keys < records` the same
/// key is updated many times in random order, as in a real change stream.
pub(crate) fn node_fields(shape: Shape, seed: u64, n: u64) -> (String, Fields) {
    let sku = sku(shape, seed, n);
    let seq = match is_bad(shape, seed, n) {
        false => Seq::N(n as i64),
        true if n.is_multiple_of(2) => Seq::Text,
        true => Seq::N(-1),
    };
    let pad = pad_for(&node_head(&sku, seq), shape.value_bytes);
    (sku.clone(), Fields::Node { sku, seq, pad })
}

/// Node record `n`'s key and JSON value.
pub(crate) fn node_record(shape: Shape, seed: u64, n: u64) -> (String, String) {
    let (k, f) = node_fields(shape, seed, n);
    (k, f.json())
}

/// Whether node record `n` is one of the bad ones (`Shape::bad_fraction`).
pub(crate) fn is_bad(shape: Shape, seed: u64, n: u64) -> bool {
    let ppm = (shape.bad_fraction * 1e6).round() as u64;
    ppm > 0 && mix(seed ^ 0xbad, n) % 1_000_000 < ppm
}

/// Edge record `m`: the Kafka key is the edge id (drawn from the edge id
/// space, so ids are updated too), and both endpoints are skus of backlog
/// node records.
pub(crate) fn edge_fields(shape: Shape, seed: u64, m: u64) -> (String, Fields) {
    let id = format!("e{:010}", mix(seed ^ 0xed9e, m) % shape.edge_keys.max(1));
    let pool = shape.endpoints.max(1);
    let src = sku(shape, BACKLOG_SEED, mix(seed, 2 * m) % pool);
    let dst = sku(shape, BACKLOG_SEED, mix(seed, 2 * m + 1) % pool);
    let seq = m as i64;
    let pad = pad_for(&edge_head(&src, &dst, seq), shape.value_bytes);
    (id, Fields::Edge { src, dst, seq, pad })
}

/// Record `i` of a stream: its kind, key and fields.
pub(crate) fn record_fields(shape: Shape, seed: u64, i: u64) -> (Kind, String, Fields) {
    match kind_of(shape, i) {
        (Kind::Node, n) => {
            let (k, f) = node_fields(shape, seed, n);
            (Kind::Node, k, f)
        }
        (Kind::Edge, m) => {
            let (k, f) = edge_fields(shape, seed, m);
            (Kind::Edge, k, f)
        }
    }
}

/// Record `i` of a stream: its kind, key and JSON value.
pub(crate) fn record(shape: Shape, seed: u64, i: u64) -> (Kind, String, String) {
    let (kind, k, f) = record_fields(shape, seed, i);
    (kind, k, f.json())
}

/// Distinct node keys and edge ids among `records` backlog records: the
/// rows the graph must hold once they are all folded.
pub(crate) fn distinct_keys(shape: Shape, records: u64) -> (usize, usize) {
    let (mut nodes, mut edges) = (
        std::collections::HashSet::new(),
        std::collections::HashSet::new(),
    );
    for i in 0..records {
        if let (Kind::Node, n) = kind_of(shape, i) {
            if is_bad(shape, BACKLOG_SEED, n) {
                continue;
            }
        }
        match record(shape, BACKLOG_SEED, i) {
            (Kind::Node, k, _) => nodes.insert(k),
            (Kind::Edge, k, _) => edges.insert(k),
        };
    }
    (nodes.len(), edges.len())
}

/// The workload's topics: nodes, and edges when the mix has any. Offsets of
/// all of them are kept in one vector indexed by *slot* (topic index ×
/// partitions + partition), so every phase compares like with like.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Topics {
    pub nodes: String,
    pub edges: Option<String>,
    pub partitions: i32,
}

impl Topics {
    pub(crate) fn names(&self) -> Vec<&str> {
        std::iter::once(self.nodes.as_str())
            .chain(self.edges.as_deref())
            .collect()
    }

    pub(crate) fn of(&self, k: Kind) -> &str {
        match k {
            Kind::Node => &self.nodes,
            Kind::Edge => self.edges.as_deref().expect("edge topic in an edge mix"),
        }
    }

    pub(crate) fn slots(&self) -> usize {
        self.names().len() * self.partitions as usize
    }

    pub(crate) fn slot(&self, topic: &str, partition: i32) -> Option<usize> {
        let t = self.names().iter().position(|n| *n == topic)?;
        Some(t * self.partitions as usize + partition as usize)
    }

    /// (topic, partition) of a slot.
    pub(crate) fn at(&self, slot: usize) -> (&str, i32) {
        let p = self.partitions as usize;
        (self.names()[slot / p], (slot % p) as i32)
    }
}
