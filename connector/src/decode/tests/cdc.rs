//! Change envelopes and field paths through `RecordDecoder::decode`.
//! Event shapes follow Debezium's PostgreSQL connector documentation
//! (debezium/debezium, documentation/modules/ROOT/pages/connectors/
//! postgresql.adoc: "create events", "update events", "delete events",
//! "tombstone events", "truncate events"): the payload's `before`, `after`,
//! `source`, `op`, `ts_ms`, and the `{schema, payload}` wrapper of the JSON
//! converter with `schemas.enable = true`. `real_events_*` read the events
//! verbatim from those pages (and the MySQL connector's), as saved in
//! `envelope/fixtures/` (its README says where each comes from).

use super::*;

const SHOP: &str = r#"
    node Customer { id: I64 @key  name: String  email: String?  since: DateTime?  balance: String? }
    node Product { sku: String @key  title: String }
    edge Contains: Customer -> Product { quantity: I32?  @unique(src, dst) }
"#;

fn shop(m: &str) -> RecordDecoder {
    let s = GraphSchema::parse(SHOP, "shop.pg").unwrap();
    RecordDecoder::new(&s, &mapping(m), 100, 100_000).unwrap()
}

fn customers(extra: &str) -> RecordDecoder {
    shop(&format!(
        "topic = 'c'\nnode = 'Customer'\nenvelope = 'debezium'\n{extra}"
    ))
}

const SOURCE: &str = r#""source":{"version":"2.7.0.Final","connector":"postgresql","name":"PostgreSQL_server","ts_ms":1559033904863,"snapshot":"false","db":"postgres","sequence":"[\"24023119\",\"24023128\"]","schema":"public","table":"customers","txId":555,"lsn":24023128,"xmin":null}"#;

fn event(op: &str, before: &str, after: &str) -> String {
    format!(r#"{{"before":{before},"after":{after},{SOURCE},"op":"{op}","ts_ms":1559033904863}}"#)
}

fn wrapped(payload: &str) -> String {
    format!(
        r#"{{"schema":{{"type":"struct","fields":[],"optional":false,"name":"PostgreSQL_server.public.customers.Envelope"}},"payload":{payload}}}"#
    )
}

#[test]
fn creates_reads_and_updates_upsert_after_and_deletes_delete() {
    let mut d = customers("");
    let c = event("c", "null", r#"{"id":1,"name":"Anne"}"#);
    let r = event("r", "null", r#"{"id":2,"name":"Bo"}"#);
    let u = event("u", r#"{"id":1}"#, r#"{"id":1,"name":"Anne K"}"#);
    let del = event("d", r#"{"id":2}"#, "null");
    let out = d
        .decode(&[
            rec(0, Some(r#"{"id":1}"#), Some(&c)),
            rec(1, Some(r#"{"id":2}"#), Some(&r)),
            rec(2, Some(r#"{"id":1}"#), Some(&u)),
            rec(3, Some(r#"{"id":2}"#), Some(&del)),
            // The tombstone after the delete: nothing, not a second delete.
            rec(4, Some(r#"{"id":2}"#), None),
        ])
        .unwrap();
    assert!(out.rejects.is_empty(), "{:?}", out.rejects);
    let up = out.upserts.unwrap();
    assert_eq!(ids(&up), ["1"]);
    assert_eq!(col(&up, "name"), ["Anne K"]);
    let del = out.deletes.unwrap();
    assert_eq!(ids(&del), ["2"]);
}

#[test]
fn the_converter_wrapper_is_decided_per_record() {
    let mut d = customers("");
    let bare = event("c", "null", r#"{"id":1,"name":"Anne"}"#);
    let wrapped = wrapped(&event("c", "null", r#"{"id":2,"name":"Bo"}"#));
    let key = r#"{"schema":{"type":"struct","fields":[{"type":"int32","optional":false,"field":"id"}],"optional":false,"name":"PostgreSQL_server.public.customers.Key"},"payload":{"id":3}}"#;
    let del = wrapped_delete();
    let out = d
        .decode(&[
            rec(0, None, Some(&bare)),
            rec(1, None, Some(&wrapped)),
            rec(2, Some(key), Some(&del)),
        ])
        .unwrap();
    assert!(out.rejects.is_empty(), "{:?}", out.rejects);
    assert_eq!(ids(&out.upserts.unwrap()), ["1", "2"]);
    // No before: the wrapped Kafka key names the row.
    assert_eq!(ids(&out.deletes.unwrap()), ["3"]);
}

fn wrapped_delete() -> String {
    wrapped(&event("d", "null", "null"))
}

#[test]
fn the_last_event_of_a_key_wins_in_kafka_order() {
    let mut d = customers("");
    let c = event("c", "null", r#"{"id":1,"name":"Anne"}"#);
    let del = event("d", r#"{"id":1}"#, "null");
    let again = event("c", "null", r#"{"id":1,"name":"Anne again"}"#);
    let out = d
        .decode(&[rec(0, None, Some(&c)), rec(1, None, Some(&del))])
        .unwrap();
    assert!(out.upserts.is_none());
    assert_eq!(ids(&out.deletes.unwrap()), ["1"]);
    let out = d
        .decode(&[
            rec(0, None, Some(&c)),
            rec(1, None, Some(&del)),
            rec(2, None, Some(&again)),
        ])
        .unwrap();
    assert!(out.deletes.is_none());
    assert_eq!(col(&out.upserts.unwrap(), "name"), ["Anne again"]);
}

#[test]
fn envelopes_that_cannot_be_read_are_typed_rejects_with_the_value_as_it_came() {
    let mut d = customers("");
    let no_after = event("u", r#"{"id":1}"#, "null");
    let truncate = format!(r#"{{{SOURCE},"op":"t","ts_ms":1559033904863}}"#);
    let message = event("m", "null", "null");
    let flat = r#"{"id":1,"name":"Anne"}"#;
    let no_before = event("d", "null", "null");
    let bad_row = event("c", "null", r#"{"id":"x","name":"Anne"}"#);
    let out = d
        .decode(&[
            rec(0, None, Some(&no_after)),
            rec(1, None, Some(&truncate)),
            rec(2, None, Some(&message)),
            rec(3, None, Some(flat)),
            rec(4, None, Some(&no_before)),
            rec(5, None, Some(&bad_row)),
            rec(6, None, Some("{")),
        ])
        .unwrap();
    assert_eq!(
        codes(&out),
        [
            (0, "missing_after"),
            (1, "unsupported_op"),
            (2, "unknown_op"),
            (3, "unknown_op"),
            (4, "missing_before"),
            (5, "wrong_type"),
            (6, "malformed_json"),
        ]
    );
    // The reject carries the event, not the row graphsink made of it.
    assert_eq!(out.rejects[5].value.as_deref(), Some(bad_row.as_bytes()));
    assert!(out.upserts.is_none() && out.deletes.is_none());
}

#[test]
fn op_field_takes_the_op_and_the_row_from_their_paths() {
    let mut d = shop(
        "topic = 'c'\nnode = 'Customer'\nenvelope = 'op_field'\nop_path = '/kind'\n\
         delete_when = ['DELETE']\ndata_path = '/row'",
    );
    let out = d
        .decode(&[
            rec(
                0,
                None,
                Some(r#"{"kind":"INSERT","row":{"id":1,"name":"A"}}"#),
            ),
            rec(1, None, Some(r#"{"kind":"DELETE","row":{"id":2}}"#)),
            rec(2, None, Some(r#"{"row":{"id":3,"name":"C"}}"#)),
            rec(3, None, Some(r#"{"kind":"UPDATE"}"#)),
        ])
        .unwrap();
    assert_eq!(codes(&out), [(2, "unknown_op"), (3, "missing_after")]);
    assert_eq!(ids(&out.upserts.unwrap()), ["1"]);
    assert_eq!(ids(&out.deletes.unwrap()), ["2"]);
    // ExtractNewRecordState's rewrite mode: the op is a field of the row.
    let mut d = shop(
        "topic = 'c'\nnode = 'Customer'\nenvelope = 'op_field'\nop_path = '/__deleted'\n\
         delete_when = [true]",
    );
    let out = d
        .decode(&[
            rec(0, None, Some(r#"{"id":1,"name":"A","__deleted":"false"}"#)),
            rec(1, None, Some(r#"{"id":2,"name":"B","__deleted":"true"}"#)),
        ])
        .unwrap();
    assert!(out.rejects.is_empty(), "{:?}", out.rejects);
    assert_eq!(ids(&out.upserts.unwrap()), ["1"]);
    assert_eq!(ids(&out.deletes.unwrap()), ["2"]);
}

#[test]
fn fields_come_from_paths_and_the_rest_keep_their_names() {
    let m = "topic = 'c'\nnode = 'Customer'\n\
             [fields]\nname = '/customer/full_name'\nemail = 'mail'\n\
             since = { path = '/created_at', encoding = 'io.debezium.time.MicroTimestamp' }\n\
             balance = { encoding = 'decimal', scale = 4 }";
    let mut d = shop(m);
    let v = r#"{"id":7,"customer":{"full_name":"Ann"},"mail":"a@x","created_at":1559033904863123,"balance":"dzWUAA=="}"#;
    let out = d.decode(&[rec(0, None, Some(v))]).unwrap();
    assert!(out.rejects.is_empty(), "{:?}", out.rejects);
    let up = out.upserts.unwrap();
    assert_eq!(col(&up, "name"), ["Ann"]);
    assert_eq!(col(&up, "email"), ["a@x"]);
    assert_eq!(col(&up, "balance"), ["200000.0000"]);
    assert_eq!(col(&up, "since"), ["2019-05-28T08:58:24.863"]);
    let out = d
        .decode(&[
            // What is left: `customer.age` is not a property.
            rec(
                0,
                None,
                Some(r#"{"id":1,"customer":{"full_name":"A","age":3}}"#),
            ),
            // A top-level `name` is not read: name comes from the path.
            rec(
                1,
                None,
                Some(r#"{"id":2,"customer":{"full_name":"B"},"name":"B"}"#),
            ),
            rec(2, None, Some(r#"{"id":3}"#)),
            rec(3, None, Some(r#"{"id":4,"customer":{"full_name":5}}"#)),
            rec(
                4,
                None,
                Some(r#"{"id":5,"customer":{"full_name":"E"},"created_at":"soon"}"#),
            ),
        ])
        .unwrap();
    assert_eq!(
        codes(&out),
        [
            (0, "unknown_field"),
            (1, "unknown_field"),
            (2, "missing_required"),
            (3, "wrong_type"),
            (4, "wrong_type"),
        ]
    );
    let m: Vec<&str> = out.rejects.iter().map(|r| r.message.as_str()).collect();
    assert!(m[2].contains("/customer/full_name"), "{}", m[2]);
    assert!(m[3].contains("/customer/full_name"), "{}", m[3]);
    assert!(m[4].contains("/created_at"), "{}", m[4]);
}

#[test]
fn join_table_rows_become_edges_and_their_deletes_name_them() {
    let mut d = shop(
        "topic = 'l'\nedge = 'Contains'\nenvelope = 'debezium'\nsrc = '/order_id'\ndst = '/product_id'",
    );
    let c = event(
        "c",
        "null",
        r#"{"order_id":1,"product_id":"p-1","quantity":2}"#,
    );
    let del = event("d", r#"{"order_id":1,"product_id":"p-2"}"#, "null");
    let out = d
        .decode(&[rec(0, None, Some(&c)), rec(1, None, Some(&del))])
        .unwrap();
    assert!(out.rejects.is_empty(), "{:?}", out.rejects);
    let up = out.upserts.unwrap();
    assert_eq!(ids(&up), [r#"["1","p-1"]"#]);
    assert_eq!(col(&up, "src"), ["1"]);
    assert_eq!(col(&up, "quantity"), ["2"]);
    assert_eq!(ids(&out.deletes.unwrap()), [r#"["1","p-2"]"#]);
}

#[test]
fn debezium_keys_name_their_rows_under_partition_sharding() {
    let mut d = customers("").partition_keyed(true, None);
    let c = event("c", "null", r#"{"id":1,"name":"Anne"}"#);
    let out = d
        .decode(&[
            rec(0, Some(r#"{"id":1}"#), Some(&c)),
            rec(1, Some(r#"{"id":9}"#), Some(&c)),
        ])
        .unwrap();
    assert_eq!(codes(&out), [(1, "partition_key_mismatch")]);
    // The reject keeps the key as it came.
    assert_eq!(out.rejects[0].key.as_deref(), Some(&br#"{"id":9}"#[..]));
}

#[test]
fn settings_that_cannot_work_are_refused_at_start() {
    let s = GraphSchema::parse(SHOP, "shop.pg").unwrap();
    let refused = |m: &str| {
        let m: Mapping = toml::from_str(m).unwrap();
        match crate::config::validate_mapping_for_tests(&m) {
            Err(e) => e.to_string(),
            Ok(()) => match RecordDecoder::new(&s, &m, 10, 1000) {
                Err(e) => e.to_string(),
                Ok(_) => String::new(),
            },
        }
    };
    assert!(refused("topic='c'\nnode='Customer'\n[fields]\nnope='/x'").contains("not a property"));
    assert!(refused("topic='c'\nnode='Customer'\n[fields]\nname='/a~2'").contains("~"));
    assert!(
        refused("topic='c'\nnode='Customer'\n[fields]\nname='/a'\nemail='/a/b'").contains("holds")
    );
    assert!(refused("topic='c'\nnode='Customer'\nenvelope='op_field'").contains("op_path"));
    assert!(refused("topic='c'\nnode='Customer'\nop_path='/op'").contains("op_field"));
    assert!(
        refused("topic='c'\nnode='Customer'\nenvelope='debezium'\nformat='protobuf'")
            .contains("format")
    );
    assert!(refused(
        "topic='c'\nnode='Customer'\n[fields]\nname={path='/a',encoding='epoch_days',scale=2}"
    )
    .contains("scale"));
}

/// The tables of Debezium's documentation examples (`customers`).
const INVENTORY: &str = r#"
    node Customer { id: I64 @key  first_name: String  last_name: String  email: String }
"#;

macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!("../envelope/fixtures/", $name, ".json"))
    };
}

#[test]
fn real_events_of_both_converter_forms_upsert_and_delete() {
    let s = GraphSchema::parse(INVENTORY, "inventory.pg").unwrap();
    let m = mapping("topic = 't'\nnode = 'Customer'\nenvelope = 'debezium'");
    for (connector, id, events) in [
        (
            "postgresql",
            "1",
            [
                fixture!("pg_create"),
                fixture!("pg_create_payload"),
                fixture!("pg_update"),
                fixture!("pg_update_payload"),
                fixture!("pg_delete"),
                fixture!("pg_delete_payload"),
            ],
        ),
        (
            "mysql",
            "1004",
            [
                fixture!("mysql_create"),
                fixture!("mysql_create_payload"),
                fixture!("mysql_update"),
                fixture!("mysql_update_payload"),
                fixture!("mysql_delete"),
                fixture!("mysql_delete_payload"),
            ],
        ),
    ] {
        let mut d = RecordDecoder::new(&s, &m, 100, 100_000).unwrap();
        // Each upsert alone: the row is `after`, whichever form.
        for (i, e) in events[..4].iter().enumerate() {
            let out = d.decode(&[rec(i as i64, None, Some(e))]).unwrap();
            assert!(
                out.rejects.is_empty(),
                "{connector} #{i}: {:?}",
                out.rejects
            );
            assert_eq!(ids(&out.upserts.unwrap()), [id], "{connector} #{i}");
        }
        for (i, e) in events[4..].iter().enumerate() {
            let out = d
                .decode(&[rec(i as i64, None, Some(e)), rec(9, None, None)])
                .unwrap();
            assert!(
                out.rejects.is_empty(),
                "{connector} delete #{i}: {:?}",
                out.rejects
            );
            assert_eq!(ids(&out.deletes.unwrap()), [id], "{connector} delete #{i}");
        }
    }
}

#[test]
fn real_keys_name_rows_and_a_real_truncate_is_refused() {
    let s = GraphSchema::parse(INVENTORY, "inventory.pg").unwrap();
    let m = mapping("topic = 't'\nnode = 'Customer'\nenvelope = 'debezium'\nkey = 'kafka'");
    let mut d = RecordDecoder::new(&s, &m, 100, 100_000).unwrap();
    let create = fixture!("mysql_create_payload").replace("1004", "1001");
    for (key, id) in [
        (fixture!("mysql_key"), "1001"),
        (fixture!("mysql_key_payload"), "1001"),
        (fixture!("pg_key_payload"), "1"),
    ] {
        let value = if id == "1" {
            fixture!("pg_create_payload").to_string()
        } else {
            create.clone()
        };
        let out = d.decode(&[rec(0, Some(key), Some(&value))]).unwrap();
        assert!(out.rejects.is_empty(), "{key}: {:?}", out.rejects);
        assert_eq!(ids(&out.upserts.unwrap()), [id]);
    }
    // The docs' PostgreSQL key example (`{"id": "1"}` under a
    // non-converter schema layout) names the same row.
    let out = d
        .decode(&[rec(
            0,
            Some(fixture!("pg_key")),
            Some(fixture!("pg_create_payload")),
        )])
        .unwrap();
    assert!(out.rejects.is_empty(), "{:?}", out.rejects);
    let out = d
        .decode(&[rec(0, None, Some(fixture!("pg_truncate")))])
        .unwrap();
    assert_eq!(codes(&out), [(0, "unsupported_op")]);
}

#[test]
fn a_key_field_takes_a_pointer_too() {
    let mut d = shop("topic = 'c'\nnode = 'Customer'\nkey = { field = '/customer/id' }\nunknown_fields = 'ignore'");
    let out = d
        .decode(&[
            rec(0, None, Some(r#"{"customer":{"id":7},"name":"Ann"}"#)),
            rec(1, None, Some(r#"{"customer":{},"name":"Bo"}"#)),
        ])
        .unwrap();
    assert_eq!(codes(&out), [(1, "missing_key")]);
    assert!(
        out.rejects[0].message.contains("/customer/id"),
        "{}",
        out.rejects[0].message
    );
    let up = out.upserts.unwrap();
    assert_eq!(ids(&up), ["7"]);
    assert_eq!(col(&up, "name"), ["Ann"]);
}
