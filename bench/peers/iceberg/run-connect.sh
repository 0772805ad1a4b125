#!/usr/bin/env bash
# run-connect.sh PEER_DIR CONNECTOR_NAME TOPICS: one measured Connect run
# (bench/peers/iceberg/lib.sh writes the properties and wraps this in
# /usr/bin/time). Starts ConnectStandalone, waits until the connector's
# group (connect-NAME) has committed every partition's end offset and the
# tables hold every record (wait_committed.py says why both), stops
# the worker, and reads the tables back with pyiceberg.
set -uo pipefail
pdir="$1" name="$2" topics="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
start=$(date +%s.%N)
java -Xms256m -Xmx1g -Dlog4j2.configurationFile="$here/log4j2.properties" \
    -cp "$ICEBERG_LIBS/*" org.apache.kafka.connect.cli.ConnectStandalone \
    "$pdir/worker.properties" "$pdir/sink.properties" >"$pdir/connect.log" 2>&1 &
jpid=$!
"$PEERS_PYTHON" "$here/wait_committed.py" "$GRAPHSINK_TEST_BROKER" "connect-$name" "$topics" \
    --pid "$jpid" --timeout "${ICEBERG_TIMEOUT_S:-900}" --warehouse "$pdir/warehouse"
rc=$?
end=$(date +%s.%N)
kill "$jpid" 2>/dev/null
wait "$jpid" 2>/dev/null
[ "$rc" -eq 0 ] || { echo "the connector's offsets never reached the end (log: $pdir/connect.log)" >&2; exit 1; }
"$PEERS_PYTHON" "$here/read_tables.py" "$pdir/warehouse" --secs "$(echo "$end - $start" | bc -l)"
