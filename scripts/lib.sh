# shellcheck shell=bash
# Helpers shared by scripts/test.sh and scripts/demo.sh. Source it, don't run it.
# Every function is safe under `set -euo pipefail`.
#
#   ensure_build_deps   install protoc, a C toolchain, OpenSSL headers (apt)
#   ensure_kafka        resolve Apache Kafka 4.4.0's jars with Maven (scripts/kafka/pom.xml)
#                       into $GRAPHSINK_CACHE/kafka-4.4.0/libs once; sets KAFKA_LIBS
#   start_kafka         format a KRaft storage dir and start kafka.Kafka on free
#                       loopback ports; sets GRAPHSINK_TEST_BROKER
#   stop_kafka          stop it by its PID (idempotent)
#   ensure_tansu        install the tansu 0.6.0 test broker once; sets TANSU_BIN
#   start_tansu         start tansu on a free loopback port; sets GRAPHSINK_TEST_BROKER
#   use_broker          GRAPHSINK_TEST_BROKER if set; else the backend
#                       GRAPHSINK_TEST_BROKER_BACKEND names: kafka (the default:
#                       ensure_kafka + start_kafka), tansu (ensure_tansu +
#                       start_tansu), or containers (the tests start Kafka in a
#                       container)
#   stop_broker         stop whichever broker use_broker started (idempotent;
#                       callers: `trap stop_broker EXIT`)
#   ensure_moto         install moto's S3 server into a venv once; sets MOTO_BIN
#   use_s3              GRAPHSINK_TEST_S3 if set, else ensure_moto + start_s3
#   start_s3            start moto on a free loopback port, create the test
#                       bucket, refuse a server that ignores conditional PUTs;
#                       sets GRAPHSINK_TEST_S3
#   stop_s3             stop it again (idempotent)
#   ensure_prometheus   install Debian's prometheus (2.42: the server and
#                       promtool) with apt-get once; sets PROMETHEUS_BIN
#   start_prometheus    start a private Prometheus on a free loopback port,
#                       scraping every second the targets listed in a
#                       file_sd file; sets GRAPHSINK_TEST_PROMETHEUS (its
#                       URL) and GRAPHSINK_TEST_PROM_TARGETS (the file tests
#                       write their graphsink addresses into)
#   stop_prometheus     stop it again (idempotent)
#   ensure_apicurio     unpack Apicurio Registry 3.3.3 (a Confluent-compatible
#                       Schema Registry) from Maven Central once; finds a
#                       Java >= 21 for it; sets APICURIO_JAR, APICURIO_JAVA
#   start_apicurio      start it on free loopback ports, in memory; sets
#                       GRAPHSINK_TEST_REGISTRY (its /apis/ccompat/v7 URL)
#   stop_apicurio       stop it again (idempotent)
#   use_registry        GRAPHSINK_TEST_REGISTRY if set, else ensure_apicurio +
#                       start_apicurio
#   ensure_sr_client    Confluent's Python client with its Avro, Protobuf and
#                       JSON serializers, and pylance, in a venv once; sets
#                       SR_PYTHON (the tests' independent producer and reader)
#   ensure_toxiproxy    build Toxiproxy 2.5.0 with go install once; sets TOXIPROXY_BIN
#   start_kafka_cluster [N]  N (default 3) secured KRaft nodes (SASL_SSL
#                       SCRAM-SHA-512, mTLS, ACLs, RF 3) in network namespaces,
#                       and a client namespace whose Toxiproxy stands before
#                       each node; sets GRAPHSINK_CLUSTER_* (scripts/kafka/cluster.sh)
#   stop_kafka_cluster  stop it, delete its namespaces (idempotent)
#   cluster_exec CMD    run CMD in the client namespace
#   kafka_cluster_tool CLASS ARGS  a Kafka tool (AclCommand, ConfigCommand, ...)
#                       as the super user admin
#   kafka_cluster_node stop|kill|start|freeze|thaw ID
#   kafka_cluster_cut ID|all [blackhole|unreachable], kafka_cluster_heal
#   kafka_cluster_toxic TYPE ATTRS [ID|all] [STREAM], kafka_cluster_toxics_reset
#   netns_sweep         delete namespaces left by processes that are gone

GRAPHSINK_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GRAPHSINK_CACHE="${GRAPHSINK_CACHE:-${HOME:?HOME is not set}/.cache/graphsink}"
# The build cache lives outside the clone so CI (and fresh clones) reuse it.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$GRAPHSINK_CACHE/target}"
export GRAPHSINK_REPO GRAPHSINK_CACHE

TANSU_VERSION=0.6.0
MOTO_VERSION=5.2.1
MOTO_VENV="$GRAPHSINK_CACHE/moto-venv"
S3_TEST_BUCKET=graphsink-test   # testkit/src/s3.rs TEST_BUCKET
TANSU_ROOT="$GRAPHSINK_CACHE/tansu-$TANSU_VERSION"
KAFKA_VERSION=4.4.0             # scripts/kafka/pom.xml; testkit/src/kafka.rs
KAFKA_ROOT="$GRAPHSINK_CACHE/kafka-$KAFKA_VERSION"
APICURIO_VERSION=3.3.3          # scripts/apicurio/pom.xml
APICURIO_ROOT="$GRAPHSINK_CACHE/apicurio-$APICURIO_VERSION"
# Confluent's own serializers frame the test records (issue 34 names this
# version); pylance reads the graph back. docs/formats.md.
SR_CLIENT_PACKAGES="confluent-kafka[avro,protobuf,json]==2.16.1 pylance==14.0.2"
SR_CLIENT_VENV="$GRAPHSINK_CACHE/sr-client-venv"
# The broker JVM's heap (docs/kafka.md has the measurement behind it).
GRAPHSINK_KAFKA_HEAP="${GRAPHSINK_KAFKA_HEAP:--Xms256m -Xmx1g}"

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

# Apache Kafka's own jars from Maven Central, once per machine. The Rust
# testkit (testkit/src/kafka.rs) starts brokers from the same folder.
# .complete holds the sha256 of the pom it was resolved from: a pom that
# gained a dependency (kafka-tools did) is resolved again into the same
# folder, adding jars and removing none, so brokers running from it keep
# theirs.
ensure_kafka() {
    export KAFKA_LIBS="$KAFKA_ROOT/libs"
    local pom="$GRAPHSINK_REPO/scripts/kafka/pom.xml" want
    want="$(sha256sum "$pom" | cut -d' ' -f1)"
    [ "$(cat "$KAFKA_ROOT/.complete" 2>/dev/null)" = "$want" ] && return 0
    have java || die "java not found: Apache Kafka $KAFKA_VERSION needs Java 17 (the polyglot machine has it), or set GRAPHSINK_TEST_BROKER=host:port"
    have mvn || die "mvn not found: the test broker needs Maven Central (the polyglot machine) or GRAPHSINK_TEST_BROKER=host:port"
    log "resolving Apache Kafka $KAFKA_VERSION with Maven into $KAFKA_ROOT (once per machine)"
    mkdir -p "$GRAPHSINK_CACHE"
    local started; started="$(_now_ms)"
    # shellcheck disable=SC2016
    flock "$GRAPHSINK_CACHE/kafka-install.lock" bash -c '
        [ "$(cat "$1/.complete" 2>/dev/null)" = "$3" ] && exit 0
        [ -d "$1/libs" ] || { rm -rf "$1" && mkdir -p "$1"; }
        rm -f "$1/.complete" &&
            mvn -q -B -f "$2" dependency:copy-dependencies -DincludeScope=runtime \
                -DoutputDirectory="$1/libs" </dev/null >"$1/mvn.log" 2>&1 &&
            echo "$3" >"$1/.complete"
    ' _ "$KAFKA_ROOT" "$pom" "$want" || {
        tail -n 30 "$KAFKA_ROOT/mvn.log" >&2 || true
        die "could not resolve Apache Kafka $KAFKA_VERSION from Maven Central: the test broker needs Maven Central (the polyglot machine) or GRAPHSINK_TEST_BROKER=host:port"
    }
    log "Apache Kafka $KAFKA_VERSION resolved in $(($(_now_ms) - started)) ms ($(find "$KAFKA_LIBS" -name '*.jar' | wc -l) jars)"
}

# Uses the broker the user gave in GRAPHSINK_TEST_BROKER, or starts a private one.
use_broker() {
    if [ -n "${GRAPHSINK_TEST_BROKER:-}" ]; then
        log "using external broker GRAPHSINK_TEST_BROKER=$GRAPHSINK_TEST_BROKER (starting none)"
        return 0
    fi
    case "${GRAPHSINK_TEST_BROKER_BACKEND:-kafka}" in
        kafka) ensure_kafka; start_kafka ;;
        tansu) ensure_tansu; start_tansu ;;
        containers) log "broker backend: Kafka in a container (the tests start it; needs Docker)" ;;
        *) die "GRAPHSINK_TEST_BROKER_BACKEND=${GRAPHSINK_TEST_BROKER_BACKEND}: expected kafka (the default), tansu or containers" ;;
    esac
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

start_tansu() {
    [ -z "${_GS_BROKER_PID:-}" ] || die "start_tansu: a broker is already running (pid $_GS_BROKER_PID)"
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

# _stop_server NAME PID LAUNCHER DIR: SIGTERM to the server's process group
# (setsid made it its leader), SIGKILL after 10 s, reap its launcher, remove
# its folder. Never fails, so the stop_* functions are safe in EXIT traps.
_stop_server() {
    local name="$1" pid="$2" launcher="$3" dir="$4" i
    if [ -n "$pid" ]; then
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do _alive "$pid" || break; sleep 0.1; done
        if _alive "$pid"; then
            log "$name (pid $pid) ignored SIGTERM for 10 s; killing it"
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    if [ -n "$launcher" ]; then
        # Never block here: only reap a launcher that has exited.
        [ -n "$pid" ] || kill -KILL "$launcher" 2>/dev/null || true
        _alive "$launcher" || wait "$launcher" 2>/dev/null || true
    fi
    [ -z "$dir" ] || rm -rf "$dir"
    return 0
}

# Formats a KRaft storage directory (--standalone: this node is the whole
# controller quorum) and starts kafka.Kafka on two free loopback ports (the
# client listener and the controller). Ready = a metadata request answers.
start_kafka() {
    [ -z "${_GS_BROKER_PID:-}" ] || die "start_kafka: a broker is already running (pid $_GS_BROKER_PID)"
    : "${KAFKA_LIBS:?run ensure_kafka first}"
    local port cport dir deadline started cp
    port="$(_free_port)"
    cport="$(_free_port)"
    dir="$(mktemp -d "${TMPDIR:-/tmp}/graphsink-kafka.XXXXXX")"
    _GS_BROKER_DIR="$dir"
    _GS_BROKER_LOG="$dir/kafka.log"
    started="$(_now_ms)"
    sed -e "s|@PORT@|$port|g" -e "s|@CONTROLLER_PORT@|$cport|g" -e "s|@LOG_DIR@|$dir/data|g" \
        "$GRAPHSINK_REPO/scripts/kafka/server.properties" >"$dir/server.properties"
    cp="$KAFKA_LIBS/*"
    local java_opts=(-Dlog4j2.configurationFile="$GRAPHSINK_REPO/scripts/kafka/log4j2.yaml")
    java "${java_opts[@]}" -cp "$cp" kafka.tools.StorageTool format --standalone \
        --cluster-id "$(java -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null)" \
        --config "$dir/server.properties" </dev/null >"$_GS_BROKER_LOG" 2>&1 ||
        _broker_failed "kafka-storage format failed"
    # shellcheck disable=SC2016,SC2086  # the heap options are split on purpose
    setsid bash -c 'echo "$$" >"$1"; shift; exec "$@"' _ "$dir/pid" \
        java $GRAPHSINK_KAFKA_HEAP -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
        "${java_opts[@]}" -cp "$cp" kafka.Kafka "$dir/server.properties" \
        </dev/null >>"$_GS_BROKER_LOG" 2>&1 &
    _GS_BROKER_LAUNCHER=$!
    deadline=$((SECONDS + 60))
    while [ ! -s "$dir/pid" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.05; done
    _GS_BROKER_PID="$(cat "$dir/pid" 2>/dev/null || true)"
    [ -n "$_GS_BROKER_PID" ] || _broker_failed "the broker process did not start"
    until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && _kafka_answers "127.0.0.1:$port"; do
        _alive "$_GS_BROKER_PID" || _broker_failed "kafka exited during startup"
        [ "$SECONDS" -lt "$deadline" ] || _broker_failed "kafka not ready on 127.0.0.1:$port after 60 s"
        sleep 0.2
    done
    export GRAPHSINK_TEST_BROKER="127.0.0.1:$port"
    log "Apache Kafka $KAFKA_VERSION broker ready at $GRAPHSINK_TEST_BROKER in $(($(_now_ms) - started)) ms (pid $_GS_BROKER_PID, log $_GS_BROKER_LOG)"
}

# An ApiVersions request (v0) that gets a reply with error code 0: the broker
# answers Kafka requests, not just TCP. With a CA file as $2, over TLS,
# checking the broker's certificate and its address against it (ApiVersions
# is answered before SASL authentication).
_KAFKA_PROBE_PY='
import socket, ssl, struct, sys
host, port = sys.argv[1].rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=2)
if sys.argv[2]:
    s = ssl.create_default_context(cafile=sys.argv[2]).wrap_socket(s, server_hostname=host)
client = b"graphsink-probe"
body = struct.pack(">hhih", 18, 0, 1, len(client)) + client  # ApiVersions v0
s.sendall(struct.pack(">i", len(body)) + body)
def read(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise SystemExit(1)
        b += c
    return b
size, = struct.unpack(">i", read(4))
reply = read(size)
corr, err = struct.unpack(">ih", reply[:6])
sys.exit(0 if corr == 1 and err == 0 else 1)
'
_kafka_answers() { python3 -c "$_KAFKA_PROBE_PY" "$1" "${2:-}" 2>/dev/null; }

stop_kafka() { stop_broker; }

# Idempotent and never fails, so it is safe in an EXIT trap (it keeps the
# caller's exit status).
stop_broker() {
    local pid="${_GS_BROKER_PID:-}"
    _stop_server broker "$pid" "${_GS_BROKER_LAUNCHER:-}" "${_GS_BROKER_DIR:-}"
    [ -z "$pid" ] || unset GRAPHSINK_TEST_BROKER   # only if it was ours
    _GS_BROKER_PID="" _GS_BROKER_LAUNCHER="" _GS_BROKER_DIR=""
    return 0
}

# Python's venv module (Debian splits it out), for the tools installed
# from PyPI into venvs under $GRAPHSINK_CACHE.
ensure_python_venv() {
    python3 -m venv --help >/dev/null 2>&1 && return 0
    have apt-get || die "python3 has no venv module and there is no apt-get"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv </dev/null
}

ensure_moto() {
    export MOTO_BIN="$MOTO_VENV/bin/moto_server"
    if [ ! -x "$MOTO_BIN" ]; then
        log "installing moto $MOTO_VERSION (S3 server for the tests, about a minute, once per machine) into $MOTO_VENV"
        mkdir -p "$GRAPHSINK_CACHE"
        ensure_python_venv
        # shellcheck disable=SC2016
        flock "$GRAPHSINK_CACHE/moto-install.lock" bash -c '
            [ -x "$1/bin/moto_server" ] && exit 0
            rm -rf "$1" && python3 -m venv "$1" &&
                "$1/bin/pip" install -q --disable-pip-version-check "moto[server]==$2" </dev/null
        ' _ "$MOTO_VENV" "$MOTO_VERSION"
        [ -x "$MOTO_BIN" ] || die "moto install finished but $MOTO_BIN is missing"
    fi
}

use_s3() {
    if [ -n "${GRAPHSINK_TEST_S3:-}" ]; then
        log "using external S3 endpoint GRAPHSINK_TEST_S3=$GRAPHSINK_TEST_S3 (starting none)"
        _check_s3 "$GRAPHSINK_TEST_S3"
    else
        ensure_moto
        start_s3
    fi
}

# One raw request; prints the HTTP status. moto checks no signature, but it
# answers an anonymous request on an existing key with 403 before looking at
# its conditions, so the request carries a (dummy) Authorization header.
_s3_status() {
    local endpoint="$1" method="$2" path="$3"; shift 3
    curl -s -o /dev/null -w '%{http_code}' -X "$method" "$@" \
        -H 'Authorization: AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0' \
        "$endpoint$path"
}

# Creates the test bucket and refuses a server that ignores conditional PUTs.
_check_s3() {
    local ep="$1" key="/$S3_TEST_BUCKET/_probe/conditional-$$" code again stale
    have curl || die "curl is needed to check the S3 server"
    code="$(_s3_status "$ep" PUT "/$S3_TEST_BUCKET")"
    case "$code" in 200 | 409) ;; *) die "cannot create bucket $S3_TEST_BUCKET at $ep (HTTP $code)" ;; esac
    code="$(_s3_status "$ep" PUT "$key" -H 'If-None-Match: *' --data-binary x)"
    [ "$code" = 200 ] || die "a put-if-absent on $ep failed (HTTP $code)"
    again="$(_s3_status "$ep" PUT "$key" -H 'If-None-Match: *' --data-binary x)"
    stale="$(_s3_status "$ep" PUT "$key" -H 'If-Match: "0000000000000000"' --data-binary x)"
    _s3_status "$ep" DELETE "$key" >/dev/null || true
    if [ "$again" != 412 ] || [ "$stale" != 412 ]; then
        die "the S3 server at $ep does not enforce conditional PUTs (If-None-Match gave $again, If-Match gave $stale; both must be 412): Lance would lose commits on it"
    fi
}

start_s3() {
    [ -z "${_GS_S3_PID:-}" ] || die "start_s3: an S3 server is already running (pid $_GS_S3_PID)"
    : "${MOTO_BIN:?run ensure_moto first}"
    local port dir deadline started
    port="$(_free_port)"
    dir="$(mktemp -d "${TMPDIR:-/tmp}/graphsink-s3.XXXXXX")"
    _GS_S3_DIR="$dir" _GS_S3_LOG="$dir/moto.log"
    started="$(_now_ms)"
    # shellcheck disable=SC2016
    setsid bash -c 'echo "$$" >"$1"; shift; exec "$@"' _ "$dir/pid" \
        "$MOTO_BIN" -H 127.0.0.1 -p "$port" </dev/null >"$_GS_S3_LOG" 2>&1 &
    _GS_S3_LAUNCHER=$!
    deadline=$((SECONDS + 30))
    while [ ! -s "$dir/pid" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.05; done
    _GS_S3_PID="$(cat "$dir/pid" 2>/dev/null || true)"
    [ -n "$_GS_S3_PID" ] || _s3_failed "the S3 server process did not start"
    until [ "$(_s3_status "http://127.0.0.1:$port" GET /)" = 200 ]; do
        _alive "$_GS_S3_PID" || _s3_failed "moto_server exited during startup"
        [ "$SECONDS" -lt "$deadline" ] || _s3_failed "moto_server not ready on port $port after 30 s"
        sleep 0.1
    done
    export GRAPHSINK_TEST_S3="http://127.0.0.1:$port"
    # A subshell, so a refusal (die) still stops the server it started.
    (_check_s3 "$GRAPHSINK_TEST_S3") || { stop_s3; exit 1; }
    log "moto S3 server ready at $GRAPHSINK_TEST_S3 in $(($(_now_ms) - started)) ms (pid $_GS_S3_PID, log $_GS_S3_LOG)"
}

_s3_failed() {
    log "ERROR: $1; last lines of $_GS_S3_LOG:"
    tail -n 40 "$_GS_S3_LOG" >&2 || true
    stop_s3
    exit 1
}

stop_s3() {
    local pid="${_GS_S3_PID:-}"
    _stop_server moto "$pid" "${_GS_S3_LAUNCHER:-}" "${_GS_S3_DIR:-}"
    [ -z "$pid" ] || unset GRAPHSINK_TEST_S3
    _GS_S3_PID="" _GS_S3_LAUNCHER="" _GS_S3_DIR=""
    return 0
}

ensure_prometheus() {
    export PROMETHEUS_BIN="${PROMETHEUS_BIN:-/usr/bin/prometheus}"
    if [ ! -x "$PROMETHEUS_BIN" ] || ! have promtool; then
        have apt-get || die "prometheus not found and no apt-get: install Prometheus 2.x (and promtool) yourself"
        log "installing prometheus (Debian's package: the server and promtool) with apt-get"
        as_root apt-get update -qq
        # The package's service may not start here (policy-rc.d); the tests
        # run their own server, so that is fine.
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus </dev/null || true
        [ -x "$PROMETHEUS_BIN" ] || die "apt-get did not install $PROMETHEUS_BIN"
        have promtool || die "apt-get installed prometheus but promtool is missing"
    fi
}

start_prometheus() {
    [ -z "${_GS_PROM_PID:-}" ] || die "start_prometheus: one is already running (pid $_GS_PROM_PID)"
    : "${PROMETHEUS_BIN:?run ensure_prometheus first}"
    local port dir deadline started
    port="$(_free_port)"
    dir="$(mktemp -d "${TMPDIR:-/tmp}/graphsink-prometheus.XXXXXX")"
    _GS_PROM_DIR="$dir" _GS_PROM_LOG="$dir/prometheus.log"
    echo '[]' >"$dir/targets.json"
    # Tests add their own targets (with a `test` label) to targets.json;
    # Prometheus re-reads it every second. The job is named as in
    # deploy/prometheus/prometheus.yml, so the dashboard's queries (which
    # select `job="graphsink"`) are evaluated unchanged in tests/e2e/ops.rs.
    cat >"$dir/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: graphsink
    metrics_path: /metrics
    file_sd_configs:
      - files: ["$dir/targets.json"]
        refresh_interval: 1s
YAML
    started="$(_now_ms)"
    # shellcheck disable=SC2016
    setsid bash -c 'echo "$$" >"$1"; shift; exec "$@"' _ "$dir/pid" \
        "$PROMETHEUS_BIN" --config.file "$dir/prometheus.yml" \
        --storage.tsdb.path "$dir/data" --web.listen-address "127.0.0.1:$port" \
        </dev/null >"$_GS_PROM_LOG" 2>&1 &
    _GS_PROM_LAUNCHER=$!
    deadline=$((SECONDS + 30))
    while [ ! -s "$dir/pid" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.05; done
    _GS_PROM_PID="$(cat "$dir/pid" 2>/dev/null || true)"
    [ -n "$_GS_PROM_PID" ] || _prometheus_failed "the prometheus process did not start"
    until curl -sf "http://127.0.0.1:$port/-/ready" >/dev/null 2>&1; do
        _alive "$_GS_PROM_PID" || _prometheus_failed "prometheus exited during startup"
        [ "$SECONDS" -lt "$deadline" ] || _prometheus_failed "prometheus not ready on port $port after 30 s"
        sleep 0.1
    done
    export GRAPHSINK_TEST_PROMETHEUS="http://127.0.0.1:$port"
    export GRAPHSINK_TEST_PROM_TARGETS="$dir/targets.json"
    log "prometheus ready at $GRAPHSINK_TEST_PROMETHEUS in $(($(_now_ms) - started)) ms (pid $_GS_PROM_PID, targets $GRAPHSINK_TEST_PROM_TARGETS, log $_GS_PROM_LOG)"
}

_prometheus_failed() {
    log "ERROR: $1; last lines of $_GS_PROM_LOG:"
    tail -n 40 "$_GS_PROM_LOG" >&2 || true
    stop_prometheus
    exit 1
}

stop_prometheus() {
    local pid="${_GS_PROM_PID:-}"
    _stop_server prometheus "$pid" "${_GS_PROM_LAUNCHER:-}" "${_GS_PROM_DIR:-}"
    [ -z "$pid" ] || unset GRAPHSINK_TEST_PROMETHEUS GRAPHSINK_TEST_PROM_TARGETS
    _GS_PROM_PID="" _GS_PROM_LAUNCHER="" _GS_PROM_DIR=""
    return 0
}

# A java of version 21 or newer: Apicurio 3's classes need it (Kafka runs on
# the machine's Java 17). GRAPHSINK_JAVA21 names one; else JAVA_HOME, the
# JDKs under /usr/lib/jvm (the polyglot machine has Temurin 25 there), PATH.
_java21() {
    local j v
    for j in "${GRAPHSINK_JAVA21:-}" "${JAVA_HOME:+$JAVA_HOME/bin/java}" /usr/lib/jvm/*/bin/java "$(command -v java || true)"; do
        [ -n "$j" ] && [ -x "$j" ] || continue
        v="$("$j" -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2}')"
        if [ -n "$v" ] && [ "${v%%.*}" -ge 21 ] 2>/dev/null; then
            echo "$j"
            return 0
        fi
    done
    return 1
}

ensure_apicurio() {
    export APICURIO_JAR="$APICURIO_ROOT/quarkus-run.jar"
    APICURIO_JAVA="$(_java21)" || die "Apicurio Registry $APICURIO_VERSION needs Java 21 or newer and none was found (looked at GRAPHSINK_JAVA21, JAVA_HOME, /usr/lib/jvm/*, PATH); install one, or set GRAPHSINK_TEST_REGISTRY=http://host:port to a Confluent-compatible registry of your own"
    export APICURIO_JAVA
    [ -e "$APICURIO_ROOT/.complete" ] && return 0
    have mvn || die "mvn not found: Apicurio Registry comes from Maven Central (the polyglot machine), or set GRAPHSINK_TEST_REGISTRY"
    log "unpacking Apicurio Registry $APICURIO_VERSION from Maven Central into $APICURIO_ROOT (once per machine, ~160 MB)"
    mkdir -p "$GRAPHSINK_CACHE"
    local started; started="$(_now_ms)"
    # shellcheck disable=SC2016
    flock "$GRAPHSINK_CACHE/apicurio-install.lock" bash -c '
        [ -e "$1/.complete" ] && exit 0
        rm -rf "$1" && mkdir -p "$1" &&
            mvn -q -B -f "$2" package -DoutputDirectory="$1" \
                -Dmaven.repo.local="${MAVEN_REPO_LOCAL:-$HOME/.m2/repository}" </dev/null >"$1.mvn.log" 2>&1 &&
            [ -e "$1/quarkus-run.jar" ] && touch "$1/.complete"
    ' _ "$APICURIO_ROOT" "$GRAPHSINK_REPO/scripts/apicurio/pom.xml" || {
        tail -n 30 "$APICURIO_ROOT.mvn.log" >&2 || true
        die "could not unpack Apicurio Registry $APICURIO_VERSION from Maven Central; set GRAPHSINK_TEST_REGISTRY to a registry of your own"
    }
    # Maven's own target/ folder beside the pom is scratch.
    rm -rf "$GRAPHSINK_REPO/scripts/apicurio/target"
    log "Apicurio Registry $APICURIO_VERSION unpacked in $(($(_now_ms) - started)) ms"
}

# In memory (Apicurio's default storage: H2 in memory), on a free loopback
# port for the API and another for its health checks. Ready = /health/ready.
start_apicurio() {
    [ -z "${_GS_REG_PID:-}" ] || die "start_apicurio: a registry is already running (pid $_GS_REG_PID)"
    : "${APICURIO_JAR:?run ensure_apicurio first}"
    local port mport dir deadline started
    port="$(_free_port)"
    mport="$(_free_port)"
    dir="$(mktemp -d "${TMPDIR:-/tmp}/graphsink-registry.XXXXXX")"
    _GS_REG_DIR="$dir" _GS_REG_LOG="$dir/registry.log"
    started="$(_now_ms)"
    # Serial GC and C1 only: a test registry holds a few schemas, and on 2
    # cores the JIT's second tier costs more start time than it saves.
    # shellcheck disable=SC2016
    (cd "$dir" && setsid bash -c 'echo "$$" >"$1"; shift; exec "$@"' _ "$dir/pid" \
        "$APICURIO_JAVA" -Xms64m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
        -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$port" \
        -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port="$mport" \
        -Dquarkus.http.access-log.enabled=false \
        -jar "$APICURIO_JAR" </dev/null >"$_GS_REG_LOG" 2>&1) &
    _GS_REG_LAUNCHER=$!
    deadline=$((SECONDS + 90))
    while [ ! -s "$dir/pid" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.05; done
    _GS_REG_PID="$(cat "$dir/pid" 2>/dev/null || true)"
    [ -n "$_GS_REG_PID" ] || _registry_failed "the registry process did not start"
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$mport/health/ready")" = 200 ]; do
        _alive "$_GS_REG_PID" || _registry_failed "Apicurio Registry exited during startup"
        [ "$SECONDS" -lt "$deadline" ] || _registry_failed "Apicurio Registry not ready on port $port after 90 s"
        sleep 0.2
    done
    export GRAPHSINK_TEST_REGISTRY="http://127.0.0.1:$port/apis/ccompat/v7"
    log "Apicurio Registry $APICURIO_VERSION ready at $GRAPHSINK_TEST_REGISTRY in $(($(_now_ms) - started)) ms (pid $_GS_REG_PID, log $_GS_REG_LOG)"
}

_registry_failed() {
    log "ERROR: $1; last lines of $_GS_REG_LOG:"
    tail -n 40 "$_GS_REG_LOG" >&2 || true
    stop_apicurio
    exit 1
}

stop_apicurio() {
    local pid="${_GS_REG_PID:-}"
    _stop_server registry "$pid" "${_GS_REG_LAUNCHER:-}" "${_GS_REG_DIR:-}"
    [ -z "$pid" ] || unset GRAPHSINK_TEST_REGISTRY
    _GS_REG_PID="" _GS_REG_LAUNCHER="" _GS_REG_DIR=""
    return 0
}

use_registry() {
    if [ -n "${GRAPHSINK_TEST_REGISTRY:-}" ]; then
        log "using external Schema Registry GRAPHSINK_TEST_REGISTRY=$GRAPHSINK_TEST_REGISTRY (starting none)"
    else
        ensure_apicurio
        start_apicurio
    fi
}

ensure_sr_client() {
    export SR_PYTHON="$SR_CLIENT_VENV/bin/python"
    if [ ! -e "$SR_CLIENT_VENV/.complete" ]; then
        log "installing $SR_CLIENT_PACKAGES into $SR_CLIENT_VENV (once per machine)"
        mkdir -p "$GRAPHSINK_CACHE"
        ensure_python_venv
        local started; started="$(_now_ms)"
        # shellcheck disable=SC2016,SC2086
        flock "$GRAPHSINK_CACHE/sr-client-install.lock" bash -c '
            [ -e "$1/.complete" ] && exit 0
            rm -rf "$1" && python3 -m venv "$1" &&
                "$1/bin/pip" install -q --disable-pip-version-check $2 </dev/null &&
                touch "$1/.complete"
        ' _ "$SR_CLIENT_VENV" "$SR_CLIENT_PACKAGES" || die "could not install $SR_CLIENT_PACKAGES from PyPI"
        log "installed in $(($(_now_ms) - started)) ms"
    fi
}

# The examples' start (scripts/demo.sh, scripts/shop.sh): a fresh work dir
# ($GRAPHSINK_DEMO_DIR, else <repo>/$1, resolved against $2, the caller's
# directory, since a config resolves relative roots against its own), a
# broker (stopped on exit), a debug build of graphsink, and the config's
# environment. Sets demo_dir and gs, exports GRAPHSINK_BROKER and
# GRAPHSINK_GRAPH_ROOT, and defines step (runs graphsink, echoing it).
demo_start() {
    local default_name="$1" caller_dir="$2"
    demo_dir="${GRAPHSINK_DEMO_DIR:-$GRAPHSINK_REPO/$default_name}"
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
    # The example configs read these through ${VAR} expansion.
    export GRAPHSINK_BROKER="$GRAPHSINK_TEST_BROKER"
    export GRAPHSINK_GRAPH_ROOT="$demo_dir/graph"
    log "broker $GRAPHSINK_BROKER, graph root $GRAPHSINK_GRAPH_ROOT"
}

step() {
    printf '\n$ graphsink %s\n' "$*" >&2
    "$gs" "$@"
}

# The secured Kafka cluster in network namespaces (start_kafka_cluster and
# its helpers).
# shellcheck source=scripts/kafka/cluster.sh
source "$GRAPHSINK_REPO/scripts/kafka/cluster.sh"
