"""`gristmill loader bench`: runs end to end on a tiny synthetic dataset and on a given URL."""
import json
import os

import pytest

from gristmill.cli import main


def bench_json(argv: list[str], capsys, names: tuple[str, str], steps: int) -> tuple[dict, dict, dict]:
    """`gristmill loader bench ... --json -`: its two passes (named ``names``, ``steps`` each) and the config."""
    assert main(["loader", "bench", *argv, "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    one, two = out["passes"]
    assert (one["name"], two["name"]) == names
    assert one["steps"] == two["steps"] == steps
    assert 0 <= one["wait_fraction"] and one["wait_p50_ms"] <= one["wait_p95_ms"] <= one["wait_max_ms"]
    return one, two, out["config"]


def test_bench_synthetic_reports_cold_and_warm_as_json(capsys):
    cold, warm, config = bench_json(["--synthetic", "--sequences", "96", "--seq-len", "16", "--shard-rows", "16",
                                     "--steps", "6", "--global-batch", "8", "--step-ms", "1", "--latency-ms", "1",
                                     "--window-shards", "2"], capsys, ("cold", "warm"), 6)
    assert cold["bytes_fetched"] > 0 and cold["cache_misses"] > 0
    assert warm["bytes_fetched"] == 0 and warm["cache_misses"] == 0 and warm["cache_hits"] > 0
    assert cold["tokens_per_s"] > 0 and config["order"] == "window"


@pytest.mark.slow  # spawns two processes per pass
def test_bench_ranks_reports_every_ranks_wait_from_processes_sharing_one_cache(capsys):
    rc = main(["loader", "bench", "--synthetic", "--sequences", "96", "--seq-len", "16", "--shard-rows", "16",
               "--steps", "4", "--global-batch", "8", "--step-ms", "1", "--latency-ms", "20", "--window-shards", "2",
               "--ranks", "2", "--json", "-"])
    assert rc == 0
    passes = json.loads(capsys.readouterr().out)["passes"]
    assert [(p["name"], p["rank"]) for p in passes] == [("cold", 0), ("cold", 1), ("warm", 0), ("warm", 1)]
    assert all(p["steps"] == 4 and p["wait_max_ms"] >= p["wait_p50_ms"] >= 0 for p in passes)
    cold, warm = passes[:2], passes[2:]
    assert sum(p["bytes_fetched"] for p in cold) > 0  # each rank fetched its own slice into the shared cache
    assert all(p["cache_misses"] == 0 and p["bytes_fetched"] == 0 for p in warm)  # both found it there
    # a rank starts waiting for its first batch when the barrier releases it: the cold wait shows the 20 ms store
    assert all(p["time_to_first_batch_s"] >= 0.02 for p in cold)
    assert main(["loader", "bench", "--synthetic", "--ranks", "3", "--global-batch", "8"]) == 2
    assert "--ranks 3: expected a positive divisor of --global-batch 8" in capsys.readouterr().err


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


def test_bench_through_the_service_reports_two_served_passes(toy_dataset, tmp_path, capsys):
    """`--service URL`: the simulated trainer reads through a real `gristmill serve` (its own process,
    a token required); the dataset is named by sha256, resolved by the service."""
    from helpers import ServeProcess

    with ServeProcess(toy_dataset.url, env={"GRISTMILL_SERVE_TOKEN": "bench-token"}) as srv:
        assert srv.url, srv.output()
        token = os.path.join(str(tmp_path), "token")
        with open(token, "w") as f:
            f.write("bench-token\n")
        first, again, config = bench_json([toy_dataset.manifest.sha256, "--service", srv.url, "--service-token-file",
                                           token, "--steps", "5", "--global-batch", "8", "--step-ms", "1", "--prefetch",
                                           "2", "--order", "global"], capsys, ("first", "again"), 5)
    row_bytes = 17 * 2  # seq_len 16 + 1 tokens of uint16 on the wire
    # at least the 5 steps each pass takes; how far the client had read ahead (16-step requests, two in
    # flight) when the pass closed depends on timing, so the two passes need not be equal
    assert first["bytes_served"] >= 5 * 8 * row_bytes and again["bytes_served"] >= 5 * 8 * row_bytes
    assert first["bytes_fetched"] == 0 and first["service_retries"] == 0
    assert config["service"] == [srv.url]


def test_bench_service_table_and_refusals(toy_dataset, capsys):
    from helpers import ServeProcess

    with ServeProcess(toy_dataset.url) as srv:
        assert main(["loader", "bench", toy_dataset.url, "--service", srv.url, "--steps", "3", "--global-batch", "8",
                     "--step-ms", "1"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].split()[-3:] == ["MB", "served", "retries"]
        assert [line.split()[:2] for line in lines[2:]] == [["first", "3"], ["again", "3"]]
        assert main(["loader", "bench", "--synthetic", "--service", srv.url]) == 2
        assert "not --synthetic" in capsys.readouterr().err
