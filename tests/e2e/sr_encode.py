"""Frames records the way a Kafka shop's producers do: with Confluent's own
serializers (confluent-kafka's AvroSerializer, ProtobufSerializer,
JSONSerializer), which register the schema in the registry and write the
wire format. The e2e tests (tests/e2e/formats.rs) produce the bytes this
prints, so the bytes graphsink reads are Confluent's, not graphsink's.

    python sr_encode.py REGISTRY_URL SUBJECT_TOPIC < job.json

job.json: {"format": "avro", "schema": "<schema text>", "records": [...]},
optionally with framed keys: "key_schema" (an Avro schema, registered as
`<topic>-key`) and "keys" (one per record), and "registry": more settings of
Confluent's SchemaRegistryClient (a registry over TLS with basic auth:
"ssl.ca.location", "basic.auth.user.info").
Prints one JSON object per record: {"value": hex of the framed bytes,
"decoded": the record as Confluent's deserializer reads it back (fastavro
under the hood), with bytes as hex, and "key": hex of the framed key}.
"""

import json
import sys

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.json_format import MessageToDict

FD = descriptor_pb2.FieldDescriptorProto
PROTO_TYPES = {
    "string": FD.TYPE_STRING, "bytes": FD.TYPE_BYTES, "bool": FD.TYPE_BOOL,
    "int32": FD.TYPE_INT32, "int64": FD.TYPE_INT64, "uint32": FD.TYPE_UINT32,
    "uint64": FD.TYPE_UINT64, "float": FD.TYPE_FLOAT, "double": FD.TYPE_DOUBLE,
}


def proto_class(spec, message):
    """A message class built from a small spec (no protoc here): {"package",
    "messages": [{"name", "fields": [{"name", "type", "number", "optional"?,
    "repeated"?}]}]}."""
    fdp = descriptor_pb2.FileDescriptorProto(
        name=spec["package"].replace(".", "_") + ".proto", package=spec["package"], syntax="proto3")
    for m in spec["messages"]:
        mp = fdp.message_type.add(name=m["name"])
        for f in m["fields"]:
            fp = mp.field.add(name=f["name"], number=f["number"], type=PROTO_TYPES[f["type"]],
                              label=FD.LABEL_REPEATED if f.get("repeated") else FD.LABEL_OPTIONAL)
            if f.get("optional"):
                # proto3 `optional`: a synthetic one-field oneof.
                fp.proto3_optional = True
                fp.oneof_index = len(mp.oneof_decl)
                mp.oneof_decl.add(name="_" + f["name"])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{spec['package']}.{message}"))
from confluent_kafka.serialization import MessageField, SerializationContext


def plain(v):
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return v


def main():
    url, topic = sys.argv[1], sys.argv[2]
    job = json.load(sys.stdin)
    # A timeout (the client's default is none): a request the registry never
    # answers is retried on a new connection rather than waited on forever.
    conf = {"url": url, "timeout": 30, **job.get("registry", {})}
    client = SchemaRegistryClient(conf)
    ctx = SerializationContext(topic, MessageField.VALUE)
    # Each deserializer has a client of its own: it fetches the writer
    # schema by the id in the frame, as any consumer would.
    if job["format"] == "avro":
        ser = AvroSerializer(client, job["schema"])
        de = AvroDeserializer(SchemaRegistryClient(conf))
    elif job["format"] == "json_schema":
        ser = JSONSerializer(job["schema"], client)
        de = JSONDeserializer(None, schema_registry_client=SchemaRegistryClient(conf))
    elif job["format"] == "protobuf":
        cls = proto_class(job["schema"], job["message"])
        conf = {"use.deprecated.format": False}
        ser = ProtobufSerializer(cls, client, conf)
        de = ProtobufDeserializer(cls, conf)
        for r in job["records"]:
            framed = ser(cls(**r), ctx)
            back = MessageToDict(de(framed, ctx), preserving_proto_field_name=True)
            print(json.dumps({"value": framed.hex(), "decoded": back}))
        return
    else:
        raise SystemExit(f"format {job['format']} is not scripted yet")
    keys = [None] * len(job["records"])
    if "key_schema" in job:
        key_ser = AvroSerializer(client, job["key_schema"])
        key_ctx = SerializationContext(topic, MessageField.KEY)
        keys = [key_ser(k, key_ctx).hex() for k in job["keys"]]
    for r, k in zip(job["records"], keys):
        framed = ser(r, ctx)
        print(json.dumps({"value": framed.hex(), "decoded": plain(de(framed, ctx)), "key": k}))


if __name__ == "__main__":
    main()
