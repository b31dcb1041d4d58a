"""The stages of ``gristmill prepare``, behind the one interface the executor knows.

A stage has a ``name``, the job section that configures it, a ``kind`` (``map``: a task per
partition; ``global``: tasks over hash ranges or ranges of partitions) and ``run(ctx)``, which
runs its tasks through ``ctx.run_tasks`` and returns its statistics. A stage that removes
documents (``removes = True``) writes them to ``removed/<name>/*.parquet`` (REMOVED_SCHEMA,
sorted by ``order``) and texts it shortened to ``overrides/<name>/*.parquet``; later stages
read partitions through ``pipeline.survivors`` with those files. Each stage owns its own
bookkeeping (exact dedup's keys, fuzzy dedup's bands and edges, decontamination's index).

``build(job)`` is the fixed order, each stage present when the job enables it:

    extract (+ language) -> unique_ids (jobs with an id_field) -> exact_dedup -> quality -> fuzzy_dedup -> decontaminate -> pii -> tokenizer -> tokenize -> pack
"""
from __future__ import annotations

import functools
import glob
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Literal

from gristmill.manifests import DatasetBuilder, FileRef, Shard
from gristmill.manifests.builder import DOC_INDEX_FILE

from . import decontam, exact_dedup, fuzzy_dedup, pack, pii, unique_ids
from . import quality as quality_rules
from .quality import classifier as quality_classifier
from .quality.task import partition_task as quality_task
from .config import JobConfig
from .extract import extract_partition
from .progress import Progress
from .tasks import run_tasks
from .tokenize import load_tokenizer, tokenize_partition, train_bpe
from .survivors import surviving_docs
from .workdir import WorkDir, part_name


@dataclass
class Context:
    """What a stage may use: the job, the work dir, Ray, the partitions, and what ran before."""

    job: JobConfig
    wd: WorkDir
    ray: object
    partitions: list[dict]
    progress: Progress
    log: Callable[[str], None]
    results: dict = field(default_factory=dict)  # stage name -> its stats
    timings: dict = field(default_factory=dict)
    removed_files: list[str] = field(default_factory=list)  # every removal so far (REMOVED_SCHEMA files)
    override_files: list[str] = field(default_factory=list)  # every text override so far, later ones win
    task_cpu_seconds: float = 0.0
    resumed_tasks: int = 0  # tasks found finished (marker present) when their step started

    @property
    def root(self) -> str:
        return self.wd.root

    def docs_files(self) -> list[str]:
        return [self.wd.path("docs", f"{part_name(t['part'])}.parquet") for t in self.partitions]

    def run_tasks(self, step: str, items: list[dict], fn, measure=None) -> list[dict]:
        self.resumed_tasks += sum(os.path.exists(self.wd.marker(step, it["name"])) for it in items)
        out = run_tasks(self.ray, self.wd, step, items, fn, progress=self.progress, measure=measure,
                        max_in_flight=self.job.ray.concurrency)
        self.task_cpu_seconds += sum(s.get("_cpu_seconds", 0.0) for s in out)
        return out

    def cpu_seconds(self) -> float:
        """The driver's CPU time plus that of every task run so far (resumed ones as recorded)."""
        return time.process_time() + self.task_cpu_seconds

    def add_outputs(self, stage: str, pattern: str = "*.parquet") -> None:
        self.removed_files += sorted(glob.glob(self.wd.path("removed", stage, pattern)))
        self.override_files += sorted(glob.glob(self.wd.path("overrides", stage, pattern)))


class Stage:
    name: str
    section: str | None = None  # the job section that configures it
    kind: Literal["map", "global"] = "map"
    removes = False  # reports documents removed (counted in the accounting as `removed`)

    def run(self, ctx: Context):
        raise NotImplementedError


def _tasks_per_partition(ctx: Context, **extra) -> list[dict]:
    return [{"name": part_name(t["part"]), "part": t["part"], **extra} for t in ctx.partitions]


def _merge_removed(stats: list[dict]) -> tuple[dict, int]:
    removed: dict[str, int] = {}
    for s in stats:
        for k, v in s["removed"].items():
            removed[k] = removed.get(k, 0) + v
    return removed, sum(s["removed_bytes"] for s in stats)


class Extract(Stage):
    """Read every input record, quarantine the unreadable, identify the language (fused: one pass)."""
    name, section, kind = "extract", "extract", "map"

    def run(self, ctx):
        job = ctx.job
        fn = functools.partial(extract_partition, extract=job.extract, language=job.language, work_root=ctx.root,
                               batch_rows=job.ray.records_per_batch)
        # each file with its input entry's own minimum length and language threshold (per source)
        items = [{"name": part_name(t["part"]), **t, "check_ids": needs_id_check(job),  # [inputs, issue 26]
                  "files": [{**f, "min_chars": job.inputs[f["input"]].min_chars,
                                                               "language_threshold": job.inputs[f["input"]].language_threshold}
                                                              for f in t["files"]]} for t in ctx.partitions]
        stats = ctx.run_tasks("extract", items, fn,
                              measure=lambda s: (s["extract"]["records"], sum(f["bytes"] for f in s["inputs"])))
        ctx.add_outputs("language")
        return stats


def needs_id_check(job: JobConfig) -> bool:
    """[inputs, issue 26] Ids come from the data (some input has an id_field): check they are unique."""
    return any(spec.id_field is not None for spec in job.inputs)


class UniqueIds(Stage):
    """[inputs, issue 26] An id more than one record carries keeps none of them (pipeline/unique_ids.py)."""
    name, section, kind, removes = "unique_ids", None, "global", True

    def run(self, ctx):
        total = sum(s["language"]["documents_in"] for s in ctx.results["extract"])
        id_files = [ctx.wd.path("ids", f"{part_name(t['part'])}.parquet") for t in ctx.partitions]
        items = [{**t, "name": f"task-{t['task']:03d}"} for t in unique_ids.plan_tasks(total)]
        stats = ctx.run_tasks("unique_ids", items, functools.partial(unique_ids.check_task, id_files=id_files,
                                                                     work_root=ctx.root))
        removed, nbytes = _merge_removed(stats)
        ctx.add_outputs(self.name)
        return {"removed": removed, "removed_bytes": nbytes, "detail": {}}


class ExactDedup(Stage):
    """Ray tasks over hash-bucket ranges of the keys extract wrote; the text never moves."""
    name, section, kind, removes = "exact_dedup", "exact_dedup", "global", True

    def run(self, ctx):
        total = sum(s["language"]["documents_out"] for s in ctx.results["extract"])
        key_files = [ctx.wd.path("keys", f"{part_name(t['part'])}.parquet") for t in ctx.partitions]
        items = [{**t, "name": f"task-{t['task']:03d}"} for t in exact_dedup.plan_tasks(total)]
        stats = ctx.run_tasks("exact_dedup", items, functools.partial(exact_dedup.dedup_task, key_files=key_files,
                                                                      work_root=ctx.root,  # [inputs, issue 26]
                                                                      exclude_files=sorted(glob.glob(ctx.wd.path(
                                                                          "removed", unique_ids.STAGE, "*.parquet")))))
        removed, nbytes = _merge_removed(stats)
        ctx.add_outputs(self.name)
        return {"removed": removed, "removed_bytes": nbytes, "detail": {}}


class Quality(Stage):
    """Heuristic and classifier quality rules per partition (pipeline/quality/, docs/quality.md);
    each input entry may carry its own settings (``JobConfig.quality_for``)."""
    name, section, kind, removes = "quality", "quality", "map", True

    def __init__(self, job: JobConfig):
        self.configs = [job.quality_for(i) for i in range(len(job.inputs))]
        for cfg in {c.classifier for c in self.configs if c.classifier is not None}:
            quality_classifier.check_label(cfg)  # a wrong model or label fails now, not in a worker

    def run(self, ctx):
        names = list(dict.fromkeys(m for c in self.configs for m in quality_rules.metric_names(c)))
        items = [{**it, "docs": d, "sources": {f["uri"]: f["input"] for f in t["files"]}}
                 for it, d, t in zip(_tasks_per_partition(ctx), ctx.docs_files(), ctx.partitions)]
        fn = functools.partial(quality_task, configs=[c.to_dict() for c in self.configs], names=names, root=ctx.root,
                               removed_files=list(ctx.removed_files), override_files=list(ctx.override_files))
        stats = ctx.run_tasks("quality", items, fn)
        removed, nbytes = _merge_removed(stats)
        ctx.add_outputs(self.name)
        return {"removed": removed, "removed_bytes": nbytes,
                "detail": {"metrics": names, "texts_shortened": sum(s["texts_shortened"] for s in stats)}}


class FuzzyDedup(Stage):
    """MinHash + LSH near-duplicates over partition files (pipeline.fuzzy_dedup)."""
    name, section, kind, removes = "fuzzy_dedup", "fuzzy_dedup", "global", True

    def __init__(self, cfg):
        self.cfg = cfg

    def run(self, ctx):
        out = fuzzy_dedup.find_near_duplicates(ctx.run_tasks, ctx.root, ctx.docs_files(), list(ctx.removed_files), self.cfg,
                                               override_files=list(ctx.override_files))
        ctx.add_outputs(self.name)
        return out


class Decontaminate(Stage):
    """A per-partition map against the eval n-gram index (built once on the driver from the
    small eval files, cached in the work dir); then, optionally, against the validation split."""
    name, section, kind, removes = "decontaminate", "decontaminate", "map", True

    def __init__(self, cfg):
        self.cfg = cfg

    def run(self, ctx):
        cfg, split = self.cfg, ctx.job.split
        loaded = decontam.load_eval_sets(cfg)
        index = decontam.build_eval_index(cfg, loaded, ctx.root)
        index_path = decontam.eval_index_path(cfg, loaded, ctx.root)
        first = self._pass(ctx, "decontaminate", index_path, "", None)
        detail = decontam.report(index, cfg, [r for r, _ in loaded], [f for s in first for f in s["found"]])
        stats = list(first)
        # The validation pass sees the eval pass's cuts and removals, and only those: on a rerun a
        # validation task killed after committing its files must not read them as removals.
        ctx.add_outputs(self.name, "part-*.parquet")
        if cfg.against_validation and split.validation_fraction > 0:
            items = [{**it, "docs": d, "out": f"decontam/validation/{it['name']}.parquet"}
                     for it, d in zip(_tasks_per_partition(ctx), ctx.docs_files())]
            ctx.run_tasks("decontaminate.validation_docs", items, functools.partial(
                decontam.validation_docs_task, root=ctx.root, removed_files=list(ctx.removed_files),
                override_files=list(ctx.override_files), split=split))
            (built,) = ctx.run_tasks("decontaminate.validation_index", [{"name": "index", "out": "decontam/validation.npz"}],
                                     functools.partial(decontam.validation_index_task, cfg=cfg, root=ctx.root,
                                                       files=[ctx.wd.path(it["out"]) for it in items]))
            val_path = ctx.wd.path("decontam", "validation.npz")
            pruned = None
            if cfg.validation_max_doc_freq is not None:  # boilerplate is not overlap: count, in tasks, then prune
                df_items = [{**it, "out": f"decontam/validation_df/{it['name']}.parquet"} for it in items]
                ctx.run_tasks("decontaminate.validation_df", df_items, functools.partial(
                    decontam.document_frequency_task, root=ctx.root, index_path=val_path,
                    removed_files=list(ctx.removed_files), override_files=list(ctx.override_files)))
                (pruned,) = ctx.run_tasks("decontaminate.validation_prune", [{"name": "prune", "out": "decontam/validation-pruned.npz"}],
                                          functools.partial(decontam.prune_index_task, root=ctx.root, index_path=val_path,
                                                            files=[ctx.wd.path(it["out"]) for it in df_items],
                                                            max_doc_freq=cfg.validation_max_doc_freq))
                val_path = ctx.wd.path("decontam", "validation-pruned.npz")
            second = self._pass(ctx, "decontaminate.validation", val_path, "val-", split)
            (val,) = ctx.run_tasks("decontaminate.validation_report", [{"name": "report"}], functools.partial(
                decontam.report_task, cfg=cfg, index_path=val_path, records=[built["record"]],
                found=[f for s in second for f in s["found"]]))
            val_detail = {**val["report"], "boilerplate_ngrams": pruned["boilerplate_ngrams"] if pruned else None,
                          "max_doc_freq": cfg.validation_max_doc_freq}
            detail = {**detail, "against_validation": val_detail,
                      "eval_sets": list(detail.get("eval_sets", [])) + list(val_detail.get("eval_sets", []))}
            stats += second
            ctx.add_outputs(self.name, "val-*.parquet")
        removed, nbytes = _merge_removed(stats)
        return {"removed": removed, "removed_bytes": nbytes, "detail": detail}

    def _pass(self, ctx, step, index_path, prefix, split):
        items = [{**it, "docs": d, "removed": f"removed/{self.name}/{prefix}{it['name']}.parquet",
                  "overrides": f"overrides/{self.name}/{prefix}{it['name']}.parquet"}
                 for it, d in zip(_tasks_per_partition(ctx), ctx.docs_files())]
        fn = functools.partial(decontam.partition_task, cfg=self.cfg, index_path=index_path, root=ctx.root,
                               removed_files=list(ctx.removed_files), override_files=list(ctx.override_files), split=split)
        return ctx.run_tasks(step, items, fn)


class Pii(Stage):
    """Placeholders for e-mails, IPs and phone numbers (pipeline.pii), a task per partition.
    It removes nothing; it takes the removing stages' place in the manifest's stage table
    (``removes``) so its replacement counts are part of the published statistics."""
    name, section, kind, removes = "pii", "pii", "map", True

    def __init__(self, cfg):
        self.cfg = cfg

    def run(self, ctx):
        items = [{**it, "docs": d, "out": f"overrides/{self.name}/{it['name']}.parquet"}
                 for it, d in zip(_tasks_per_partition(ctx), ctx.docs_files())]
        stats = ctx.run_tasks(self.name, items, functools.partial(
            pii.pii_task, cfg=self.cfg, root=ctx.root, removed_files=list(ctx.removed_files),
            override_files=list(ctx.override_files)))
        ctx.add_outputs(self.name)
        counts = {k: sum(s["replacements"][k] for s in stats) for k in pii.KINDS}
        kinds = [k for k, on in zip(pii.KINDS, (self.cfg.emails, self.cfg.ips, self.cfg.phones)) if on]
        return {"removed": {}, "removed_bytes": 0, "detail": {
            "replacements": {k: counts[k] for k in kinds},
            "documents_changed": sum(s["documents_changed"] for s in stats)}}


def _sample_texts(docs_files: list[str], removed_files: list[str], override_files: list[str], budget: int):
    """The first surviving documents in global order, up to ``budget`` bytes."""
    for part, f in enumerate(docs_files):
        for t in surviving_docs(f, part, removed_files, override_files, ["id", "text", "bytes"], 1024):
            for text, n in zip(t.column("text").to_pylist(), t.column("bytes").to_pylist()):
                if budget <= 0:
                    return
                yield text
                budget -= n


def _train_tokenizer(item: dict, cfg, root: str, docs_files, removed_files, override_files) -> dict:
    sample = list(_sample_texts(docs_files, removed_files, override_files, cfg.sample_bytes))
    path = os.path.join(root, item["out"])
    tmp = path + ".tmp.json"
    train_bpe(sample, cfg, tmp)
    os.replace(tmp, path)
    return {"documents": len(sample)}


class Tokenizer(Stage):
    """The job's tokenizer.json, or a byte-level BPE trained (in one task) on the first documents."""
    name, section, kind = "tokenizer", "tokenizer", "global"

    def run(self, ctx):
        cfg = ctx.job.tokenizer
        if cfg.path:
            load_tokenizer(cfg.path, cfg.eos_token)  # fail now, not in a worker, if it is unusable
            return {"path": cfg.path}
        ctx.log(f"[tokenizer] training byte-level BPE (vocab {cfg.vocab_size}) on up to {cfg.sample_bytes:,} bytes")
        ctx.run_tasks("tokenizer", [{"name": "train", "out": "tokenizer.json"}],
                      functools.partial(_train_tokenizer, cfg=cfg, root=ctx.root, docs_files=ctx.docs_files(),
                                        removed_files=list(ctx.removed_files), override_files=list(ctx.override_files)))
        return {"path": ctx.wd.path("tokenizer.json")}


class Tokenize(Stage):
    name, section, kind = "tokenize", "tokenizer", "map"

    def run(self, ctx):
        job = ctx.job
        fn = functools.partial(_tokenize_task, tokenizer_path=ctx.results["tokenizer"]["path"], cfg=job.tokenizer,
                               split=job.split, work_root=ctx.root, removed_files=list(ctx.removed_files),
                               override_files=list(ctx.override_files))
        return ctx.run_tasks("tokenize", _tasks_per_partition(ctx), fn)


def _tokenize_task(item, tokenizer_path, cfg, split, work_root, removed_files, override_files):
    return tokenize_partition(item["part"], tokenizer_path, cfg, split, work_root, removed_files, override_files)


class Pack(Stage):
    """Fixed ranges of partitions packed in parallel; then one task merges the document index."""
    name, section, kind = "pack", "pack", "global"

    def run(self, ctx):
        job = ctx.job
        tok_path = ctx.results["tokenizer"]["path"]
        _, vocab, eos_id = load_tokenizer(tok_path, job.tokenizer.eos_token)
        staging = ctx.wd.path("staging")
        builder = DatasetBuilder(staging, dataset=job.output.dataset, seq_len=job.pack.seq_len, tokenizer_json=tok_path,
                                 vocab_size=vocab, eos_id=eos_id)
        tokens = {split: [s["splits"][split]["tokens"] for s in ctx.results["tokenize"]] for split in pack.SPLITS}
        token_files = [ctx.wd.path("tokens", f"{part_name(t['part'])}.parquet") for t in ctx.partitions]
        items = pack.plan_ranges(tokens, job.pack.range_tokens)  # every train range, then every validation one
        out = ctx.run_tasks("pack", items, functools.partial(
            pack.pack_range_task, token_files=token_files, staging=staging, index_dir=ctx.wd.path("pack_index"),
            seq_len=job.pack.seq_len, shard_bytes=job.pack.shard_bytes, vocab_size=vocab))
        shards, slices = [], []
        split_stats = {split: {"documents": 0, "tokens_in": 0, "rows": 0, "shards": 0, "tokens_dropped_tail": 0}
                       for split in pack.SPLITS}
        for o in out:  # manifest order: the items' order
            slices.append((o["index"], len(shards)))
            shards += [Shard(**s) for s in o["shards"]]
            for k, v in o["stats"].items():
                split_stats[o["split"]][k] += v
        (merged,) = ctx.run_tasks("pack.doc_index", [{"name": "merge"}], functools.partial(
            pack.merge_doc_index, slices=slices, out_path=os.path.join(staging, DOC_INDEX_FILE)))
        builder.shards = shards
        builder.doc_index = FileRef(DOC_INDEX_FILE, merged["sha256"], merged["bytes"], merged["rows"])
        return {"stats": split_stats, "builder": builder}


def build(job: JobConfig) -> list[Stage]:
    """The stages this job runs, in order (every section was validated with the job)."""
    stages: list[Stage] = [Extract()]
    if needs_id_check(job):  # [inputs, issue 26]
        stages.append(UniqueIds())
    if job.exact_dedup.enabled:
        stages.append(ExactDedup())
    if job.quality is not None and job.quality.enabled:
        stages.append(Quality(job))
    for cls in (FuzzyDedup, Decontaminate, Pii):  # optional typed sections: absent or enabled: false skips
        section = getattr(job, cls.section)
        if section is not None and section.enabled:
            stages.append(cls(section))
    return stages + [Tokenizer(), Tokenize(), Pack()]
