"""Every export writes nothing that looks like output unless all of it is (issue 26): a shard that
fails verification midway leaves no file of the export, and an earlier export it would replace intact."""
import os
import shutil

import pytest
from helpers import build_dataset, flip_byte

from gristmill.cli import main


@pytest.fixture
def pub(tmp_path):
    return build_dataset(str(tmp_path / "d"), doc_tokens=(5, 20), shard_rows=(20, 15, 25))


def _listing(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("fmt", ["parquet", "arrow-stream"])
def test_a_shard_failing_verification_leaves_no_view_output(pub, tmp_path, capsys, fmt):
    shard = os.path.join(pub.url, pub.manifest.shards[1].path)  # the second: the first was already written before
    saved = str(tmp_path / "saved.arrow")
    shutil.copy(shard, saved)
    flip_byte(shard)
    out = str(tmp_path / "out")
    assert main(["export", fmt, pub.url, out]) == 2
    assert "sha256 mismatch" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["d", "saved.arrow"]  # no output, and no staging directory left
    shutil.copy(saved, shard)
    assert main(["export", fmt, pub.url, out]) == 0  # no --overwrite needed: the failed run left nothing
    assert "gristmill.json" in _listing(out) and len(_listing(out)) == len(pub.manifest.shards) + 1


@pytest.mark.parametrize("fmt", ["parquet", "arrow-stream"])
def test_a_failed_overwrite_leaves_the_earlier_export_intact(pub, tmp_path, fmt):
    out = str(tmp_path / "out")
    assert main(["export", fmt, pub.url, out, "--split", "train"]) == 0
    before = {p: open(os.path.join(out, p), "rb").read() for p in _listing(out)}
    flip_byte(os.path.join(pub.url, pub.manifest.shards[2].path))
    assert main(["export", fmt, pub.url, out, "--overwrite"]) == 2
    assert {p: open(os.path.join(out, p), "rb").read() for p in _listing(out)} == before


def test_a_megatron_export_of_a_failing_shard_writes_nothing(pub, tmp_path):
    flip_byte(os.path.join(pub.url, pub.manifest.shards[1].path))
    prefix = str(tmp_path / "meg" / "data")
    assert main(["export", "megatron", pub.url, prefix]) == 2
    assert not os.path.exists(os.path.dirname(prefix)) or os.listdir(os.path.dirname(prefix)) == []
