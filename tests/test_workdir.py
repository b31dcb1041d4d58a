"""The work dir's small-file reader (``read_parquet``, the stages' replacement for ``pq.read_table``)
and its listing of a step's finished tasks."""
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gristmill.pipeline.workdir import WorkDir, read_parquet


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("rp")
    rng = random.Random(5)
    t = pa.table({"part": [rng.randrange(10) for _ in range(3000)], "order": list(range(3000)),
                  "id": [f"d{i}" if i % 7 else None for i in range(3000)]}).sort_by("part")
    pq.write_table(t, root / "many-groups.parquet", row_group_size=250)  # statistics prune whole row groups
    pq.write_table(t.slice(0, 0), root / "empty.parquet")
    return [str(root / "many-groups.parquet"), str(root / "empty.parquet")]


@pytest.mark.parametrize("filters", [None, [("part", "=", 3)], [("part", ">=", 2), ("part", "<", 5)],
                                     [("id", "in", ["d1", "d8", "nope"])], [("part", "==", 99)],
                                     [("order", ">", 2990)], [("order", "<=", 3)]])
@pytest.mark.parametrize("columns", [None, ["order"], ["id", "part"]])
def test_read_parquet_reads_what_read_table_reads(files, filters, columns):
    for f in files:
        assert read_parquet(f, columns, filters).equals(pq.read_table(f, columns=columns, filters=filters))


def test_read_parquet_casts_to_a_given_schema_and_refuses_an_unknown_op(files):
    schema = pa.schema([("part", pa.int16()), ("order", pa.int64()), ("id", pa.string())])
    got = read_parquet(files[0], filters=[("part", "=", 4)], schema=schema)
    assert got.schema == schema and got.equals(pq.read_table(files[0], filters=[("part", "=", 4)], schema=schema))
    with pytest.raises(ValueError, match="unsupported filter"):
        read_parquet(files[0], filters=[("part", "not in", [1])])


def test_finished_reads_task_and_batch_markers_and_skips_torn_ones(tmp_path):
    wd = WorkDir(str(tmp_path))
    assert wd.finished("s") == {}  # no marker folder yet
    wd.mark_done("s", "a", {"n": 1})
    wd.mark_done("s", "b", {"n": 2}, sync=False)
    wd.mark_batch_done("s", {"c": {"n": 3}, "d": {"n": 4}})
    done = tmp_path / "_done" / "s"
    (done / "e.json.tmp-0123abcd").write_bytes(b'{"n": 5}')  # a marker's temp file, before its rename
    (done / "f.json").write_bytes(b'{"n": 6')  # torn by a crash of the machine: not a whole object
    (done / "g.batch.json").write_bytes(b'{"tasks": {"g": {"n": 7}, "h": {')
    (done / "i.json").write_bytes(b"\x00\x00\x00")
    assert wd.finished("s") == {"a": {"n": 1}, "b": {"n": 2}, "c": {"n": 3}, "d": {"n": 4}}
    assert wd.done("s", "d") == {"n": 4} and wd.done("s", "f") is None and wd.done("s", "g") is None


def test_read_parquet_reads_a_url_through_fsspec(files):
    import fsspec

    with open(files[0], "rb") as f:
        data = f.read()
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/rp/many-groups.parquet", data)
    got = read_parquet("memory://rp/many-groups.parquet", ["order"], [("part", "=", 2)])
    assert got.equals(pq.read_table(files[0], columns=["order"], filters=[("part", "=", 2)])) and got.num_rows
