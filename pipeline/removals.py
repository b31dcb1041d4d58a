"""What a run dropped, and why, with the text (the library side of ``gristmill inspect removed``).

Every removing stage writes ``removed/<stage>/*.parquet`` (REMOVED_SCHEMA). The language
filter's rows carry their text; the later stages' documents are in ``docs/<part>`` under the
same id, so a removed row is a (part, id) reference there. A duplicate (exact or near) names its
survivor (``duplicate_of``, and ``duplicate_of_order``, whose high bits are its partition), so
both texts are read from the partitions they live in: a lookup touches only the partitions of
the rows shown, never the corpus.
"""
from __future__ import annotations

import json

from gristmill.errors import UsageError

from .documents import part_of
from .workdir import WorkDir


def find_runs(path: str, storage_options: dict | None = None) -> list[WorkDir]:
    """The run dirs (``<work_dir>/<run key>``) at ``path`` (a directory or fsspec URL, opened with
    ``storage_options``: the job's ``work_dir_options``), oldest first: itself when it is one, else
    the runs in the work dir it names."""
    runs = WorkDir.runs_at(path, storage_options)
    if not runs and (older := WorkDir.runs_at(path, storage_options, older=True)):
        raise UsageError(f"{older[-1].root} is a run dir of an earlier gristmill (a file a partition; this one writes "
                         "a file a block of partitions, docs/pipeline.md) and is not read by this version: inspect it "
                         "with the gristmill that wrote it, or run the prepare again (a new run dir beside it)")
    if not runs:
        raise UsageError(f"{path} is neither a run dir (with docs/ and removed/) nor a work dir holding one; "
                         "give the work_dir of the prepare job or its run dir (report.json's run_dir)")
    return runs


def _removed_files(run: WorkDir, stage: str | None) -> list[str]:
    stages = run.removal_stages()
    if stage is not None and stage in stages:  # one stage: no order to find
        return run.removed_files(stage)
    if len(stages) > 1:
        # pipeline order; a stage not listed (a newer one) follows them, by name. Imported only when
        # there is an order to find: the stages' modules import their libraries (numba's, ~0.3 s)
        from .stages import STAGE_ORDER

        stages.sort(key=lambda s: (STAGE_ORDER.index(s) if s in STAGE_ORDER else len(STAGE_ORDER), s))
    if stage is not None:
        raise UsageError(f"no removals of stage {stage!r} in {run.root}; stages with removals: {', '.join(stages) or 'none'}")
    return [f for s in stages for f in run.removed_files(s)]


def _docs(run: WorkDir, wanted: dict[int, set[str]]) -> dict[str, dict]:
    """id -> document row (as extracted) for the ids wanted, read partition by partition."""
    out: dict[str, dict] = {}
    for part, ids in sorted(wanted.items()):
        path = run.docs(part)
        if not ids or not run.exists(path):
            continue
        cols = [c for c in ("id", "text", "source", "position", "url") if c in _schema_names(run, path)]
        for row in run.read_parquet(path, columns=cols, filters=[("id", "in", sorted(ids))]).to_pylist():
            out[row["id"]] = row
    return out


def removed_documents(path: str, reason: str | None = None, stage: str | None = None, limit: int = 20,
                      storage_options: dict | None = None) -> dict:
    """Up to ``limit`` removed documents of the run at ``path`` (read with ``storage_options``, the
    job's ``work_dir_options``; in pipeline and input order), each with its text and, for a
    duplicate, its survivor's id and text."""
    import pyarrow.compute as pc

    runs = find_runs(path, storage_options)
    run = runs[-1]  # the most recent
    rows, reasons = [], {}
    for f in _removed_files(run, stage):
        for vc in pc.value_counts(run.read_parquet(f, columns=["reason"]).column("reason")).to_pylist():
            reasons[vc["values"]] = reasons.get(vc["values"], 0) + vc["counts"]
        if len(rows) < limit:  # the full rows (the language filter's carry their text) only while needed
            t = run.read_parquet(f, filters=[("reason", "=", reason)] if reason is not None else None)
            rows += t.slice(0, limit - len(rows)).to_pylist()
    if reason is not None and reason not in reasons:
        raise UsageError(f"no document of {run.root} was removed as {reason!r}; reasons there: "
                         + (", ".join(f"{k} ({v:,})" for k, v in sorted(reasons.items())) or "none"))
    wanted: dict[int, set[str]] = {}
    for r in rows:
        r["detail"] = json.loads(r["detail"] or "{}")
        if r.get("text") is None:
            wanted.setdefault(r["part"], set()).add(r["id"])
        if (sid := r["detail"].get("duplicate_of")) is not None and "earlier_url" not in r["detail"]:
            order = r["detail"].get("duplicate_of_order")
            for p in ([part_of(order)] if order is not None else run.parts()):  # runs before the order was kept
                wanted.setdefault(p, set()).add(sid)
    docs = _docs(run, wanted)
    out = []
    for r in rows:
        doc = docs.get(r["id"], {})
        item = {"id": r["id"], "stage": r["stage"], "reason": r["reason"], "bytes": r["bytes"],
                "source": doc.get("source"), "position": doc.get("position"), "url": doc.get("url"),
                "text": r["text"] if r.get("text") is not None else doc.get("text"), "detail": r["detail"]}
        if (sid := r["detail"].get("duplicate_of")) is not None and "earlier_url" in r["detail"]:
            # dedup_against: the survivor is a document of an earlier version, read back from it
            from .dedup_index import earlier_document_text

            d = r["detail"]
            item["survivor"] = {"id": f"{d['earlier_version']}: {sid}", "source": None, "position": None, "url": None,
                                "text": earlier_document_text(d["earlier_url"], d["earlier_sha256"], sid)}
        elif sid is not None:
            s = docs.get(sid, {})
            item["survivor"] = {"id": sid, "source": s.get("source"), "position": s.get("position"),
                                "url": s.get("url"), "text": s.get("text")}
        out.append(item)
    return {"run_dir": run.root, "runs_found": len(runs), "removed_by_reason": dict(sorted(reasons.items())), "documents": out}


def _schema_names(run: WorkDir, path: str) -> list[str]:
    with run.open_parquet(path) as pf:
        return pf.schema_arrow.names
