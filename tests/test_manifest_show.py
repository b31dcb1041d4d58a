"""`gristmill manifest show`: the stage statistics as a table; --json keeps the machine form."""
import json

from helpers import build_dataset


STATS = {
    "stages": {
        "extract": {"documents_in": 120, "documents_out": 110, "bytes_in": 9000, "bytes_out": 8000,
                    "quarantined": {"empty": 4, "malformed_json": 6}},
        "language": {"documents_in": 110, "documents_out": 100, "bytes_in": 8000, "bytes_out": 7000,
                     "removed": {"language": 10}, "languages": {"de": 10, "en": 100}},
        "exact_dedup": {"documents_in": 100, "documents_out": 97, "bytes_in": 7000, "bytes_out": 6900,
                        "removed": {"exact_duplicate": 3}},
        "pii": {"documents_in": 97, "documents_out": 97, "bytes_in": 6900, "bytes_out": 6900, "removed": {},
                "detail": {"replacements": {"email": 5, "ip": 2}, "documents_changed": 4}},
        "tokenize": {"documents_in": 97, "documents_out": 97, "bytes_in": 6800, "tokens_out": 12345,
                     "splits": {"train": {"documents": 95, "tokens": 12000}, "validation": {"documents": 2, "tokens": 345}}},
        "pack": {"train": {"documents": 95, "tokens_in": 12000, "rows": 5, "shards": 1, "tokens_dropped_tail": 100},
                 "validation": {"documents": 2, "tokens_in": 345, "rows": 0, "shards": 0, "tokens_dropped_tail": 345},
                 "tokens_in": 12345, "tokens_out": 11900},
    },
    "accounting": {"input": 120, "kept": 97, "removed": {"exact_duplicate": 3, "language": 10},
                   "quarantined": {"empty": 4, "malformed_json": 6}, "balanced": True},
}


def test_show_prints_the_stage_table_and_json_the_manifest(tmp_path, capsys):
    from gristmill.cli import main

    pub = build_dataset(str(tmp_path), stats=STATS)
    assert main(["manifest", "show", pub.url]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.split()}
    assert lines["stage"].split()[:4] == ["stage", "docs", "in", "docs"]
    assert lines["extract"].split()[1:3] == ["120", "110"] and "empty 4, malformed_json 6" in lines["extract"]
    assert "language 10" in lines["language"] and "languages de 10, en 100" in lines["language"]
    assert lines["exact_dedup"].split()[1:5] == ["100", "97", "exact_duplicate", "3"]
    assert "replaced email 5, ip 2" in lines["pii"]
    assert "12,345" in lines["tokenize"] and "11,900" in lines["pack"]
    assert "input 120 = kept 97 + removed 13 + quarantined 10  [balanced]" in out
    assert "{" not in out  # no JSON in the human form
    assert main(["manifest", "show", "--json", pub.url]) == 0
    assert json.loads(capsys.readouterr().out)["stats"] == STATS
