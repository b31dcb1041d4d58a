"""Small helpers shared by tests. Datasets come from the project's one synthetic builder
(gristmill.manifests.synthetic); checkpoint metadata from the trainer's schema (gristmill.trainer.meta)."""
from __future__ import annotations

import collections
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import warnings

from gristmill.manifests.synthetic import build_synthetic, write_tokenizer  # noqa: F401  (re-exported for tests)


def build_dataset(root: str, **options):
    """The tests' toy dataset: ``build_synthetic``'s marked rows (row r of shard s starts with s + 1, r;
    one document ``doc-<s>-<r>`` per row), published as dataset "toy"."""
    return build_synthetic(root, **{"dataset": "toy", **options})


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


def write_checkpoint_meta(run_dir: str, published, *, step: int, seed: int = 3, order: str = "global",
                          global_batch: int = 8, world_size: int = 2, **extra) -> str:
    """A checkpoint's meta.json through the trainer's schema (trainer/meta.py), minus the weights.
    ``extra`` overrides fields before sealing: ``loader__seed=4`` sets meta["loader"]["seed"]."""
    from gristmill.trainer.meta import new_meta, write_meta

    ckpt = os.path.join(run_dir, "checkpoints", f"step-{step}")
    os.makedirs(ckpt, exist_ok=True)
    m = published.manifest
    meta = new_meta(step=step, world_size=world_size, global_batch=global_batch, seq_len=m.seq_len,
                    loader={"next_index": step * global_batch, "seed": seed, "order": order, "manifest_sha256": m.sha256},
                    manifest_sha256=m.sha256, manifest_url=published.url,
                    job={"data": {"seed": seed, "order": order, "global_batch": global_batch}})
    for key, value in extra.items():
        *path, last = key.split("__")
        d = meta
        for p in path:
            d = d[p]
        d[last] = value
    write_meta(ckpt, meta)
    return ckpt


def write_dcp_checkpoint(ckpt_dir: str, state: dict | None = None) -> dict:
    """Turn a meta-only checkpoint into a complete one without a process group: DCP files holding
    ``state`` plus the data-position copy, as the trainer saves it, and meta.json's file list."""
    import torch
    import torch.distributed.checkpoint as dcp

    from gristmill.trainer.checkpoint import file_checksums
    from gristmill.trainer.meta import DCP_KEY, encode_data_position, read_meta, write_meta

    meta = read_meta(ckpt_dir)
    position = torch.frombuffer(bytearray(encode_data_position(meta)), dtype=torch.uint8)
    with warnings.catch_warnings():  # DCP warns that no process group means a single-process save: intended
        warnings.simplefilter("ignore", UserWarning)
        trainer_states = {  # what trainer.checkpoint.STATES names, the loader and step as meta.json records them
            "model": {"weight": torch.arange(4.0)}, "optimizer": {"state": {"weight": {"step": torch.tensor(1.0)}}},
            "scheduler": {"kind": "warmup_cosine", "last_step": meta["step"]}, "loader": dict(meta["loader"]),
            "train_state": {"step": meta["step"], "tokens_seen": meta["tokens_seen"], "skipped_total": 0,
                            "consecutive_bad": 0}}
        dcp.save({**trainer_states, **(state or {}), DCP_KEY: position}, checkpoint_id=ckpt_dir, no_dist=True)
    return write_meta(ckpt_dir, {**meta, "files": file_checksums(ckpt_dir)})


def reseal_meta(ckpt_dir: str, edit, *, files: bool = False) -> dict:
    """Apply ``edit(meta)`` to a checkpoint's meta.json and write it back with a fresh self-hash
    (and, with ``files``, fresh file checksums): what a careful forger would do."""
    from gristmill.trainer.checkpoint import file_checksums
    from gristmill.trainer.meta import META_FILE, write_meta

    meta = load_json(os.path.join(ckpt_dir, META_FILE))
    edit(meta)
    if files:
        meta["files"] = file_checksums(ckpt_dir)
    return write_meta(ckpt_dir, meta)


def kill_at_marker(proc, marker: str, what: str, timeout_s: float = 240) -> None:
    """Wait until the fault launcher's ``proc`` (started in a new session) writes ``marker`` (tests/fault_launcher.py),
    then SIGKILL its whole process group; ``what`` names the point it never reached."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(marker):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, f"the trainer never reached {what}"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # torchrun starts its workers in sessions of their own: killing the launcher's group orphans them,
    # and the stalled one (its pid is the marker's content) would run on after the test
    run_dir = os.path.dirname(marker)
    with open(marker) as f:
        stalled = f.read().strip()
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
            if pid == stalled or run_dir in cmdline:
                os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            continue


class Evil:
    """An object whose unpickling runs ``touch marker`` (os.system): what a forged checkpoint could hold."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def extract_files(work_root: str, files: list[tuple[str, str]], *, text_field: str = "text", id_field: str | None = None,
                  batch_rows: int = 64, language: bool = False, extract: dict | None = None, **file_options):
    """Run the extract task that `prepare` runs, on one partition of ``files`` ([(path, format)]),
    in this process (no Ray); ``extract``: keys of the extract section. Returns (stats, kept
    document rows, quarantine rows)."""
    import pyarrow.parquet as pq

    from gristmill.pipeline.stages.extract.config import ExtractConfig, LanguageConfig
    from gristmill.pipeline.stages.extract.tasks import extract_partition
    from gristmill.pipeline.partitions import InputFile
    from gristmill.pipeline.workdir import BlockOutputs, WorkDir

    task = {"part": 0, "files": [InputFile(uri=p, rel=os.path.basename(p), size=None, mtime="", input=0, format=fmt,
                                           text_field=text_field, id_field=id_field, **file_options) for p, fmt in files]}
    wd = WorkDir(work_root)
    with BlockOutputs():  # partition 0's block, as the runner opens it around the task
        stats = extract_partition(task, ExtractConfig(**(extract or {})), LanguageConfig(enabled=language), wd, batch_rows)
    docs = pq.read_table(wd.docs(0)).to_pylist()
    quarantine = pq.read_table(wd.quarantine(0)).to_pylist()
    return stats, docs, quarantine


def demo_job_dict(corpus, out, **over) -> dict:
    """A prepare job over the demo corpus at ``corpus`` (WARC, Parquet, text and JSONL inputs),
    publishing under ``out``; ``over`` replaces whole sections."""
    d = {
        "inputs": [str(corpus / "corpus" / "*.jsonl*"), {"path": str(corpus / "corpus" / "*.parquet"), "text_field": "content"},
                   str(corpus / "corpus" / "*.txt"), str(corpus / "corpus" / "*.warc.gz")],
        # report.html costs ~2 s a run (matplotlib); the report tests turn it back on
        "output": {"store": str(out / "store"), "dataset": "demo", "report_html": False},
        "work_dir": str(out / "work"),
        "extract": {"max_chars": 100_000},
        "split": {"validation_fraction": 0.05},
        "tokenizer": {"vocab_size": 512, "sample_bytes": 300_000},
        "pack": {"seq_len": 128, "shard_bytes": 60_000},
    }
    d.update(over)
    return d


class ServeProcess:
    """``gristmill serve`` in its own process on 127.0.0.1 and a free port (``--listen HOST:0``); ``url`` is
    its endpoint once it printed its listening line. ``args``: the command's arguments after the URLs;
    ``env``: extra environment (e.g. ``GRISTMILL_SERVE_TOKEN``); ``log``: a file every line is also written
    to. ``kill()`` is kill -9; ``stop()`` SIGTERM.

    A daemon thread drains the server's output from the start (it logs as it serves: an undrained 64 KB
    pipe would block it) into a bounded buffer: the first ``HEAD_LINES`` lines and the last
    ``TAIL_LINES``, which ``output()`` and ``stop()`` return (the shutdown message is always in the tail)."""

    HEAD_LINES, TAIL_LINES = 200, 2000

    def __init__(self, *urls: str, args: tuple[str, ...] = (), env: dict | None = None, listen: str = "127.0.0.1:0",
                 timeout_s: float = 60.0, log: str | None = None, cwd: str | None = None):
        self.proc = subprocess.Popen([sys.executable, "-m", "gristmill", "serve", *urls, "--listen", listen, *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                                     env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        self.head: list[str] = []
        self.tail: collections.deque[str] = collections.deque(maxlen=self.TAIL_LINES)
        self.dropped = 0  # lines between the head and the tail that were not kept
        self._lock = threading.Lock()
        self._log = open(log, "w") if log else None
        self._first: queue.Queue[str | None] = queue.Queue()  # lines until the listening one, for __init__
        self._drain = threading.Thread(target=self._read, name="serve-output", daemon=True)
        self._drain.start()
        self.url = None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._first.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise TimeoutError(f"gristmill serve did not start in {timeout_s} s: {self.output()[-2000:]}") from None
            if line is None:  # exited before listening
                self.proc.wait(timeout=10)
                return
            found = re.search(r"listening on (grpc(?:\+tls)?://\S+)", line)
            if found:
                self.url = found.group(1)
                return

    def _read(self) -> None:
        listening = False
        for line in self.proc.stdout:
            with self._lock:
                if len(self.head) < self.HEAD_LINES:
                    self.head.append(line)
                else:
                    if len(self.tail) == self.tail.maxlen:
                        self.dropped += 1
                    self.tail.append(line)
                if self._log:
                    self._log.write(line)
            if not listening:
                self._first.put(line)
                listening = "listening on" in line
        if not listening:
            self._first.put(None)
        with self._lock:
            if self._log:
                self._log.close()

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        """What it printed so far (complete once it exited), bounded: head, a gap marker, tail."""
        if self.proc.poll() is not None:
            self._drain.join(timeout=10)
        with self._lock:
            gap = [f"[... {self.dropped} lines not kept ...]\n"] if self.dropped else []
            return "".join(self.head + gap + list(self.tail))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._drain.join(timeout=10)

    def stop(self, timeout_s: float = 20.0) -> str:
        """SIGTERM (kill -9 if it does not exit in ``timeout_s``); returns what it printed (``output()``)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.output()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()


def write_part(path, schema, rows) -> None:
    """A partition's rows of a work-dir block file (``WorkDir.docs(3)``, ...), written as a stage's task
    writes them: through its block's outputs (here a block of its own)."""
    from gristmill.manifests.storage import Store
    from gristmill.pipeline.workdir import BlockOutputs, writer

    with BlockOutputs():
        out = writer(path, schema, Store.from_url(path))
        out.write(rows)
        out.commit()


def sigint_as_a_terminal_sends_it() -> None:
    """``preexec_fn`` of a child a test stops with SIGINT: its SIGINT back to the default, as a
    foreground process started from a terminal has it. A test run started in the background of a
    script (``make test &``) inherits SIGINT ignored, and Python keeps an ignored SIGINT ignored,
    so without this the test would measure how pytest was started rather than the product."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def doc_tokens(published, root: str | None = None) -> dict[str, list[int]]:
    """doc_id -> its tokens, read from the shards (under ``root``, default the version dir) through the
    document index: what a takedown must leave whole (tests/test_takedown*.py)."""
    from gristmill.manifests.doc_index import read_published_doc_index
    from gristmill.manifests.shards import read_rows

    root = root or published.url
    rows = {i: read_rows(os.path.join(root, s.path)) for i, s in enumerate(published.manifest.shards)}
    out: dict[str, list[int]] = {}
    for s in read_published_doc_index(published).to_pylist():
        out.setdefault(s["doc_id"], []).extend(rows[s["shard"]][s["row"], s["start"]:s["start"] + s["length"]].tolist())
    return out
