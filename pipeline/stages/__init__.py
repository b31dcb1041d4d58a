"""The stages of ``gristmill prepare``: the interface (``base``) and ``STAGES``, the one order.

Each stage is a folder here: ``stage.py`` (its ``Stage`` subclass: orchestration and bookkeeping),
``config.py`` (its job section's model) and ``tasks.py`` (the functions its tasks run). Libraries
several stages share stay at ``pipeline/`` level (``text``, ``minhash``, ``lsh``, ``ngrams``,
``dedup_index``, ``tokenization``, ``removals``, ``survivors``, ...).
``STAGES`` is the order they run in, each present when the job enables it (``Stage.from_job``):

    extract (+ language) -> unique_ids (jobs with an id_field) -> exact_dedup -> quality -> fuzzy_dedup
    -> dedup_against -> decontaminate -> dedup_index -> pii -> tokenizer -> tokenize -> pack

(``dedup_index`` writes the version's dedup index from the documents left after every removal, with
their texts as fuzzy dedup compares them, before PII redaction rewrites them.) Everything else that
needs the order derives it from ``STAGES``: the job's stage sections (``job_sections``, from which
``pipeline.config.PrepareConfig`` is built), ``build(job)``, ``STAGE_ORDER`` (removed/<stage>,
``inspect removed``, the data card's fallback order) and the survivors each stage leaves
(``Context.run``, from its ``removes``/``rewrites``). tests/test_stage_registry.py checks that
every stage's section is a field of the job of the declared type, that the tasks' ``STAGE``
names are stage names, that the report's stage sections name stages, and that a toy stage folder
plus its line is all a new stage takes.

A new stage: a folder here (``stage.py`` with a ``Stage`` subclass: name, section, config and
default, removes/rewrites, ``run``; ``config.py``; ``tasks.py``) and its line in ``STAGES``
(docs/architecture.md has a worked example). Nothing here imports ``pipeline.config``: it imports
this registry to build the job model.
"""
from __future__ import annotations

from typing import Iterable

from .base import Context, JobSection, Packed, Stage, StageResult
from .decontaminate.stage import Decontaminate
from .dedup_against.stage import DedupAgainst
from .dedup_index.stage import DedupIndex
from .exact_dedup.stage import ExactDedup
from .extract.stage import Extract
from .fuzzy_dedup.stage import FuzzyDedup
from .pack.stage import Pack
from .pii.stage import Pii
from .quality.stage import Quality
from .tokenize.stage import Tokenize
from .tokenizer.stage import Tokenizer
from .unique_ids.stage import UniqueIds

__all__ = ["STAGES", "STAGE_ORDER", "Context", "JobSection", "Packed", "Stage", "StageResult", "build", "job_sections"]

STAGES: tuple[type[Stage], ...] = (
    Extract,
    UniqueIds,
    ExactDedup,
    Quality,
    FuzzyDedup,
    DedupAgainst,
    Decontaminate,
    DedupIndex,  # every version publishes its dedup index
    Pii,
    Tokenizer,
    Tokenize,
    Pack,
)

# Every name a stage's rows and files go under, in the order the stages run (``language`` is
# extract's filter, whose removals go under their own name).
STAGE_ORDER: tuple[str, ...] = tuple(n for cls in STAGES for n in cls.names)


def job_sections(stages: Iterable[type[Stage]] = STAGES) -> list[JobSection]:
    """The job's stage sections, in stage order: each stage's ``sections()`` in turn. A section
    several stages declare (``tokenizer``: the tokenizer stage's and tokenize's) is one section, of
    the one type they all name, and sits with the last of them."""
    out: dict[str, JobSection] = {}
    for cls in stages:
        for sec in cls.sections():
            if sec.name in out and out[sec.name].type != sec.type:
                raise TypeError(f"stage {cls.name}: section {sec.name} is {out[sec.name].type}, declared as {sec.type}")
            out.pop(sec.name, None)
            out[sec.name] = sec
    return list(out.values())


def build(job, stages: Iterable[type[Stage]] = STAGES) -> list[Stage]:
    """The stages this job (a ``PrepareConfig``) runs, in order (every section was validated with the job)."""
    return [stage for cls in stages if (stage := cls.from_job(job)) is not None]
