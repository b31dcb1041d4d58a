"""`gristmill mix`: a pinned sha256 that does not match, is malformed, or was read by YAML as a number
is one line that names the job file and the field (issue 26)."""
import os

import pytest
from helpers import build_synthetic

from gristmill.cli import main


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("mixsha"))
    build_synthetic(root, dataset="web", shard_rows=(20,), val_rows=(4,), seed=1)
    return root


def _job(store, tmp_path, sha_line: str) -> str:
    path = tmp_path / "MIX.yaml"
    path.write_text(f"name: pinned\nstore: {os.path.join(store, 'store')}\ncomponents:\n"
                    f"  - dataset: web\n    weight: 1\n    {sha_line}\n")
    return str(path)


@pytest.mark.parametrize("sha_line, message", [
    ("sha256: " + "1" * 64, r"components\[0\]\.sha256: expected a sha256 as a quoted string .* got the number 1111"),
    ("sha256: '" + "0" * 64 + "'", r"components\[0\]\.sha256: manifest of 'web' \(hash pinned by the caller\): sha256 mismatch"),
    ("sha256: abc", r"components\[0\]\.sha256: expected 64 lowercase hex digits .* got 'abc'"),
    ("sha256: '" + "A" * 64 + "'", r"components\[0\]\.sha256: expected 64 lowercase hex digits"),
])
def test_a_pinned_sha256_problem_names_the_job_file_and_the_field(store, tmp_path, capsys, sha_line, message):
    import re

    job = _job(store, tmp_path, sha_line)
    assert main(["mix", job]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(rf"MIX\.yaml: {message}", err), err
    assert not os.path.exists(os.path.join(store, "store", "pinned"))


def test_the_right_pin_publishes(store, tmp_path):
    from gristmill.manifests import load_manifest

    sha = load_manifest(os.path.join(store, "store", "web")).manifest.sha256
    assert main(["mix", _job(store, tmp_path, f"sha256: '{sha}'")]) == 0
