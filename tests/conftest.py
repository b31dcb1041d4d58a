import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/helpers.py


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
