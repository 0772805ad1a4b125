#!/usr/bin/env python3
"""The Kafka -> Lance sink a competent user writes today, without graphsink.

confluent-kafka consumes a batch, json decodes each value, the batch keeps
the last record per id, pylance merge-inserts it into one Lance table per
topic (nodes by their `sku`, edges by their Kafka key, `src`/`dst` kept as
plain columns), and only then are the batch's offsets committed,
synchronously. At-least-once: a crash between the write and the commit
replays the batch, and the merge by id makes the replay harmless.

It checks nothing a graph would: an edge whose endpoint never arrives is
written anyway; there is no dead-letter path (a bad record stops the run).

`--exit-at-end` takes every partition's end offset at start (one admin
ListOffsets request) and stops when every partition's committed position
reaches it. It prints one
JSON line: records, seconds from the first record to the last commit, the
rows each table holds read back with pylance.
"""

import argparse
import json
import sys
import time

import lance
import pyarrow as pa
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

NODE_SCHEMA = pa.schema(
    [("sku", pa.string()), ("seq", pa.int64()), ("pad", pa.string())]
)
EDGE_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("src", pa.string()),
        ("dst", pa.string()),
        ("seq", pa.int64()),
        ("pad", pa.string()),
    ]
)


class Table:
    """One Lance table, merged into by `key`."""

    def __init__(self, uri, schema, key):
        self.uri, self.schema, self.key = uri, schema, key
        self.ds = None

    def merge(self, rows):
        t = pa.Table.from_pylist(rows, schema=self.schema)
        if self.ds is None:
            try:
                self.ds = lance.dataset(self.uri)
            except (ValueError, FileNotFoundError):
                self.ds = lance.write_dataset(t, self.uri, mode="create")
                return
        (
            self.ds.merge_insert(self.key)
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute(t)
        )
        # merge_insert commits a new version; reopen at it for the next batch.
        self.ds = lance.dataset(self.uri)

    def rows(self):
        try:
            return lance.dataset(self.uri).count_rows()
        except (ValueError, FileNotFoundError):
            return 0


def end_offsets(bootstrap, topics):
    """(topic, partition) -> end offset, for every partition, in one request.
    (Per-partition watermark queries queue behind the consumer's long-poll
    fetches on the same connection: ~0.5 s each.)"""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(timeout=10)
    want = {TopicPartition(t, p): OffsetSpec.latest()
            for t in topics for p in md.topics[t].partitions}
    return {(tp.topic, tp.partition): r.result().offset
            for tp, r in admin.list_offsets(want).items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--nodes-topic", required=True)
    p.add_argument("--edges-topic")
    p.add_argument("--group", required=True)
    p.add_argument("--out", required=True, help="folder of the Lance tables")
    p.add_argument("--batch", type=int, default=50_000, help="records per write")
    p.add_argument("--max-wait", type=float, default=1.0,
                   help="seconds a batch waits to fill before it is written")
    p.add_argument("--exit-at-end", action="store_true")
    a = p.parse_args()

    c = Consumer(
        {
            "bootstrap.servers": a.bootstrap,
            "group.id": a.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    topics = [a.nodes_topic] + ([a.edges_topic] if a.edges_topic else [])
    c.subscribe(topics)
    tables = {
        a.nodes_topic: Table(f"{a.out}/Item.lance", NODE_SCHEMA, "sku"),
    }
    if a.edges_topic:
        tables[a.edges_topic] = Table(f"{a.out}/Link.lance", EDGE_SCHEMA, "id")

    ends = end_offsets(a.bootstrap, topics) if a.exit_at_end else None
    nxt = {}  # (topic, partition) -> next offset written and committed
    records, first, batches = 0, None, 0
    spent = {"consume_decode_s": 0.0, "write_s": 0.0, "commit_s": 0.0}
    while True:
        if ends is not None and all(
            nxt.get(k, 0) >= e for k, e in ends.items()
        ):
            break
        # Fill one batch: up to --batch records or --max-wait seconds.
        pending = {t: {} for t in tables}
        offsets = {}
        n = 0
        t0 = time.monotonic()
        deadline = t0 + a.max_wait
        while n < a.batch and time.monotonic() < deadline:
            msgs = c.consume(num_messages=min(10_000, a.batch - n), timeout=0.1)
            for m in msgs:
                if m.error():
                    raise KafkaException(m.error())
                if first is None:
                    first = time.monotonic()
                v = json.loads(m.value())
                if m.topic() == a.nodes_topic:
                    pending[m.topic()][v["sku"]] = v
                else:
                    v["id"] = m.key().decode()
                    pending[m.topic()][v["id"]] = v
                offsets[(m.topic(), m.partition())] = m.offset() + 1
            n += len(msgs)
        if n == 0:
            continue
        t1 = time.monotonic()
        for topic, rows in pending.items():
            if rows:
                tables[topic].merge(list(rows.values()))
        t2 = time.monotonic()
        # Only after the write: commit what it holds.
        c.commit(
            offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
            asynchronous=False,
        )
        t3 = time.monotonic()
        spent["consume_decode_s"] += t1 - t0
        spent["write_s"] += t2 - t1
        spent["commit_s"] += t3 - t2
        nxt.update(offsets)
        records += n
        batches += 1
    secs = time.monotonic() - first if first is not None else 0.0
    c.close()
    out = {
        "records": records,
        "secs": secs,
        "records_per_s": records / secs if secs > 0 else 0.0,
        "batches": batches,
        **{k: round(v, 3) for k, v in spent.items()},
        "rows": {t.uri.rsplit("/", 1)[-1].split(".")[0]: t.rows()
                 for t in tables.values()},
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
