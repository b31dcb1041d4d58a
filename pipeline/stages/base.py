"""The one interface between the executor and a stage: ``Stage``, its ``Context`` and its ``StageResult``.

A stage has a ``name``, the job ``section`` that configures it, a ``kind`` (``map``: a task per
partition; ``global``: tasks over hash ranges or ranges of partitions, planned from the data),
``removes`` (whether it takes documents out of the run) and ``run(ctx)``, which runs its tasks
through ``ctx.runner`` and returns a ``StageResult``: plain data (counts, rows of the manifest's
stage table, the dataset it packed), never a live object. A stage that removes or rewrites
documents writes them by partition (``removed/<name>/part-N.parquet``,
``overrides/<name>/part-N.parquet``) and hands the next stages ``ctx.survivors.after(...)``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from ..config import PrepareConfig
from ..runner import Runner
from ..stats import Accounting, Counts
from ..survivors import Survivors
from ..workdir import WorkDir, part_name


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
    removed_files: tuple[tuple[str, str], ...] = ()  # (stage, prefix) of its removed/<stage>/<prefix>part-N: removed.jsonl
    core_seconds: dict[str, float] = field(default_factory=dict)  # report.json: summed task seconds by row
    peak_rss_mb: dict[str, float] = field(default_factory=dict)  # report.json: a worker's peak by row
    data: Any = None  # what later stages read (``ctx.results[name].data``)


@dataclass
class Context:
    """What a stage may use: the job, the work dir, the runner, the partitions, the documents
    still in the run and what ran before."""

    job: PrepareConfig
    wd: WorkDir
    runner: Runner
    partitions: list[dict]
    log: Callable[[str], None] = lambda msg: None
    survivors: Survivors | None = None
    results: dict[str, StageResult] = field(default_factory=dict)  # stage name -> its result

    def __post_init__(self):
        if self.survivors is None:
            self.survivors = Survivors(self.wd)

    def cpu_seconds(self) -> float:
        """The driver's CPU time plus that of every task run so far (resumed ones as recorded)."""
        return time.process_time() + self.runner.task_cpu_seconds

    def per_partition(self, **extra) -> list[dict]:
        """One task item per partition: ``name`` (``part-N``), ``part`` and ``extra``."""
        return [{"name": part_name(t["part"]), "part": t["part"], **extra} for t in self.partitions]


class Stage:
    name: str
    section: str | None = None  # the job section that configures it
    kind: Literal["map", "global"] = "map"
    removes = False  # takes documents out of the run (each one counted in the accounting as `removed`)

    def run(self, ctx: Context) -> StageResult:
        raise NotImplementedError
