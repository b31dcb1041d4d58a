"""The ``decontaminate`` section of a prepare job: its eval files and policy (docs/decontamination.md)."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from gristmill.config import Bool, NonEmptyStr, NonNegativeInt, PositiveInt, ResolvedPath, Section, Str, fail, no_format

from gristmill.manifests.storage import Store

from ... import ngrams


Policy = Literal["drop", "cut"]


class EvalSetSpec(Section):
    """One eval file of the ``decontaminate`` section: ``name``, ``path`` and how to read it."""

    name: NonEmptyStr
    path: Annotated[ResolvedPath, Field(min_length=1)]  # local path (relative: to the job file) or fsspec URL
    format: Literal[ngrams.FORMATS]  # from the file name when omitted
    fields: Annotated[tuple[NonEmptyStr, ...], Field(min_length=1)] = ("text",)  # jsonl/parquet: the text fields of an item
    id_field: Str | None = None  # jsonl/parquet: the field naming an item; None: its number
    split: Literal[ngrams.TEXT_SPLITS] = "auto"  # text: line | paragraph | auto
    storage_options: dict[str, Any] = {}  # fsspec storage options of path's filesystem; never in the manifest
    follow_symlinks: bool = False  # false: a path that a symlink takes outside its folder is refused unread

    def store(self) -> Store:
        """The store the eval file is read through, opened with ``storage_options``."""
        return Store.from_url(self.path, **self.storage_options)

    def content_dict(self) -> dict:
        """What the file's items depend on: all but its storage options (credentials are no content)."""
        d = self.to_dict()
        d.pop("storage_options")
        return d

    @model_validator(mode="before")
    @classmethod
    def _infer(cls, d: Any) -> Any:
        if not isinstance(d, dict):
            return d
        if isinstance(d.get("fields"), str):
            d = {**d, "fields": [d["fields"]]}
        if d.get("format") is None and isinstance(d.get("path"), str) and d["path"]:
            try:
                d = {**d, "format": ngrams.infer_format(d["path"])}
            except ValueError:
                fail(f"one of {', '.join(ngrams.FORMATS)}", no_format(d["path"]), at=("format",))
        return d

    @model_validator(mode="after")
    def _options_fit_the_format(self) -> "EvalSetSpec":
        # A non-default option the format ignores is a mistake; defaults are what --print-config writes.
        if self.format == "text" and (self.fields != ("text",) or self.id_field is not None):
            fail("no fields/id_field on a text file (they apply to jsonl and parquet)",
                 f"fields={list(self.fields)}, id_field={self.id_field!r} for text file {self.path}", at=("fields",))
        if self.format != "text" and self.split != "auto":
            fail(f"no split on a {self.format} file (it applies to text files)", repr(self.split), at=("split",))
        return self

    def read_items(self, max_record_bytes: int | None = None) -> list[tuple[str, str]]:
        return ngrams.read_eval_items(self.path, self.format, self.fields, self.id_field, self.split, max_record_bytes,
                                      store=self.store(), follow_symlinks=self.follow_symlinks)


class DecontamConfig(Section):
    """The ``decontaminate`` stage (its tasks.py, docs/decontamination.md)."""

    SECTION = "decontaminate"
    enabled: Bool = True
    eval_sets: tuple[EvalSetSpec, ...] = ()
    n: PositiveInt = ngrams.DEFAULT_N
    policy: Policy = "drop"
    margin: NonNegativeInt = 200  # cut: characters removed on each side of a matching span
    min_matches: PositiveInt = 1  # gram hits an item needs in a document (items with fewer grams: all of them)
    min_item_words: PositiveInt = 1  # eval items shorter than this are counted but not indexed
    against_validation: Bool = True  # the executor also checks train against the validation split
    validation_min_matches: PositiveInt = 1  # as min_matches, for the pass against the validation split
    # Boilerplate: a validation n-gram found in more than this many documents of the corpus
    # (both splits) is not overlap (licence footers, navigation, repeated headers); null counts every gram.
    validation_max_doc_freq: PositiveInt | None = 10

    @model_validator(mode="after")
    def _eval_sets(self) -> "DecontamConfig":
        names = [e.name for e in self.eval_sets]
        for i, name in enumerate(names):
            if name in names[:i]:
                fail("eval set names to be unique", f"{name!r} again", at=("eval_sets", i, "name"))
        if self.enabled:  # a disabled section may name files that are not on this machine
            for i, e in enumerate(self.eval_sets):
                if (why := _not_a_file(e.path, e.storage_options)) is not None:
                    fail("an existing eval file", f"{e.path!r}, which {why}", at=("eval_sets", i, "path"))
        return self


def _not_a_file(path: str, storage_options: dict) -> str | None:
    """Why ``path`` is no regular file to read (None: it is one). A FIFO or /dev/zero exists: it is
    named for what it is, never said not to exist."""
    import os

    from ...readers import special_file

    store = Store.from_url(path, **storage_options)
    p = store.path(path)
    if store.fs.isfile(p):
        return None
    if store.is_local and os.path.lexists(p):
        return (f"is {special_file(p)}, not a regular file; copy its contents to a file and name that"
                if os.path.exists(p) else "is a symlink to nothing")
    return "does not exist"
