#!/usr/bin/env python3
"""Waits until consumer group GROUP has committed each partition's high
watermark of TOPICS (comma list), then until the Iceberg tables under
--warehouse hold that many rows, polling every 100 ms; exits 1 if PID dies
or the timeout passes.

Both, because the sink's workers commit the Connect group's offsets in the
transaction that sends their DATA_WRITTEN events (files written, not yet in
a table); the coordinator commits the tables later, on its own interval. The
offsets alone said "done" a commit early in the first trials here."""

import argparse
import os
import sys
import time

from confluent_kafka import Consumer, TopicPartition

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from read_tables import table_rows  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bootstrap")
    p.add_argument("group")
    p.add_argument("topics")
    p.add_argument("--pid", type=int)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--warehouse", required=True)
    a = p.parse_args()
    c = Consumer({"bootstrap.servers": a.bootstrap, "group.id": a.group,
                  "enable.auto.commit": False})
    tps = []
    for t in a.topics.split(","):
        md = c.list_topics(t, timeout=10).topics[t]
        tps += [TopicPartition(t, p) for p in md.partitions]
    ends = {(tp.topic, tp.partition): c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
    total = sum(ends.values())  # the sink appends: one row per record
    deadline = time.monotonic() + a.timeout
    offsets_done = False
    while time.monotonic() < deadline:
        if a.pid:
            try:
                os.kill(a.pid, 0)
            except ProcessLookupError:
                return 1
        if not offsets_done:
            got = c.committed(tps, timeout=10)
            offsets_done = all(tp.offset >= ends[(tp.topic, tp.partition)] for tp in got)
            if offsets_done:
                print(f"offsets at the end after {time.monotonic():.3f}", file=sys.stderr)
        if offsets_done and sum(table_rows(a.warehouse, snapshot_only=True).values()) >= total:
            return 0
        time.sleep(0.1)
    return 1


if __name__ == "__main__":
    sys.exit(main())
