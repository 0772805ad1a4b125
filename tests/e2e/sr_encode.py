"""Frames records the way a Kafka shop's producers do: with Confluent's own
serializers (confluent-kafka's AvroSerializer, ProtobufSerializer,
JSONSerializer), which register the schema in the registry and write the
wire format. The e2e tests (tests/e2e/formats.rs) produce the bytes this
prints, so the bytes graphsink reads are Confluent's, not graphsink's.

    python sr_encode.py REGISTRY_URL SUBJECT_TOPIC < job.json

job.json: {"format": "avro", "schema": "<schema text>", "records": [...]}.
Prints one JSON object per record: {"value": hex of the framed bytes,
"decoded": the record as Confluent's deserializer reads it back (fastavro
under the hood), with bytes as hex}.
"""

import json
import sys

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
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
    client = SchemaRegistryClient({"url": url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    # Each deserializer has a client of its own: it fetches the writer
    # schema by the id in the frame, as any consumer would.
    if job["format"] == "avro":
        ser = AvroSerializer(client, job["schema"])
        de = AvroDeserializer(SchemaRegistryClient({"url": url}))
    elif job["format"] == "json_schema":
        ser = JSONSerializer(job["schema"], client)
        de = JSONDeserializer(None, schema_registry_client=SchemaRegistryClient({"url": url}))
    else:
        raise SystemExit(f"format {job['format']} is not scripted yet")
    for r in job["records"]:
        framed = ser(r, ctx)
        print(json.dumps({"value": framed.hex(), "decoded": plain(de(framed, ctx))}))


if __name__ == "__main__":
    main()
