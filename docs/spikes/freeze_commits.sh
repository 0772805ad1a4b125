#!/usr/bin/env bash
# Issue 49's schedule, repeated (docs/kafka.md, "Commits before a freeze"):
# a private Apache Kafka 4.4 broker whose group coordinator logs at INFO,
# then docs/spikes/freeze_commits.py against it. Needs the Python with
# confluent-kafka that scripts/test.sh installs (ensure_sr_client).
#
#   docs/spikes/freeze_commits.sh BIN RUNS OUT   # e.g. target/debug/graphsink 9 /tmp/freeze-new
#   FREEZE_SESSION_MS=6000 docs/spikes/freeze_commits.sh ...   # the member's session.timeout.ms
#   python3 docs/spikes/freeze_commits_report.py OUT            # one line per run
#
# Writes OUT/run-N/ (the member's and the fresh run's logs, the broker's
# coordinator lines, facts.json) and OUT/summary.json. Generated; not for git.
set -euo pipefail
bin="$(realpath "$1")" runs="$2" out="$3"
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/../../scripts/lib.sh"
ensure_kafka
ensure_sr_client
mkdir -p "$out"
out="$(realpath "$out")"

# The broker's own config, with the group coordinator, its runtime and the
# controller at INFO (the repo's log4j2.yaml keeps WARN).
conf="$(mktemp -d)"
trap 'stop_kafka; rm -rf "$conf"' EXIT
mkdir -p "$conf/scripts/kafka"
cp "$GRAPHSINK_REPO/scripts/kafka/server.properties" "$conf/scripts/kafka/"
sed '/^    Logger:/a\
      - name: org.apache.kafka.coordinator.group\
        level: INFO\
      - name: org.apache.kafka.coordinator.common.runtime\
        level: INFO\
      - name: org.apache.kafka.controller.BrokerHeartbeatManager\
        level: INFO\
      - name: org.apache.kafka.controller.ReplicationControlManager\
        level: INFO' "$GRAPHSINK_REPO/scripts/kafka/log4j2.yaml" >"$conf/scripts/kafka/log4j2.yaml"
GRAPHSINK_REPO="$conf" start_kafka

FREEZE_BROKER_PID="$_GS_BROKER_PID" FREEZE_BROKER_LOG="$_GS_BROKER_LOG" \
    "$SR_PYTHON" "$(dirname "$0")/freeze_commits.py" "$bin" "$runs" "$out"
