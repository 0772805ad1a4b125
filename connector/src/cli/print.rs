//! How the CLI prints what the library returns: text lines and JSON. Tests
//! and scripts/demo.sh read some of these lines, so their format is stable.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::commands::status::{GraphStatus, KafkaStatus};
use crate::commands::{CheckSummary, GcReport, MigrateReport, Snapshot, TableGc};
use crate::error::Result;
use crate::graph::GraphCommit;
use crate::kafka::queries::GroupMember;
use crate::rejects::Reject;
use crate::types::TopicPartition;

pub(super) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn fmt_ms(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

/// `3m 12s`, to the second.
fn fmt_age(ms: i64) -> String {
    let secs = u64::try_from(ms.max(0) / 1000).unwrap_or(0);
    humantime_serde::re::humantime::format_duration(Duration::from_secs(secs)).to_string()
}

pub(super) fn check(c: &CheckSummary) {
    // The root is echoed config: a registered secret in it is masked.
    println!(
        "ok: {} mappings, {} types, graph root {}",
        c.mappings,
        c.types,
        crate::redact::text(&c.root)
    );
    // The schema plan against the existing graph, one line per change.
    for change in &c.plan.changes {
        println!("{change}");
    }
}

pub(super) fn folded(c: Option<&GraphCommit>) {
    match c {
        Some(c) => println!("published {} (seq {})", c.id, c.seq),
        None => println!("nothing to fold"),
    }
}

pub(super) fn migrated(r: &MigrateReport, dry_run: bool) {
    if r.plan.changes.is_empty() {
        println!(
            "nothing to migrate: the graph is at schema version {}",
            r.version
        );
        return;
    }
    for change in &r.plan.changes {
        println!("  {change}");
    }
    match &r.applied {
        Some(c) => println!(
            "applied {} change(s) as schema version {}: commit {} (seq {}); {} fold(s) first; writes paused {} ms",
            r.plan.changes.len(),
            c.schema_version,
            c.id,
            c.seq,
            r.folds,
            r.paused.as_millis()
        ),
        None if dry_run => println!(
            "dry run: {} change(s) against schema version {}; nothing applied",
            r.plan.changes.len(),
            r.version
        ),
        None => println!("nothing applied"),
    }
}

pub(super) fn commit(c: &GraphCommit) {
    let when = chrono::DateTime::from_timestamp_millis(c.created_at)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default();
    println!("commit {}  seq {}  {}  by {}", c.id, c.seq, when, c.actor);
    if let Some(p) = &c.parent {
        println!("  parent  {p}");
    }
    if let Some(change) = &c.schema_change {
        println!("  schema  version {}", c.schema_version);
        for line in &change.changes {
            println!("    {line}");
        }
    }
    for (table, s) in &c.stats {
        println!(
            "  {table:<32} +{} upserted  -{} deleted",
            s.upserted, s.deleted
        );
    }
    for r in &c.offsets {
        println!(
            "  offsets {}/{}  {}..={}",
            r.topic, r.partition, r.first, r.last
        );
    }
}

pub(super) fn snapshot(s: &Snapshot) {
    println!("commit {} (seq {})", s.commit.id, s.commit.seq);
    for t in &s.tables {
        println!(
            "  {:<32} {:>10} rows  (version {})",
            t.table, t.rows, t.version
        );
    }
}

// ---- status -----------------------------------------------------------------

pub(super) fn graph_status(g: &GraphStatus) {
    let (head, now) = (&g.head, g.now);
    println!(
        "head     {}  seq {}  {}  ({} ago)  by {}",
        head.id,
        head.seq,
        fmt_ms(head.created_at),
        fmt_age(now - head.created_at),
        head.actor
    );
    for p in &g.pending {
        match p.oldest {
            Some(o) => println!(
                "pending  {:<24} {:>8}  oldest {} ({} ago)",
                p.edge,
                p.count,
                fmt_ms(o),
                fmt_age(now - o)
            ),
            None => println!("pending  {:<24} {:>8}", p.edge, p.count),
        }
    }
    println!("pending  {:<24} {:>8}", "total", g.pending_total());
    println!("rejects  {}", g.rejects);
    println!(
        "storage  {:<24} {:>10} {:>10} {:>11} {:>12} {:>9}",
        "table", "base", "wal", "generations", "old versions", "versions"
    );
    for s in &g.storage {
        println!(
            "         {:<24} {:>10} {:>10} {:>11} {:>12} {:>9}",
            s.table,
            fmt_bytes(s.base),
            fmt_bytes(s.wal),
            fmt_bytes(s.generations),
            fmt_bytes(s.old_versions),
            s.versions
        );
    }
    let total: u64 = g.storage.iter().map(|s| s.total()).sum();
    println!("         {:<24} {:>10}", "total", fmt_bytes(total));
    println!(
        "shards   {:<24} {:>6} {:>6} {:>10} {:>11} {:>8}  claimed by",
        "table", "bucket", "epoch", "generation", "folded upto", "unfolded"
    );
    for s in &g.shards {
        let owner = match &s.owner {
            Some(o) => format!("{} since {}", o.holder, fmt_ms(o.claimed_at)),
            None => "-".to_string(),
        };
        println!(
            "         {:<24} {:>6} {:>6} {:>10} {:>11} {:>8}  {owner}",
            s.table, s.bucket, s.writer_epoch, s.current_generation, s.folded_upto, s.unfolded
        );
    }
    for f in &g.last_folds {
        println!(
            "folded   by {}  last seq {}  {} ({} ago)",
            f.folder,
            f.seq,
            fmt_ms(f.created_at),
            fmt_age(g.now - f.created_at)
        );
    }
}

/// `people/0-3,7 orders/1`: a member's partitions, by topic.
fn held(parts: &[TopicPartition]) -> String {
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in parts {
        by_topic.entry(t).or_default().push(*p);
    }
    for ps in by_topic.values_mut() {
        ps.sort_unstable();
        ps.dedup();
    }
    let runs = |ps: &[i32]| {
        let mut out: Vec<String> = Vec::new();
        let mut i = 0;
        while i < ps.len() {
            let mut j = i;
            while j + 1 < ps.len() && ps[j + 1] == ps[j] + 1 {
                j += 1;
            }
            out.push(if j > i {
                format!("{}-{}", ps[i], ps[j])
            } else {
                ps[i].to_string()
            });
            i = j + 1;
        }
        out.join(",")
    };
    by_topic
        .iter()
        .map(|(t, ps)| format!("{t}/{}", runs(ps)))
        .collect::<Vec<_>>()
        .join(" ")
}

// ---- gc ---------------------------------------------------------------------

pub(super) fn gc(r: &GcReport) {
    let verb = if r.dry_run { "would delete" } else { "deleted" };
    println!(
        "retention by head seq {}: {} commits readable, {} expired",
        r.head_seq, r.retained_commits, r.expired_commits
    );
    let line = |name: &str, t: &TableGc| {
        println!(
            "  {:<28} wal {:>5} ({:>9})  generations {:>4} ({:>9})  versions {:>5} ({:>9})  trimmed {}",
            name,
            t.wal.count,
            fmt_bytes(t.wal.bytes),
            t.generations.count,
            fmt_bytes(t.generations.bytes),
            t.versions.count,
            fmt_bytes(t.versions.bytes),
            t.trimmed
        )
    };
    println!("{verb}:");
    for (table, t) in &r.tables {
        line(table, t);
    }
    line("total", &r.total());
}

/// Bytes in binary units, three significant figures.
pub(super) fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

pub(super) fn kafka_status(k: &KafkaStatus) {
    let members: &[GroupMember] = match &k.members {
        Err(e) => {
            println!(
                "kafka    group {} (members unknown: {})",
                k.group,
                one_line(e)
            );
            &[]
        }
        Ok(g) => {
            match g.state.as_str() {
                "" => println!("kafka    group {} (unknown to the broker)", k.group),
                state if g.protocol.is_empty() => println!("kafka    group {} ({state})", k.group),
                state => println!("kafka    group {} ({state}, {})", k.group, g.protocol),
            }
            &g.members
        }
    };
    for m in members {
        let holds = match &m.assigned {
            Some(parts) if parts.is_empty() => "nothing".to_string(),
            Some(parts) => held(parts),
            // tansu 0.6 describes members without their assignment.
            None => "(the broker did not report its partitions)".to_string(),
        };
        let name = match m.client_id.as_str() {
            "" => &m.member_id,
            id => id,
        };
        match m.host.trim_start_matches('/') {
            "" => println!("  member {name}: {holds}"),
            host => println!("  member {name} at {host}: {holds}"),
        }
    }
    for p in &k.partitions {
        let committed = p.committed.map_or("-".to_string(), |c| c.to_string());
        println!(
            "  {:<28} committed {:>10}  end {:>10}  lag {:>8}",
            format!("{}/{}", p.topic, p.partition),
            committed,
            p.end,
            p.lag()
        );
    }
    for m in &k.missing {
        println!("  {:<28} {}", m.topic, m.error);
    }
    println!("  total lag {}", k.total_lag());
}

/// `status --json`: one object; a Kafka failure becomes `kafka_error`.
pub(super) fn status_json(g: &GraphStatus, kafka: &Result<KafkaStatus>) {
    let (head, now) = (&g.head, g.now);
    let mut out = serde_json::json!({
        "head": {
            "id": head.id,
            "seq": head.seq,
            "created_at": head.created_at,
            "age_ms": now - head.created_at,
            "actor": head.actor,
        },
        "pending": g.pending.iter().map(|p| serde_json::json!({
            "edge": p.edge,
            "table": p.table,
            "count": p.count,
            "oldest_pending_since": p.oldest,
            "oldest_age_ms": p.oldest.map(|o| now - o),
        })).collect::<Vec<_>>(),
        "pending_total": g.pending_total(),
        "rejects": g.rejects,
        "storage": g.storage,
        "shards": g.shards,
        "last_folds": g.last_folds,
        "kafka": null,
    });
    match kafka {
        Ok(k) => out["kafka"] = kafka_json(k),
        Err(e) => out["kafka_error"] = one_line(&e.to_string()).into(),
    }
    println!("{out}");
}

fn kafka_json(k: &KafkaStatus) -> serde_json::Value {
    serde_json::json!({
        "group": k.group,
        "group_state": k.members.as_ref().ok().map(|g| &g.state),
        "assignor": k.members.as_ref().ok().map(|g| &g.protocol),
        "members_error": k.members.as_ref().err(),
        "members": k.members.as_ref().map(|g| g.members.as_slice()).unwrap_or_default().iter().map(|m| serde_json::json!({
            "member_id": m.member_id,
            "client_id": m.client_id,
            "host": m.host,
            "partitions": m.assigned.as_ref().map(|ps| ps.iter().map(|(t, p)| serde_json::json!({
                "topic": t, "partition": p,
            })).collect::<Vec<_>>()),
        })).collect::<Vec<_>>(),
        "partitions": k.partitions.iter().map(|p| serde_json::json!({
            "topic": p.topic,
            "partition": p.partition,
            "committed": p.committed,
            "end": p.end,
            "lag": p.lag(),
        })).collect::<Vec<_>>(),
        "total_lag": k.total_lag(),
        "missing_topics": k.missing.iter().map(|m| serde_json::json!({
            "topic": m.topic, "error": m.error,
        })).collect::<Vec<_>>(),
    })
}

// ---- rejects ----------------------------------------------------------------

/// `1 reject`, `3 rejects`.
pub(super) fn rejects_n(n: usize) -> String {
    format!("{n} reject{}", if n == 1 { "" } else { "s" })
}

/// The oldest `limit` of `selected` on stdout, and how many on stderr.
pub(super) fn rejects(selected: &[Reject], limit: usize, json: bool) {
    for r in selected.iter().take(limit) {
        if json {
            println!("{}", reject_json(r));
        } else {
            println!("{}", reject_line(r));
        }
    }
    if selected.len() > limit {
        eprintln!(
            "{limit} of {} (oldest first; raise --limit for more)",
            rejects_n(selected.len())
        );
    } else {
        eprintln!("{}", rejects_n(selected.len()));
    }
}

/// One readable line: time, stage, code, type, source, id, message.
pub(super) fn reject_line(r: &Reject) -> String {
    let source = match (&r.topic, r.partition, r.offset) {
        (Some(t), Some(p), Some(o)) => format!("{t}/{p}@{o}"),
        _ => "-".to_string(),
    };
    format!(
        "{}  {:<8}  {:<18}  {:<12}  {}  {}  {}",
        fmt_ms(r.rejected_at),
        r.stage.as_str(),
        r.code.as_str(),
        r.type_name.as_deref().unwrap_or("-"),
        source,
        r.reject_id,
        one_line(&r.message)
    )
}

/// Bytes as JSON: a string when they are UTF-8, else `{"base64": ".."}`.
fn bytes_json(b: &[u8]) -> serde_json::Value {
    use base64::Engine;
    match std::str::from_utf8(b) {
        Ok(s) => serde_json::Value::String(s.to_string()),
        Err(_) => serde_json::json!({
            "base64": base64::engine::general_purpose::STANDARD.encode(b)
        }),
    }
}

/// A reject as JSON: its serde form, with key, value and header values as
/// text (or base64) instead of byte arrays.
fn reject_json(r: &Reject) -> serde_json::Value {
    let opt = |b: &Option<Vec<u8>>| b.as_deref().map_or(serde_json::Value::Null, bytes_json);
    // A reject is a struct of plain fields: it always serializes to an object.
    let mut v = serde_json::to_value(r).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("key".into(), opt(&r.key));
        o.insert("value".into(), opt(&r.value));
        o.insert(
            "headers".into(),
            r.headers
                .iter()
                .map(|(k, v)| serde_json::json!([k, opt(v)]))
                .collect(),
        );
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rejects::{Origin, RejectCode};

    #[test]
    fn a_reject_prints_its_bytes_as_text_or_base64() {
        let r = Reject::of_record(
            Origin {
                topic: "t".into(),
                partition: 0,
                offset: 3,
                key: Some(b"k".to_vec()),
                value: Some(vec![0xff]),
                headers: vec![("h".into(), Some(b"v".to_vec())), ("n".into(), None)],
                ..Default::default()
            },
            "Person",
            RejectCode::Range,
            "m\n  n",
            None,
        );
        let json = reject_json(&r);
        assert_eq!(json["key"], "k");
        assert_eq!(json["value"]["base64"], "/w==");
        assert_eq!(
            json["headers"],
            serde_json::json!([["h", "v"], ["n", null]])
        );
        let line = reject_line(&r);
        assert!(line.contains("  validate  range  "), "{line}");
        assert!(line.contains("  t/0@3  "), "{line}");
        assert!(line.ends_with(" m n"), "{line}");
        assert_eq!(rejects_n(1), "1 reject");
        assert_eq!(rejects_n(2), "2 rejects");
    }
}

#[cfg(test)]
mod held_tests {
    use super::held;

    #[test]
    fn partitions_print_as_runs_per_topic() {
        let parts: Vec<(String, i32)> = [
            ("b", 0),
            ("a", 0),
            ("a", 1),
            ("a", 2),
            ("a", 5),
            ("a", 7),
            ("a", 8),
        ]
        .iter()
        .map(|(t, p)| (t.to_string(), *p))
        .collect();
        assert_eq!(held(&parts), "a/0-2,5,7-8 b/0");
        let mut shuffled = parts.clone();
        shuffled.reverse();
        shuffled.push(("a".to_string(), 1));
        assert_eq!(held(&shuffled), "a/0-2,5,7-8 b/0");
    }
}
