"""gristmill report without a browser: the pages' content, the plain-text fallback without the
`report` extra, the run page's numbers against the audit's, and that a page which cannot be
drawn never fails prepare. (tests/test_report_browser.py opens both pages of a real run in Chromium.)"""
from __future__ import annotations

import json
import logging
import os
import re
import sys

import pytest

from gristmill import cli
from gristmill.report import build_report, render_text, write_dataset_report, write_page
from gristmill.report.dedup import side_by_side
from helpers import write_checkpoint_meta


def figures_in(html: str) -> dict[str, str]:
    return dict(re.findall(r'<figure data-figure="([^"]+)">(.*?)</figure>', html, re.S))


def test_dataset_page_without_its_work_dir_draws_what_the_manifest_has_and_says_what_is_missing(toy_dataset, tmp_path):
    page, out = build_report(toy_dataset.url)
    assert out == f"toy-v{toy_dataset.manifest.version}.html"  # no run dir found: written here
    path = tmp_path / "card.html"
    assert write_page(page, str(path)) is True
    html = path.read_text()
    figs = figures_in(html)
    assert {"tokens_per_source", "tokens_per_file", "tokens_per_document", "shard_sizes"} <= set(figs)
    assert all("<svg" in f and "<path" in f for f in figs.values())
    assert "--work-dir" in html and 'class="missing"' in html  # the figures it cannot draw are named
    assert 'data-total="input"' not in html and 'data-total="removed"' not in html  # no accounting: no empty totals
    page, _ = build_report(toy_dataset.url, work_dir=str(tmp_path))
    assert f"no run under {tmp_path} has a report.json naming this manifest" in render_text(page)
    assert f'data-total="manifest_sha256" data-value="{toy_dataset.manifest.sha256}"' in html
    assert f"gristmill manifest verify {toy_dataset.url} --sha256 {toy_dataset.manifest.sha256}" in html
    # self-contained: no script, no stylesheet link, every href or src a fragment of the page itself
    assert "<script" not in html and "<link" not in html
    assert {v[:1] for v in re.findall(r'(?:href|src)="([^"]*)"', html)} <= {"#"}


def test_without_the_report_extra_the_page_is_plain_text_tables(toy_dataset, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    monkeypatch.delitem(sys.modules, "gristmill.report.figures", raising=False)
    out = tmp_path / "card.html"
    assert cli.main(["report", toy_dataset.url, "--out", str(out)]) == 0
    assert "tables only: pip install 'gristmill[report]'" in capsys.readouterr().out
    html = out.read_text()
    assert "<svg" not in html and "<pre>" in html and "matplotlib is not installed" in html
    shards = toy_dataset.manifest.shards
    assert f"shards: {len(shards)}" in html and shards[0].path in html  # the numbers are all there
    assert cli.main(["report", toy_dataset.url, "--text"]) == 0
    assert f"manifest sha256: {toy_dataset.manifest.sha256}" in capsys.readouterr().out


def test_a_new_stages_reasons_and_counted_detail_are_drawn_with_no_code_for_it(toy_dataset, tmp_path):
    """What a quality stage would put in the manifest: its rules as removal reasons, and a
    detail that counts hits by rule."""
    from dataclasses import replace

    from gristmill.manifests import Published
    from gristmill.report.dataset import dataset_page

    stages = {"extract": {"documents_in": 10, "documents_out": 10, "bytes_in": 900, "bytes_out": 1000, "quarantined": {}},
              "quality": {"documents_in": 10, "documents_out": 7, "bytes_in": 1000, "bytes_out": 600,
                          "removed": {"gopher_repetition": 2, "short_lines": 1},
                          "detail": {"rule_hits": {"gopher_repetition": 3, "short_lines": 1}, "threshold": 0.5}},
              "pii": {"documents_in": 7, "documents_out": 7, "detail": {"replacements": {"email": 0, "ip": 0}}},
              "tokenize": {"documents_in": 7, "documents_out": 7, "tokens_out": 70}}
    m = replace(toy_dataset.manifest, stats={"stages": stages, "accounting": {"input": 10, "kept": 7, "removed": {
        "gopher_repetition": 2, "short_lines": 1}, "quarantined": {}, "balanced": True}})
    path = tmp_path / "card.html"
    write_page(dataset_page(Published(m, toy_dataset.url)), str(path))
    figs = figures_in(path.read_text())
    assert "quality: gopher_repetition" in figs["removed_by_reason"] and "short_lines" in figs["removed_by_reason"]
    assert "gopher_repetition" in figs["quality_rule_hits"] and "<path" in figs["quality_rule_hits"]
    assert [n for n in figs if n.startswith("funnel")] == ["funnel_documents", "funnel_bytes"]
    assert "pii_replacements" not in figs and "pii: replacements: none (email, ip all 0)" in path.read_text()
    assert figs["funnel_documents"].index("extract") < figs["funnel_documents"].index("quality") \
        < figs["funnel_documents"].index("tokenize")  # the executor's order, the new stage before tokenize


def test_side_by_side_marks_the_words_only_one_document_has():
    left, right = side_by_side("the quick brown fox <b> jumps", "the quick red fox <b> jumps high")
    assert left == "the quick <del>brown</del> fox &lt;b&gt; jumps"
    assert right == "the quick <ins>red</ins> fox &lt;b&gt; jumps <ins>high</ins>"


def _fake_run(run_dir, published, steps=6):
    """metrics.jsonl as the trainer writes it (rank 1 three times slower: a straggler) and a
    checkpoint meta.json at the last step."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps({"kind": "train", "step": s, "loss": 5.0 - 0.1 * s, "grad_norm": 1.0, "lr": 1e-3,
                                "tokens_seen": s * 8 * 16, "tokens_per_s": 1000.0 + s, "tokens_per_s_per_device": 500.0,
                                "mfu": None, "input_wait_s": 0.01, "input_wait_pct": 3.0 + s, "step_s": 0.3,
                                "rank_step_s": [0.1, 0.3], "rank_input_wait_s": [0.01, 0.2],
                                "rank_collective_wait_s": [0.19, 0.0], "skipped": False, "skipped_total": 0}) + "\n")
            if s == steps:
                f.write(json.dumps({"kind": "straggler", "step": s, "rank": 1, "host": "node-b", "own_step_s": 0.3,
                                    "median_own_step_s": 0.2, "windows": 3, "input_wait_s": 0.2}) + "\n")
            if s % 3 == 0:
                f.write(json.dumps({"kind": "eval", "step": s, "val_loss": 5.5 - 0.1 * s}) + "\n")
                f.write(json.dumps({"kind": "checkpoint", "step": s, "blocked_s": 0.05, "young_daly_interval_s": 93.0}) + "\n")
    write_checkpoint_meta(run_dir, published, step=steps, world_size=2, global_batch=8)


def test_run_page_numbers_are_the_metrics_and_the_audits(toy_dataset, tmp_path, capsys):
    run = str(tmp_path / "run")
    _fake_run(run, toy_dataset)
    assert cli.main(["report", run]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {run}/report.html"
    html = open(os.path.join(run, "report.html")).read()
    figs = figures_in(html)
    assert {"loss", "tokens_per_s", "input_wait", "rank_step_s", "rank_input_wait_s", "rank_collective_wait_s",
            "checkpoint_save_s", "seen_per_source", "seen_per_language", "seen_per_file"} <= set(figs)
    assert re.search(r"<td>\d+</td><td>1</td><td>node-b</td>", html)  # the straggler, named with its host
    assert "mfu" not in figs and "MFU: not reported" in html  # no peak known: said, not drawn
    assert 'data-total="steps" data-value="6"' in html and 'data-total="val_loss" data-value="4.9"' in html
    # rank 1 is the straggler: three times the fastest rank's step time
    assert re.search(r"<td>1</td><td>0.3</td><td>0.3</td><td>3</td>", html)
    assert cli.main(["audit", "seen", run, "--json"]) == 0
    audit = json.loads(capsys.readouterr().out)
    for source, e in audit["by_source"].items():
        assert f"<td>{source}</td><td>{e['documents']:,}</td><td>{e['fully_seen']:,}</td><td>{e['tokens_seen']:,}</td>" in html
    assert f'data-total="documents_seen" data-value="{audit["documents_seen"]}"' in html


def test_a_page_that_cannot_be_drawn_never_fails_prepare(toy_dataset, tmp_path, monkeypatch, caplog):
    from gristmill.report import dataset

    def broken(*a, **k):
        raise ValueError("a figure fell over")

    monkeypatch.setattr(dataset, "dataset_page", broken)
    with caplog.at_level(logging.WARNING, logger="gristmill.report"):
        assert write_dataset_report(toy_dataset, str(tmp_path)) is None
    assert "could not write" in caplog.text and "a figure fell over" in caplog.text
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize("target, says", [("/no/such/dataset", "no manifest at /no/such/dataset"),
                                          ("RUN", "metrics.jsonl:2: not a JSON line")])
def test_report_errors_are_one_line(target, says, tmp_path, capsys):
    if target == "RUN":
        target = str(tmp_path)
        (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n{not json\n')
    assert cli.main(["report", target]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gristmill report: error: ") and says in err and err.count("\n") == 1


def test_histograms_add_up_file_by_file():
    import numpy as np

    from gristmill.report.hist import LOG_EDGES, UNIT_EDGES, Histogram, shown

    sizes = np.array([1, 3, 900, 1024, 70_000, 5])
    h = Histogram(LOG_EDGES).add(sizes[:2]).add(sizes[2:])
    assert (h.counts == np.histogram(sizes, LOG_EDGES)[0]).all() and h.n == 6 and h.mean == sizes.mean()
    edges, (counts,) = shown(h)
    assert edges[0] <= 1 < edges[1] and edges[-2] <= 70_000 < edges[-1] and counts.sum() == 6
    scores = Histogram(UNIT_EDGES).add([0.0, 0.5, 1.0, float("nan")])
    assert scores.n == 3 and scores.counts[0] == 1 and scores.counts[-1] == 1  # 1.0 is in the last bin; NaN in none


def test_the_fallback_stage_order_is_the_one_the_pipeline_runs(tmp_path):
    from gristmill.pipeline import stages
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.stages import STAGE_ORDER
    from gristmill.report.dataset import stage_order

    job = PrepareConfig.from_dict({"inputs": [{"path": "unused.jsonl", "id_field": "id"}], "output": {"store": str(tmp_path / "s"), "dataset": "d"},
                               "work_dir": str(tmp_path / "w"), "quality": {}, "fuzzy_dedup": {}, "decontaminate": {},
                               "pii": {}, "dedup_against": [str(tmp_path / "s" / "old" / "v1")]})
    assert [s.name for s in stages.build(job)] == [n for n in STAGE_ORDER if n != "language"]  # language: extract's filter
    counted = {n: {"documents_in": 1} for n in ("tokenize", "pii", "a_new_stage", "quality", "extract")}
    assert stage_order(counted, None) == ["extract", "quality", "pii", "a_new_stage", "tokenize"]
