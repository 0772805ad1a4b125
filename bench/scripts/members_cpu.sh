#!/usr/bin/env bash
# CPU per record with 1, 2 and 4 `graphsink run` members of one group on a
# partition-sharded graph (docs/perf/2026-12-03-scale-out-cpu-per-record-with-1-2-and-4-members.md, "Scale-out"). The members join
# first; then RECORDS ~100 B records are produced while they run, and their
# CPU (utime+stime, /usr/bin/time) is read once every offset is committed
# and they stop. Usage: bench/scripts/members_cpu.sh <release graphsink> [records] [rounds]
set -euo pipefail
BIN=$(realpath "$1"); RECORDS=${2:-1000000}; ROUNDS=${3:-1}
cd "$(dirname "$0")/../.." && source scripts/lib.sh
ensure_tansu >/dev/null
W=$(mktemp -d "${TMPDIR:-/tmp}/graphsink-members-cpu.XXXXXX")
start_broker
trap 'stop_broker; rm -rf "$W"' EXIT
cat > $W/g.pg <<'PG'
node Item { id: String @key  name: String  qty: I32 }
PG
python3 - "$RECORDS" > $W/data.jsonl <<'PY'
import sys, json
n = int(sys.argv[1])
pad = "x" * 60
for i in range(n):
    print(json.dumps({"key": f"i{i}", "value": {"id": f"i{i}", "name": f"{pad}{i}", "qty": i % 1000}}))
PY
cpu_of() { awk '{print $14+$15}' /proc/$1/stat; }
TPID=$_GS_BROKER_PID
tck=$(getconf CLK_TCK)
for round in $(seq 1 $ROUNDS); do
for N in 1 2 4; do
  D=$W/n$N-r$round; mkdir -p $D
  T=items-n$N-r$round
  cat > $D/c.toml <<TOML
[graph]
root = "graph"
schema = "../g.pg"
[kafka]
"bootstrap.servers" = "$GRAPHSINK_TEST_BROKER"
"group.id" = "g-n$N-r$round"
"session.timeout.ms" = "6000"
[wal]
sharding = "partition"
[[mapping]]
topic = "$T"
node = "Item"
TOML
  head -1 $W/data.jsonl > $D/one.jsonl
  $BIN produce --config $D/c.toml --topic $T --file $D/one.jsonl --partitions 8 > $D/produce0.log 2>&1
  pids=()
  for m in $(seq 1 $N); do
    /usr/bin/time -f "%e %U %S" -o $D/time-$m $BIN run --config $D/c.toml > $D/run-$m.log 2>&1 &
    pids+=($!)
  done
  sleep 15
  t0=$(cpu_of $TPID); s0=$(date +%s.%N)
  $BIN produce --config $D/c.toml --topic $T --file $W/data.jsonl --partitions 8 > $D/produce.log 2>&1
  s_prod=$(date +%s.%N)
  for i in $(seq 1 600); do
    lag=$($BIN status --config $D/c.toml --json 2>/dev/null | python3 -c 'import sys,json; print(json.load(sys.stdin)["kafka"]["total_lag"])' || echo x)
    [ "$lag" = 0 ] && break
    sleep 0.5
  done
  s1=$(date +%s.%N); t1=$(cpu_of $TPID)
  for p in "${pids[@]}"; do pkill -TERM -P $p 2>/dev/null || true; done
  rc=0; for p in "${pids[@]}"; do wait $p || rc=$?; done
  cpu=$(cat $D/time-* | awk '{u+=$2; s+=$3} END {print u+s}')
  echo "N=$N round=$round rc=$rc produce_s=$(echo "$s_prod - $s0" | bc) caught_up_s=$(echo "$s1 - $s0" | bc) graphsink_cpu=$cpu broker_cpu_during=$(echo "($t1 - $t0)/$tck" | bc -l | cut -c1-6) per_member=$(cat $D/time-* | awk '{printf "%s+%s ", $2, $3}') records=$(grep -h 'stopped after' $D/run-*.log | sed 's/.*stopped after \([0-9]*\).*/\1/' | paste -sd+)"
done
done
