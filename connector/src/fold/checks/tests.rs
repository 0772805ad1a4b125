//! The graph checks without a broker and without Lance: small batches and
//! views built in memory, concrete rows and codes asserted.

use std::collections::{HashMap, HashSet};

use arrow::array::RecordBatch;
use serde_json::{json, Value};

use super::unique::Held;
use super::view::{Link, Pending};
use super::*;
use crate::config::{DeletePolicy, EndpointPolicy};
use crate::fold::policy::TypePolicy;
use crate::fold::read::Read;
use crate::rejects::RejectCode::{self, *};

const NOW: i64 = 1_000_000;

fn schema() -> GraphSchema {
    GraphSchema::parse(
        "node Person { name: String @key  email: String? @unique }\n\
         node Company { name: String @key }\n\
         edge WorksAt: Person -> Company @card(1..2)\n\
         edge Knows: Person -> Person",
        "t.pg",
    )
    .unwrap()
}

/// Rows of `ty` from JSON objects; provenance defaults to `t/0@<n>`, n the
/// row's position, unless a row sets `_src_offset`.
fn rows(schema: &GraphSchema, ty: &str, values: &[Value]) -> RecordBatch {
    let ty = schema.get(ty).unwrap();
    let filled: Vec<Value> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let mut v = v.clone();
            let o = v.as_object_mut().unwrap();
            o.entry("_src_topic").or_insert(json!("t"));
            o.entry("_src_partition").or_insert(json!(0));
            o.entry("_src_offset").or_insert(json!(i));
            v
        })
        .collect();
    let mut d = arrow_json::ReaderBuilder::new(ty.table_schema.clone())
        .build_decoder()
        .unwrap();
    d.serialize(&filled).unwrap();
    d.flush()
        .unwrap()
        .unwrap_or_else(|| RecordBatch::new_empty(ty.table_schema.clone()))
}

fn link(id: &str, src: &str, dst: &str) -> Link {
    Link {
        id: id.into(),
        src: src.into(),
        dst: dst.into(),
    }
}

fn ids(list: &[&str]) -> HashSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// One fold's inputs: what it read, the base view, the policies.
struct Fold {
    schema: GraphSchema,
    policies: Policies,
    read: ReadSet,
    view: BaseView,
    retry: Vec<String>,
}

impl Fold {
    fn new() -> Fold {
        Fold {
            schema: schema(),
            policies: Policies {
                max_pending_edges: 100,
                ..Default::default()
            },
            read: ReadSet::new(),
            view: BaseView::default(),
            retry: vec![],
        }
    }

    fn upserts(mut self, ty: &str, values: &[Value]) -> Fold {
        let b = rows(&self.schema, ty, values);
        let table = self.schema.get(ty).unwrap().table.clone();
        self.read.entry(table).or_default().upserts = Some(b);
        self
    }

    fn deletes(mut self, ty: &str, list: &[&str]) -> Fold {
        let table = self.schema.get(ty).unwrap().table.clone();
        let r: &mut Read = self.read.entry(table).or_default();
        r.deletes = list.iter().map(|s| s.to_string()).collect();
        self
    }

    fn nodes(mut self, ty: &str, list: &[&str]) -> Fold {
        let table = self.schema.get(ty).unwrap().table.clone();
        self.view
            .node_ids
            .entry(table)
            .or_default()
            .extend(ids(list));
        self
    }

    fn policy(mut self, ty: &str, p: TypePolicy) -> Fold {
        self.policies.types.insert(ty.into(), p);
        self
    }

    fn check(&self) -> Checked {
        check(&Ctx {
            schema: &self.schema,
            policies: &self.policies,
            now: NOW,
            retry_pending: &self.retry,
            read: &self.read,
            view: &self.view,
        })
        .unwrap()
    }
}

/// (table, id, code) of each rejection, in order.
fn refused(c: &Checked) -> Vec<(String, String, RejectCode)> {
    c.rejections
        .iter()
        .map(|r| (r.table.clone(), r.id().unwrap(), r.code))
        .collect()
}

fn r(table: &str, id: &str, code: RejectCode) -> (String, String, RejectCode) {
    (table.into(), id.into(), code)
}

fn upserted(c: &Checked, table: &str) -> HashSet<String> {
    crate::fold::rows::id_set(c.changes[table].upserts.as_ref()).unwrap()
}

fn edge(id: &str, src: &str, dst: &str, offset: i64) -> Value {
    json!({"id": id, "src": src, "dst": dst, "_src_offset": offset})
}

#[test]
fn card_max_keeps_the_earliest_and_does_not_recount_an_update() {
    let mut f = Fold::new()
        .nodes("Person", &["p1"])
        .nodes("Company", &["c1", "c2", "c3"])
        .upserts(
            "WorksAt",
            &[
                edge("e1", "p1", "c2", 5),
                edge("e2", "p1", "c3", 3),
                edge("e0", "p1", "c1", 9), // an update keeping its src
            ],
        );
    f.view
        .card
        .insert("edges/WorksAt".into(), vec![link("e0", "p1", "c1")].into());
    let c = f.check();
    assert_eq!(refused(&c), vec![r("edges/WorksAt", "e1", Cardinality)]);
    assert!(c.rejections[0]
        .message
        .starts_with("@card(1..2): src \"p1\" already has 2 edge(s)"));
    assert_eq!(upserted(&c, "edges/WorksAt"), ids(&["e0", "e2"]));
    assert_eq!(c.changes["edges/WorksAt"].rejected, 1);
}

#[test]
fn card_min_refuses_explicit_deletes_that_go_below_it() {
    let mut f = Fold::new().deletes("WorksAt", &["e0", "e1", "e2"]);
    f.view.card.insert(
        "edges/WorksAt".into(),
        vec![
            link("e0", "p1", "c1"),
            link("e1", "p2", "c1"),
            link("e2", "p2", "c2"),
        ]
        .into(),
    );
    let c = f.check();
    // p1 has one edge (the min); p2 has two, so one of them may go.
    assert_eq!(
        refused(&c),
        vec![
            r("edges/WorksAt", "e0", Cardinality),
            r("edges/WorksAt", "e2", Cardinality)
        ]
    );
    assert!(
        matches!(&c.rejections[0].refused, Refused::Delete { row, .. } if row == &json!({"id": "e0", "src": "p1"}))
    );
    assert_eq!(c.changes["edges/WorksAt"].deletes, vec!["e1".to_string()]);
}

#[test]
fn unique_exempts_nulls_and_the_earliest_claimant_wins() {
    let mut f = Fold::new().upserts(
        "Person",
        &[
            json!({"id": "a", "name": "a", "email": "x", "_src_offset": 7}),
            json!({"id": "b", "name": "b", "email": "x", "_src_offset": 2}),
            json!({"id": "c", "name": "c", "email": null}),
            json!({"id": "d", "name": "d", "email": null}),
            json!({"id": "e", "name": "e", "email": "held"}),
            json!({"id": "k", "name": "k", "email": "kk"}), // keeps its own tuple
            json!({"id": "u", "name": "u", "email": "w"}),  // gives up "y"
            json!({"id": "f", "name": "f", "email": "y"}),
        ],
    );
    let held = |tuple: &str, id: &str| Held {
        tuple: format!("[\"{tuple}\"]"),
        id: id.into(),
    };
    f.view.uniques.insert(
        "nodes/Person".into(),
        vec![vec![held("held", "z"), held("kk", "k"), held("y", "u")]],
    );
    let c = f.check();
    assert_eq!(
        refused(&c),
        vec![
            r("nodes/Person", "a", Unique),
            r("nodes/Person", "e", Unique)
        ]
    );
    assert_eq!(
        c.rejections[0].message,
        "@unique(email) = [\"x\"] is already held by Person \"b\""
    );
    assert_eq!(
        upserted(&c, "nodes/Person"),
        ids(&["b", "c", "d", "k", "u", "f"])
    );
}

#[test]
fn endpoints_must_exist_with_their_declared_types() {
    let f = Fold::new()
        .nodes("Person", &["p1", "p2", "p4"])
        .nodes("Company", &["c1"])
        .upserts("Person", &[json!({"id": "p3", "name": "p3"})])
        .deletes("Person", &["p4"])
        .upserts(
            "WorksAt",
            &[
                edge("w1", "p1", "c1", 0),
                edge("w2", "p1", "p2", 1), // p2 is a Person, not a Company
                edge("w3", "c1", "c1", 2), // c1 is a Company, not a Person
                edge("w4", "p3", "c1", 3), // p3 is added by this fold
                edge("w5", "p4", "c1", 4), // p4 is deleted by this fold
            ],
        )
        .policy(
            "WorksAt",
            TypePolicy {
                endpoint: EndpointPolicy::Reject,
                deadline_ms: 600_000,
                delete: DeletePolicy::Reject,
            },
        );
    let c = f.check();
    assert_eq!(
        refused(&c),
        vec![
            r("edges/WorksAt", "w2", EndpointNotFound),
            r("edges/WorksAt", "w3", EndpointNotFound),
            r("edges/WorksAt", "w5", EndpointNotFound),
        ]
    );
    assert!(
        c.rejections[0]
            .message
            .contains("dst Company \"p2\" not found"),
        "{}",
        c.rejections[0].message
    );
    assert!(c.rejections[1]
        .message
        .contains("src Person \"c1\" not found"));
    assert_eq!(upserted(&c, "edges/WorksAt"), ids(&["w1", "w4"]));
}

#[test]
fn a_referenced_delete_is_refused_under_reject() {
    let mut f = Fold::new()
        .deletes("Person", &["p1", "p5", "p6"])
        .deletes("Knows", &["k2"]);
    f.view.links.insert(
        "edges/Knows".into(),
        vec![link("k1", "p2", "p1"), link("k2", "p2", "p6")],
    );
    let c = f.check();
    // k2 goes in this fold, so p6 is free; p5 has no edge.
    assert_eq!(refused(&c), vec![r("nodes/Person", "p1", Referenced)]);
    assert!(c.rejections[0]
        .message
        .contains("1 committed edge(s) reference it (e.g. k1)"));
    assert_eq!(
        c.changes["nodes/Person"].deletes,
        vec!["p5".to_string(), "p6".to_string()]
    );
    assert_eq!(c.changes["edges/Knows"].deletes, vec!["k2".to_string()]);
}

#[test]
fn a_referenced_delete_cascades_under_cascade_even_below_card_min() {
    let mut f = Fold::new().deletes("Person", &["p1"]).policy(
        "Person",
        TypePolicy {
            delete: DeletePolicy::Cascade,
            deadline_ms: 600_000,
            ..Default::default()
        },
    );
    f.view
        .links
        .insert("edges/Knows".into(), vec![link("k1", "p2", "p1")]);
    f.view
        .links
        .insert("edges/WorksAt".into(), vec![link("e0", "p1", "c1")]);
    f.view
        .card
        .insert("edges/WorksAt".into(), vec![link("e0", "p1", "c1")].into());
    let c = f.check();
    assert_eq!(refused(&c), vec![]);
    assert_eq!(c.changes["nodes/Person"].deletes, vec!["p1".to_string()]);
    assert_eq!(c.changes["edges/Knows"].deletes, vec!["k1".to_string()]);
    assert_eq!(c.changes["edges/WorksAt"].deletes, vec!["e0".to_string()]);
}

fn pending(schema: &GraphSchema, values: &[Value], since: Vec<i64>) -> Pending {
    Pending {
        rows: rows(schema, "Knows", values),
        since,
    }
}

#[test]
fn pending_overflow_rejects_the_oldest_deferred_edges() {
    let mut f = Fold::new()
        .upserts(
            "Knows",
            &[edge("k_a", "x", "y", 0), edge("k_b", "x", "z", 1)],
        )
        .policy(
            "Knows",
            TypePolicy {
                deadline_ms: 600_000,
                ..Default::default()
            },
        );
    f.policies.max_pending_edges = 2;
    let old = pending(&f.schema, &[edge("k_old", "x", "q", 0)], vec![NOW - 1000]);
    f.view.pending.insert("edges/Knows".into(), old);
    let c = f.check();
    assert_eq!(
        refused(&c),
        vec![r("edges/Knows", "k_old", PendingOverflow)]
    );
    let rewrite = c.changes["_pending/Knows"].replace.as_ref().unwrap();
    assert_eq!(
        crate::fold::rows::id_set(Some(rewrite)).unwrap(),
        ids(&["k_a", "k_b"])
    );
    let since = crate::fold::rows::pending_since(rewrite).unwrap();
    assert_eq!(since.values().to_vec(), vec![NOW, NOW]);
    assert!(upserted(&c, "edges/Knows").is_empty());
}

#[test]
fn a_deferred_edge_past_its_deadline_is_rejected() {
    let mut f = Fold::new().policy(
        "Knows",
        TypePolicy {
            deadline_ms: 500,
            ..Default::default()
        },
    );
    f.retry = vec!["edges/Knows".into()];
    let old = pending(
        &f.schema,
        &[edge("late", "x", "q", 0), edge("young", "x", "q", 1)],
        vec![NOW - 500, NOW - 10],
    );
    f.view.pending.insert("edges/Knows".into(), old);
    let c = f.check();
    assert_eq!(
        refused(&c),
        vec![r("edges/Knows", "late", EndpointNotFound)]
    );
    assert!(c.rejections[0]
        .message
        .contains("endpoint_deadline of 500 ms"));
    let rewrite = c.changes["_pending/Knows"].replace.as_ref().unwrap();
    assert_eq!(
        crate::fold::rows::id_set(Some(rewrite)).unwrap(),
        ids(&["young"])
    );
}

#[test]
fn rejections_become_rejects_with_their_source_and_typed_code() {
    let f = Fold::new()
        .upserts("Knows", &[edge("k1", "x", "y", 41)])
        .policy(
            "Knows",
            TypePolicy {
                endpoint: EndpointPolicy::Reject,
                deadline_ms: 600_000,
                ..Default::default()
            },
        );
    let c = f.check();
    let rej = c.rejections[0].to_reject("c1", NOW).unwrap();
    assert_eq!(rej.code, EndpointNotFound);
    assert_eq!(
        (rej.topic.as_deref(), rej.partition, rej.offset),
        (Some("t"), Some(0), Some(41))
    );
    assert_eq!(rej.graph_commit.as_deref(), Some("c1"));
    // Deterministic ids: a rolled-forward fold rejects under the same id.
    assert_eq!(
        rej.reject_id,
        c.rejections[0].to_reject("c1", NOW + 1).unwrap().reject_id
    );
}

#[test]
fn tuples_are_json_arrays_of_canonical_strings() {
    let s = GraphSchema::parse("node T { k: String @key  a: String?  n: I32? }", "t.pg").unwrap();
    let b = rows(
        &s,
        "T",
        &[
            json!({"id": "1", "k": "1", "a": "x", "n": 7}),
            json!({"id": "2", "k": "2", "n": 8}),
        ],
    );
    assert_eq!(
        super::unique::tuples(&b, &["a", "n"]).unwrap(),
        vec![Some("[\"x\",\"7\"]".to_string()), None]
    );
    assert_eq!(
        super::unique::tuples(&b, &["n"]).unwrap(),
        vec![Some("[\"7\"]".to_string()), Some("[\"8\"]".to_string())]
    );
}

#[test]
fn a_missing_or_mistyped_column_is_corrupt_not_empty() {
    let s = schema();
    let b = rows(&s, "Person", &[json!({"id": "a", "name": "a"})]);
    let e = crate::fold::rows::str_at(&b, "nope", 0).unwrap_err();
    assert_eq!(e.kind(), crate::error::ErrorKind::Corrupt);
    let e = crate::fold::rows::str_at(&b, "_src_offset", 0).unwrap_err();
    assert_eq!(e.kind(), crate::error::ErrorKind::Corrupt);
    assert_eq!(crate::fold::rows::str_at(&b, "id", 0).unwrap(), "a");
}

fn commit(id: &str) -> crate::graph::GraphCommit {
    crate::graph::GraphCommit {
        id: id.into(),
        seq: 2,
        parent: Some("p".into()),
        actor: "other".into(),
        created_at: 0,
        tables: Default::default(),
        folded: vec![],
        offsets: vec![],
        stats: Default::default(),
        dead_letters_delivered: 0,
        folder: None,
        dead_letter_since: Default::default(),
        schema_version: 0,
        schema_change: None,
    }
}

/// A publish that finds the head moved rebases only when the checks,
/// re-run against the new head, decide the same.
#[test]
fn a_moved_head_rebases_only_if_the_recheck_agrees() {
    let f = Fold::new()
        .nodes("Person", &["p1", "p2"])
        .upserts("Knows", &[edge("k1", "p1", "p2", 0)]);
    let before = f.check().decision().unwrap();
    // The new head kept both people: same decision, rebase.
    let same = f.check().decision().unwrap();
    crate::fold::rebase("parent", &commit("moved"), &before, &same).unwrap();
    // The new head deleted p2: k1 would now wait for its endpoint.
    let mut f = f;
    f.view.node_ids = HashMap::from([("nodes/Person".to_string(), ids(&["p1"]))]);
    let after = f.check().decision().unwrap();
    assert_ne!(before, after);
    let e = crate::fold::rebase("parent", &commit("moved"), &before, &after).unwrap_err();
    assert!(
        matches!(&e, crate::error::Error::CommitConflict { expected, found } if expected == "parent" && found == "moved"),
        "{e}"
    );
}

#[test]
fn a_row_off_its_committed_partition_is_a_shard_conflict_and_the_rest_go_on() {
    // p1 and p2 were committed from partitions 1 and 2; p3 is new.
    let mut f = Fold::new().upserts(
        "Person",
        &[
            json!({"id": "p1", "name": "p1", "_src_partition": 3}),
            json!({"id": "p2", "name": "p2", "_src_partition": 2}),
            json!({"id": "p3", "name": "p3", "_src_partition": 0}),
        ],
    );
    let table = "nodes/Person".to_string();
    {
        let r = f.read.get_mut(&table).unwrap();
        r.deletes = vec!["p4".into(), "p5".into()];
        r.delete_shards = vec![1, 0];
    }
    f.view.homes.insert(
        table.clone(),
        HashMap::from([
            ("p1".to_string(), 1),
            ("p2".to_string(), 2),
            ("p4".to_string(), 1),
            ("p5".to_string(), 2),
        ]),
    );
    let c = f.check();
    assert_eq!(
        refused(&c),
        [
            r("nodes/Person", "p1", ShardConflict),
            r("nodes/Person", "p5", ShardConflict)
        ]
    );
    let change = &c.changes[&table];
    let kept: Vec<String> = crate::fold::rows::id_set(change.upserts.as_ref())
        .unwrap()
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(kept, ["p2", "p3"]);
    assert_eq!(change.deletes, ["p4"]);
    assert_eq!(change.rejected, 2);
    assert!(c.rejections[0]
        .message
        .contains("partition 1 and this row from partition 3"));
    // Without homes (bucket sharding) nothing is refused.
    f.view.homes.clear();
    assert!(refused(&f.check()).is_empty());
}

#[test]
fn refused_deletes_of_one_id_from_two_partitions_are_two_rejects() {
    // p1's row from partition 0 is kept; its deletes from partitions 1 and
    // 2 in the same fold are both shard conflicts.
    let mut f = Fold::new().upserts(
        "Person",
        &[json!({"id": "p1", "name": "p1", "_src_partition": 0})],
    );
    let table = "nodes/Person".to_string();
    f.read.get_mut(&table).unwrap().conflicts.deletes =
        vec![("p1".to_string(), 1), ("p1".to_string(), 2)];
    let c = f.check();
    assert_eq!(
        refused(&c),
        [
            r("nodes/Person", "p1", ShardConflict),
            r("nodes/Person", "p1", ShardConflict)
        ]
    );
    let ids: Vec<String> = c
        .rejections
        .iter()
        .map(|r| r.to_reject("c1", NOW).unwrap().reject_id)
        .collect();
    assert_ne!(
        ids[0], ids[1],
        "deletes carry no offset: the partition must tell them apart"
    );
    // The same fold checked again gives the same ids (a rolled-forward fold).
    let again: Vec<String> = f
        .check()
        .rejections
        .iter()
        .map(|r| r.to_reject("c1", NOW).unwrap().reject_id)
        .collect();
    assert_eq!(ids, again);
}

#[test]
fn the_row_from_an_ids_committed_partition_stays_when_a_fold_reads_it_from_several() {
    // p1 was committed from partition 2, p4 from 1, p5 from 2. The read
    // kept each id's lowest partition and handed the rest over as conflicts.
    let mut f = Fold::new().upserts(
        "Person",
        &[
            json!({"id": "p1", "name": "p1", "email": "stray", "_src_partition": 0}),
            json!({"id": "p5", "name": "p5", "email": "p5", "_src_partition": 0}),
        ],
    );
    let table = "nodes/Person".to_string();
    {
        let conflicts = rows(
            &f.schema,
            "Person",
            &[
                json!({"id": "p1", "name": "p1", "email": "other", "_src_partition": 1}),
                json!({"id": "p1", "name": "p1", "email": "home", "_src_partition": 2}),
                json!({"id": "p6", "name": "p6", "email": "p6", "_src_partition": 3}),
            ],
        );
        let r = f.read.get_mut(&table).unwrap();
        r.conflicts.upserts = Some(conflicts);
        r.deletes = vec!["p4".into(), "p6".into()];
        r.delete_shards = vec![0, 1];
        r.conflicts.deletes = vec![("p4".into(), 1), ("p5".into(), 2)];
    }
    f.view.homes.insert(
        table.clone(),
        HashMap::from([
            ("p1".to_string(), 2),
            ("p4".to_string(), 1),
            ("p5".to_string(), 2),
            ("p6".to_string(), 3),
        ]),
    );
    let c = f.check();
    let change = &c.changes[&table];
    // p1's and p6's updates from home go on; p4's and p5's deletes too.
    let kept = change
        .upserts
        .as_ref()
        .expect("p1's and p6's rows from home");
    let emails: std::collections::BTreeMap<String, String> = (0..kept.num_rows())
        .map(|i| {
            let id = crate::fold::rows::str_at(kept, ID, i).unwrap();
            (id, crate::fold::rows::str_at(kept, "email", i).unwrap())
        })
        .collect();
    assert_eq!(
        emails,
        [("p1".into(), "home".into()), ("p6".into(), "p6".into())].into()
    );
    let mut deletes = change.deletes.clone();
    deletes.sort();
    assert_eq!(deletes, ["p4", "p5"]);
    // Only the rows from other partitions are refused.
    let mut why: Vec<(String, String)> = c
        .rejections
        .iter()
        .map(|r| {
            assert_eq!(r.code, ShardConflict);
            let row = r.to_reject("c1", NOW).unwrap().row.unwrap_or_default();
            (r.id().unwrap(), row)
        })
        .collect();
    why.sort();
    assert_eq!(why.len(), 5, "{why:?}");
    let at = |k: usize, id: &str, has: &str| {
        assert!(why[k].0 == id && why[k].1.contains(has), "{k}: {why:?}")
    };
    at(0, "p1", "\"other\"");
    at(1, "p1", "\"stray\"");
    at(2, "p4", "\"_src_partition\":0");
    at(3, "p5", "\"email\":\"p5\"");
    at(4, "p6", "\"_src_partition\":1");
    assert_eq!(change.rejected, 5);
    assert!(c.rejections.iter().all(|r| !r.message.contains("lower")));
}

#[test]
fn a_recheck_that_keeps_another_partitions_row_is_another_decision() {
    // p1 read from partitions 0 and 2. New at the parent, the lowest
    // partition's row is kept; at a head where p1's home is 2, partition
    // 2's. Same ids written and refused, different rows: a rebase must
    // not take one for the other.
    let mut f = Fold::new().upserts(
        "Person",
        &[json!({"id": "p1", "name": "p1", "email": "low", "_src_partition": 0})],
    );
    let table = "nodes/Person".to_string();
    f.read.get_mut(&table).unwrap().conflicts.upserts = Some(rows(
        &f.schema,
        "Person",
        &[json!({"id": "p1", "name": "p1", "email": "home", "_src_partition": 2})],
    ));
    let at_parent = f.check().decision().unwrap();
    f.view
        .homes
        .insert(table, HashMap::from([("p1".to_string(), 2)]));
    let at_head = f.check().decision().unwrap();
    assert_ne!(at_parent, at_head);
    assert_eq!(at_head, f.check().decision().unwrap());
}
