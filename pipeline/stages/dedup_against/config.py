"""The ``dedup_against`` section of a prepare job: the earlier versions, each a ``DedupAgainstSpec``."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from gristmill.config import ResolvedPath, Section, Str


class DedupAgainstSpec(Section):
    """One earlier version of ``dedup_against``: its URL and, optionally, the manifest hash it must have."""

    url: Annotated[ResolvedPath, Field(min_length=1)]  # <root>/<dataset>/v<N>, or <root>/<dataset> (its latest)
    sha256: Annotated[Str, Field(pattern="^[0-9a-f]{64}$")] | None = None  # pinned: any other manifest is refused
    # false: its latest, manifest.json and index files must not resolve outside the folder url names
    # through a symlink (refused unread, docs/security.md); true: links are followed anywhere
    follow_symlinks: bool = False

    @model_validator(mode="before")
    @classmethod
    def _url_alone(cls, d: Any) -> Any:
        return {"url": d} if isinstance(d, str) else d
