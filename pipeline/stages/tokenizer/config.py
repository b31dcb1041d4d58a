"""The ``tokenizer`` section of a prepare job (tokenize and pack read it too)."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from gristmill.config import Int, PositiveInt, ResolvedPath, Section, Str, existing_local_file


class TokenizerConfig(Section):
    path: ResolvedPath | None = None  # a tokenizer.json; None = train a byte-level BPE on a sample
    vocab_size: Annotated[Int, Field(ge=259, le=1 << 20)] = 8192  # when training
    sample_bytes: PositiveInt = 4_000_000  # training sample: the first documents in `order` up to this many bytes
    eos_token: Str = "<|endoftext|>"
    batch_size: PositiveInt = 512  # documents per encode_batch call

    @field_validator("path")
    @classmethod
    def _path_exists(cls, v: str | None) -> str | None:
        return existing_local_file(v, "tokenizer")
