"""One line per run of freeze_commits.py (docs/kafka.md, "Commits before
a freeze"): what the group held before the freeze and after the member
stopped, which offset commits the broker refused and when, how the
member stopped, and what the fresh `--exit-at-end` run was given.

    python3 docs/spikes/freeze_commits_report.py OUT [OUT...]
"""
import collections
import glob
import json
import os
import re
import sys

REPLY = re.compile(r'OffsetCommit for (\d+) partition\(s\) in join-state (\S+): (\S+): returned: (.*?) fac=')


def replies(path, facts):
    """librdkafka's OffsetCommit replies, by phase and result."""
    phases = collections.OrderedDict(
        (k, collections.Counter()) for k in ('before', 'frozen+thaw', 'after SIGTERM'))
    for line in open(path, errors='replace'):
        m = REPLY.search(line)
        if not m:
            continue
        t = float(line.split(None, 1)[0])
        result = m[4]
        # librdkafka's local retry answer: the request is re-sent, not refused.
        if result.startswith('Local: Operation in progress'):
            continue
        phase = ('before' if t < facts['t_freeze'] else
                 'frozen+thaw' if t < facts['t_sigterm'] else 'after SIGTERM')
        phases[phase][result] += 1
    return {k: dict(v) for k, v in phases.items()}


def first(lines, pattern):
    for t, l in lines:
        if re.search(pattern, l):
            return t, l
    return None


def run_line(d):
    f = json.load(open(os.path.join(d, 'facts.json')))
    member_log = open(os.path.join(d, 'member.log'), errors='replace').read()
    fresh_log = os.path.join(d, 'fresh.log')
    before, after = f['committed_before'], f['committed_after_stop']
    ends = f.get('ends_at_fresh_start')
    final = f['committed_after_fresh']
    out = {
        'run': os.path.basename(d),
        'before': [before.get(str(p)) for p in range(4)],
        'folded': [f['folded_high_before'][str(p)] + 1 for p in range(4)],
        'after_stop': [after.get(str(p)) for p in range(4)],
        'replies': replies(os.path.join(d, 'member.log'), f),
        'session_timeout': 'SESSTMOUT' in member_log,
        'leave_sent': 'fac="LEAVE"' in member_log,
        'revoke_commit': [re.sub(r'.*error=', '', l) for _, l in f['member']['commit_failed']
                          if 'revoke' in l],
        'stopped': [l for _, l in f['member']['stopped']],
        'member_exit': f['member_exit'],
        'drain_failed': [re.sub(r'.*error=', '', l) for _, l in f['member'].get('drain_failed', [])],
        'fresh_assigned': [(round(t - f['t_fresh_start'], 1),
                            re.sub(r'.*partitions=', '', l).replace(f['topic'], ''))
                           for t, l in f['fresh']['assigned']],
        'fresh_exit': f['fresh_exit'],
        'fresh_took': round(f['t_fresh_exited'] - f['t_fresh_start'], 1),
        'final': [final.get(str(p)) for p in range(4)],
    }
    if ends:
        out['unread_at_exit'] = [p for p in range(4)
                                 if (final.get(str(p)) or 0) < ends[str(p)]]
    broker = open(os.path.join(d, 'broker.log'), errors='replace').read()
    # Each generation: its members, and whether its leader sent the
    # assignment (a leader that never does is a departed member).
    synced = set(re.findall(r'Assignment received from leader \S+ for group \S+ for generation (\d+)', broker))
    out['generations'] = [f'{g}:{n}{"" if g in synced else " (no assignment)"}' for g, n in
                          re.findall(r'Stabilized group \S+ generation (\d+) with (\d+) members', broker)]
    out['fenced'] = 'Fencing broker' in broker
    return out


for out_dir in sys.argv[1:]:
    print(f'== {out_dir}')
    for d in sorted(glob.glob(os.path.join(out_dir, 'run-*')),
                    key=lambda p: int(p.rsplit('-', 1)[1])):
        if not os.path.exists(os.path.join(d, 'facts.json')):
            print(json.dumps({'run': os.path.basename(d), 'incomplete': True}))
            continue
        print(json.dumps(run_line(d)))
