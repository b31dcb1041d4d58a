"""The ``tokenizer`` section of a prepare job (tokenize and pack read it too)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from gristmill.config import Int, PositiveInt, ResolvedPath, Section, Str, existing_local_file


class TokenizerConfig(Section):
    path: ResolvedPath | None = None  # a tokenizer.json; None = train a byte-level BPE on a sample
    vocab_size: Annotated[Int, Field(ge=259, le=1 << 20)] = 8192  # when training
    sample_bytes: PositiveInt = 4_000_000  # training sample: the first documents in `order` up to this many bytes
    eos_token: Str = "<|endoftext|>"
    batch_size: PositiveInt = 512  # documents per encode_batch call
    # auto: tiktoken where the file maps onto its rank table exactly (same ids), else tokenizers;
    # tokenizers: always HF tokenizers. Not content (the ids are the same): the manifest records which ran.
    encoder: Literal["auto", "tokenizers"] = "auto"

    @field_validator("path")
    @classmethod
    def _path_exists(cls, v: str | None) -> str | None:
        return existing_local_file(v, "tokenizer")
