#!/usr/bin/env python3
"""Waits until each Delta table holds one row per record of its topic (kdi
appends), reading them with `deltalake` every 500 ms; exits 1 if a
PID dies first or the timeout passes.

Why not kdi's own `-e`: it stops a partition only when it consumes the
record at the high watermark it read at start (`end_of_partition_reached`
compares the record's offset with the watermark, which is the *next*
offset), so on a backlog nobody appends to it never exits (its own test
produces more records after the backlog to end it); and when it does exit
it drops the records buffered for the next file. The runner keeps `-e`
and ends the processes once the tables are complete."""

import argparse
import os
import sys
import time

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from deltalake import DeltaTable


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bootstrap")
    p.add_argument("pairs", nargs="+", help="TOPIC=TABLE_PATH ...")
    p.add_argument("--pids", default="")
    p.add_argument("--timeout", type=float, default=900)
    a = p.parse_args()
    admin = AdminClient({"bootstrap.servers": a.bootstrap})
    md = admin.list_topics(timeout=10)
    want = {}
    for pair in a.pairs:
        topic, path = pair.split("=", 1)
        req = {TopicPartition(topic, q): OffsetSpec.latest() for q in md.topics[topic].partitions}
        want[path] = sum(r.result().offset for r in admin.list_offsets(req).values())
    pids = [int(x) for x in a.pids.split(",") if x]
    deadline = time.monotonic() + a.timeout
    while time.monotonic() < deadline:
        done = True
        for path, n in want.items():
            try:
                got = DeltaTable(path).to_pyarrow_dataset().count_rows()
            except Exception:
                got = 0
            done = done and got >= n
        if done:
            return 0
        for pid in pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                print(f"kdi process {pid} exited before its table was complete", file=sys.stderr)
                return 1
        time.sleep(0.5)
    print("timed out waiting for the Delta tables", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
