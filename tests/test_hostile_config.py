"""Errors that were tracebacks (or hangs) where one line is promised (issue 26): a YAML alias bomb,
absurd trainer sizes, a seq_len no reader serves, malformed eval files, an unwritable store."""
import gzip
import json
import os
import time

import pytest

from gristmill.config import read_yaml
from gristmill.errors import ConfigError, GristmillError

BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")) + "inputs: *i\n"


def test_a_yaml_alias_bomb_is_refused_fast_without_expanding_it(tmp_path):
    p = tmp_path / "bomb.yaml"
    p.write_text(BOMB)  # ~600 bytes, 9^9 = 387 million strings expanded
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"expands to more than 100,000 YAML values") as e:
        read_yaml(str(p))
    assert time.perf_counter() - t0 < 2 and len(str(e.value)) < 400 and "lol" not in str(e.value)


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    from gristmill.cli import main

    (tmp_path / "bomb.yaml").write_text(BOMB)
    t0 = time.perf_counter()
    assert main(["prepare", str(tmp_path / "bomb.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bomb.yaml: expands to more than" in err and time.perf_counter() - t0 < 5


def test_anchors_and_merge_keys_within_the_budget_still_work(tmp_path):
    p = tmp_path / "ok.yaml"
    p.write_text("base: &b {x: 1, y: [1, 2]}\nother:\n  <<: *b\n  y: 3\nboth: [*b, *b]\n")
    assert read_yaml(str(p)) == {"base": {"x": 1, "y": [1, 2]}, "other": {"x": 1, "y": 3},
                                 "both": [{"x": 1, "y": [1, 2]}, {"x": 1, "y": [1, 2]}]}
    p.write_text("loop: &s [1, *s]\n")
    with pytest.raises(ConfigError, match="line 1: a value that contains itself"):
        read_yaml(str(p))


def test_an_error_about_a_big_aliased_value_renders_a_few_characters(tmp_path):
    from gristmill.pipeline.config import load_job

    wide = "w: &w [" + ", ".join(["abcdefgh"] * 200) + "]\n"  # 200 x 200 = 40,000 values a use, used twice: under the budget
    p = tmp_path / "job.yaml"
    p.write_text(wide + "x: &x [" + ", ".join(["*w"] * 200) + "]\ninputs: in.jsonl\noutput: {store: s, dataset: d}\n"
                 "work_dir: w\npack: {seq_len: *x}\n")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"pack\.seq_len: expected an integer in \[1, 2147483646\], got \[\[") as e:
        load_job(str(p))
    shown = next(part for part in str(e.value).split("; ") if "pack.seq_len" in part)
    assert len(shown) < 250 and time.perf_counter() - t0 < 5  # not the 40,000 strings


def test_pack_seq_len_is_bounded_by_what_every_reader_serves(tmp_path):
    from gristmill.manifests.manifest import MAX_SEQ_LEN
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.stages.pack.config import MAX_PACK_SEQ_LEN

    job = {"inputs": ["/x/a.jsonl"], "output": {"store": "/s", "dataset": "d"}, "work_dir": "/w"}
    with pytest.raises(ConfigError, match=r"pack\.seq_len: expected an integer in \[1, 2147483646\], got 3000000000"):
        PrepareConfig.from_dict({**job, "pack": {"seq_len": 3_000_000_000}})
    assert MAX_PACK_SEQ_LEN <= MAX_SEQ_LEN and MAX_PACK_SEQ_LEN + 1 < 2 ** 31  # manifest; fixed_size_list / int32 spans
    assert PrepareConfig.from_dict({**job, "pack": {"seq_len": MAX_PACK_SEQ_LEN}}).pack.seq_len == MAX_PACK_SEQ_LEN


@pytest.mark.parametrize("section,value,message", [
    ("data", {"manifest": "x", "global_batch": 10 ** 15}, "data.global_batch: expected an integer in [1, 16777216]"),
    ("model", {"dim": 10 ** 9}, "model.dim: expected an integer in [1, 131072] or null"),
    ("model", {"n_layers": 10 ** 6}, "model.n_layers: expected an integer in [1, 4096] or null"),
])
def test_absurd_trainer_sizes_are_config_errors(section, value, message):
    from gristmill.trainer.config import TrainConfig

    d = {"data": {"manifest": "x"}, section: value}
    with pytest.raises(ConfigError) as e:
        TrainConfig.from_dict(d)
    assert message in str(e.value)


def test_a_run_that_cannot_fit_is_refused_by_its_budget_before_allocating():
    from gristmill.trainer.budget import available_bytes, check_fits, memory_budget
    from gristmill.trainer.model import count_params, model_args

    args = model_args("8b", 128_256, 8192)
    budget = memory_budget(args, n_params=count_params(args)["total"], shards=1, compute_bytes=2, micro_batch=4096,
                           seq_len=8192, activation_checkpoint="none")
    with pytest.raises(ConfigError, match=r"the run needs .* per rank, more than a 80 GB GPU \(80\.00 GB\); the largest "
                                          r"term is activations \(none, 33,554,432 tokens\) at .*: lower data\.micro_batch"):
        check_fits(budget, 80 * 10 ** 9, "a 80 GB GPU")
    small = memory_budget(model_args("tiny", 256, 16), n_params=count_params(model_args("tiny", 256, 16))["total"],
                          shards=1, compute_bytes=4, micro_batch=2, seq_len=16, activation_checkpoint="none")
    check_fits(small, *available_bytes("cpu"))  # a toy run fits this host
    assert available_bytes("cpu")[0] > 0


def _eval(tmp_path, name, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


MALFORMED_EVAL_FILES = [
    ("bad-utf8.jsonl", b'{"text": "ok"}\n{"text": "bad \xff"}\n', "line 2: not valid UTF-8"),
    ("cut.jsonl.gz", gzip.compress(b"".join(b'{"text": "item %d"}\n' % i for i in range(3000)), mtime=0)[:4000], "line "),
    ("deep.jsonl", b'{"text": "ok"}\n' + b"[" * 100_000 + b"\n", "line 2: "),
    ("junk.parquet", b"PAR1 not really", "junk.parquet: "),
    ("bad.txt", b"line one\nline two \xff\n", "line 2: not valid UTF-8"),
]


# named by file (a bytes id would hold the data: xdist workers must collect the same ids)
@pytest.mark.parametrize("name,data,where", [pytest.param(*case, id=case[0]) for case in MALFORMED_EVAL_FILES])
def test_malformed_eval_files_are_one_line_errors_with_the_file_and_line(tmp_path, name, data, where):
    from gristmill.pipeline.ngrams import read_eval_items

    path = _eval(tmp_path, name, data)
    with pytest.raises(GristmillError) as e:
        read_eval_items(path)
    assert f"eval file {path}" in str(e.value) and where in str(e.value) and "\n" not in str(e.value)


def test_an_unwritable_store_fails_prepare_before_any_work(tmp_path, capsys):
    from gristmill.cli import main

    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "a-file").write_text("")
    for store, message in ((str(tmp_path / "a-file" / "store"), "a-file exists and is not a directory"),
                           ("/proc/gristmill-store", "cannot write in /proc")):
        job = tmp_path / "job.yaml"
        job.write_text(json.dumps({"inputs": [str(tmp_path / "in.jsonl")], "output": {"store": store, "dataset": "d"},
                                   "work_dir": str(tmp_path / "w")}))
        assert main(["prepare", str(job)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "output.store: " in err and message in err, err
        assert not os.path.exists(tmp_path / "w")


def test_a_writable_store_is_probed_without_leaving_anything(tmp_path):
    from gristmill.pipeline.executor import check_writable

    check_writable(str(tmp_path / "new" / "store"), "d")
    check_writable(f"memory://{tmp_path.name}/store", "d")
    assert os.listdir(tmp_path) == []
    import fsspec

    assert fsspec.filesystem("memory").find(f"/{tmp_path.name}") == []
