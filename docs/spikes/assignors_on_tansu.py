"""Which assignment does tansu 0.6 + librdkafka give two group members that
subscribe to two co-partitioned topics (4 partitions each)?
docs/decisions/0007-scale-out.md, "Ownership and the assignor".

    python3 -m venv /tmp/plv && /tmp/plv/bin/pip install confluent-kafka
    (source scripts/lib.sh && ensure_tansu && start_broker &&
     /tmp/plv/bin/python docs/spikes/assignors_on_tansu.py "$GRAPHSINK_TEST_BROKER";
     stop_broker)

Each trial starts member C1, then C2 six seconds later, and prints every
assign/revoke callback with its time; topics show as `a`/`b`.
"""
import sys
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

BROKER = sys.argv[1]
RUN = uuid.uuid4().hex[:6]
TOPICS = [f'a-{RUN}', f'b-{RUN}']
ADMIN = AdminClient({'bootstrap.servers': BROKER})  # kept: its futures die with it
for f in ADMIN.create_topics([NewTopic(t, 4, 1) for t in TOPICS]).values():
    f.result()
producer = Producer({'bootstrap.servers': BROKER})
for t in TOPICS:
    for p in range(4):
        producer.produce(t, key=b'k', value=b'v', partition=p)
producer.flush(10)


def names(ps):
    return sorted((x.topic[0], x.partition) for x in ps)


def member(name, group, props, log, stop):
    classic = props.get('group.protocol') != 'consumer'
    timeouts = {'session.timeout.ms': 6000, 'heartbeat.interval.ms': 500} if classic else {}
    c = Consumer({'bootstrap.servers': BROKER, 'group.id': group,
                  'auto.offset.reset': 'earliest', **timeouts, **props})
    c.subscribe(TOPICS,
                on_assign=lambda c, ps: log.append((time.time(), name, 'assign', names(ps))),
                on_revoke=lambda c, ps: log.append((time.time(), name, 'revoke', names(ps))))
    while not stop.is_set():
        m = c.poll(0.2)
        if m is not None and m.error():
            log.append((time.time(), name, 'error', str(m.error())))
    log.append((time.time(), name, 'holds at the end', names(c.assignment())))
    c.close()


def trial(label, props, second_after=6, total=20):
    log, stop = [], threading.Event()
    group = f'g-{label}-{RUN}'
    threads = [threading.Thread(target=member, args=(n, group, props, log, stop)) for n in ('C1', 'C2')]
    threads[0].start()
    time.sleep(second_after)
    threads[1].start()
    time.sleep(total - second_after)
    stop.set()
    for t in threads:
        t.join()
    t0 = log[0][0] if log else time.time()
    print(f'== {label} {props}')
    for t, n, what, ps in log:
        print(f'  {t - t0:6.2f}s {n} {what} {ps}')


trial('range', {'partition.assignment.strategy': 'range'})
trial('cooperative-sticky', {'partition.assignment.strategy': 'cooperative-sticky'})
trial('kip848', {'group.protocol': 'consumer', 'group.remote.assignor': 'range'}, total=14)
