"""The one interface between the executor and a stage: ``Stage``, its ``Context`` and its ``StageResult``.

A stage class declares what it is; the executor reads the declarations and never names a stage:

- ``name``: its name in the report, the manifest's ``stats.stages`` and ``removed/<name>/``;
  ``names``: every name its rows and files go under, in order (extract's ``("extract", "language")``);
- ``section``, ``config`` and ``default``: its key in the job, that section's type (its folder's
  ``config.py``) and the value of an absent section: ``None`` (absent means off: the field is
  ``config | None``) or a default instance (``()`` for a list). ``PrepareConfig`` is derived from these
  (``pipeline.config.job_model``); ``more_sections``: further sections the stage owns, after its own
  (extract's ``language``), as ``JobSection``s. A section several stages declare is shared (tokenize
  reads ``tokenizer`` too): each names the same type, and it sits with the last of them;
- ``removes`` / ``rewrites``: whether it takes documents out of the run (``removed/<name>/``, a
  partition's rows of its block's file) or rewrites their texts (``overrides/<name>/``). From these (``verdicts()``) the executor
  advances ``ctx.survivors`` after the stage ran (``Context.run``): no stage does it by hand;
- ``from_job(job) -> Stage | None``: the one way in. It reads the job once and keeps what the stage
  needs; ``None`` when the job does not run the stage (its section absent or ``enabled: false``).
  ``run(ctx)`` reads only the stage itself and ``ctx`` (the work dir, the runner, the partitions,
  the survivors and the typed artifacts of earlier stages), never the job.

``run(ctx)`` runs its tasks through ``ctx.runner`` and returns a ``StageResult``: plain data
(counts, rows of the manifest's stage table, the dataset it packed) and, for later stages, one
typed ``artifact`` (a small frozen dataclass, e.g. ``tokenizer.TokenizerFile``) that they look up by
its type: ``ctx.artifact(TokenizerFile)``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, NamedTuple, TypeVar

from ..partitions import Partition
from ..runner import Runner
from ..stats import Accounting, Counts
from ..survivors import Survivors, Verdicts
from ..workdir import WorkDir, part_name

A = TypeVar("A")


class JobSection(NamedTuple):
    """A section of the job a stage declares: its key, its type and its value when the job omits it
    (None: absent means off)."""

    name: str
    type: Any
    default: Any


@dataclass(frozen=True)
class Packed:
    """The dataset a stage packed into ``staging``: what the manifest needs, as data."""

    staging: str
    dataset: str
    seq_len: int
    tokenizer_json: str
    vocab_size: int
    eos_id: int
    shards: tuple  # manifests.Shard, in manifest order
    doc_index: Any  # manifests.FileRef of the merged document index in ``staging``
    tokenizer_store: Any = None  # manifests.storage.Store of ``tokenizer_json`` (None: its URL's)
    encoder: str = ""  # the encoder tokenize ran and its version ("tiktoken 0.14.0"); the manifest records it


@dataclass
class StageResult:
    """What a stage hands back: data the executor publishes without knowing the stage.

    ``rows``: the stage's own rows of the manifest's stage table, as they are (extract's two,
    tokenize's, pack's). ``flow``: a stage in the document flow (it removes or rewrites
    documents): the executor writes its row with the documents in of the row before it;
    ``flow_start``: the (documents, bytes) that enter the flow after this stage (extract).
    """

    name: str
    rows: dict[str, dict] = field(default_factory=dict)
    flow: Counts | None = None
    flow_start: tuple[int, int] | None = None
    detail: dict = field(default_factory=dict)  # the flow row's detail (JSON-able)
    accounting: Accounting = field(default_factory=Accounting)
    inputs: list[dict] = field(default_factory=list)  # manifests.Input fields of the files read
    eval_sets: list[dict] = field(default_factory=list)  # manifests.EvalSet fields checked against
    dataset: Packed | None = None
    core_seconds: dict[str, float] = field(default_factory=dict)  # report.json: summed task seconds by row
    peak_rss_mb: dict[str, float] = field(default_factory=dict)  # report.json: a worker's peak by row
    artifact: Any = None  # what later stages read, a frozen dataclass: ``ctx.artifact(type)``
    dedup_index: tuple = ()  # manifests.FileRef of the version's dedup index files it wrote into ``staging``
    dedup_against: tuple = ()  # manifests.PinnedVersion of the earlier versions it deduplicated against
    removed_files: tuple[tuple[str, str], ...] = ()  # set by Context.run from the stage's verdicts: removed.jsonl


@dataclass
class Context:
    """What a stage may use: the work dir, the runner, the partitions, the documents still in the
    run and the artifacts of the stages before it."""

    wd: WorkDir
    runner: Runner
    partitions: list[Partition]
    log: Callable[[str], None] = lambda msg: None
    survivors: Survivors | None = None
    artifacts: dict[type, Any] = field(default_factory=dict)  # artifact type -> the one earlier stage's artifact

    def __post_init__(self):
        if self.survivors is None:
            self.survivors = Survivors(self.wd)

    def run(self, stage: "Stage") -> StageResult:
        """``stage.run(self)``, then what every stage's run implies, from its declarations: its
        artifact kept for the stages after it, the survivors advanced past its verdicts, and its
        removal files named for removed.jsonl."""
        result = stage.run(self)
        if result.artifact is not None:
            kind = type(result.artifact)
            if kind in self.artifacts:
                raise RuntimeError(f"stage {stage.name}: a {kind.__name__} was already handed on by an earlier stage")
            self.artifacts[kind] = result.artifact
        verdicts = stage.verdicts()
        self.survivors = self.survivors.applying(stage.name, verdicts)
        result.removed_files = tuple((v.stage or stage.name, v.prefix) for v in verdicts if v.removed)
        return result

    def artifact(self, kind: type[A]) -> A:
        """The artifact of type ``kind`` an earlier stage handed on (a missing one is a bug of the stage order)."""
        try:
            return self.artifacts[kind]
        except KeyError:
            raise RuntimeError(f"no earlier stage handed on a {kind.__name__}") from None

    def cpu_seconds(self) -> float:
        """The driver's CPU time plus that of every task run so far (resumed ones as recorded)."""
        return time.process_time() + self.runner.task_cpu_seconds

    def part_numbers(self) -> list[int]:
        return [t.part for t in self.partitions]

    def per_partition(self, **extra) -> list[dict]:
        """One task item per partition: ``name`` (``part-N``), ``part`` and ``extra``."""
        return [{"name": part_name(t.part), "part": t.part, **extra} for t in self.partitions]


class Stage:
    """A stage of ``prepare``; see the module's docstring for what each declaration means."""

    name: ClassVar[str]
    names: ClassVar[tuple[str, ...]] = ()  # every name its rows and files go under; () = (name,)
    section: ClassVar[str | None] = None  # its key in the job: a PrepareConfig field
    config: ClassVar[Any] = None  # that section's type (tests/test_stage_registry.py checks both)
    default: ClassVar[Any] = None  # an absent section: None = the stage is off; else its default value
    more_sections: ClassVar[tuple[JobSection, ...]] = ()  # further sections it owns, after its own
    removes: ClassVar[bool] = False  # takes documents out of the run: removed/<name>/ (counted as `removed`)
    rewrites: ClassVar[bool] = False  # rewrites texts: overrides/<name>/ (later stages read the new texts)

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "name" in cls.__dict__ and not cls.__dict__.get("names"):
            cls.names = (cls.name,)

    @classmethod
    def sections(cls) -> tuple[JobSection, ...]:
        """The job sections it declares, in order: its own ``section``, then ``more_sections``."""
        own = (JobSection(cls.section, cls.config, cls.default),) if cls.section is not None else ()
        return own + tuple(cls.more_sections)

    @classmethod
    def from_job(cls, job) -> "Stage | None":
        """The stage as this job runs it, or None when the job does not run it. The default: the
        job's ``section`` is the stage's only input (``section_of``)."""
        if cls.section is None:
            return cls()
        cfg = cls.section_of(job)
        return None if cfg is None else cls(cfg)

    @classmethod
    def section_of(cls, job):
        """The job's ``section`` for this stage, or None when it turns the stage off: absent, empty
        or ``enabled: false`` (the one rule, for a ``from_job`` that reads more of the job too)."""
        cfg = getattr(job, cls.section)
        return None if cfg is None or cfg == () or getattr(cfg, "enabled", True) is False else cfg

    def verdicts(self) -> tuple[Verdicts, ...]:
        """The per-partition files it writes that later stages apply (from ``removes``/``rewrites``)."""
        return (Verdicts(removed=self.removes, overrides=self.rewrites),) if self.removes or self.rewrites else ()

    def run(self, ctx: Context) -> StageResult:
        raise NotImplementedError
