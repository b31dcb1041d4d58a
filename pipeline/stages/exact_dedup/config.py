"""The ``exact_dedup`` section of a prepare job."""
from __future__ import annotations

from gristmill.config import Bool, Section


class ExactDedupConfig(Section):
    enabled: Bool = True
