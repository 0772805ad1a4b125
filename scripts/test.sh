#!/usr/bin/env bash
# Runs the whole test suite against a throwaway Apache Kafka 4.4 broker
# (KRaft, its jars resolved from Maven Central once per machine).
#   bash scripts/test.sh [cargo test args] [-- test binary args]
# Set GRAPHSINK_TEST_BROKER=host:port to use a broker of your own instead,
# and GRAPHSINK_TEST_S3=http://host:port for an S3 server of your own (it
# must enforce conditional PUTs; the test bucket is created if missing).
# GRAPHSINK_TEST_BROKER_BACKEND=tansu runs the tests and the chaos short form
# against tansu 0.6 instead (built once, about 13 minutes);
# GRAPHSINK_TEST_BROKER_BACKEND=containers against Kafka in a container
# (needs Docker; the test build always has that backend compiled in).
# A private Prometheus (Debian's package) is started for
# tests/e2e/ops.rs, and Apicurio Registry (a Confluent-compatible Schema
# Registry, from Maven Central; GRAPHSINK_TEST_REGISTRY=URL takes another)
# with Confluent's Python serializers for tests/e2e/formats.rs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

ensure_build_deps

# Split our args at `--` so the default --test-threads=4 stays on the test
# binary's side (after a second `--` libtest would take it for a test filter).
# Four on two cores: the e2e tests mostly wait (on Kafka's sessions, on
# moto), and four took the suite from 866 s to 638 s (docs/kafka.md, "Cold
# and warm costs"); the machine's cores are not libtest's default here.
cargo_args=() test_args=()
while [ "$#" -gt 0 ]; do
    if [ "$1" = -- ]; then shift; test_args=("$@"); break; fi
    cargo_args+=("$1"); shift
done
case " ${test_args[*]} " in
    *" --test-threads"*) ;;                 # the caller chose a thread count
    *) test_args=(--test-threads=4 "${test_args[@]}") ;;
esac

# The whole suite's installs (each idempotent, flock'd, once per machine),
# in the background at a lower priority while cargo builds. Its own log;
# a failure here is only reported: the same install runs again in the
# foreground below, where it stops the run with its reason.
prefetch_installs() {
    _prefetch_log="$(mktemp "${TMPDIR:-/tmp}/graphsink-prefetch.XXXXXX")"
    (
        renice -n 10 -p "$BASHPID" >/dev/null 2>&1 || true
        t="$(_now_ms)"
        [ -n "${GRAPHSINK_TEST_BROKER:-}" ] || ensure_kafka
        [ -n "${GRAPHSINK_TEST_S3:-}" ] || ensure_moto
        ensure_toxiproxy
        ensure_prometheus
        [ -n "${GRAPHSINK_TEST_REGISTRY:-}" ] || ensure_apicurio
        ensure_sr_client
        bash scripts/check-deploy.sh --install
        bash scripts/debezium/run.sh --install
        log "installs done in $(($(_now_ms) - t)) ms"
    ) >"$_prefetch_log" 2>&1 &
    _prefetch_pid=$!
    # A failed build stops the run: the installs stop with it.
    trap '[ -z "${_prefetch_pid:-}" ] || { pkill -P "$_prefetch_pid"; kill "$_prefetch_pid"; } 2>/dev/null; true' EXIT
}
wait_prefetch() {
    if wait "$_prefetch_pid"; then
        tail -n 1 "$_prefetch_log" >&2
    else
        log "the background installs failed (log below); retrying each in the foreground"
        tail -n 20 "$_prefetch_log" >&2
    fi
    rm -f "$_prefetch_log"
    _prefetch_pid=""
}

# Lint gates, first and before any server starts: formatting, then clippy
# with every warning an error (the workspace's lints are in Cargo.toml).
# Clippy runs as the test build's own compiler of graphsink's crates, the
# way `cargo clippy` runs it (RUSTC_WORKSPACE_WRAPPER=clippy-driver, the
# lint flags in CLIPPY_ARGS), so the gate shares the test build's
# artifacts: a separate `cargo clippy` checked every dependency a second
# time, about 10 minutes of a cold run. It covers every crate and target
# (`--all-targets`), as `cargo clippy --workspace --all-targets` does.
# For the whole suite (no cargo arguments, as CI runs it) or GRAPHSINK_LINT=1.
if [ "${#cargo_args[@]}" -eq 0 ] || [ "${GRAPHSINK_LINT:-}" = 1 ]; then
    cargo fmt --version >/dev/null 2>&1 || die "cargo fmt is missing: rustup component add rustfmt"
    clippy_driver="$(rustc --print sysroot)/bin/clippy-driver"
    [ -x "$clippy_driver" ] || die "clippy-driver is missing ($clippy_driver): rustup component add clippy"
    log "lint: cargo fmt --all --check"
    cargo fmt --all --check || die "cargo fmt --all --check: run \`cargo fmt --all\`"
    export RUSTC_WORKSPACE_WRAPPER="$clippy_driver"
    export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
    # The servers' installs run meanwhile (a cold machine: ~2.5 minutes of
    # downloads and small builds hidden behind a ~30-minute cargo build).
    prefetch_installs
    log "lint: clippy -D warnings inside the test build (cargo test --workspace --all-targets --locked --no-run)"
    lint_started=$SECONDS
    cargo test --workspace --all-targets --locked --no-run \
        || die "the test build failed, or clippy found warnings (above; \`cargo clippy --workspace --all-targets -- -D warnings\` shows the same)"
    log "build and lint passed in $((SECONDS - lint_started)) s"
    wait_prefetch
fi

# Every server this run started is stopped on the way out, and the chaos
# halves (run in the background below) are taken down too; each harness
# stops the brokers it started. `set +e` first: under `set -e` a command
# that fails here (a pkill that finds the harness already gone) would end
# the trap before the servers are stopped, and leave them running.
stop_all() {
    set +e
    for p in ${chaos_pids[@]:-}; do pkill -TERM -P "$p"; done 2>/dev/null
    stop_broker; stop_s3; stop_prometheus; stop_apicurio
}
trap stop_all EXIT
use_broker
use_s3
# The secured cluster's tests (testkit/src/cluster.rs, tests/e2e/cluster.rs)
# put a Toxiproxy before each node; built once (the tests would build it
# too, but here its log stays out of theirs).
ensure_toxiproxy
# A real Prometheus scrapes graphsink in tests/e2e/ops.rs.
ensure_prometheus
start_prometheus
# The registry formats' tests: a real registry, and Confluent's serializers.
use_registry
ensure_sr_client
log "tests use broker GRAPHSINK_TEST_BROKER=${GRAPHSINK_TEST_BROKER:-(a container)}, S3 GRAPHSINK_TEST_S3=$GRAPHSINK_TEST_S3, Prometheus GRAPHSINK_TEST_PROMETHEUS=$GRAPHSINK_TEST_PROMETHEUS, Schema Registry GRAPHSINK_TEST_REGISTRY=$GRAPHSINK_TEST_REGISTRY"

status=0
cargo test --workspace --locked "${cargo_args[@]}" -- "${test_args[@]}" || status=$?

# The peers tooling's own check (bench/peers/README.md): the Python sink a
# user writes, on a tiny backlog on this broker, counts every record and
# key. The peers themselves do not run here. Whole suite or GRAPHSINK_PEERS_CHECK=1.
if [ "$status" -eq 0 ] && { [ "${#cargo_args[@]}" -eq 0 ] || [ "${GRAPHSINK_PEERS_CHECK:-}" = 1 ]; }; then
    log "bench/peers self-test (python/selftest.py)"
    "$SR_PYTHON" bench/peers/python/selftest.py || status=$?
fi

# What cannot run here (no Docker engine) is at least checked: the
# deployment files (compose schema, Prometheus config, the dashboard's
# queries and metric names). The testcontainers broker backend is compiled
# and linted by the test build itself (connector/Cargo.toml turns on the
# testkit's `containers` feature for the tests). Only for the whole suite
# or when GRAPHSINK_DEPLOY_CHECK=1.
if [ "$status" -eq 0 ] && { [ "${#cargo_args[@]}" -eq 0 ] || [ "${GRAPHSINK_DEPLOY_CHECK:-}" = 1 ]; }; then
    bash scripts/check-deploy.sh || status=$?
fi

# Real Debezium (scripts/debezium/): a PostgreSQL cluster's changes,
# captured by Debezium's connector in Kafka Connect 4.4, through the broker
# into the shop graph, checked against what the database says. Only for
# the whole suite or when GRAPHSINK_DEBEZIUM=1.
if [ "$status" -eq 0 ] && [ "${GRAPHSINK_TEST_BROKER_BACKEND:-kafka}" = kafka ] &&
    { [ "${#cargo_args[@]}" -eq 0 ] || [ "${GRAPHSINK_DEBEZIUM:-}" = 1 ]; }; then
    log "real Debezium into the shop graph (scripts/debezium/run.sh)"
    dbz_dir="$(mktemp -d /tmp/graphsink-debezium.XXXXXX)"
    if GRAPHSINK_TEST_BROKER= GRAPHSINK_DEBEZIUM_DIR="$dbz_dir" bash scripts/debezium/run.sh; then
        rm -rf "$dbz_dir"
    else
        status=1; log "real Debezium failed; its work dir is kept: $dbz_dir"
    fi
fi

# The reliability harness's short form (RELIABILITY.md): a fixed seed, 33
# kill -9 trials (every failpoint once), a broker freeze, a dead-letter
# outage, broker restarts, a full disk, group members and schema changes,
# each checked by the independent checker; then the cluster set's short
# form. It starts its own brokers (it must freeze and restart them). Only
# for the whole suite (no cargo arguments) or when GRAPHSINK_CHAOS=1.
if [ "$status" -eq 0 ] && { [ "${#cargo_args[@]}" -eq 0 ] || [ "${GRAPHSINK_CHAOS:-}" = 1 ]; }; then
    chaos_broker=()
    case "${GRAPHSINK_TEST_BROKER_BACKEND:-kafka}" in
        tansu) ensure_tansu; ensure_moto
               chaos_broker=(--broker-backend tansu --tansu "$TANSU_BIN" --moto "$MOTO_BIN")
               freeze=5 ;;
        # A 30 s freeze under load, after which a fresh `run --exit-at-end`
        # must end within 3 minutes (issue 33); tansu wedges after one.
        *) ensure_kafka; chaos_broker=(--broker-backend kafka); freeze=30 ;;
    esac
    # The test build's features (the tests turn on the testkit's
    # `containers`): other features would rebuild Lance and its tree.
    cargo build --locked -p graphsink -p graphsink-chaos --bins --features graphsink-testkit/containers
    # Two processes side by side, each with its own brokers: the phases
    # mostly wait (on sessions, freezes, restarts; 0.6-0.9 of a core each),
    # so the pair takes about the longer half's time, not the sum's. A
    # phase's seed is its place in the set, the same as in one process.
    log "graphsink-chaos short form (seed 1, ${chaos_broker[1]}): kills,disk beside freeze,dead-letters,restarts,members,migrate"
    chaos_pids=()
    for part in kills,disk freeze,dead-letters,restarts,members,migrate; do
        ( set -o pipefail
          "$CARGO_TARGET_DIR/debug/graphsink-chaos" --seed 1 --phases "$part" --trials 33 \
              --freezes "$freeze" --dead-letter-outage 5 --restarts 2 "${chaos_broker[@]}" 2>&1 |
              sed -u "s/^/[chaos ${part%%,*}] /" ) &
        chaos_pids+=("$!")
    done
    for pid in "${chaos_pids[@]}"; do wait "$pid" || status=$?; done
    # The cluster set's short form (RELIABILITY.md, "Kafka cluster"): the
    # secured three-node cluster, a rolling restart of its brokers and a
    # kill -9 of the leader of graphsink's partitions, each under the live
    # producer and ending with the full audit (3.5–4 minutes).
    if [ "${GRAPHSINK_TEST_BROKER_BACKEND:-kafka}" = kafka ]; then
        log "graphsink-chaos cluster short form (seed 1, three secured Kafka nodes)"
        "$CARGO_TARGET_DIR/debug/graphsink-chaos" --seed 1 --cluster 3 \
            --phases rolling-restart,kill-leader || status=$?
    fi
fi
exit "$status"
