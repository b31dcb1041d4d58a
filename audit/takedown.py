"""`gristmill takedown`: remove documents and their copies from a dataset (or every component of a
mixture), publish the new version(s), re-pin mixtures, and list the checkpoints that trained on
them; the answer is a report a compliance reviewer can read (:func:`report_markdown`) and JSON.

The parts: finding and rebuilding are the pipeline's (pipeline/takedown.py: the version's dedup
index, its fuzzy-dedup threshold, shards rewritten only where a removed document lived); which
checkpoints saw the documents is the audit's (audit/exposure.py, the loader's own order). This
module is where the two meet, as the audit is the one part that may call both (docs/architecture.md).
"""
from __future__ import annotations

import datetime as _dt

from gristmill.errors import UsageError
from gristmill.manifests.doc_index import read_published_doc_index
from gristmill.manifests.mixture import is_mixture, load_data
from gristmill.pipeline.takedown import Request, find_documents, publish_without

from .exposure import exposure


def _describe(published, doc_ids: list[str]) -> dict[str, dict]:
    """Provenance of removed documents from the version's document index: source, position, url, lang, tokens."""
    if not doc_ids:
        return {}
    spans = read_published_doc_index(published, columns=["doc_id", "source", "position", "lang", "url", "length"],
                                     filters=[("doc_id", "in", doc_ids)])
    g = spans.group_by("doc_id", use_threads=False).aggregate([("length", "sum")])
    tokens = dict(zip(g.column("doc_id").to_pylist(), g.column("length_sum").to_pylist()))
    firsts = {}
    for row in spans.to_pylist():
        firsts.setdefault(row["doc_id"], {k: row[k] for k in ("source", "position", "lang", "url")})
    return {d: {**firsts[d], "tokens": int(tokens[d])} for d in firsts}


def repin(mixture, replaced: dict[str, object]):
    """Publish ``mixture`` (a PublishedMixture) again with components replaced (old sha256 -> new
    Published); weights, budgets and policies as they were. Returns the new PublishedMixture."""
    from gristmill.manifests import ManifestStore
    from gristmill.manifests.mixture import build_mixture

    m = mixture.manifest
    resolved = [({"name": c.name, "weight": c.weight, "tokens": c.tokens, "exhausted": c.exhausted},
                 replaced.get(c.sha256, pub)) for c, pub in zip(m.components, mixture.components)]
    root = mixture.url.rstrip("/").rsplit("/", 2)[0]
    return load_data(ManifestStore(root).publish(build_mixture(m.name, resolved, root), ""))


def takedown(url: str, request: Request, *, runs: list[str] = (), repin_mixtures: list[str] = (),
             dry_run: bool = False) -> dict:
    """Find, remove and republish; list exposure. Returns the report (JSON-able)."""
    data = load_data(url)
    targets = list(zip([c.name for c in data.manifest.components], data.components)) if is_mixture(data) else [(None, data)]
    report = {"created_at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
              "request": {**request.to_dict(), "texts": list(request.texts)}, "data": url, "dry_run": dry_run,
              "versions": [], "mixtures": [], "runs": []}
    replaced, all_removed, missing = {}, set(), None
    for component, pub in targets:
        found = find_documents(pub, request)
        m = pub.manifest
        about = _describe(pub, found.doc_ids)
        removed = [{**r, **about.get(r["doc_id"], {})} for r in found.removals.to_pylist()]
        entry = {"component": component, "dataset": m.dataset, "parent": {"url": pub.url, "version": m.version,
                                                                           "sha256": m.sha256},
                 "threshold": found.threshold, "minhash": found.params, "removed": removed,
                 "kept_below_threshold": found.kept, "not_found": found.not_found, "new": None}
        missing = set(found.not_found) if missing is None else missing & set(found.not_found)
        all_removed |= set(found.doc_ids)
        if found.doc_ids and not dry_run:
            rebuilt = publish_without(pub, found, request)
            new = rebuilt.published
            replaced[m.sha256] = new
            entry["new"] = {"url": new.url, "version": new.manifest.version, "sha256": new.manifest.sha256,
                            "shards_rewritten": rebuilt.rewritten, "shards_dropped": rebuilt.dropped,
                            "shards_reused": len(rebuilt.reused), "tokens_removed": rebuilt.tokens_removed,
                            "tokens_dropped_tail": rebuilt.tokens_dropped_tail,
                            "dedup_index_files_rewritten": rebuilt.dedup_files_rewritten}
        report["versions"].append(entry)
    if not all_removed:
        raise UsageError(f"takedown: nothing in {url} matches the request ({'; '.join(sorted(missing or [])) or 'empty'}); "
                         "check the ids / URLs, or pass the text with --text")
    report["not_found"] = sorted(missing or [])
    mixtures = ([url] if is_mixture(data) else []) + list(repin_mixtures)
    for mix_url in mixtures:
        mix = load_data(mix_url)
        if not is_mixture(mix):
            raise UsageError(f"--repin {mix_url}: not a mixture (a dataset version); name a mixture made by gristmill mix")
        hit = [c.name for c in mix.manifest.components if c.sha256 in replaced]
        entry = {"mixture": mix.url, "version": mix.manifest.version, "sha256": mix.manifest.sha256, "components": hit}
        if hit and not dry_run:
            new = repin(mix, replaced)
            entry["new"] = {"url": new.url, "version": new.manifest.version, "sha256": new.manifest.sha256}
        report["mixtures"].append(entry)
    if runs:
        report["runs"] = exposure(list(runs), sorted(all_removed))
    return report


def report_markdown(report: dict) -> str:
    """The takedown report as a page a reviewer reads: what was asked, what was removed and why, the
    new versions, the mixtures re-pinned, and every checkpoint that trained on a removed document."""
    r = report["request"]
    out = [f"# Takedown report ({report['created_at']})", "",
           f"Data: `{report['data']}`" + ("  (**dry run**: nothing was published)" if report["dry_run"] else ""), "",
           "## Request", "", f"- reason: {r['reason']}"]
    out += [f"- document id: `{d}`" for d in r["doc_ids"]] + [f"- URL: {u}" for u in r["urls"]]
    out += [f"- text #{k + 1}: \"{t[:200]}{'...' if len(t) > 200 else ''}\"" for k, t in enumerate(r["texts"])]
    if report["not_found"]:
        out += ["", "Not found in the data: " + ", ".join(report["not_found"])]
    for v in report["versions"]:
        name = f"{v['dataset']} v{v['parent']['version']}" + (f" (component {v['component']})" if v["component"] else "")
        out += ["", f"## {name}", "", f"Parent: `{v['parent']['url']}` sha256 `{v['parent']['sha256']}`", "",
                f"Copies searched with the version's dedup index: MinHash {v['minhash'].get('num_perm')} permutations of "
                f"{v['minhash'].get('ngram')}-word shingles, near copy at estimated Jaccard >= {v['threshold']} (the "
                "version's own fuzzy-dedup threshold); exact copy: the same normalised text.", ""]
        if not v["removed"]:
            out += ["No document of this version matches the request."]
            continue
        out += ["| document | why | matched | similarity | source | url | tokens |", "|---|---|---|---|---|---|---|"]
        for d in v["removed"]:
            sim = "" if d["similarity"] is None else f"{d['similarity']:.3f}"
            out.append(f"| `{d['doc_id']}` | {d['match']} | {d['target']} | {sim} | {d.get('source') or ''} "
                       f"{'' if d.get('position') is None else '@' + str(d['position'])} | {d.get('url') or ''} | "
                       f"{d.get('tokens', '')} |")
        if v["kept_below_threshold"]:
            out += ["", f"Considered and kept (estimated Jaccard below {v['threshold']}, at least 0.5): " + ", ".join(
                f"`{k['doc_id']}` ({k['similarity']:.3f} to {k['target']})" for k in v["kept_below_threshold"])]
        n = v["new"]
        if n:
            out += ["", f"Published **{v['dataset']} v{n['version']}** at `{n['url']}` (sha256 `{n['sha256']}`), whose "
                    f"manifest names this parent and the removals (`stats.takedown`). Shards rewritten: "
                    f"{len(n['shards_rewritten'])} ({', '.join(n['shards_rewritten'])}); dropped: "
                    f"{len(n['shards_dropped'])}{' (' + ', '.join(n['shards_dropped']) + ')' if n['shards_dropped'] else ''}; reused byte for byte: {n['shards_reused']}. Tokens removed: "
                    f"{n['tokens_removed']:,}; dropped as a rewritten shard's partial last row: {n['tokens_dropped_tail']:,}. "
                    f"Check it with `gristmill manifest verify {n['url']}`."]
    if report["mixtures"]:
        out += ["", "## Mixtures", ""]
        for mx in report["mixtures"]:
            what = (f"re-pinned as v{mx['new']['version']} `{mx['new']['url']}` (sha256 `{mx['new']['sha256']}`)"
                    if mx.get("new") else "not re-pinned" + (" (dry run)" if mx["components"] else
                                                             ": pins no version changed here"))
            out.append(f"- `{mx['mixture']}` v{mx['version']}: components {', '.join(mx['components']) or 'none'} {what}")
    if report["runs"]:
        out += ["", "## Checkpoints that trained on a removed document", "",
                "| checkpoint | step | documents: steps that trained on them |", "|---|---|---|"]
        for e in report["runs"]:
            if e.get("error"):
                out.append(f"| `{e['checkpoint'] or e['run']}` | | could not be audited: {e['error']} |")
            else:
                docs = "; ".join(f"`{d}`: {_ranges(s)}" for d, s in e["documents"].items()) or "none"
                out.append(f"| `{e['checkpoint']}` | {e['step']} | {docs} |")
        out += ["", "Steps are the runs' optimizer steps (a rewound spike's skipped samples and steps whose update "
                "was skipped are not counted: no model was trained on them)."]
    out += ["", "## What this does not do", "",
            "- Earlier versions stay published and unchanged (they are content-addressed); delete them from the "
            "store if the request requires it.",
            "- Checkpoints listed above keep what they learned; retraining or unlearning is a separate decision."]
    return "\n".join(out) + "\n"


def _ranges(steps: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``1-3, 7``."""
    out, start = [], None
    for i, s in enumerate(steps):
        if start is None:
            start = s
        if i + 1 == len(steps) or steps[i + 1] != s + 1:
            out.append(f"{start}-{s}" if s != start else str(s))
            start = None
    return ", ".join(out)
