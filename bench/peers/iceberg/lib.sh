# The Apache Iceberg Kafka Connect sink in Kafka Connect standalone, as
# a peer: jars from Maven Central (pom.xml beside this file) into
# $PEERS_CACHE/iceberg/libs, a Hadoop catalog on the local filesystem.

# Connect 4.4.0 is the issue's target, but iceberg-kafka-connect 1.12.0
# cannot start a task in it: IcebergSinkTask.start calls
# org.apache.kafka.common.utils.AppInfoParser, which kafka-clients 4.4 moved
# to ...utils.internals (NoClassDefFoundError). 4.3.2 is the newest Connect
# it runs in; it talks to the 4.4 broker as any 4.3 client does.
# ICEBERG_CONNECT_VERSION=4.4.0 reproduces the failure.
ICEBERG_CONNECT_VERSION="${ICEBERG_CONNECT_VERSION:-4.3.2}"
ICEBERG_ROOT="$PEERS_CACHE/iceberg"
export ICEBERG_LIBS="$ICEBERG_ROOT/libs-connect-$ICEBERG_CONNECT_VERSION"
ICEBERG_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

ensure_iceberg() {
    [ -f "$ICEBERG_LIBS/iceberg-kafka-connect-1.12.0.jar" ] && return 0
    log "resolving Kafka Connect $ICEBERG_CONNECT_VERSION and iceberg-kafka-connect 1.12.0 with Maven into $ICEBERG_LIBS"
    mkdir -p "$ICEBERG_ROOT"
    mvn -q -f "$ICEBERG_DIR/pom.xml" dependency:copy-dependencies -Dkafka.version="$ICEBERG_CONNECT_VERSION" \
        -DoutputDirectory="$ICEBERG_LIBS" -DincludeScope=runtime ||
        die "Maven could not resolve the Iceberg sink's jars (log above)"
}

# run_iceberg ROUND_DIR PEER_DIR NODES_TOPIC EDGES_TOPIC ROUND [COMMIT_S]:
# Connect standalone with the sink on both topics (a table each, routed by
# the topic name that InsertField puts in the value), stopped once its
# consumer group's committed offsets reach the topics' end offsets; then
# the tables are read back with pyiceberg. COMMIT_S empty = the sink's
# default commit interval (300 s).
run_iceberg() {
    local dir="$1" pdir="$2" nodes="$3" edges="$4" round="$5" commit_s="${6:-}"
    local tag="iceberg" name="peer-iceberg-$round-$(date +%s%N)"
    [ -z "$commit_s" ] || tag="iceberg-${commit_s}s"
    iceberg_properties "$pdir" "$name" "$nodes" "$edges" "$commit_s"
    measured "$dir/$tag" bash "$ICEBERG_DIR/run-connect.sh" "$pdir" "$name" "$nodes${edges:+,$edges}"
}

# iceberg_properties DIR NAME NODES_TOPIC EDGES_TOPIC COMMIT_S: the worker's
# and the connector's properties in DIR (warehouse DIR/warehouse).
iceberg_properties() {
    local pdir="$1" name="$2" nodes="$3" edges="$4" commit_s="${5:-}"
    mkdir -p "$pdir/warehouse"
    cat >"$pdir/worker.properties" <<EOP
bootstrap.servers=$GRAPHSINK_TEST_BROKER
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
value.converter.schemas.enable=false
offset.storage.file.filename=$pdir/connect.offsets
offset.flush.interval.ms=1000
plugin.discovery=only_scan
EOP
    cat >"$pdir/sink.properties" <<EOP
name=$name
connector.class=org.apache.iceberg.connect.IcebergSinkConnector
tasks.max=1
topics=$nodes${edges:+,$edges}
consumer.override.auto.offset.reset=earliest
transforms=topic
transforms.topic.type=org.apache.kafka.connect.transforms.InsertField\$Value
transforms.topic.topic.field=_topic
iceberg.catalog.type=hadoop
iceberg.catalog.warehouse=file://$pdir/warehouse
iceberg.control.topic=control-$name
iceberg.tables=bench.item${edges:+,bench.link}
iceberg.tables.route-field=_topic
iceberg.table.bench.item.route-regex=$nodes
${edges:+iceberg.table.bench.link.route-regex=$edges}
iceberg.tables.auto-create-enabled=true
${commit_s:+iceberg.control.commit.interval-ms=$((commit_s * 1000))}
EOP
}
