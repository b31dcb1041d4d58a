"""The quality rules against an earlier revision of themselves: CPU per GB and the same verdicts (issue 43).

    .venv/bin/python benchmarks/bench_quality_speed.py --corpus /tmp/gm-tp/200mb --base 6886b2b [--docs 100000]
        [--config throughput|default] [--rounds 2] [--script english|latin|cyrillic]

Run it under the shared lock (it does not take it). The base revision's ``pipeline/quality/`` is read
with ``git show`` into a temporary package and imported beside today's (``gristmill.pipeline.quality``);
both evaluate the same documents of ``bench_throughput.py``'s corpus (real prose, files in sorted
order) with the same section: ``throughput`` is that benchmark's job (Gopher repetition and quality
without the alpha-words rule; C4 and FineWeb off), ``default`` every rule set at its defaults (C4
dropping lines, FineWeb on C4's text).

Compared, document by document: the removal reason, the value and threshold it crossed, C4's new text,
and every metric (all equal as floats, not within a tolerance). Timed: CPU seconds (``process_time``)
of the per-document loop of each, after one warm-up document, ``--rounds`` alternating rounds (the
machine is shared; the best of each is kept). Reported: core-seconds per GB of text and the ratio.

``--script`` rewrites the corpus's words, the same way each time, to measure text whose tokens are not
ASCII (they take the regex, not the numba scanner): ``latin`` puts a diacritic in about one word in four
(as in German or French prose), ``cyrillic`` writes every letter in Cyrillic and gives each word one of
six endings (Russian's inflection: about six times the distinct tokens). Word lengths, punctuation,
lines and repetition stay the corpus's.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "throughput": {"gopher_quality": {"min_alpha_words_ratio": None}, "c4": {"enabled": False}, "fineweb": {"enabled": False}},
    "default": {},
}


def base_quality(rev: str, into: str):
    """``pipeline/quality`` of ``rev`` as the package ``quality_base`` (its imports are relative, or of gristmill.jit)."""
    pkg = os.path.join(into, "quality_base")
    os.makedirs(pkg)
    names = subprocess.run(["git", "-C", REPO, "ls-tree", "--name-only", f"{rev}:pipeline/quality"], check=True,
                           capture_output=True, text=True).stdout.split()
    for name in names:
        if name.endswith(".py"):
            src = subprocess.run(["git", "-C", REPO, "show", f"{rev}:pipeline/quality/{name}"], check=True,
                                 capture_output=True, text=True).stdout
            with open(os.path.join(pkg, name), "w") as f:
                f.write(src)
    sys.path.insert(0, into)
    return importlib.import_module("quality_base")


_LATIN = str.maketrans("aeiouc", "äéîöüç")
_CYRILLIC = str.maketrans("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
                          "абцдефгхийклмнопярстуввхызАБЦДЕФГХИЙКЛМНОПЯРСТУВВХЫЗ")
_ENDINGS = ("", "а", "ы", "ом", "ами", "ов")


def rewrite(doc: str, script: str) -> str:
    """``doc`` in another script (the module's docstring): a word's change depends on the word and
    its place, as inflection does, never on a random draw."""
    if script == "english":
        return doc
    out = []
    for i, tok in enumerate(doc.split(" ")):
        h = zlib.crc32(tok.encode())
        if script == "latin":
            out.append(tok.translate(_LATIN) if h % 4 == 0 else tok)
        else:
            core = tok.rstrip(".,;:!?\"')\n")
            ending = _ENDINGS[(h + i) % len(_ENDINGS)] if core.isalpha() else ""
            out.append(core.translate(_CYRILLIC) + ending + tok[len(core):])
    return " ".join(out)


def main() -> None:
    import bench_tokenize

    from gristmill.pipeline import quality as new
    from gristmill.pipeline.stages.quality.config import QualityConfig

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--base", required=True, help="the revision to compare with")
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="throughput")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--script", choices=("english", "latin", "cyrillic"), default="english")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    old = base_quality(a.base, tempfile.mkdtemp(prefix="gm-quality-base-"))
    cfg = QualityConfig.model_validate(CONFIGS[a.config])
    docs = [rewrite(d, a.script) for d in bench_tokenize.read_docs(a.corpus, a.docs)]
    gb = sum(len(d.encode()) for d in docs) / 1e9
    sets = {"old": old.rule_sets(cfg), "new": new.rule_sets(cfg)}
    mods = {"old": old, "new": new}
    for k in mods:
        mods[k].evaluate(docs[0], cfg, sets[k])  # numba's kernels load outside the clock
    best = {"old": float("inf"), "new": float("inf")}
    verdicts = {}
    for _ in range(a.rounds):
        for k in ("old", "new"):
            ev, s = mods[k].evaluate, sets[k]
            t0 = time.process_time()
            verdicts[k] = [ev(d, cfg, s) for d in docs]
            best[k] = min(best[k], time.process_time() - t0)
    differ = {"reason": 0, "value_threshold": 0, "text": 0, "metrics": 0}
    for o, n in zip(verdicts["old"], verdicts["new"]):
        differ["reason"] += o.reason != n.reason
        differ["value_threshold"] += (o.value, o.threshold) != (n.value, n.threshold)
        differ["text"] += o.text != n.text
        differ["metrics"] += o.metrics != n.metrics
    removed = sum(v.reason is not None for v in verdicts["new"])
    res = {"base": a.base, "config": a.config, "script": a.script, "docs": len(docs), "gb": gb, "removed": removed, "differ": differ,
           "core_s_per_gb": {k: v / gb for k, v in best.items()}, "speedup": best["old"] / best["new"]}
    print(f"{len(docs):,} documents ({gb * 1000:.1f} MB, {a.script}), config {a.config}, {removed:,} removed; "
          f"documents differing: {differ}")
    print(f"core-s per GB: base {a.base} {best['old'] / gb:.0f}, now {best['new'] / gb:.0f}: {res['speedup']:.2f}x "
          f"(best of {a.rounds} alternating rounds)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
