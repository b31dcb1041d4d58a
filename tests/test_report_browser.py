"""Both reports of a demo-like run, opened in the system's headless Chromium as a person would:
no console error, every figure drawn (an SVG with marks, a size on screen), and the totals the
page shows equal to report.json (dataset) and to metrics.jsonl and the audit (training run).

One prepare of the demo corpus with every stage (the session's Ray), then report.html as the
prepare command writes it (gristmill/cli/prepare.py); a 6-step tiny training run on it; `gristmill report RUN_DIR`. Chromium and chromedriver
come from Debian's packages (tests/setup_browser.sh installs them when missing)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from browser import inspect, start
from helpers import demo_job_dict

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DATASET_FIGURES = {"funnel_documents", "funnel_bytes", "removed_by_reason", "quarantined_by_reason", "languages",
                   "language_scores", "length_histogram", "cluster_sizes", "lsh_curve", "decontam_hits",
                   "tokens_per_source", "tokens_per_file", "tokens_per_language", "tokens_per_document", "shard_sizes"}
RUN_FIGURES = {"loss", "tokens_per_s", "input_wait", "rank_step_s", "checkpoint_save_s", "seen_per_source",
               "seen_per_language", "seen_per_file"}

PAIRS = """return {pairs: document.querySelectorAll('[data-pair]').length,
                   marked: document.querySelectorAll('[data-pair] ins, [data-pair] del').length,
                   hits: document.querySelectorAll('[data-hit] mark').length};"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.demo_corpus import write_demo_corpus
    from gristmill.cli.prepare import write_data_card
    from gristmill.pipeline.executor import prepare

    out = tmp_path_factory.mktemp("report")
    write_demo_corpus(str(out))
    job = demo_job_dict(out, out, output={"store": str(out / "store"), "dataset": "demo"},  # report_html: the default
                        language={"allowed": ["en"], "threshold": 0.65}, fuzzy_dedup={"threshold": 0.8},
                        decontaminate={"eval_sets": [{"name": "demo_qa", "path": str(out / "evals" / "demo_qa.jsonl"),
                                                      "id_field": "id"}]})
    result = prepare(PrepareConfig.from_dict(job), quiet=True)
    write_data_card(result, quiet=True)
    train_dir = str(out / "train")
    subprocess.run([sys.executable, "-m", "gristmill.trainer", os.path.join(ROOT, "configs", "train-tiny.yaml"),
                    "--set", f"data.manifest={result.url}", "--set", f"run.dir={train_dir}",
                    "--set", f"data.cache_dir={out / 'cache'}", "--set", "run.steps=6", "--set", "checkpoint.every=3",
                    "--set", "eval.every=3", "--set", "run.tensorboard=false"],
                   check=True, cwd=ROOT, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    from gristmill import cli

    assert cli.main(["report", train_dir]) == 0
    return result, train_dir


@pytest.fixture(scope="module")
def browser():
    driver = start()
    yield driver
    driver.quit()


def number(text: str) -> int:
    return int(text.replace(",", ""))


def assert_drawn(page: dict, expected: set[str]) -> None:
    assert page["severe"] == []
    drawn = {f["name"]: f for f in page["figures"]}
    assert expected <= set(drawn), f"missing figures: {sorted(expected - set(drawn))}"
    for f in page["figures"]:
        assert f["svg"] and f["marks"] > 0 and f["width"] > 100 and f["height"] > 50, f


def test_the_dataset_page_prepare_wrote(run, browser):
    result, _ = run
    path = os.path.join(result.run_dir, "report.html")
    page = inspect(browser, path)
    assert_drawn(page, DATASET_FIGURES)
    with open(os.path.join(result.run_dir, "report.json")) as f:
        rep = json.load(f)
    t, acc = page["totals"], rep["accounting"]
    assert number(t["input"]) == acc["input"] and number(t["kept"]) == acc["kept"]
    assert number(t["removed"]) == sum(acc["removed"].values())
    assert number(t["quarantined"]) == sum(acc["quarantined"].values())
    assert number(t["tokens_out"]) == rep["stats"]["pack"]["tokens_out"]
    assert number(t["shards"]) == next(r["shards"] for r in rep["stages"] if r["stage"] == "publish")
    assert t["manifest_sha256"] == rep["manifest_sha256"] == result.manifest_sha256
    quoted = browser.execute_script(PAIRS)
    assert quoted["pairs"] > 0 and quoted["marked"] > 0  # removed beside survivor, differences highlighted
    assert quoted["hits"] > 0  # each decontamination hit's matching passage is marked


def test_the_training_run_page(run, browser):
    _, train_dir = run
    page = inspect(browser, os.path.join(train_dir, "report.html"))
    assert_drawn(page, RUN_FIGURES)
    with open(os.path.join(train_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    last = [r for r in records if r["kind"] == "train"][-1]
    t = page["totals"]
    assert number(t["steps"]) == last["step"] == 6
    assert number(t["tokens_seen"]) == last["tokens_seen"]
    assert number(t["checkpoints"]) == len(os.listdir(os.path.join(train_dir, "checkpoints")))
    out = subprocess.run([sys.executable, "-m", "gristmill", "audit", "seen", train_dir, "--json"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    audit = json.loads(out)
    assert number(t["documents_seen"]) == audit["documents_seen"] and t["manifest_sha256"] == audit["manifest_sha256"]
