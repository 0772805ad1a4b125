#!/usr/bin/env python3
"""Prints the peers table of one bench/peers/run.sh output folder.

Per round: graphsink and the bench's baselines (from bench.json), then each
peer (PEER.out's last JSON line, PEER.time.json from /usr/bin/time,
PEER.broker.json). CPU s per M records is the process's user+sys (for a
peer, its whole process, JVM included); the broker's CPU is its own column.
"""

import json
import pathlib
import re
import sys


def load(p):
    try:
        # (the first runs wrote bc's ".46" for 0.46)
        return json.loads(re.sub(r": \.", ": 0.", pathlib.Path(p).read_text()))
    except (OSError, ValueError):
        return None


def last_json(p):
    try:
        lines = pathlib.Path(p).read_text().strip().splitlines()
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def main(out):
    out = pathlib.Path(out)
    # Every sink to *visible*: graphsink to the graph commit that holds its
    # last record, each peer to its last table commit (it commits offsets
    # after it). graphsink's durable rate (to its last offset commit, data
    # in the WAL only) is a column of its own.
    print("| round | workload | sink | records/s (first record → last visible) "
          "| ×graphsink | records/s (wall, incl. start) | graphsink durable records/s | CPU s / M records "
          "| broker CPU s / M | peak RSS MiB | rows (expected) | correct |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for rdir in sorted(out.glob("r*")):
        b = load(rdir / "bench.json")
        if not b:
            continue
        w = b["workload"]
        n = w["records"]
        wl = f'{n} recs, {w["edge_records"]} edges'
        exp = b["expected_rows"]
        gs = b["graphsink_records_per_s"] or float("nan")
        timed = b["graphsink_timed_records"] or float("nan")
        # graphsink's process CPU over its whole backlog run (start to
        # exit, its last fold included): the sum of its thread groups.
        cpu = sum(g["cpu_secs"] for g in b.get("graphsink_threads", []))
        bc = b["broker_cpu_cores"].get("graphsink")  # none with --broker
        bcpu = "–" if bc is None else f"{bc * b['graphsink_secs'] / n * 1e6:.1f}"
        rows = ", ".join(f"{k} {v}" for k, v in b["graph_rows"].items() if v)
        wall = b.get("graphsink_wall_records_per_s")
        durable = b.get("graphsink_durable_records_per_s")
        print(f"| {rdir.name} | {wl} | graphsink | {gs:,.0f} | 1.00 "
              f"| {'–' if not wall else f'{wall:,.0f}'} "
              f"| {'–' if not durable else f'{durable:,.0f}'} "
              f"| {cpu / n * 1e6:.1f} "
              f"| {bcpu} "
              f"| {b['graphsink_peak_rss_mib'] or 0:.0f} | {rows} "
              f"| {'no' if b['count_mismatch'] else 'yes'} |")
        print(f"| {rdir.name} | {wl} | bare loop (ceiling) | {b['bare_records_per_s']:,.0f} "
              f"| {b['bare_records_per_s'] / gs:.2f} | – | – | – | – | – | – | – |")
        if b["direct_records_per_s"]:
            print(f"| {rdir.name} | {wl} | direct Lance load (bench, Rust) "
                  f"| {b['direct_records_per_s']:,.0f} | {b['direct_records_per_s'] / gs:.2f} "
                  f"| – | – | – | – | {b.get('direct_peak_rss_mib') or 0:.0f} | – | – |")
        # graphsink's release binary, `run --exit-at-end` as a process on
        # the bench's config (run.sh's `graphsink` peer): its wall, start
        # and final fold included, as each peer's is.
        t = load(rdir / "graphsink.time.json")
        if t is not None:
            br = load(rdir / "graphsink.broker.json") or {}
            print(f"| {rdir.name} | {wl} | graphsink binary, as a process | – | – "
                  f"| {n / t['wall_s']:,.0f} | – "
                  f"| {(t['user_s'] + t['sys_s']) / n * 1e6:.1f} "
                  f"| {br.get('broker_cpu_s', 0) / n * 1e6:.1f} "
                  f"| {t['max_rss_kib'] / 1024:.0f} | – "
                  f"| {'exit 0' if t.get('exit') == 0 else 'NO: exit ' + str(t.get('exit'))} |")
        want = {"nodes/Item": exp.get("nodes/Item", 0), "edges/Link": exp.get("edges/Link", 0)}
        for peer in ("python", "kdi", "iceberg", "iceberg-5s"):
            r = last_json(rdir / f"{peer}.out")
            t = load(rdir / f"{peer}.time.json")
            br = load(rdir / f"{peer}.broker.json") or {}
            if t is None:
                continue
            if not r:
                print(f"| {rdir.name} | {wl} | {peer} | failed: see {peer}.err "
                      "| – | – | – | – | – | – | – | no |")
                continue
            got = r.get("rows", {})
            # An appending peer (kdi, the Iceberg sink) holds one row per
            # record; a merging one (the Python script) one per key.
            exp_rows = ({"nodes/Item": w["node_records"], "edges/Link": w["edge_records"]}
                        if r.get("append") else want)
            ok = r.get("records") == n and all(
                got.get(k.split("/")[1], 0) == v for k, v in exp_rows.items() if v)
            rows = ", ".join(f"{k} {v}" for k, v in got.items())
            wanted = ", ".join(f"{k.split('/')[1]} {v}" for k, v in exp_rows.items() if v)
            rate = r.get("records_per_s", 0)
            print(f"| {rdir.name} | {wl} | {peer} | {rate:,.0f} | {rate / gs:.2f} "
                  f"| {n / t['wall_s']:,.0f} | – "
                  f"| {(t['user_s'] + t['sys_s']) / n * 1e6:.1f} "
                  f"| {br.get('broker_cpu_s', 0) / n * 1e6:.1f} "
                  f"| {t['max_rss_kib'] / 1024:.0f} | {rows} ({wanted}) "
                  f"| {'yes' if ok else 'NO'} |")


if __name__ == "__main__":
    main(sys.argv[1])
