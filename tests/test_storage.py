"""The storage seam (manifests/storage.py): a Store resolved once from a URL and its options, its
capability flags, and its commit primitives and the writers built on them, on a local disk and on S3
(the local moto server, tests/s3server.py): whole or nothing, one winner per name."""
from __future__ import annotations

import pickle
import posixpath
import threading

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gristmill.manifests import storage
from gristmill.manifests.parquet_part import ParquetPart
from gristmill.manifests.storage import FsspecStore, LocalStore, S3Store, Store, atomic_write


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "objects")
    return f"{request.getfixturevalue('s3')}/objects"


def test_put_new_has_one_winner(where):
    store = Store.from_url(where)
    path = f"{where}/claimed"
    barrier, wins = threading.Barrier(16), []

    def claim(i):
        barrier.wait()
        if store.put_new(path, f"writer {i}".encode()):
            wins.append(i)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(wins) == 1
    assert store.read(path) == f"writer {wins[0]}".encode()  # the winner's bytes, never overwritten
    assert not store.put_new(path, b"late")
    assert store.read(path) == f"writer {wins[0]}".encode()


def test_put_and_open_put_are_whole_or_nothing(where):
    store = Store.from_url(where)
    fs, root = store.fs, store.path(where)
    path = f"{where}/sub/obj"
    store.put(path, b"old")
    store.put(path, b"new")
    assert store.read(path) == b"new"
    with pytest.raises(RuntimeError, match="writer died"):
        with store.open_put(path) as f:
            f.write(b"x" * (6 << 20))  # past s3fs's 5 MiB part size: a multipart upload is under way
            f.write(b"y" * (6 << 20))
            raise RuntimeError("writer died")
    assert store.read(path) == b"new"  # the failed write left the old object whole
    with pytest.raises(RuntimeError, match="writer died"):
        with store.open_put(f"{where}/fresh") as f:
            f.write(b"partial")
            raise RuntimeError("writer died")
    fs.invalidate_cache(root)
    assert sorted(posixpath.basename(p) for p in fs.find(root)) == ["obj"]  # no partial object, no temp name left
    assert not store.exists(f"{where}/fresh")
    with store.open_put(f"{where}/fresh") as f:
        f.write(b"whole")
    assert store.read(f"{where}/fresh") == b"whole"


def test_a_local_file_is_put_whole_or_not_at_all(tmp_path, monkeypatch):
    """LocalStore.put_file (a publish's disk-to-disk copy, in the kernel): the bytes whole at the
    name, or, when the copy fails part way, the old file unchanged and no temp file left."""
    import shutil

    store = LocalStore()
    src = tmp_path / "shard.bin"
    src.write_bytes(bytes(range(256)) * 20_000)  # 5 MB
    dst = tmp_path / "out" / "v1" / "shard.bin"
    store.put_file(str(src), str(dst))
    assert dst.read_bytes() == src.read_bytes()
    real = shutil.copyfile

    def dies(a, b, **kw):  # the disk fills half way through
        real(a, b, **kw)
        with open(b, "r+b") as f:
            f.truncate(1000)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copyfile", dies)
    src.write_bytes(b"new content" * 1000)
    with pytest.raises(OSError, match="No space"):
        store.put_file(str(src), str(dst))
    assert dst.read_bytes() == bytes(range(256)) * 20_000  # the old file, whole
    assert sorted(p.name for p in dst.parent.iterdir()) == ["shard.bin"]  # no temp name left


def test_an_s3_upload_buffers_one_8_mib_part_not_s3fs_50(s3):
    """A publish streams up to 16 files at once: each open upload holds at most one part in memory
    (s3fs's default part, 50 MiB, made that 800 MiB of the driver), and the object is whole."""
    store = Store.from_url(f"{s3}/parts")
    data = [bytes([i]) * (7 << 20) for i in range(3)]
    held = []
    with store.open_put(f"{s3}/parts/shard") as f:
        for chunk in data:
            f.write(chunk)
            held.append(f.file.buffer.tell())  # bytes not yet sent as a part
    assert max(held) < (8 << 20) + (7 << 20), held  # s3fs sends a part once 8 MiB are buffered
    assert store.read(f"{s3}/parts/shard") == b"".join(data)


def test_put_new_refused_where_not_atomic(tmp_path):
    class Plain(fsspec.AbstractFileSystem):  # a filesystem with no conditional write
        protocol = ("plainfs",)

    store = FsspecStore(Plain())
    assert not store.conditional_writes
    with pytest.raises(storage.StorageError, match="plainfs:// has no atomic create-if-absent"):
        store.put_new(str(tmp_path / "x"), b"1")


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
    fs.invalidate_cache(posixpath.join(root, "stage"))
    assert sorted(posixpath.basename(p) for p in fs.find(root)) == ["part-00001.parquet"]
    atomic_write(f"{where}/_done/stage/part-00001.json", b'{"rows": 5000}', Store.from_url(where))
    assert Store.from_url(where).read(f"{where}/_done/stage/part-00001.json") == b'{"rows": 5000}'


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
    data = Store.from_url(where).read(f"{where}/removed/s/part-00003.parquet")
    assert data == (tmp_path / "direct.parquet").read_bytes()
    assert pq.read_table(pa.BufferReader(data)).schema == schema
    ParquetPart(f"{where}/removed/s/part-00004.parquet", schema).abort()  # an empty part aborted: no file
    fs.invalidate_cache(posixpath.join(root, "removed", "s"))
    assert [posixpath.basename(p) for p in fs.find(posixpath.join(root, "removed"))] == ["part-00003.parquet"]


def test_workdir_markers_on_any_url(where):
    """The run dir's commit (a task's marker) on a local disk and on S3; a task receives the
    WorkDir pickled (its URL and store) and reads the same markers."""
    import pickle

    from gristmill.pipeline.workdir import WorkDir

    wd = WorkDir(f"{where}/work/key")
    assert wd.done("extract", "part-00000") is None
    wd.mark_done("extract", "part-00000", {"documents": 3})
    again = pickle.loads(pickle.dumps(wd))
    assert again.store == wd.store and again.done("extract", "part-00000") == {"documents": 3}
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


def test_a_store_is_resolved_from_its_url_with_its_capabilities(where):
    store = Store.from_url(where)
    if where.startswith("s3://"):
        assert type(store) is S3Store and not store.is_local
        assert store.whole_object_writes and store.conditional_writes  # one PUT; If-None-Match: *
    else:
        assert type(store) is LocalStore and store.is_local and store.conditional_writes
        assert Store.from_url(f"file://{where}") == store  # file:// is the same disk
        store.put(f"{where}/x", b"1")
        assert Store.from_url(f"file://{where}").read(f"file://{where}/x") == b"1"
    assert pickle.loads(pickle.dumps(store)) == store  # a task receives it and opens the same filesystem
    memory = Store.from_url("memory://gristmill-store-test")
    assert memory.whole_object_writes and memory.conditional_writes and not memory.is_local
    assert FsspecStore.kinds["gs"].whole_object_writes and not FsspecStore.kinds["gs"].conditional_writes


def test_storage_options_reach_the_store_and_the_work_dir(s3):
    """Options given once with the URL open the store's filesystem, and travel with a pickled work dir."""
    from gristmill.pipeline.workdir import WorkDir

    options = {"default_block_size": 6 << 20}
    wd = WorkDir(f"{s3}/work/key", options)
    assert wd.store.fs.storage_options["default_block_size"] == 6 << 20
    assert wd.store != Store.from_url(s3)  # another filesystem instance than the one without options
    again = pickle.loads(pickle.dumps(wd))
    assert again.store.fs.storage_options["default_block_size"] == 6 << 20
    wd.mark_done("extract", "part-00000", {"documents": 1})
    assert again.done("extract", "part-00000") == {"documents": 1}
    wd.write(wd.docs(0), b"")  # what makes it a run dir
    runs = WorkDir.runs_at(f"{s3}/work", options)
    assert [r.root for r in runs] == [wd.root] and runs[0].store == wd.store


def test_the_work_dir_options_are_not_the_jobs_content():
    """Credentials and endpoints say where the run dir is, not what the run makes: the run key and
    the manifest's config never hold them."""
    from gristmill.pipeline.config import PrepareConfig

    job = {"inputs": "x.jsonl", "output": {"store": "/tmp/s", "dataset": "d"}, "work_dir": "s3://b/w"}
    plain = PrepareConfig.from_dict(job)
    secret = PrepareConfig.from_dict({**job, "work_dir_options": {"key": "AKIA...", "secret": "..."}})
    assert secret.work_dir_options == {"key": "AKIA...", "secret": "..."} and plain.work_dir_options == {}
    assert secret.content_dict() == plain.content_dict()


def test_a_new_store_is_one_class():
    """docs/architecture.md's worked example: a subclass naming its protocols is what from_url
    gives for them, with its flags and its own create-if-absent."""
    from fsspec.implementations.memory import MemoryFileSystem

    class LabFS(MemoryFileSystem):  # a backend fsspec knows under its own protocol
        protocol = "labfs"

    fsspec.register_implementation("labfs", LabFS, clobber=True)

    class LabStore(storage.MemoryStore):
        protocols = ("labfs",)

    try:
        store = Store.from_url("labfs://bucket/x")
        assert type(store) is LabStore and store.conditional_writes and store.whole_object_writes
        assert store.put_new("labfs://bucket/x/claim", b"a") and not store.put_new("labfs://bucket/x/claim", b"b")
        assert store.read("labfs://bucket/x/claim") == b"a" and store.listdir("labfs://bucket/x") == ["claim"]
    finally:
        FsspecStore.kinds.pop("labfs")


def test_url_questions_are_answered_by_the_storage_module():
    assert storage.is_url("s3://b/k") and storage.is_url("file:///x") and not storage.is_url("/x/y")
    assert not storage.is_url("c:\\data")  # a Windows drive is no protocol
    assert storage.split_url("s3://b/k") == ("s3", "b/k") and storage.split_url("rel/x") == ("", "rel/x")
    assert storage.join_url(*storage.split_url("gs://b/k")) == "gs://b/k" and storage.join_url("", "a/b") == "a/b"
    assert storage.local_path("file:///x/y") == "/x/y" and storage.local_path("x/y") == "x/y"
    assert storage.local_path("s3://b/k") is None


def test_a_prepare_reaches_its_work_dir_only_through_the_options_given(tmp_path):
    """A work dir on a filesystem that refuses to open without an option: the job's
    work_dir_options must reach every read and write of the run dir (tasks, markers, logs, the
    trained tokenizer, staging, publish's copy), or the run fails. The serial runner keeps the
    in-memory filesystem in one process."""
    import json
    import uuid

    from fsspec.implementations.memory import MemoryFileSystem

    from gristmill.manifests import load_manifest, verify_published
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.executor import prepare

    class TicketFS(MemoryFileSystem):
        protocol = "gmticket"

        def __init__(self, ticket=None, **kwargs):
            if ticket != "ok":
                raise PermissionError("gmticket:// opens only with its ticket (a storage option)")
            super().__init__(**kwargs)

    fsspec.register_implementation("gmticket", TicketFS, clobber=True)

    class TicketStore(storage.MemoryStore):
        protocols = ("gmticket",)

    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    docs = [{"text": " ".join(words[(i + k) % len(words)] for k in range(40 + i % 7)) + f" document {i}."}
            for i in range(60)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    work = f"gmticket://work-{uuid.uuid4().hex[:8]}"
    job = {"inputs": str(tmp_path / "in.jsonl"), "output": {"store": str(tmp_path / "store"), "dataset": "t",
                                                            "report_html": False},
           "work_dir": work, "work_dir_options": {"ticket": "ok"}, "runner": "serial",
           "language": {"enabled": False}, "tokenizer": {"vocab_size": 300, "sample_bytes": 50_000},
           "pack": {"seq_len": 32, "shard_bytes": 10_000}}
    try:
        with pytest.raises(PermissionError):
            Store.from_url(work)  # without its option the filesystem does not open
        result = prepare(PrepareConfig.from_dict(job), quiet=True)
        assert result.run_dir.startswith(work)
        assert Store.from_url(work, ticket="ok").exists(f"{result.run_dir}/report.json")
        assert verify_published(load_manifest(f"{tmp_path}/store/t")) == []
    finally:
        FsspecStore.kinds.pop("gmticket")


def _ticketed(protocol: str, ticket: str):
    """A filesystem (fsspec's memory one, its own objects) that opens only with ``ticket=<ticket>``,
    served by a MemoryStore subclass (create-if-absent, so a manifest store can live there)."""
    from fsspec.implementations.memory import MemoryFileSystem

    class TicketFS(MemoryFileSystem):
        store, pseudo_dirs = {}, [""]

        def __init__(self, ticket=None, **kwargs):
            if ticket != self.ticket:
                raise PermissionError(f"{self.protocol}:// opens only with its ticket (a storage option)")
            super().__init__(**kwargs)

    TicketFS.protocol, TicketFS.ticket = protocol, ticket
    fsspec.register_implementation(protocol, TicketFS, clobber=True)
    type(f"{protocol}Store", (storage.MemoryStore,), {"protocols": (protocol,)})


def _storage_job(tmp_path, **options) -> dict:
    """A small serial prepare whose input, eval file and manifest store each live on a filesystem
    that opens only with its own ticket; ``options``: the storage options to give each."""
    import json
    import uuid

    import random

    run, rng = uuid.uuid4().hex[:8], random.Random(0)
    docs = [{"text": " ".join(f"w{rng.randrange(5000)}" for _ in range(40 + i % 7)) + f" document {i}."} for i in range(60)]
    inputs = Store.from_url("gmin://x", ticket="in-SECRET-1")
    inputs.put(f"gmin://in-{run}/a.jsonl", "".join(json.dumps(d) + "\n" for d in docs[:30]).encode())
    inputs.put(f"gmin://in-{run}/b.jsonl", "".join(json.dumps(d) + "\n" for d in docs[30:]).encode())
    Store.from_url("gmeval://x", ticket="eval-SECRET-2").put(
        f"gmeval://ev-{run}/qa.jsonl", (json.dumps({"text": docs[3]["text"]}) + "\n").encode())
    return {"inputs": [{"path": f"gmin://in-{run}/*.jsonl", "storage_options": options.get("inputs", {})}],
            "output": {"store": f"gmout://out-{run}", "dataset": "t", "report_html": False,
                       "storage_options": options.get("output", {})},
            "decontaminate": {"eval_sets": [{"name": "qa", "path": f"gmeval://ev-{run}/qa.jsonl",
                                             "storage_options": options.get("eval", {})}]},
            "work_dir": str(tmp_path / "work"), "runner": "serial", "language": {"enabled": False},
            "tokenizer": {"vocab_size": 300, "sample_bytes": 50_000}, "pack": {"seq_len": 32, "shard_bytes": 10_000}}


SECRETS = {"inputs": {"ticket": "in-SECRET-1"}, "eval": {"ticket": "eval-SECRET-2"}, "output": {"ticket": "out-SECRET-3"}}


@pytest.fixture
def ticketed():
    for protocol, ticket in (("gmin", "in-SECRET-1"), ("gmeval", "eval-SECRET-2"), ("gmout", "out-SECRET-3")):
        _ticketed(protocol, ticket)
    yield
    for protocol in ("gmin", "gmeval", "gmout"):
        FsspecStore.kinds.pop(protocol)


def test_a_prepare_reaches_inputs_eval_sets_and_its_store_only_through_their_options(tmp_path, ticketed):
    """Each of inputs[].storage_options, decontaminate.eval_sets[].storage_options and
    output.storage_options must reach every read and write of its files (listing the glob,
    hashing and reading the inputs, checking and reading the eval file, the write probe, the
    publish, the data card's read back), or the run fails; and no option's value lands in the
    manifest, report.json or any file of the run dir."""
    import os

    from gristmill.cli.prepare import write_data_card
    from gristmill.errors import ConfigError
    from gristmill.manifests import load_manifest, verify_published
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.executor import prepare

    for role in SECRETS:  # each option missing alone: the job fails on that filesystem
        # (the output store's refusal comes as the write probe's one line, before any work)
        with pytest.raises((PermissionError, ConfigError), match={"inputs": "gmin", "eval": "gmeval", "output": "gmout"}[role]):
            prepare(PrepareConfig.from_dict(_storage_job(tmp_path, **{**SECRETS, role: {}})), quiet=True)
    job = PrepareConfig.from_dict(_storage_job(tmp_path, **SECRETS))
    result = prepare(job, quiet=True)
    out = Store.from_url(job.output.store, **SECRETS["output"])
    pub = load_manifest(f"{job.output.store}/t", **SECRETS["output"])
    assert pub.manifest.sha256 == result.manifest_sha256 and verify_published(pub) == []  # read through pub.store
    assert [i.uri for i in pub.manifest.inputs] == [job.inputs[0].path.replace("*", n) for n in ("a", "b")]
    assert [e.name for e in pub.manifest.eval_sets][0] == "qa"
    assert pub.manifest.stats["stages"]["decontaminate"]["removed"] == {"contaminated": 1}
    assert write_data_card(result, quiet=True, storage_options=SECRETS["output"]) == f"{result.run_dir}/report.html"
    # `gristmill report` reads the version through --storage-option (without it: the store's own refusal)
    from gristmill import cli

    with pytest.raises(PermissionError, match="gmout"):
        cli.main(["report", pub.url, "--text"])
    assert cli.main(["report", pub.url, "--text", "--storage-option", "ticket=out-SECRET-3"]) == 0
    published = [out.read(p) for p in out.fs.find(out.path(pub.url))]
    run_files = [open(os.path.join(d, f), "rb").read() for d, _, fs in os.walk(result.run_dir) for f in fs]
    assert any(b'"manifest_sha256"' in b for b in run_files) and any(b'"config"' in b for b in published)
    for secret in ("SECRET", "ticket"):
        assert not [b for b in published + run_files if secret.encode() in b], f"{secret} written out"


def test_storage_options_are_not_the_jobs_content(tmp_path):
    """Credentials say where files are, not what the run makes: the run key (so a resume) and the
    manifest's config are the same with or without every storage option."""
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.executor import plan_inputs, run_key

    (tmp_path / "a.jsonl").write_text('{"text": "a"}\n')

    def job(inputs, evals, output):
        return PrepareConfig.from_dict({
            "inputs": [{"path": str(tmp_path / "*.jsonl"), "storage_options": inputs}],
            "output": {"store": "gmout://o", "dataset": "t", "storage_options": output}, "work_dir": str(tmp_path / "w"),
            "decontaminate": {"enabled": False, "eval_sets": [{"name": "qa", "path": "gmeval://e/qa.jsonl",
                                                               "storage_options": evals}]}})

    secret, plain = job(SECRETS["inputs"], SECRETS["eval"], SECRETS["output"]), job({}, {}, {})
    assert secret.inputs[0].storage_options == SECRETS["inputs"] and plain.inputs[0].storage_options == {}
    assert secret.content_dict() == plain.content_dict() and "SECRET" not in str(secret.content_dict())
    assert "'storage_options':" not in str(secret.content_dict())  # no key of that name at any depth
    assert run_key(secret, plan_inputs(secret)) == run_key(plain, plan_inputs(plain))


def test_a_stores_file_reads_lines_by_size(where):
    """A line reader asks ``readline(size)`` (pipeline/readers.py's bounded_lines): fsspec's object-store
    files take no size (they would read a 4 GiB line whole), so ``sized_readline`` wraps them."""
    store = Store.from_url(where)
    path = f"{where}/lines.jsonl"
    store.put(path, b"x" * 100_000 + b"\nshort\n")
    with store.fs.open(store.path(path), "rb") as f:
        lines = storage.sized_readline(f)
        assert lines.readline(10) == b"x" * 10
        assert (lines is f) == store.is_local  # a local file's readline takes a size: left as it is
        if not store.is_local:
            with pytest.raises(TypeError):
                f.readline(10)
