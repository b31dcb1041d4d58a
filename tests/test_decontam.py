"""Decontamination: the n-gram index (plain Python) and the Ray stage, on corpora made here.

Documents and eval items are random word sequences from one vocabulary (seeded), so a clean
document shares no 13-gram with an eval item unless one was planted in it.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gristmill.manifests import EvalSet
from gristmill.pipeline import ngrams
from gristmill.errors import ConfigError
from gristmill.pipeline.stages.decontaminate.config import DecontamConfig
from gristmill.pipeline.stages.decontaminate.tasks import cut_text, decontaminate, decontaminate_against_docs
from gristmill.pipeline.ngrams import build_index, find_matches, read_eval_items, word_hashes
from gristmill.pipeline.text import words

VOCAB = [f"w{i}" for i in range(2000)]


def phrase(rng, k):
    return " ".join(rng.choice(VOCAB, size=k))


def write_jsonl(path, records):
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return str(path)


# --------------------------------------------------------------------------------------
# Hashing and the index (no Ray)


def test_word_hashes_follow_text_words_and_do_not_depend_on_the_batch():
    texts = ["Hello, WORLD! It's ﬁne_ok", "", "  ...  ", "Straße ½ café ①", "hello world"]
    batch = word_hashes(texts)
    for t, text in enumerate(texts):
        alone = word_hashes([text]).hashes
        assert len(alone) == len(words(text))
        assert np.array_equal(batch.hashes[batch.first[t]:batch.first[t + 1]], alone)
    # same word -> same hash wherever it is; different words -> different hashes
    assert np.array_equal(batch.hashes[:2], batch.hashes[-2:])
    assert len(set(batch.hashes.tolist())) == len(set(w for t in texts for w in words(t)))


def test_word_char_table_is_the_text_regex_on_every_code_point():
    from gristmill.pipeline.text import _NON_WORD  # what pipeline.text splits words on

    table = ngrams.word_char_table()
    # the regex over one string of every code point (in C, not a Python call per code point):
    # each character it matches is a non-word character
    non_word = np.zeros(0x110000, dtype=bool)
    for m in _NON_WORD.finditer("".join(map(chr, range(0x110000)))):
        non_word[m.start():m.end()] = True
    assert np.flatnonzero(non_word == np.asarray(table, dtype=bool)).tolist() == []


def test_words_are_exactly_pipeline_text_words_on_any_unicode():
    rng = np.random.default_rng(3)
    # ASCII (all of it), Latin-1, combining marks, compatibility forms, CJK, digits, surrogates, emoji
    pool = [chr(c) for c in (*range(128), *range(0xA0, 0x180), 0x301, 0x308, 0xFB01, 0x2460, 0xBD, 0x2044,
                             0xFF21, 0x3000, 0x4E2D, 0x6587, 0x0661, 0x00DF, 0x130, 0xD800, 0x1F600)]
    samples = ["".join(rng.choice(pool, size=int(rng.integers(0, 60)))) for _ in range(1500)]
    samples += ["Don't_stop-me NOW!!\tOK\r\n42x", "Stra\u00dfe \u00bd caf\u00e9 e\u0301 \u2460"]
    for text in samples:
        alone = [word_hashes([w]).hashes for w in words(text)]
        expected = np.concatenate(alone) if alone else np.zeros(0, np.uint64)
        assert np.array_equal(word_hashes([text]).hashes, expected), repr(text)


def test_hashes_are_stable_across_processes():
    code = "from gristmill.pipeline.ngrams import text_grams; print(text_grams('a b c d e f g h i j k l m n o', 13).tolist())"
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
    assert runs[0] == runs[1] == f"{ngrams.text_grams('a b c d e f g h i j k l m n o', 13).tolist()}\n"


def test_find_matches_counts_hits_and_respects_min_matches():
    rng = np.random.default_rng(0)
    item = phrase(rng, 20)  # 8 thirteen-grams
    index = build_index([("ev", [("q0", item), ("q1", phrase(rng, 20))])], n=13)
    assert index.ngrams == 16 and index.lengths == (13,)
    doc = f"{phrase(rng, 50)}. {item.upper()}! {phrase(rng, 50)}"
    (m,) = find_matches(index, doc)
    assert (m.eval_set, m.item, m.hits) == ("ev", "q0", 8)
    assert [words(doc)[a:b] for a, b in m.spans][0] == words(item)[:13]
    partial = f"{phrase(rng, 30)} {' '.join(item.split()[:14])} {phrase(rng, 30)}"  # 2 grams of q0
    assert [x.hits for x in find_matches(index, partial)] == [2]
    assert find_matches(index, partial, min_matches=3) == []
    assert find_matches(index, doc, min_matches=8)[0].hits == 8
    assert find_matches(index, phrase(rng, 200)) == []


def test_short_items_are_one_gram_and_min_item_words_skips_tiny_ones():
    index = build_index([("ev", [("long", "a b c d e f g h i j k l m n"), ("short", "Paris is the capital"),
                                 ("tiny", "yes")])], n=13, min_item_words=2)
    assert list(index.item_grams) == [2, 1, 0] and index.lengths == (13, 4)
    hits = find_matches(index, "Everyone knows: paris IS the capital, of France. Yes.", min_matches=5)
    assert [(m.item, m.hits) for m in hits] == [("short", 1)]  # an item of 1 gram needs only 1 hit
    assert find_matches(index, "paris is a capital") == []


def test_index_save_and_load_round_trip(tmp_path):
    index = build_index([("a", [("0", "one two three four"), ("1", "five six")]), ("b", [("x", "one two three four")])], n=3)
    index.save(str(tmp_path / "i.npz"))
    back = ngrams.NgramIndex.load(str(tmp_path / "i.npz"))
    doc = "zero one two three four five six"
    assert find_matches(back, doc) == find_matches(index, doc)
    assert [(m.eval_set, m.item) for m in find_matches(back, doc)] == [("a", "0"), ("a", "1"), ("b", "x")]


def test_read_eval_items_jsonl_parquet_and_text(tmp_path):
    j = write_jsonl(tmp_path / "e.jsonl", [{"id": "a", "q": "Question one?", "choices": ["x", "y"]},
                                           {"id": "b", "q": "Question two?", "choices": []}])
    assert read_eval_items(j, fields=["q", "choices"], id_field="id") == [("a", "Question one?\nx\ny"),
                                                                          ("b", "Question two?\n")]
    assert [i for i, _ in read_eval_items(j, fields=["q"])] == ["0", "1"]
    with pytest.raises(ValueError, match=r"e.jsonl line 1: no field 'answer'"):
        read_eval_items(j, fields=["answer"])
    p = str(tmp_path / "e.parquet")
    pq.write_table(pa.table({"text": ["first item", "second item"]}), p)
    assert read_eval_items(p) == [("0", "first item"), ("1", "second item")]
    with pytest.raises(ValueError, match=r"e.parquet: no column\(s\) 'question'"):
        read_eval_items(p, fields=["question"])
    lines = tmp_path / "lines.txt"
    lines.write_text("item one\nitem two\n\n")  # trailing blank lines are not paragraph breaks
    assert read_eval_items(str(lines)) == [("0", "item one"), ("1", "item two")]
    paras = tmp_path / "paras.txt"
    paras.write_text("para one\nstill one\n\npara two\n")
    assert read_eval_items(str(paras)) == [("0", "para one\nstill one"), ("1", "para two")]
    assert len(read_eval_items(str(paras), split="line")) == 3


def test_cut_text_removes_spans_with_margin_and_keeps_the_rest():
    text = "Keep this start. " + "THE leaked eval sentence here." + " And keep this end."
    index = build_index([("ev", [("0", "the leaked eval sentence here")])], n=13)
    (m,) = find_matches(index, text)
    assert cut_text(text, m.spans, margin=0) == "Keep this start.\nAnd keep this end."
    assert cut_text(text, m.spans, margin=3) == "Keep this star\nd keep this end."


# --------------------------------------------------------------------------------------
# Configuration


def test_config_parses_defaults_and_resolves_paths(tmp_path):
    write_jsonl(tmp_path / "mmlu.jsonl", [{"text": "x"}])
    cfg = DecontamConfig.from_dict({"eval_sets": [{"name": "mmlu", "path": "mmlu.jsonl"}]}, base_dir=str(tmp_path))
    assert (cfg.n, cfg.policy, cfg.margin, cfg.min_matches) == (13, "drop", 200, 1)
    assert cfg.eval_sets[0].path == str(tmp_path / "mmlu.jsonl") and cfg.eval_sets[0].format == "jsonl"


@pytest.mark.parametrize("section, message", [
    ({"polcy": "cut"}, r"decontaminate.polcy: expected one of the keys .*, got unknown key 'polcy'; did you mean 'policy'"),
    ({"policy": "trim"}, r"decontaminate.policy: expected one of drop, cut, got 'trim'"),
    ({"n": 0}, r"decontaminate.n: expected an integer >= 1, got 0"),
    ({"n": "13"}, r"decontaminate.n: expected an integer >= 1, got '13'"),
    ({"min_matches": True}, r"decontaminate.min_matches: expected an integer >= 1, got True"),
    ({"margin": -1}, r"decontaminate.margin: expected an integer >= 0, got -1"),
    ({"eval_sets": [{"name": "x", "path": "nope.jsonl"}]},
     r"decontaminate.eval_sets\[0\].path: expected an existing eval file, got '.*nope.jsonl', which does not exist"),
    ({"eval_sets": [{"name": "x"}]}, r"decontaminate.eval_sets\[0\].path: expected a non-empty string \(required\), got nothing"),
    ({"eval_sets": [{"name": "x", "path": "e.jsonl", "split": "line"}]},
     r"decontaminate.eval_sets\[0\].split: expected no split on a jsonl file \(it applies to text files\), got 'line'"),
    ({"eval_sets": [{"name": "x", "path": "e.txt", "id_field": "id"}]},
     r"decontaminate.eval_sets\[0\].fields: expected no fields/id_field on a text file"),
    ({"eval_sets": [{"name": "x", "path": "e.csv"}]},
     r"decontaminate.eval_sets\[0\].format: expected one of jsonl, parquet, text, got no format, and the name '.*e.csv' does not tell it"),
    ({"eval_sets": [{"name": "x", "path": "e.jsonl"}, {"name": "x", "path": "e.jsonl"}]},
     r"decontaminate.eval_sets\[1\].name: expected eval set names to be unique, got 'x' again"),
])
def test_config_errors_name_the_key(tmp_path, section, message):
    write_jsonl(tmp_path / "e.jsonl", [{"text": "x"}])
    (tmp_path / "e.csv").write_text("x\n")
    (tmp_path / "e.txt").write_text("x\n")
    with pytest.raises(ConfigError, match=message):
        DecontamConfig.from_dict(section, base_dir=str(tmp_path))


# --------------------------------------------------------------------------------------
# The stage on Ray


def planted_corpus(tmp_path, n_docs=60, seed=0):
    """Clean documents, two eval files, and items planted in every 5th document (ground truth)."""
    rng = np.random.default_rng(seed)
    qa = [{"id": f"qa-{i}", "question": phrase(rng, 12), "answer": phrase(rng, 8)} for i in range(6)]
    trivia = [phrase(rng, 25) for _ in range(6)] + ["the capital of zzland is qqville"]  # one short item
    write_jsonl(tmp_path / "qa.jsonl", qa)
    (tmp_path / "trivia.txt").write_text("\n".join(trivia) + "\n")
    truth, rows = {}, []
    for i in range(n_docs):
        text = f"{phrase(rng, 200)}. "
        if i % 5 == 0:  # plant one item: qa items span both fields, trivia items as written
            k = i // 5
            planted = (("qa", f"qa-{k % 6}", f"{qa[k % 6]['question']}\n{qa[k % 6]['answer']}") if k % 2 == 0
                       else ("trivia", str(k % 7), trivia[k % 7]))
            text += planted[2].capitalize() + ". "
            truth[f"doc-{i}"] = planted[:2]
        text += phrase(rng, 200)
        rows.append({"id": f"doc-{i}", "order": i, "text": text, "source": f"mem://corpus/{i % 3}.jsonl",
                     "position": i, "lang": "en"})
    section = {"eval_sets": [
        {"name": "qa", "path": "qa.jsonl", "fields": ["question", "answer"], "id_field": "id"},
        {"name": "trivia", "path": "trivia.txt"},
    ]}
    return rows, truth, section


def by_id(table):
    return {r["id"]: r for r in table.to_pylist()}


def test_drop_finds_every_planted_item_and_removes_no_clean_document(tmp_path):
    rows, truth, section = planted_corpus(tmp_path)
    cfg = DecontamConfig.from_dict(section, base_dir=str(tmp_path))
    result = decontaminate(pa.Table.from_pylist(rows), cfg, str(tmp_path / "work"))
    removed, kept = by_id(result.removed), by_id(result.kept)
    assert {i: (r["eval_set"], r["eval_item"]) for i, r in removed.items()} == truth
    assert set(kept) == {r["id"] for r in rows} - set(truth)
    assert all(r["reason"] == "contaminated" and r["matches"] >= 1 for r in removed.values())
    assert kept["doc-1"] == rows[1]  # kept rows: every column, unchanged, nothing added
    assert removed["doc-0"]["text"] == rows[0]["text"] and removed["doc-0"]["lang"] == "en"
    stats = json.loads(json.dumps(result.stats))  # JSON-able
    assert stats["documents_removed"] == len(truth) and stats["documents_cut"] == 0
    found = {(s, f["item"]): [d["id"] for d in f["documents"]]
             for s, per in stats["per_eval_set"].items() for f in per["found"]}
    expected = {}
    for doc, key in sorted(truth.items(), key=lambda kv: int(kv[0].split("-")[1])):
        expected.setdefault(key, []).append(doc)
    assert found == expected
    assert stats["per_eval_set"]["trivia"]["items"] == 7
    assert stats["per_eval_set"]["qa"]["documents_removed"] + stats["per_eval_set"]["trivia"]["documents_removed"] == len(truth)
    doc0 = stats["per_eval_set"]["qa"]["found"][0]["documents"][0]
    assert (doc0["id"], doc0["source"], doc0["position"]) == ("doc-0", "mem://corpus/0.jsonl", 0)


def test_eval_set_records_hash_the_file_bytes(tmp_path):
    rows, truth, section = planted_corpus(tmp_path, n_docs=5)
    cfg = DecontamConfig.from_dict(section, base_dir=str(tmp_path))
    result = decontaminate(pa.Table.from_pylist(rows), cfg, None)
    records = result.stats["eval_sets"]
    assert [r["name"] for r in records] == ["qa", "trivia"]
    for r, name in zip(records, ("qa.jsonl", "trivia.txt")):
        data = (tmp_path / name).read_bytes()
        assert r["sha256"] == hashlib.sha256(data).hexdigest() and r["uri"] == str(tmp_path / name)
        assert EvalSet.from_dict(r, name) == EvalSet(**r)  # exactly the manifest's fields
    assert [r["items"] for r in records] == [6, 7]


def test_cut_policy_keeps_the_rest_of_the_document(tmp_path):
    rows, truth, section = planted_corpus(tmp_path)
    cfg = DecontamConfig.from_dict({**section, "policy": "cut", "margin": 0}, base_dir=str(tmp_path))
    result = decontaminate(pa.Table.from_pylist(rows), cfg, None)
    kept = by_id(result.kept)
    assert result.removed.num_rows == 0 and len(kept) == len(rows)
    assert result.stats["documents_cut"] == len(truth)
    index = build_index([(s.name, s.read_items()) for s in cfg.eval_sets], n=13)
    for r in rows:
        after = kept[r["id"]]["text"]
        if r["id"] in truth:
            head, tail = words(r["text"])[:200], words(r["text"])[-200:]
            assert words(after) == head + tail  # exactly the planted item is gone
            assert find_matches(index, after) == []
        else:
            assert after == r["text"]


def test_cut_that_leaves_nothing_drops_and_empty_references_remove_nothing(tmp_path):
    item = "an evaluation question that someone pasted into the corpus without any other text"
    write_jsonl(tmp_path / "e.jsonl", [{"text": item}, {"text": ""}])
    rows = [{"id": "only-item", "order": 0, "text": f"  {item.title()}!  ", "source": "s", "position": 0},
            {"id": "clean", "order": 1, "text": "nothing to see here", "source": "s", "position": 1}]
    cfg = DecontamConfig.from_dict({"eval_sets": [{"name": "e", "path": str(tmp_path / "e.jsonl")}], "policy": "cut"})
    result = decontaminate(pa.Table.from_pylist(rows), cfg, None)
    assert [r["id"] for r in result.removed.to_pylist()] == ["only-item"]
    assert result.stats["documents_removed"] == 1 and result.stats["documents_cut"] == 0
    assert result.stats["per_eval_set"]["e"]["items"] == 2 and result.stats["per_eval_set"]["e"]["items_indexed"] == 1
    none = decontaminate_against_docs(pa.Table.from_pylist(rows), pa.Table.from_pylist(rows[:0]), cfg)
    assert none.removed.num_rows == 0 and none.kept.num_rows == 2 and none.stats["eval_sets"][0]["items"] == 0


def test_min_matches_keeps_documents_with_too_few_hits(tmp_path):
    rng = np.random.default_rng(1)
    item = phrase(rng, 40)  # 28 grams
    write_jsonl(tmp_path / "e.jsonl", [{"text": item}])
    part = " ".join(item.split()[:16])  # 4 grams
    rows = [{"id": "partial", "order": 0, "text": f"{phrase(rng, 50)} {part} {phrase(rng, 50)}", "source": "s", "position": 0},
            {"id": "whole", "order": 1, "text": f"{phrase(rng, 50)} {item} {phrase(rng, 50)}", "source": "s", "position": 1}]
    removed = {}
    for min_matches in (1, 4, 5, 28, 100):
        cfg = DecontamConfig.from_dict({"eval_sets": [{"name": "e", "path": str(tmp_path / "e.jsonl")}],
                                        "min_matches": min_matches})
        result = decontaminate(pa.Table.from_pylist(rows), cfg, None)
        removed[min_matches] = sorted(r["id"] for r in result.removed.to_pylist())
    # an item wholly present always counts: it needs min(min_matches, its 28 grams) hits
    assert removed == {1: ["partial", "whole"], 4: ["partial", "whole"], 5: ["whole"], 28: ["whole"], 100: ["whole"]}


def test_against_validation_split(tmp_path):
    rng = np.random.default_rng(2)
    val = [{"id": f"val-{i}", "order": i, "text": phrase(rng, 60), "source": "v", "position": i} for i in range(4)]
    train = [{"id": f"tr-{i}", "order": i, "text": phrase(rng, 80), "source": "t", "position": i} for i in range(8)]
    train[3]["text"] += " " + " ".join(val[2]["text"].split()[10:40])  # a validation passage leaked into train
    cfg = DecontamConfig.from_dict({})
    result = decontaminate_against_docs(pa.Table.from_pylist(train), pa.Table.from_pylist(val), cfg)
    (gone,) = result.removed.to_pylist()
    assert (gone["id"], gone["eval_set"], gone["eval_item"], gone["matches"]) == ("tr-3", "validation", "val-2", 18)
    assert gone["reason"] == "validation_overlap"  # its own reason, not the eval sets' `contaminated`
    # its own min_matches: the 18 grams of the leaked passage are not enough for 19
    strict = decontaminate_against_docs(pa.Table.from_pylist(train), pa.Table.from_pylist(val),
                                        DecontamConfig.from_dict({"validation_min_matches": 19, "min_matches": 1}))
    assert strict.removed.num_rows == 0 and strict.stats["min_matches"] == 19
    assert result.kept.num_rows == 7
    record = result.stats["eval_sets"][0]
    assert record["uri"] == "split:validation" and record["items"] == 4
    again = decontaminate_against_docs(pa.Table.from_pylist(train), pa.Table.from_pylist(val[::-1]), cfg)
    assert again.stats == result.stats  # input order does not matter


def test_rerun_is_deterministic_and_reuses_the_cached_index(tmp_path):
    rows, truth, section = planted_corpus(tmp_path, n_docs=30)
    cfg = DecontamConfig.from_dict(section, base_dir=str(tmp_path))
    work = str(tmp_path / "work")
    first = decontaminate(pa.Table.from_pylist(rows), cfg, work)
    (cached,) = os.listdir(os.path.join(work, "decontam"))
    mtime = os.path.getmtime(os.path.join(work, "decontam", cached))
    # same documents in another order: same answer
    second = decontaminate(pa.Table.from_pylist(rows[::-1]), cfg, work)
    assert second.stats == first.stats
    assert os.path.getmtime(os.path.join(work, "decontam", cached)) == mtime  # loaded, not rebuilt
    assert by_id(second.removed) == by_id(first.removed)


@pytest.mark.slow
def test_demo_corpus_planted_items_are_all_found_and_nothing_else(tmp_path):
    from gristmill.pipeline.demo_corpus import write_demo_corpus
    from gristmill.pipeline.documents import make_id, make_order
    from gristmill.pipeline.readers import read_jsonl

    write_demo_corpus(str(tmp_path))
    rows = []
    for part, name in enumerate(("00-books.jsonl.zst", "01-news.jsonl.gz")):  # the files with English prose
        for rec in read_jsonl(str(tmp_path / "corpus" / name), "text", None):
            rows.append({"id": make_id(name, rec["position"]), "order": make_order(part, rec["position"]),
                         "text": rec["text"], "source": name, "position": rec["position"]})
    truth = {r["doc_id"]: (r["eval_set"], r["eval_item"])
             for r in map(json.loads, (tmp_path / "truth" / "contaminated.jsonl").read_text().splitlines())}
    assert truth  # the generator planted something
    section = {"eval_sets": [{"name": "demo_qa", "path": str(tmp_path / "evals" / "demo_qa.jsonl"), "id_field": "id"}]}
    result = decontaminate(pa.Table.from_pylist(rows), DecontamConfig.from_dict(section), str(tmp_path / "work"))
    removed = {r["id"]: (r["eval_set"], r["eval_item"]) for r in result.removed.to_pylist()}
    assert removed == truth
    assert result.kept.num_rows == len(rows) - len(truth)
    (record,) = result.stats["eval_sets"]
    data = (tmp_path / "evals" / "demo_qa.jsonl").read_bytes()
    assert record["sha256"] == hashlib.sha256(data).hexdigest() and record["items"] == len(data.splitlines())


def _validation_stage_run(tmp_path, docs_files, eval_path, work="work", stats=None, **section):
    """The executor's decontaminate stage (both passes) over ``docs_files``, as a fresh run of
    `prepare` in the same work dir would run it; the ids still in the run afterwards."""
    from gristmill.pipeline import stages
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.runner import SerialRunner
    from gristmill.pipeline.workdir import WorkDir

    job = PrepareConfig.from_dict({"inputs": ["unused.jsonl"], "output": {"store": str(tmp_path / "store"), "dataset": "d"},
                               "work_dir": str(tmp_path / work), "split": {"validation_fraction": 0.5},
                               "decontaminate": {"eval_sets": [{"name": "e", "path": eval_path}], **section}})
    (stage,) = [s for s in stages.build(job) if s.name == "decontaminate"]
    wd = WorkDir(str(tmp_path / work))
    from gristmill.pipeline.partitions import Partition

    ctx = stages.Context(wd, SerialRunner(wd), [Partition(p, ()) for p in range(len(docs_files))])
    out = ctx.run(stage)
    if stats is not None:
        stats.update({"removed": out.flow.removed, "removed_bytes": out.flow.removed_bytes, "detail": out.detail})
    return sorted(i for p in range(len(docs_files)) for t in ctx.survivors.docs(p, ["id"], 100)
                  for i in t.column("id").to_pylist())


def _write_docs(work, texts: dict, parts: list[list[str]]) -> list[str]:
    """Partition N's documents in ``work``/docs holding ``parts[N]`` (ids into ``texts``), as extract writes them."""
    from helpers import write_part

    from gristmill.pipeline.documents import make_order
    from gristmill.pipeline.workdir import WorkDir

    schema = pa.schema([("id", pa.string()), ("order", pa.int64()), ("part", pa.int32()), ("bytes", pa.int64()),
                        ("source", pa.string()), ("position", pa.int64()), ("text", pa.string())])
    files = []
    for p, chunk in enumerate(parts):
        path = WorkDir(str(work)).docs(p)
        write_part(path, schema, pa.table({"id": chunk, "order": [make_order(p, k) for k in range(len(chunk))], "part": [p] * len(chunk),
                            "bytes": [len(texts[i].encode()) for i in chunk], "source": ["s"] * len(chunk),
                            "position": list(range(len(chunk))), "text": [texts[i] for i in chunk]}, schema=schema))
        files.append(path)
    return files


def test_validation_pass_redone_after_a_kill_between_its_outputs_and_its_marker(tmp_path):
    """A validation-pass task killed after committing its removed file but before its marker is
    redone on the rerun; the rerun must not read that file as an earlier stage's removals (it
    would skip the documents the file removed and rewrite it without them)."""
    from gristmill.pipeline.stages.tokenize.config import SplitConfig
    from gristmill.pipeline.documents import split_of

    rng = np.random.default_rng(3)
    split = SplitConfig(validation_fraction=0.5)
    ids = [f"doc-{i}" for i in range(40)]
    val_ids = [i for i in ids if split_of(i, split) == "validation"][:2]
    train_ids = [i for i in ids if split_of(i, split) == "train"][:6]
    texts = {i: phrase(rng, 60) for i in val_ids + train_ids}
    texts[train_ids[4]] += " " + " ".join(texts[val_ids[1]].split()[5:35])  # a validation passage leaked into train
    docs_files = _write_docs(tmp_path / "work", texts, [val_ids[:1] + train_ids[:3], val_ids[1:] + train_ids[3:]])
    eval_path = write_jsonl(tmp_path / "e.jsonl", [{"text": phrase(rng, 20)}])  # matches nothing

    first = _validation_stage_run(tmp_path, docs_files, eval_path)
    assert train_ids[4] not in first and len(first) == len(val_ids + train_ids) - 1
    # kill -9 after the task's outputs were renamed into place, before its marker was written
    os.remove(tmp_path / "work" / "_done" / "decontaminate.validation" / "part-00001.batch.json")
    assert _validation_stage_run(tmp_path, docs_files, eval_path) == first


def test_validation_overlap_has_its_own_reason_and_boilerplate_is_not_overlap(tmp_path):
    """A footer in many documents of both splits is boilerplate: with validation_max_doc_freq
    (default 10) it is not overlap; a passage of one validation document leaked into one train
    document is, under the reason validation_overlap."""
    from gristmill.pipeline.stages.tokenize.config import SplitConfig
    from gristmill.pipeline.documents import split_of

    rng = np.random.default_rng(5)
    split = SplitConfig(validation_fraction=0.5)
    ids = [f"doc-{i}" for i in range(60)]
    val_ids = [i for i in ids if split_of(i, split) == "validation"][:6]
    train_ids = [i for i in ids if split_of(i, split) == "train"][:10]
    footer = phrase(rng, 25)
    texts = {i: phrase(rng, 60) + " " + footer for i in val_ids + train_ids}  # 16 documents share the footer
    texts[train_ids[2]] += " " + " ".join(texts[val_ids[3]].split()[5:35])
    docs_files = _write_docs(tmp_path / "w1", texts, [val_ids[:3] + train_ids[:5], val_ids[3:] + train_ids[5:]])
    shutil.copytree(tmp_path / "w1" / "docs", tmp_path / "w2" / "docs")
    eval_path = write_jsonl(tmp_path / "e.jsonl", [{"text": phrase(rng, 20)}])  # matches nothing

    stats = {}
    kept = _validation_stage_run(tmp_path, docs_files, eval_path, "w1", stats)
    assert sorted(set(val_ids + train_ids) - set(kept)) == [train_ids[2]]
    assert stats["removed"] == {"validation_overlap": 1}
    v = stats["detail"]["against_validation"]
    assert v["max_doc_freq"] == 10 and v["boilerplate_ngrams"] == 25 - 13 + 1  # the footer's 13-grams
    everything = {}
    kept = _validation_stage_run(tmp_path, docs_files, eval_path, "w2", everything, validation_max_doc_freq=None)
    assert set(train_ids) - set(kept) == set(train_ids)  # every train document shares the footer with validation
    assert everything["removed"] == {"validation_overlap": len(train_ids)}
    assert everything["detail"]["against_validation"]["boilerplate_ngrams"] is None


def test_report_names_the_first_matches_of_a_set_and_counts_them_all(tmp_path):
    """The report (and so the manifest) is bounded by ``limit``, not by the contamination found; the
    counts stay exact, and the listed matches are the first in corpus order."""
    from gristmill.pipeline.stages.decontaminate.tasks import report

    rows, truth, section = planted_corpus(tmp_path)
    cfg = DecontamConfig.from_dict(section, base_dir=str(tmp_path))
    whole = decontaminate(pa.Table.from_pylist(rows), cfg, None).stats
    index = build_index([(s.name, s.read_items()) for s in cfg.eval_sets], n=13)
    found = [{"id": r["id"], "source": r["source"], "position": r["position"], "action": "drop",
              "eval_matches": json.dumps([[r["eval_set"], r["eval_item"], r["matches"]]])}
             for r in sorted(decontaminate(pa.Table.from_pylist(rows), cfg, None).removed.to_pylist(),
                             key=lambda r: r["order"])]
    short = report(index, cfg, whole["eval_sets"], iter(found), limit=1)
    for name, per in short["per_eval_set"].items():
        full = whole["per_eval_set"][name]
        listed = [d for f in per["found"] for d in f["documents"]]
        assert per["matches"] == sum(len(f["documents"]) for f in full["found"]) > 1
        assert per["documents_listed"] == len(listed) == 1  # the first match of the set, in corpus order
        assert listed[0]["id"] == min((d for f in full["found"] for d in f["documents"]),
                                      key=lambda d: int(d["id"].split("-")[1]))["id"]
        # every count as in the whole report
        for k in ("items_found", "documents_removed", "documents_cut"):
            assert per[k] == full[k], k
    assert short["documents_removed"] == whole["documents_removed"] == len(truth)
