"""Hostile inputs, third round (issue 33): eval files read through the corpus readers' bounds, a
record no parser can hold, job values no reader accepts, manifest paths that are not plain paths,
forged checkpoint counts and dedup indexes. Each is one line (exit 2) or one quarantine record."""
import gzip
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
import zstandard

from helpers import build_dataset, extract_files, write_checkpoint_meta

from gristmill.cli import main
from gristmill.errors import ConfigError, GristmillError
from gristmill.pipeline.ngrams import EvalFileError, read_eval_items

MiB = 1 << 20


def _one_line(e) -> str:
    msg = str(e.value if hasattr(e, "value") else e)
    assert "\n" not in msg and "Traceback" not in msg, msg
    return msg


# -- 2. a record no parser can hold is quarantined, not fatal -------------------------------------------
def test_a_5000_digit_integer_is_quarantined_not_fatal(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_text('{"text": "first record here"}\n{"text": "second", "n": ' + "7" * 5000 + '}\n{"text": "third record"}\n')
    stats, docs, quarantine = extract_files(str(tmp_path / "w"), [(str(p), "jsonl")])
    assert [d["text"] for d in docs] == ["first record here", "third record"]
    assert [(q["reason"], q["position"]) for q in quarantine] == [("number_too_large", 1)]
    assert "4300" in quarantine[0]["detail"] or "digits" in quarantine[0]["detail"]


# -- 5. a Parquet text column that is a list or struct has its own reason --------------------------------
def test_a_parquet_text_column_of_lists_or_structs_is_text_not_a_string(tmp_path):
    lists, structs = tmp_path / "l.parquet", tmp_path / "s.parquet"
    pq.write_table(pa.table({"text": [["a", "b"], None]}), lists)
    pq.write_table(pa.table({"text": [{"x": "a"}]}), structs)
    from gristmill.pipeline.readers import read_records

    assert [r.get("reason") for r in read_records(str(lists), "parquet")] == ["text_not_a_string", "missing_text_field"]
    assert [r.get("reason") for r in read_records(str(structs), "parquet")] == ["text_not_a_string"]
