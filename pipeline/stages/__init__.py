"""The stages of ``gristmill prepare``: the interface (``base``) and the fixed order.

Each stage is a module here that owns its orchestration and its bookkeeping; the per-task
algorithms are the part's libraries (``pipeline.extract``, ``pipeline.fuzzy_dedup``, ...).
``build(job)`` is the order, each stage present when the job enables it:

    extract (+ language) -> unique_ids (jobs with an id_field) -> exact_dedup -> quality -> fuzzy_dedup -> dedup_against -> decontaminate -> dedup_index
    -> pii -> tokenizer -> tokenize -> pack

(``dedup_index`` writes the version's dedup index from the documents left after every removal, with
their texts as fuzzy dedup compares them, before PII redaction rewrites them.)

A new stage: a module here with a ``Stage`` subclass, and its place in ``build``.
"""
from __future__ import annotations

from ..config import PrepareConfig
from .base import Context, Packed, Stage, StageResult
from .decontaminate import Decontaminate
from .dedup_against import DedupAgainst
from .dedup_index import DedupIndex
from .exact_dedup import ExactDedup
from .extract import Extract
from .fuzzy_dedup import FuzzyDedup
from .pack import Pack
from .pii import Pii
from .quality import Quality
from .tokenize import Tokenize
from .tokenizer import Tokenizer
from .unique_ids import UniqueIds, needs_id_check

__all__ = ["Context", "Packed", "Stage", "StageResult", "build"]


def build(job: PrepareConfig) -> list[Stage]:
    """The stages this job runs, in order (every section was validated with the job)."""
    stages: list[Stage] = [Extract()]
    if needs_id_check(job):
        stages.append(UniqueIds())
    if job.exact_dedup.enabled:
        stages.append(ExactDedup())
    if job.quality is not None and job.quality.enabled:
        stages.append(Quality(job))
    def on(section) -> bool:  # optional typed sections: absent or enabled: false skips
        return section is not None and section.enabled

    if on(job.fuzzy_dedup):
        stages.append(FuzzyDedup(job.fuzzy_dedup))
    if job.dedup_against:
        stages.append(DedupAgainst())
    if on(job.decontaminate):
        stages.append(Decontaminate(job.decontaminate))
    stages.append(DedupIndex())  # every version publishes its dedup index
    if on(job.pii):
        stages.append(Pii(job.pii))
    return stages + [Tokenizer(), Tokenize(), Pack()]
