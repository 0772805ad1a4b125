#!/usr/bin/env python3
"""Steady-state freshness of one peer: produce -> readable by the target's
own reader, under a paced producer.

Creates a fresh topic, starts the peer (--peer-cmd, `{topic}` replaced),
produces one primer record per partition and waits until the reader sees
them (so the peer's start is not counted), then produces --rate records/s
for --secs seconds, each a new key with `seq` = its index, and polls the
reader every --poll-ms: a record's latency is the first poll that sees its
`seq` minus its produce time (the producer's send call; delivery is
asynchronous). Prints one JSON line: p50/p99/max ms, samples, unseen.

Readers: lance:PATH (pylance), iceberg:WAREHOUSE (pyiceberg, the Hadoop
catalog's newest metadata of bench/item), delta:PATH (deltalake).
"""

import argparse
import glob
import json
import os
import shlex
import signal
import subprocess
import sys
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


def reader(spec):
    kind, path = spec.split(":", 1)
    if kind == "lance":
        import lance

        def seen():
            try:
                return lance.dataset(path).to_table(columns=["seq"]).column("seq").to_pylist()
            except (ValueError, FileNotFoundError, OSError):
                return []
    elif kind == "iceberg":
        sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/iceberg")
        from read_tables import newest_metadata
        from pyiceberg.table import StaticTable

        def seen():
            d = f"{path}/bench/item"
            if not glob.glob(f"{d}/metadata/v*.metadata.json"):
                return []
            try:
                t = StaticTable.from_metadata(newest_metadata(d))
                return t.scan(selected_fields=("seq",)).to_arrow().column("seq").to_pylist()
            except Exception:  # a metadata file being written
                return []
    elif kind == "delta":
        from deltalake import DeltaTable

        def seen():
            try:
                return DeltaTable(path).to_pyarrow_table(columns=["seq"]).column("seq").to_pylist()
            except Exception:
                return []
    else:
        raise SystemExit(f"unknown reader {spec}")
    return seen


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--peer-cmd", required=True)
    p.add_argument("--reader", required=True)
    p.add_argument("--rate", type=int, default=5000)
    p.add_argument("--secs", type=int, default=10)
    p.add_argument("--poll-ms", type=int, default=100)
    p.add_argument("--warmup-timeout", type=float, default=180)
    p.add_argument("--drain-timeout", type=float, default=120)
    p.add_argument("--value-bytes", type=int, default=100)
    a = p.parse_args()
    seen = reader(a.reader)
    admin = AdminClient({"bootstrap.servers": a.bootstrap})
    admin.create_topics([NewTopic(a.topic, a.partitions, 1)])[a.topic].result()
    prod = Producer({"bootstrap.servers": a.bootstrap, "linger.ms": 5})

    def send(i, part=None):
        v = {"sku": f"f{i:09d}", "seq": i, "pad": ""}
        v["pad"] = "x" * max(0, a.value_bytes - len(json.dumps(v)))
        kw = {} if part is None else {"partition": part}
        prod.produce(a.topic, key=v["sku"], value=json.dumps(v), **kw)

    peer = subprocess.Popen(shlex.split(a.peer_cmd.replace("{topic}", a.topic)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        # Primers: seq -1 - partition, one per partition.
        for part in range(a.partitions):
            send(-1 - part, part)
        prod.flush(30)
        t0 = time.monotonic()
        while len([s for s in seen() if s < 0]) < a.partitions:
            if peer.poll() is not None or time.monotonic() - t0 > a.warmup_timeout:
                raise SystemExit(f"the peer never made the primers readable (rc {peer.poll()})")
            time.sleep(0.2)
        warmup = time.monotonic() - t0
        n = a.rate * a.secs
        sent = {}
        start = time.monotonic()
        lat = {}
        next_poll = start
        i = 0
        while i < n or len(lat) < n:
            now = time.monotonic()
            due = min(n, int((now - start) * a.rate))
            while i < due:
                sent[i] = time.monotonic()
                send(i)
                i += 1
            prod.poll(0)
            if now >= next_poll:
                for s in seen():
                    if s >= 0 and s not in lat:
                        lat[s] = (time.monotonic() - sent[s]) * 1e3
                next_poll = time.monotonic() + a.poll_ms / 1e3
            if i >= n and now - start > a.secs + a.drain_timeout:
                break
            time.sleep(0.001)
        prod.flush(30)
    finally:
        try:
            os.killpg(peer.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        peer.wait(timeout=60)
    xs = list(lat.values())
    print(json.dumps({"rate": a.rate, "secs": a.secs, "samples": len(xs),
                      "unseen": n - len(xs), "warmup_s": round(warmup, 1),
                      "p50_ms": pct(xs, 0.5), "p99_ms": pct(xs, 0.99), "max_ms": max(xs) if xs else None,
                      "poll_ms": a.poll_ms}))


if __name__ == "__main__":
    main()
