#!/usr/bin/env python3
"""Reads the Iceberg sink's tables back with pyiceberg (the Hadoop catalog's
newest metadata file, as a StaticTable) and prints the peer's JSON line."""

import argparse
import glob
import json
import re

from pyiceberg.table import StaticTable


def newest_metadata(table_dir):
    files = glob.glob(f"{table_dir}/metadata/v*.metadata.json")
    return max(files, key=lambda f: int(re.search(r"/v(\d+)\.metadata\.json$", f).group(1)))


def table_rows(warehouse, snapshot_only=False):
    """Rows per table; with snapshot_only, the current snapshot's
    total-records (cheap: metadata only) instead of a scan."""
    rows = {}
    for name, table in (("Item", "item"), ("Link", "link")):
        d = f"{warehouse}/bench/{table}"
        if not glob.glob(f"{d}/metadata/v*.metadata.json"):
            continue
        try:
            t = StaticTable.from_metadata(newest_metadata(d))
        except Exception:  # a metadata file being written
            continue
        if snapshot_only:
            snap = t.current_snapshot()
            rows[name] = int(snap.summary["total-records"]) if snap else 0
        else:
            rows[name] = t.scan().to_arrow().num_rows
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("warehouse")
    p.add_argument("--secs", type=float, default=0.0)
    a = p.parse_args()
    rows = table_rows(a.warehouse)
    n = sum(rows.values())
    # The Apache sink appends every record (it has no upsert by key).
    print(json.dumps({"records": n, "secs": a.secs,
                      "records_per_s": n / a.secs if a.secs else 0.0,
                      "rows": rows, "append": True}))


if __name__ == "__main__":
    main()
