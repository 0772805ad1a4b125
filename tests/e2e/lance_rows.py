"""Reads one version of a Lance table with pylance, independent of
graphsink's Rust read path, for the registry-format e2e tests
(tests/e2e/formats.rs): their rows must equal what Confluent's
deserializer read from the same bytes.

    python lance_rows.py URI VERSION STORAGE_OPTIONS_JSON

Prints one JSON object per row; dates and times as ISO text, bytes as hex.
"""

import json
import sys

import lance

# Confluent's side prints values the same way.
from sr_encode import plain


def main():
    uri, version, options = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    ds = lance.dataset(uri, version=version, storage_options=options or None)
    for row in ds.to_table().to_pylist():
        print(json.dumps(plain(row)))


if __name__ == "__main__":
    main()
