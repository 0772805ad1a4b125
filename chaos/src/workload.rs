//! The workload: a seeded stream of node records, edge records whose
//! endpoints may arrive later (deferred), tombstones, edges that can never
//! resolve (fold rejects) and a share of bad records (sync rejects). Each
//! record carries a `chaos.expect` header saying what must become of it;
//! graphsink never reads headers, and the checker reads only Kafka and the
//! graph, so the expectation travels with the stream itself.
//!
//! The id spaces keep the expected graph independent of fold timing:
//! edge endpoints come only from `stable` nodes, which are never deleted
//! (so no delete is refused as `referenced`), tombstones hit only
//! `volatile` nodes, and `Dangle` edges point at `ghost` ids that are never
//! produced, so each is one `endpoint_not_found` fold reject whenever it is
//! folded.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

pub(crate) const SCHEMA: &str = "\
// graphsink-chaos: nodes, edges whose endpoints may come later, and
// edges that can never resolve.
node Item {
    id: String @key
    name: String
    qty: I32
    @range(qty, 0..1000000)
}
edge Link: Item -> Item { w: I32? }
edge Dangle: Item -> Item
";

/// The topics of one phase and their partition counts.
#[derive(Debug, Clone)]
pub(crate) struct Topics {
    pub items: String,
    pub links: String,
    pub dangles: String,
    pub dead_letters: String,
}

pub(crate) const ITEM_PARTITIONS: i32 = 4;
pub(crate) const LINK_PARTITIONS: i32 = 2;
pub(crate) const DANGLE_PARTITIONS: i32 = 1;

impl Topics {
    pub(crate) fn new(prefix: &str) -> Topics {
        Topics {
            items: format!("{prefix}-items"),
            links: format!("{prefix}-links"),
            dangles: format!("{prefix}-dangles"),
            dead_letters: format!("{prefix}-dead-letters"),
        }
    }

    /// The mapped topics with their partition counts.
    pub(crate) fn mapped(&self) -> [(&str, i32); 3] {
        [
            (&self.items, ITEM_PARTITIONS),
            (&self.links, LINK_PARTITIONS),
            (&self.dangles, DANGLE_PARTITIONS),
        ]
    }
}

/// Header naming what must become of a record: `ok`, `reject:<code>` (a
/// sync reject) or `fold:<code>` (a fold reject).
pub(crate) const EXPECT: &str = "chaos.expect";

/// One record to produce. The partition is chosen here (a hash of the
/// key), so a key always lands on one partition whatever the client's
/// partitioner.
#[derive(Debug, Clone)]
pub(crate) struct Out {
    pub topic: String,
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub expect: String,
}

const STABLE: u64 = 300;
const VOLATILE: u64 = 200;
const EDGES: u64 = 400;

pub(crate) struct Generator {
    rng: StdRng,
    seq: u64,
    topics: Topics,
    bad_percent: u32,
}

impl Generator {
    pub(crate) fn new(seed: u64, topics: Topics, bad_percent: u32) -> Generator {
        Generator {
            rng: StdRng::seed_from_u64(seed),
            seq: 0,
            topics,
            bad_percent,
        }
    }

    /// The next record of the stream.
    pub(crate) fn next(&mut self) -> Out {
        self.seq += 1;
        if self.rng.random_range(0..100) < self.bad_percent {
            return self.bad();
        }
        match self.rng.random_range(0..100) {
            0..48 => {
                let id = if self.rng.random_bool(0.5) {
                    self.stable()
                } else {
                    format!("v{}", self.rng.random_range(0..VOLATILE))
                };
                self.item(id)
            }
            48..57 => {
                let id = format!("v{}", self.rng.random_range(0..VOLATILE));
                self.out_items(Some(id), None, "ok")
            }
            57..89 => {
                let id = format!("e{}", self.rng.random_range(0..EDGES));
                let v = json!({"src": self.stable(), "dst": self.stable(), "w": self.seq as i32});
                self.out_links(Some(id), Some(v.to_string().into_bytes()), "ok")
            }
            89..95 => {
                let id = format!("e{}", self.rng.random_range(0..EDGES));
                self.out_links(Some(id), None, "ok")
            }
            _ => {
                let v = json!({"src": format!("g{}", self.seq), "dst": self.stable()});
                let key = format!("d{}", self.seq);
                let topic = self.topics.dangles.clone();
                Out {
                    partition: 0,
                    topic,
                    key: Some(key.into_bytes()),
                    value: Some(v.to_string().into_bytes()),
                    expect: "fold:endpoint_not_found".into(),
                }
            }
        }
    }

    /// One fresh value for every stable node: produced last, so every edge
    /// endpoint exists by the end and no edge stays deferred.
    pub(crate) fn closing(&mut self) -> Vec<Out> {
        (0..STABLE)
            .map(|i| {
                self.seq += 1;
                self.item(format!("s{i}"))
            })
            .collect()
    }

    fn stable(&mut self) -> String {
        format!("s{}", self.rng.random_range(0..STABLE))
    }

    fn item(&mut self, id: String) -> Out {
        let v = json!({"name": format!("n{}", self.seq), "qty": (self.seq % 1_000_000) as i32});
        self.out_items(Some(id), Some(v.to_string().into_bytes()), "ok")
    }

    fn out_items(&self, key: Option<String>, value: Option<Vec<u8>>, expect: &str) -> Out {
        let partition = key
            .as_deref()
            .map_or(0, |k| partition_of(k, ITEM_PARTITIONS));
        Out {
            topic: self.topics.items.clone(),
            partition,
            key: key.map(String::into_bytes),
            value,
            expect: expect.into(),
        }
    }

    fn out_links(&self, key: Option<String>, value: Option<Vec<u8>>, expect: &str) -> Out {
        let partition = key
            .as_deref()
            .map_or(0, |k| partition_of(k, LINK_PARTITIONS));
        Out {
            topic: self.topics.links.clone(),
            partition,
            key: key.map(String::into_bytes),
            value,
            expect: expect.into(),
        }
    }

    /// A bad record: mixed decode and validate codes, on nodes and edges,
    /// half of them under the key of a real node (a rejected update must
    /// leave the earlier accepted value standing).
    fn bad(&mut self) -> Out {
        let id = if self.rng.random_bool(0.5) {
            format!("v{}", self.rng.random_range(0..VOLATILE))
        } else {
            format!("bad{}", self.seq)
        };
        let edge = format!("e{}", self.rng.random_range(0..EDGES));
        let obj = |v: serde_json::Value| Some(v.to_string().into_bytes());
        let (node, value, code): (bool, Option<Vec<u8>>, &str) = match self.rng.random_range(0..12)
        {
            0 => (
                true,
                Some(br#"{"name": "x", "qty": 1"#.to_vec()),
                "malformed_json",
            ),
            1 => (true, obj(json!({"name": "x", "qty": "x"})), "wrong_type"),
            2 => (
                true,
                obj(json!({"name": "x", "qty": 1, "zzz": 1})),
                "unknown_field",
            ),
            3 => (true, obj(json!({"name": "x", "qty": -5})), "range"),
            4 => (true, obj(json!({"qty": 1})), "missing_required"),
            5 => (true, Some(b"[1, 2]".to_vec()), "not_an_object"),
            6 => (true, Some(vec![0xff, 0xfe, b'{']), "not_utf8"),
            7 => (
                true,
                obj(json!({"name": "x", "qty": 9_999_999_999u64})),
                "overflow",
            ),
            8 => (true, obj(json!({"name": "x", "qty": 3.5})), "wrong_type"),
            9 => (false, obj(json!({"dst": "s1", "w": 1})), "missing_endpoint"),
            10 => (
                false,
                obj(json!({"src": "s1", "dst": "s2", "w": "x"})),
                "wrong_type",
            ),
            _ => (false, Some(b"{".to_vec()), "malformed_json"),
        };
        let expect = format!("reject:{code}");
        if node {
            self.out_items(Some(id), value, &expect)
        } else {
            self.out_links(Some(edge), value, &expect)
        }
    }
}

/// FNV-1a of the key, mod the partition count.
pub(crate) fn partition_of(key: &str, partitions: i32) -> i32 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in key.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    (h % partitions as u64) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_the_same_stream() {
        let t = Topics::new("p");
        let mut a = Generator::new(7, t.clone(), 10);
        let mut b = Generator::new(7, t, 10);
        for _ in 0..1000 {
            let (x, y) = (a.next(), b.next());
            assert_eq!((x.key, x.value, x.partition), (y.key, y.value, y.partition));
        }
    }

    #[test]
    fn every_kind_is_produced() {
        let mut g = Generator::new(1, Topics::new("p"), 10);
        let recs: Vec<Out> = (0..5000).map(|_| g.next()).collect();
        for want in [
            "ok",
            "fold:endpoint_not_found",
            "reject:not_utf8",
            "reject:range",
        ] {
            assert!(recs.iter().any(|r| r.expect == want), "{want}");
        }
        assert!(recs
            .iter()
            .any(|r| r.value.is_none() && r.topic.ends_with("links")));
    }
}
