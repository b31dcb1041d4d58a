"""The stages of ``gristmill prepare``: the interface (``base``) and ``STAGES``, the one order.

Each stage is a module here that owns its orchestration and its bookkeeping; the per-task
algorithms are the part's libraries (``pipeline.extract``, ``pipeline.near_duplicates``, ...).
``STAGES`` is the order they run in, each present when the job enables it (``Stage.from_job``):

    extract (+ language) -> unique_ids (jobs with an id_field) -> exact_dedup -> quality -> fuzzy_dedup
    -> dedup_against -> decontaminate -> dedup_index -> pii -> tokenizer -> tokenize -> pack

(``dedup_index`` writes the version's dedup index from the documents left after every removal, with
their texts as fuzzy dedup compares them, before PII redaction rewrites them.) Everything else that
needs the order derives it from ``STAGES``: ``build(job)``, ``STAGE_ORDER`` (removed/<stage>,
``inspect removed``, the data card's fallback order) and the survivors each stage leaves
(``Context.run``, from its ``removes``/``rewrites``). tests/test_stage_registry.py checks that
every stage's section is a field of the job of the declared type, that the libraries' ``STAGE``
names are stage names and that the report's stage sections name stages.

A new stage: a module here with a ``Stage`` subclass (name, section and config, removes/rewrites,
``run``), and its line in ``STAGES`` (docs/architecture.md has a worked example).
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
from .unique_ids import UniqueIds

__all__ = ["STAGES", "STAGE_ORDER", "Context", "Packed", "Stage", "StageResult", "build"]

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


def build(job: PrepareConfig) -> list[Stage]:
    """The stages this job runs, in order (every section was validated with the job)."""
    return [stage for cls in STAGES if (stage := cls.from_job(job)) is not None]
