"""`audit seen | doc | leak` on a checkpoint trained on a mixture (manifests.mixture).

The mixture's order (loader.mixture, the loader's own code) maps every consumed global index to
(component, shard, row); each component is then audited as the dataset it is, by the same
functions as a plain checkpoint (audit/seen.py, doc.py, leak.py), on the samples it served, and
the answers are put side by side: per component (samples, share of the mixture, tokens), and
per source and file keyed ``<component>/<source>``.
"""
from __future__ import annotations

import pyarrow as pa

from gristmill.manifests.mixture import PublishedMixture

from .checkpoint import AuditError, Checkpoint
from .consumed import Consumed, ranks, trained_indices


def mixture_order(mix: PublishedMixture, ckpt: Checkpoint):
    from gristmill.loader import order
    from gristmill.loader.mixture import MixtureOrder

    window = ckpt.window_shards if ckpt.window_shards is not None else order.DEFAULT_WINDOW_SHARDS
    return MixtureOrder(mix, ckpt.split, ckpt.seed, ckpt.order, window)


def consumed_components(mix: PublishedMixture, ckpt: Checkpoint, steps: tuple[int, int]) -> list[Consumed]:
    """Per component (manifest order), the samples of steps ``first..last`` it served, shard and row in its own manifest."""
    index, step = trained_indices(ckpt, steps)  # past the rewinds, less bad steps (trainer/skips.py)
    comp, _, shard, row = mixture_order(mix, ckpt).locate_components(index)
    rank = ranks(index, step, ckpt)
    return [Consumed(index=index[sel], step=step[sel], rank=rank[sel], shard=shard[sel], row=row[sel])
            for sel in (comp == c for c in range(len(mix.components)))]


def _prefixed(entries: dict, name: str) -> dict:
    return {f"{name}/{k}": v for k, v in entries.items()}


def audit_seen_mixture(mix: PublishedMixture, used: list[Consumed], steps: tuple[int, int]):
    """The per-component `audit seen` answers, and their sums: same keys as a dataset's summary plus ``by_component``."""
    from .seen import SeenReport, audit_seen

    m = mix.manifest
    reports = [audit_seen(pub, u, steps) for pub, u in zip(mix.components, used)]
    total = sum(len(u) for u in used)
    by_component = {}
    for c, pub, r in zip(m.components, mix.components, reports):
        s = r.summary
        by_component[c.name] = {
            "dataset": s["dataset"], "version": s["version"], "manifest_sha256": s["manifest_sha256"],
            "manifest_url": s["manifest_url"], "parts": c.parts, "period": m.period, "weight": c.parts / m.period,
            "samples": s["samples"], "share": s["samples"] / total if total else 0.0, "rows_seen": s["rows_seen"],
            "rows": sum(sh.rows for sh in pub.manifest.shards_of("train")), "tokens_seen": s["tokens_seen"],
            "token_exposures": s["token_exposures"], "documents_seen": s["documents_seen"],
            "documents_fully_seen": s["documents_fully_seen"], "exhausted": c.exhausted}
    summed = {k: sum(r.summary[k] for r in reports) for k in (
        "samples", "rows_seen", "rows_seen_more_than_once", "tokens_seen", "token_exposures", "documents_seen",
        "documents_fully_seen", "documents_partly_seen")}
    summary = {
        "kind": "mixture", "dataset": m.name, "version": m.version, "manifest_sha256": m.sha256, "manifest_url": mix.url,
        "steps": [steps[0], steps[1]], **summed, "by_component": by_component,
        **{key: {k: v for c, r in zip(m.components, reports) for k, v in _prefixed(r.summary[key], c.name).items()}
           for key in ("by_shard", "by_source", "by_file", "by_lang")},
    }
    docs = pa.concat_tables([
        r.documents.add_column(0, "component", pa.array([c.name] * r.documents.num_rows, pa.string()))
        for c, r in zip(m.components, reports)])
    return SeenReport(summary, docs, used)


def consumed_table_mixture(mix: PublishedMixture, used: list[Consumed]) -> pa.Table:
    """`--samples-out` of a mixture: the dataset's columns plus the component, in global index order."""
    from .seen import consumed_table

    table = pa.concat_tables([
        consumed_table(u, pub.manifest).add_column(0, "component", pa.array([c.name] * len(u), pa.string()))
        for c, pub, u in zip(mix.manifest.components, mix.components, used)])
    return table.sort_by("index")


def audit_doc_mixture(mix: PublishedMixture, ckpt: Checkpoint, used: list[Consumed], doc_id: str) -> dict:
    """One document of one component: in a mixture a document is (component, id), as everywhere in
    the audit (``<component>/<id>`` in `audit seen`'s and `audit leak`'s answers). ``doc_id`` is
    ``<component>/<id>``, or a bare id that exactly one component's index holds; an id several
    components hold is refused, naming the ``<component>/<id>`` of each (never added up: they are
    different documents)."""
    from .doc import audit_doc

    m = mix.manifest
    names = [c.name for c in m.components]
    head, sep, rest = doc_id.partition("/")
    if sep and head in names:
        candidates, wanted = [names.index(head)], rest
    else:
        candidates, wanted = list(range(len(names))), doc_id
    found = {}
    for i in candidates:
        try:
            found[names[i]] = audit_doc(mix.components[i], ckpt, used[i], wanted)
        except AuditError:
            if len(candidates) == 1:
                raise
    if not found:
        raise AuditError(f"document {doc_id!r} is in the document index of no component of mixture {m.name!r} "
                         f"({', '.join(names)}); name one as <component>/<doc_id>")
    if len(found) > 1:
        raise AuditError(f"document id {doc_id!r} is in {len(found)} components of mixture {m.name!r}, each its own "
                         f"document: ask for one of {', '.join(f'{n}/{doc_id}' for n in found)}")
    (name, answer), = found.items()
    return {**answer, "component": name,
            "occurrences": [{**o, "component": name} for o in answer["occurrences"]],
            "provenance": {**answer["provenance"], "component": name, "mixture": m.name, "mixture_sha256": m.sha256}}


def audit_leak_mixture(mix: PublishedMixture, used: list[Consumed], eval_file: str, **options):
    """Each component checked with its own decontamination settings (unless given); matches carry the component."""
    from .leak import LeakReport, audit_leak

    m = mix.manifest
    reports = [audit_leak(pub, u, eval_file, **options) for pub, u in zip(mix.components, used)]
    matches = pa.concat_tables([
        r.matches.add_column(0, "component", pa.array([c.name] * r.matches.num_rows, pa.string()))
        for c, r in zip(m.components, reports)])
    first = reports[0].summary
    item_order = {}
    for r in reports:
        for item in r.summary["leaked_items"]:
            item_order.setdefault(item, len(item_order))
    ns = sorted({r.summary["n"] for r in reports})
    summary = {
        "kind": "mixture", "eval_file": eval_file, "eval_sha256": first["eval_sha256"],
        "n": ns[0] if len(ns) == 1 else ns, "min_matches": sorted({r.summary["min_matches"] for r in reports}),
        "decontaminated_against": {c.name: r.summary["decontaminated_against"] for c, r in zip(m.components, reports)},
        "items": first["items"], "items_leaked": len(item_order), "leaked_items": list(item_order),
        "documents_checked": sum(r.summary["documents_checked"] for r in reports),
        "tokens_checked": sum(r.summary["tokens_checked"] for r in reports),
        "documents_leaked": sum(r.summary["documents_leaked"] for r in reports),
        "steps": sorted({s for r in reports for s in r.summary["steps"]}),
        "manifest_sha256": m.sha256,
        "by_component": {c.name: r.summary for c, r in zip(m.components, reports)},
    }
    if len(summary["min_matches"]) == 1:
        summary["min_matches"] = summary["min_matches"][0]
    return LeakReport(summary, matches)
