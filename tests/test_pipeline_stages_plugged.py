"""The optional global stages plugged into the executor (decontamination here): what they
remove is removed, what they cut is tokenized cut, their eval sets reach the manifest."""
import json
import os

import pytest

pytestmark = pytest.mark.slow

ITEM = ("the lighthouse keeper counted three hundred and sixty five nights of light without a "
        "single failure of the great lamp in the tower")
PROSE = ("The river runs past the old mill where farmers bring their grain every autumn and the miller weighs "
         "each sack before the stones turn it into flour for the bakers of the town number {i}. ")


def _corpus(tmp_path):
    os.makedirs(tmp_path / "in")
    with open(tmp_path / "in" / "a.jsonl", "w") as f:
        for i in range(12):
            text = PROSE.format(i=i) * 3 + (ITEM if i in (3, 7) else "")
            f.write(json.dumps({"text": text}) + "\n")
    with open(tmp_path / "eval.jsonl", "w") as f:
        f.write(json.dumps({"id": "q1", "text": ITEM}) + "\n")


@pytest.mark.parametrize("policy", ["drop", "cut"])
def test_decontamination_plugged_in(tmp_path, policy):
    from gristmill.manifests import load_manifest
    from gristmill.pipeline.config import PrepareConfig
    from gristmill.pipeline.executor import prepare

    _corpus(tmp_path)
    job = PrepareConfig.from_dict({
        "inputs": [str(tmp_path / "in" / "*.jsonl")], "output": {"store": str(tmp_path / "store"), "dataset": "d"},
        "work_dir": str(tmp_path / "work"), "language": {"enabled": False}, "split": {"validation_fraction": 0.0},
        "decontaminate": {"eval_sets": [{"name": "qa", "path": str(tmp_path / "eval.jsonl"), "id_field": "id"}],
                          "policy": policy, "margin": 0, "against_validation": False},
        "tokenizer": {"vocab_size": 300, "sample_bytes": 100_000}, "pack": {"seq_len": 16, "shard_bytes": 4096},
    }, base_dir=str(tmp_path))
    result = prepare(job, quiet=True)
    m = load_manifest(result.url).manifest
    assert [e.name for e in m.eval_sets] == ["qa"] and m.eval_sets[0].items == 1
    acc = m.stats["accounting"]
    assert acc["balanced"] and acc["input"] == 12
    if policy == "drop":
        assert acc["removed"] == {"contaminated": 2} and acc["kept"] == 10
        removed = [json.loads(line) for line in open(os.path.join(result.run_dir, "removed.jsonl"))]
        assert sorted(r["id"] for r in removed) == ["a.jsonl:3", "a.jsonl:7"]
    else:
        assert acc["removed"] == {} and acc["kept"] == 12
        import pyarrow.parquet as pq

        cut = pq.read_table(os.path.join(result.run_dir, "overrides", "decontaminate")).to_pylist()
        assert sorted(r["id"] for r in cut) == ["a.jsonl:3", "a.jsonl:7"]
        assert all("lighthouse" not in r["text"] and "river runs past" in r["text"] for r in cut)
        # the cut documents were tokenized shorter than their uncut twins in the corpus
        from gristmill.manifests import read_doc_index

        length: dict[str, int] = {}
        for span in read_doc_index(os.path.join(result.url, m.doc_index.path)).to_pylist():
            length[span["doc_id"]] = length.get(span["doc_id"], 0) + span["length"]
        assert length["a.jsonl:3"] < length["a.jsonl:4"] + 5 and length["a.jsonl:7"] < length["a.jsonl:6"] + 5
