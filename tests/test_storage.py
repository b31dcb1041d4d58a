"""The commit primitives of manifests/storage.py, and the writers built on them, on a local disk
and on S3 (the local moto server, tests/s3server.py): whole or nothing, one winner per name."""
from __future__ import annotations

import posixpath
import threading

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gristmill.manifests import storage
from gristmill.manifests.parquet_part import ParquetPart
from gristmill.manifests.shards import atomic_write


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "objects")
    return f"{request.getfixturevalue('s3')}/objects"


def test_put_new_has_one_winner(where):
    fs, root = fsspec.core.url_to_fs(where)
    path = posixpath.join(root, "claimed")
    barrier, wins = threading.Barrier(16), []

    def claim(i):
        barrier.wait()
        if storage.put_new(fs, path, f"writer {i}".encode()):
            wins.append(i)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(wins) == 1
    assert storage.get(fs, path) == f"writer {wins[0]}".encode()  # the winner's bytes, never overwritten
    assert not storage.put_new(fs, path, b"late")
    assert storage.get(fs, path) == f"writer {wins[0]}".encode()


def test_put_and_open_put_are_whole_or_nothing(where):
    fs, root = fsspec.core.url_to_fs(where)
    path = posixpath.join(root, "sub", "obj")
    storage.put(fs, path, b"old")
    storage.put(fs, path, b"new")
    assert storage.get(fs, path) == b"new"
    with pytest.raises(RuntimeError, match="writer died"):
        with storage.open_put(fs, path) as f:
            f.write(b"x" * (6 << 20))  # past s3fs's 5 MiB part size: a multipart upload is under way
            f.write(b"y" * (6 << 20))
            raise RuntimeError("writer died")
    assert storage.get(fs, path) == b"new"  # the failed write left the old object whole
    with pytest.raises(RuntimeError, match="writer died"):
        with storage.open_put(fs, posixpath.join(root, "fresh")) as f:
            f.write(b"partial")
            raise RuntimeError("writer died")
    storage.refresh(fs, root)
    assert sorted(posixpath.basename(p) for p in fs.find(root)) == ["obj"]  # no partial object, no temp name left
    with storage.open_put(fs, posixpath.join(root, "fresh")) as f:
        f.write(b"whole")
    assert storage.get(fs, posixpath.join(root, "fresh")) == b"whole"


def test_put_new_refused_where_not_atomic(tmp_path):
    class Plain(fsspec.AbstractFileSystem):  # a filesystem with no conditional write
        protocol = ("plainfs",)

    with pytest.raises(storage.StorageError, match="plainfs:// has no atomic create-if-absent"):
        storage.put_new(Plain(), str(tmp_path / "x"), b"1")


def test_parquet_part_and_atomic_write(where):
    fs, root = fsspec.core.url_to_fs(where)
    schema = pa.schema([("id", pa.string()), ("n", pa.int64())])
    url = f"{where}/stage/part-00001.parquet"
    part = ParquetPart(url, schema)
    for i in range(5000):  # past one buffered batch
        part.append({"id": f"d{i}", "n": i})
    assert not fs.exists(posixpath.join(root, "stage", "part-00001.parquet"))  # nothing before the commit
    part.commit()
    with fsspec.open(url, "rb") as f:
        assert pq.read_table(f).column("n").to_pylist() == list(range(5000))
    dead = ParquetPart(f"{where}/stage/part-00002.parquet", schema)
    dead.write(pa.table({"id": ["x"], "n": [1]}))
    dead.abort()
    storage.refresh(fs, posixpath.join(root, "stage"))
    assert sorted(posixpath.basename(p) for p in fs.find(root)) == ["part-00001.parquet"]
    atomic_write(f"{where}/_done/stage/part-00001.json", b'{"rows": 5000}')
    assert storage.get(fs, posixpath.join(root, "_done", "stage", "part-00001.json")) == b'{"rows": 5000}'


def test_an_empty_parquet_part_is_the_file_parquet_writes_for_no_rows(where, tmp_path):
    """A part that got no rows is written from cached bytes (no writer opened): the same bytes a
    ParquetWriter closes with no rows, a file with the schema, nothing before the commit."""
    fs, root = fsspec.core.url_to_fs(where)
    schema = pa.schema([("id", pa.string()), ("text", pa.string())])
    part = ParquetPart(f"{where}/removed/s/part-00003.parquet", schema)
    part.write(pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}))
    assert not fs.exists(posixpath.join(root, "removed", "s", "part-00003.parquet"))
    part.commit()
    with pq.ParquetWriter(str(tmp_path / "direct.parquet"), schema, compression="zstd"):
        pass
    data = storage.get(fs, posixpath.join(root, "removed", "s", "part-00003.parquet"))
    assert data == (tmp_path / "direct.parquet").read_bytes()
    assert pq.read_table(pa.BufferReader(data)).schema == schema
    ParquetPart(f"{where}/removed/s/part-00004.parquet", schema).abort()  # an empty part aborted: no file
    storage.refresh(fs, posixpath.join(root, "removed", "s"))
    assert [posixpath.basename(p) for p in fs.find(posixpath.join(root, "removed"))] == ["part-00003.parquet"]


def test_workdir_markers_on_any_url(where):
    """The run dir's commit (a task's marker) on a local disk and on S3; a task receives the
    WorkDir pickled (its URL only) and reads the same markers."""
    import pickle

    from gristmill.pipeline.workdir import WorkDir

    wd = WorkDir(f"{where}/work/key")
    assert wd.done("extract", "part-00000") is None
    wd.mark_done("extract", "part-00000", {"documents": 3})
    again = pickle.loads(pickle.dumps(wd))
    assert "_fs" not in again.__dict__ and again.done("extract", "part-00000") == {"documents": 3}
    assert wd.docs(7).endswith("/work/key/docs/block-00007.parquet") and wd.docs(7).startswith(where)


def test_workdir_attempts_and_logs_on_any_url(where):
    """A batch's attempt files (create-if-absent: one number per attempt) and a task's log, on a
    local disk and on S3."""
    import logging
    import os
    import socket

    from gristmill.pipeline.runner import record_attempt, task_log
    from gristmill.pipeline.workdir import WorkDir

    wd = WorkDir(f"{where}/work/key")
    assert [record_attempt(wd, "extract", "part-00000") for _ in range(3)] == [1, 2, 3]
    assert sorted(wd.listdir(wd.logs("extract"))) == [f"part-00000.attempt-{n}" for n in (1, 2, 3)]
    # each names the worker that claimed it: where to look when a retry needs explaining
    assert wd.read_bytes(wd.attempt("extract", "part-00000", 2)).decode() == f"{socket.gethostname()} {os.getpid()}\n"
    log = wd.log("extract", "part-00001")
    with task_log(log):
        logging.getLogger("gristmill.task").warning("slow partition")
    assert wd.exists(log) and b"WARNING gristmill.task: slow partition" in wd.read_bytes(log)
