"""``gristmill demo-corpus OUT_DIR``: a small, deterministic, multilingual corpus with ground truth.

Offline and reproducible: English prose is assembled from the docstrings of Python's own
standard library (a fixed module list, a fixed-seed RNG); German, French and Spanish
paragraphs are written here. Layout::

    OUT_DIR/corpus/00-books.jsonl.zst    English documents, near-duplicate pairs, contaminated docs
    OUT_DIR/corpus/01-news.jsonl.gz      English + German/French/Spanish + exact duplicates of 00
    OUT_DIR/corpus/02-forum.jsonl        plain JSONL with every kind of bad record
    OUT_DIR/corpus/03-wiki.parquet       text in column `content`, ids in column `doc_id`
    OUT_DIR/corpus/04-cut.jsonl.gz       truncated gzip
    OUT_DIR/corpus/05-cut.jsonl.zst      truncated zstd
    OUT_DIR/corpus/06-web.warc.gz        HTML pages with navigation and footer boilerplate
    OUT_DIR/corpus/07-notes-NN.txt       plain text files, one document each
    OUT_DIR/evals/demo_qa.jsonl          evaluation set: {"id", "text"}
    OUT_DIR/truth/*.jsonl                what was planted (see below)

Document ids follow the pipeline's rule ``<file name>:<position>`` (the corpus files share one
directory, and a prepare job over ``corpus/*`` names them relative to it).

truth/exact_duplicates.jsonl  {"id", "duplicate_of"}: copies (verbatim or differing only in
                              case, punctuation, whitespace) of an earlier document
truth/near_duplicates.jsonl   {"a", "b", "jaccard", "expect"}: jaccard is the exact Jaccard of
                              the word-5-gram sets (``pipeline.text.words``); expect is
                              "duplicate" (about 0.9 / 0.85) or "distinct" (below 0.6)
truth/contaminated.jsonl      {"doc_id", "eval_set", "eval_item"}: an eval item pasted verbatim
truth/languages.jsonl         {"id", "lang"} for the non-English documents
truth/bad_records.jsonl       {"source", "position", "reason"} expected in quarantine
"""
from __future__ import annotations

import gzip
import importlib
import inspect
import io
import json
import os
import random
import warnings

import pyarrow as pa
import pyarrow.parquet as pq

from .text import words

SEED = 20261129
MODULES = (
    "abc argparse ast asyncio base64 bisect calendar collections configparser contextlib copy csv dataclasses datetime "
    "decimal difflib email enum fractions functools gettext glob gzip hashlib heapq hmac html http.client imaplib "
    "inspect io ipaddress itertools json locale logging lzma mailbox mimetypes multiprocessing numbers operator optparse "
    "os pathlib pickle pkgutil platform plistlib poplib pprint queue random re sched secrets selectors shelve shlex shutil "
    "signal smtplib socket socketserver sqlite3 ssl statistics string struct subprocess tarfile tempfile textwrap "
    "threading timeit token tokenize trace traceback typing unittest urllib.parse urllib.request uuid warnings wave "
    "weakref xml.dom.minidom zipfile zoneinfo"
).split()

FOREIGN = {
    "de": [
        "Die Mühle am Fluss wurde im vierzehnten Jahrhundert gebaut und mahlte jahrhundertelang das Getreide der umliegenden "
        "Dörfer. Heute ist sie ein Museum, in dem Besucher sehen können, wie aus Korn Mehl wird.",
        "Der Zug nach Hamburg hatte wieder einmal Verspätung, und die Reisenden warteten geduldig auf dem zugigen Bahnsteig. "
        "Niemand wusste genau, wann er ankommen würde, aber alle hofften auf eine baldige Durchsage.",
        "In der Bibliothek der Stadt gibt es mehr als hunderttausend Bücher, darunter viele seltene Handschriften aus dem "
        "Mittelalter. Die Mitarbeiter helfen gern bei der Suche nach Quellen für wissenschaftliche Arbeiten.",
        "Wer im Winter durch die Berge wandert, sollte warme Kleidung, ausreichend Wasser und eine gute Karte mitnehmen. "
        "Das Wetter kann sich schnell ändern, und der Weg zurück ist oft länger, als man denkt.",
    ],
    "fr": [
        "Le moulin du village a été restauré par une association de bénévoles qui souhaitaient préserver ce patrimoine. "
        "Chaque été, ils organisent des visites et expliquent aux enfants comment on fabriquait la farine autrefois.",
        "La bibliothèque municipale propose des ateliers d'écriture pour les adultes et des lectures de contes pour les plus "
        "jeunes. L'inscription est gratuite et ouverte à tous les habitants de la commune.",
        "Après une longue journée de travail, elle aimait se promener le long de la rivière et regarder les bateaux passer. "
        "Le bruit de l'eau l'aidait à oublier les soucis du bureau et à retrouver son calme.",
        "Les chercheurs ont publié une étude détaillée sur l'évolution du climat dans les Alpes au cours du dernier siècle. "
        "Leurs conclusions montrent que les glaciers reculent plus vite que prévu.",
    ],
    "es": [
        "El molino de agua del pueblo funcionó durante casi doscientos años antes de cerrar definitivamente. Hoy los vecinos "
        "quieren convertirlo en un centro cultural donde se puedan celebrar conciertos y exposiciones.",
        "La biblioteca pública abre todos los días de la semana y ofrece acceso gratuito a internet, periódicos y revistas. "
        "Además, organiza clubes de lectura para personas de todas las edades.",
        "Cuando llegamos a la playa, el sol ya se estaba poniendo y el cielo tenía un color naranja precioso. Nos sentamos en "
        "la arena y nos quedamos mirando el mar hasta que se hizo de noche.",
        "Los científicos han descubierto una nueva especie de rana en los bosques tropicales del sur del país. El animal es "
        "pequeño, de color verde brillante, y solo vive cerca de los arroyos de montaña.",
    ],
}

EVAL_ITEMS = [
    "The miller of Ashford ground forty bushels of rye every morning before the river froze in the winter of the great flood year.",
    "A quorum of seven wardens must approve any change to the canal tolls, and their vote is recorded in the ledger kept at the lock house.",
    "Silver lanterns were hung along the harbour wall so that the fishing boats could find the narrow entrance on moonless nights.",
    "The orchard keeper planted eleven rows of pear trees, each row facing east, because the old almanac promised a sweeter harvest that way.",
    "When the observatory dome jammed, the astronomers opened the roof by hand and recorded the comet through a gap of nine inches.",
    "Every clerk in the counting house learned to add columns of figures backwards, from the bottom, to catch the errors of the day.",
    "The ferry between the two islands carried mail, livestock and a piano exactly once, an event the villagers still celebrate each spring.",
    "Beekeepers on the northern slope painted their hives in three colours so that the bees would return to the right home after foraging.",
    "The glassblower's apprentice spent four years making only bottles before he was allowed to shape a single drinking glass.",
    "In the archive beneath the town hall, the oldest map shows a road that no longer exists and a bridge that was never built.",
    "The lighthouse logbook records that the lamp was lit for three hundred and sixty five consecutive nights without a single failure.",
    "Weavers in the valley used undyed wool for the warp and coloured wool for the weft, which gave their blankets a distinctive striped edge.",
]
CONTAMINATED = (1, 4, 7, 10)  # indices of EVAL_ITEMS pasted into corpus documents

NAV = "<nav><a href='/'>Home</a> | <a href='/about'>About</a> | <a href='/contact'>Contact</a></nav>"
FOOTER = "<footer>Copyright 2026 Example Pages. All rights reserved. Privacy | Terms | Cookies</footer>"


def stdlib_paragraphs() -> list[str]:
    """Prose paragraphs of Python's help topics and the standard library's docstrings, each once."""
    from pydoc_data.topics import topics

    paras, seen = [], set()  # seen: paragraphs and their word 13-grams
    docs = [topics[k] for k in sorted(topics)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for doc in docs:
            _add_paragraphs(doc, paras, seen)
        for name in MODULES:
            try:
                mod = importlib.import_module(name)
            except ImportError:
                continue
            objs = [mod] + [getattr(mod, n) for n in sorted(dir(mod)) if not n.startswith("_")]
            for obj in objs:
                members = [obj] + ([getattr(obj, n, None) for n in sorted(vars(obj)) if not n.startswith("_")]
                                   if inspect.isclass(obj) else [])
                for m in members:
                    _add_paragraphs(inspect.getdoc(m) if m is not None else None, paras, seen)
    return paras


def _add_paragraphs(doc: str | None, paras: list[str], seen: set) -> None:
    """Keep prose paragraphs that share no word 13-gram with one kept before (docstrings repeat
    sentences, e.g. str.lower and bytes.lower), so documents overlap only where planted."""
    for p in (doc or "").split("\n\n"):
        p = " ".join(p.split())
        if len(p.split()) < 20 or sum(c.isalpha() or c == " " for c in p) < 0.85 * len(p):
            continue
        w = words(p)
        grams = {tuple(w[i:i + 13]) for i in range(max(1, len(w) - 12))}
        if grams & seen:
            continue
        seen.update(grams)
        paras.append(p)


def english_documents(paras: list[str], n: int, rng: random.Random, vocab: list[str]) -> list[str]:
    """``n`` documents of 2-6 paragraphs, each paragraph used once per pass over the pool.

    From the second pass on, every 5th word of a reused paragraph is replaced (at an offset that
    depends on the pass), so no two documents share a word 5-gram or 13-gram by accident: the
    only duplicates and contaminations in the corpus are the planted ones.
    """
    docs, pool, at, passes = [], [], 0, 0
    while len(docs) < n:
        if len(pool) - at < 6:
            pool, at = list(paras), 0
            rng.shuffle(pool)
            pool = [_perturb(p, passes, rng, vocab) for p in pool] if passes else pool
            passes += 1
        k = rng.randint(2, 6)
        docs.append("\n\n".join(pool[at:at + k]))
        at += k  # an index, not pool = pool[k:]: that copy per document was quadratic in the pool's size
    return docs


def _perturb(paragraph: str, passes: int, rng: random.Random, vocab: list[str]) -> str:
    words = paragraph.split(" ")
    for i in range((passes - 1) % 5, len(words), 5):
        new = rng.choice(vocab)
        while new.casefold() == words[i].casefold().strip(".,;:()"):
            new = rng.choice(vocab)
        words[i] = new
    return " ".join(words)


def shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i:i + n]) for i in range(max(0, len(w) - n + 1))}


def jaccard(a: str, b: str) -> float:
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


def near_duplicate(text: str, target: float, rng: random.Random, vocab: list[str]) -> tuple[str, float]:
    """Replace random words until the word-5-gram Jaccard with ``text`` drops to ``target``."""
    toks = text.split(" ")
    while True:
        i = rng.randrange(len(toks))
        toks[i] = rng.choice(vocab)
        variant = " ".join(toks)
        j = jaccard(text, variant)
        if j <= target:
            return variant, j


def _zst(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=3).compress(data)


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()


def _warc_record(url: str, html: str, n: int) -> bytes:
    body = html.encode()
    http = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    head = (f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: {url}\r\nWARC-Date: 2026-11-29T00:00:00Z\r\n"
            f"WARC-Record-ID: <urn:uuid:00000000-0000-0000-0000-{n:012d}>\r\n"
            f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(http)}\r\n\r\n").encode()
    return head + http + b"\r\n\r\n"


def _html(title: str, paragraphs: list[str]) -> str:
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return (f"<!DOCTYPE html><html><head><title>{title}</title><style>p {{ margin: 0 }}</style>"
            f"<script>var tracking = 1;</script></head><body>{NAV}<main><article><h1>{title}</h1>{body}</article></main>"
            f"{FOOTER}</body></html>")


def _variant_case_punct(text: str) -> str:
    """Same normalised text: lower case, extra spaces and punctuation (upper case would fool
    the language identifier, and the copy would leave by the language filter instead)."""
    return "  " + text.lower().replace(". ", " . ;  ") + " !!  "


def _clearly_english(texts: list[str], min_score: float = 0.85) -> list[bool]:
    """Planted documents must pass the default language filter, or the truth would be moot."""
    from .langid import identify

    langs, scores = identify(texts)
    return [lang == "en" and score >= min_score for lang, score in zip(langs, scores)]


def write_demo_corpus(out_dir: str, scale: int = 1) -> dict:
    """The corpus files, evals/demo_qa.jsonl and truth/*.jsonl (the planted ground truth) under
    ``out_dir``; the same bytes for the same ``scale``, every time."""
    rng = random.Random(SEED)
    paras = stdlib_paragraphs()
    vocab = sorted({w for p in paras[:400] for w in p.split() if w.isalpha() and len(w) > 2})
    docs = english_documents(paras, 1400 * scale, rng, vocab)
    truth: dict[str, list] = {k: [] for k in ("exact_duplicates", "near_duplicates", "contaminated", "languages",
                                              "bad_records")}
    files: dict[str, bytes] = {}
    books, used, english = _books(docs[: 700 * scale], rng, vocab, truth)
    files["00-books.jsonl.zst"] = _zst(_jsonl(books))
    files["01-news.jsonl.gz"] = _gz(_jsonl(_news(docs[700 * scale: 1100 * scale], books, used, english, truth)))
    files["02-forum.jsonl"] = _forum(docs[1100 * scale: 1200 * scale], truth)
    files["03-wiki.parquet"] = _wiki(docs[1200 * scale: 1300 * scale], truth)
    files.update(_truncated(docs[1300 * scale: 1320 * scale], truth))
    files["06-web.warc.gz"] = _warc(docs[1320 * scale: 1380 * scale])
    for i, t in enumerate(docs[1380 * scale: 1400 * scale]):  # 07-notes-NN.txt: plain text, one document per file
        files[f"07-notes-{i:02d}.txt"] = t.encode()
    _write(out_dir, files, truth)
    return {"files": len(files), "bytes": sum(len(d) for d in files.values())}


def _books(docs: list[str], rng: random.Random, vocab: list[str], truth: dict) -> tuple[list[dict], set, list[bool]]:
    """00-books.jsonl.zst: the main English file, with near-duplicate pairs (appended) and
    contaminated documents (an eval item pasted in). Returns the records, the documents used as
    near-duplicate bases, and which of the originals are clearly English."""
    books = [{"text": t, "id": f"book-{i}"} for i, t in enumerate(docs)]
    english = _clearly_english([r["text"] for r in books])
    used = _plant_near_duplicates(books, english, rng, vocab, truth)
    _plant_contamination(books, [i for i in range(len(docs)) if i not in used and english[i]], truth)
    return books, used, english


def _plant_near_duplicates(books: list[dict], english: list[bool], rng: random.Random, vocab: list[str],
                           truth: dict) -> set:
    """8 pairs at Jaccard ~0.9 and 8 at ~0.85 (to be merged), 8 at ~0.5 (to be kept apart)."""
    long_docs = [i for i, r in enumerate(books) if len(r["text"].split()) >= 250 and english[i]]
    plan = [(0.9, "duplicate")] * 8 + [(0.85, "duplicate")] * 8 + [(0.5, "distinct")] * 8
    bases = iter(long_docs)
    used = set()
    for target, expect in plan:
        while True:
            i = next(bases)
            variant, j = near_duplicate(books[i]["text"], target, rng, vocab)
            if _clearly_english([variant])[0]:
                break
        used.add(i)
        books.append({"text": variant, "id": f"book-{len(books)}"})
        truth["near_duplicates"].append({"a": f"00-books.jsonl.zst:{i}", "b": f"00-books.jsonl.zst:{len(books) - 1}",
                                         "jaccard": round(j, 6), "expect": expect})
    return used


def _plant_contamination(books: list[dict], candidates: list[int], truth: dict) -> None:
    """The CONTAMINATED eval items, each pasted into the middle of one of the last candidates."""
    for k, item in zip(candidates[-len(CONTAMINATED):], CONTAMINATED):
        parts = books[k]["text"].split("\n\n")
        parts.insert(len(parts) // 2, EVAL_ITEMS[item])
        books[k]["text"] = "\n\n".join(parts)
        truth["contaminated"].append({"doc_id": f"00-books.jsonl.zst:{k}", "eval_set": "demo_qa", "eval_item": f"qa-{item}"})


def _news(docs: list[str], books: list[dict], used: set, english: list[bool], truth: dict) -> list[dict]:
    """01-news.jsonl.gz: more English, the foreign-language documents, exact copies of books
    (every other one with case and punctuation changed: the same after normalisation)."""
    news = [{"text": t} for t in docs]
    for lang, ps in sorted(FOREIGN.items()):
        for j in range(len(ps)):
            news.append({"text": " ".join(ps[j:] + ps[:j])})  # rotations: distinct documents
            truth["languages"].append({"id": f"01-news.jsonl.gz:{len(news) - 1}", "lang": lang})
    dup_sources = [i for i in range(0, len(english), 41) if i not in used and english[i]][:6]
    for n, i in enumerate(dup_sources):
        text = books[i]["text"] if n % 2 == 0 else _variant_case_punct(books[i]["text"])
        news.append({"text": text})
        truth["exact_duplicates"].append({"id": f"01-news.jsonl.gz:{len(news) - 1}", "duplicate_of": f"00-books.jsonl.zst:{i}"})
    return news


def _forum(docs: list[str], truth: dict) -> bytes:
    """02-forum.jsonl: good records between one bad record of every kind."""
    lines: list[bytes] = []
    bad = [(b'{"text": "this line is not valid json', "malformed_json"),
           (b'{"text": "invalid utf-8 here: \xff\xfe"}', "invalid_utf8"),
           (b'{"body": "the text field is missing"}', "missing_text_field"),
           (b'{"text": 42}', "text_not_a_string"),
           (b'{"text": "   \\n  "}', "empty"),
           (json.dumps({"text": "huge " * 30000}).encode(), "huge")]
    for i, t in enumerate(docs):
        lines.append(json.dumps({"text": t}).encode())
        if i % 15 == 5 and bad:
            line, reason = bad.pop(0)
            truth["bad_records"].append({"source": "02-forum.jsonl", "position": len(lines), "reason": reason})
            lines.append(line)
    return b"\n".join(lines) + b"\n"


def _wiki(docs: list[str], truth: dict) -> bytes:
    """03-wiki.parquet: text column ``content``, one null."""
    content = list(docs) + [None]
    truth["bad_records"].append({"source": "03-wiki.parquet", "position": len(docs), "reason": "missing_text_field"})
    buf = io.BytesIO()
    pq.write_table(pa.table({"doc_id": [f"wiki-{i}" for i in range(len(content))], "content": content}), buf,
                   compression="zstd")
    return buf.getvalue()


def _truncated(docs: list[str], truth: dict) -> dict[str, bytes]:
    """04/05: truncated compressed files (the records before the cut are readable)."""
    cut = [{"text": t} for t in docs]
    gz, zst = _gz(_jsonl(cut)), _zst(_jsonl(cut))
    truth["bad_records"] += [{"source": "04-cut.jsonl.gz", "position": None, "reason": "truncated"},
                             {"source": "05-cut.jsonl.zst", "position": None, "reason": "truncated"}]
    return {"04-cut.jsonl.gz": gz[: len(gz) * 2 // 3], "05-cut.jsonl.zst": zst[: len(zst) * 2 // 3]}


def _warc(docs: list[str]) -> bytes:
    """06-web.warc.gz: HTML pages, one gzip member per record as in Common Crawl."""
    return b"".join(_gz(_warc_record(f"https://example.org/page/{i}", _html(f"Page {i}", p.split("\n\n")), i))
                    for i, p in enumerate(docs))


def _write(out_dir: str, files: dict[str, bytes], truth: dict) -> None:
    corpus, truth_dir, evals = (os.path.join(out_dir, d) for d in ("corpus", "truth", "evals"))
    for d in (corpus, truth_dir, evals):
        os.makedirs(d, exist_ok=True)
    for name, data in sorted(files.items()):
        with open(os.path.join(corpus, name), "wb") as f:
            f.write(data)
    with open(os.path.join(evals, "demo_qa.jsonl"), "wb") as f:
        f.write(_jsonl([{"id": f"qa-{i}", "text": t} for i, t in enumerate(EVAL_ITEMS)]))
    for name, rows in truth.items():
        with open(os.path.join(truth_dir, f"{name}.jsonl"), "wb") as f:
            f.write(_jsonl(rows))
