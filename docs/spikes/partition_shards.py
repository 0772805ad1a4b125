"""Two MemWAL facts partition-aligned shards rely on (docs/decisions/0007-scale-out.md):
identity sharding on the nullable Int32 `_src_partition` column, and how
long a claim (new epoch, sentinel, WAL replay) takes when the previous
owner died with an unflushed memtable of ~100 B rows.

    python3 -m venv /tmp/plv && /tmp/plv/bin/pip install pylance==14.0.2
    /tmp/plv/bin/python docs/spikes/partition_shards.py
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import lance
import numpy as np
import pyarrow as pa
from lance import mem_wal

SCH = pa.schema([
    pa.field('id', pa.string(), False,
             metadata={b'lance-schema:unenforced-primary-key': b'true'}),
    pa.field('_src_partition', pa.int32(), True),
    pa.field('pad', pa.string()),
])
# Memtable limits that hold 300k rows unflushed (graphsink's default freezes
# at 100k rows).
LIMITS = dict(max_memtable_rows=400_000, max_memtable_size=256 << 20,
              max_unflushed_memtable_bytes=1 << 30)


def table(path):
    shutil.rmtree(path, ignore_errors=True)
    lance.write_dataset(pa.Table.from_pylist([], schema=SCH), path)
    lance.dataset(path).initialize_mem_wal(identity_column='_src_partition')
    return lance.dataset(path)


def die_with_unflushed(path, sid, rows):
    ds = lance.dataset(path)
    w = ds.mem_wal_writer(sid, durable_write=True, max_wal_flush_interval_ms=20, **LIMITS)
    rng = np.random.default_rng(1)
    for _ in range(0, rows, 5000):
        ids = [f'k{k:010d}' for k in rng.integers(0, 10**9, 5000)]
        w.put(pa.RecordBatch.from_pydict(
            {'id': ids, '_src_partition': [0] * 5000, 'pad': ['x' * 80] * 5000}, schema=SCH))
    time.sleep(0.5)  # the last WAL flush
    os._exit(0)      # no close: the memtable lives only in the WAL


if len(sys.argv) == 5 and sys.argv[1] == 'writer':
    die_with_unflushed(sys.argv[2], sys.argv[3], int(sys.argv[4]))

root = tempfile.mkdtemp()
ds = table(f'{root}/ident.lance')
spec = ds.mem_wal_index_details()['sharding_specs'][0]
print('details under identity sharding:', ds.mem_wal_index_details())
batch = pa.RecordBatch.from_pylist(
    [{'id': i, '_src_partition': p, 'pad': ''} for i, p in (('a', 3), ('b', 0), ('c', None), ('d', 7))],
    schema=SCH)
print('shard of partitions [3, 0, null, 7]:',
      mem_wal.evaluate_sharding_spec(batch, spec, ds.lance_schema).column(0).to_pylist())

for rows in (20_000, 100_000, 300_000):
    path = f'{root}/replay.lance'
    table(path)
    sid = str(uuid.uuid4())
    subprocess.run([sys.executable, __file__, 'writer', path, sid, str(rows)], check=True)
    t = time.time()
    w = lance.dataset(path).mem_wal_writer(sid, **LIMITS)
    took = time.time() - t
    print(f'{rows:7d} unflushed rows: claim + replay {took:.3f} s, '
          f'{w.memtable_stats()["row_count"]} rows back in the memtable')
    w.close()
shutil.rmtree(root)
