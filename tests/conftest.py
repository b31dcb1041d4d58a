import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/helpers.py

# The files whose tests start a Ray (the session's, or a cluster of their own): one xdist worker
# runs them all, one after another; two Rays at once on two cores starve each other.
RAY_FILES = {"test_deploy_ray.py", "test_local_runner.py", "test_runner.py"}


def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n N --dist loadgroup`` (`make test`), a file's tests stay on one worker (its
    module fixtures, often a whole prepare, are built once) and the Ray files share one."""
    for item in items:
        name = os.path.basename(str(item.fspath))
        item.add_marker(pytest.mark.xdist_group("ray" if name in RAY_FILES else name))


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
