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

demo_start demo-data "$caller_dir"
cfg=schemas/social.toml

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
