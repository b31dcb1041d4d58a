"""The per-document logic of the stages, without Ray: dedup, split, tokenizer, packing."""
import os

import numpy as np
import pytest

from gristmill.manifests import DatasetBuilder, read_doc_index, read_rows
from gristmill.pipeline.stages.tokenize.config import SplitConfig
from gristmill.pipeline.stages.tokenizer.config import TokenizerConfig
from gristmill.pipeline.documents import make_order, norm_hash, part_of, split_of
from gristmill.pipeline.stages.exact_dedup.tasks import find_exact_duplicates, keys_table, plan_tasks
from gristmill.pipeline.executor import group_files
from gristmill.pipeline.partitions import InputFile
from gristmill.pipeline.stages.pack.tasks import pack_split
from gristmill.pipeline.stages.tokenize.tasks import TOKENS_SCHEMA
from gristmill.pipeline.stages.tokenizer.tasks import train_bpe


def _keys(rows):
    d = {"norm_hash": [], "order": [], "id": [], "part": [], "bytes": []}
    for text, order in rows:
        for k, v in zip(d, (norm_hash(text), order, f"doc{order}", part_of(order), len(text))):
            d[k].append(v)
    return keys_table(d)


def test_exact_dedup_keeps_the_earliest_copy_whatever_the_input_order():
    rows = [("Hello,  World!", make_order(2, 0)), ("hello world", make_order(0, 5)), ("unique text", make_order(1, 0)),
            ("HELLO WORLD.", make_order(1, 3)), ("other", make_order(0, 1)), ("Other!", make_order(3, 0))]
    out = find_exact_duplicates(_keys(rows))
    expected = {f"doc{make_order(1, 3)}": f"doc{make_order(0, 5)}", f"doc{make_order(2, 0)}": f"doc{make_order(0, 5)}",
                f"doc{make_order(3, 0)}": f"doc{make_order(0, 1)}"}
    assert dict(zip(out.column("id").to_pylist(), out.column("duplicate_of").to_pylist())) == expected
    assert out.column("order").to_pylist() == sorted(out.column("order").to_pylist())
    shuffled = find_exact_duplicates(_keys(list(reversed(rows))))
    assert shuffled.equals(out)


def test_dedup_task_plan_covers_every_bucket_once_with_tasks_sized_to_the_data():
    from gristmill.pipeline.stages.exact_dedup.tasks import BUCKETS, KEYS_PER_TASK

    for n in (0, 10, 5_000_000, 10**10):
        tasks = plan_tasks(n)
        covered = [b for t in tasks for b in range(t["lo"], t["hi"])]
        assert covered == list(range(BUCKETS))
        assert len(tasks) == max(1, -(-n // KEYS_PER_TASK))  # no fixed cap: 10^10 keys make 5,000 tasks


def test_small_files_share_a_partition_large_ones_stand_alone():
    sizes = [5, 300, 40, 40, 30, None, 10, 10, 100, 1]
    files = [InputFile(uri=f"f{i}", rel=f"f{i}", size=n, mtime="", input=0, format="jsonl") for i, n in enumerate(sizes)]
    groups = group_files(files, limit=100)
    assert [[f.uri for f in g] for g in groups] == [
        ["f0"], ["f1"], ["f2", "f3"], ["f4"], ["f5"], ["f6", "f7"], ["f8"], ["f9"]]
    assert [f for g in groups for f in g] == files  # consecutive, in order, each file once
    assert all(len(g) == 1 or sum(f.size for f in g) <= 100 for g in groups)
    assert len(group_files(files, limit=1)) == len(files)


def test_split_is_a_pure_function_of_id_and_seed():
    cfg = SplitConfig(validation_fraction=0.2, seed=0)
    ids = [f"file.jsonl:{i}" for i in range(5000)]
    splits = [split_of(i, cfg) for i in ids]
    assert splits == [split_of(i, cfg) for i in ids]
    assert 0.17 < splits.count("validation") / len(ids) < 0.23
    other = [split_of(i, SplitConfig(validation_fraction=0.2, seed=1)) for i in ids]
    assert other != splits


def test_bpe_training_is_deterministic(tmp_path):
    texts = [f"The mill ground {i} bushels of grain while the river ran past the wheel number {i % 7}." for i in range(300)]
    cfg = TokenizerConfig(vocab_size=400)
    train_bpe(iter(texts), cfg, str(tmp_path / "a.json"))
    train_bpe(iter(texts), cfg, str(tmp_path / "b.json"))
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def _token_file(path, docs, first=0):
    """docs: list of (id, split, tokens) in order; ``first``: the position of the first one; ``path``
    a file or a partition's rows of a block file (``WorkDir.tokens``, a block of its own)."""
    from gristmill.manifests.storage import Store
    from gristmill.pipeline.workdir import BlockOutputs, writer

    with BlockOutputs():  # a PartPath's block (a block of its own); a plain file is written whole as ever
        _token_file_rows(writer(path, TOKENS_SCHEMA, Store.from_url(path)), docs, first)
    return str(path)


def _token_file_rows(p, docs, first):
    p.write({"id": [d[0] for d in docs], "order": list(range(first, first + len(docs))), "source": ["src"] * len(docs),
             "position": list(range(first, first + len(docs))), "lang": ["en"] * len(docs), "split": [d[1] for d in docs],
             "tokens": [d[2] for d in docs], "url": [f"https://u/{d[0]}" for d in docs]})
    p.commit()


def test_pack_rows_and_doc_index_reconstruct_every_document(tmp_path):
    from helpers import write_tokenizer

    rng = np.random.default_rng(0)
    docs = [(f"d{i}", "validation" if i % 5 == 0 else "train", list(rng.integers(1, 500, rng.integers(1, 40))) + [0])
            for i in range(60)]
    files = [_token_file(tmp_path / "t0.parquet", docs[:25]), _token_file(tmp_path / "t1.parquet", docs[25:])]
    b = DatasetBuilder(str(tmp_path / "stage"), dataset="t", seq_len=8, tokenizer_json=write_tokenizer(str(tmp_path / "tok.json")),
                       vocab_size=512, eos_id=0)
    stats = {}
    with b.doc_index_writer() as w:
        for split in ("train", "validation"):
            stats[split] = pack_split(b, files, split, seq_len=8, shard_bytes=9 * 2 * 5, index=w)  # 5 rows a shard
    index = read_doc_index(str(tmp_path / "stage" / b.doc_index.path)).to_pylist()
    assert [(s["shard"], s["row"], s["start"]) for s in index] == sorted((s["shard"], s["row"], s["start"]) for s in index)
    assert all(s["row"] < b.shards[s["shard"]].rows for s in index)  # no span points into the dropped tails
    assert all(s["url"] == f"https://u/{s['doc_id']}" for s in index)  # provenance reaches the index
    shards = [read_rows(str(tmp_path / "stage" / s.path)) for s in b.shards]
    assert all(r.shape[1] == 9 for r in shards) and all(r.shape[0] <= 5 for r in shards)
    for split in ("train", "validation"):
        stream = np.concatenate([d[2] for d in docs if d[1] == split])
        kept = stats[split]["rows"] * 9
        assert stats[split]["tokens_dropped_tail"] == len(stream) - kept
        packed = np.concatenate([shards[i].reshape(-1) for i, s in enumerate(b.shards) if s.split == split])
        assert np.array_equal(packed, stream[:kept])  # documents in order, EOS after each, nothing reordered
    got: dict[str, list] = {}
    for span in index:
        row = shards[span["shard"]][span["row"]]
        got.setdefault(span["doc_id"], []).extend(row[span["start"]: span["start"] + span["length"]].tolist())
    for doc_id, split, tokens in docs:
        if doc_id in got:
            assert got[doc_id] == [int(t) for t in tokens][: len(got[doc_id])]
    assert len(got) >= 50


def _pack_in_ranges(tmp_path, name, docs, cuts, range_tokens):
    """Pack ``docs`` split into partition files at ``cuts`` with the pack stage's range tasks (no Ray)."""
    import functools
    import os

    from gristmill.manifests import Shard
    from gristmill.pipeline.stages.pack import tasks as pack
    from gristmill.pipeline.workdir import WorkDir

    bounds = [0, *cuts, len(docs)]
    wd = WorkDir(str(tmp_path / name))
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        _token_file(wd.tokens(i), docs[a:b], a)
    tokens = {s: [sum(len(d[2]) for d in docs[a:b] if d[1] == s) for a, b in zip(bounds, bounds[1:])] for s in pack.SPLITS}
    staging = wd.staging
    task = functools.partial(pack.pack_range_task, wd=wd, seq_len=8, shard_bytes=9 * 2 * 5, vocab_size=512)
    out = [task(item) for item in pack.plan_ranges(tokens, range_tokens)]
    shards, slices = [], []
    for o in out:
        slices.append((o["index"], len(shards)))
        shards += [Shard(**s) for s in o["shards"]]
    merged = pack.merge_doc_index({}, wd, slices, os.path.join(staging, "doc_index.parquet"))
    rows = [read_rows(os.path.join(staging, s.path)) for s in shards]
    return shards, rows, merged, read_doc_index(os.path.join(staging, "doc_index.parquet")).to_pylist(), out


def test_pack_ranges_do_not_depend_on_the_partitioning(tmp_path):
    rng = np.random.default_rng(3)
    docs = [(f"d{i}", "validation" if i % 7 == 0 else "train", list(rng.integers(1, 500, rng.integers(1, 40))) + [0])
            for i in range(120)]
    a = _pack_in_ranges(tmp_path, "a", docs, [30, 31, 90], range_tokens=200)
    b = _pack_in_ranges(tmp_path, "b", docs, [5, 64], range_tokens=200)
    assert len(a[4]) > 4  # several ranges per split
    assert [(s.sha256, s.split, s.rows) for s in a[0]] == [(s.sha256, s.split, s.rows) for s in b[0]]
    assert a[2] == b[2]  # the merged document index is byte-identical
    index, rows = a[3], a[1]
    for span in index:  # every span points into its shard's rows
        assert span["row"] < a[0][span["shard"]].rows
    # each range drops at most one row's tail; every document that starts in a range is packed in it
    for o in a[4]:
        assert o["stats"]["tokens_dropped_tail"] < 9
    got: dict[str, list] = {}
    for span in index:
        got.setdefault(span["doc_id"], []).extend(rows[span["shard"]][span["row"]][span["start"]: span["start"] + span["length"]].tolist())
    for doc_id, split, tokens in docs:
        if doc_id in got:
            assert got[doc_id] == [int(t) for t in tokens][: len(got[doc_id])]
    assert len(got) >= 110


def test_serial_runner_commits_markers_and_a_rerun_skips_finished_tasks(tmp_path):
    from gristmill.pipeline.runner import SerialRunner
    from gristmill.pipeline.workdir import WorkDir

    wd, calls = WorkDir(str(tmp_path)), []

    def fn(item):
        calls.append(item["name"])
        return {"documents_in": item["n"]}

    items = [{"name": f"t{i}", "n": i} for i in range(3)]
    first = SerialRunner(wd).run("step", items, fn)
    assert [s["documents_in"] for s in first] == [0, 1, 2] and calls == ["t0", "t1", "t2"]
    os.remove(wd.marker("step", "t1"))  # killed before its marker: redone alone
    again = SerialRunner(wd)
    assert [s["documents_in"] for s in again.run("step", items, fn)] == [0, 1, 2]
    assert calls == ["t0", "t1", "t2", "t1"] and again.resumed_tasks == 2
    with pytest.raises(RuntimeError, match="task names are not unique"):
        again.run("step", items + items[:1], fn)


def test_manifest_stats_chain_the_flow_rows_and_balance_the_accounting():
    from gristmill.pipeline.stages import StageResult
    from gristmill.pipeline.stats import Accounting, Counts, manifest_stats, summed

    assert summed([{"a": 1, "r": {"x": 1}}, {"a": 2, "r": {"y": 3, "x": 1}}]) == {"a": 3, "r": {"x": 2, "y": 3}}
    results = [
        StageResult("extract", rows={"extract": {"documents_in": 12}}, flow_start=(10, 1000),
                    accounting=Accounting(input=12, removed={"language": 1}, quarantined={"empty": 1})),
        StageResult("dedup", flow=Counts.of_tasks([{"removed": {"dup": 2}, "removed_bytes": 150},
                                                   {"removed": {"dup": 1}, "removed_bytes": 50}])),
        StageResult("pii", flow=Counts(), detail={"replacements": {}}),
        StageResult("tokenize", rows={"tokenize": {"documents_out": 7}}, accounting=Accounting(kept=7)),
    ]
    stats = manifest_stats(results)
    assert stats["stages"]["dedup"] == {"documents_in": 10, "bytes_in": 1000, "documents_out": 7, "bytes_out": 800,
                                        "removed": {"dup": 3}}
    assert stats["stages"]["pii"]["documents_in"] == 7 and stats["stages"]["pii"]["detail"] == {"replacements": {}}
    assert list(stats["stages"]) == ["extract", "dedup", "pii", "tokenize"]
    assert stats["accounting"] == {"input": 12, "kept": 7, "removed": {"dup": 3, "language": 1},
                                   "quarantined": {"empty": 1}, "balanced": True}


def test_survivors_apply_each_stage_file_of_the_partition(tmp_path):
    import pyarrow as pa

    from gristmill.pipeline.documents import OVERRIDE_SCHEMA, REMOVED_SCHEMA
    from helpers import write_part

    from gristmill.pipeline.survivors import Survivors
    from gristmill.pipeline.workdir import WorkDir

    wd = WorkDir(str(tmp_path))
    for path, schema, rows in ((wd.docs(3), pa.schema([("id", pa.string()), ("text", pa.string())]),
                                {"id": ["a", "b", "c"], "text": ["A", "B", "C"]}),
                               (wd.removed("s1", 3), REMOVED_SCHEMA, {"id": ["b"], "order": [1], "part": [3], "bytes": [1],
                                                                       "stage": ["s1"], "reason": ["r"], "detail": [None],
                                                                       "text": [None]}),
                               (wd.overrides("s1", 3), OVERRIDE_SCHEMA, {"id": ["c"], "order": [2], "part": [3], "text": ["c1"]}),
                               (wd.overrides("s2", 3), OVERRIDE_SCHEMA, {"id": ["c"], "order": [2], "part": [3], "text": ["c2"]})):
        write_part(path, schema, rows)
    s = Survivors(wd).after("s1", removed=True, overrides=True)
    assert s.removed_files(3) == [wd.removed("s1", 3)]
    got = [r for t in s.docs(3, ["id", "text"], 2) for r in t.to_pylist()]
    assert got == [{"id": "a", "text": "A"}, {"id": "c", "text": "c1"}]
    later = s.after("s2", overrides=True)  # a later stage's text wins
    assert [r["text"] for t in later.docs(3, ["id", "text"], 10) for r in t.to_pylist()] == ["A", "c2"]


def test_a_misspelt_flow_field_is_refused_not_counted_zero():
    from gristmill.pipeline.stats import Counts

    assert Counts.of_task({"removed": {"dup": 2}, "removed_bytes": 9, "pairs": 3, "documents_out": 1}).removed_bytes == 9
    with pytest.raises(ValueError, match="'removed_byte', close to the flow field 'removed_bytes'"):
        Counts.of_tasks([{"removed": {"dup": 2}, "removed_byte": 9}])


def test_partitions_are_records_and_the_run_key_is_as_before(tmp_path):
    """plan_inputs gives Partition/InputFile records: a misspelt field is an AttributeError where it
    is read (a dict's .get read None), a frozen one cannot be changed, and a task's pickle is small.
    The run key is the dict era's (each file's [uri, bytes, mtime]), so a run dir made before resumes."""
    import dataclasses
    import pickle

    from gristmill.manifests import sha256_json
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.executor import WORK_DIR_LAYOUT, plan_inputs, run_key
    from gristmill.pipeline.partitions import Partition

    for name, n in (("a.jsonl", 10), ("b.jsonl", 20), ("sub/c.jsonl", 5000)):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x" * n)
    job = PrepareConfig.from_dict({"inputs": [str(tmp_path / "*.jsonl"), {"path": str(tmp_path / "sub" / "*.jsonl"),
                                                                           "text_field": "body"}],
                                   "output": {"store": str(tmp_path / "s"), "dataset": "d"}, "work_dir": str(tmp_path / "w"),
                                   "partitioning": {"partition_bytes": 100}})
    parts = plan_inputs(job)
    assert all(type(p) is Partition for p in parts) and [p.part for p in parts] == [0, 1]
    assert [[(f.rel, f.size, f.input, f.text_field) for f in p.files] for p in parts] == [
        [("a.jsonl", 10, 0, "text"), ("b.jsonl", 20, 0, "text")], [("sub/c.jsonl", 5000, 1, "body")]]
    with pytest.raises(AttributeError):
        parts[0].files[0].byte  # noqa: B018 - the misspelling of `size` fails where it is read
    with pytest.raises(AttributeError):
        parts[0].file  # noqa: B018
    with pytest.raises(dataclasses.FrozenInstanceError):
        parts[0].part = 3
    assert pickle.loads(pickle.dumps(parts)) == parts and len(pickle.dumps(parts[1])) < 500
    ids = [[[f.uri, f.size, f.mtime] for f in p.files] for p in parts]
    assert all(isinstance(i[2], str) and i[2] for p in ids for i in p)
    assert run_key(job, parts) == sha256_json({"job": job.content_dict(), "inputs": ids, "layout": WORK_DIR_LAYOUT})[:16]
