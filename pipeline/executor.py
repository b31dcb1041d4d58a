"""``gristmill prepare``: run the stages in order on Ray Data, resumably, and publish.

Stage order (the slots are fixed; optional stages are skipped when their section is absent):

    extract -> language -> exact_dedup -> fuzzy_dedup -> decontaminate -> tokenize -> pack -> publish

* Per-partition stages (extract + language fused, tokenize) run one Ray task per partition (an
  input file, or a run of small consecutive files); each commits its output and a completion
  marker (pipeline/workdir.py).
* Global stages return the rows they remove; the executor writes those sorted by ``order``
  and later partitions drop them. Exact dedup runs as Ray tasks over hash-bucket ranges of
  the keys the extract stage wrote; fuzzy dedup and decontamination get the surviving
  documents as one ray.data.Dataset (pipeline.stage.StageResult contract).
* Pack and publish run in the driver, in ``order``: the output never depends on scheduling.
"""
from __future__ import annotations

import contextlib
import errno
import glob as _glob
import json
import logging
import os
import posixpath
import shutil
import sys
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.core import url_to_fs

from gristmill.errors import ConfigError, GristmillError
from gristmill.manifests import DatasetBuilder, EvalSet, Input, ManifestStore, code_version, sha256_json
from gristmill.manifests.shards import atomic_write

from . import exact_dedup
from . import report as rep
from .config import JobConfig, JobConfigError
from .documents import OVERRIDE_SCHEMA, REMOVED_SCHEMA, to_removed_rows
from .extract import extract_partition
from .pack import pack_split
from .tokenize import load_tokenizer, overridden_texts, removed_ids, split_of, tokenize_partition, train_bpe
from .workdir import ParquetPart, WorkDir, part_name

GLOBAL_STAGES = ("exact_dedup", "fuzzy_dedup", "decontaminate")


@dataclass
class RunResult:
    manifest_sha256: str
    url: str
    version: int
    report: dict
    run_dir: str


# -- planning --------------------------------------------------------------------------------
def plan_inputs(job: JobConfig) -> list[dict]:
    """Expand every input path/glob into files in sorted URI order and group them into partitions.

    A partition (one task, one set of stage outputs) is a run of consecutive files: small files
    share one up to ``ray.partition_bytes``, a larger file is a partition of its own. Records are
    numbered in file order inside a partition, so the global document sequence is the same for
    any grouping; only the bookkeeping (tasks, markers) changes with it.
    """
    found: dict[str, dict] = {}
    for i, spec in enumerate(job.inputs):
        fs, _ = url_to_fs(spec.path)
        for p, info in _input_files(fs, spec.path, f"inputs[{i}].path"):
            uri = os.path.abspath(p) if "://" not in spec.path else fs.unstrip_protocol(p)
            if uri not in found:
                found[uri] = {"uri": uri, "format": spec.format, "text_field": spec.text_field, "id_field": spec.id_field,
                              "bytes": info.get("size"),
                              "mtime": str(info.get("mtime") or info.get("LastModified") or info.get("ETag") or "")}
    uris = sorted(found)
    common = posixpath.commonpath([u.split("://")[-1] for u in uris]) if len(uris) > 1 else posixpath.dirname(uris[0].split("://")[-1])
    files = [{**found[u], "rel": posixpath.relpath(u.split("://")[-1], common) if common else u} for u in uris]
    return [{"part": part, "files": group} for part, group in enumerate(group_files(files, job.ray.partition_bytes))]


def _input_files(fs, pattern: str, where: str) -> list[tuple[str, dict]]:
    """The files a path or glob names, with their fsspec info. Anything matched that is not a
    readable file stops the job here, before any work, in one line: a directory (the glob
    names files; a Spark-style ``x.parquet/`` directory is read as ``x.parquet/*.parquet``), a
    symlink loop or a dangling link. Skipping them would drop data without a word."""
    paths = sorted(fs.glob(pattern)) if _glob.has_magic(pattern) else [pattern]
    out = []
    for p in paths:
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
        try:
            p.encode()
        except UnicodeEncodeError:
            raise ConfigError(f"{where}: the file name {p.encode(errors='surrogateescape')!r} is not valid UTF-8 "
                                 "(document ids and the manifest name files in UTF-8); rename it") from None
        out.append((p, info))
    if not out:
        raise ConfigError(f"{where}: no input file matches {pattern!r}")
    return out


def group_files(files: list[dict], limit: int) -> list[list[dict]]:
    """Consecutive files, each group at most ``limit`` bytes unless it is a single file.

    A file of unknown size (some HTTP servers) is taken to be large: it stands alone.
    """
    groups: list[list[dict]] = []
    size = 0
    for f in files:
        n = limit if f["bytes"] is None else f["bytes"]
        if not groups or size + n > limit:
            groups.append([])
            size = 0
        groups[-1].append(f)
        size += n
    return groups


def run_key(job: JobConfig, tasks: list[dict]) -> str:
    """Names the run dir: the job's content, each input's identity (uri, size, mtime) and the
    partitioning (finished partitions are only reused under the same grouping)."""
    ids = [[[f["uri"], f["bytes"], f["mtime"]] for f in t["files"]] for t in tasks]
    return sha256_json({"job": job.content_dict(), "inputs": ids})[:16]


# -- Ray ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def ray_runtime(job: JobConfig, address: str | None):
    """Embedded local Ray by default; ``address`` (or RAY_ADDRESS, set by `ray job submit`) joins a cluster."""
    import ray

    if ray.is_initialized():  # e.g. the test session's Ray
        yield ray
        return
    join = address or os.environ.get("RAY_ADDRESS")
    try:
        if join:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        else:
            ray.init(num_cpus=job.ray.num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    except Exception as e:  # Ray raises plain Exception/TimeoutError/ConnectionError: the environment, not the job
        with contextlib.suppress(Exception):
            ray.shutdown()  # stop whatever half-started processes it left
        raise RayStartError(_ray_start_advice(e, join, job.ray.num_cpus)) from e
    try:
        yield ray
    finally:
        ray.shutdown()


class RayStartError(GristmillError):
    """Ray could not be started or joined; the message says which setting helps."""


def _ray_start_advice(e: Exception, join: str | None, num_cpus: int | None) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    cause = f"{type(e).__name__}{': ' + first if first else ''}"
    if join:
        return (f"cannot join the Ray cluster at {join} ({cause}); check that it is up and runs the same Ray and "
                "Python versions (`ray status` on the head), or drop --address / RAY_ADDRESS for an embedded Ray")
    cpus = f"ray.num_cpus: {num_cpus} is set; lower it" if num_cpus else "set ray.num_cpus in the job (e.g. 2)"
    return (f"the embedded Ray did not start ({cause}). On a busy machine give its processes more time: "
            f"RAY_raylet_start_wait_time_s=120 RAY_worker_register_timeout_seconds=120 in the environment; "
            f"{cpus} to start fewer workers; or join a running cluster with --address")


def _map_partitions(ray, stage: str, items: list[dict], fn, concurrency: int | None, progress) -> list[dict]:
    """Run ``fn(item) -> stats`` for each item as Ray Data tasks; progress as each one finishes."""
    if not items:
        return []
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # our own progress lines instead, one per finished partition
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    ds = ds.map(lambda item: {"stats": json.dumps(fn(item))}, num_cpus=1, concurrency=concurrency)
    out, t0 = [], time.perf_counter()
    for row in ds.iter_rows():
        out.append(json.loads(row["stats"]))
        if progress is not None:
            progress(stage, len(out), len(items), time.perf_counter() - t0, out)
    return out


# -- the run -----------------------------------------------------------------------------------
class Executor:
    def __init__(self, job: JobConfig, *, address: str | None = None, quiet: bool = False):
        self.job, self.address, self.quiet = job, address, quiet
        self.tasks = plan_inputs(job)
        self.wd = WorkDir(os.path.join(job.work_dir, run_key(job, self.tasks)))
        self.timings: dict[str, dict] = {}
        self.global_stages = [s for s in GLOBAL_STAGES if self._enabled(s)]
        self._check_optional_stages()

    def _enabled(self, stage: str) -> bool:
        if stage == "exact_dedup":
            return self.job.exact_dedup.enabled
        section = getattr(self.job, stage)
        return section is not None and section.get("enabled", True) is not False

    def _check_optional_stages(self) -> None:
        """Fail before any work if an enabled stage is not installed or its section is invalid."""
        self.stage_configs = {}
        for stage in self.global_stages:
            if stage == "exact_dedup":
                continue
            module = self._stage_module(stage)
            section = dict(getattr(self.job, stage))
            section.pop("enabled", None)
            try:
                if stage == "fuzzy_dedup":
                    self.stage_configs[stage] = module.FuzzyDedupConfig.from_dict(section)
                else:
                    self.stage_configs[stage] = module.DecontamConfig.from_dict(section, base_dir=self.job.base_dir)
            except ValueError as e:
                raise JobConfigError(f"job section {stage}: {e}") from None

    @staticmethod
    def _stage_module(stage: str):
        module = {"fuzzy_dedup": "gristmill.pipeline.fuzzy_dedup", "decontaminate": "gristmill.pipeline.decontam"}[stage]
        try:
            return __import__(module, fromlist=["_"])
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            raise JobConfigError(f"job section {stage}: is set but {module} is not available in this gristmill; "
                                 f"remove the section to run without {stage.replace('_', ' ')}") from None

    def log(self, msg: str) -> None:
        if not self.quiet:
            print(msg, file=sys.stderr, flush=True)

    def progress(self, stage: str, done: int, total: int, seconds: float, stats: list[dict]) -> None:
        docs = sum(_stage_docs(stage, s) for s in stats)
        mb = sum(_stage_bytes(stage, s) for s in stats) / 1e6
        self.log(f"[{stage}] {done}/{total} partitions  {docs:,} docs  {mb:,.1f} MB  {mb / max(seconds, 1e-9):,.1f} MB/s")

    def run(self) -> RunResult:
        t_all = time.perf_counter()
        self.log(f"[prepare] {sum(len(t['files']) for t in self.tasks)} input files in {len(self.tasks)} partitions; "
                 f"work dir {self.wd.root}")
        with ray_runtime(self.job, self.address) as ray:
            extract_stats = self._extract(ray)
            removed_files, global_stats, eval_sets = [], {}, []
            for stage in self.global_stages:
                st = self._global_stage(ray, stage, removed_files)
                global_stats[stage] = st
                eval_sets += st.get("detail", {}).get("eval_sets", [])
                removed_files += sorted(_glob.glob(self.wd.path("removed", stage, "*.parquet")))
            tok_path = self._tokenizer(removed_files)
            tok_stats = self._tokenize(ray, tok_path, removed_files)
        self.timings["total"] = {"start": t_all}
        return self._pack_and_publish(tok_path, extract_stats, global_stats, tok_stats, eval_sets)

    # -- stages -------------------------------------------------------------------------------
    def _extract(self, ray) -> list[dict]:
        t0 = time.perf_counter()
        job, root = self.job, self.wd.root
        todo = [t for t in self.tasks if self.wd.done("extract", part_name(t["part"])) is None]
        self.log(f"[extract] {len(self.tasks) - len(todo)} of {len(self.tasks)} partitions already done")
        batch = job.ray.records_per_batch
        _map_partitions(ray, "extract", todo, lambda t: extract_partition(t, job.extract, job.language, root, batch),
                        job.ray.concurrency, self.progress)
        self.timings["extract"] = {"seconds": time.perf_counter() - t0, "resumed_parts": len(self.tasks) - len(todo)}
        return [self.wd.done("extract", part_name(t["part"])) for t in self.tasks]

    def docs_files(self) -> list[str]:
        return [self.wd.path("docs", f"{part_name(t['part'])}.parquet") for t in self.tasks]

    def survivors(self, ray, removed_files: list[str]):
        """The documents no stage has removed so far, as a ray.data.Dataset."""
        ds = ray.data.read_parquet(self.docs_files())
        if removed_files:
            ds = ds.map_batches(_drop_removed, fn_args=(tuple(removed_files),), batch_format="pyarrow")
        return ds

    def _global_stage(self, ray, stage: str, removed_files: list[str]) -> dict:
        if (done := self.wd.done(stage, "all")) is not None:
            self.log(f"[{stage}] already done")
            self.timings[stage] = {"seconds": done.pop("_seconds", 0.0), "resumed_parts": 1}
            return done
        t0 = time.perf_counter()
        self.log(f"[{stage}] running")
        if stage == "exact_dedup":
            stats = self._exact_dedup(ray)
        else:
            stats = self._pluggable_stage(ray, stage, removed_files)
        seconds = time.perf_counter() - t0
        self.wd.mark_done(stage, "all", {**stats, "_seconds": seconds})
        self.timings[stage] = {"seconds": seconds, "resumed_parts": 0}
        self.log(f"[{stage}] removed {sum(stats['removed'].values()):,} documents {stats['removed']} in {seconds:.1f}s")
        return stats

    def _exact_dedup(self, ray) -> dict:
        total = sum(self.wd.done("extract", part_name(t["part"]))["language"]["documents_out"] for t in self.tasks)
        key_files = [self.wd.path("keys", f"{part_name(t['part'])}.parquet") for t in self.tasks]
        root = self.wd.root
        results = _map_partitions(ray, "exact_dedup", exact_dedup.plan_tasks(total),
                                  lambda t: exact_dedup.dedup_task(t, key_files, root), self.job.ray.concurrency, None)
        removed = {}
        for r in results:
            _add_counts(removed, r["removed"])
        return {"removed": removed, "removed_bytes": sum(r["removed_bytes"] for r in results), "detail": {}}

    def _pluggable_stage(self, ray, stage: str, removed_files: list[str]) -> dict:
        """fuzzy_dedup / decontaminate: a function over the surviving documents -> StageResult(s)."""
        module, cfg = self._stage_module(stage), self.stage_configs[stage]
        stage_dir = self.wd.path("stages", stage)
        os.makedirs(stage_dir, exist_ok=True)
        docs = self.survivors(ray, removed_files)
        if stage == "fuzzy_dedup":
            results = [module.find_near_duplicates(docs, cfg, stage_dir)]
        else:
            results = [module.decontaminate(docs, cfg, stage_dir)]
            split = self.job.split
            if cfg.against_validation and split.validation_fraction > 0:
                # Train must not contain validation text either: check it against the split.
                kept = results[0].kept
                train = kept.filter(lambda r: split_of(r["id"], split) == "train")
                val = kept.filter(lambda r: split_of(r["id"], split) == "validation")
                results.append(module.decontaminate_against_docs(train, val, cfg, stage_dir))
        tables = [t for r in results if (t := _collect_removed(r.removed)) is not None]
        rows = (pa.concat_tables([to_removed_rows(t, stage) for t in tables]).sort_by("order") if tables
                else REMOVED_SCHEMA.empty_table())
        out = ParquetPart(self.wd.path("removed", stage, "all.parquet"), REMOVED_SCHEMA)
        out.write(rows)
        out.commit()
        self._write_overrides(stage, [r.kept for r in results])
        removed: dict[str, int] = {}
        for r in rows.column("reason").to_pylist():
            removed[r] = removed.get(r, 0) + 1
        detail = results[0].stats or {}
        if len(results) > 1:
            detail = {**detail, "against_validation": results[1].stats or {}}
            detail["eval_sets"] = list(detail.get("eval_sets", [])) + list((results[1].stats or {}).get("eval_sets", []))
        return {"removed": removed, "removed_bytes": sum(b or 0 for b in rows.column("bytes").to_pylist()), "detail": detail}

    def _write_overrides(self, stage: str, kept_sets: list) -> None:
        """Documents a stage kept with shorter text (decontamination's ``cut`` policy).

        A stage that only removes documents writes an empty file. Later sets win: the second
        decontamination pass saw the first pass's cuts.
        """
        texts: dict[str, dict] = {}
        for kept in kept_sets:
            if kept is None or "bytes" not in kept.schema().names:
                continue
            for t in kept.map_batches(_changed_texts, batch_format="pyarrow").iter_batches(batch_format="pyarrow"):
                for row in t.to_pylist():
                    texts[row["id"]] = row
        rows = sorted(texts.values(), key=lambda r: r["order"])
        out = ParquetPart(self.wd.path("overrides", stage, "all.parquet"), OVERRIDE_SCHEMA)
        out.write(pa.Table.from_pylist(rows, schema=OVERRIDE_SCHEMA))
        out.commit()

    def override_files(self) -> list[str]:
        return [p for s in self.global_stages if os.path.exists(p := self.wd.path("overrides", s, "all.parquet"))]

    def _tokenizer(self, removed_files: list[str]) -> str:
        cfg = self.job.tokenizer
        if cfg.path:
            load_tokenizer(cfg.path, cfg.eos_token)  # fail now, not in a worker, if it is unusable
            return cfg.path
        path = self.wd.path("tokenizer.json")
        if self.wd.done("tokenizer", "train") is not None:
            return path
        t0 = time.perf_counter()
        self.timings["tokenizer_training"] = {"seconds": 0.0}
        sample = list(self._sample_texts(removed_files, cfg.sample_bytes, self.override_files()))
        self.log(f"[tokenizer] training byte-level BPE (vocab {cfg.vocab_size}) on {len(sample):,} documents")
        tmp = path + ".tmp.json"
        train_bpe(sample, cfg, tmp)
        os.replace(tmp, path)
        self.wd.mark_done("tokenizer", "train", {"documents": len(sample), "seconds": time.perf_counter() - t0})
        self.timings["tokenizer_training"] = {"seconds": time.perf_counter() - t0}
        return path

    def _sample_texts(self, removed_files: list[str], budget: int, override_files: list[str]):
        """The first surviving documents in global order, up to ``budget`` bytes."""
        for t, f in zip(self.tasks, self.docs_files()):
            drop = removed_ids(removed_files, t["part"])
            new_text = overridden_texts(override_files, t["part"])
            for batch in pq.ParquetFile(f).iter_batches(columns=["id", "text", "bytes"], batch_size=1024):
                for doc_id, text, n in zip(*(batch.column(i).to_pylist() for i in range(3))):
                    if doc_id in drop:
                        continue
                    if budget <= 0:
                        return
                    yield new_text.get(doc_id, text)
                    budget -= n

    def _tokenize(self, ray, tok_path: str, removed_files: list[str]) -> list[dict]:
        t0 = time.perf_counter()
        job, root, overrides = self.job, self.wd.root, self.override_files()
        parts = [t["part"] for t in self.tasks]
        todo = [{"part": p} for p in parts if self.wd.done("tokenize", part_name(p)) is None]
        self.log(f"[tokenize] {len(parts) - len(todo)} of {len(parts)} partitions already done")
        _map_partitions(ray, "tokenize", todo,
                        lambda t: tokenize_partition(t["part"], tok_path, job.tokenizer, job.split, root, removed_files, overrides),
                        job.ray.concurrency, self.progress)
        self.timings["tokenize"] = {"seconds": time.perf_counter() - t0, "resumed_parts": len(parts) - len(todo)}
        return [self.wd.done("tokenize", part_name(p)) for p in parts]

    def _pack_and_publish(self, tok_path, extract_stats, global_stats, tok_stats, eval_sets) -> RunResult:
        job = self.job
        t0 = time.perf_counter()
        staging = self.wd.path("staging")
        shutil.rmtree(staging, ignore_errors=True)  # a killed pack is redone from scratch: it is cheap
        _, vocab, eos_id = load_tokenizer(tok_path, job.tokenizer.eos_token)
        builder = DatasetBuilder(staging, dataset=job.output.dataset, seq_len=job.pack.seq_len, tokenizer_json=tok_path,
                                 vocab_size=vocab, eos_id=eos_id)
        token_files = [self.wd.path("tokens", f"{part_name(t['part'])}.parquet") for t in self.tasks]
        pack_stats = {}
        with builder.doc_index_writer() as index:
            for split in ("train", "validation"):
                pack_stats[split] = pack_split(builder, token_files, split, job.pack.seq_len, job.pack.shard_bytes, index)
        self.timings["pack"] = {"seconds": time.perf_counter() - t0, "resumed_parts": 0}
        t0 = time.perf_counter()
        stats = rep.manifest_stats(extract_stats, global_stats, tok_stats, pack_stats, self.global_stages)
        inputs = [Input(f["uri"], f["bytes"], f["sha256"]) for s in extract_stats for f in s["inputs"]]
        manifest = builder.manifest(inputs=inputs, config=job.content_dict(), code_version=code_version(), stats=stats,
                                    eval_sets=[EvalSet(**e) for e in eval_sets])
        published = ManifestStore(job.output.store).publish(manifest, staging)
        self.timings["publish"] = {"seconds": time.perf_counter() - t0, "resumed_parts": 0}
        self.timings["total"]["seconds"] = time.perf_counter() - self.timings["total"]["start"]
        report = rep.build_report(stats, extract_stats, tok_stats, self.timings, published, self.wd.root)
        self._write_outputs(report)
        return RunResult(published.manifest.sha256, published.url, published.manifest.version, report, self.wd.root)

    def _write_outputs(self, report: dict) -> None:
        """report.json, plus the quarantine and removed records as JSONL for people to read."""
        atomic_write(self.wd.path("report.json"), (json.dumps(report, indent=1, sort_keys=True) + "\n").encode())
        rep.export_jsonl([self.wd.path("quarantine", f"{part_name(t['part'])}.parquet") for t in self.tasks],
                         self.wd.path("quarantine.jsonl"))
        removed = [self.wd.path("removed", "language", f"{part_name(t['part'])}.parquet") for t in self.tasks]
        for stage in self.global_stages:
            removed += sorted(_glob.glob(self.wd.path("removed", stage, "*.parquet")))
        rep.export_jsonl(removed, self.wd.path("removed.jsonl"))


def _stage_docs(stage: str, s: dict) -> int:
    return s["extract"]["records"] if stage == "extract" else s.get("documents_in", 0)


def _stage_bytes(stage: str, s: dict) -> int:
    return sum(f["bytes"] for f in s["inputs"]) if stage == "extract" else s.get("bytes_in", 0)


def _add_counts(into: dict, counts: dict) -> None:
    for k, v in counts.items():
        into[k] = into.get(k, 0) + v


def _changed_texts(batch: pa.Table) -> pa.Table:
    """Rows whose text is no longer the extracted one (its UTF-8 length differs from ``bytes``)."""
    lengths = [len(t.encode()) if t is not None else -1 for t in batch.column("text").to_pylist()]
    changed = pa.array([n != b for n, b in zip(lengths, batch.column("bytes").to_pylist())], pa.bool_())
    return batch.filter(changed).select(OVERRIDE_SCHEMA.names).cast(OVERRIDE_SCHEMA)


def _drop_removed(batch: pa.Table, removed_files: tuple[str, ...]) -> pa.Table:
    parts = set(batch.column("part").to_pylist())
    drop = set().union(*(_removed_ids_cached(removed_files, p) for p in parts)) if parts else set()
    if not drop:
        return batch
    return batch.filter(pa.array([i not in drop for i in batch.column("id").to_pylist()], pa.bool_()))


_CACHE: dict = {}


def _removed_ids_cached(files: tuple[str, ...], part: int) -> set[str]:
    key = (files, part)
    if key not in _CACHE:
        if len(_CACHE) > 64:  # bounded: a worker sees batches of a few partitions at a time
            _CACHE.clear()
        _CACHE[key] = removed_ids(list(files), part)
    return _CACHE[key]


def _collect_removed(ds) -> pa.Table | None:
    """A stage's removed rows, in the driver (they are the minority of documents)."""
    if ds is None:
        return None
    if isinstance(ds, pa.Table):
        return ds
    tables = [b for b in ds.iter_batches(batch_format="pyarrow", batch_size=8192) if b.num_rows]
    return pa.concat_tables(tables, promote_options="default") if tables else None


def prepare(job: JobConfig, *, address: str | None = None, quiet: bool = False) -> RunResult:
    return Executor(job, address=address, quiet=quiet).run()
