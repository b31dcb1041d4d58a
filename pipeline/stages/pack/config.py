"""The ``pack`` section of a prepare job."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from gristmill.config import Int, PositiveInt, Section, fail
from gristmill.manifests.manifest import MAX_SEQ_LEN


# The longest row every reader serves: shards are Arrow fixed_size_list[seq_len + 1]
# (an int32 length), the manifest accepts seq_len <= MAX_SEQ_LEN, and the loader's document spans
# are int32 offsets into a row; the token dtype (uint16/uint32) sizes a row, not its length.
MAX_PACK_SEQ_LEN = min(MAX_SEQ_LEN, (1 << 31) - 2)


class PackConfig(Section):
    seq_len: Annotated[Int, Field(ge=1, le=MAX_PACK_SEQ_LEN)] = 2048
    shard_bytes: PositiveInt = 64 << 20  # target uncompressed size of a shard
    # Tokens of document starts per pack task (its tasks.py). Part of the output's identity:
    # each range drops its last partial row, so changing it changes the shards. At least one row
    # (seq_len): 1 made one task per token; pack.plan_ranges also caps the tasks per split.
    range_tokens: PositiveInt = 64 << 20

    @model_validator(mode="after")
    def _range_holds_a_row(self) -> "PackConfig":
        if "range_tokens" in self.model_fields_set and self.range_tokens < self.seq_len:  # a default stays valid
            fail(f"at least seq_len ({self.seq_len:,}) tokens: a pack task packs whole rows (default 64 Mi)",
                 f"{self.range_tokens:,}", at=("range_tokens",))
        return self
