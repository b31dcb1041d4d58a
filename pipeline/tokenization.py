"""Tokenize with Hugging Face ``tokenizers``: a user tokenizer.json or a BPE trained here.

Training is deterministic: byte-level BPE on the first documents in global ``order`` up to
``sample_bytes`` (after filtering and dedup), a fixed vocabulary size, and the trainer's
deterministic merge order (ties broken by the pair itself). Documents are encoded without the
tokenizer's own special-token template; one EOS follows every document.
"""
from __future__ import annotations

import functools
import itertools
import resource
import time

import numpy as np
import pyarrow as pa

from .config import SplitConfig, TokenizerConfig
from .documents import split_of
from .survivors import Survivors
from gristmill.errors import GristmillError
from gristmill.manifests.storage import Store

STAGE = "tokenize"
TOKENS_SCHEMA = pa.schema([
    ("id", pa.string()), ("order", pa.int64()), ("source", pa.string()), ("position", pa.int64()), ("lang", pa.string()),
    ("split", pa.string()), ("tokens", pa.list_(pa.uint32())), ("url", pa.string()),
])


class TokenizerError(GristmillError):
    pass


def train_bpe(texts, cfg: TokenizerConfig, out_path: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=cfg.vocab_size, special_tokens=[cfg.eos_token], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(out_path)


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str, eos_token: str, store: Store | None = None):
    """(tokenizer, vocab_size, eos_id) of ``path`` of ``store`` (None: the store of ``path``); the EOS
    token must be in the vocabulary.

    Cached per worker process: a worker tokenizes many partitions with the same file.
    """
    from tokenizers import Tokenizer

    try:
        store = store or Store.from_url(path)
        if store.is_local:
            tok = Tokenizer.from_file(store.path(path))
        else:  # a work dir or tokenizer on an object store
            tok = Tokenizer.from_str(store.read(path).decode("utf-8"))
    except Exception as e:
        raise TokenizerError(f"tokenizer.path: {path} is not a tokenizers tokenizer.json: {e}") from e
    eos_id = tok.token_to_id(eos_token)
    if eos_id is None:
        raise TokenizerError(f"tokenizer.eos_token: {eos_token!r} is not in the vocabulary of {path}; set eos_token to its EOS")
    return tok, tok.get_vocab_size(with_added_tokens=True), eos_id


def tokenize_partition(part: int, tokenizer_path: str, cfg: TokenizerConfig, split: SplitConfig,
                       survivors: Survivors, tokenizer_store: Store | None = None) -> dict:
    """Partition ``part``'s surviving documents (rewritten texts applied) as token ids with EOS:
    its rows of ``tokens/block-B.parquet``; returns its counts by split."""
    wd = survivors.wd
    cpu0 = time.process_time()
    tok, _, eos_id = load_tokenizer(tokenizer_path, cfg.eos_token, tokenizer_store)
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
        flat, offsets = encode_with_eos(tok, texts, eos_id)
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


def encode_with_eos(tok, texts: list[str], eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """All documents' token ids with EOS after each, flat, and the offsets of each document."""
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no character offsets: we do not use them
    ids = [e.ids for e in encode(texts, add_special_tokens=False)]
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.uint32, count=int(lengths.sum()))
    flat = np.insert(flat, np.cumsum(lengths), np.uint32(eos_id))
    offsets = np.concatenate([[0], np.cumsum(lengths + 1)]).astype(np.int32)
    return flat, offsets


def pc_sum(column) -> int:
    import pyarrow.compute as pc

    return int(pc.sum(column).as_py() or 0)
