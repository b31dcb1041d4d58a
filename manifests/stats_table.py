"""The stage statistics a manifest records (``stats.stages``, ``stats.accounting``, written by
``pipeline.stats.manifest_stats``) as a table for people: ``gristmill manifest show``."""
from __future__ import annotations

import json


def _counts(d: dict | None) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in (d or {}).items())


def _int(v) -> str:
    return "" if v is None else f"{v:,}"


def stage_rows(stages: dict) -> list[dict]:
    """One row per stage, in pipeline order: documents in/out, removals and quarantines by
    reason, tokens, and a note (languages kept, PII replacements, validation documents)."""
    rows = []
    for name, st in stages.items():
        if name == "pack":
            splits = {k: v for k, v in st.items() if isinstance(v, dict)}
            rows.append({"stage": name, "in": sum(v.get("documents", 0) for v in splits.values()), "out": None,
                         "removed": "", "quarantined": "", "tokens": st.get("tokens_out"),
                         "note": f"tail dropped {sum(v.get('tokens_dropped_tail', 0) for v in splits.values()):,} tokens; "
                                 + ", ".join(f"{k} {v.get('shards', 0)} shards" for k, v in splits.items())})
            continue
        detail = st.get("detail") or {}
        note = ""
        if "replacements" in detail:
            note = "replaced " + (_counts(detail["replacements"]) or "nothing")
        elif name == "language":
            note = "languages " + _counts(st.get("languages"))
        elif name == "tokenize":
            note = "; ".join(f"{k} {v['documents']:,} docs" for k, v in st.get("splits", {}).items())
        elif "documents_cut" in detail and detail["documents_cut"]:
            note = f"cut {detail['documents_cut']:,}"
        rows.append({"stage": name, "in": st.get("documents_in"), "out": st.get("documents_out"),
                     "removed": _counts(st.get("removed")), "quarantined": _counts(st.get("quarantined")),
                     "tokens": st.get("tokens_out"), "note": note})
    return rows


def format_stats(stats: dict) -> str:
    """The table, then the accounting identity. Stats without ``stages`` (a dataset not made by
    ``prepare``) print as their JSON."""
    if not isinstance(stats.get("stages"), dict):
        return json.dumps(stats, sort_keys=True)
    rows = stage_rows(stats["stages"])
    cols = [("stage", "stage", str), ("in", "docs in", _int), ("out", "docs out", _int), ("removed", "removed", str),
            ("quarantined", "quarantined", str), ("tokens", "tokens", _int), ("note", "", str)]
    cells = [[head for _, head, _ in cols]] + [[fmt(r[k]) for k, _, fmt in cols] for r in rows]
    width = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    right = {1, 2, 5}  # numbers
    lines = ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(line, width))).rstrip()
             for line in cells]
    lines.insert(1, "-" * len(lines[0]))
    a = stats.get("accounting")
    if a:
        lines.append(f"input {a['input']:,} = kept {a['kept']:,} + removed {sum(a['removed'].values()):,} + quarantined "
                     f"{sum(a['quarantined'].values()):,}  [{'balanced' if a.get('balanced') else 'NOT BALANCED'}]")
    return "\n".join(lines)
