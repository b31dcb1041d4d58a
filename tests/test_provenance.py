"""Inputs and provenance: HTML fields of JSONL/Parquet through the WARC extractor, and the
document's url (WARC-Target-URI or a url field) kept in the documents."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gristmill.errors import ConfigError
from gristmill.pipeline.config import PrepareConfig
from gristmill.pipeline.demo_corpus import _gz, _html, _warc_record
from gristmill.pipeline.html import html_to_text
from helpers import extract_files

PAGES = [_html(f"Title {i}", [f"Paragraph {i} about mills and rivers, long enough to be main content."] * 3)
         for i in range(3)]


def test_html_field_of_jsonl_and_parquet_is_extracted_like_a_warc_page(tmp_path):
    want = [html_to_text(p.encode(), "utf-8") for p in PAGES]
    assert all("Paragraph" in w and "Privacy" not in w for w in want)  # main content, footer dropped
    j = tmp_path / "pages.jsonl"
    j.write_text("".join(json.dumps({"content": p, "url": f"https://e.org/{i}"}) + "\n" for i, p in enumerate(PAGES))
                 + json.dumps({"content": "plain, no url"}) + "\n")
    pq.write_table(pa.table({"content": PAGES, "link": [f"https://p.org/{i}" for i in range(3)]}), tmp_path / "pages.parquet")
    _, docs, _ = extract_files(str(tmp_path / "wj"), [(str(j), "jsonl")], text_field="content",
                               text_format="html", url_field="url")
    assert [d["text"] for d in docs] == want + ["plain, no url"]
    assert [d["url"] for d in docs] == [f"https://e.org/{i}" for i in range(3)] + [None]
    _, docs, _ = extract_files(str(tmp_path / "wp"), [(str(tmp_path / "pages.parquet"), "parquet")], text_field="content",
                               text_format="html", url_field="link")
    assert [d["text"] for d in docs] == want and [d["url"] for d in docs] == [f"https://p.org/{i}" for i in range(3)]
    # text_format text (the default): the HTML is the text
    _, docs, _ = extract_files(str(tmp_path / "wt"), [(str(j), "jsonl")], text_field="content", url_field="url")
    assert docs[0]["text"] == PAGES[0].strip()


def test_warc_target_uri_is_the_document_url(tmp_path):
    p = tmp_path / "w.warc.gz"
    p.write_bytes(b"".join(_gz(_warc_record(f"https://w.org/{i}", page, i)) for i, page in enumerate(PAGES)))
    _, docs, _ = extract_files(str(tmp_path / "w"), [(str(p), "warc")])
    assert [d["url"] for d in docs] == [f"https://w.org/{i}" for i in range(3)]


def test_input_options_are_parsed_and_checked(tmp_path):
    base = {"output": {"store": str(tmp_path / "s"), "dataset": "d"}, "work_dir": str(tmp_path / "w")}
    job = PrepareConfig.from_dict({**base, "inputs": [{"path": "a.jsonl", "text_format": "html", "url_field": "link"}]})
    assert (job.inputs[0].text_format, job.inputs[0].url_field) == ("html", "link")
    assert PrepareConfig.from_dict({**base, "inputs": ["a.jsonl"]}).inputs[0].url_field == "url"
    with pytest.raises(ConfigError, match="text_format"):
        PrepareConfig.from_dict({**base, "inputs": [{"path": "a.jsonl", "text_format": "markdown"}]})
    for path, fmt in (("a.warc.gz", "warc"), ("a.txt", "text")):  # html would be ignored there: refused
        with pytest.raises(ConfigError, match=rf"inputs\[0\]\.text_format: expected .*got 'html' on a {fmt} input"):
            PrepareConfig.from_dict({**base, "inputs": [{"path": path, "text_format": "html"}]})


def test_a_url_field_that_is_also_the_id_or_text_field_is_read(tmp_path):
    from gristmill.pipeline.readers import read_parquet

    urls = [f"https://u.org/{i}" for i in range(3)]
    pq.write_table(pa.table({"text": ["a b", "c d", "e f"], "link": urls}), tmp_path / "p.parquet")
    recs = list(read_parquet(str(tmp_path / "p.parquet"), "text", "link", 1024, "link"))
    assert [r["url"] for r in recs] == urls
    recs = list(read_parquet(str(tmp_path / "p.parquet"), "link", None, 1024, "link"))
    assert [r["url"] for r in recs] == urls and [r["text"] for r in recs] == urls
