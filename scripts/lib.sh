# shellcheck shell=bash
# Helpers shared by scripts/test.sh and scripts/demo.sh. Source it, don't run it.
# Every function is safe under `set -euo pipefail`.
#
#   ensure_build_deps   install protoc, a C toolchain, OpenSSL headers (apt)
#   ensure_tansu        install the tansu 0.6.0 test broker once; sets TANSU_BIN
#   use_broker          GRAPHSINK_TEST_BROKER if set, else ensure_tansu + start_broker
#   start_broker        start tansu on a free loopback port; sets GRAPHSINK_TEST_BROKER
#   stop_broker         stop it again (idempotent; callers: `trap stop_broker EXIT`)

GRAPHSINK_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GRAPHSINK_CACHE="${GRAPHSINK_CACHE:-${HOME:?HOME is not set}/.cache/graphsink}"
# The build cache lives outside the clone so CI (and fresh clones) reuse it.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$GRAPHSINK_CACHE/target}"
export GRAPHSINK_REPO GRAPHSINK_CACHE

TANSU_VERSION=0.6.0
TANSU_ROOT="$GRAPHSINK_CACHE/tansu-$TANSU_VERSION"

log() { printf '[graphsink] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

ensure_build_deps() {
    local pkgs=()
    have protoc || pkgs+=(protobuf-compiler)          # lance's build runs protoc
    { have gcc && have make; } || pkgs+=(build-essential)  # librdkafka, zstd, ...
    have perl || pkgs+=(perl)
    have python3 || pkgs+=(python3)                   # used below to pick ports
    have pkg-config || pkgs+=(pkg-config)             # openssl-sys finds OpenSSL so
    [ -e /usr/include/openssl/ssl.h ] || pkgs+=(libssl-dev)  # rdkafka's "ssl" feature
    if [ "${#pkgs[@]}" -gt 0 ]; then
        have apt-get || die "missing build tools (${pkgs[*]}) and no apt-get; install them yourself"
        log "installing build dependencies with apt-get: ${pkgs[*]}"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" </dev/null
    fi
    have cargo || die "cargo not found: install Rust (https://rustup.rs) first"
}

ensure_tansu() {
    export TANSU_BIN="$TANSU_ROOT/bin/tansu"
    if [ ! -x "$TANSU_BIN" ]; then
        log "installing tansu $TANSU_VERSION (a release build, about 13 minutes, once per machine) into $TANSU_ROOT"
        mkdir -p "$GRAPHSINK_CACHE"
        # flock: a parallel test.sh/demo.sh waits for this install instead of racing it.
        # dynostore (no default features) is enough for memory:// storage and builds fastest.
        # shellcheck disable=SC2016  # $1.. expand in the inner shell
        flock "$GRAPHSINK_CACHE/tansu-install.lock" bash -c '
            [ -x "$1/bin/tansu" ] || cargo install tansu --version "$2" --locked \
                --no-default-features --features dynostore \
                --root "$1" --target-dir "$3/tansu-build" </dev/null
        ' _ "$TANSU_ROOT" "$TANSU_VERSION" "$GRAPHSINK_CACHE"
        [ -x "$TANSU_BIN" ] || die "tansu install finished but $TANSU_BIN is missing"
    fi
}

# Uses the broker the user gave in GRAPHSINK_TEST_BROKER, or starts a private one.
use_broker() {
    if [ -n "${GRAPHSINK_TEST_BROKER:-}" ]; then
        log "using external broker GRAPHSINK_TEST_BROKER=$GRAPHSINK_TEST_BROKER (starting none)"
    else
        ensure_tansu
        start_broker
    fi
}

_now_ms() { local t="${EPOCHREALTIME//[.,]/}"; echo $((t / 1000)); }  # bash >= 5

_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# True while the process exists and is not a zombie (an unreaped child still
# answers `kill -0`, so check its state in /proc).
_alive() {
    local state
    [ -r "/proc/$1/stat" ] || return 1
    state="$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

start_broker() {
    [ -z "${_GS_BROKER_PID:-}" ] || die "start_broker: a broker is already running (pid $_GS_BROKER_PID)"
    : "${TANSU_BIN:?run ensure_tansu first}"
    local port url dir deadline started
    port="$(_free_port)"
    url="tcp://127.0.0.1:$port"
    dir="$(mktemp -d "${TMPDIR:-/tmp}/graphsink-broker.XXXXXX")"
    _GS_BROKER_DIR="$dir"
    _GS_BROKER_LOG="$dir/tansu.log"
    started="$(_now_ms)"
    # setsid gives the broker its own process group, so stop_broker can kill the
    # whole group; the inner shell records its own pid before exec'ing tansu
    # (setsid may fork, which would make $! the wrong pid).
    # shellcheck disable=SC2016
    setsid bash -c 'echo "$$" >"$1"; shift; exec "$@"' _ "$dir/pid" \
        "$TANSU_BIN" broker --listener-url "$url" --advertised-listener-url "$url" \
        --storage-engine memory://tansu/ </dev/null >"$_GS_BROKER_LOG" 2>&1 &
    _GS_BROKER_LAUNCHER=$!
    deadline=$((SECONDS + 30))
    while [ ! -s "$dir/pid" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.05; done
    _GS_BROKER_PID="$(cat "$dir/pid" 2>/dev/null || true)"
    [ -n "$_GS_BROKER_PID" ] || _broker_failed "the broker process did not start"
    # Ready = the port accepts connections and a Kafka request (list topics) succeeds.
    until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null &&
        timeout 5 "$TANSU_BIN" topic list --broker "$url" >/dev/null 2>&1; do
        _alive "$_GS_BROKER_PID" || _broker_failed "tansu exited during startup"
        [ "$SECONDS" -lt "$deadline" ] || _broker_failed "tansu not ready on $url after 30 s"
        sleep 0.2
    done
    export GRAPHSINK_TEST_BROKER="127.0.0.1:$port"
    log "tansu broker ready at $GRAPHSINK_TEST_BROKER in $(($(_now_ms) - started)) ms (pid $_GS_BROKER_PID, log $_GS_BROKER_LOG)"
}

_broker_failed() {
    log "ERROR: $1; last lines of $_GS_BROKER_LOG:"
    tail -n 40 "$_GS_BROKER_LOG" >&2 || true
    stop_broker
    exit 1
}

# Idempotent and never fails, so it is safe in an EXIT trap (it keeps the
# caller's exit status).
stop_broker() {
    local pid="${_GS_BROKER_PID:-}" i
    if [ -n "$pid" ]; then
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do _alive "$pid" || break; sleep 0.1; done
        if _alive "$pid"; then
            log "tansu (pid $pid) ignored SIGTERM for 10 s; killing it"
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    if [ -n "${_GS_BROKER_LAUNCHER:-}" ]; then
        # Never block here: only reap a launcher that has exited.
        [ -n "$pid" ] || kill -KILL "$_GS_BROKER_LAUNCHER" 2>/dev/null || true
        _alive "$_GS_BROKER_LAUNCHER" || wait "$_GS_BROKER_LAUNCHER" 2>/dev/null || true
    fi
    [ -z "${_GS_BROKER_DIR:-}" ] || rm -rf "$_GS_BROKER_DIR"
    [ -z "$pid" ] || unset GRAPHSINK_TEST_BROKER   # only if it was ours
    _GS_BROKER_PID="" _GS_BROKER_LAUNCHER="" _GS_BROKER_DIR=""
    return 0
}
