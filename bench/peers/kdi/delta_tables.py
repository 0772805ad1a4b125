#!/usr/bin/env python3
"""kafka-delta-ingest's tables: `create` makes them (kdi writes only into
an existing Delta table, whose schema it converts the JSON to), `count`
reads them back with the `deltalake` package (delta-rs's Python reader) and
prints the peer's JSON line."""

import argparse
import json

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

ITEM = pa.schema([("sku", pa.string()), ("seq", pa.int64()), ("pad", pa.string())])
# The edge id is the Kafka key, which kdi cannot read (its transforms see
# the value and kafka.offset|partition|topic|timestamp only): no id column.
LINK = pa.schema([("src", pa.string()), ("dst", pa.string()), ("seq", pa.int64()),
                  ("pad", pa.string())])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["create", "count"])
    p.add_argument("dir")
    p.add_argument("--edges", action="store_true")
    p.add_argument("--secs", type=float, default=0.0)
    a = p.parse_args()
    if a.what == "create":
        write_deltalake(f"{a.dir}/delta-Item", ITEM.empty_table())
        if a.edges:
            write_deltalake(f"{a.dir}/delta-Link", LINK.empty_table())
        return
    rows = {}
    for name in ("Item", "Link"):
        try:
            rows[name] = DeltaTable(f"{a.dir}/delta-{name}").to_pyarrow_dataset().count_rows()
        except Exception:  # no such table in a nodes-only run
            pass
    n = sum(rows.values())
    # kdi appends every record (no merge by key): the rows are the records.
    print(json.dumps({"records": n, "secs": a.secs,
                      "records_per_s": n / a.secs if a.secs else 0.0,
                      "rows": rows, "append": True}))


if __name__ == "__main__":
    main()
