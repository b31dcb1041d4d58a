"""The one config system (gristmill/config.py) behind both job files: the error shape
``file: section.key: expected ..., got ...``, duplicate YAML keys, ``--set`` and ``--print-config``
on ``gristmill prepare`` and ``gristmill train``, and dataset names that are paths."""
import json
import os

import pytest
import yaml

from gristmill.cli import main
from gristmill.errors import ConfigError
from gristmill.pipeline.config import PrepareConfig as PrepareJob
from gristmill.pipeline.config import load_job
from gristmill.trainer.config import TrainConfig as TrainJob
from gristmill.trainer.config import load as load_train

INPUTS = "inputs:\n  - path: in/a.jsonl\n  - {path: in/b.txt, format: text}\n"
REST = "output: {store: store, dataset: d}\nwork_dir: work\n"
PREPARE = INPUTS + REST
TRAIN = "data: {manifest: store/d}\n"


@pytest.fixture
def prepare_dir(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "in" / "b.txt").write_text("x\n")
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "qa.jsonl").write_text('{"id": "q", "text": "x"}\n')
    return tmp_path


def write(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("extra, message", [
    # a wrong type, in a list entry
    ("inputs:\n  - {path: in/a.jsonl, text_field: 3}\n", "inputs[0].text_field: expected a string, got 3"),
    # a bad Literal, in a list entry
    ("inputs:\n  - {path: in/a.jsonl, format: csv}\n", "inputs[0].format: expected one of jsonl, parquet, text, warc, got 'csv'"),
    # out of bounds, open and closed intervals
    ("fuzzy_dedup: {threshold: 1.5}\n", "fuzzy_dedup.threshold: expected a number in (0, 1), got 1.5"),
    ("tokenizer: {vocab_size: 100}\n", "tokenizer.vocab_size: expected an integer in [259, 1048576], got 100"),
    ("runner: {num_cpus: 0}\n", "runner.num_cpus: expected an integer >= 1 or null, got 0"),
    # the runner's kinds come from the registry; a key the kind does not read is refused
    ("runner: {kind: cluster}\n", "runner.kind: expected one of auto, serial, local, ray, got 'cluster'"),
    ("runner: {kind: local, address: 'ray://head:10001'}\n",
     "runner.address: expected only the keys runner kind local reads (num_cpus, concurrency, max_retries), got address"),
    # the ray: section of earlier versions: one line naming the new keys
    ("ray: {num_cpus: 2, partition_bytes: 1}\n",
     "ray: expected runner: and partitioning: sections (ray: was split in two), got a ray: section; move its keys: "
     "ray.num_cpus -> runner.num_cpus, ray.partition_bytes -> partitioning.partition_bytes"),
    # a bool that is a string
    ("extract: {html_main_content: 'yes'}\n", "extract.html_main_content: expected true or false, got 'yes'"),
    # an unknown key, nested and at the top
    ("decontaminate: {polcy: cut}\n",
     "decontaminate.polcy: expected one of the keys enabled, eval_sets, n, policy, margin, min_matches, min_item_words, "
     "against_validation, validation_min_matches, validation_max_doc_freq, got unknown key 'polcy'; did you mean 'policy'?"),
    ("langauge: {}\n", "langauge: expected one of the keys inputs, output, work_dir, work_dir_options, extract, language, exact_dedup, "
                       "quality, fuzzy_dedup, dedup_against, decontaminate, pii, split, tokenizer, pack, partitioning, runner, got unknown key 'langauge'; did you mean 'language'?"),
    # an index two lists deep
    ("decontaminate:\n  eval_sets:\n    - {name: qa, path: evals/qa.jsonl}\n    - {name: qa, path: evals/qa.jsonl}\n",
     "decontaminate.eval_sets[1].name: expected eval set names to be unique, got 'qa' again"),
    ("decontaminate:\n  eval_sets: [{name: qa, path: evals/qa.jsonl, fields: []}]\n",
     "decontaminate.eval_sets[0].fields: expected a non-empty list of strings, got []"),
])
def test_prepare_errors_name_section_key_expected_and_got(prepare_dir, extra, message):
    text = extra + REST if extra.startswith("inputs:") else PREPARE + extra
    path = write(prepare_dir / "job.yaml", text)
    with pytest.raises(ConfigError) as e:
        load_job(path)
    assert str(e.value) == f"{path}: {message}"


@pytest.mark.parametrize("extra, message", [
    ("run: {steps: ten}\n", "run.steps: expected an integer >= 1, got 'ten'"),
    ("optimizer: {lr: 0}\n", "optimizer.lr: expected a number > 0, got 0"),
    ("parallelism: {attention: xformers}\n", "parallelism.attention: expected one of auto, sdpa, flash, got 'xformers'"),
    ("checkpoint: {kep: 2}\n", "checkpoint.kep: expected one of the keys enabled, dir, storage_options, local_dir, every, auto_first_steps, keep, "
                               "keep_every, async_save, device_mtbf_hours, mtbf_hours, resume, "
                               "allow_manifest_change, got unknown key 'kep'; did you mean 'keep'?"),
    ("optimizer: {betas: [0.9, high]}\n", "optimizer.betas[1]: expected a number, got 'high'"),
    ("optimizer: {betas: [0.9]}\n", "optimizer.betas: expected a list of 2 numbers, got [0.9]"),
    ("eval: 5\n", "eval: expected a mapping, got 5"),
])
def test_train_errors_name_section_key_expected_and_got(tmp_path, extra, message):
    path = write(tmp_path / "train.yaml", TRAIN + extra)
    with pytest.raises(ConfigError) as e:
        load_train(path)
    assert str(e.value) == f"{path}: {message}"


def test_every_problem_is_reported_at_once(tmp_path):
    path = write(tmp_path / "train.yaml", "data: {global_batch: 0}\nrun: {seed: 1.5}\n")
    with pytest.raises(ConfigError) as e:
        load_train(path)
    assert str(e.value) == (f"{path}: run.seed: expected an integer, got 1.5; "
                            "data.manifest: expected a non-empty string (required), got nothing; "
                            "data.global_batch: expected an integer in [1, 16777216], got 0")


@pytest.mark.parametrize("load, text", [(load_job, PREPARE + "pack:\n  seq_len: 64\n  shard_bytes: 4096\n  seq_len: 128\n"),
                                        (load_train, TRAIN + "run:\n  steps: 3\n  steps: 4\n")])
def test_duplicate_yaml_keys_are_refused_naming_both_lines(prepare_dir, load, text):
    path = write(prepare_dir / "job.yaml", text)
    key, first, second = ("seq_len", 7, 9) if load is load_job else ("steps", 3, 4)
    with pytest.raises(ConfigError) as e:
        load(path)
    assert str(e.value) == f"job file {path}: duplicate key {key!r} at lines {first} and {second}; a key may appear once in a mapping"


def test_yaml_merge_keys_may_override_what_they_merge(tmp_path):
    path = write(tmp_path / "train.yaml", TRAIN + "run:\n  <<: {steps: 3, seed: 1}\n  steps: 5\n")
    cfg = load_train(path)
    assert (cfg.run.steps, cfg.run.seed) == (5, 1)


def test_set_overrides_both_jobs_with_yaml_values(prepare_dir):
    prep = write(prepare_dir / "job.yaml", PREPARE)
    job = load_job(prep, ["pack.seq_len=64", "fuzzy_dedup.threshold=0.7", "inputs[1].format=jsonl", "language.allowed=[de, en]",
                          "tokenizer.path="])
    assert job.pack.seq_len == 64 and job.fuzzy_dedup.threshold == 0.7 and job.fuzzy_dedup.enabled
    assert job.inputs[1].format == "jsonl" and job.language.allowed == ("de", "en") and job.tokenizer.path is None
    train = write(prepare_dir / "train.yaml", TRAIN)
    cfg = load_train(train, ["run.steps=7", "optimizer.betas=[0.8, 0.9]", "data.expected_sha256=abc"])
    assert cfg.run.steps == 7 and cfg.optimizer.betas == (0.8, 0.9) and cfg.data.expected_sha256 == "abc"


@pytest.mark.parametrize("load, override, message", [
    (load_train, "run.stepz=3", "--set run.stepz=3: run.stepz: expected one of the keys dir, steps, seed, log_every, "
                                "tensorboard, log_samples, hang_timeout_s, straggler_fraction, straggler_windows, got unknown key "
                                "'stepz'; did you mean 'steps'?"),
    (load_train, "run.steps.x=3", "--set run.steps.x=3: run.steps: expected an integer >= 1, got a key below it ('x')"),
    (load_job, "inputs[5].path=x", "--set inputs[5].path=x: inputs[5]: expected an index below 2 (the job's list has 2 entries), got 5"),
    (load_train, "run.dir.x=3", "--set run.dir.x=3: run.dir: expected a string, got a key below it ('x')"),
    (load_job, "inputs[0].path.x=3", "--set inputs[0].path.x=3: inputs[0].path: expected a non-empty string, got a key below it ('x')"),
    (load_job, "pack.seq_len", "--set 'pack.seq_len': expected KEY=VALUE with KEY a dotted path, e.g. --set run.steps=100 "
                               "or --set inputs[0].format=jsonl"),
])
def test_set_with_a_bad_key_gets_the_same_error_shape(prepare_dir, load, override, message):
    path = write(prepare_dir / "job.yaml", PREPARE if load is load_job else TRAIN)
    with pytest.raises(ConfigError) as e:
        load(path, [override])
    assert str(e.value) == message


def test_a_bad_value_from_set_names_the_override(tmp_path):
    path = write(tmp_path / "train.yaml", TRAIN)
    with pytest.raises(ConfigError) as e:
        load_train(path, ["run.steps=0"])
    assert str(e.value) == f"{path}: run.steps: expected an integer >= 1, got 0 (from --set run.steps=0)"


@pytest.mark.parametrize("command", ["prepare", "train"])
def test_print_config_round_trips_and_does_no_work(prepare_dir, tmp_path_factory, capsys, command):
    if command == "prepare":
        text = PREPARE + ("language: {model: null}\nfuzzy_dedup: {enabled: false}\n"
                          "decontaminate:\n  eval_sets: [{name: qa, path: evals/qa.jsonl, id_field: id}]\n")
        load, overrides = load_job, ["--set", "pack.seq_len=64", "--set", "inputs[0].text_field=body"]
    else:
        text, load, overrides = TRAIN, load_train, ["--set", "run.steps=3", "--set", "optimizer.betas=[0.8, 0.9]"]
    path = write(prepare_dir / "job.yaml", text)
    assert main([command, path, *overrides, "--print-config"]) == 0
    printed = capsys.readouterr().out
    expected = load(path, [o for o in overrides if o != "--set"])
    elsewhere = write(tmp_path_factory.mktemp("elsewhere") / "printed.yaml", printed)  # relative paths were made absolute
    assert load(elsewhere) == expected
    assert yaml.safe_load(printed) == expected.to_dict()
    assert not os.path.exists(prepare_dir / "work") and not os.path.exists(prepare_dir / "runs")
    if command == "prepare":
        assert expected.pack.seq_len == 64 and expected.inputs[0].text_field == "body"
        assert expected.decontaminate.eval_sets[0].path == str(prepare_dir / "evals" / "qa.jsonl")
        assert expected.fuzzy_dedup is not None and not expected.fuzzy_dedup.enabled


@pytest.mark.parametrize("command, override, message", [
    ("prepare", "pack.seq_lenn=1", "--set pack.seq_lenn=1: pack.seq_lenn: expected one of the keys seq_len, shard_bytes, range_tokens, "
                                   "got unknown key 'seq_lenn'; did you mean 'seq_len'?"),
    ("train", "optimizer.lr=-1", "optimizer.lr: expected a number > 0, got -1 (from --set optimizer.lr=-1)"),
])
def test_cli_reports_a_bad_set_in_one_line(prepare_dir, capsys, command, override, message):
    path = write(prepare_dir / "job.yaml", PREPARE if command == "prepare" else TRAIN)
    assert main([command, path, "--set", override, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gristmill {command}: error: ") and err.rstrip().endswith(message) and err.count("\n") == 1


@pytest.mark.parametrize("name", ["../evil", "a/b", "/abs/name", "", ".", "..", "name\n"])
def test_path_like_dataset_names_are_refused_before_any_work(prepare_dir, capsys, name):
    path = write(prepare_dir / "job.yaml", PREPARE.replace("dataset: d", f"dataset: {json.dumps(name)}"))  # JSON is YAML
    assert main(["prepare", path]) == 2
    err = capsys.readouterr().err
    assert (f"output.dataset: expected a dataset name matching [A-Za-z0-9][A-Za-z0-9._-]* (one directory: no '/', "
            f"not '.' or '..'), got {name!r}") in err
    assert not os.path.exists(prepare_dir / "work") and not os.path.exists(prepare_dir / "store")


def test_sections_are_typed_and_null_means_defaults(prepare_dir):
    path = write(prepare_dir / "job.yaml", PREPARE + "extract:\nfuzzy_dedup: {}\ndecontaminate: null\n")
    job = load_job(path)
    assert job.extract.max_chars == 1_000_000 and job.fuzzy_dedup.enabled and job.decontaminate is None
    assert job.inputs[0].path == str(prepare_dir / "in" / "a.jsonl") and job.work_dir == str(prepare_dir / "work")
    content = job.content_dict()
    assert "work_dir" not in content and "runner" not in content and "partitioning" not in content
    assert "store" not in content["output"]
    assert "report_html" not in content["output"]  # the data card is drawn beside the run, not into the version
    assert content["fuzzy_dedup"]["threshold"] == 0.8  # every default written out, so the manifest records it
    with pytest.raises(ConfigError, match=r"^inputs: expected a non-empty list of mappings \(required\), got nothing; "):
        PrepareJob.from_dict({"output": {"store": "s", "dataset": "d"}})
    assert TrainJob.from_dict({"data": {"manifest": "m"}, "run": None}).run.steps == 100


def test_a_disabled_decontaminate_section_may_name_missing_eval_files(prepare_dir):
    section = "decontaminate:\n  enabled: {on}\n  eval_sets: [{{name: qa, path: evals/missing.jsonl}}]\n"
    assert not load_job(write(prepare_dir / "off.yaml", PREPARE + section.format(on="false"))).decontaminate.enabled
    with pytest.raises(ConfigError, match=r"decontaminate.eval_sets\[0\].path: expected an existing eval file, got '.*missing.jsonl'"):
        load_job(write(prepare_dir / "on.yaml", PREPARE + section.format(on="true")))


@pytest.mark.parametrize("path", ["s3://bucket/key", "file:///abs/x", "memory://x", "gmsim:///abs/x", "simplecache::s3://b/k",
                                  "hdfs://host/p", "data:text/plain,hi", "rel/dir", "/abs/dir", "", "C://windows/x",
                                  "c:\\data\\x", "a://one-letter", "://x", "dir/s3://x", "x:y", "./s3:/x", "DATA:x"])
def test_the_job_files_url_test_is_the_storage_modules(path):
    """gristmill.config (a leaf: it imports no part and no fsspec) reads a URL by itself, to leave URLs
    unresolved against the job file's folder; it must answer as the storage module, which asks fsspec."""
    from fsspec.core import split_protocol

    from gristmill import config
    from gristmill.manifests import storage

    assert config._is_url(path) == storage.is_url(path) == (split_protocol(path)[0] is not None)
