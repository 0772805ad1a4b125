# shellcheck shell=bash
# The secured Kafka cluster in network namespaces, for bash: sourced by
# scripts/lib.sh (its header lists the functions). testkit/src/cluster.rs is
# the Rust side, with the same topology, settings (cluster.properties) and
# certificates (certs.sh); docs/kafka.md, "The secured cluster", draws it.
#
# Every namespace is gsk<PID>x<TAG>-<host>, PID the process that made it,
# so a later start deletes what a dead one left (netns_sweep).

GRAPHSINK_KAFKA_CLUSTER_HEAP="${GRAPHSINK_KAFKA_CLUSTER_HEAP:--Xms128m -Xmx512m}"
TOXIPROXY_VERSION=2.5.0          # testkit/src/toxiproxy.rs VERSION
TOXIPROXY_ROOT="$GRAPHSINK_CACHE/toxiproxy-$TOXIPROXY_VERSION"
_GS_NET=10.77           # host k is 10.77.k.2, its router side 10.77.k.1
_GS_PROXY_NET=10.77.100 # node i as clients reach it: its Toxiproxy, 10.77.100.i
_GS_CLIENT_INDEX=50     # the bash cluster's one client host
# Kafka's short-lived tools (format, AclCommand, ...): C1 only and the
# serial collector start faster on 2 busy cores (testkit/src/cluster.rs TOOL_JVM).
_GS_TOOL_JVM="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xmx256m"

ensure_toxiproxy() {
    export TOXIPROXY_BIN="$TOXIPROXY_ROOT/bin/toxiproxy-server"
    [ -x "$TOXIPROXY_BIN" ] && return 0
    have go || die "go not found: Toxiproxy $TOXIPROXY_VERSION is built from the Go module proxy (go install)"
    log "building Toxiproxy $TOXIPROXY_VERSION with go install into $TOXIPROXY_ROOT (about a minute, once per machine)"
    mkdir -p "$GRAPHSINK_CACHE"
    local started; started="$(_now_ms)"
    # shellcheck disable=SC2016
    flock "$GRAPHSINK_CACHE/toxiproxy-install.lock" bash -c '
        [ -x "$1/bin/toxiproxy-server" ] && exit 0
        rm -rf "$1" && mkdir -p "$1/bin" &&
            GOBIN="$1/bin" GOFLAGS="-mod=mod -buildvcs=false" \
                go install "github.com/Shopify/toxiproxy/v2/cmd/server@v$2" </dev/null >"$1.log" 2>&1 &&
            mv "$1/bin/server" "$1/bin/toxiproxy-server"
    ' _ "$TOXIPROXY_ROOT" "$TOXIPROXY_VERSION" || {
        tail -n 20 "$TOXIPROXY_ROOT.log" >&2 || true
        die "could not build Toxiproxy $TOXIPROXY_VERSION from the Go module proxy"
    }
    [ -x "$TOXIPROXY_BIN" ] || die "Toxiproxy install finished but $TOXIPROXY_BIN is missing"
    log "Toxiproxy $TOXIPROXY_VERSION built in $(($(_now_ms) - started)) ms"
}

# Kills what runs in a namespace and deletes it (never fails).
_netns_delete() {
    local pids
    pids="$(ip netns pids "$1" 2>/dev/null || true)"
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    ip netns del "$1" 2>/dev/null || true
}

# Deletes the namespaces of processes that are gone (a crashed test, a
# killed shell), with whatever still ran in them.
netns_sweep() {
    local ns
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
        [[ "$ns" =~ ^gsk([0-9]+)x ]] || continue
        _alive "${BASH_REMATCH[1]}" && continue
        log "deleting the stale network namespace $ns (its process ${BASH_REMATCH[1]} is gone)"
        _netns_delete "$ns"
    done
}

# _netns_host PREFIX INDEX LABEL: the namespace PREFIX-LABEL at
# 10.77.INDEX.2, a veth pair to the router namespace PREFIX-hub, which
# forwards between hosts and has no way out of the machine.
_netns_host() {
    local hub="$1-hub" ns="$1-$3" i="$2"
    ip netns add "$ns" &&
        ip -n "$hub" link add "h$i" type veth peer name eth0 netns "$ns" &&
        ip -n "$hub" addr add "$_GS_NET.$i.1/24" dev "h$i" &&
        ip -n "$hub" link set "h$i" up &&
        ip -n "$ns" link set lo up &&
        ip -n "$ns" addr add "$_GS_NET.$i.2/24" dev eth0 &&
        ip -n "$ns" link set eth0 up &&
        ip -n "$ns" route add "$_GS_NET.0.0/16" via "$_GS_NET.$i.1"
}

_secret() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }

# A KRaft id (cluster or directory): 16 random bytes, URL-safe base64, not
# starting with "-" (argparse would take it for an option).
_kraft_id() {
    python3 -c 'import base64, os
while True:
    s = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
    if not s.startswith("-"):
        print(s)
        break'
}

_cluster_failed() {
    log "ERROR: $1 (logs in ${_GS_CLUSTER_DIR:-?}; the last lines of each node's:)"
    local f
    for f in "${_GS_CLUSTER_DIR:-/nonexistent}"/node*/kafka.log; do
        [ -e "$f" ] && { log "--- $f"; tail -n 15 "$f" >&2; }
    done
    _GS_CLUSTER_KEEP=1 stop_kafka_cluster
    exit 1
}

# _cluster_launch ID: starts node ID's JVM in its namespace (its data
# directory as it is: formatted once, kept across restarts).
_cluster_launch() {
    local i="$1" d="$_GS_CLUSTER_DIR/node$1"
    rm -f "$d/pid"
    # shellcheck disable=SC2016,SC2086
    ip netns exec "$_GS_CLUSTER_PREFIX-node$i" setsid bash -c 'echo "$$" >"$1"; shift; exec "$@"' _ "$d/pid" \
        java $GRAPHSINK_KAFKA_CLUSTER_HEAP -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$GRAPHSINK_REPO/scripts/kafka/log4j2.yaml" \
        -cp "$KAFKA_LIBS/*" kafka.Kafka "$d/server.properties" </dev/null >>"$d/kafka.log" 2>&1 &
    disown   # stop_kafka_cluster kills it; no "Killed" job notice then
    local deadline=$((SECONDS + 10))
    while [ ! -s "$d/pid" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.05; done
    [ -s "$d/pid" ] || _cluster_failed "node $i's JVM did not start"
}

# _cluster_wait_node ID: until node ID answers over TLS through the client
# host's proxy.
_cluster_wait_node() {
    local i="$1" deadline=$((SECONDS + ${2:-120})) pid
    pid="$(cat "$_GS_CLUSTER_DIR/node$i/pid")"
    until cluster_exec python3 -c "$_KAFKA_PROBE_PY" "$_GS_PROXY_NET.$i:9092" "$GRAPHSINK_CLUSTER_CA" >/dev/null 2>&1; do
        _alive "$pid" || _cluster_failed "node $i exited during startup"
        [ "$SECONDS" -lt "$deadline" ] || _cluster_failed "node $i not ready after ${2:-120} s"
        sleep 0.5
    done
}

# _toxiproxy_api METHOD PATH [JSON]: the client host's Toxiproxy API.
_toxiproxy_api() {
    cluster_exec curl -sf -X "$1" "http://127.0.0.1:8474$2" ${3:+-H 'Content-Type: application/json' -d "$3"} >/dev/null
}

# start_kafka_cluster [N]: N (default 3) KRaft nodes, each broker and
# controller, in namespaces of their own, a three-voter quorum
# (--initial-controllers), SASL_SSL with SCRAM-SHA-512 and mTLS, deny-by-
# default ACLs; and one client namespace whose Toxiproxy sits before every
# node. Exports:
#   GRAPHSINK_CLUSTER_NS         the client namespace (cluster_exec runs in it)
#   GRAPHSINK_CLUSTER_BOOTSTRAP  SASL_SSL bootstrap (through the proxies)
#   GRAPHSINK_CLUSTER_MTLS_BOOTSTRAP  the mTLS listener's
#   GRAPHSINK_CLUSTER_CA         the CA certificate clients trust
#   GRAPHSINK_CLUSTER_ADMIN_CONFIG  a Java client config: SASL as the super user admin
#   GRAPHSINK_CLUSTER_USER, GRAPHSINK_CLUSTER_PASSWORD  a SCRAM user with no ACL
#   GRAPHSINK_CLUSTER_MTLS_CERT, GRAPHSINK_CLUSTER_MTLS_KEY  a client certificate (User:graphsink-mtls)
#   GRAPHSINK_CLUSTER_DIR        all of it: node data, logs, certificates
start_kafka_cluster() {
    local n="${1:-3}" prefix="gsk$$xb" dir started pass admin_pw user_pw cid i d
    local specs=() voters="" controllers="" scram
    [ -z "${_GS_CLUSTER_PREFIX:-}" ] || die "start_kafka_cluster: a cluster is already running ($_GS_CLUSTER_PREFIX)"
    [ "$n" -ge 1 ] && [ "$n" -le 9 ] || die "start_kafka_cluster: 1 to 9 nodes, not $n"
    [ "$(id -u)" -eq 0 ] || die "start_kafka_cluster needs root: it makes network namespaces (ip netns)"
    have ip || die "start_kafka_cluster needs iproute2's ip"
    ensure_kafka
    ensure_toxiproxy
    netns_sweep
    dir="$(mktemp -d "${TMPDIR:-/tmp}/graphsink-cluster.XXXXXX")"
    _GS_CLUSTER_PREFIX="$prefix" _GS_CLUSTER_DIR="$dir" _GS_CLUSTER_N="$n"
    export GRAPHSINK_CLUSTER_DIR="$dir" GRAPHSINK_CLUSTER_NS="$prefix-client"
    started="$(_now_ms)"
    ip netns add "$prefix-hub" 2>"$dir/netns.err" ||
        _cluster_failed "cannot make a network namespace ($(cat "$dir/netns.err")): the cluster needs root and network namespaces"
    ip -n "$prefix-hub" link set lo up
    ip netns exec "$prefix-hub" sysctl -qw net.ipv4.ip_forward=1 ||
        _cluster_failed "cannot turn on forwarding in the router namespace"
    for ((i = 1; i <= n; i++)); do
        _netns_host "$prefix" "$i" "node$i" || _cluster_failed "cannot link the namespace of node $i"
        specs+=("broker=node$i=IP:$_GS_NET.$i.2,IP:$_GS_PROXY_NET.$i")
        voters+="${voters:+,}$i@$_GS_NET.$i.2:9095:$(_kraft_id)"
        controllers+="${controllers:+,}$_GS_NET.$i.2:9095"
    done
    _netns_host "$prefix" "$_GS_CLIENT_INDEX" client || _cluster_failed "cannot link the client namespace"
    pass="$(_secret)" admin_pw="$(_secret)" user_pw="$(_secret)"
    bash "$GRAPHSINK_REPO/scripts/kafka/certs.sh" "$dir/certs" "$pass" "${specs[@]}" client=graphsink-mtls ||
        _cluster_failed "certs.sh failed"
    export GRAPHSINK_CLUSTER_CA="$dir/certs/ca.pem"
    export GRAPHSINK_CLUSTER_MTLS_CERT="$dir/certs/graphsink-mtls.pem" GRAPHSINK_CLUSTER_MTLS_KEY="$dir/certs/graphsink-mtls.key"
    cid="$(_kraft_id)"
    for ((i = 1; i <= n; i++)); do
        d="$dir/node$i"
        mkdir -p "$d"
        sed -e "s|@NODE_ID@|$i|g" -e "s|@ADDR@|$_GS_NET.$i.2|g" -e "s|@PROXY_ADDR@|$_GS_PROXY_NET.$i|g" \
            -e "s|@CONTROLLERS@|$controllers|g" -e "s|@LOG_DIR@|$d/data|g" \
            -e "s|@KEYSTORE@|$dir/certs/node$i.p12|g" -e "s|@TRUSTSTORE@|$dir/certs/truststore.p12|g" \
            -e "s|@STORE_PASSWORD@|$pass|g" \
            "$GRAPHSINK_REPO/scripts/kafka/cluster.properties" >"$d/server.properties"
    done
    # The SCRAM users go into every node's bootstrap metadata (KIP-900),
    # so the first client can authenticate; the formats run side by side.
    scram=(--add-scram "SCRAM-SHA-512=[name=admin,password=$admin_pw]"
        --add-scram "SCRAM-SHA-512=[name=graphsink,password=$user_pw]")
    for ((i = 1; i <= n; i++)); do
        # shellcheck disable=SC2086
        java $_GS_TOOL_JVM -Dlog4j2.configurationFile="$GRAPHSINK_REPO/scripts/kafka/log4j2.yaml" -cp "$KAFKA_LIBS/*" \
            kafka.tools.StorageTool format --cluster-id "$cid" --initial-controllers "$voters" \
            "${scram[@]}" --config "$dir/node$i/server.properties" </dev/null >"$dir/node$i/kafka.log" 2>&1 &
    done
    for ((i = 1; i <= n; i++)); do wait -n || _cluster_failed "kafka-storage format failed"; done
    for ((i = 1; i <= n; i++)); do _cluster_launch "$i"; done

    # The client host: Toxiproxy on 127.0.0.1:8474, and on 10.77.100.i one
    # proxy per node and listener.
    for ((i = 1; i <= n; i++)); do ip -n "$GRAPHSINK_CLUSTER_NS" addr add "$_GS_PROXY_NET.$i/32" dev lo; done
    # shellcheck disable=SC2016
    ip netns exec "$GRAPHSINK_CLUSTER_NS" setsid env LOG_LEVEL=warn bash -c 'echo "$$" >"$1"; shift; exec "$@"' _ "$dir/toxiproxy.pid" \
        "$TOXIPROXY_BIN" -host 127.0.0.1 -port 8474 </dev/null >"$dir/toxiproxy.log" 2>&1 &
    disown
    local deadline=$((SECONDS + 20))
    until _toxiproxy_api GET /version; do
        [ "$SECONDS" -lt "$deadline" ] || _cluster_failed "Toxiproxy not ready after 20 s (log: $dir/toxiproxy.log)"
        sleep 0.1
    done
    for ((i = 1; i <= n; i++)); do
        _toxiproxy_api POST /proxies "{\"name\":\"node$i-client\",\"listen\":\"$_GS_PROXY_NET.$i:9092\",\"upstream\":\"$_GS_NET.$i.2:9092\",\"enabled\":true}" &&
            _toxiproxy_api POST /proxies "{\"name\":\"node$i-mtls\",\"listen\":\"$_GS_PROXY_NET.$i:9093\",\"upstream\":\"$_GS_NET.$i.2:9093\",\"enabled\":true}" ||
            _cluster_failed "cannot create node $i's proxies"
    done
    GRAPHSINK_CLUSTER_BOOTSTRAP="" GRAPHSINK_CLUSTER_MTLS_BOOTSTRAP=""
    for ((i = 1; i <= n; i++)); do
        GRAPHSINK_CLUSTER_BOOTSTRAP+="${GRAPHSINK_CLUSTER_BOOTSTRAP:+,}$_GS_PROXY_NET.$i:9092"
        GRAPHSINK_CLUSTER_MTLS_BOOTSTRAP+="${GRAPHSINK_CLUSTER_MTLS_BOOTSTRAP:+,}$_GS_PROXY_NET.$i:9093"
    done
    export GRAPHSINK_CLUSTER_BOOTSTRAP GRAPHSINK_CLUSTER_MTLS_BOOTSTRAP
    export GRAPHSINK_CLUSTER_USER=graphsink GRAPHSINK_CLUSTER_PASSWORD="$user_pw"
    export GRAPHSINK_CLUSTER_ADMIN_CONFIG="$dir/admin.properties"
    (umask 077 && cat >"$GRAPHSINK_CLUSTER_ADMIN_CONFIG" <<EOF
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin_pw";
ssl.truststore.type=PEM
ssl.truststore.location=$GRAPHSINK_CLUSTER_CA
EOF
    )
    for ((i = 1; i <= n; i++)); do _cluster_wait_node "$i"; done
    log "Kafka cluster of $n nodes ready at $GRAPHSINK_CLUSTER_BOOTSTRAP (SASL_SSL, from namespace $GRAPHSINK_CLUSTER_NS) in $(($(_now_ms) - started)) ms (dir $dir)"
}

# cluster_exec CMD...: runs CMD in the client namespace.
cluster_exec() { ip netns exec "${GRAPHSINK_CLUSTER_NS:?no cluster: start_kafka_cluster first}" "$@"; }

# kafka_cluster_tool CLASS ARGS...: one of Kafka's tools (AclCommand,
# ConfigCommand, MetadataQuorumCommand, ...: org.apache.kafka.tools.*) as
# the super user admin, from the client namespace.
kafka_cluster_tool() {
    local class="$1"; shift
    case "$class" in *.*) ;; *) class="org.apache.kafka.tools.$class" ;; esac
    # shellcheck disable=SC2086
    cluster_exec java $_GS_TOOL_JVM -Dlog4j2.configurationFile="$GRAPHSINK_REPO/scripts/kafka/log4j2.yaml" -cp "$KAFKA_LIBS/*" \
        "$class" --bootstrap-server "$GRAPHSINK_CLUSTER_BOOTSTRAP" --command-config "$GRAPHSINK_CLUSTER_ADMIN_CONFIG" "$@"
}

# kafka_cluster_node stop|kill|start|freeze|thaw ID: stop is a controlled
# shutdown (SIGTERM, waited for); start relaunches on the kept data.
kafka_cluster_node() {
    local action="$1" i="$2" pid="" deadline
    pid="$(cat "${_GS_CLUSTER_DIR:?no cluster}/node$i/pid" 2>/dev/null || true)"
    case "$action" in
        stop)
            [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null || true
            deadline=$((SECONDS + 60))
            while [ -n "$pid" ] && _alive "$pid"; do
                [ "$SECONDS" -lt "$deadline" ] || die "node $i ignored SIGTERM for 60 s"
                sleep 0.1
            done ;;
        kill) [ -z "$pid" ] || kill -KILL "$pid" 2>/dev/null || true
              while [ -n "$pid" ] && _alive "$pid"; do sleep 0.05; done ;;
        start) ! { [ -n "$pid" ] && _alive "$pid"; } || die "node $i is running (pid $pid)"
               _cluster_launch "$i"; _cluster_wait_node "$i" ;;
        freeze) kill -STOP "$pid" ;;
        thaw) kill -CONT "$pid" ;;
        *) die "kafka_cluster_node: stop, kill, start, freeze or thaw, not $action" ;;
    esac
}

# kafka_cluster_cut ID|all [blackhole|unreachable]: the client namespace
# loses node ID (or every node): the router drops their packets both ways
# (blackhole: silently, as a lost link; unreachable: with an ICMP error).
# kafka_cluster_heal undoes every cut.
kafka_cluster_cut() {
    local target="$1" how="${2:-blackhole}" i client="$_GS_NET.$_GS_CLIENT_INDEX.2"
    for ((i = 1; i <= _GS_CLUSTER_N; i++)); do
        [ "$target" = all ] || [ "$target" = "$i" ] || continue
        ip -n "$_GS_CLUSTER_PREFIX-hub" rule add pref 100 from "$client" to "$_GS_NET.$i.2" "$how"
        ip -n "$_GS_CLUSTER_PREFIX-hub" rule add pref 100 from "$_GS_NET.$i.2" to "$client" "$how"
    done
}
kafka_cluster_heal() {
    while ip -n "${_GS_CLUSTER_PREFIX:?no cluster}-hub" rule del pref 100 2>/dev/null; do :; done
}

# kafka_cluster_toxic TYPE ATTRIBUTES [ID|all] [STREAM]: a Toxiproxy toxic
# (latency '{"latency":200,"jitter":50}', bandwidth '{"rate":100}',
# timeout '{"timeout":0}', reset_peer '{"timeout":0}') on the client
# host's proxies to node ID (default all), downstream unless STREAM says
# upstream. kafka_cluster_toxics_reset removes every toxic.
kafka_cluster_toxic() {
    local type="$1" attrs="$2" target="${3:-all}" stream="${4:-downstream}" i l
    for ((i = 1; i <= _GS_CLUSTER_N; i++)); do
        [ "$target" = all ] || [ "$target" = "$i" ] || continue
        for l in client mtls; do
            _toxiproxy_api POST "/proxies/node$i-$l/toxics" \
                "{\"name\":\"$type-$stream\",\"type\":\"$type\",\"stream\":\"$stream\",\"toxicity\":1.0,\"attributes\":$attrs}" ||
                die "cannot add the $type toxic to node$i-$l"
        done
    done
}
kafka_cluster_toxics_reset() { _toxiproxy_api POST /reset; }

# Stops every node and the proxy, deletes the namespaces (veths go with
# them) and the directory. Idempotent and never fails: safe in an EXIT trap.
stop_kafka_cluster() {
    local prefix="${_GS_CLUSTER_PREFIX:-}" dir="${_GS_CLUSTER_DIR:-}" f pid ns
    [ -n "$prefix" ] || return 0
    for f in "$dir"/node*/pid "$dir/toxiproxy.pid"; do
        pid="$(cat "$f" 2>/dev/null || true)"
        [ -z "$pid" ] || kill -KILL "$pid" 2>/dev/null || true
    done
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
        case "$ns" in "$prefix"-*) _netns_delete "$ns" ;; esac
    done
    if [ -n "${_GS_CLUSTER_KEEP:-}" ]; then log "kept the cluster's directory: $dir"; else rm -rf "$dir"; fi
    unset GRAPHSINK_CLUSTER_NS GRAPHSINK_CLUSTER_BOOTSTRAP GRAPHSINK_CLUSTER_MTLS_BOOTSTRAP GRAPHSINK_CLUSTER_CA \
        GRAPHSINK_CLUSTER_ADMIN_CONFIG GRAPHSINK_CLUSTER_USER GRAPHSINK_CLUSTER_PASSWORD GRAPHSINK_CLUSTER_DIR \
        GRAPHSINK_CLUSTER_MTLS_CERT GRAPHSINK_CLUSTER_MTLS_KEY
    _GS_CLUSTER_PREFIX="" _GS_CLUSTER_DIR="" _GS_CLUSTER_N=0
    return 0
}
