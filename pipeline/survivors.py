"""The documents still in the run: a partition's document file less what earlier stages removed,
with the texts they shortened or redacted.

Every stage delivers its verdicts by partition: partition N's rows of ``removed/<stage>/block-B``
(REMOVED_SCHEMA) and ``overrides/<stage>/block-B`` (OVERRIDE_SCHEMA), its block's files
(``WorkDir.removed``/``overrides``: a ``PartPath``, read as that partition's row groups only; map
stages write their own partitions' rows; global steps route their verdicts to partitions first).
So a task reads one range per earlier stage, never one per partition: the work of a step grows
with the data, not with the square of the partition count.

``Survivors`` is a small value in the stage context: the work dir and which stages' files to
apply, in order (later overrides win). ``after(...)`` gives the value for the next stage;
``applying(stage, verdicts)`` does it from a stage's declared ``Verdicts`` (what the executor calls
after every stage, ``pipeline.stages.Context.run``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import pyarrow as pa

from .workdir import WorkDir


@dataclass(frozen=True)
class Verdicts:
    """Per-partition rows a stage writes: ``removed/<stage>/<prefix>block-B`` (``removed``) and
    ``overrides/<stage>/<prefix>block-B`` (``overrides``). ``stage`` None: the stage's own name.
    ``applied=False``: written for the record only, not applied to later stages' documents
    (extract's language removals: ``docs/`` holds only the documents it kept)."""

    removed: bool = False
    overrides: bool = False
    prefix: str = ""
    stage: str | None = None
    applied: bool = True


@dataclass(frozen=True)
class Survivors:
    wd: WorkDir
    removed: tuple[tuple[str, str], ...] = ()  # (stage, file prefix) whose removals apply
    overrides: tuple[tuple[str, str], ...] = ()  # (stage, file prefix) whose texts apply, later ones win

    def after(self, stage: str, *, removed: bool = False, overrides: bool = False, prefix: str = "") -> "Survivors":
        """These survivors less what ``stage`` removed (``removed``), with the texts it rewrote (``overrides``)."""
        return replace(self, removed=self.removed + (((stage, prefix),) if removed else ()),
                       overrides=self.overrides + (((stage, prefix),) if overrides else ()))

    def applying(self, stage: str, verdicts) -> "Survivors":
        """These survivors past every applied one of ``verdicts`` (``Verdicts``) of ``stage``, in order."""
        out = self
        for v in verdicts:
            if v.applied:
                out = out.after(v.stage or stage, removed=v.removed, overrides=v.overrides, prefix=v.prefix)
        return out

    def removed_files(self, part: int) -> list[str]:
        return [self.wd.removed(s, part, prefix) for s, prefix in self.removed]

    def override_files(self, part: int) -> list[str]:
        return [self.wd.overrides(s, part, prefix) for s, prefix in self.overrides]

    def removed_ids(self, part: int) -> set[str]:
        """Ids the stages removed from partition ``part`` (one file a stage)."""
        ids: set[str] = set()
        for f in self.removed_files(part):
            ids.update(self.wd.read_parquet(f, ["id"]).column("id").to_pylist())
        return ids

    def overridden_texts(self, part: int) -> dict[str, str]:
        """id -> text for the documents of partition ``part`` that a stage rewrote."""
        out: dict[str, str] = {}
        for f in self.override_files(part):
            t = self.wd.read_parquet(f, ["id", "text"])
            out.update(zip(t.column("id").to_pylist(), t.column("text").to_pylist()))
        return out

    def docs(self, part: int, columns: list[str], batch_size: int):
        """Batches (pa.Table) of partition ``part``'s documents that no stage removed, in order,
        with rewritten texts applied (when ``text`` is among ``columns``)."""
        drop = self.removed_ids(part)
        new_text = self.overridden_texts(part) if "text" in columns else {}
        for batch in self.wd.iter_batches(self.wd.docs(part), columns, batch_size):
            t = pa.Table.from_batches([batch])
            if drop:
                t = t.filter(pa.array([i not in drop for i in t.column("id").to_pylist()], pa.bool_()))
            if new_text and t.num_rows:
                texts = [new_text.get(i, x) for i, x in zip(t.column("id").to_pylist(), t.column("text").to_pylist())]
                t = t.set_column(t.schema.get_field_index("text"), "text", pa.array(texts, pa.string()))
            if t.num_rows:
                yield t
