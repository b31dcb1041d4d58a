"""The fuzzy-dedup and decontamination sections: clusters, the LSH curve, removed documents
beside their survivors (difflib), and every eval-set hit with its matching passage."""
from __future__ import annotations

import difflib
import html

from gristmill.pipeline.lsh import false_negative_area, false_positive_area

from .page import Figure, Html, Note, Page, Table, plot

QUOTE_CHARS = 1500  # of each quoted document
PAIRS_SHOWN = 4



def _words(text: str) -> list[str]:
    return text.split()


def side_by_side(removed: str, survivor: str) -> tuple[str, str]:
    """Both texts as HTML, words only in the removed one in <del>, only in the survivor in <ins>."""
    a, b = _words(removed[:QUOTE_CHARS]), _words(survivor[:QUOTE_CHARS])
    left, right = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        la, lb = html.escape(" ".join(a[i1:i2])), html.escape(" ".join(b[j1:j2]))
        if op == "equal":
            left.append(la)
            right.append(lb)
        else:
            if la:
                left.append(f"<del>{la}</del>")
            if lb:
                right.append(f"<ins>{lb}</ins>")
    return " ".join(left), " ".join(right)


def fuzzy_section(page: Page, stage: dict | None, work) -> None:
    if not stage:
        return
    d = stage.get("detail", {})
    sec = page.section("fuzzy", "Fuzzy dedup (MinHash + LSH)")
    lsh = d.get("lsh", {})
    sizes = sorted(((int(k), v) for k, v in d.get("cluster_sizes", {}).items()))
    sec.add(Table(["documents in", "candidate pairs", "pairs linked", "clusters", "documents removed"],
                  [[d.get("documents_in"), d.get("candidate_pairs"), d.get("pairs_linked"), d.get("clusters"),
                    d.get("documents_removed")]]))
    if sizes:
        sec.add(Figure("cluster_sizes", "Clusters by size (the survivor included)",
                       lambda: plot().bars([str(k) for k, _ in sizes], {"clusters": [v for _, v in sizes]},
                                           xlabel="clusters", horizontal=False),
                       Table(["cluster size", "clusters"], [list(x) for x in sizes])))
    else:
        sec.add(Note("No near-duplicate cluster was found."))
    if lsh.get("bands") and lsh.get("rows"):
        b, r, t = lsh["bands"], lsh["rows"], lsh["threshold"]
        fp, fn = false_positive_area(t, b, r), false_negative_area(t, b, r)
        p = 1 - (1 - t ** r) ** b
        sec.add(Figure("lsh_curve", "LSH S-curve at these parameters",
                       lambda: plot().lsh_curve(b, r, t),
                       Table(["bands", "rows", "num_perm", "threshold", "P(candidate) at threshold",
                              "false-positive area", "false-negative area"],
                             [[b, r, lsh.get("num_perm"), t, round(p, 4), round(fp, 5), round(fn, 5)]]),
                       caption=f"a pair at Jaccard {t:g} becomes a candidate with probability {p:.4f} "
                               f"(expected miss rate at the threshold {1 - p:.2%}); "
                               f"{'every candidate is verified by exact Jaccard' if d.get('config', {}).get('verify', True) else 'candidates are not verified'}"))
    pairs = d.get("sample_pairs", [])[:PAIRS_SHOWN]
    if not pairs:
        return
    if work is None:
        sec.add(Note("Quoting removed documents beside their survivors needs the run's work dir.", missing=True))
        return
    texts = work.texts(ids=[i for p in pairs for i in (p["removed"], p["survivor"])])
    blocks, plain = [], []
    for p in pairs:
        gone, kept = texts.get(p["removed"]), texts.get(p["survivor"])
        if gone is None or kept is None:
            continue
        left, right = side_by_side(gone, kept)
        blocks.append(f'<div class="pair" data-pair="{html.escape(p["removed"])}"><div><h4>removed {html.escape(p["removed"])}, '
                      f'Jaccard {p["similarity"]}</h4>{left}</div><div><h4>survivor {html.escape(p["survivor"])}</h4>'
                      f'{right}</div></div>')
        plain.append(f"removed {p['removed']} ~ survivor {p['survivor']} (Jaccard {p['similarity']})")
    if blocks:
        sec.add(Note("Removed documents (left) beside the document that survived (right): words only in one of them "
                     "are struck or highlighted."), Html("".join(blocks), "\n".join(plain)))


def _passage(item: str, doc: str, pad: int = 12) -> tuple[str, str]:
    """The document's longest run of the item's words, as HTML with the run marked, and as text."""
    a, b = [w.lower() for w in _words(item)], _words(doc)
    m = difflib.SequenceMatcher(None, a, [w.lower() for w in b], autojunk=False).find_longest_match(0, len(a), 0, len(b))
    lo, hi = max(0, m.b - pad), min(len(b), m.b + m.size + pad)
    pre, hit, post = (" ".join(b[lo:m.b]), " ".join(b[m.b:m.b + m.size]), " ".join(b[m.b + m.size:hi]))
    html_ = f"{'… ' if lo else ''}{html.escape(pre)} <mark>{html.escape(hit)}</mark> {html.escape(post)}{' …' if hi < len(b) else ''}"
    return html_, hit


def _eval_items(config: dict) -> dict[tuple[str, str], str]:
    """(eval set, item id) -> item text, read from the job's eval files when they are still there."""
    from gristmill.pipeline.stages.decontaminate.config import EvalSetSpec

    out = {}
    for spec in (config.get("decontaminate") or {}).get("eval_sets", []):
        try:
            items = EvalSetSpec(**spec).read_items()
        except Exception:  # noqa: BLE001 - a moved or changed eval file only costs the quote
            continue
        out.update({(spec["name"], str(i)): t for i, t in items})
    return out


def decontam_section(page: Page, stage: dict | None, config: dict, work) -> None:
    if not stage:
        return
    d = stage.get("detail", {})
    sec = page.section("decontam", "Decontamination")
    per = dict(d.get("per_eval_set", {}))
    per.update((d.get("against_validation") or {}).get("per_eval_set", {}))
    set_rows = [[name, s["items"], s["items_indexed"], s["items_found"], s["documents_removed"], s["documents_cut"]]
            for name, s in per.items()]
    table = Table(["eval set", "items", "items indexed", "items found", "documents removed", "documents cut"], set_rows,
                  caption=f"{d.get('n')}-grams, policy {d.get('policy')}, min_matches {d.get('min_matches')}")
    sec.add(Figure("decontam_hits", "Eval-set items found in the training text, and documents removed or cut",
                   lambda: plot().bars([r[0] for r in set_rows], {"items found": [r[3] for r in set_rows],
                                                                  "documents removed": [r[4] for r in set_rows],
                                                                  "documents cut": [r[5] for r in set_rows]},
                                       xlabel="count"),
                   table))
    hits = [(name, f["item"], doc) for name, s in per.items() for f in s.get("found", []) for doc in f["documents"]]
    if not hits:
        sec.add(Note("No eval-set item occurs in the training text."))
        return
    items = _eval_items(config)
    texts = work.texts(ids=[doc["id"] for *_, doc in hits[:50]]) if work else {}
    rows, blocks = [], []
    for name, item, doc in hits:
        rows.append([name, item, doc["id"], doc["hits"], doc["action"]])
        text, item_text = texts.get(doc["id"]), items.get((name, str(item)))
        if text is not None and item_text is not None and len(blocks) < 50:
            passage, _ = _passage(item_text, text)
            blocks.append(f'<div class="pair" data-hit="{html.escape(doc["id"])}"><div><h4>{html.escape(name)} item '
                          f'{html.escape(str(item))}</h4>{html.escape(item_text[:QUOTE_CHARS])}</div><div><h4>'
                          f'{html.escape(doc["id"])} ({doc["hits"]} matching n-grams, {doc["action"]})</h4>{passage}</div></div>')
    sec.add(Table(["eval set", "item", "document", "matching n-grams", "action"], rows))
    cut_short = [f"{name}: {s['documents_listed']:,} of {s['matches']:,}" for name, s in per.items()
                 if s.get("matches", 0) > s.get("documents_listed", 0)]
    if cut_short:  # the manifest lists the first matches of a set only (decontaminate's LISTED_PER_SET)
        sec.add(Note("Matches listed above (the first of each eval set; all are counted): " + "; ".join(cut_short)
                     + ". Every removed document is in removed.jsonl with its eval item."))
    if blocks:
        sec.add(Note("Each hit: the eval item (left) and the matching passage of the training document (right)."),
                Html("".join(blocks), ""))
    else:
        sec.add(Note("The matching passages need the run's work dir and the eval files.", missing=True))
