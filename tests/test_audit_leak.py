"""`audit leak` on a dataset of real (word-level) text whose documents run across rows."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import write_checkpoint_meta, write_tokenizer

from gristmill.audit import consumed, read_checkpoint
from gristmill.audit.leak import audit_leak
from gristmill.cli import main
from gristmill.manifests import DatasetBuilder, Input, ManifestStore

SEQ_LEN = 16
WIDTH = SEQ_LEN + 1


def pack_dataset(root, docs, tokenizer_json, vocab_size, eos_id, config=None):
    """Token-id documents packed with EOS across rows into one shard, as the pipeline packs them.

    Returns (published, stream, doc_of): the packed token stream and the document of each token.
    """
    stream, doc_of = [], []
    for d, ids in enumerate(docs):
        stream += list(ids) + [eos_id]
        doc_of += [d] * (len(ids) + 1)
    n_rows = len(stream) // WIDTH
    stream, doc_of = np.array(stream[: n_rows * WIDTH]), np.array(doc_of[: n_rows * WIDTH])
    cols = {k: [] for k in ("shard", "row", "start", "length", "doc_id", "source", "position", "lang")}
    # A span is a maximal run of one document's tokens inside one row.
    for r in range(n_rows):
        owners = doc_of[r * WIDTH:(r + 1) * WIDTH]
        starts = np.flatnonzero(np.diff(np.concatenate([[-1], owners])) != 0)
        for s, e in zip(starts, np.append(starts[1:], WIDTH)):
            d = int(owners[s])
            for k, v in zip(cols, (0, r, int(s), int(e - s), f"doc-{d}", "mem://text/0.jsonl", d, "en")):
                cols[k].append(v)
    staging = os.path.join(root, "staging")
    b = DatasetBuilder(staging, dataset="text", seq_len=SEQ_LEN, tokenizer_json=tokenizer_json, vocab_size=vocab_size,
                       eos_id=eos_id)
    b.add_shard("train", stream.reshape(n_rows, WIDTH))
    b.set_doc_index(pa.table(cols))
    m = b.manifest(inputs=[Input("mem://text/0.jsonl", 1, "0" * 64)], config=config or {}, code_version="test", stats={})
    return ManifestStore(os.path.join(root, "store")).publish(m, staging), stream, doc_of


def build_text_dataset(root, n_docs=40, seed=0, config=None):
    """Documents of 5-40 words ``w2..w299`` (word-level tokenizer: one token per word, EOS = 0)."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(2, 300, size=rng.integers(5, 41)).tolist() for _ in range(n_docs)]
    os.makedirs(root, exist_ok=True)
    tok = write_tokenizer(os.path.join(root, "tok.json"))
    published, stream, doc_of = pack_dataset(root, docs, tok, 512, 0, config)
    return published, docs, stream, doc_of


def words(ids):
    return " ".join(f"w{i}" for i in ids)


@pytest.fixture
def text_run(tmp_path):
    published, docs, stream, doc_of = build_text_dataset(str(tmp_path / "data"))
    ckpt_dir = write_checkpoint_meta(str(tmp_path / "run"), published, step=8, global_batch=4, world_size=2)  # 32 of 55 rows
    used = consumed(published.manifest, read_checkpoint(ckpt_dir))
    # Words of each document inside the rows the model consumed (EOS is not a word).
    in_seen_row = np.isin(np.arange(len(stream)) // WIDTH, used.row) & (stream != 0)
    seen_words = np.bincount(doc_of[in_seen_row], minlength=len(docs))
    return published, docs, ckpt_dir, used, seen_words, doc_of


def write_eval(path, items):
    with open(path, "w") as f:
        for item_id, text in items:
            f.write(json.dumps({"id": item_id, "question": text}) + "\n")
    return path


def test_planted_items_in_seen_text_are_found_and_unseen_ones_are_not(text_run, tmp_path):
    published, docs, ckpt_dir, used, seen_words, doc_of = text_run
    fully = next(d for d in range(len(docs)) if seen_words[d] == len(docs[d]) >= 20)
    unseen = next(d for d in range(len(docs)) if seen_words[d] == 0 and len(docs[d]) >= 13)
    eval_file = write_eval(str(tmp_path / "eval.jsonl"), [
        ("planted-full", "Question: " + words(docs[fully][2:17]).upper() + "?"),  # case and punctuation differ
        ("planted-unseen", words(docs[unseen])),
        ("clean", words(range(300, 330))),
        ("short-clean", "w301 w302"),
    ])
    report = audit_leak(published, used, eval_file, fields=["question"], id_field="id")
    s = report.summary
    assert [(r["item"], r["doc_id"]) for r in report.matches.to_pylist()] == [("planted-full", f"doc-{fully}")]
    assert s["items"] == 4 and s["leaked_items"] == ["planted-full"] and s["decontaminated_against"] is None
    row = report.matches.to_pylist()[0]
    assert row["source"] == "mem://text/0.jsonl" and row["position"] == fully and row["ngrams"] == 3  # 15 words: 3 13-grams
    rows = np.unique(np.flatnonzero(doc_of == fully) // WIDTH)
    assert row["steps"] == np.unique(used.step[np.isin(used.row, rows)]).tolist()


def test_only_the_seen_part_of_a_partly_seen_document_counts(text_run, tmp_path):
    published, docs, ckpt_dir, used, seen_words, doc_of = text_run
    partly = next(d for d in range(len(docs)) if 13 <= seen_words[d] < len(docs[d]) - 13)
    report = audit_leak(published, used, write_eval(str(tmp_path / "partly.jsonl"), [("whole-doc", words(docs[partly]))]),
                        fields=["question"], id_field="id")
    [row] = report.matches.to_pylist()
    assert row["doc_id"] == f"doc-{partly}"
    # Only the n-grams inside the consumed rows were seen, not all of the document's.
    assert 1 <= row["ngrams"] < len(docs[partly]) - 13 + 1


def test_clean_eval_set_reports_no_leak_via_cli(text_run, tmp_path, capsys):
    published, docs, ckpt_dir, used, seen_words, doc_of = text_run
    eval_file = write_eval(str(tmp_path / "clean.jsonl"), [(f"c{i}", words(range(300 + i, 320 + i))) for i in range(10)])
    out = str(tmp_path / "leaks.parquet")
    assert main(["audit", "leak", ckpt_dir, "--eval", eval_file, "--field", "question", "--out", out]) == 0
    assert capsys.readouterr().out.startswith("clean: 0 of 10 items")
    assert pq.read_table(out).num_rows == 0
    # Every document's whole text as an eval set: exactly the fully seen documents leak; never an unseen one.
    fully = [d for d in range(len(docs)) if seen_words[d] == len(docs[d])]
    unseen = [d for d in range(len(docs)) if seen_words[d] == 0]
    all_docs = write_eval(str(tmp_path / "all.jsonl"), [(f"d{d}", words(docs[d])) for d in fully + unseen])
    assert main(["audit", "leak", ckpt_dir, "--eval", all_docs, "--field", "question", "--id-field", "id", "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert fully and unseen and summary["leaked_items"] == [f"d{d}" for d in fully]


def test_bad_eval_file_is_a_one_line_error(text_run, tmp_path, capsys):
    ckpt_dir = text_run[2]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "w2 w3"}\nnot json\n')
    assert main(["audit", "leak", ckpt_dir, "--eval", str(bad), "--field", "question"]) == 2
    assert "bad.jsonl line 2: not valid JSON" in capsys.readouterr().err


def test_byte_level_bpe_text_is_recovered_from_the_tokens(tmp_path):
    """The pipeline's tokenizer (byte-level BPE): text cut across rows decodes back, accents included."""
    from gristmill.pipeline.stages.tokenizer.config import TokenizerConfig
    from gristmill.pipeline.tokenization import load_tokenizer
    from gristmill.pipeline.stages.tokenizer.tasks import train_bpe

    rng = np.random.default_rng(1)
    vocab = ("the mill grinds grain into flour while the river turns its wheel and the café owner counts "
             "naïve sacks of wheat barley rye oats every morning before dawn").split()
    texts = [" ".join(rng.choice(vocab, size=rng.integers(15, 60))).capitalize() + "." for _ in range(30)]
    path = str(tmp_path / "bpe.json")
    cfg = TokenizerConfig(vocab_size=300)
    train_bpe(texts, cfg, path)
    tok, vocab_size, eos_id = load_tokenizer(path, cfg.eos_token)
    docs = [tok.encode(t).ids for t in texts]
    published, stream, doc_of = pack_dataset(str(tmp_path), docs, path, vocab_size, eos_id)
    rows = published.manifest.shards[0].rows
    ckpt = read_checkpoint(write_checkpoint_meta(str(tmp_path / "run"), published, step=rows // 4, global_batch=4,
                                                 world_size=1))
    used = consumed(published.manifest, ckpt)  # every row but the last few
    seen_rows = set(used.row.tolist())
    fully = [d for d in range(len(texts)) if set(np.flatnonzero(doc_of == d) // WIDTH) <= seen_rows]
    eval_file = write_eval(str(tmp_path / "eval.jsonl"), [(f"t{d}", texts[d].upper()) for d in fully])
    report = audit_leak(published, used, eval_file, fields=["question"], id_field="id")
    assert fully and report.summary["leaked_items"] == [f"t{d}" for d in fully]  # in eval-file order
    assert {(r["item"], r["doc_id"]) for r in report.matches.to_pylist()} >= {(f"t{d}", f"doc-{d}") for d in fully}


def test_n_defaults_to_the_datasets_decontamination_setting(tmp_path):
    published, docs, stream, doc_of = build_text_dataset(str(tmp_path), config={"decontaminate": {"n": 5}})
    ckpt = read_checkpoint(write_checkpoint_meta(str(tmp_path / "run"), published, step=8, global_batch=4, world_size=2))
    used = consumed(published.manifest, ckpt)
    in_seen = np.isin(np.arange(len(stream)) // WIDTH, used.row) & (stream != 0)
    d = next(d for d in range(len(docs)) if in_seen[(doc_of == d) & (stream != 0)].all() and len(docs[d]) >= 8)
    # 8 words the model saw inside 20 clean ones: no 13-gram of it was seen, but four 5-grams were.
    eval_file = write_eval(str(tmp_path / "eval.jsonl"), [("mixed", words(range(300, 306)) + " " + words(docs[d][:8])
                                                           + " " + words(range(310, 316)))])
    report = audit_leak(published, used, eval_file, fields=["question"])
    assert report.summary["n"] == 5 and report.matches.to_pylist()[0]["ngrams"] == 4
    assert audit_leak(published, used, eval_file, fields=["question"], n=13).summary["items_leaked"] == 0
