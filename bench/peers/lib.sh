# Shared by bench/peers/*.sh: where the peers' caches live and how one peer
# run is measured. Sourced after scripts/lib.sh.

PEERS_CACHE="${PEERS_CACHE:-$GRAPHSINK_CACHE/peers}"
PEERS_VENV="$PEERS_CACHE/py-venv"
# The Python side: the user's script (confluent-kafka + pylance) and the
# peers' own readers (pyiceberg, deltalake).
PEERS_PY_PACKAGES="confluent-kafka==2.16.1 pylance==14.0.2 pyiceberg==0.12.0 deltalake==1.6.6 pyarrow==26.0.1"

ensure_peers_venv() {
    export PEERS_PYTHON="$PEERS_VENV/bin/python"
    if ! "$PEERS_PYTHON" -c 'import confluent_kafka, lance, pyiceberg, deltalake' 2>/dev/null; then
        log "installing the peers' Python packages into $PEERS_VENV: $PEERS_PY_PACKAGES"
        mkdir -p "$PEERS_CACHE"
        python3 -m venv "$PEERS_VENV"
        # shellcheck disable=SC2086
        "$PEERS_VENV/bin/pip" install -q $PEERS_PY_PACKAGES
    fi
}

# Sum of a process's utime+stime in seconds (0 if it is gone).
proc_cpu_s() {
    awk -v t="$(getconf CLK_TCK)" '{ print ($14 + $15) / t }' "/proc/$1/stat" 2>/dev/null || echo 0
}

# measured OUT_PREFIX CMD...: runs CMD under /usr/bin/time (wall s, user s,
# sys s, peak RSS KiB of the process and its waited-for children) and the
# broker's CPU seconds over the same span; stdout to OUT_PREFIX.out.
measured() {
    local prefix="$1" b0 b1
    shift
    b0="$(proc_cpu_s "${_GS_BROKER_PID:-0}")"
    /usr/bin/time -f '{"wall_s": %e, "user_s": %U, "sys_s": %S, "max_rss_kib": %M, "exit": %x}' \
        -o "$prefix.time.json" "$@" >"$prefix.out" 2>"$prefix.err"
    local rc=$?
    b1="$(proc_cpu_s "${_GS_BROKER_PID:-0}")"
    printf '{"broker_cpu_s": %.3f}\n' "$(echo "$b1 - $b0" | bc -l)" >"$prefix.broker.json"
    return $rc
}

# graphsink_peer_config WORK GROUP ROOT: the bench's config of its
# graphsink phase (in WORK, beside its schema), with GROUP and ROOT of its
# own; prints the new file's path.
graphsink_peer_config() {
    local src
    src="$(ls "$1"/bench-graphsink-*.toml 2>/dev/null | grep -v -- '-s3-' | head -n 1)"
    [ -n "$src" ] || die "no bench-graphsink-*.toml in $1 (the bench's --work-dir)"
    sed -e "s|^\"group.id\" = .*|\"group.id\" = \"$2\"|" -e "s|^root = .*|root = \"$3\"|" \
        "$src" >"$1/$2.toml"
    echo "$1/$2.toml"
}

# peers_start OUT_DEFAULT PEERS: the run's output folder (OUT_DEFAULT unless
# --out gave one), the release bench binary, the Python venv, each named
# peer installed, and a broker stopped on exit. Sets out and bench_bin.
peers_start() {
    out="${out:-$1}"
    mkdir -p "$out"
    bench_bin="$CARGO_TARGET_DIR/release/graphsink-bench"
    [ -x "$bench_bin" ] || die "no $bench_bin: build it first (BENCHMARKS.md, 'How to run it')"
    graphsink_bin="$CARGO_TARGET_DIR/release/graphsink"
    case ",$2," in
        *,graphsink,*) [ -x "$graphsink_bin" ] ||
            die "no $graphsink_bin: build it with the bench (cargo build --release -p graphsink -p graphsink-bench)" ;;
    esac
    ensure_peers_venv
    local p
    for p in ${2//,/ }; do
        case "$p" in
            graphsink|python) ;;
            kdi) source "$here/kdi/lib.sh"; ensure_kdi ;;
            iceberg) source "$here/iceberg/lib.sh"; ensure_iceberg ;;
            *) die "unknown peer $p (graphsink, python, kdi, iceberg)" ;;
        esac
    done
    ensure_kafka
    start_kafka
    trap stop_kafka EXIT
}
