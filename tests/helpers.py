"""Small builders shared by tests: a tokenizer and a token dataset written through the real format."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa

from gristmill.manifests import DatasetBuilder, Input, ManifestStore, Published


def write_tokenizer(path: str, vocab_size: int = 512) -> str:
    """A tiny word-level tokenizer.json that `tokenizers` can load (no training needed)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<eos>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(path)
    return path


def build_dataset(
    root: str,
    *,
    dataset: str = "toy",
    seq_len: int = 16,
    shard_rows: tuple[int, ...] = (40, 30, 50),
    val_rows: tuple[int, ...] = (8,),
    vocab_size: int = 512,
    seed: int = 0,
    publish: bool = True,
) -> Published:
    """Write and publish a dataset whose row r of shard s starts with a marker token pattern.

    Token values are random but every row is distinct, and the doc index maps each row to one
    document ``doc-<shard>-<row>``, so tests can check exactly which rows were served.
    """
    rng = np.random.default_rng(seed)
    os.makedirs(root, exist_ok=True)
    staging = os.path.join(root, f".staging-{dataset}-{seed}")
    tok = write_tokenizer(os.path.join(root, f"tokenizer-{vocab_size}.json"), vocab_size)
    b = DatasetBuilder(staging, dataset=dataset, seq_len=seq_len, tokenizer_json=tok, vocab_size=vocab_size, eos_id=0)
    doc = {k: [] for k in ("shard", "row", "start", "length", "doc_id", "source", "position", "lang")}
    for split, sizes in (("train", shard_rows), ("validation", val_rows)):
        for n in sizes:
            rows = rng.integers(1, vocab_size, size=(n, seq_len + 1), dtype=np.int64)
            shard_id = len(b.shards)
            rows[:, 0] = shard_id + 1  # first token names the shard, second the row: rows are distinct
            rows[:, 1] = np.arange(n) % vocab_size
            b.add_shard(split, rows)
            for r in range(n):
                for k, v in zip(doc, (shard_id, r, 0, seq_len + 1, f"doc-{shard_id}-{r}", f"mem://src/{shard_id}.jsonl", r, "en")):
                    doc[k].append(v)
    b.set_doc_index(pa.table(doc))
    m = b.manifest(inputs=[Input("mem://src/0.jsonl", 1, "0" * 64)], config={"test": True, "seed": seed},
                   code_version="test", stats={"pack": {"rows": sum(shard_rows)}})
    if not publish:
        return Published(m, staging)
    return ManifestStore(os.path.join(root, "store")).publish(m, staging)


def flip_byte(path: str, offset: int | None = None) -> None:
    size = os.path.getsize(path)
    offset = size // 2 if offset is None else offset
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def load_json(path: str):
    with open(path) as f:
        return json.load(f)


def extract_files(work_root: str, files: list[tuple[str, str]], *, text_field: str = "text", id_field: str | None = None,
                  batch_rows: int = 64, language: bool = False):
    """Run the extract task that `prepare` runs, on one partition of ``files`` ([(path, format)]),
    in this process (no Ray). Returns (stats, kept document rows, quarantine rows)."""
    import pyarrow.parquet as pq

    from gristmill.pipeline.config import ExtractConfig, LanguageConfig
    from gristmill.pipeline.extract import extract_partition
    from gristmill.pipeline.workdir import WorkDir, part_name

    task = {"part": 0, "files": [{"uri": p, "format": fmt, "text_field": text_field, "id_field": id_field,
                                  "rel": os.path.basename(p)} for p, fmt in files]}
    stats = extract_partition(task, ExtractConfig(), LanguageConfig(enabled=language), work_root, batch_rows)
    wd = WorkDir(work_root)
    docs = pq.read_table(wd.path("docs", f"{part_name(0)}.parquet")).to_pylist()
    quarantine = pq.read_table(wd.path("quarantine", f"{part_name(0)}.parquet")).to_pylist()
    return stats, docs, quarantine
