"""Stage 1, per partition (an input file or a run of small ones): read, extract, language-filter, hash for dedup.

The three per-document steps run fused in one pass over the file (no intermediate copy), but
each keeps its own counters and time so the report shows them as separate stages. Output of a
partition: the surviving documents, the removed ones (language), the quarantined records.
"""
from __future__ import annotations

import json
import resource
import time
from dataclasses import dataclass

from gristmill.manifests.hashing import sha256_file
from gristmill.manifests.storage import Store

from ...exact_keys import KEY_SCHEMA, keys_table
from ...id_files import ID_SCHEMA, ids_table
from ...documents import DOC_SCHEMA, QUARANTINE_SCHEMA, REMOVED_SCHEMA, make_id, make_order, norm_hash
from ...langid import identify
from ...partitions import InputFile
from ...readers import SYMLINK_OUTSIDE_ROOT, bad, read_records
from ...workdir import ParquetPart, WorkDir
from .config import ExtractConfig, LanguageConfig

STAGE = "extract"


@dataclass(frozen=True, slots=True)
class Source:
    """An ``inputs[]`` entry's own settings for its files: its minimum length and language
    threshold (None: the job-wide section's) and the store it is read through (None: the URL's)."""

    min_chars: int | None = None
    language_threshold: float | None = None
    store: Store | None = None


def extract_partition(task: dict, extract: ExtractConfig, language: LanguageConfig, wd: WorkDir,
                      batch_rows: int = 1024, sources: tuple[Source, ...] | None = None) -> dict:
    """Process one partition's files (``task["files"]``: ``InputFile``) in order; ``sources``: the
    settings of each ``inputs[]`` entry, by its index (None: the defaults for every file). Returns
    its stats (``pipeline.runner`` commits them as the task's marker once the outputs are in place)."""
    part = task["part"]
    docs = wd.part(wd.docs(part), DOC_SCHEMA)
    removed = wd.part(wd.removed("language", part), REMOVED_SCHEMA)
    quarantine = wd.part(wd.quarantine(part), QUARANTINE_SCHEMA)
    ex = {"records": 0, "documents": 0, "bytes_out": 0, "quarantined": {}, "seconds": 0.0}
    lg = {"documents_in": 0, "bytes_in": 0, "documents_out": 0, "bytes_out": 0, "removed": {}, "languages": {}, "seconds": 0.0}
    keys = {k: [] for k in KEY_SCHEMA.names[1:]}  # one partition's dedup keys (~80 B a document)
    ids = {k: [] for k in ID_SCHEMA.names[1:]} if task.get("check_ids") else None  # unique_ids' input
    inputs, cpu0 = [], time.process_time()
    for file in task["files"]:
        source = sources[file.input] if sources is not None else Source()
        t0 = time.perf_counter()
        batch: list[dict] = []
        if (refusal := _escaped(file, source)) is not None:
            records = [refusal]  # neither read nor hashed: not an input of the version
        else:
            sha, size = sha256_file(file.uri, store=source.store)
            inputs.append({"uri": file.uri, "bytes": size, "sha256": sha})
            records = read_records(file.uri, file.format, file.text_field, file.id_field,
                                   main_content=extract.html_main_content, batch_rows=batch_rows,
                                   html=file.text_format == "html", url_field=file.url_field,
                                   max_record_bytes=extract.max_record_bytes, store=source.store)  # reader limit
        for rec in records:
            rec["order"] = make_order(part, ex["records"])  # numbered across the partition's files, in file order
            ex["records"] += 1
            if "reason" not in rec:
                rec["text"] = rec["text"].strip()
                if (bad_field := _unencodable(rec)) is not None:
                    what = {"text": "the text", "user_id": f"id field {file.id_field!r}", "url": "the URL"}[bad_field]
                    rec.update(reason="lone_surrogate", detail=f"{what} holds a lone UTF-16 surrogate (e.g. a JSON \\ud800 "
                               "escape without its pair): not Unicode text, and not writable as UTF-8",
                               raw=rec[bad_field][:500].encode("utf-8", "backslashreplace").decode())
                elif len(rec["text"]) < (min_chars := source.min_chars or extract.min_chars):
                    rec.update(reason="empty", detail=f"{len(rec['text'])} characters after stripping (min_chars {min_chars})",
                               raw=rec["text"][:500])
                elif len(rec["text"]) > extract.max_chars:
                    rec.update(reason="huge", detail=f"{len(rec['text'])} characters (max_chars {extract.max_chars})", raw=rec["text"][:500])
            if "reason" in rec:
                ex["quarantined"][rec["reason"]] = ex["quarantined"].get(rec["reason"], 0) + 1
                quarantine.append({"source": file.uri, "position": _int64(rec["position"]), "offset": _int64(rec.get("offset")),
                                   "end": _int64(rec.get("end")), "part": part, "reason": rec["reason"], "detail": rec["detail"],
                                   "raw": rec.get("raw", "")})
                continue
            batch.append(rec)
            if len(batch) >= batch_rows:
                ex["seconds"] += time.perf_counter() - t0
                _finish_batch(batch, file, source, part, language, docs, removed, keys, ex, lg, ids)
                batch, t0 = [], time.perf_counter()
        ex["seconds"] += time.perf_counter() - t0
        _finish_batch(batch, file, source, part, language, docs, removed, keys, ex, lg, ids)
    key_file = wd.part(wd.keys(part), KEY_SCHEMA, row_group_size=4096)
    key_file.write(keys_table(keys))
    outputs = [docs, removed, quarantine, key_file]
    if ids is not None:
        outputs.append(wd.part(wd.ids(part), ID_SCHEMA, row_group_size=4096))
        outputs[-1].write(ids_table(ids))
    for p in outputs:
        p.commit()
    stats = {"part": part, "inputs": inputs, "extract": ex, "language": lg,
             "cpu_seconds": time.process_time() - cpu0,  # the whole task, all threads (a worker runs one task at a time)
             "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    return stats


def _escaped(file: InputFile, source: Source) -> dict | None:
    """The one quarantine record of a file that a symlink takes outside the folder its pattern
    matched under (asked just before it would be opened; nothing of it is read), else None."""
    if file.root is None:
        return None
    target = (source.store or Store.from_url(file.uri)).escapes(file.uri, file.root)
    if target is None:
        return None
    return bad(0, SYMLINK_OUTSIDE_ROOT, f"a symlink to {target}, outside {file.root} (the folder its pattern matched "
               "under); not read. Copy the file into the folder, or set follow_symlinks: true on its inputs[] entry")


def _int64(v: int | None) -> int | None:
    """A count a file claims (a WARC Content-Length, a Parquet footer) that no
    int64 column holds is unknown (null), never a crash while writing the quarantine row."""
    return v if v is None or -(1 << 63) <= v < (1 << 63) else None


def _unencodable(rec: dict) -> str | None:
    """The first string field of a good record that is not encodable as UTF-8 (JSON may spell
    lone surrogates; every later stage and the Parquet outputs need real UTF-8). Sets ``bytes``,
    the text's UTF-8 length, as it goes: the encoding is needed anyway."""
    for key in ("text", "user_id", "url"):
        if key in rec:
            try:
                n = len(rec[key].encode())
            except UnicodeEncodeError:
                return key
            if key == "text":
                rec["bytes"] = n
    return None


def _finish_batch(batch: list[dict], file: InputFile, source: Source, part: int, language: LanguageConfig, docs: ParquetPart, removed: ParquetPart,
                  keys: dict, ex: dict, lg: dict, id_rows: dict | None = None) -> None:
    if not batch:
        return
    texts = [r["text"] for r in batch]
    nbytes = [r["bytes"] for r in batch]
    ex["documents"] += len(batch)
    ex["bytes_out"] += sum(nbytes)
    t0 = time.perf_counter()
    if language.enabled:
        langs, scores = identify(texts, language.model)
    else:
        langs, scores = [None] * len(batch), [None] * len(batch)
    threshold = language.threshold if source.language_threshold is None else source.language_threshold  # per source
    keep = [not language.enabled or (lang in language.allowed and score >= threshold)
            for lang, score in zip(langs, scores)]
    lg["documents_in"] += len(batch)
    lg["bytes_in"] += sum(nbytes)
    ids = [r.get("user_id") or make_id(file.rel, r["position"]) for r in batch]
    out = {k: [] for k in DOC_SCHEMA.names}
    for r, i, lang, score, k, n in zip(batch, ids, langs, scores, keep, nbytes):
        if id_rows is not None:  # every good record's id, kept by the language filter or not
            for key, v in (("id", i), ("order", r["order"]), ("part", part), ("bytes", n), ("kept", k),
                           ("source", file.uri), ("position", r["position"])):
                id_rows[key].append(v)
        if lang is not None:
            lg["languages"][lang] = lg["languages"].get(lang, 0) + 1
        if not k:
            reason = "language" if lang not in language.allowed else "language_score"
            lg["removed"][reason] = lg["removed"].get(reason, 0) + 1
            removed.append({"id": i, "order": r["order"], "part": part, "bytes": n, "stage": "language", "reason": reason,
                            "detail": json.dumps({"lang": lang, "lang_score": score}), "text": r["text"]})
            continue
        lg["documents_out"] += 1
        lg["bytes_out"] += n
        for key, v in (("id", i), ("order", r["order"]), ("text", r["text"]), ("source", file.uri),
                       ("position", r["position"]), ("lang", lang), ("lang_score", score), ("part", part), ("bytes", n), ("url", r.get("url"))):
            out[key].append(v)
    lg["seconds"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    out["norm_hash"] = [norm_hash(t) for t in out["text"]]  # exact dedup's key, computed while the text is at hand
    ex["hash_seconds"] = ex.get("hash_seconds", 0.0) + time.perf_counter() - t0
    docs.write(out)
    for k in keys:
        keys[k].extend(out[k])
