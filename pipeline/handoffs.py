"""What one stage hands the stages after it (``Context.artifact``): data only, so that no stage
folder imports another's (tests/test_layering.py). The stage that makes each is named on it."""
from __future__ import annotations

from dataclasses import dataclass

from gristmill.manifests.storage import Store

from .tokenization import encoder_label

SPLITS = ("train", "validation")  # in manifest order


@dataclass(frozen=True)
class Extracted:
    """What extract hands on: the documents it kept (exact dedup's keys) and the records it read
    (unique ids' ids)."""

    documents: int
    records: int


@dataclass(frozen=True)
class RepeatedIds:
    """What unique ids hands on: its bucket-range tasks, whose files name the repeated ids (exact
    dedup leaves those documents to it)."""

    tasks: tuple[str, ...]


@dataclass(frozen=True)
class TokenizerFile:
    """What the tokenizer stage hands on: the tokenizer.json that tokenize and pack use, and the encoder
    tokenize runs (``pipeline.tokenization.choose_encoder``; the manifest records it)."""

    path: str
    store: Store | None = None  # the work dir's for a trained one; None: the path's own (the job's tokenizer.path)
    encoder: str = "tokenizers"

    @property
    def encoder_label(self) -> str:
        return encoder_label(self.encoder)


@dataclass(frozen=True)
class TokenCounts:
    """What tokenize hands on: each split's tokens by partition (pack plans its ranges from them)."""

    train: tuple[int, ...]
    validation: tuple[int, ...]

    def by_split(self) -> dict[str, list[int]]:
        return {"train": list(self.train), "validation": list(self.validation)}
