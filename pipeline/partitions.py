"""The planned partitions of a run, as records: ``InputFile`` and ``Partition``.

``executor.plan_inputs`` expands the job's inputs into files (``InputFile``, one per file, with
how to read it) and groups consecutive ones into partitions (``Partition``): one task and one
set of stage outputs each. Both are small frozen dataclasses with slots: they pickle cheaply
into a task, and a misspelt field is an ``AttributeError`` where it is read, never a silent
``None`` from ``dict.get``. The plan is not written to the work dir: it is made again on every
run, and the run key (``executor.run_key``) holds each file's ``(uri, size, mtime)`` as before.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class InputFile:
    """One input file and how to read it (its ``inputs[input]`` entry's reader settings)."""

    uri: str  # absolute path or URL: the document's ``source``
    rel: str  # its path relative to the inputs' common folder: the stem of derived document ids
    size: int | None  # bytes when planned (None: a server that does not say)
    mtime: str  # the filesystem's modification time, LastModified or ETag, as a string ("" unknown)
    input: int  # the index of the inputs[] entry that named it
    format: str  # jsonl | parquet | text | warc
    text_field: str = "text"
    id_field: str | None = None
    text_format: str = "text"  # text | html
    url_field: str | None = "url"
    # The folder its pattern matched under (``executor.pattern_root``): a file that resolves outside it
    # through a symlink is quarantined unread (``symlink_outside_root``); None: its entry follows symlinks.
    root: str | None = None


@dataclass(frozen=True, slots=True)
class Partition:
    """A run of consecutive input files read by one task (``part``: its number, from 0)."""

    part: int
    files: tuple[InputFile, ...]

    @property
    def uris(self) -> list[str]:
        return [f.uri for f in self.files]
