"""Machine-readable output: one writer for Parquet and JSONL, chosen by the file's extension."""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

from .checkpoint import AuditError

FORMATS = (".parquet", ".jsonl")


def check_output_path(path: str | None) -> None:
    """Refuse a bad output name before any work is done."""
    if path is not None and not path.endswith(FORMATS):
        raise AuditError(f"output {path!r}: use a .parquet or .jsonl file name")


def write_table(table: pa.Table, path: str) -> None:
    """Write atomically (temporary name, then rename) as Parquet (.parquet) or JSON lines (.jsonl)."""
    check_output_path(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    if path.endswith(".parquet"):
        pq.write_table(table, tmp, compression="zstd")
    else:
        with open(tmp, "w") as f:
            for row in table.to_pylist():
                f.write(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
