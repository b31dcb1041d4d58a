"""``gristmill report DATASET_URL``: the data card of one dataset version.

Built from the manifest (always: counts per stage, LSH parameters, clusters, decontamination
hits, shards, inputs), the document index it pins (tokens per source, file and document), and,
when the prepare run's work dir is at hand, its files (lengths, language scores, quoted texts:
``gristmill.report.workfiles``). A figure whose data the run lacks is replaced by a note that
says so.
"""
from __future__ import annotations

import numpy as np

from gristmill.manifests import Published, load_manifest

from . import dedup, tokens
from .hist import UNIT_EDGES, shown
from .page import Figure, Note, Page, Table, plot
from .workfiles import WorkFiles, find_run_dir, older_run_dir

TOP = 30  # rows of a long breakdown drawn; the table under the figure lists all of them


def dataset_page(published: Published, run_dir: str | None = None, searched: str | None = None,
                 work_dir_options: dict | None = None, older: str | None = None) -> Page:
    """``searched``: the --work-dir in which no run of this manifest was found (for the note);
    ``work_dir_options``: the storage options the run dir is read with (the job's); ``older``: the
    run dir of an earlier layout that made it (found, not read)."""
    m = published.manifest
    stats = m.stats
    acc = stats.get("accounting", {})
    work = WorkFiles(run_dir, work_dir_options) if run_dir else None
    tokens_out = stats.get("stages", {}).get("pack", {}).get("tokens_out", sum(s.tokens for s in m.shards))
    page = Page(
        title=f"{m.dataset} v{m.version}",
        subtitle=f"dataset card: {published.url} - created {m.created_at} - code {m.code_version}",
        totals=[("input", "input records", acc.get("input")), ("kept", "documents kept", acc.get("kept")),
                ("removed", "removed", sum(acc["removed"].values()) if acc else None),
                ("quarantined", "quarantined", sum(acc["quarantined"].values()) if acc else None),
                ("tokens_out", "tokens packed", tokens_out), ("shards", "shards", len(m.shards)),
                ("manifest_sha256", "manifest sha256", m.sha256)])
    if acc:
        page.totals.append(("balanced", "input = kept + removed + quarantined", "yes" if acc.get("balanced") else "NO"))
    if work is None:
        where = (f"{older} has its report.json, but is a run dir of an earlier gristmill (a file a partition), "
                 "whose files this version does not read: report it with the gristmill that wrote it" if older
                 else f"no run under {searched} has a report.json naming this manifest" if searched
                 else "pass --work-dir, the job's work_dir")
        page.section("workdir", "Work dir").add(Note(
            f"The prepare run's work dir was not found ({where}): the length and "
            "language-score histograms and the quoted documents need its files; every other figure comes from "
            "the manifest and the document index.", missing=True))
    funnel(page, stats, work)
    language(page, stats, m.config, work)
    lengths(page, work)
    for name, draw in STAGE_SECTIONS.items():
        draw(page, stats.get("stages", {}).get(name), m.config, work)
    tokens.tokens_section(page, published)
    tokens.chain_section(page, published)
    return page


def build(url: str, work_dir: str | None = None, work_dir_options: dict | None = None,
          storage_options: dict | None = None) -> tuple[Page, str | None]:
    """The page of the dataset version at ``url`` (read with ``storage_options``) and the run dir it
    was made in (None: not found), the work dir read with ``work_dir_options``."""
    published = load_manifest(url, **(storage_options or {}))
    sha = published.manifest.sha256
    run_dir = find_run_dir(work_dir, sha, work_dir_options) if work_dir else None
    older = older_run_dir(work_dir, sha, work_dir_options) if work_dir and not run_dir else None
    return dataset_page(published, run_dir, searched=None if run_dir else work_dir, work_dir_options=work_dir_options,
                        older=older), run_dir


def funnel(page: Page, stats: dict, work: WorkFiles | None) -> None:
    stages = stats.get("stages", {})
    sec = page.section("funnel", "Stage funnel")
    if not stages:
        sec.add(Note("This manifest has no per-stage statistics (not made by gristmill prepare).", missing=True))
        return
    seconds = {r["stage"]: r.get("wall_seconds") for r in (work.report["stages"] if work else [])}
    names = stage_order(stages, work)
    rows = []
    for n in names:
        s = stages[n]
        removed = s.get("removed", {})
        quarantined = s.get("quarantined", {})
        rows.append([n, s.get("documents_in"), s.get("documents_out"), sum(removed.values()), sum(quarantined.values()),
                     s.get("bytes_in"), s.get("bytes_out"), s.get("tokens_out"),
                     ", ".join(f"{k} {v:,}" for k, v in {**removed, **quarantined}.items()), seconds.get(n)])
    table = Table(["stage", "docs in", "docs out", "removed", "quarantined", "bytes in", "bytes out", "tokens out",
                   "by reason", "wall s"], rows)
    sec.add(Figure("funnel_documents", "Documents into and out of every stage",
                   lambda: plot().bars(names, {"in": [stages[n]["documents_in"] for n in names],
                                               "out": [stages[n].get("documents_out") or 0 for n in names]},
                                       xlabel="documents"), table),
            Figure("funnel_bytes", "Bytes into and out of every stage",
                   lambda: plot().bars([n for n in names if stages[n].get("bytes_in") is not None],
                                       {"in": [stages[n]["bytes_in"] for n in names if stages[n].get("bytes_in") is not None],
                                        "out": [stages[n].get("bytes_out") or 0 for n in names
                                                if stages[n].get("bytes_in") is not None]}, xlabel="bytes"),
                   Table(["stage", "bytes in", "bytes out"], [[n, stages[n].get("bytes_in"), stages[n].get("bytes_out")]
                                                              for n in names if stages[n].get("bytes_in") is not None])))
    if work is None:
        sec.add(Note("Stage times are in the run's report.json (work dir not found).", missing=True))
    # Removal reasons of every stage, drawn generically: a new stage's rules (e.g. quality
    # filters) show up here with no change to the report.
    reasons = [(n, r, v) for n in names for r, v in stages[n].get("removed", {}).items()]
    sec2 = page.section("reasons", "Removed and quarantined, by reason")
    if reasons:
        labels = [f"{n}: {r}" for n, r, _ in reasons]
        sec2.add(Figure("removed_by_reason", "Documents removed, by stage and reason",
                        lambda: plot().bars(labels, {"documents": [v for *_, v in reasons]}, xlabel="documents"),
                        Table(["stage", "reason", "documents"], [list(x) for x in reasons])))
    else:
        sec2.add(Note("No stage removed any document."))
    quarantined = [(n, r, v) for n in names for r, v in stages[n].get("quarantined", {}).items()]
    if quarantined:
        sec2.add(Figure("quarantined_by_reason", "Input records quarantined, by reason",
                        lambda: plot().bars([f"{n}: {r}" for n, r, _ in quarantined],
                                            {"records": [v for *_, v in quarantined]}, xlabel="records"),
                        Table(["stage", "reason", "records"], [list(x) for x in quarantined]),
                        caption="the bad records are in the run's quarantine.jsonl, with byte ranges"))
    else:
        sec2.add(Note("No input record was quarantined."))
    for n in names:
        if n in OWN_SECTIONS:
            continue
        for key, counts in sorted(stages[n].get("detail", {}).items()):
            # any stage's detail that counts things by name (e.g. a quality stage's rule hits)
            if not (isinstance(counts, dict) and counts and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                                for v in counts.values())):
                continue
            if not any(counts.values()):  # e.g. no PII found: a note, not an empty chart
                sec2.add(Note(f"{n}: {key.replace('_', ' ')}: none ({', '.join(sorted(counts))} all 0)."))
                continue
            items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
            sec2.add(Figure(f"{n}_{key}", f"{n}: {key.replace('_', ' ')}",
                            lambda items=items: plot().bars([str(k) for k, _ in items[:TOP]],
                                                            {key: [v for _, v in items[:TOP]]}, xlabel="count"),
                            Table([key, "count"], [list(kv) for kv in items])))


# The stages whose detail has a section of its own (drawn after the funnel, in this order), by
# stage name (pipeline.stages.STAGE_ORDER; tests/test_stage_registry.py checks the names); the
# funnel leaves their detail to them.
STAGE_SECTIONS = {
    "fuzzy_dedup": lambda page, stage, config, work: dedup.fuzzy_section(page, stage, work),
    "decontaminate": dedup.decontam_section,
}
OWN_SECTIONS = tuple(STAGE_SECTIONS)


def stage_order(stages: dict, work: WorkFiles | None) -> list[str]:
    """The stages in the order they ran: report.json's rows when the run dir is known (the
    manifest's JSON is key-sorted); else the executor's fixed order, any other stage that
    removes documents before tokenize."""
    have = [n for n, s in stages.items() if "documents_in" in s]
    if work is not None:
        ran = [r["stage"] for r in work.report.get("stages", []) if r["stage"] in have]
        return ran + [n for n in have if n not in ran]
    from gristmill.pipeline.stages import STAGE_ORDER  # the stages' modules: only for this fallback

    known = [n for n in STAGE_ORDER if n in have]
    others = [n for n in have if n not in STAGE_ORDER]
    at = known.index("tokenize") if "tokenize" in known else len(known)
    return known[:at] + others + known[at:]


def language(page: Page, stats: dict, config: dict, work: WorkFiles | None) -> None:
    lg = stats.get("stages", {}).get("language")
    if not lg:
        return
    sec = page.section("language", "Language")
    langs = sorted(lg.get("languages", {}).items(), key=lambda kv: (-kv[1], kv[0]))
    if langs:
        shown = langs[:TOP]
        sec.add(Figure("languages", "Language mix of the extracted documents (before the filter)",
                       lambda: plot().bars([k for k, _ in shown], {"documents": [v for _, v in shown]}, xlabel="documents (log scale)",
                                           log=True),
                       Table(["language", "documents"], [list(kv) for kv in langs]),
                       caption=f"allowed: {', '.join(config.get('language', {}).get('allowed') or []) or 'any'}"))
    else:
        sec.add(Note("Language identification was off for this dataset."))
    scores = work.language_scores() if work else None
    threshold = config.get("language", {}).get("threshold")
    if scores is not None and (scores[0].n or scores[1].n):
        edges, kept, removed = UNIT_EDGES, scores[0].counts, scores[1].counts  # the whole [0, 1] range, always
        sec.add(Figure("language_scores", "Language-ID score of each document",
                       lambda: plot().histogram({"kept": kept, "removed by the language stage": removed}, edges=edges,
                                                xlabel="language-ID confidence", vline=threshold,
                                                vlabel=f"threshold {threshold}"),
                       Table(["score from", "kept", "removed"], [[round(float(edges[i]), 3), int(kept[i]), int(removed[i])]
                                                                 for i in range(len(kept)) if kept[i] or removed[i]])))
    elif langs:
        sec.add(Note("The score distribution needs the run's work dir (docs/ and removed/language/).", missing=True))


def lengths(page: Page, work: WorkFiles | None) -> None:
    sec = page.section("lengths", "Document lengths")
    got = work.lengths() if work else None
    if got is None:
        sec.add(Note("The length histograms need the run's work dir (docs/, removed/).", missing=True))
        return
    edges, (before, after) = shown(*got)
    sec.add(Figure("length_histogram", "Document length in UTF-8 bytes, before and after filtering",
                   lambda: plot().histogram({"extracted": before, "kept (reached the tokenizer)": after}, edges=edges,
                                            xlabel="bytes (log scale)", log_x=True),
                   Table(["bytes from", "extracted", "kept"], [[int(edges[i]), int(before[i]), int(after[i])]
                                                               for i in range(len(before)) if before[i] or after[i]]),
                   caption=f"mean {got[0].mean:,.0f} B extracted, {got[1].mean:,.0f} B kept"))


__all__ = ["build", "dataset_page"]
