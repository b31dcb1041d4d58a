"""The tokenize stage's task: a partition's surviving documents encoded with the tokenizer the
tokenizer stage handed on, by the encoder it chose (``pipeline.tokenization.load_encoder``: tiktoken
where the file maps onto its rank table exactly, else HF ``tokenizers``; the same ids either way), split
into train and validation.

Documents are encoded without the tokenizer's own special-token template; one EOS follows every document.
"""
from __future__ import annotations

import itertools
import resource
import time

import numpy as np
import pyarrow as pa

from gristmill.manifests.storage import Store

from ...documents import split_of
from ...survivors import Survivors
from ...tokenization import TOKENIZERS, load_encoder
from ...tokenizer_config import TokenizerConfig
from .config import SplitConfig

STAGE = "tokenize"
TOKENS_SCHEMA = pa.schema([
    ("id", pa.string()), ("order", pa.int64()), ("source", pa.string()), ("position", pa.int64()), ("lang", pa.string()),
    ("split", pa.string()), ("tokens", pa.list_(pa.uint32())), ("url", pa.string()),
])


def tokenize_partition(part: int, tokenizer_path: str, cfg: TokenizerConfig, split: SplitConfig,
                       survivors: Survivors, tokenizer_store: Store | None = None, encoder: str = TOKENIZERS) -> dict:
    """Partition ``part``'s surviving documents (rewritten texts applied) as token ids with EOS:
    its rows of ``tokens/block-B.parquet``; returns its counts by split."""
    wd = survivors.wd
    cpu0 = time.process_time()
    tok, _, eos_id = load_encoder(tokenizer_path, cfg.eos_token, tokenizer_store, encoder)
    drop = survivors.removed_ids(part)
    new_text = survivors.overridden_texts(part)
    # lz4: token ids barely compress, and zstd here cost ~5% of the stage
    out = wd.part(wd.tokens(part), TOKENS_SCHEMA, compression="lz4")
    st = {"documents_in": 0, "bytes_in": 0, "documents_out": 0, "tokens_out": 0, "seconds": 0.0,
          "splits": {s: {"documents": 0, "tokens": 0} for s in ("train", "validation")}}
    cols = ["id", "order", "source", "position", "lang", "bytes", "text", "url"]
    for batch in wd.iter_batches(wd.docs(part), cols, cfg.batch_size):
        table = pa.Table.from_batches([batch])
        if drop:
            ids = table.column("id").to_pylist()
            table = table.filter(pa.array([i not in drop for i in ids], pa.bool_()))
        if not table.num_rows:
            continue
        t0 = time.perf_counter()
        texts = table.column("text").to_pylist()
        if new_text:
            texts = [new_text.get(i, t) for i, t in zip(table.column("id").to_pylist(), texts)]
        flat, offsets = encode_with_eos(tok, texts, eos_id, cfg.eos_token)
        ids = table.column("id").to_pylist()
        splits = [split_of(i, split) for i in ids]
        st["seconds"] += time.perf_counter() - t0
        lengths = np.diff(offsets)
        st["documents_in"] += table.num_rows
        st["bytes_in"] += sum(len(t.encode()) for t in texts) if new_text else pc_sum(table.column("bytes"))
        for s, n in zip(splits, lengths.tolist()):
            st["splits"][s]["documents"] += 1
            st["splits"][s]["tokens"] += n
        st["documents_out"] += table.num_rows
        st["tokens_out"] += int(len(flat))
        tok_col = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.uint32()))
        out.write(table.drop_columns(["text", "bytes", "url"]).append_column("split", pa.array(splits))
                  .append_column("tokens", tok_col).append_column("url", table.column("url")))
    out.commit()
    st["cpu_seconds"] = time.process_time() - cpu0  # the whole task, the tokenizer's threads included
    st["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return st


def encode_with_eos(tok, texts: list[str], eos_id: int, eos_token: str) -> tuple[np.ndarray, np.ndarray]:
    """All documents' token ids with EOS after each, flat, and the offsets of each document."""
    flat = tok.encode_joined(texts, eos_token)  # one call, no list per document (tiktoken)
    if flat is not None:
        ends = np.flatnonzero(flat == eos_id) + 1
        if len(ends) == len(texts):  # else a document holds an EOS of its own: one by one
            return flat, np.concatenate([[0], ends]).astype(np.int32)
    ids = tok.encode_batch(texts)
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.uint32, count=int(lengths.sum()))
    flat = np.insert(flat, np.cumsum(lengths), np.uint32(eos_id))
    offsets = np.concatenate([[0], np.cumsum(lengths + 1)]).astype(np.int32)
    return flat, offsets


def pc_sum(column) -> int:
    import pyarrow.compute as pc

    return int(pc.sum(column).as_py() or 0)
