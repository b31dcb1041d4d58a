"""The job file of ``gristmill prepare``: one pydantic model per section (`gristmill.config`).

The job's sections that are no stage's (inputs, output, work_dir, partitioning, runner) are here;
every stage section is its stage's own (``pipeline/stages/<name>/config.py``) and ``PrepareConfig``
is derived from ``STAGES`` (``job_model``): each stage declares its ``section``, its ``config`` type and
its ``default``, and the job holds those sections in stage order, between ``work_dir_options`` and
``partitioning``. A section whose default is None (``quality``, ``fuzzy_dedup``, ``decontaminate``)
turns its stage on when present (``{}`` too) and not ``enabled: false``.
Errors read ``section.key: expected ..., got ...``. The parsed job is also recorded in the
manifest, so every default is written out explicitly (``content_dict``).
"""
from __future__ import annotations

from typing import Annotated, Any, Iterable, Literal

from pydantic import Field, ValidationError, ValidationInfo, create_model, field_validator, model_validator
from pydantic_core import PydanticCustomError

from gristmill.config import Float, NonNegativeInt, PositiveInt, ResolvedPath, Section, Str, fail, no_format
from gristmill.config import _resolve
from gristmill.config import load as _load
from gristmill.manifests.storage import Store
from gristmill.manifests.store import DATASET_NAME
from .runners import AUTO_OPTIONS, RUNNERS
from .runners import KINDS as RUNNER_KINDS
from .stages import STAGES, job_sections
from .stages.quality.config import QualityConfig, merge

Format = Literal["jsonl", "parquet", "text", "warc"]
FORMATS = Format.__args__


class InputSpec(Section):
    path: Annotated[ResolvedPath, Field(min_length=1)]  # fsspec path or glob
    format: Format  # guessed from the extension when omitted
    text_field: Str = "text"  # jsonl / parquet
    id_field: Str | None = None  # jsonl / parquet: use this field as the doc id (else derived from provenance)
    text_format: Literal["text", "html"] = "text"  # jsonl / parquet: html runs text_field through the HTML extractor
    url_field: Str = "url"  # jsonl / parquet: this field, where a record has it, is the document's `url` (provenance)
    # Per-source settings (docs/pipeline.md): null = the job-wide section's value.
    min_chars: PositiveInt | None = None  # extract.min_chars for these files
    language_threshold: Annotated[Float, Field(ge=0, le=1)] | None = None  # language.threshold for these files
    quality: dict[str, Any] | None = None  # keys of the quality section, merged onto it for these files
    # fsspec storage options of path's filesystem (an endpoint, credentials): listing, hashing and
    # reading these files go through one store opened with them. Not content: never in the manifest
    storage_options: dict[str, Any] = {}
    # A file matched under path's folder that resolves outside it through a symlink is quarantined
    # unread (``symlink_outside_root``): a downloaded corpus may link to ~/.ssh (docs/security.md).
    # true: such links are followed wherever they point.
    follow_symlinks: bool = False

    def store(self) -> Store:
        """The store these files are listed and read through, opened with ``storage_options``."""
        return Store.from_url(self.path, **self.storage_options)

    @field_validator("quality")
    @classmethod
    def _classifier_path(cls, v: dict | None, info: ValidationInfo) -> dict | None:
        # validated only once merged (PrepareConfig.quality_for), so the one path in it resolves here
        c = (v or {}).get("classifier")
        if isinstance(c, dict) and isinstance(c.get("path"), str):
            v = merge(v, {"classifier": {"path": _resolve(c["path"], info)}})
        return v

    @model_validator(mode="after")
    def _html_fields_only(self) -> "InputSpec":
        # a text file is plain text and a WARC's responses go through the HTML extractor anyway:
        # html there would be ignored, so it is refused
        if self.text_format == "html" and self.format not in ("jsonl", "parquet"):
            fail("text_format: text on a text or warc input (html is for a jsonl or parquet text_field)",
                 f"'html' on a {self.format} input", at=("text_format",))
        return self

    @model_validator(mode="before")
    @classmethod
    def _guess_format(cls, d: Any) -> Any:
        if isinstance(d, str):
            d = {"path": d}
        if isinstance(d, dict) and d.get("format") is None and isinstance(d.get("path"), str) and d["path"]:
            d = {**d, "format": guess_format(d["path"])}
        return d


def guess_format(path: str) -> str:
    """From the extension; a glob like ``*.jsonl*`` (plain, .gz and .zst) counts too."""
    name = path.lower().rsplit("/", 1)[-1]
    for marker, fmt in ((".warc", "warc"), (".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "jsonl"),
                        (".parquet", "parquet"), (".txt", "text")):
        if marker in name:
            return fmt
    fail(f"one of {', '.join(FORMATS)}", no_format(path), at=("format",))


class OutputConfig(Section):
    store: Annotated[ResolvedPath, Field(min_length=1)]  # fsspec root of the manifest store
    dataset: Str  # a name, never a path: it becomes one directory under the store
    report_html: bool = True  # write report.html (the data card, gristmill.report) beside report.json at the end
    # A run that keeps no document is refused (nothing published, exit 2) unless this says an empty
    # version is wanted (docs/pipeline.md "A run that keeps nothing").
    allow_empty: bool = False
    # fsspec storage options of the store's filesystem (an endpoint, credentials): the write probe,
    # the publish and the data card's read go through one store opened with them; never in the manifest
    storage_options: dict[str, Any] = {}

    @field_validator("dataset")
    @classmethod
    def _name(cls, v: str) -> str:
        # Checked here, not only when publishing: `../evil` or `a/b` must fail before any work.
        if not DATASET_NAME.fullmatch(v):
            fail(f"a dataset name matching {DATASET_NAME.pattern} (one directory: no '/', not '.' or '..')", repr(v))
        return v


class RunnerConfig(Section):
    """Who runs the tasks (``pipeline.runners``): ``kind`` one of the registered runners, or
    ``auto``: Ray when a cluster is named (``--address``, ``address``, RAY_ADDRESS), else ``local``.
    Parallelism only: nothing here changes the output (docs/pipeline.md, determinism). A key the
    chosen runner does not read is refused (``local``: num_cpus, concurrency, max_retries)."""

    kind: Literal[RUNNER_KINDS] = "auto"
    address: Str | None = None  # ray: a cluster to join (--address overrides it); null: RAY_ADDRESS, else embedded
    num_cpus: PositiveInt | None = None  # workers on this machine (local runner, embedded Ray); None = its CPUs
    concurrency: PositiveInt | None = None  # batches of tasks in flight; None = two per worker or cluster CPU
    # A task whose worker or node dies (OOM killer, a preempted node) is run again up to this
    # many times; an exception a task raises is not retried (a deterministic bug fails at once).
    max_retries: NonNegativeInt = 3
    object_store_mb: PositiveInt = 128  # embedded local Ray only: its object store (tasks pass a few KB)
    # ray with a cluster named: how long its host:port may not answer before the run fails in one line
    # (Ray itself retried for minutes, silently); raise it where the cluster is still starting
    connect_timeout_s: PositiveInt = 60

    @model_validator(mode="before")
    @classmethod
    def _kind_alone(cls, d: Any) -> Any:
        return {"kind": d} if isinstance(d, str) else d

    @model_validator(mode="after")
    def _options_of_the_kind(self) -> "RunnerConfig":
        reads = AUTO_OPTIONS if self.kind == "auto" else RUNNERS[self.kind].options
        for key in self.model_fields_set - {"kind"} - set(reads):
            fail(f"only the keys runner kind {self.kind} reads ({', '.join(reads) or 'none'})", f"{key}", at=(key,))
        return self


class PartitioningConfig(Section):
    # Parallelism only, like runner: (the output does not depend on either). Consecutive small
    # input files share a partition (one task) up to this many input bytes, so a corpus of many
    # small files does not pay a task's fixed cost per file; a larger file is a partition of its own.
    partition_bytes: PositiveInt = 1 << 20
    records_per_batch: PositiveInt = 1024  # documents per language-ID/write batch inside a task


# The ray: section of earlier versions, split into runner: and partitioning: (a job naming it is
# refused with the new keys, never half-read).
MOVED_RAY_KEYS = {"runner": "runner.kind", "num_cpus": "runner.num_cpus", "concurrency": "runner.concurrency",
                  "max_retries": "runner.max_retries", "object_store_mb": "runner.object_store_mb",
                  "partition_bytes": "partitioning.partition_bytes", "records_per_batch": "partitioning.records_per_batch"}


class JobBase(Section):
    """The sections of a job that are no stage's own, and what reads across sections; ``job_model``
    adds the stages' sections after ``work_dir_options`` and ``JOB_TAIL`` after those."""

    inputs: Annotated[tuple[InputSpec, ...], Field(min_length=1)]  # each a path/glob or a mapping with path:
    output: OutputConfig
    work_dir: Annotated[ResolvedPath, Field(min_length=1)]  # resumable stage outputs: a directory or fsspec URL (s3://)
    # fsspec storage options of work_dir's filesystem (an endpoint, credentials, ``anon``): every read
    # and write of the run dir goes through one store opened with them (manifests/storage.py)
    work_dir_options: dict[str, Any] = {}

    @model_validator(mode="before")
    @classmethod
    def _no_ray_section(cls, d: Any) -> Any:
        if isinstance(d, dict) and "ray" in d:
            keys = d["ray"] if isinstance(d["ray"], dict) else {}
            moved = ", ".join(f"ray.{k} -> {MOVED_RAY_KEYS[k]}" for k in keys if k in MOVED_RAY_KEYS)
            fail("runner: and partitioning: sections (ray: was split in two)",
                 f"a ray: section; move its keys: {moved or ', '.join(f'ray.{k} -> {v}' for k, v in MOVED_RAY_KEYS.items())}",
                 at=("ray",))
        return d

    @field_validator("inputs", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, (str, dict)) else v

    @model_validator(mode="after")
    def _per_source_quality(self) -> "JobBase":
        for i in range(len(self.inputs)):
            self.quality_for(i)
        return self

    def quality_for(self, i: int) -> QualityConfig | None:
        """The quality settings of ``inputs[i]``: the job's section with the entry's own keys merged on."""
        spec = self.inputs[i]
        quality = getattr(self, "quality", None)  # a job model without the quality stage has no section
        if spec.quality is None:
            return quality
        if quality is None or not quality.enabled:
            fail("a quality: section in the job (the stage is off without it)", f"quality settings for inputs[{i}]",
                 at=("inputs", i, "quality"))
        try:
            return QualityConfig.model_validate(merge(quality.to_dict(), spec.quality))
        except ValidationError as e:
            from gristmill.config import describe_error

            loc, msg = describe_error(QualityConfig, e.errors(include_url=False)[0])
            raise PydanticCustomError("config", "{msg}", {"msg": msg, "at": ("inputs", i, "quality", *loc)}) from None

    def content_dict(self) -> dict:
        """What determines the output: all but the work dir, the store root, the data card,
        parallelism and every storage option (work dir, inputs, eval sets, output store:
        credentials and endpoints are no content, and the manifest must never hold them)."""
        d = self.to_dict()
        d.pop("work_dir"), d.pop("work_dir_options"), d.pop("runner"), d.pop("partitioning")
        for spec in d["inputs"]:
            spec.pop("storage_options")
        if d["decontaminate"] is not None:
            for spec in d["decontaminate"]["eval_sets"]:
                spec.pop("storage_options")
        d["output"].pop("storage_options")
        d["output"].pop("store")  # where a version is published is not part of its content
        d["output"].pop("report_html")  # the data card is drawn beside report.json, not into the version
        d["output"].pop("allow_empty")  # a permission to publish, not a property of what is published
        d["tokenizer"].pop("encoder")  # how the ids are computed, not which: the same either way
        return d


# The sections after the stages' own: parallelism only (neither changes the output).
JOB_TAIL = {"partitioning": (PartitioningConfig, PartitioningConfig()), "runner": (RunnerConfig, RunnerConfig())}


def job_model(stages: Iterable[type] = STAGES, name: str = "PrepareConfig") -> type[JobBase]:
    """The job model of ``stages``: ``JobBase``, then each stage's sections in stage order (a section
    whose default is None is optional: ``<config> | None``), then ``JOB_TAIL``."""
    fields = {s.name: (s.type if s.default is not None else s.type | None, s.default) for s in job_sections(stages)}
    return create_model(name, __base__=JobBase, __module__=__name__, __doc__="The whole job, sections in stage order.",
                        **fields, **JOB_TAIL)


PrepareConfig = job_model()


def load_job(path: str, overrides: Iterable[str] = ()) -> PrepareConfig:
    """Parse a job YAML file with ``--set`` overrides. Relative paths in it are relative to the file's directory."""
    return _load(PrepareConfig, path, overrides)
