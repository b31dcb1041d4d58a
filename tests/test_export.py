"""gristmill export: Megatron-LM .bin/.idx read back by Megatron's own IndexedDataset, Parquet read by
DuckDB, Arrow streaming files and the shards themselves read by Hugging Face datasets."""
import json
import os
import struct
from collections import OrderedDict

import duckdb
import numpy as np
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from helpers import build_dataset, flip_byte
from gristmill.cli import main
from gristmill.manifests import HashMismatchError, read_rows

# megatron-core imports parts of itself that warn about missing Apex/Transformer Engine and old torch.jit APIs.
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def pub(tmp_path_factory):
    # Documents of 5..40 tokens over rows of 17: most cross a row, some cross a shard.
    return build_dataset(str(tmp_path_factory.mktemp("export")), doc_tokens=(5, 40), shard_rows=(20, 15, 25))


def documents_by_loop(pub, split="train"):
    """doc_id -> its tokens, by a plain loop over the document index and the shards' rows."""
    rows = {i: read_rows(os.path.join(pub.url, s.path)) for i, s in enumerate(pub.manifest.shards)}
    docs = OrderedDict()
    for span in pq.read_table(os.path.join(pub.url, pub.manifest.doc_index.path)).to_pylist():
        if pub.manifest.shards[span["shard"]].split != split:
            continue
        piece = rows[span["shard"]][span["row"], span["start"]:span["start"] + span["length"]].tolist()
        docs.setdefault(span["doc_id"], []).extend(piece)
    return docs


def test_megatron_export_reads_back_in_megatron(pub, tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset  # the dev extra megatron-core, no GPU needed

    prefix = str(tmp_path / "out" / "toy_text_document")
    assert main(["export", "megatron", pub.url, prefix]) == 0
    want = documents_by_loop(pub)
    ds = IndexedDataset(prefix)
    assert len(ds) == len(want) > 30
    for i, tokens in enumerate(want.values()):
        got = ds[i]
        assert got.dtype == np.uint16 and got.tolist() == tokens
    assert ds.document_indices.tolist() == list(range(len(want) + 1))
    with open(prefix + ".idx", "rb") as f:  # the header, straight from the spec
        assert f.read(9) == b"MMIDIDX\x00\x00" and struct.unpack("<QBQQ", f.read(25)) == (1, 8, len(want), len(want) + 1)
    record = json.load(open(prefix + ".gristmill.json"))
    assert record["manifest_sha256"] == pub.manifest.sha256 and record["tokens"] == sum(map(len, want.values()))
    assert main(["export", "megatron", pub.url, prefix]) == 2  # never overwrites without --overwrite
    assert main(["export", "megatron", pub.url, prefix, "--split", "validation", "--overwrite"]) == 0
    val = IndexedDataset(prefix)  # held: its items are views of its mapping, which it unmaps when collected
    assert val[0].tolist() == next(iter(documents_by_loop(pub, "validation").values()))


def test_a_damaged_shard_is_refused_before_anything_is_written(tmp_path):
    pub = build_dataset(str(tmp_path / "d"), doc_tokens=(5, 40))
    flip_byte(os.path.join(pub.url, pub.manifest.shards[1].path))
    from gristmill.manifests.export import export_megatron

    prefix = str(tmp_path / "out" / "x")
    with pytest.raises(HashMismatchError):
        export_megatron(pub.url, prefix)
    assert not os.path.exists(os.path.join(tmp_path, "out")) or os.listdir(tmp_path / "out") == []


def test_parquet_view_reads_in_duckdb_and_joins_the_document_index(pub, tmp_path):
    out = tmp_path / "pq"
    assert main(["export", "parquet", pub.url, str(out), "--split", "train"]) == 0
    record = json.load(open(out / "gristmill.json"))
    assert record["manifest_sha256"] == pub.manifest.sha256 and len(record["files"]) == 3
    con = duckdb.connect()
    got = con.sql(f"select shard, row, tokens from read_parquet('{out}/shards/*.parquet') order by shard, row").fetchall()
    train = [(i, s) for i, s in enumerate(pub.manifest.shards) if s.split == "train"]
    want = [(i, r, row.tolist()) for i, s in train for r, row in enumerate(read_rows(os.path.join(pub.url, s.path)))]
    assert got == want
    # The document index joins on (shard, row): the first token of each document, found by SQL.
    index = os.path.join(pub.url, pub.manifest.doc_index.path)
    firsts = con.sql(f"""select d.doc_id, t.tokens[d.start + 1] from read_parquet('{index}') d
                         join read_parquet('{out}/shards/*.parquet') t using (shard, row)
                         where d.start > 0 or (d.shard = 0 and d.row = 0) order by d.shard, d.row, d.start limit 5""").fetchall()
    docs = documents_by_loop(pub)
    assert all(docs[doc][0] == first for doc, first in firsts)


def test_duckdb_reads_a_shard_through_pyarrow(pub):
    """The documented route without any export: pyarrow opens the Arrow IPC file, DuckDB queries the table."""
    s = pub.manifest.shards[0]
    shard = ipc.open_file(os.path.join(pub.url, s.path)).read_all()  # noqa: F841  (DuckDB finds it by name)
    [(n, first)] = duckdb.sql("select count(*), min(tokens[1]) from shard").fetchall()
    rows = read_rows(os.path.join(pub.url, s.path))
    assert (n, first) == (s.rows, int(rows[:, 0].min()))


def test_hugging_face_datasets_read_the_shards_and_the_stream_view(pub, tmp_path):
    from datasets import Dataset, load_dataset

    paths = [os.path.join(pub.url, s.path) for s in pub.manifest.shards if s.split == "train"]
    want = np.concatenate([read_rows(p) for p in paths]).tolist()
    ds = load_dataset("arrow", data_files=paths, split="train", cache_dir=str(tmp_path / "hf"))
    assert list(ds["tokens"]) == want
    # Dataset.from_file reads the Arrow streaming format only: the arrow-stream view is for it.
    out = tmp_path / "stream"
    assert main(["export", "arrow-stream", pub.url, str(out), "--split", "train"]) == 0
    parts = [Dataset.from_file(str(out / (os.path.splitext(s.path)[0] + ".arrows")))
             for s in pub.manifest.shards if s.split == "train"]
    assert sum((list(p["tokens"]) for p in parts), []) == want
