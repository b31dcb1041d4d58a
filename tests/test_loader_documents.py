"""Loader(documents=True): per-row document boundaries, checked against the document index itself."""
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from helpers import build_dataset
from gristmill.loader import Batches, Caching, Loader
from gristmill.loader.options import sections
from gristmill.manifests import HashMismatchError


@pytest.fixture(scope="module")
def pub(tmp_path_factory):
    # Documents of 3..12 tokens packed over rows of 17: most rows hold several documents, some none start.
    return build_dataset(str(tmp_path_factory.mktemp("docs")), doc_tokens=(3, 12), shard_rows=(20, 15, 25))


def batches(pub, cache_dir, steps, **kw):
    out = []
    with Loader(pub.url, **sections(cache_dir=str(cache_dir), global_batch=kw.pop("global_batch", 6), workers=0,
                                    documents=True, **kw)) as ld:
        for batch in ld:
            out.append(batch)
            if len(out) == steps:
                break
    return out


def expected_from_index(pub, shard: int, row: int):
    """Position ids and segment lengths of one row, by a plain loop over the index's spans of it."""
    t = pq.read_table(os.path.join(pub.url, pub.manifest.doc_index.path)).to_pylist()
    S = pub.manifest.seq_len
    starts = sorted({0} | {s["start"] for s in t if s["shard"] == shard and s["row"] == row and s["start"] < S})
    pos, lengths = [], []
    for a, b in zip(starts, starts[1:] + [S]):
        pos += list(range(b - a))
        lengths.append(b - a)
    return pos, lengths


def test_position_ids_and_cu_seqlens_match_the_document_index(pub, tmp_path):
    got = batches(pub, tmp_path, steps=4, seed=3)
    from gristmill.loader import samples_at

    multi = 0
    for batch in got:
        shards, rows = samples_at(pub.manifest, "train", 3, "global", batch["indices"].numpy())
        lengths = []
        for j, (s, r) in enumerate(zip(shards.tolist(), rows.tolist())):
            pos, lens = expected_from_index(pub, s, r)
            assert batch["position_ids"][j].tolist() == pos
            lengths += lens
            multi += len(lens) > 1
        cu = batch["cu_seqlens"]
        assert cu.dtype == torch.int32
        assert cu.tolist() == np.concatenate([[0], np.cumsum(lengths)]).tolist()
        assert batch["max_seqlen"] == max(lengths)
        assert cu[-1] == batch["input_ids"].numel()
    assert multi > 0  # the fixture really packs several documents into rows


def test_boundaries_are_a_pure_function_of_the_index(pub, tmp_path):
    """Ranks, resume and worker threads change nothing: a rank's rows carry the same boundaries as the
    matching slice of the single-rank batch."""
    whole = batches(pub, tmp_path, steps=3, seed=1)
    halves = [batches(pub, tmp_path, steps=3, seed=1, rank=r, world_size=2) for r in range(2)]
    resumed = batches(pub, tmp_path, steps=2, seed=1, start_index=6)
    for k, batch in enumerate(whole):
        assert torch.equal(torch.cat([halves[0][k]["position_ids"], halves[1][k]["position_ids"]]), batch["position_ids"])
    for a, b in zip(whole[1:], resumed):
        assert torch.equal(a["position_ids"], b["position_ids"]) and torch.equal(a["cu_seqlens"], b["cu_seqlens"])


def test_a_tampered_document_index_is_refused(tmp_path):
    pub = build_dataset(str(tmp_path / "d"), doc_tokens=(3, 12))
    path = os.path.join(pub.url, pub.manifest.doc_index.path)
    t = pq.read_table(path)
    pq.write_table(t.slice(1), path)  # one span dropped: the boundaries would be wrong
    with pytest.raises(HashMismatchError):
        Loader(pub.url, caching=Caching(dir=str(tmp_path / "c")), batches=Batches(documents=True))


def test_a_source_without_its_own_document_index_is_refused(pub):
    from gristmill.errors import UsageError
    from gristmill.loader import DocumentBoundaries

    with pytest.raises(UsageError, match="document index"):
        DocumentBoundaries(pub.manifest)  # a manifest alone, not a published version: no index to read


# -- a mixture: each row's boundaries from its own component's index ------------------------------
def publish_mixture(root: str) -> str:
    """Two components with documents packed several to a row, mixed 3:1; returns the mixture's URL."""
    import yaml

    from gristmill.cli import main
    from gristmill.manifests.synthetic import build_synthetic

    build_synthetic(root, dataset="web", doc_tokens=(3, 12), shard_rows=(20, 15), seed=1)
    build_synthetic(root, dataset="code", doc_tokens=(2, 7), shard_rows=(18,), seed=2)
    job = os.path.join(root, "mix.yaml")
    with open(job, "w") as f:
        yaml.safe_dump({"name": "blend", "store": os.path.join(root, "store"),
                        "components": [{"dataset": "web", "weight": 3}, {"dataset": "code", "weight": 1}]}, f)
    assert main(["mix", job]) == 0
    return os.path.join(root, "store", "blend")


def test_a_mixtures_rows_carry_their_own_components_boundaries(tmp_path):
    from gristmill.loader.mixture import MixtureOrder
    from gristmill.manifests.mixture import load_data

    mix = load_data(publish_mixture(str(tmp_path / "m")))
    order = MixtureOrder(mix, "train", 5)
    owners = set()
    for batch in batches(mix, tmp_path / "c", steps=4, seed=5, global_batch=8):
        comp, _, shards, rows = order.locate_components(batch["indices"].numpy())
        lengths = []
        for j, (c, s, r) in enumerate(zip(comp.tolist(), shards.tolist(), rows.tolist())):
            pos, lens = expected_from_index(mix.components[c], s, r)
            assert batch["position_ids"][j].tolist() == pos
            lengths += lens
            owners.add(c)
        assert batch["cu_seqlens"].tolist() == np.concatenate([[0], np.cumsum(lengths)]).tolist()
        assert batch["max_seqlen"] == max(lengths)
    assert owners == {0, 1}  # both components' indexes were read


def test_a_tampered_component_document_index_is_refused(tmp_path):
    from gristmill.manifests.mixture import load_data

    mix = load_data(publish_mixture(str(tmp_path / "m")))
    code = mix.components[1]
    path = os.path.join(code.url, code.manifest.doc_index.path)
    pq.write_table(pq.read_table(path).slice(1), path)
    with pytest.raises(HashMismatchError, match="doc"):
        Loader(mix.url, caching=Caching(dir=str(tmp_path / "c")), batches=Batches(documents=True))
