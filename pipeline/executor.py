"""``prepare(job)``: run the job's stages in order as tasks over work-dir files, resumably, and publish.

The executor knows one interface (``pipeline.stages.Stage``): it builds the list of stages the
job enables (``stages.build``), runs each one and publishes from what they return as data
(``StageResult``: stage-table rows, accounting, inputs, eval sets, the packed dataset); it
never names a stage. Every stage is tasks over files run by a ``pipeline.runner.Runner`` (a
pool of local processes, or Ray tasks on a cluster: the job's ``runner:``, ``pipeline.runners``): a task per
partition, per hash range or per range of partitions, each committed with a marker, so a
rerun after ``kill -9`` skips every finished task of every stage. The driver holds
O(partitions): removed rows, overrides and statistics stay in files and task markers.
Publishing copies the packed shards into a new version directory and commits ``manifest.json``
last. The data card (report.html) is the prepare command's to write.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import glob as _glob
import itertools
import json
import os
import posixpath
import signal
import sys
import threading
import time
from dataclasses import dataclass

from gristmill.errors import ConfigError, GristmillError
from gristmill.manifests import DatasetBuilder, EvalSet, Input, ManifestStore, code_version, sha256_json
from gristmill.manifests.storage import Store, is_url, local_path, nearest_dir, split_url

from . import runners
from . import stages as st
from .config import PrepareConfig
from .partitions import InputFile, Partition
from .progress import Progress
from .readers import special_file
from .stats import build_report, check_balanced, export_jsonl, manifest_stats
from .workdir import WorkDir

WORK_DIR_LAYOUT = 2  # in the run key: a run dir of another layout (1: a file per partition) is never resumed




@dataclass
class RunResult:
    manifest_sha256: str
    url: str
    version: int
    report: dict
    run_dir: str


# -- planning --------------------------------------------------------------------------------
def plan_inputs(job: PrepareConfig) -> list[Partition]:
    """Expand every input path/glob into files in sorted URI order and group them into partitions.

    A partition (one task, one set of stage outputs) is a run of consecutive files: small files
    share one up to ``partitioning.partition_bytes``, a larger file is a partition of its own. Records are
    numbered in file order inside a partition, so the global document sequence is the same for
    any grouping; only the bookkeeping (tasks, markers) changes with it. Each input is listed
    through its own store (``inputs[i].storage_options``).
    """
    found: dict[str, dict] = {}
    for i, spec in enumerate(job.inputs):
        try:
            fs = spec.store().fs
        except (OSError, ValueError, ImportError) as e:  # a chained URL's outer file missing, an unknown protocol
            raise ConfigError(f"inputs[{i}].path: {spec.path} cannot be opened ({type(e).__name__}: "
                              f"{getattr(e, 'strerror', None) or e}); fix the path or its storage_options") from None
        root = None if spec.follow_symlinks else pattern_root(spec.path)
        for p, info in _input_files(fs, spec.path, f"inputs[{i}].path"):
            uri = fs.unstrip_protocol(p) if is_url(spec.path) else os.path.abspath(p)
            if uri not in found:
                found[uri] = dict(uri=uri, input=i, format=spec.format, text_field=spec.text_field, id_field=spec.id_field,
                                  text_format=spec.text_format, url_field=spec.url_field, size=info.get("size"), root=root,
                                  mtime=str(info.get("mtime") or info.get("LastModified") or info.get("ETag") or ""))
    uris = sorted(found)
    paths = {u: split_url(u)[1] for u in uris}
    common = posixpath.commonpath(list(paths.values())) if len(uris) > 1 else posixpath.dirname(paths[uris[0]])
    files = [InputFile(**found[u], rel=posixpath.relpath(paths[u], common) if common else u) for u in uris]
    return [Partition(part, tuple(group)) for part, group in enumerate(group_files(files, job.partitioning.partition_bytes))]


def pattern_root(pattern: str) -> str:
    """The folder a path or glob names its files under: the components before the first one with
    glob magic (a plain path: its folder). A file that resolves outside it through a symlink is
    not the folder's to give (``Store.escapes``): a downloaded corpus may link to ~/.ssh."""
    if not _glob.has_magic(pattern):
        return posixpath.dirname(pattern) or "."
    parts = pattern.split("/")
    lead = list(itertools.takewhile(lambda p: not _glob.has_magic(p), parts))
    return "/".join(lead) or ("/" if pattern.startswith("/") else ".")


def _input_files(fs, pattern: str, where: str) -> list[tuple[str, dict]]:
    """The files a path or glob names, with their fsspec info. Anything matched that is not a
    readable file stops the job here, before any work, in one line: a directory (the glob
    names files; a Spark-style ``x.parquet/`` directory is read as ``x.parquet/*.parquet``), a
    symlink loop or a dangling link. Skipping them would drop data without a word."""
    paths = sorted(fs.glob(pattern)) if _glob.has_magic(pattern) else [pattern]
    out = []
    for p in paths:
        if any(ord(c) < 0x20 or c == "\x7f" for c in p):  # a newline in an id forges lines in `inspect removed`
            raise ConfigError(f"{where}: the file name {p!r} holds a control character (document ids name their "
                              "file, one per line in reports); rename it")
        try:
            info = fs.info(p)
        except OSError as e:
            if p == pattern and isinstance(e, FileNotFoundError) and not os.path.lexists(p):
                continue  # a plain path that is not there: "no input file matches" below
            why = ("a symlink loop" if e.errno == errno.ELOOP else
                   "a symlink to nothing" if isinstance(e, FileNotFoundError) and os.path.islink(p) else e.strerror or str(e))
            raise ConfigError(f"{where}: {p} (matched by {pattern!r}) cannot be read: {why}; fix or remove it") from None
        if info.get("type") == "directory":
            raise ConfigError(f"{where}: {p} (matched by {pattern!r}) is a directory, not an input file; "
                                 f"name the files in it, e.g. {posixpath.join(p, '*')!r}")
        if info.get("type") != "file":  # a FIFO, device or socket never ends (or never starts)
            raise ConfigError(f"{where}: {p} (matched by {pattern!r}) is {special_file(p)}, not a regular file; "
                              "copy its contents to a file and name that")
        try:
            p.encode()
        except UnicodeEncodeError:
            raise ConfigError(f"{where}: the file name {p.encode(errors='surrogateescape')!r} is not valid UTF-8 "
                                 "(document ids and the manifest name files in UTF-8); rename it") from None
        out.append((p, info))
    if not out:
        raise ConfigError(f"{where}: no input file matches {pattern!r}")
    return out


def group_files(files: list[InputFile], limit: int) -> list[list[InputFile]]:
    """Consecutive files, each group at most ``limit`` bytes unless it is a single file.

    A file of unknown size (some HTTP servers) is taken to be large: it stands alone.
    """
    groups: list[list[dict]] = []
    size = 0
    for f in files:
        n = limit if f.size is None else f.size
        if not groups or size + n > limit:
            groups.append([])
            size = 0
        groups[-1].append(f)
        size += n
    return groups


def run_key(job: PrepareConfig, tasks: list[Partition]) -> str:
    """Names the run dir: the job's content, each input's identity (uri, size, mtime) and the
    partitioning (finished partitions are only reused under the same grouping)."""
    ids = [[[f.uri, f.size, f.mtime] for f in t.files] for t in tasks]
    return sha256_json({"job": job.content_dict(), "inputs": ids, "layout": WORK_DIR_LAYOUT})[:16]


def check_writable(store: str, dataset: str, storage_options: dict | None = None) -> None:
    """The output store must take a write where the version will go, checked
    before any work (an unwritable store was once found only after the whole pipeline ran). A
    local store: a temporary file in the nearest existing directory on the way to
    ``<store>/<dataset>`` (nothing is created for good); a URL: a probe object written and deleted
    through the store opened with ``storage_options`` (``output.storage_options``)."""
    import uuid

    where = f"output.store: {store}"
    if (local := local_path(store)) is not None:
        try:
            path = nearest_dir(os.path.join(local, dataset))
        except NotADirectoryError as e:
            raise ConfigError(f"{where}: {e} exists and is not a directory; point output.store elsewhere") from None
        if os.path.isdir(latest := os.path.join(local, dataset, "latest")):  # the pointer must be a file to replace
            raise ConfigError(f"{where}: {latest} is a directory, where the dataset's latest pointer (a file holding "
                              "a version number) goes; move it away (checked before any work)")
        try:
            with contextlib.ExitStack() as stack:
                import tempfile

                stack.enter_context(tempfile.NamedTemporaryFile(dir=path, prefix=".gristmill-write-probe-"))
        except OSError as e:
            raise ConfigError(f"{where}: cannot write in {path} ({e.strerror or e}); fix its permissions or choose "
                              "another store (checked before any work)") from None
        return
    try:
        target = Store.from_url(store, **(storage_options or {}))
        probe = posixpath.join(target.path(store), dataset, f".gristmill-write-probe-{uuid.uuid4().hex}")
        target.fs.pipe_file(probe, b"")
        target.fs.rm_file(probe)
    except Exception as e:  # noqa: BLE001 - any backend's refusal is the same finding
        raise ConfigError(f"{where}: cannot write there ({type(e).__name__}: {e}); fix its credentials or "
                          "permissions, or choose another store (checked before any work)") from None


class PrepareInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a prepare, after the workers (or Ray) were stopped; its message says
    how to resume, ``signum`` which signal stopped it (the command exits 128 + signum)."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.signum = signum


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where Ctrl-C raises KeyboardInterrupt."""

    signum = signal.SIGTERM


@contextlib.contextmanager
def _sigterm_stops_like_ctrl_c():
    """SIGTERM (`kill`, a scheduler's stop, a container's shutdown) stops a prepare the way Ctrl-C
    does: workers stopped, finished tasks kept, one line saying the same command resumes. Only the
    main thread can take signals; elsewhere SIGTERM keeps its default action."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise _Terminated()

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


class EmptyRunError(GristmillError):
    """The run kept no document and ``output.allow_empty`` is not set: nothing is published."""


# -- the run -----------------------------------------------------------------------------------
class Executor:
    def __init__(self, job: PrepareConfig, *, address: str | None = None, quiet: bool = False, fresh: bool = False):
        self.job, self.address, self.quiet = job, address, quiet
        runners.resolve(job.runner, address)  # a local runner with a cluster named is an error before any work
        self.tasks = plan_inputs(job)
        check_writable(job.output.store, job.output.dataset, job.output.storage_options)  # before any work, not at publish
        self.wd = WorkDir.of_run(job.work_dir, run_key(job, self.tasks), job.work_dir_options)
        if fresh:  # the user's way out of a damaged run dir (workdir.FRESH_HINT): nothing of it is reused
            self.wd.remove()
        self.wd.set_blocks(len(self.tasks))  # the blocks of partitions (a function of their count), fixed for resumes
        self.stages = st.build(job)  # fails on a bad stage section before any work starts

    def log(self, msg: str) -> None:
        """The run's progress lines, on stderr unless quiet (not through logging too: the command's
        handler writes INFO to stderr, so each line came twice and --quiet did not silence them)."""
        if not self.quiet:
            print(msg, file=sys.stderr, flush=True)

    def run(self) -> RunResult:
        t_all = time.perf_counter()
        self.log(f"[prepare] {sum(len(t.files) for t in self.tasks)} input files in {len(self.tasks)} partitions; "
                 f"work dir {self.wd.root}")
        timings: dict[str, dict] = {}
        inputs = {t.part: t.uris for t in self.tasks}
        results: list[st.StageResult] = []
        try:
            with _sigterm_stops_like_ctrl_c():
                with runners.start(self.job.runner, self.wd, Progress(quiet=self.quiet), inputs, self.address) as runner:
                    ctx = st.Context(self.wd, runner, self.tasks, self.log)
                    for stage in self.stages:
                        t0, c0, r0 = time.perf_counter(), ctx.cpu_seconds(), runner.resumed_tasks
                        results.append(ctx.run(stage))  # and the survivors advanced past its verdicts
                        timings[stage.name] = {"seconds": time.perf_counter() - t0,
                                               "cpu_seconds": ctx.cpu_seconds() - c0,
                                               "resumed_parts": runner.resumed_tasks - r0}
                timings["total"] = {"seconds": time.perf_counter() - t_all}
                return self._publish(results, timings, t_all, runner.retries)
        except KeyboardInterrupt as e:  # the workers (or Ray) are stopped by now (the runner's exit); a publish
            # stopped half way removed its version (ManifestStore.publish)
            signum = getattr(e, "signum", signal.SIGINT)
            raise PrepareInterrupted(f"interrupted by {signal.Signals(signum).name}; every finished task is kept in "
                                     f"{self.wd.root}: the same command resumes from there", signum) from None

    def _publish(self, results: list[st.StageResult], timings: dict, t_all: float, retries: dict) -> RunResult:
        """The manifest from the stages' results (data only: no stage is named here), published;
        then report.json and the JSONL exports."""
        t0 = time.perf_counter()
        stats = manifest_stats(results)
        check_balanced(stats["accounting"], self.wd)  # never publish a run that lost records
        self._refuse_empty(stats["accounting"], results)
        (packed,) = [r.dataset for r in results if r.dataset is not None]
        builder = DatasetBuilder(packed.staging, dataset=packed.dataset, seq_len=packed.seq_len,
                                 tokenizer_json=packed.tokenizer_json, vocab_size=packed.vocab_size, eos_id=packed.eos_id,
                                 store=self.wd.store, tokenizer_store=packed.tokenizer_store, encoder=packed.encoder)
        builder.shards, builder.doc_index = list(packed.shards), packed.doc_index
        builder.dedup_index = [f for r in results for f in r.dedup_index]
        manifest = builder.manifest(inputs=[Input(f["uri"], f["bytes"], f["sha256"]) for r in results for f in r.inputs],
                                    config=self.job.content_dict(), code_version=code_version(), stats=stats,
                                    eval_sets=[EvalSet(**e) for r in results for e in r.eval_sets],
                                    dedup_against=[p for r in results for p in r.dedup_against])
        published = ManifestStore(self.job.output.store, **self.job.output.storage_options).publish(
            manifest, builder.dir, files_store=builder.store)
        timings["publish"] = {"seconds": time.perf_counter() - t0}
        timings["total"]["seconds"] = time.perf_counter() - t_all
        core = {k: v for r in results for k, v in r.core_seconds.items()}
        peak = {k: v for r in results for k, v in r.peak_rss_mb.items()}
        report = {**build_report(stats, core, peak, timings, published, self.wd),
                  "retries": {"total": sum(retries.values()), "by_step": dict(sorted(retries.items()))}}
        self._write_outputs(report, [f for r in results for f in r.removed_files])
        return RunResult(published.manifest.sha256, published.url, published.manifest.version, report, self.wd.root)

    def _refuse_empty(self, accounting: dict, results: list[st.StageResult]) -> None:
        """A run that keeps no document publishes nothing unless ``output.allow_empty`` asks for an
        empty version: an empty ``latest`` is almost always a filter, a field name or an input
        glob gone wrong, and a trainer would only find out at its first batch."""
        if accounting["kept"] or self.job.output.allow_empty:
            return
        self._write_records([f for r in results for f in r.removed_files])  # what became of every record
        gone = {**{f"removed {k}": v for k, v in accounting["removed"].items()},
                **{f"quarantined {k}": v for k, v in accounting["quarantined"].items()}}
        why = ", ".join(f"{k} {v:,}" for k, v in sorted(gone.items(), key=lambda kv: -kv[1])) or "no input record"
        raise EmptyRunError(f"the run kept no document of {accounting['input']:,} input records ({why}; see "
                            f"{self.wd.quarantine_jsonl} and {self.wd.removed_jsonl}); nothing was published. Fix the "
                            "inputs or filters, or set output.allow_empty: true to publish an empty version")

    def _write_outputs(self, report: dict, removed_files: list[tuple[str, str]]) -> None:
        """report.json, plus the quarantine and removed records as JSONL for people to read."""
        self.wd.write(self.wd.report_json, (json.dumps(report, indent=1, sort_keys=True) + "\n").encode())
        self._write_records(removed_files)

    def _write_records(self, removed_files: list[tuple[str, str]]) -> None:
        """The quarantine and removed records as JSONL for people to read (each block file once, all
        its partitions' rows in order: O(blocks) paths and opens per stage, never one per partition)."""
        parts = [t.part for t in self.tasks]
        files = self.wd.block_files
        export_jsonl(self.wd, files(self.wd.quarantine, parts), self.wd.quarantine_jsonl)
        removed = self.wd.whole_files(f for stage, prefix in removed_files
                                      for f in files(functools.partial(self.wd.removed, stage, prefix=prefix), parts))
        # no text: the language filter removes most of a crawl, and its texts would copy most of the
        # input uncompressed; they stay in removed/language/*.parquet (what inspect removed reads)
        export_jsonl(self.wd, removed, self.wd.removed_jsonl, drop=("text",))


def prepare(job: PrepareConfig, *, address: str | None = None, quiet: bool = False, fresh: bool = False) -> RunResult:
    """Run the job's stages and publish its dataset; the data card is the command's to write
    (``RunResult.url``, ``RunResult.run_dir``)."""
    return Executor(job, address=address, quiet=quiet, fresh=fresh).run()
