"""The pii stage's IP rule on real text: precision and recall, datatrove's pattern vs gristmill's (issue 26).

    .venv/bin/python benchmarks/bench_pii.py [--rescan]

Quick and single-threaded (well under a minute): no lock needed for the labelled part; --rescan
reads ~25,000 local files (~1 minute of one core), run it under /tmp/gristmill-heavy.lock.

The sample (benchmarks/data/pii_ip_sample.jsonl): real text of this machine's documentation,
Debian package docs and changelogs (/usr/share/doc), man page sources (/usr/share/man) and the
Python 3.13 standard library's sources (~25,000 files, 583 distinct ones with a candidate). Every
match of datatrove's dotted-quad pattern (PIIFormatter) that ``ipaddress`` parses as a public
address was a candidate (8,373 in all); at most 4 per file (content-deduplicated, seed 0) were
drawn, shuffled, and the first 450 labelled by hand: ``ip`` is true when the match stands for a
public IPv4 address in its text (an address, a network with its /n, a host:port, also a
documentation example such as ``--address=1.2.3.4``); false for versions, section numbers,
OIDs, CVS revisions and pieces of longer dotted numbers. Each row keeps the 60 characters
before the match and the 40 after it: exactly what ``pipeline.stages.pii.tasks.ip_in_context`` reads, so
the measurement needs nothing but this file. The rule was written looking at the first 300
rows (``split: dev``); the last 150 (``split: test``) were labelled after it was fixed and
never used to change it.

Reported per split: datatrove's precision (every candidate is replaced, so its recall on these
candidates is 1 by construction) and gristmill's precision and recall. Recall is over the
addresses datatrove's pattern finds; addresses it cannot find (IPv4 inside longer tokens) are
outside this sample. --rescan also counts, over all candidates of the local files, how many
each rule replaces (unlabelled).
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # noqa: E402 (run from a checkout)

from gristmill.pipeline.stages.pii.tasks import IP_CANDIDATE, IPV4, _ip_ok, ip_in_context  # noqa: E402

SAMPLE = os.path.join(os.path.dirname(__file__), "data", "pii_ip_sample.jsonl")
ROOTS = ["/usr/share/doc/**/*", "/usr/share/man/man*/*", "/root/.pyenv/versions/3.13.0/lib/python3.13/*.py",
         "/root/.pyenv/versions/3.13.0/lib/python3.13/*/*.py"]


def gristmill_replaces(before: str, match: str, after: str) -> bool:
    """Whether the pii stage replaces a public address overlapping the candidate ``match``."""
    text, lo = before + match + after, len(before)
    return any(m.start(1) < lo + len(match) and m.end(1) > lo and _ip_ok(m.group(1), True)
               and ip_in_context(text, m.start(1), m.end(1)) for m in IP_CANDIDATE.finditer(text))


def evaluate(rows: list[dict]) -> dict:
    truth = sum(r["ip"] for r in rows)
    pred = [gristmill_replaces(r["before"], r["match"], r["after"]) for r in rows]
    tp = sum(p and r["ip"] for p, r in zip(pred, rows))
    return {"rows": len(rows), "ips": truth,
            "datatrove": {"replaced": len(rows), "precision": round(truth / len(rows), 3), "recall": 1.0},
            "gristmill": {"replaced": sum(pred), "precision": round(tp / max(sum(pred), 1), 3),
                          "recall": round(tp / max(truth, 1), 3)},
            "misses": [r["before"][-30:] + "[[" + r["match"] + "]]" + r["after"][:20] for p, r in zip(pred, rows) if r["ip"] and not p],
            "false_replacements": [r["before"][-30:] + "[[" + r["match"] + "]]" + r["after"][:20] for p, r in zip(pred, rows)
                                   if p and not r["ip"]]}


def rescan() -> dict:
    """Over every candidate of the local files: how many each rule replaces (no labels)."""
    files = sorted({f for r in ROOTS for f in glob.glob(r, recursive=True) if os.path.isfile(f) and not os.path.islink(f)})
    old = new = 0
    for f in files:
        try:
            data = open(f, "rb").read()
            text = (gzip.decompress(data) if f.endswith(".gz") else data).decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
            continue
        for m in IPV4.finditer(text):
            if _ip_ok(m.group(0), True):
                old += 1
                new += gristmill_replaces(text[max(0, m.start() - 60):m.start()], m.group(0), text[m.end():m.end() + 40])
    return {"files": len(files), "datatrove_replacements": old, "gristmill_replacements": new}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rescan", action="store_true", help="also count replacements over all local candidates")
    a = ap.parse_args()
    rows = [json.loads(line) for line in open(SAMPLE, encoding="utf-8")]
    out = {split: evaluate([r for r in rows if r["split"] == split]) for split in ("dev", "test")}
    out["all"] = evaluate(rows)
    if a.rescan:
        out["rescan"] = rescan()
    print(json.dumps(out, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
