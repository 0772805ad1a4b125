//! Change streams end to end: Debezium events through the real broker into
//! the graph, read back by pylance. The shop example (schemas/shop.pg,
//! schemas/shop.toml, schemas/sample/shop/) runs as users run it, with the
//! example's own mappings; its events follow the shapes of Debezium's
//! PostgreSQL connector documentation (postgresql.adoc: create, update,
//! delete and tombstone events; the JSON converter with and without
//! `schemas.enable`). Avro envelopes are framed by Confluent's own
//! serializer against the real registry (sr_encode.py).

use std::collections::BTreeMap;
use std::time::Duration;

use arrow::array::Array;
use serde_json::{json, Value};

use crate::harness::*;

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
const SHOP_TABLES: [&str; 4] = ["customers", "products", "orders", "order_lines"];

/// The shop example's `[[mapping]]` bodies, without their `topic` lines,
/// in `SHOP_TABLES` order; `edit` may change each. `[mapping.fields]`
/// becomes an inline `fields = { … }`, so the harness may add keys after.
fn shop_mappings(edit: impl Fn(&str) -> String) -> Vec<String> {
    let toml = std::fs::read_to_string(format!("{REPO}/schemas/shop.toml")).unwrap();
    let body = toml.split("[errors]").next().unwrap();
    body.split("[[mapping]]")
        .skip(1)
        .map(|m| {
            let lines = m
                .lines()
                .filter(|l| !l.starts_with("topic") && !l.starts_with('#') && !l.trim().is_empty());
            let (mut keys, mut fields) = (Vec::new(), Vec::new());
            let mut in_fields = false;
            for l in lines {
                if l.trim() == "[mapping.fields]" {
                    in_fields = true;
                } else if in_fields {
                    fields.push(l.trim());
                } else {
                    keys.push(l.to_string());
                }
            }
            if !fields.is_empty() {
                keys.push(format!("fields = {{ {} }}", fields.join(", ")));
            }
            edit(&keys.join("\n"))
        })
        .collect()
}

fn shop_graph(backend: Backend, edit: impl Fn(&str) -> String) -> TestGraph {
    let schema = std::fs::read_to_string(format!("{REPO}/schemas/shop.pg")).unwrap();
    let mappings = shop_mappings(edit);
    let refs: Vec<&str> = mappings.iter().map(String::as_str).collect();
    TestGraph::on(backend, &schema, &refs, "[errors]\ntolerance = \"all\"")
}

/// A sample file's records (`{"key", "value"}` lines, a null value a
/// tombstone), each key on the partition its text picks of 2, as a
/// producer's partitioner keeps one key on one partition.
fn sample(file: &str) -> Vec<RawRec> {
    let text = std::fs::read_to_string(format!("{REPO}/schemas/sample/shop/{file}.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let line: Value = serde_json::from_str(l).unwrap();
            let key = line["key"].to_string();
            let partition = (key.bytes().map(u32::from).sum::<u32>() % 2) as i32;
            RawRec {
                partition,
                key: Some(key.into_bytes()),
                value: (!line["value"].is_null()).then(|| line["value"].to_string().into_bytes()),
                headers: vec![],
            }
        })
        .collect()
}

async fn produce_phase(tg: &TestGraph, suffix: &str) {
    for (t, topic) in SHOP_TABLES.iter().zip(&tg.topics) {
        if suffix.is_empty() || *t != "orders" {
            produce_raw(topic, &sample(&format!("{t}{suffix}"))).await;
        }
    }
}

async fn create_shop_topics(tg: &TestGraph) {
    for t in &tg.topics {
        create_topic(t, 2).await;
    }
}

/// Each row of `table` at the head, by id, with only `columns`.
async fn table(tg: &TestGraph, table: &str, columns: &[&str]) -> BTreeMap<String, Value> {
    let g = tg.graph().await;
    let version = g.head().await.unwrap().tables[table];
    pylance_rows_at(&g, table, version)
        .into_iter()
        .map(|(id, row)| {
            let kept: serde_json::Map<String, Value> = columns
                .iter()
                .map(|c| (c.to_string(), row[*c].clone()))
                .collect();
            (id, Value::Object(kept))
        })
        .collect()
}

/// The shop after every sample event; `cascade`: products deleted with the
/// edges that reference them.
async fn assert_shop(tg: &TestGraph, cascade: bool) {
    let customers = table(tg, "nodes/Customer", &["name", "city", "since"]).await;
    let row = |name: &str, city: &str, day: &str| json!({"name": name, "city": city, "since": day});
    assert_eq!(
        customers,
        BTreeMap::from([
            ("1".into(), row("Ada Lovelace", "London", "2023-12-01")),
            ("2".into(), row("Grace Hopper", "New York", "2023-12-02")),
            ("4".into(), row("Edsger Dijkstra", "Nuenen", "2024-12-06")),
        ]),
        "customers: snapshot reads, an insert, an update (before = the key only), a delete"
    );
    // pyarrow shows a DateTime (Date64) as its date; the milliseconds, from
    // the MicroTimestamp floored, through plain Lance.
    assert_eq!(
        since_millis(tg, "nodes/Customer", "since").await,
        BTreeMap::from([
            ("1".into(), Some(1_701_388_800_123)),
            ("2".into(), Some(1_701_475_200_000)),
            ("4".into(), Some(1_733_500_000_000)),
        ])
    );
    let products = table(tg, "nodes/Product", &["title", "price"]).await;
    let mut want = BTreeMap::from([
        (
            "p-1".to_string(),
            json!({"title": "Keyboard", "price": "44.90"}),
        ),
        (
            "p-2".to_string(),
            json!({"title": "Mouse", "price": "19.50"}),
        ),
        (
            "p-3".to_string(),
            json!({"title": "USB cable", "price": "5.00"}),
        ),
        (
            "p-4".to_string(),
            json!({"title": "Monitor", "price": "189.00"}),
        ),
    ]);
    if cascade {
        want.remove("p-3");
    }
    assert_eq!(products, want, "products: Decimal prices as exact text");
    let orders = table(tg, "nodes/Order", &["customer", "ships"]).await;
    assert_eq!(
        orders,
        BTreeMap::from([
            ("100".into(), json!({"customer": 1, "ships": null})),
            ("101".into(), json!({"customer": 2, "ships": "2024-12-11"})),
        ]),
        "orders: a foreign key as a property, epoch days as a Date"
    );
    assert_eq!(
        since_millis(tg, "nodes/Order", "placed").await,
        BTreeMap::from([
            ("100".into(), Some(1_733_000_000_000)),
            ("101".into(), Some(1_733_500_000_000)),
        ])
    );
    let lines = table(tg, "edges/Contains", &["src", "dst", "quantity"]).await;
    let mut want = BTreeMap::from([
        (
            r#"["100","p-3"]"#.to_string(),
            json!({"src": "100", "dst": "p-3", "quantity": 2}),
        ),
        (
            r#"["101","p-2"]"#.to_string(),
            json!({"src": "101", "dst": "p-2", "quantity": 4}),
        ),
    ]);
    if cascade {
        want.remove(r#"["100","p-3"]"#);
    }
    assert_eq!(
        lines, want,
        "order lines: the join table's rows as edges, one deleted"
    );
}

/// A DateTime column's milliseconds by id, at the head, read by plain
/// Lance.
async fn since_millis(tg: &TestGraph, table: &str, column: &str) -> BTreeMap<String, Option<i64>> {
    let g = tg.graph().await;
    let version = g.head().await.unwrap().tables[table];
    let ds = plain_open(&g, table)
        .await
        .checkout_version(version)
        .await
        .unwrap();
    let batch = ds.scan().try_into_batch().await.unwrap();
    let ids = batch.column_by_name("id").unwrap();
    let ids = arrow::array::AsArray::as_string::<i32>(ids);
    let ms = arrow::compute::cast(
        batch.column_by_name(column).unwrap(),
        &arrow::datatypes::DataType::Int64,
    )
    .unwrap();
    let ms = arrow::array::AsArray::as_primitive::<arrow::datatypes::Int64Type>(&ms);
    (0..batch.num_rows())
        .map(|i| {
            (
                ids.value(i).to_string(),
                ms.is_valid(i).then(|| ms.value(i)),
            )
        })
        .collect()
}

/// The codes and messages of the rejects at the head, in offset order.
async fn rejects(tg: &TestGraph) -> Vec<(String, String)> {
    let mut r: Vec<(i64, String, String)> = rejects_at_head(tg)
        .await
        .into_iter()
        .map(|r| {
            (
                r["offset"].as_i64().unwrap_or(-1),
                r["code"].as_str().unwrap().to_string(),
                r["message"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    r.sort();
    r.into_iter().map(|(_, c, m)| (c, m)).collect()
}

async fn the_shop_example_lands_with_its_deletes(backend: Backend) {
    crate::init_logs();
    let tg = shop_graph(backend, str::to_string);
    create_shop_topics(&tg).await;
    produce_phase(&tg, "").await;
    try_run_to_end(&tg).await.expect("run");
    produce_phase(&tg, "-deletes").await;
    try_run_to_end(&tg).await.expect("run the deletes");
    assert_shop(&tg, false).await;
    // Under on_delete_referenced = "reject", the referenced product stays,
    // and its delete is one reject (its tombstone: none), in both sinks.
    let r = rejects(&tg).await;
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].0, "referenced");
    assert!(r[0].1.contains("p-3"), "{}", r[0].1);
    let dlq = read_topic_to_end(&tg.dlq, "read_committed");
    assert_eq!(dlq.len(), 1);
    // A fold reject of a delete has no source coordinates (docs/rejects.md).
    assert_eq!(
        dlq[0].header("graphsink.code").as_deref(),
        Some("referenced")
    );
    assert_eq!(dlq[0].header("graphsink.type").as_deref(), Some("Product"));
}
crate::on_every_backend!(the_shop_example_lands_with_its_deletes);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_referenced_delete_under_cascade_takes_its_edges() {
    crate::init_logs();
    let tg = shop_graph(Backend::Local, |m| {
        m.replace(
            "on_delete_referenced = \"reject\"",
            "on_delete_referenced = \"cascade\"",
        )
    });
    create_shop_topics(&tg).await;
    produce_phase(&tg, "").await;
    try_run_to_end(&tg).await.expect("run");
    produce_phase(&tg, "-deletes").await;
    try_run_to_end(&tg).await.expect("run the deletes");
    assert_shop(&tg, true).await;
    assert_eq!(rejects(&tg).await, vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_after_kill_9_and_from_the_start_changes_nothing() {
    crate::init_logs();
    let tg = shop_graph(Backend::Local, |m| format!("{m}\n"));
    create_shop_topics(&tg).await;
    produce_phase(&tg, "").await;
    try_run_to_end(&tg).await.expect("run");
    // The deletes, acknowledged by a process killed before it folds them.
    produce_phase(&tg, "-deletes").await;
    let mut child = tg.spawn_run();
    // Every partition that holds records (a partition without any has no
    // committed offset).
    wait_until("acked", Duration::from_secs(60), || {
        tg.topics.iter().all(|t| {
            let done = committed(&tg.group, t, 2);
            end_offsets(t, 2)
                .iter()
                .all(|(p, end)| *end == 0 || done.get(p) == Some(end))
        })
    })
    .await;
    child.kill().expect("kill -9");
    child.wait().unwrap();
    // As in recovery's kill -9 test: the dead member's session expires first.
    wait_for_no_members(&tg.group).await;
    try_run_to_end(&tg).await.expect("run after the kill");
    assert_shop(&tg, false).await;
    // Every event again, from offset 0, in one pass: upserts and deletes
    // are idempotent, and one key's events keep their order, so the graph
    // lands where it was (the referenced product's delete is refused
    // again: its edge is committed now).
    for t in &tg.topics {
        reset_group(&tg.group, t, 2);
    }
    try_run_to_end(&tg).await.expect("replay from the start");
    assert_shop(&tg, false).await;
    let codes: Vec<String> = rejects(&tg).await.into_iter().map(|(c, _)| c).collect();
    assert_eq!(codes, ["referenced", "referenced"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_stream_reject_lands_in_both_sinks() {
    crate::init_logs();
    let tg = shop_graph(Backend::Local, str::to_string);
    create_shop_topics(&tg).await;
    let customers = &tg.topics[0];
    let src = r#""source":{"connector":"postgresql","lsn":1,"ts_ms":1}"#;
    let bad = [
        (
            r#"{"id":7}"#,
            format!(r#"{{"before":null,"after":null,{src},"op":"c"}}"#),
        ),
        (
            r#"{"id":7}"#,
            format!(r#"{{"before":{{"id":7}},"after":null,{src},"op":"x"}}"#),
        ),
        (
            "",
            format!(r#"{{"before":null,"after":null,{src},"op":"t"}}"#),
        ),
        (
            "",
            format!(r#"{{"before":null,"after":null,{src},"op":"d"}}"#),
        ),
        (
            r#"{"id":8}"#,
            format!(
                r#"{{"before":null,"after":{{"id":8,"full_name":"X","created_at":"soon"}},{src},"op":"c"}}"#
            ),
        ),
    ];
    let recs: Vec<RawRec> = bad
        .iter()
        .map(|(k, v)| RawRec {
            partition: 0,
            key: (!k.is_empty()).then(|| k.as_bytes().to_vec()),
            value: Some(v.clone().into_bytes()),
            headers: vec![],
        })
        .collect();
    produce_raw(customers, &recs).await;
    try_run_to_end(&tg).await.expect("run");
    let r = rejects(&tg).await;
    let codes: Vec<&str> = r.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(
        codes,
        [
            "missing_after",
            "unknown_op",
            "unsupported_op",
            "missing_before",
            "wrong_type"
        ]
    );
    assert!(r[4].1.contains("/created_at"), "names the path: {}", r[4].1);
    let dlq = read_topic_to_end(&tg.dlq, "read_committed");
    let mut dl: Vec<(String, String)> = dlq
        .iter()
        .map(|m| {
            (
                m.header("__connect.errors.offset").unwrap(),
                m.header("__connect.errors.exception.message")
                    .unwrap_or_default(),
            )
        })
        .collect();
    dl.sort();
    assert_eq!(dl.len(), 5, "{dl:?}");
    // The dead letter is the event as it came.
    assert_eq!(
        dlq.iter()
            .filter(|m| m.value.as_deref() == Some(bad[3].1.as_bytes()))
            .count(),
        1
    );
}

/// Debezium's Avro envelope as Confluent's AvroConverter registers it for
/// `customers` (see decode/tests/avro.rs): `before`/`after` are
/// `["null", Value]`, Connect's types live in `connect.name`.
const ENVELOPE: &str = r#"{"type":"record","name":"Envelope","namespace":"shop.public.customers",
 "connect.name":"shop.public.customers.Envelope","fields":[
 {"name":"before","default":null,"type":["null",{"type":"record","name":"Value",
   "connect.name":"shop.public.customers.Value","fields":[
   {"name":"id","type":"int"},{"name":"full_name","type":"string"},
   {"name":"email","type":["null","string"],"default":null},
   {"name":"city","type":["null","string"],"default":null},
   {"name":"created_at","type":["null",{"type":"long","connect.version":1,"connect.name":"io.debezium.time.MicroTimestamp"}],"default":null}]}]},
 {"name":"after","default":null,"type":["null","Value"]},
 {"name":"source","type":{"type":"record","name":"Source","namespace":"io.debezium.connector.postgresql",
   "fields":[{"name":"connector","type":"string"},{"name":"ts_ms","type":"long"},
   {"name":"lsn","type":["null","long"],"default":null}]}},
 {"name":"op","type":"string"},
 {"name":"ts_ms","type":["null","long"],"default":null}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_avro_envelopes_from_confluents_serializer_land() {
    crate::init_logs();
    let registry = crate::formats::apicurio();
    let tg = shop_graph(Backend::Local, |m| {
        if m.contains("node = \"Customer\"") {
            format!("format = \"avro\"\n{m}")
        } else {
            m.to_string()
        }
    });
    let config = std::fs::read_to_string(tg.config_path()).unwrap();
    std::fs::write(
        tg.config_path(),
        format!("{config}\n{}", crate::formats::registry_toml(&registry)),
    )
    .unwrap();
    create_shop_topics(&tg).await;
    let src = json!({"connector": "postgresql", "ts_ms": 1, "lsn": 24023128});
    let row = |id: i64, name: &str| json!({"id": id, "full_name": name, "email": null, "city": "Oslo", "created_at": 1559033904863123i64});
    let events = [
        json!({"before": null, "after": row(1, "Ann"), "source": src, "op": "r", "ts_ms": 1}),
        json!({"before": null, "after": row(2, "Bo"), "source": src, "op": "c", "ts_ms": 2}),
        json!({"before": row(2, "Bo"), "after": null, "source": src, "op": "d", "ts_ms": 3}),
        json!({"before": null, "after": null, "source": src, "op": "u", "ts_ms": 4}),
    ];
    let encoded = crate::formats::encode(&registry, &tg.topics[0], ENVELOPE, &events);
    let recs: Vec<RawRec> = encoded
        .iter()
        .zip(["1", "2", "2", "3"])
        .map(|((v, _), k)| RawRec {
            partition: 0,
            key: Some(format!(r#"{{"id":{k}}}"#).into_bytes()),
            value: Some(v.clone()),
            headers: vec![],
        })
        .collect();
    produce_raw(&tg.topics[0], &recs).await;
    try_run_to_end(&tg).await.expect("run");
    let customers = table(&tg, "nodes/Customer", &["name", "city"]).await;
    assert_eq!(
        customers,
        BTreeMap::from([("1".into(), json!({"name": "Ann", "city": "Oslo"}))])
    );
    assert_eq!(
        since_millis(&tg, "nodes/Customer", "since").await,
        BTreeMap::from([("1".into(), Some(1_559_033_904_863))])
    );
    let r = rejects(&tg).await;
    assert_eq!(
        r.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>(),
        ["missing_after"]
    );
}
