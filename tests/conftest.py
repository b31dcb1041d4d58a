import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/helpers.py
# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set (python:3.x images set it): without it each of
# the two workers compiles (and pytest assert-rewrites) every test module and gristmill module at collection,
# ~2.5 s of CPU a worker, and each `python -m gristmill` a test starts compiles what it imports (the children
# read the .pyc files written here; __pycache__/ is in .gitignore).
sys.dont_write_bytecode = False

# The files whose tests start a Ray (the session's, or a cluster of their own): one xdist worker
# runs them all, one after another; two Rays at once on two cores starve each other.
RAY_FILES = {"test_deploy_ray.py", "test_local_runner.py", "test_runner.py", "test_runner_conformance.py"}
# The groups of a minute or more in `make test` (pytest --durations), heaviest first: they start
# first, so neither worker is left alone with one of them at the end (a missing one costs only time).
HEAVY_FIRST = ["test_partition_scaling.py", "ray", "test_kill_anywhere.py", "test_trainer.py", "test_pipeline_s3.py",
               "test_service_train.py"]
# Then the groups of 5 s or more in the quick loop (-m 'not slow', where most of the above are empty), heaviest
# first (test_service.py, the heaviest there, came after two thirds of the files in file order): the small
# groups left for the end even the two workers out.
HEAVY_FIRST += ["test_service.py", "test_service_hostile.py", "test_store_concurrency.py", "test_loader_cli.py",
                "test_loader.py", "test_hostile3_inputs.py", "test_hostile3_faults.py", "test_quality.py",
                "test_manifest_facts.py", "test_layering.py", "test_storage.py"]


def _group(item) -> str:
    name = os.path.basename(str(item.fspath))
    return "ray" if name in RAY_FILES else name


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n N --dist loadgroup --no-loadscope-reorder`` (`make test`), a file's tests stay
    on one worker (its module fixtures, often a whole prepare, are built once), the Ray files share
    one, and the heavy groups are handed out first."""
    for item in items:  # before every other plugin's hook: xdist's reads the marks into the node ids
        item.add_marker(pytest.mark.xdist_group(_group(item)))
    yield
    if getattr(config.option, "loadgroup", False):
        rank = {g: i for i, g in enumerate(HEAVY_FIRST)}
        items.sort(key=lambda item: rank.get(_group(item), len(rank)))  # stable: the rest keep their order


def pytest_xdist_node_collection_finished(node, ids):
    """The controller's check that the groups took: pytest 9.2 ignores xdist 3.8's node-id rewrite
    (pytest-dev/pytest-xdist#1386), and every test then runs apart, module fixtures built twice."""
    if node.config.getoption("dist") == "loadgroup" and ids and "@" not in ids[0]:
        raise pytest.UsageError("pytest-xdist is not grouping the tests (--dist loadgroup; pytest-xdist#1386): "
                                "install the tested pytest: pip install -c constraints.txt -e '.[dev]'")


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole test session (starting Ray costs seconds)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def toy_dataset(tmp_path):
    """A small published token dataset (3 train shards, 1 validation shard, seq_len 16)."""
    from helpers import build_dataset

    return build_dataset(str(tmp_path))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A local S3 server (moto, tests/s3server.py) on 127.0.0.1, stopped at the end of the session."""
    from s3server import S3Server

    server = S3Server(str(tmp_path_factory.mktemp("s3") / "moto.log")).start()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """A fresh bucket's ``s3://`` URL, with the endpoint and fake credentials in the environment
    for this test only (s3fs, and processes the test starts, reach the local server and nothing else)."""
    import s3fs

    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    s3fs.S3FileSystem.clear_instance_cache()  # no instance made under other settings is reused
    yield s3_server.new_bucket()
    s3fs.S3FileSystem.clear_instance_cache()
