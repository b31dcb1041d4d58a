"""The ``split`` section of a prepare job: tokenize assigns each document to train or validation."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gristmill.config import Float, Int, Section


class SplitConfig(Section):
    validation_fraction: Annotated[Float, Field(ge=0, lt=1)] = 0.01  # of documents, chosen by a hash of the doc id
    seed: Int = 0  # salt of that hash: change it to draw a different validation set
