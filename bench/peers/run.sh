#!/usr/bin/env bash
# Peers side by side (issue 39): one private Apache Kafka 4.4, one produced
# backlog per round, graphsink's bench on it, then each peer on the very
# same topics with its own consumer group. See bench/peers/README.md.
#
#   bash bench/peers/run.sh [--records N] [--edge-fraction F] [--rounds R]
#                           [--peers graphsink,python,kdi,iceberg] [--out DIR]
#                           [--iceberg-commit-s S]
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../scripts/lib.sh
source "$here/../../scripts/lib.sh"
# shellcheck source=lib.sh
source "$here/lib.sh"

records=1000000 edge_fraction=0 rounds=1 peers=python out="" iceberg_commit_s=""
while [ $# -gt 0 ]; do
    case "$1" in
        --records) records="$2"; shift 2 ;;
        --edge-fraction) edge_fraction="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --peers) peers="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --iceberg-commit-s) iceberg_commit_s="$2"; shift 2 ;;
        *) die "unknown flag $1 (see the header of $0)" ;;
    esac
done
peers_start "$PEERS_CACHE/runs/$(date -u +%Y%m%dT%H%M%S)" "$peers"
log "results in $out"

for round in $(seq 1 "$rounds"); do
    dir="$out/r$round"
    mkdir -p "$dir"
    # graphsink and its same-run baselines; it produces the backlog and
    # leaves the topics on the broker for the peers.
    log "round $round: graphsink-bench --records $records --edge-fraction $edge_fraction"
    "$bench_bin" --broker "$GRAPHSINK_TEST_BROKER" --records "$records" \
        --edge-fraction "$edge_fraction" --latency-rate 0 --json "$dir/bench.json" \
        --work-dir "$dir/work" \
        >"$dir/bench.out" 2>"$dir/bench.err" || die "the bench failed: $dir/bench.err"
    topics="$(sed -n 's/^producing .* to \(.*\) \.\.\.$/\1/p' "$dir/bench.err")"
    nodes_topic="${topics%%, *}"
    edges_topic=""
    [ "$topics" = "$nodes_topic" ] || edges_topic="${topics#*, }"
    echo "{\"nodes_topic\": \"$nodes_topic\", \"edges_topic\": \"$edges_topic\"}" >"$dir/topics.json"
    for p in ${peers//,/ }; do
        log "round $round: peer $p on $topics"
        pdir="$dir/$p"
        mkdir -p "$pdir"
        case "$p" in
            # graphsink as a user runs it: the release binary on the
            # bench's own config (a group and a graph of its own), timed as
            # a process like the peers: start and final fold included.
            graphsink)
                measured "$dir/$p" "$graphsink_bin" run --exit-at-end \
                    --config "$(graphsink_peer_config "$dir/work" "peer-graphsink-$round-$$" "$pdir/graph")" ;;
            python)
                measured "$dir/$p" "$PEERS_PYTHON" "$here/python/sink.py" \
                    --bootstrap "$GRAPHSINK_TEST_BROKER" --nodes-topic "$nodes_topic" \
                    ${edges_topic:+--edges-topic "$edges_topic"} \
                    --group "peer-python-$round-$$" --out "$pdir" --exit-at-end ;;
            kdi) run_kdi "$dir" "$pdir" "$nodes_topic" "$edges_topic" "$round" ;;
            iceberg) run_iceberg "$dir" "$pdir" "$nodes_topic" "$edges_topic" "$round" "$iceberg_commit_s" ;;
        esac || log "peer $p failed in round $round: see $dir/$p.err"
        rm -rf "$pdir"/*.lance "$pdir"/warehouse "$pdir"/delta-* "$pdir"/graph 2>/dev/null
    done
    rm -rf "$dir/work"
done
"$PEERS_PYTHON" "$here/summarize.py" "$out" | tee "$out/summary.md"
