"""What Lance 14.0.2 does with a late commit from a stale reader.

docs/decisions/0007-scale-out.md, open risk 1: a folder stopped after it read table
version v0 resumes after another folder committed on top. Which of its
merge-insert passes does Lance refuse, and which does it rebase and land?

The late writer holds the dataset at v0 and executes through Lance's own
commit path (conflict_retries 0). pylance's execute_uncommitted + commit
is not used: its Python Transaction drops the inserted-rows filter and the
compacted-SSTable markers, so it would show conflicts that graphsink's Rust
path does not have.

    python3 -m venv /tmp/plv && /tmp/plv/bin/pip install pylance==14.0.2
    /tmp/plv/bin/python docs/spikes/stale_writer.py
"""
import shutil
import tempfile
import uuid

import lance
import pyarrow as pa
from lance.mem_wal import CompactedSsTable

# `id` is the unenforced primary key, as in graphsink's tables; two
# fragments of 500 rows (k0..k499, k500..k999).
SCH = pa.schema([
    pa.field('id', pa.string(), False,
             metadata={b'lance-schema:unenforced-primary-key': b'true'}),
    pa.field('v', pa.int64()),
])
ROOT = tempfile.mkdtemp()
SHARD = str(uuid.uuid4())


def fresh(path, mem_wal):
    rows = [{'id': f'k{i}', 'v': 0} for i in range(1000)]
    lance.write_dataset(pa.Table.from_pylist(rows, schema=SCH), path, max_rows_per_file=500)
    if mem_wal:
        lance.dataset(path).initialize_mem_wal()
    return lance.dataset(path)


def write(ds, upsert=None, delete=None, gen=None):
    b = ds.merge_insert('id')
    if delete is not None:
        b = b.when_matched_delete()
        t = pa.Table.from_pylist([{'id': k} for k in delete], schema=pa.schema([SCH.field('id')]))
    else:
        b = b.when_matched_update_all().when_not_matched_insert_all()
        t = pa.Table.from_pylist([{'id': k, 'v': v} for k, v in upsert], schema=SCH)
    if gen is not None:
        b = b.mark_sstables_as_compacted([CompactedSsTable(SHARD, gen)])
    return b.conflict_retries(0).use_index(False).execute(t)


def case(name, late, newer, keys, mem_wal=False):
    path = f'{ROOT}/{name}.lance'
    v0 = fresh(path, mem_wal).version
    newer(lance.dataset(path))              # the other folder's commit lands
    try:
        late(lance.dataset(path, version=v0))  # the stale folder read v0
        verdict = 'LANDED'
    except Exception as e:  # noqa: BLE001 - any refusal is the answer
        verdict = 'refused: ' + str(e).split('\n')[0].split(', /')[0][:90]
    ds = lance.dataset(path)
    rows = ds.to_table(filter=' OR '.join(f"id = '{k}'" for k in keys)).to_pylist()
    print(f'{name:30s} {verdict}\n    {sorted((r["id"], r["v"]) for r in rows)} rows={ds.count_rows()}')


print('-- late writes without markers')
case('upsert_same_key', lambda d: write(d, [('k5', 1)]), lambda d: write(d, [('k5', 2)]), ['k5'])
case('insert_same_new_key', lambda d: write(d, [('n1', 1)]), lambda d: write(d, [('n1', 2)]), ['n1'])
case('upsert_other_fragment', lambda d: write(d, [('k700', 1)]), lambda d: write(d, [('k5', 2)]), ['k5', 'k700'])
case('insert_other_new_key', lambda d: write(d, [('n2', 1)]), lambda d: write(d, [('n1', 2)]), ['n1', 'n2'])
case('delete_other_fragment', lambda d: write(d, delete=['k700']), lambda d: write(d, [('k5', 2)]), ['k5', 'k700'])
case('upsert_vs_newer_delete', lambda d: write(d, [('k700', 1)]), lambda d: write(d, delete=['k5']), ['k5', 'k700'])
print('-- with compacted-SSTable markers (MemWAL initialised)')
case('marker_same_gen', lambda d: write(d, [('k700', 1)], gen=1), lambda d: write(d, [('k5', 2)], gen=1), ['k5', 'k700'], True)
case('marker_older_gen', lambda d: write(d, [('k700', 1)], gen=1), lambda d: write(d, [('k5', 2)], gen=2), ['k5', 'k700'], True)
case('marker_newer_gen', lambda d: write(d, [('k700', 1)], gen=3), lambda d: write(d, [('k5', 2)], gen=2), ['k5', 'k700'], True)
case('unmarked_delete_after_marker', lambda d: write(d, delete=['k700']), lambda d: write(d, [('k5', 2)], gen=1), ['k5', 'k700'], True)
case('unmarked_upsert_after_marker', lambda d: write(d, [('k700', 1)]), lambda d: write(d, [('k5', 2)], gen=1), ['k5', 'k700'], True)
shutil.rmtree(ROOT)
