"""Tokens per source, per input file and per document (from the document index the manifest
pins), shard sizes, and the hash chain inputs -> shards -> manifest with the commands that check it."""
from __future__ import annotations

import html
import shlex

import numpy as np
import pyarrow.compute as pc

from gristmill.manifests import Published
from gristmill.manifests.storage import split_url

from .hist import LOG_EDGES, Histogram, shown
from .page import Figure, Html, Note, Page, Table, plot

TOP = 30



def _grouped(table, key: str) -> list[tuple[str, int, int]]:
    """(key, documents, tokens) per value of ``key``, most tokens first."""
    g = table.group_by(key, use_threads=False).aggregate([("doc_id", "count_distinct"), ("length", "sum")])
    rows = [(str(r[key]) if r[key] is not None else "unknown", int(r["doc_id_count_distinct"]), int(r["length_sum"]))
            for r in g.to_pylist()]
    return sorted(rows, key=lambda r: (-r[2], r[0]))


def tokens_section(page: Page, published: Published) -> None:
    from gristmill.audit.seen import read_spans, source_of  # the audit's own reader and source mapping

    m = published.manifest
    sec = page.section("tokens", "Tokens")
    spans = read_spans(published, columns=["shard", "doc_id", "source", "length", "lang"])
    if spans.num_rows == 0:
        sec.add(Note("The document index is empty.", missing=True))
        return
    split_of_shard = np.array([1 if s.split == "validation" else 0 for s in m.shards], np.int8)
    train = spans.filter(pc.equal(pc.take(split_of_shard, spans.column("shard")), 0)) if len(m.shards) else spans
    files = _grouped(spans, "source")
    per_source: dict[str, list[int]] = {}
    for uri, docs, n in files:
        e = per_source.setdefault(source_of(uri, m.config), [0, 0])
        e[0] += docs
        e[1] += n
    sources = sorted(per_source.items(), key=lambda kv: (-kv[1][1], kv[0]))
    sec.add(Figure("tokens_per_source", "Tokens per source (the job's inputs[].path)",
                   lambda: plot().bars([k for k, _ in sources[:TOP]], {"tokens": [v[1] for _, v in sources[:TOP]]},
                                       xlabel="tokens"),
                   Table(["source", "documents", "tokens"], [[k, v[0], v[1]] for k, v in sources])),
            Figure("tokens_per_file", f"Tokens per input file{f' (the {TOP} largest)' if len(files) > TOP else ''}",
                   lambda: plot().bars([f[0].rsplit("/", 1)[-1] for f in files[:TOP]], {"tokens": [f[2] for f in files[:TOP]]},
                                       xlabel="tokens"),
                   Table(["input file", "documents", "tokens"], [list(f) for f in files])))
    langs = _grouped(spans, "lang")
    sec.add(Figure("tokens_per_language", "Tokens per language",
                   lambda: plot().bars([k for k, *_ in langs[:TOP]], {"tokens": [n for *_, n in langs[:TOP]]}, xlabel="tokens"),
                   Table(["language", "documents", "tokens"], [list(x) for x in langs])))
    per_doc = Histogram(LOG_EDGES).add(
        spans.group_by("doc_id", use_threads=False).aggregate([("length", "sum")]).column("length_sum").to_numpy())
    edges, (counts,) = shown(per_doc)
    sec.add(Figure("tokens_per_document", "Tokens per document (EOS included)",
                   lambda: plot().histogram({"documents": counts}, edges=edges, xlabel="tokens (log scale)", log_x=True),
                   Table(["tokens from", "documents"], [[int(edges[i]), int(c)] for i, c in enumerate(counts) if c]),
                   caption=f"{per_doc.n:,} documents, mean {per_doc.mean:,.0f} tokens; "
                           f"{train.num_rows:,} of {spans.num_rows:,} spans in train shards"))
    shards = list(m.shards)
    sec.add(Figure("shard_sizes", "Shard sizes (compressed bytes as published)",
                   lambda: plot().bars([s.path.rsplit("/", 1)[-1] for s in shards],
                                       {split: [s.bytes if s.split == split else 0 for s in shards]
                                        for split in ("train", "validation") if any(x.split == split for x in shards)},
                                       xlabel="bytes"),
                   Table(["shard", "split", "rows", "tokens", "bytes", "raw bytes"],
                         [[s.path, s.split, s.rows, s.tokens, s.bytes, s.raw_bytes] for s in shards])))


def chain_section(page: Page, published: Published) -> None:
    m = published.manifest
    sec = page.section("chain", "Hash chain")
    url = shlex.quote(published.url)
    boxes = [f"<div>{len(m.inputs):,} input files<br><small>sha256 of each file's bytes</small></div>",
             "<div>&rarr;</div>",
             f"<div>{len(m.shards):,} token shards + document index + tokenizer<br><small>sha256 of each file "
             f"(and of each shard's uncompressed form)</small></div>", "<div>&rarr;</div>",
             f"<div>manifest.json<br><small>sha256 <code>{m.sha256}</code> of its canonical JSON, which lists "
             f"every hash to its left, the job config and the stats</small></div>"]
    cmds = [f"gristmill manifest verify {url} --sha256 {m.sha256}",
            f"gristmill manifest show {url} --json",
            "sha256sum " + " ".join(shlex.quote(split_url(i.uri)[1]) for i in m.inputs[:3])
            + (" ..." if len(m.inputs) > 3 else "")]
    sec.add(Html(f'<div class="chain">{"".join(boxes)}</div><p>Check it:</p><pre>'
                 + html.escape("\n".join(cmds)) + "</pre>",
                 "inputs -> shards -> manifest " + m.sha256 + "\n" + "\n".join(cmds)),
            Note("verify re-hashes every shard, the document index and the tokenizer against the manifest and checks "
                 "their row counts, schemas and token ids; --sha256 also pins the manifest itself. The inputs' "
                 "hashes are compared with sha256sum against the table below."),
            Table(["input file", "bytes", "sha256"], [[i.uri, i.bytes, i.sha256] for i in m.inputs]),
            Table(["pinned file", "bytes", "sha256"],
                  [[m.tokenizer.path, None, m.tokenizer.sha256], [m.doc_index.path, m.doc_index.bytes, m.doc_index.sha256]]
                  + [[s.path, s.bytes, s.sha256] for s in m.shards]))
