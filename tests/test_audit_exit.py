"""`audit doc` exits with its documented code (0 seen, 1 not seen), never SIGABRT at shutdown (issue 26).

pyarrow's dataset scanner (behind ``pq.read_table``) left read-ahead tasks on Arrow's thread pools
after returning; a process exiting right after a filtered read of the document index aborted now
and then (``terminate called without an active exception``: apache/arrow#34314, #39862; about 4 runs
in 100 here). The index is now read through ``ParquetFile`` a row group at a time, without threads.
"""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import build_dataset, write_checkpoint_meta

RUNS = 40  # of the CLI (about 2 in 100 aborted before), and twice as many of the bare read (about 4 in 100)
# What the runs import, imported once before the forks (importing starts none of Arrow's threads;
# pandas is what pyarrow imports on its first ``pa.array`` when it is installed: 0.3 s a run)
PANDAS = "try:\n    import pandas\nexcept ImportError:\n    pass\n"
READ_IMPORTS = PANDAS + """
import sys
from gristmill.manifests import load_manifest
from gristmill.manifests.doc_index import read_published_doc_index
"""
CLI_IMPORTS = PANDAS + """
import sys
from gristmill.cli import main
import gristmill.audit.checkpoint, gristmill.audit.doc, gristmill.audit.mixture, gristmill.manifests.mixture
"""
READ = """
pub = load_manifest(sys.argv[1])
print(read_published_doc_index(pub, filters=[("doc_id", "=", "doc-5")]).num_rows, read_published_doc_index(pub).num_rows)
"""
FORK_EXITS = os.path.join(os.path.dirname(__file__), "fork_exits.py")


def _runs(runs: int, prelude: str, body: str, *args: str) -> list[tuple[int, str, str]]:
    """``body`` in ``runs`` processes that each exit the normal way (tests/fork_exits.py: forked
    after ``prelude``'s imports, so a run costs its work and its exit, not an interpreter start)."""
    done = subprocess.run([sys.executable, FORK_EXITS, str(runs), prelude, body, *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [tuple(r) for r in json.loads(done.stdout)]


@pytest.mark.slow
def test_audit_doc_and_index_reads_exit_cleanly_every_time(tmp_path):
    pub = build_dataset(str(tmp_path / "d"), doc_tokens=(3, 12), shard_rows=(200, 150, 250))
    ckpt = write_checkpoint_meta(str(tmp_path / "run"), pub, step=5)
    cli = (CLI_IMPORTS, "sys.exit(main(sys.argv[1:]))", "audit", "doc", ckpt, "doc-5", "--json")
    with ThreadPoolExecutor(2) as pool:  # the two kinds of run side by side, one per core
        cli_runs, read_runs = pool.map(lambda a: _runs(*a), [(RUNS, *cli), (2 * RUNS, READ_IMPORTS, READ, pub.url)])
    results = cli_runs + read_runs
    bad = [(rc, err[-300:]) for rc, _, err in results if rc not in (0, 1) or "terminate called" in err]
    assert not bad, f"{len(bad)} of {len(results)} runs ended badly: {bad[:3]}"
    assert len({(rc, out) for rc, out, _ in cli_runs}) == 1  # the same answer every run
    assert len({out for _, out, _ in read_runs}) == 1
    assert cli_runs[0][0] == 0 and '"doc_id": "doc-5"' in cli_runs[0][1], cli_runs[0]  # seen: exit 0
