"""Issue 49's schedule, repeated: what did a member's offset commits do
around a broker freeze, and what was a fresh `run --exit-at-end` given?
(docs/kafka.md, "Commits before a freeze").

Per run, on a fresh topic (4 partitions) and group: a producer of keyed
JSON records (10,000 ids, ~300/s) runs throughout; one `graphsink run`
member (bucket sharding, defaults otherwise) until the graph holds 3 fold
commits; the group's committed offsets; the broker's JVM SIGSTOPped for
30 s, SIGCONT; SIGTERM to the member 3 s later; the committed offsets once
it exited; then at once `graphsink run --exit-at-end`, timed. Every log
line is stamped with seconds since the run began.

Started by freeze_commits.sh, which starts the broker and sets
GRAPHSINK_TEST_BROKER, FREEZE_BROKER_PID and FREEZE_BROKER_LOG.
"""
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BIN, RUNS, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
BROKER = os.environ['GRAPHSINK_TEST_BROKER']
BROKER_PID = int(os.environ['FREEZE_BROKER_PID'])
BROKER_LOG = os.environ['FREEZE_BROKER_LOG']
PARTS, IDS, RATE = 4, 10_000, 300
FREEZE_S, TERM_AFTER_S, FOLDS = 30, 3, 3
# The fresh run may wait for the departed member's session (45 s, the
# librdkafka default) plus a rebalance; past this it is stopped.
FRESH_BOUND_S = 240
# FREEZE_SESSION_MS sets the member's session.timeout.ms (librdkafka's
# default is 45000; the test and chaos harnesses use 6000).
SESSION = (f'"session.timeout.ms" = "{os.environ["FREEZE_SESSION_MS"]}"\n'
           if os.environ.get('FREEZE_SESSION_MS') else '')
ENV = dict(os.environ, NO_COLOR='1',
           RUST_LOG='info,graphsink=debug,librdkafka=debug,lance=warn')

SCHEMA = 'node Person { name: String @key  age: I32?  city: String? }\n'
CONFIG = '''[graph]
root = "graph"
schema = "graph.pg"

[kafka]
"bootstrap.servers" = "{broker}"
"group.id" = "{group}"
"debug" = "cgrp"
{session}
[[mapping]]
topic = "{topic}"
node = "Person"
'''


class Proc:
    """A graphsink process whose output lines are stamped and kept."""

    def __init__(self, args, path, t0):
        self.t0 = t0
        self.lines = []
        self.file = open(path, 'w')
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  env=ENV, text=True, errors='replace')
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            t = time.monotonic() - self.t0
            self.lines.append((round(t, 3), line.rstrip('\n')))
            self.file.write(f'{t:8.3f} {line}')
        self.file.close()

    def wait(self, bound, signalled):
        """The exit code within `bound` s; past it, a process already sent
        SIGTERM (`signalled`) is stuck and killed, another gets SIGTERM
        and 60 s more."""
        try:
            code = self.p.wait(bound)
        except subprocess.TimeoutExpired:
            if signalled:
                self.p.kill()
                code = f'killed: still running {bound} s after SIGTERM ({self.p.wait(60)})'
            else:
                self.p.send_signal(signal.SIGTERM)
                try:
                    code = f'stopped after {bound} s (exit {self.p.wait(60)})'
                except subprocess.TimeoutExpired:
                    self.p.kill()
                    code = f'killed: still running 60 s after SIGTERM ({self.p.wait(60)})'
        self.reader.join(10)
        return code

    def grep(self, pattern):
        return [(t, strip(l)) for t, l in list(self.lines) if re.search(pattern, l)]


ANSI = re.compile(r'\x1b\[[0-9;]*m')


def strip(line):
    return ANSI.sub('', line)


def producer(topic, stop):
    p = Producer({'bootstrap.servers': BROKER, 'linger.ms': 20})
    rnd, seq = random.Random(1), 0
    while not stop.is_set():
        for _ in range(RATE // 10):
            i = rnd.randrange(IDS)
            seq += 1
            p.produce(topic, key=f'p{i}',
                      value=json.dumps({'name': f'p{i}', 'age': seq % 100_000}))
        p.poll(0)
        time.sleep(0.1)
    p.flush(60)


def committed(group, topic):
    """The group's committed offset per partition (None: none)."""
    c = Consumer({'bootstrap.servers': BROKER, 'group.id': group})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(PARTS)], timeout=15)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) if tp.error is None
                else str(tp.error) for tp in got}
    except KafkaException as e:
        return {'error': str(e)}
    finally:
        c.close()


def ends(topic):
    c = Consumer({'bootstrap.servers': BROKER, 'group.id': 'freeze-probe'})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
                for p in range(PARTS)}
    finally:
        c.close()


def graph_commits(cfg):
    """The graph's commits that carry offsets, oldest first: the highest
    offset each folded per partition."""
    r = subprocess.run([BIN, 'log', '--config', cfg], capture_output=True, text=True, env=ENV)
    commits, cur = [], None
    for line in r.stdout.splitlines():
        if line.startswith('commit '):
            cur = {}
            commits.append(cur)
        m = re.match(r'\s+offsets (\S+)/(\d+)\s+(\d+)\.\.=(\d+)', line)
        if m and cur is not None:
            cur[int(m[2])] = int(m[4])
    return [c for c in reversed(commits) if c]


def one_run(n):
    d = os.path.join(OUT, f'run-{n}')
    os.makedirs(d, exist_ok=True)
    tag = f'{int(time.time())}-{n}'
    topic, group = f'freeze_items_{tag}', f'freeze_group_{tag}'
    with open(os.path.join(d, 'graph.pg'), 'w') as f:
        f.write(SCHEMA)
    cfg = os.path.join(d, 'graphsink.toml')
    with open(cfg, 'w') as f:
        f.write(CONFIG.format(broker=BROKER, group=group, topic=topic, session=SESSION))
    admin = AdminClient({'bootstrap.servers': BROKER})
    admin.create_topics([NewTopic(topic, PARTS, 1)])[topic].result(30)
    broker_log_at = os.path.getsize(BROKER_LOG)
    t0 = time.monotonic()
    facts = {'topic': topic, 'group': group}

    def now():
        return round(time.monotonic() - t0, 3)

    stop = threading.Event()
    prod = threading.Thread(target=producer, args=(topic, stop), daemon=True)
    prod.start()
    member = Proc([BIN, 'run', '--config', cfg], os.path.join(d, 'member.log'), t0)
    deadline = time.monotonic() + 300
    while True:
        folds = graph_commits(cfg) if os.path.isdir(os.path.join(d, 'graph')) else []
        if len(folds) >= FOLDS or time.monotonic() > deadline or member.p.poll() is not None:
            break
        time.sleep(2)
    facts['folds_before'] = folds
    facts['folded_high_before'] = {p: max(c.get(p, -1) for c in folds) for p in range(PARTS)}
    facts['committed_before'] = committed(group, topic)
    facts['ends_before'] = ends(topic)
    facts['t_freeze'] = now()
    os.kill(BROKER_PID, signal.SIGSTOP)
    time.sleep(FREEZE_S)
    os.kill(BROKER_PID, signal.SIGCONT)
    facts['t_thaw'] = now()
    time.sleep(TERM_AFTER_S)
    member.p.send_signal(signal.SIGTERM)
    facts['t_sigterm'] = now()
    facts['member_exit'] = member.wait(120, signalled=True)
    facts['t_member_exited'] = now()
    # At once: the fresh run starts before anything else is asked.
    fresh = Proc([BIN, 'run', '--exit-at-end', '--config', cfg],
                 os.path.join(d, 'fresh.log'), t0)
    facts['t_fresh_start'] = now()
    facts['committed_after_stop'] = committed(group, topic)
    # At most this: the fresh run reads its end offsets a moment later.
    facts['ends_at_fresh_start'] = ends(topic)
    facts['fresh_exit'] = fresh.wait(FRESH_BOUND_S, signalled=False)
    facts['t_fresh_exited'] = now()
    facts['committed_after_fresh'] = committed(group, topic)
    facts['ends_after_fresh'] = ends(topic)
    stop.set()
    prod.join(90)
    facts['member'] = {
        k: member.grep(p) for k, p in {
            'assigned': r'event="assigned"|assigned count=|\bassigned\b.*partitions=',
            'revoked': r'\brevoked\b.*partitions=',
            'commit_failed': r'offset commit failed|async commit failed|commit on revoke failed',
            'committed_on_revoke': r'committed on revoke',
            'stopped': r'stopped after',
            'close': r'consumer close did not finish',
            'drain_failed': r'stopping without committing further',
        }.items()}
    # librdkafka's commit replies (debug "cgrp"): which commits the broker refused.
    facts['member']['commit_replies'] = member.grep(r'OffsetCommit.*(returned|failed|error)|COMMIT.*[Ee]rr')
    facts['member']['commit_replies_total'] = len(member.grep(r'OffsetCommit'))
    facts['fresh'] = {
        k: fresh.grep(p) for k, p in {
            'assigned': r'event="assigned"|assigned count=|\bassigned\b.*partitions=',
            'revoked': r'\brevoked\b.*partitions=',
            'waiting': r'waiting for',
            'end': r'event="exit_at_end"|all assigned partitions are durable',
            'stopped': r'stopped after',
        }.items()}
    with open(BROKER_LOG) as f:
        f.seek(broker_log_at)
        broker = [l.rstrip('\n') for l in f if group in l or 'fenc' in l.lower()
                  or 'Unload' in l or 'Loading' in l or 'Loaded' in l]
    with open(os.path.join(d, 'broker.log'), 'w') as f:
        f.write('\n'.join(broker) + '\n')
    with open(os.path.join(d, 'facts.json'), 'w') as f:
        json.dump(facts, f, indent=1)
    return facts


def main():
    summary = []
    for n in range(1, RUNS + 1):
        f = one_run(n)
        print(json.dumps({k: f[k] for k in (
            'committed_before', 'folded_high_before', 'committed_after_stop', 'member_exit',
            'fresh_exit', 't_fresh_start', 't_fresh_exited', 'committed_after_fresh',
            'ends_after_fresh')}), flush=True)
        print('  fresh assigned:', f['fresh']['assigned'], flush=True)
        summary.append(f)
    with open(os.path.join(OUT, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=1)


main()
