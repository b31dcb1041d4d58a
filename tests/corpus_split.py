"""One fixed English corpus written as F equal-sized JSONL files, for partition-scaling tests and
benchmarks (tests/test_partition_scaling.py, benchmarks/bench_partitions.py).

The documents are the same for every seed-and-size: each is a run of paragraphs of Python's own
documentation (``pipeline.demo_corpus.stdlib_paragraphs``) drawn with a fixed-seed RNG. Planted:
exact duplicates (a copy of an earlier document, some with changed case and spacing) and near
duplicates (a copy with one word in ``NEAR_EVERY`` replaced: word-5-gram Jaccard ~0.88, above
fuzzy dedup's 0.8). Every file holds ``docs // files`` documents and is padded (an extra JSON
field on its last line, which the reader ignores) to the same byte size, so ``partitioning.partition_bytes
= k * file_bytes`` groups the files into exactly ``files / k`` partitions: the inputs, the document
ids and hence the manifest stay the same, only the partitioning changes.
"""
from __future__ import annotations

import json
import os
import random

NEAR_EVERY = 80  # one replaced word in this many: J(5-grams) ~ (1 - 5/80) / (1 + 5/80) = 0.88
EXACT_FRACTION, NEAR_FRACTION = 0.05, 0.05


def make_documents(n: int, paragraphs_per_doc: int, seed: int = 23) -> tuple[list[str], dict]:
    """``n`` texts in order, and what was planted: {"exact": [(i, j)], "near": [(i, j)]} with j a copy of i."""
    from gristmill.pipeline.demo_corpus import stdlib_paragraphs

    paras = stdlib_paragraphs()
    rng = random.Random(seed)
    docs: list[str] = []
    truth: dict[str, list] = {"exact": [], "near": []}
    for j in range(n):
        roll = rng.random()
        if j >= 10 and roll < EXACT_FRACTION:
            i = rng.randrange(j)
            text = docs[i] if rng.random() < 0.5 else "  " + docs[i].upper() + " "  # exact dedup normalises case/space
            truth["exact"].append((i, j))
        elif j >= 10 and roll < EXACT_FRACTION + NEAR_FRACTION:
            i = rng.randrange(j)
            words = docs[i].split(" ")
            for k in range(rng.randrange(NEAR_EVERY), len(words), NEAR_EVERY):
                words[k] = f"millstone{j}"
            text = " ".join(words)
            truth["near"].append((i, j))
        else:
            text = "\n\n".join(rng.choice(paras) for _ in range(paragraphs_per_doc))
        docs.append(text)
    return docs, truth


def write_split_corpus(root: str, *, files: int, docs_per_file: int, paragraphs_per_doc: int, seed: int = 23) -> dict:
    """Write ``files`` JSONL files of ``docs_per_file`` documents under ``root``, all the same size.

    Returns {"files", "file_bytes", "docs", "text_bytes", "truth"}; ids in truth are the pipeline's
    (``<file name>:<position>``).
    """
    os.makedirs(root, exist_ok=True)
    docs, truth = make_documents(files * docs_per_file, paragraphs_per_doc, seed)
    bodies = []
    for f in range(files):
        lines = [json.dumps({"text": t}) for t in docs[f * docs_per_file:(f + 1) * docs_per_file]]
        bodies.append(lines)
    size = max(sum(len(line.encode()) + 1 for line in lines) for lines in bodies) + len(', "pad": ""')
    for f, lines in enumerate(bodies):
        last = json.loads(lines[-1])
        base = sum(len(line.encode()) + 1 for line in lines[:-1])
        last["pad"] = ""
        need = size - base - len(json.dumps(last).encode()) - 1
        last["pad"] = " " * need
        lines[-1] = json.dumps(last)
        data = ("\n".join(lines) + "\n").encode()
        assert len(data) == size, (len(data), size)
        with open(os.path.join(root, name(f)), "wb") as out:
            out.write(data)

    def doc_id(j: int) -> str:
        return f"{name(j // docs_per_file)}:{j % docs_per_file}"

    return {"files": files, "file_bytes": size, "docs": len(docs), "text_bytes": sum(len(t.encode()) for t in docs),
            "truth": {k: [(doc_id(i), doc_id(j)) for i, j in v] for k, v in truth.items()}}


def name(f: int) -> str:
    return f"f-{f:05d}.jsonl"
