# kafka-delta-ingest (delta-io/kafka-delta-ingest, Rust: rdkafka + delta-rs)
# as a peer. None of its code is in this repository: its source is fetched
# into $PEERS_CACHE/kdi-src and built there, in its own target dir.

KDI_COMMIT=c6d42de   # the commit measured (2025, "use regular env variable for sr password")
KDI_SRC="$PEERS_CACHE/kdi-src"
KDI_TARGET="$PEERS_CACHE/kdi-target"
KDI_BIN="$KDI_TARGET/release/kafka-delta-ingest"
# --allowed_latency: kdi's commit interval (its default is 300 s); 5 s is
# graphsink's fold.interval. KDI_LATENCY overrides it.
KDI_LATENCY="${KDI_LATENCY:-5}"

ensure_kdi() {
    [ -x "$KDI_BIN" ] && return 0
    if [ ! -f "$KDI_SRC/Cargo.toml" ]; then
        die "no kafka-delta-ingest source in $KDI_SRC: put commit $KDI_COMMIT of
    github.com/delta-io/kafka-delta-ingest there (git clone, or the session's
    fetch tool: git --git-dir=<mirror> archive $KDI_COMMIT | tar -x -C $KDI_SRC)"
    fi
    # Upstream ships no Cargo.lock; the one this build resolved is kept
    # beside this file so a rebuild resolves the same crates.
    local lock
    lock="$(dirname "${BASH_SOURCE[0]}")/Cargo.lock.resolved"
    [ -f "$KDI_SRC/Cargo.lock" ] || [ ! -f "$lock" ] || cp "$lock" "$KDI_SRC/Cargo.lock"
    # build.rs refuses to compile without "s3" or "azure" (its README builds
    # with --features s3); local file:// tables work with either.
    log "building kafka-delta-ingest in $KDI_SRC (release, LTO off, --features s3; ~40 min on 2 busy cores)"
    (cd "$KDI_SRC" && CARGO_TARGET_DIR="$KDI_TARGET" CARGO_PROFILE_RELEASE_LTO=off \
        CARGO_PROFILE_RELEASE_DEBUG=0 nice cargo build --release --features s3) ||
        die "kafka-delta-ingest did not build (log above)"
}

# run_kdi ROUND_DIR PEER_DIR NODES_TOPIC EDGES_TOPIC ROUND: one kdi process
# per topic (it reads one topic), side by side, each with `-e`, into Delta
# tables it needs created first; the run ends when the tables hold every
# record (`-e` alone never ends on a static backlog: wait_rows.py says
# why), read with `deltalake`. Timed as a whole.
run_kdi() {
    local dir="$1" pdir="$2" nodes="$3" edges="$4" round="$5" here
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    local id="$round-$(date +%s%N)"
    "$PEERS_PYTHON" "$here/delta_tables.py" create "$pdir" ${edges:+--edges} || return 1
    cat >"$pdir/run-kdi.sh" <<EOS
#!/usr/bin/env bash
start=\$(date +%s.%N)
export RUST_LOG=info
"$KDI_BIN" ingest "$nodes" "file://$pdir/delta-Item" -k "$GRAPHSINK_TEST_BROKER" \\
    -g "peer-kdi-items-$id" -a "kdi-items-$id" -l "$KDI_LATENCY" -e >"$pdir/kdi-items.log" 2>&1 &
a=\$!
b=""
pairs=("$nodes=$pdir/delta-Item")
if [ -n "$edges" ]; then
    "$KDI_BIN" ingest "$edges" "file://$pdir/delta-Link" -k "$GRAPHSINK_TEST_BROKER" \\
        -g "peer-kdi-links-$id" -a "kdi-links-$id" -l "$KDI_LATENCY" -e >"$pdir/kdi-links.log" 2>&1 &
    b=\$!
    pairs+=("$edges=$pdir/delta-Link")
fi
"$PEERS_PYTHON" "$here/wait_rows.py" "$GRAPHSINK_TEST_BROKER" "\${pairs[@]}" \\
    --pids "\$a\${b:+,\$b}" --timeout "\${KDI_TIMEOUT_S:-900}"
rc=\$?
end=\$(date +%s.%N)
kill \$a \$b 2>/dev/null
wait \$a \$b 2>/dev/null
[ \$rc -eq 0 ] || { echo "kafka-delta-ingest did not complete its tables (logs in $pdir)" >&2; exit 1; }
"$PEERS_PYTHON" "$here/delta_tables.py" count "$pdir" --secs "\$(echo "\$end - \$start" | bc -l)"
EOS
    measured "$dir/kdi" bash "$pdir/run-kdi.sh"
}
