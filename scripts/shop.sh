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

demo_start shop-data "$caller_dir"
cfg=schemas/shop.toml

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
