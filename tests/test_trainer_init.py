"""The model is built on the meta device, sharded, then each rank allocates and draws only its
shards (trainer.parallelize.build_model, trainer/init.py): real torchrun subprocesses on CPU, gloo.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow  # three torchrun/Python launches with torch (~15 s): end to end, outside the quick loop

# Builds the tiny model with build_model and saves its full (gathered) weights from rank 0.
WEIGHTS_PROBE = """
import os
before = dict(os.environ)
import sys, torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from gristmill.trainer.model import model_args
from gristmill.trainer.parallelize import build_mesh, build_model, init_distributed

d = init_distributed()
added = sorted(set(os.environ) - set(before))
changed = sorted(k for k in before if os.environ.get(k) != before[k])
print("START", d.rank, d.world_size, added, changed)
for out, dp_shard, ac in zip(sys.argv[1::3], map(int, sys.argv[2::3]), sys.argv[3::3]):  # one build per triple
    args = model_args("tiny", vocab_size=101, max_seq_len=16, n_kv_heads=2)
    model = build_model(args, build_mesh(d.device, d.world_size, dp_shard), device=d.device, seed=7,
                        param_dtype=torch.float32, activation_checkpoint=ac, compile=False)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if d.rank == 0:
        torch.save({k: v.clone() for k, v in full.items()}, out)
"""

# Leave together: a rank exiting while gloo's threads still serve the other aborts ("terminate called").
LEAVE = """
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
"""

# The trainer's build of the 8b preset over 2 ranks up to the initialisation (meta device, wrap,
# to_empty: build_model minus init_weights, whose 16 GB per rank this machine cannot spare);
# reports the bytes this rank holds and its resident memory, then draws block 0's shards.
SHARD_PROBE = """
import json
from gristmill.trainer import init
from gristmill.trainer.model import count_params
from gristmill.trainer.parallelize import allocate_sharded

def memory():
    found = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):  # resident now, and the peak since the start
            found[key] = int(value.split()[0]) * 1024
    return found

args = model_args("8b", vocab_size=128256, max_seq_len=2048)
model = allocate_sharded(args, build_mesh(d.device, d.world_size), device=d.device, param_dtype=torch.bfloat16,
                         activation_checkpoint="selective", compile=False)
local = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
before = memory()
block = [(init.canonical_name(n), p) for n, p in model.named_parameters() if ".layers.0." in "." + init.canonical_name(n)]
for name, p in block:
    init.normal_(p, name, seed=0, std=0.02) if p.dim() > 1 else init.ones_(p)
after = memory()
block_local = sum(p.to_local().numel() * p.element_size() for _, p in block)
block_std = torch.cat([p.to_local().flatten() for _, p in block if p.dim() > 1]).std().item()
print(json.dumps({"rank": d.rank, "local_bytes": local, "full_bytes": 4 * count_params(args)["total"],
                  "before": before, "after": after, "block_local_bytes": block_local, "block_std": block_std}))
"""


def start(script, *args: str, nproc: int = 1) -> subprocess.Popen:
    """Start ``script`` as one plain process (a group of one) or under torchrun with ``nproc`` ranks."""
    launcher = [sys.executable]
    if nproc > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen(launcher + [str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:] + err[-5000:]
    return out


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """Two launches side by side (most of a launch is starting Python and importing torch): one
    process (no torchrun variables: a group of one, its environment checked) builds the tiny model; torchrun's 2 ranks build it with FSDP (blocks wrapped for
    activation checkpointing) and with HSDP (2 replicas of a 1-rank shard group), then run the
    8b probe. Returns the three weight sets and the 8b probe's per-rank records."""
    tmp = tmp_path_factory.mktemp("init")
    one_rank, two_ranks = tmp / "one.py", tmp / "two.py"
    one_rank.write_text(WEIGHTS_PROBE + LEAVE)
    two_ranks.write_text(WEIGHTS_PROBE + SHARD_PROBE + LEAVE)
    one, two, hsdp = (str(tmp / f"{n}.pt") for n in ("one", "two", "hsdp"))
    procs = [start(one_rank, one, "-1", "none"), start(two_ranks, two, "-1", "selective", hsdp, "1", "none", nproc=2)]
    alone, ranks = (finish(p) for p in procs)
    return {"weights": tuple(torch.load(p) for p in (one, two, hsdp)),
            "ranks": [json.loads(line) for line in ranks.splitlines() if line.startswith("{")],
            "alone": [line for line in alone.splitlines() if line.startswith("START ")]}


def test_a_single_process_start_leaves_the_environment_alone(probes):
    """Without torchrun's variables the trainer is a group of one over an in-process store; it
    must not write RANK, MASTER_PORT or anything else into its caller's environment."""
    assert probes["alone"] == ["START 0 1 [] []"]


def test_initial_weights_are_the_same_at_any_world_size(probes):
    a, b, c = probes["weights"]
    assert list(a) == list(b) == list(c) and "tok_embeddings.weight" in a and "output.weight" in a
    for name in a:
        assert torch.equal(a[name], b[name]) and torch.equal(a[name], c[name]), name
    # Drawn, not left as to_empty's garbage: N(0, 0.02) matrices, the residual outputs scaled down, unit norm gains.
    assert abs(a["tok_embeddings.weight"].std().item() - 0.02) < 0.002
    assert a["layers.0.attention.wo.weight"].std() < 0.8 * a["layers.0.attention.wq.weight"].std()
    assert torch.equal(a["norm.weight"], torch.ones_like(a["norm.weight"]))
    assert not torch.equal(a["layers.0.attention.wq.weight"], a["layers.1.attention.wq.weight"])


def test_the_8b_preset_on_two_ranks_holds_only_its_shards(probes):
    """Before any step: each rank's parameters are half of the model's 32 GB of fp32, and its
    resident memory stays far below even that half (to_empty only reserves), where building the
    model whole, as the trainer used to, cost 32 GB per rank. Drawing block 0 adds about its shard."""
    ranks = probes["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    full = ranks[0]["full_bytes"]
    assert full > 30e9  # the 8b preset: 8.0e9 parameters in fp32
    for r in ranks:
        assert r["local_bytes"] == full // 2  # every 8b dimension divides by 2: exact halves
        assert r["before"]["VmHWM"] < 0.1 * full  # never anywhere near a full copy, at any moment
        grown = r["after"]["VmRSS"] - r["before"]["VmRSS"]
        assert 0.9 * r["block_local_bytes"] < grown < 1.5 * r["block_local_bytes"]  # its shard, not the whole block
        assert abs(r["block_std"] - 0.02) < 0.001
