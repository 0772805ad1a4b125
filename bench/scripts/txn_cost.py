#!/usr/bin/env python3
"""Run: python3 bench/scripts/txn_cost.py BOOTSTRAP POLLS REJECTS_PER_POLL (needs confluent-kafka).

Per-poll cost of delivering record rejects: today (idempotent produce,
wait for the acks) against a Kafka transaction per poll, and against a
transaction that also carries the consumer offsets (what exactly once for
record rejects would need). Prints p50/p99 per poll in ms."""
import sys, time, statistics, uuid
from confluent_kafka import Producer, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

bs = sys.argv[1]; polls = int(sys.argv[2]); per = int(sys.argv[3])
topic = f"txcost-{uuid.uuid4().hex[:8]}"; src = topic + "-src"
adm = AdminClient({"bootstrap.servers": bs})
for f in adm.create_topics([NewTopic(topic, 1, 1), NewTopic(src, 1, 1)]).values(): f.result()
sp = Producer({"bootstrap.servers": bs})
for _ in range(1000): sp.produce(src, b"s")
sp.flush()
payload = b"x" * 300

def pct(xs):
    xs = sorted(xs); return f"p50 {statistics.median(xs):.2f} ms, p99 {xs[int(len(xs)*0.99)-1]:.2f} ms, mean {statistics.mean(xs):.2f} ms"

base = {"bootstrap.servers": bs, "acks": "all", "enable.idempotence": True, "linger.ms": 0}
p = Producer(base)
lat = []
for i in range(polls):
    t = time.perf_counter()
    for _ in range(per): p.produce(topic, payload)
    p.flush()
    lat.append((time.perf_counter() - t) * 1e3)
print(f"idempotent, wait for acks ({per} per poll): {pct(lat)}")

tp = Producer({**base, "transactional.id": "txcost-" + uuid.uuid4().hex})
tp.init_transactions()
lat = []
for i in range(polls):
    t = time.perf_counter()
    tp.begin_transaction()
    for _ in range(per): tp.produce(topic, payload)
    tp.commit_transaction()
    lat.append((time.perf_counter() - t) * 1e3)
print(f"transaction per poll ({per} per poll): {pct(lat)}")

c = Consumer({"bootstrap.servers": bs, "group.id": "txcost-" + uuid.uuid4().hex, "enable.auto.commit": False})
c.subscribe([src])
deadline = time.time() + 20
while not c.assignment() and time.time() < deadline:
    c.poll(0.2)
lat = []
for i in range(polls):
    t = time.perf_counter()
    tp.begin_transaction()
    for _ in range(per): tp.produce(topic, payload)
    tp.send_offsets_to_transaction([TopicPartition(src, 0, i + 1)], c.consumer_group_metadata())
    tp.commit_transaction()
    lat.append((time.perf_counter() - t) * 1e3)
print(f"transaction per poll with the consumer offsets ({per} per poll): {pct(lat)}")
c.close()
