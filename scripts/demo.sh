#!/usr/bin/env bash
# The end-to-end demo: start a throwaway Apache Kafka broker, produce the sample people and
# companies, sink them into a graph, fold it and show the result.
#   bash scripts/demo.sh
# GRAPHSINK_DEMO_DIR  work dir holding the graph (default: <repo>/demo-data; wiped first)
# GRAPHSINK_TEST_BROKER=host:port  use that broker instead of starting Apache Kafka
# GRAPHSINK_TEST_BROKER_BACKEND=tansu  start tansu 0.6 instead (built once, ~13 minutes)
set -euo pipefail
caller_dir="$PWD"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

# Resolve the work dir against the caller's directory: the config resolves
# relative roots against its own directory (schemas/), so pass an absolute path.
demo_dir="${GRAPHSINK_DEMO_DIR:-$GRAPHSINK_REPO/demo-data}"
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

# schemas/social.toml reads these through ${VAR} expansion.
export GRAPHSINK_BROKER="$GRAPHSINK_TEST_BROKER"
export GRAPHSINK_GRAPH_ROOT="$demo_dir/graph"
cfg=schemas/social.toml
log "broker $GRAPHSINK_BROKER, graph root $GRAPHSINK_GRAPH_ROOT"

step() {
    printf '\n$ graphsink %s\n' "$*" >&2
    "$gs" "$@"
}
step produce --config "$cfg" --topic people --partitions 4 --file schemas/sample/people.jsonl
step produce --config "$cfg" --topic companies --partitions 4 --file schemas/sample/companies.jsonl
step produce --config "$cfg" --topic works_at --partitions 2 --file schemas/sample/works_at.jsonl
step produce --config "$cfg" --topic knows --partitions 2 --file schemas/sample/knows.jsonl
step check --config "$cfg"
step run --config "$cfg" --exit-at-end
step show --config "$cfg"
step log --config "$cfg"
# The sample data holds a few bad records on purpose: they are rejects now,
# in _ingest_rejects and on the dead-letter topic. Two edges wait for
# endpoints that have not arrived (pending).
step rejects --config "$cfg"
step status --config "$cfg"
log "demo finished; the graph is in $GRAPHSINK_GRAPH_ROOT"
