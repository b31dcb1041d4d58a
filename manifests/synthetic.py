"""Synthetic token datasets written through the real format (``DatasetBuilder`` + ``ManifestStore``).

The one builder of throwaway datasets for tests, benchmarks, ``gristmill loader bench
--synthetic`` and deploy/gpu-benchmark.sh. Everything is vectorised (a million rows build in
seconds) and deterministic in ``seed``.

Row content (``tokens``):

- ``"random"``: uniform in ``[1, vocab_size)`` (throughput: a step costs the same whatever the tokens are);
- ``"marked"``: random, but the first token is ``shard + 1`` and the second ``row % vocab_size``, so the
  tokens of a served sample say which row it is (tests check rows against content, not against the order);
- ``"counting"``: each row counts up by 1 or 2 from a random start (a tiny model learns it in a few steps).

``poison=((shard, row, token), ...)`` overwrites those rows with one token repeated: a planted
"poison" document that a model trained on the rest finds very surprising (a loss spike, tests/test_spikes_train.py).

Documents (the doc index): by default one per row, ``doc-<shard>-<row>`` from source
``source_uri(shard)`` at position ``row``. With ``doc_tokens=(lo, hi)`` documents of ``lo..hi``
tokens are laid end to end over each split and cut at row boundaries, as the pipeline packs
them: ``doc-<d>`` from ``source_uri(d % sources)`` at position ``d // sources``, language
``langs[d % len(langs)]``.
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow as pa

from .builder import DatasetBuilder
from .doc_index import DOC_INDEX_SCHEMA
from .manifest import Input
from .store import ManifestStore, Published

TOKENS = ("random", "marked", "counting")


def source_uri(i: int) -> str:
    """The input file a synthetic document comes from (two directories, so by-source groups differ)."""
    return f"mem://{'web' if i % 2 else 'books'}/{i}.jsonl"


def even_shards(rows: int, per_shard: int) -> tuple[int, ...]:
    """Shard sizes for ``rows`` rows in shards of ``per_shard`` (the last one shorter): a ``shard_rows`` argument."""
    full, rest = divmod(rows, per_shard)
    return (per_shard,) * full + ((rest,) if rest else ())


def write_tokenizer(path: str, vocab_size: int = 512) -> str:
    """A word-level tokenizer.json (``<eos>``=0, ``<unk>``=1, ``w2``..``w<V-1>``): loads in `tokenizers`
    without training and decodes every token id, so text-level checks (the audit's leak scan) work."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<eos>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(path)
    return path


def _rows(rng: np.random.Generator, tokens: str, n: int, width: int, vocab_size: int, shard: int) -> np.ndarray:
    if tokens == "counting":
        start, stride = rng.integers(1, vocab_size, size=(n, 1)), rng.integers(1, 3, size=(n, 1))
        return (start + stride * np.arange(width)) % (vocab_size - 1) + 1
    rows = rng.integers(1, vocab_size, size=(n, width), dtype=np.int64)
    if tokens == "marked":
        rows[:, 0] = shard + 1
        rows[:, 1] = np.arange(n) % vocab_size
    return rows


def _one_doc_per_row(shard_ids: list[int], sizes: list[int], width: int, lang: str) -> dict:
    shard = np.repeat(np.array(shard_ids, dtype=np.int32), sizes)
    row = np.concatenate([np.arange(n, dtype=np.int64) for n in sizes])
    return {"shard": shard, "row": row, "start": np.zeros(len(row), np.int32),
            "length": np.full(len(row), width, np.int32),
            "doc_id": [f"doc-{s}-{r}" for s, r in zip(shard.tolist(), row.tolist())],
            "source": [source_uri(s) for s in shard.tolist()], "position": row, "lang": [lang] * len(row)}


def _packed_docs(rng: np.random.Generator, shard_ids: list[int], sizes: list[int], width: int,
                 doc_tokens: tuple[int, int], first_doc: int, sources: int, langs: tuple[str, ...]) -> tuple[dict, int]:
    """Documents of doc_tokens[0]..doc_tokens[1] tokens laid end to end over one split's rows,
    split at row boundaries into spans (one doc-index row per span)."""
    lo, hi = doc_tokens
    total = sum(sizes) * width
    lengths = rng.integers(lo, hi + 1, size=total // lo + 1)
    ends = np.cumsum(lengths)
    lengths = lengths[ends <= total]
    covered = int(lengths.sum())
    if covered < total:  # the last document takes the rest
        lengths = np.append(lengths, total - covered)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    first_row, last_row = starts // width, (starts + lengths - 1) // width
    n_spans = last_row - first_row + 1
    doc = np.repeat(np.arange(len(lengths)), n_spans)
    span_row = np.repeat(first_row, n_spans) + (np.arange(n_spans.sum()) - np.repeat(np.cumsum(n_spans) - n_spans, n_spans))
    span_start = np.maximum(starts[doc], span_row * width)
    span_end = np.minimum(starts[doc] + lengths[doc], (span_row + 1) * width)
    bounds = np.cumsum([0] + sizes)  # the split's rows, shard by shard
    local = np.searchsorted(bounds, span_row, side="right") - 1
    gdoc = doc + first_doc
    src = np.array([source_uri(i) for i in range(sources)], dtype=object)
    lang = np.array(langs, dtype=object)
    table = {"shard": np.array(shard_ids, dtype=np.int32)[local], "row": span_row - bounds[local],
             "start": (span_start - span_row * width).astype(np.int32), "length": (span_end - span_start).astype(np.int32),
             "doc_id": pa.array([f"doc-{d}" for d in gdoc.tolist()]), "source": pa.array(src[gdoc % sources]),
             "position": gdoc // sources, "lang": pa.array(lang[gdoc % len(langs)])}
    return table, first_doc + len(lengths)


def _eos_at_document_ends(rows: list[np.ndarray], ids: list[int], table: dict, eos_id: int = 0) -> None:
    """EOS as each document's last token, as the pipeline packs (docs/format.md: documents are
    concatenated with EOS after each); `manifest verify` checks the document index against it."""
    doc = np.asarray(table["doc_id"].to_pylist(), dtype=object)
    last = np.append(doc[1:] != doc[:-1], True)  # the last span of each document
    shard = np.asarray(table["shard"])[last]
    row, end = np.asarray(table["row"])[last], (np.asarray(table["start"]) + np.asarray(table["length"]))[last] - 1
    for k, i in enumerate(ids):
        here = shard == i
        rows[k][row[here], end[here]] = eos_id


def build_synthetic(root: str, *, dataset: str = "synthetic", seq_len: int = 16,
                    shard_rows: tuple[int, ...] = (40, 30, 50), val_rows: tuple[int, ...] = (8,),
                    vocab_size: int = 512, seed: int = 0, tokens: str = "marked",
                    doc_tokens: tuple[int, int] | None = None, sources: int = 1, langs: tuple[str, ...] = ("en",),
                    publish: bool = True, stats: dict | None = None,
                    poison: tuple[tuple[int, int, int], ...] = ()) -> Published:
    """Write a dataset under ``root`` and publish it to ``<root>/store/<dataset>`` (the new version).

    ``shard_rows`` / ``val_rows``: rows of each train / validation shard. With ``publish=False``
    the staged dataset is returned (its ``url`` is the staging directory) for callers that
    publish it themselves; otherwise the staging directory is removed after publishing.
    """
    if tokens not in TOKENS:
        raise ValueError(f"tokens must be one of {', '.join(TOKENS)}, got {tokens!r}")
    rng = np.random.default_rng(seed)
    width = seq_len + 1
    os.makedirs(root, exist_ok=True)
    staging = os.path.join(root, f".staging-{dataset}-{seed}")
    shutil.rmtree(staging, ignore_errors=True)
    tok = write_tokenizer(os.path.join(root, f"tokenizer-{vocab_size}.json"), vocab_size)
    b = DatasetBuilder(staging, dataset=dataset, seq_len=seq_len, tokenizer_json=tok, vocab_size=vocab_size, eos_id=0)
    parts, next_doc = [], 0
    for split, sizes in (("train", shard_rows), ("validation", val_rows)):
        ids = list(range(len(b.shards), len(b.shards) + len(sizes)))
        rows = [_rows(rng, tokens, n, width, vocab_size, i) for i, n in zip(ids, sizes)]
        for shard, row, token in poison:
            if shard in ids:
                rows[ids.index(shard)][row, :] = token
        if sizes and doc_tokens is None:
            parts.append(_one_doc_per_row(ids, list(sizes), width, langs[0]))
        elif sizes:
            table, next_doc = _packed_docs(rng, ids, list(sizes), width, doc_tokens, next_doc, sources, langs)
            _eos_at_document_ends(rows, ids, table)
            parts.append(table)
        for r in rows:
            b.add_shard(split, r)
    b.set_doc_index(pa.concat_tables([pa.table(p, schema=pa.schema([f for f in DOC_INDEX_SCHEMA if f.name in p]))
                                   for p in parts]))  # no url column: the writer adds it (null)
    n_sources = sources if doc_tokens is not None else len(b.shards)
    config = {"synthetic": {"tokens": tokens, "seed": seed, "shard_rows": list(shard_rows), "val_rows": list(val_rows),
                            "doc_tokens": list(doc_tokens) if doc_tokens else None,
                            **({"poison": [list(p) for p in poison]} if poison else {})}}
    m = b.manifest(inputs=[Input(source_uri(i), 1, "0" * 64) for i in range(n_sources)], config=config,
                   code_version="synthetic", stats=stats if stats is not None else {"pack": {"rows": sum(shard_rows)}})
    if not publish:
        return Published(m, staging)
    published = ManifestStore(os.path.join(root, "store")).publish(m, staging)
    shutil.rmtree(staging)
    return published
