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


def test_finished_lists_committed_markers_only(tmp_path):
    wd = WorkDir(str(tmp_path))
    assert wd.finished("s") == set()  # no marker folder yet
    wd.mark_done("s", "a", {"n": 1})
    wd.mark_done("s", "b", {"n": 2}, sync=False)
    (tmp_path / "_done" / "s" / "c.json.tmp-0123abcd").write_bytes(b'{"n": 3')  # a marker torn before its rename
    assert wd.finished("s") == {"a", "b"}
