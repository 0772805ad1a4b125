#!/usr/bin/env bash
# The change-stream example: start a throwaway Apache Kafka broker, produce a shop database's
# Debezium change events (schemas/sample/shop/: snapshot reads, inserts, updates), sink them
# into a graph, then produce the deletes with their tombstones (one of a product an order line
# still references) and sink those, and show the graph and its rejects.
#   bash scripts/shop.sh
# GRAPHSINK_DEMO_DIR  work dir holding the graph (default: <repo>/shop-data; wiped first)
# GRAPHSINK_TEST_BROKER=host:port  use that broker instead of starting Apache Kafka
# GRAPHSINK_TEST_BROKER_BACKEND=tansu  start tansu 0.6 instead (built once, ~13 minutes)
set -euo pipefail
caller_dir="$PWD"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

# Resolve the work dir against the caller's directory: the config resolves
# relative roots against its own directory (schemas/), so pass an absolute path.
demo_dir="${GRAPHSINK_DEMO_DIR:-$GRAPHSINK_REPO/shop-data}"
case "$demo_dir" in /*) ;; *) demo_dir="$caller_dir/$demo_dir" ;; esac
# Only wipe a directory that is empty or was made by an earlier demo run.
if [ -d "$demo_dir" ] && [ -n "$(ls -A "$demo_dir")" ] && [ ! -e "$demo_dir/.graphsink-demo" ]; then
    die "$demo_dir is not empty and not an earlier demo dir; refusing to wipe it"
fi
rm -rf "$demo_dir"
mkdir -p "$demo_dir"
touch "$demo_dir/.graphsink-demo"

ensure_build_deps
trap stop_broker EXIT
if [ -n "${GRAPHSINK_TEST_BROKER:-}" ]; then
    log "note: an external broker keeps topics and group offsets between runs; the demo expects fresh ones"
fi
use_broker

log "building graphsink (debug) in $CARGO_TARGET_DIR"
cargo build --locked -p graphsink
gs="$CARGO_TARGET_DIR/debug/graphsink"

# schemas/shop.toml reads these through ${VAR} expansion.
export GRAPHSINK_BROKER="$GRAPHSINK_TEST_BROKER"
export GRAPHSINK_GRAPH_ROOT="$demo_dir/graph"
cfg=schemas/shop.toml
log "broker $GRAPHSINK_BROKER, graph root $GRAPHSINK_GRAPH_ROOT"

step() {
    printf '\n$ graphsink %s\n' "$*" >&2
    "$gs" "$@"
}
d=schemas/sample/shop
for t in customers products orders order_lines; do
    step produce --config "$cfg" --topic "shop.public.$t" --partitions 2 --file "$d/$t.jsonl"
done
step check --config "$cfg"
step run --config "$cfg" --exit-at-end
# The deletes, each followed by its tombstone (a no-op). Product p-3 is on
# order 100's line: under on_delete_referenced = "reject" it stays, and the
# delete is a `referenced` reject.
for t in customers products order_lines; do
    step produce --config "$cfg" --topic "shop.public.$t" --partitions 2 --file "$d/$t-deletes.jsonl"
done
step run --config "$cfg" --exit-at-end
step show --config "$cfg"
step rejects --config "$cfg"
log "shop example finished; the graph is in $GRAPHSINK_GRAPH_ROOT"
