"""What decontamination's table functions hand back (``pipeline.decontam.decontaminate``).

Every stage takes the documents that survived the stages before it and returns the ones it
keeps, the ones it removes (all their columns plus ``reason`` and stage-specific detail such
as ``duplicate_of`` or ``eval_item``), and counts for the report. The executor persists both
sides, so nothing is dropped silently and ``input = kept + removed + quarantined`` holds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StageResult:
    kept: Any  # pa.Table of document rows (see docs/architecture.md)
    removed: Any  # pa.Table: document rows + `reason` + detail columns
    stats: dict = field(default_factory=dict)  # JSON-able; goes into the report and the manifest
