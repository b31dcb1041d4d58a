"""`gristmill loader bench`: runs end to end on a tiny synthetic dataset and on a given URL."""
import json

from gristmill.cli import main


def test_bench_synthetic_reports_cold_and_warm_as_json(capsys):
    rc = main(["loader", "bench", "--synthetic", "--sequences", "96", "--seq-len", "16", "--shard-rows", "16",
               "--steps", "6", "--global-batch", "8", "--step-ms", "1", "--latency-ms", "1", "--window-shards", "2",
               "--json", "-"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    cold, warm = out["passes"]
    assert (cold["name"], warm["name"]) == ("cold", "warm")
    assert cold["steps"] == warm["steps"] == 6
    assert cold["bytes_fetched"] > 0 and cold["cache_misses"] > 0
    assert warm["bytes_fetched"] == 0 and warm["cache_misses"] == 0 and warm["cache_hits"] > 0
    assert 0 <= cold["wait_fraction"] and cold["wait_p50_ms"] <= cold["wait_p95_ms"] <= cold["wait_max_ms"]
    assert cold["tokens_per_s"] > 0 and out["config"]["order"] == "window"


def test_bench_on_a_published_url_prints_a_table(toy_dataset, capsys):
    rc = main(["loader", "bench", toy_dataset.url, "--steps", "4", "--global-batch", "8", "--step-ms", "1",
               "--latency-ms", "0", "--bandwidth-mbps", "0", "--order", "global"])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["pass", "steps"] and lines[2].split()[:2] == ["cold", "4"]
    assert lines[3].split()[:2] == ["warm", "4"]


def test_bench_needs_a_url_or_synthetic(capsys):
    assert main(["loader", "bench"]) == 2
    assert "either a dataset URL or --synthetic" in capsys.readouterr().err


def test_bench_refuses_a_too_small_cache_limit(toy_dataset, capsys):
    assert main(["loader", "bench", toy_dataset.url, "--cache-limit-bytes", "100", "--steps", "2"]) == 2
    assert "too small for order='window'" in capsys.readouterr().err
