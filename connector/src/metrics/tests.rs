use std::time::Duration;

use super::probes::FOLD_FAILURES_NOT_READY;
use super::*;

fn tp(p: i32) -> TopicPartition {
    ("t".to_string(), p)
}

#[test]
fn counters_get_total_and_labels_stay_bounded() {
    let m = Metrics::default();
    m.polled(&tp(0), 3, 30, 3);
    m.rejected("decode", "not_json");
    let text = m.encode();
    assert!(
        text.contains("graphsink_records_consumed_total{topic=\"t\",partition=\"0\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("graphsink_rejects_total{stage=\"decode\",code=\"not_json\"} 1"),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
    // The Prometheus text format names the counter family `_total` too.
    let text = m.encode_as(Format::Text);
    assert!(
        text.contains("# TYPE graphsink_records_consumed_total counter"),
        "{text}"
    );
    assert!(!text.contains("# EOF"), "{text}");
}

#[test]
fn accept_header_picks_the_format() {
    let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    assert_eq!(Format::accepted(Some(prometheus)), Format::OpenMetrics);
    assert_eq!(Format::accepted(Some("*/*")), Format::Text);
    assert_eq!(Format::accepted(None), Format::Text);
}

#[test]
fn lag_is_end_minus_committed() {
    let m = Metrics::default();
    m.kafka_partition(&tp(1), 7, 10);
    assert!(!m.encode().contains("graphsink_lag{"));
    m.committed(&[(tp(1), 4)]);
    assert!(m
        .encode()
        .contains("graphsink_lag{topic=\"t\",partition=\"1\"} 6"));
}

#[test]
fn readiness_names_what_fails() {
    let m = Metrics::new(Duration::ZERO);
    assert!(!m.readiness().ready && !m.readiness().joined);
    m.assigned(&[]);
    assert!(m.readiness().ready);
    for _ in 0..FOLD_FAILURES_NOT_READY {
        m.fold_failed();
    }
    assert!(m.readiness().folds_failing);
    m.fold_ended();
    m.dead_letters_retrying(true);
    std::thread::sleep(Duration::from_millis(5));
    assert!(m.readiness().dead_letters_stalled);
    m.dead_letters_retrying(false);
    m.polls_in_flight(1);
    std::thread::sleep(Duration::from_millis(5));
    assert!(m.readiness().durability_stalled);
    m.acked(Duration::from_millis(1), 1);
    m.polls_in_flight(0);
    assert!(m.readiness().ready);
    m.schema_registry_stalled(true);
    assert!(!m.readiness().ready && m.readiness().schema_registry_stalled);
    m.schema_registry_stalled(false);
    assert!(m.readiness().ready);
    m.fenced();
    assert_eq!(
        m.readiness(),
        Readiness {
            ready: false,
            joined: true,
            fenced: true,
            dead_letters_stalled: false,
            schema_registry_stalled: false,
            durability_stalled: false,
            folds_failing: false
        }
    );
}

#[test]
fn flush_counts_move_by_difference() {
    let m = Metrics::default();
    m.memtable("nodes/P", 0, 5, 100, 2);
    m.memtable("nodes/P", 1, 1, 10, 1);
    m.memtable("nodes/P", 0, 0, 0, 3);
    let text = m.encode();
    assert!(
        text.contains("graphsink_wal_flushes_total{table=\"nodes/P\"} 4"),
        "{text}"
    );
}

#[test]
fn totals_sum_the_run_over_its_polls_acks_commits_and_restarts() {
    let m = Metrics::default();
    let poll = PollReport {
        records: 5,
        rejected: 2,
        take: Duration::from_nanos(10),
        total: Duration::from_nanos(100),
        ..PollReport::default()
    };
    m.poll_done(&poll);
    m.poll_done(&poll);
    m.acked(Duration::from_millis(1), 5);
    m.committed(&[(tp(0), 5), (tp(1), 3)]);
    m.session_restarted();
    m.cut_served(Duration::from_nanos(7));
    m.rejected("fold", "dangling_edge"); // a fold reject: not a sync one
    let t = m.totals();
    assert_eq!(
        (t.consumed, t.rejected, t.durable, t.commits, t.restarts, t.polls),
        (10, 4, 5, 1, 1, 2)
    );
    assert_eq!((t.take_ns, t.poll_ns, t.cut_ns), (20, 200, 7));
}
