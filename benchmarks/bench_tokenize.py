"""Byte-level BPE encoders side by side, and their ids compared document by document (issue 43).

    .venv/bin/python benchmarks/bench_tokenize.py --corpus /tmp/gm-tp/200mb [--docs 100000] [--speed-mb 20]

Run it under the shared lock (it does not take it). On the documents of ``bench_throughput.py``'s corpus
(real prose; the corpus's own tokenizer.json, trained by gristmill's trainer, as its prepare uses):

* **ids**: ``--docs`` documents (files in sorted order) encoded by HF ``tokenizers`` and by the fast path
  (``pipeline.tokenization.load_tokenizer``'s tiktoken rank table), compared document by document, and
  the joined encoding the tokenize stage uses (documents joined by EOS) compared as a whole;
* **speed**: CPU seconds (``getrusage``, every thread) per GB of text on the first ``--speed-mb`` MB, one
  run each, side by side: HF ``encode_batch`` (its threads), HF ``encode_batch`` on one thread
  (``RAYON_NUM_THREADS=1`` is read at import, so that is a child process), tiktoken per document, tiktoken
  joined (the stage's path);
* **bpe-openai 0.1.4 beside tiktoken** on OpenAI's cl100k_base, the only kind of vocabulary its Rust
  backend takes (it has no constructor for a rank table of our own: ``bpe_openai.Encoding`` with custom
  ranks encodes in pure Python), the cl100k table read from bpe-openai's own data file.
"""
from __future__ import annotations

import argparse
import base64
import glob
import gzip
import io
import json
import os
import resource
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def read_docs(corpus: str, n: int) -> list[str]:
    import zstandard

    docs = []
    for path in sorted(glob.glob(os.path.join(corpus, "jsonl", "*.jsonl.*"))):
        with open(path, "rb") as f:
            raw = gzip.decompress(f.read()) if path.endswith(".gz") else zstandard.ZstdDecompressor().stream_reader(f).read()
        for line in io.StringIO(raw.decode("utf-8")):
            docs.append(json.loads(line)["text"])
            if len(docs) >= n:
                return docs
    return docs


def timed(fn, texts) -> tuple[float, object]:
    c0 = cpu()
    out = fn(texts)
    return cpu() - c0, out


def hf_one_thread(tokenizer: str, corpus: str, n: int) -> float:
    """CPU s of HF encode_batch on one rayon thread, in a child (the thread count is read at import)."""
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); import bench_tokenize as b; "
            f"from tokenizers import Tokenizer; t = Tokenizer.from_file({tokenizer!r}); d = b.read_docs({corpus!r}, {n}); "
            "print(b.timed(lambda x: t.encode_batch_fast(x, add_special_tokens=False), d)[0])")
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "true"}
    return float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)


def cl100k(bpe_openai) -> tuple[dict[bytes, int], str]:
    import bpe_openai.registry as reg

    path = os.path.join(os.path.dirname(bpe_openai.__file__), "data", "cl100k_base.tiktoken.gz")
    with gzip.open(path, "rt") as f:
        ranks = {base64.b64decode(tok): int(r) for tok, r in (line.split() for line in f if line.strip())}
    return ranks, reg.ENCODING_CONSTRUCTORS["cl100k_base"]()["pat_str"]


def main() -> None:
    import numpy as np
    import tiktoken
    from tokenizers import Tokenizer

    import bench_throughput as bt
    from gristmill.pipeline.tokenization import TIKTOKEN, choose_encoder, load_encoder

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--no-ids", action="store_true", help="speed only")
    ap.add_argument("--speed-mb", type=float, default=20.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    tok_path = bt.ensure_tokenizer(a.corpus)
    hf = Tokenizer.from_file(tok_path)
    assert choose_encoder(tok_path, "<|endoftext|>") == (TIKTOKEN, ""), "the corpus tokenizer must map onto tiktoken"
    fast, _, eos_id = load_encoder(tok_path, "<|endoftext|>", None, TIKTOKEN)
    docs = read_docs(a.corpus, a.docs)
    res = {"docs": len(docs), "mb": sum(len(d.encode()) for d in docs) / 1e6, "tokenizer": tok_path}

    # ids, document by document, then joined as the stage encodes them
    differ, batch = 0, 2000
    for i in range(0, 0 if a.no_ids else len(docs), batch):
        part = docs[i:i + batch]
        ours = fast.encode_batch(part)
        theirs = [e.ids for e in hf.encode_batch_fast(part, add_special_tokens=False)]
        differ += sum(x != y for x, y in zip(ours, theirs))
        joined = fast.encode_joined(part, "<|endoftext|>")
        want = np.array([t for ids in theirs for t in (*ids, eos_id)], np.uint32)
        differ += int(joined is None or not np.array_equal(joined, want))
    res["documents_differing"] = differ
    if not a.no_ids:
        print(f"ids: {len(docs):,} documents ({res['mb']:.1f} MB): {differ} differ (per document and joined)", flush=True)

    # speed on the first --speed-mb MB
    sample, size = [], 0
    for d in docs:
        if size >= a.speed_mb * 1e6:
            break
        sample.append(d)
        size += len(d.encode())
    gb = size / 1e9
    speed = {}
    speed["hf encode_batch (threads)"] = timed(lambda x: hf.encode_batch_fast(x, add_special_tokens=False), sample)[0]
    speed["hf encode_batch (1 thread)"] = hf_one_thread(tok_path, a.corpus, len(sample))
    speed["tiktoken per document"] = timed(fast.encode_batch, sample)[0]
    speed["tiktoken joined (the stage)"] = timed(lambda x: [fast.encode_joined(x[i:i + 1000], "<|endoftext|>")
                                                            for i in range(0, len(x), 1000)], sample)[0]
    try:
        import bpe_openai
        import bpe_openai._bindings

        ranks, pat = cl100k(bpe_openai)
        tk = tiktoken.Encoding("cl100k", pat_str=pat, mergeable_ranks=ranks, special_tokens={})
        # its Rust tokenizer itself: the Python wrapper refuses a text of over 200,000 tokens
        bo = bpe_openai._bindings.tokenizer_for_encoding("cl100k_base")
        speed["cl100k: tiktoken"] = timed(lambda x: [tk.encode_ordinary(t) for t in x], sample)[0]
        speed["cl100k: bpe-openai"] = timed(lambda x: [bo.encode(t) for t in x], sample)[0]
        same = all(tk.encode_ordinary(t) == list(bo.encode(t)) for t in sample[:2000])
        res["cl100k_same_ids_first_2000"] = same
    except ImportError:
        pass
    base = speed["hf encode_batch (threads)"]
    print(f"speed on {size / 1e6:.1f} MB, {len(sample):,} documents (core-s per GB; x = HF threads / this):")
    for k, v in speed.items():
        print(f"  {k:32s} {v / gb:8.1f}  {base / v:5.2f}x")
    res["core_s_per_gb"] = {k: v / gb for k, v in speed.items()}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
