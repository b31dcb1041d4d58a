"""The stages of ``gristmill prepare``: the interface (``base``) and the fixed order.

Each stage is a module here that owns its orchestration and its bookkeeping; the per-task
algorithms are the part's libraries (``pipeline.extract``, ``pipeline.fuzzy_dedup``, ...).
``build(job)`` is the order, each stage present when the job enables it:

    extract (+ language) -> exact_dedup -> quality -> fuzzy_dedup -> decontaminate -> pii -> tokenizer -> tokenize -> pack

A new stage: a module here with a ``Stage`` subclass, and its place in ``build``.
"""
from __future__ import annotations

from ..config import PrepareConfig
from .base import Context, Packed, Stage, StageResult
from .decontaminate import Decontaminate
from .exact_dedup import ExactDedup
from .extract import Extract
from .fuzzy_dedup import FuzzyDedup
from .pack import Pack
from .pii import Pii
from .quality import Quality
from .tokenize import Tokenize
from .tokenizer import Tokenizer

__all__ = ["Context", "Packed", "Stage", "StageResult", "build"]


def build(job: PrepareConfig) -> list[Stage]:
    """The stages this job runs, in order (every section was validated with the job)."""
    stages: list[Stage] = [Extract()]
    if job.exact_dedup.enabled:
        stages.append(ExactDedup())
    if job.quality is not None and job.quality.enabled:
        stages.append(Quality(job))
    for cls in (FuzzyDedup, Decontaminate, Pii):  # optional typed sections: absent or enabled: false skips
        section = getattr(job, cls.section)
        if section is not None and section.enabled:
            stages.append(cls(section))
    return stages + [Tokenizer(), Tokenize(), Pack()]
