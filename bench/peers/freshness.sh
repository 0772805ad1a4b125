#!/usr/bin/env bash
# Steady-state freshness, peers beside graphsink, on one private Kafka 4.4:
# graphsink's own paced phase (graphsink-bench --latency-rate R, its
# graph-visible latency), then each peer under freshness.py's paced
# producer at the same rate and duration. See bench/peers/README.md.
#
#   bash bench/peers/freshness.sh [--rate R] [--secs S] [--peers python,iceberg,kdi] [--out DIR]
# GRAPHSINK_BENCH_ARGS adds flags to graphsink's bench (e.g. --background-nice 0).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../scripts/lib.sh
source "$here/../../scripts/lib.sh"
# shellcheck source=lib.sh
source "$here/lib.sh"

rate=5000 secs=10 peers=python,iceberg out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --rate) rate="$2"; shift 2 ;;
        --secs) secs="$2"; shift 2 ;;
        --peers) peers="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        *) die "unknown flag $1 (see the header of $0)" ;;
    esac
done
peers_start "$PEERS_CACHE/runs/freshness-$(date -u +%Y%m%dT%H%M%S)" "$peers"
bs="$GRAPHSINK_TEST_BROKER"

log "graphsink: graphsink-bench --latency-rate $rate --latency-secs $secs"
# shellcheck disable=SC2086  # GRAPHSINK_BENCH_ARGS: extra bench flags, split on purpose
"$bench_bin" --broker "$bs" --records 100000 --latency-rate "$rate" --latency-secs "$secs" ${GRAPHSINK_BENCH_ARGS:-} \
    --json "$out/bench.json" >"$out/bench.out" 2>"$out/bench.err" || log "the bench failed: $out/bench.err"

# graphsink's reads from another process (`graphsink-bench --freshness`,
# when the bench has it): the same rate and duration, a reader child that
# alternates a fresh read (base + unfolded generations + the WAL tail)
# and a head read (the graph commit).
if "$bench_bin" --help 2>/dev/null | grep -q -- '--freshness '; then
    log "graphsink: graphsink-bench --freshness $secs --freshness-rate $rate (reader in another process)"
    # shellcheck disable=SC2086
    "$bench_bin" --broker "$bs" --freshness "$secs" --freshness-rate "$rate" --partitions 8 --buckets 4 \
        ${GRAPHSINK_BENCH_ARGS:-} >"$out/graphsink-reads.txt" 2>"$out/graphsink-reads.err" ||
        log "graphsink's reads failed: $out/graphsink-reads.err"
fi

fresh() {  # fresh NAME TOPIC READER PEER_CMD
    log "freshness: $1"
    "$PEERS_PYTHON" "$here/freshness.py" --bootstrap "$bs" --topic "$2" \
        --rate "$rate" --secs "$secs" --reader "$3" --peer-cmd "$4" --drain-timeout "${drain:-120}" --warmup-timeout "${warmup:-180}" \
        >"$out/$1.out" 2>"$out/$1.err" ||
        log "freshness of $1 failed: $out/$1.err"
}
for p in ${peers//,/ }; do
    d="$out/$p"
    mkdir -p "$d"
    topic="fresh-$p-$(date +%s)"
    case "$p" in
        python)
            # Its batch window: 1 s (as written), and 5 s (graphsink's
            # fold.interval, the matched interval).
            for w in 1 5; do
                topic="fresh-python-$w-$(date +%s)"
                fresh "python-${w}s" "$topic" "lance:$d/w$w/Item.lance" \
                    "$PEERS_PYTHON $here/python/sink.py --bootstrap $bs --nodes-topic {topic} --group fresh-python-$w-$$ --out $d/w$w --max-wait $w --batch 1000000"
            done ;;
        iceberg)
            for c in 5 ""; do
                [ -n "$c" ] || [ "${FRESH_ICEBERG_DEFAULT:-0}" = 1 ] || continue
                dd="$d/commit-${c:-default}"
                mkdir -p "$dd/warehouse"
                topic="fresh-iceberg-$(date +%s%N)"
                drain=120 warmup=180
                # The default interval is 300 s: the primers wait for the
                # first commit, the paced records for the next.
                [ -n "$c" ] || drain=420 warmup=420
                iceberg_properties "$dd" "$topic" "$topic" "" "$c"
                fresh "iceberg-${c:-default}s" "$topic" "iceberg:$dd/warehouse" \
                    "java -Xms256m -Xmx1g -Dlog4j2.configurationFile=$ICEBERG_DIR/log4j2.properties -cp $ICEBERG_LIBS/* org.apache.kafka.connect.cli.ConnectStandalone $dd/worker.properties $dd/sink.properties"
            done ;;
        kdi)
            "$PEERS_PYTHON" "$here/kdi/delta_tables.py" create "$d"
            fresh kdi "$topic" "delta:$d/delta-Item" \
                "$KDI_BIN ingest {topic} file://$d/delta-Item -k $bs -g fresh-kdi-$$ -a fresh-kdi-$$ -l $KDI_LATENCY" ;;
    esac
done
"$PEERS_PYTHON" - "$out" <<'PY' | tee "$out/summary.md"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print("| sink | p50 ms | p99 ms | max ms | samples | unseen | note |")
print("|---|---|---|---|---|---|---|")
try:
    b = json.loads((out / "bench.json").read_text())
    g = b.get("graph_visible_latency") or {}
    print(f"| graphsink (graph-visible) | {g.get('p50_ms', 0):.0f} | {g.get('p99_ms', 0):.0f} | {g.get('max_ms', 0):.0f} | {g.get('samples')} | {b.get('graph_visible_unseen')} | bench's paced phase, fold.interval 5 s |")
    d = b.get("durable_ack_latency") or {}
    print(f"| graphsink (durable ack) | {d.get('p50_ms', 0):.0f} | {d.get('p99_ms', 0):.0f} | {d.get('max_ms', 0):.0f} | {d.get('samples')} | – | offsets committed, WAL durable |")
except (OSError, ValueError):
    pass
try:  # graphsink-bench --freshness: "| fresh | seen | p50 | p99 | max | read p50 | read p99 |"
    n = None
    for line in (out / "graphsink-reads.txt").read_text().splitlines():
        if line.startswith("freshness: "):
            n = int(line.split()[1])
        c = [x.strip() for x in line.strip("|").split("|")]
        if len(c) == 7 and c[0] in ("fresh", "head"):
            what = "fresh read (WAL tail, not a commit)" if c[0] == "fresh" else "head read (the graph commit)"
            print(f"| graphsink, {c[0]} read from another process | {c[2]} | {c[3]} | {c[4]} | {c[1]} | {n - int(c[1]) if n else '–'} | {what}; one read p50/p99 {c[5]}/{c[6]} ms |")
except OSError:
    pass
for f in sorted(out.glob("*.out")):
    if f.name == "bench.out":
        continue
    try:
        r = json.loads(f.read_text().strip().splitlines()[-1])
    except (IndexError, ValueError):
        print(f"| {f.stem} | failed: see {f.stem}.err | | | | | |")
        continue
    print(f"| {f.stem} | {r['p50_ms'] or 0:.0f} | {r['p99_ms'] or 0:.0f} | {r['max_ms'] or 0:.0f} | {r['samples']} | {r['unseen']} | reader polled every {r['poll_ms']} ms; peer warm-up {r['warmup_s']} s not counted |")
PY
