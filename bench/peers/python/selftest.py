#!/usr/bin/env python3
"""The peers tooling's own check (scripts/test.sh runs it; no peer is
installed for it): produce a tiny node/edge backlog with repeated keys to a
real broker, run sink.py --exit-at-end on it, and require that it consumed
every record and that each Lance table holds one row per distinct key, with
each key's last value. Asserts counts, never speed."""

import json
import os
import subprocess
import sys
import tempfile
import time

import lance
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


def main():
    bs = os.environ["GRAPHSINK_TEST_BROKER"]
    run = f"{os.getpid()}-{int(time.time())}"
    items, links = f"peers-selftest-items-{run}", f"peers-selftest-links-{run}"
    admin = AdminClient({"bootstrap.servers": bs})
    for f in admin.create_topics([NewTopic(t, 3, 1) for t in (items, links)]).values():
        f.result()
    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True})
    last = {}
    for i in range(3000):  # 3000 node records over 700 keys
        sku = f"k{(i * 7919) % 700:04d}"
        v = {"sku": sku, "seq": i, "pad": "x" * 20}
        last[sku] = i
        p.produce(items, key=sku, value=json.dumps(v))
    for m in range(500):  # 500 edge records over 120 ids
        p.produce(links, key=f"e{m % 120}",
                  value=json.dumps({"src": "k0001", "dst": "k0002", "seq": m, "pad": ""}))
    assert p.flush(30) == 0, "records left unsent"
    with tempfile.TemporaryDirectory() as out:
        r = subprocess.run(
            [sys.executable, os.path.join(os.path.dirname(__file__), "sink.py"),
             "--bootstrap", bs, "--nodes-topic", items, "--edges-topic", links,
             "--group", f"peers-selftest-{run}", "--out", out, "--batch", "1000",
             "--exit-at-end"],
            capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["records"] == 3500, got
        assert got["rows"] == {"Item": 700, "Link": 120}, got
        seqs = lance.dataset(f"{out}/Item.lance").to_table(columns=["sku", "seq"]).to_pylist()
        assert {row["sku"]: row["seq"] for row in seqs} == last, "a key lost its last value"
    print("peers selftest: 1 passed, 0 failed")


if __name__ == "__main__":
    main()
