"""Fast in-process checks of the trainer's pieces: job config, model, schedule, MFU, Young/Daly."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from gristmill.errors import ConfigError
from gristmill.trainer import config
from gristmill.trainer.metrics import PEAK_BF16_FLOPS, mfu, peak_flops, young_daly_interval_s
from gristmill.trainer.model import PRESETS, Transformer, count_params, flops_per_token, model_args
from gristmill.trainer.state import lr_at

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def write(tmp_path, text: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


def test_presets_load(tmp_path):
    for name in sorted(os.listdir(CONFIGS)):
        cfg = config.load(os.path.join(CONFIGS, name))
        assert cfg.data.manifest and cfg.model.preset in PRESETS


def test_unknown_key_names_file_section_and_key(tmp_path):
    path = write(tmp_path, "data: {manifest: x, global_batc: 8}\n")
    with pytest.raises(ConfigError, match=r"job.yaml: data.global_batc: expected one of the keys manifest, .*global_batch.*, "
                                          r"got unknown key 'global_batc'; did you mean 'global_batch'\?"):
        config.load(path)
    with pytest.raises(ConfigError, match=r"job.yaml: optimiser: expected one of the keys run, data, .*, got unknown key 'optimiser'"):
        config.load(write(tmp_path, "data: {manifest: x}\noptimiser: {lr: 1}\n"))


def test_bad_values_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"parallelism.activation_checkpoint: expected one of none, selective, full, got 'some'"):
        config.load(write(tmp_path, "data: {manifest: x}\nparallelism: {activation_checkpoint: some}\n"))
    with pytest.raises(ConfigError, match=r"data.global_batch: expected an integer in \[1, 16777216\], got '8'"):
        config.load(write(tmp_path, "data: {manifest: x, global_batch: '8'}\n"))
    with pytest.raises(ConfigError, match=r"data.manifest: expected a non-empty string \(required\), got nothing"):
        config.load(write(tmp_path, "run: {steps: 3}\n"))


def test_overrides_apply_on_top(tmp_path):
    cfg = config.load(write(tmp_path, "data: {manifest: x}\n"), ["run.steps=7", "optimizer.betas=[0.8, 0.9]"])
    assert cfg.run.steps == 7 and cfg.optimizer.betas == (0.8, 0.9)
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        config.load(write(tmp_path, "data: {manifest: x}\n"), ["run.steps"])


def test_schedule_warms_up_then_decays_to_the_floor():
    opt = config.OptimizerConfig(lr=1.0, warmup_steps=4, min_lr_ratio=0.1)
    lrs = [lr_at(s, opt, 20) for s in range(1, 21)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(lrs[3:], lrs[4:]))
    assert lrs[-1] == pytest.approx(0.1)


def test_param_count_matches_the_model_and_flops_formula():
    args = model_args("tiny", vocab_size=100, max_seq_len=16, n_kv_heads=2)
    model = Transformer(args)
    n = count_params(args)
    assert n["total"] == sum(p.numel() for p in model.parameters())
    assert flops_per_token(args, 16) == 6 * n["non_embedding"] + 12 * args.n_layers * args.dim * 16
    big = count_params(model_args("1b", vocab_size=128256, max_seq_len=2048))
    assert 1.1e9 < big["total"] < 1.6e9  # the "1b" preset is Llama-3.2-1B shaped


def test_model_is_causal():
    torch.manual_seed(0)
    model = Transformer(model_args("tiny", vocab_size=50, max_seq_len=8, n_kv_heads=2))
    x = torch.randint(0, 50, (2, 8))
    y = x.clone()
    y[:, 5:] = (y[:, 5:] + 1) % 50
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.equal(a[:, :5], b[:, :5]) and not torch.allclose(a[:, 5:], b[:, 5:])


# Every entry of the peak table, by the names torch.cuda.get_device_name() reports (TFLOP/s,
# dense bf16, from the vendors' datasheets).
DEVICE_PEAKS = [
    ("NVIDIA H100 80GB HBM3", "H100", None, 989), ("NVIDIA H100 PCIe", "H100", "PCIE", 756),
    ("NVIDIA H100 NVL", "H100", "NVL", 835), ("NVIDIA H200", "H200", None, 989),
    ("NVIDIA GH200 480GB", "GH200", None, 989), ("NVIDIA H800", "H800", None, 989),
    ("NVIDIA H800 PCIe", "H800", "PCIE", 756), ("NVIDIA B200", "B200", None, 2250),
    ("NVIDIA GB200", "GB200", None, 2500), ("NVIDIA B100", "B100", None, 1750),
    ("NVIDIA A100-SXM4-80GB", "A100", None, 312), ("NVIDIA A800 80GB PCIe", "A800", None, 312),
    ("NVIDIA L40S", "L40S", None, 362), ("NVIDIA L40", "L40", None, 181), ("NVIDIA L4", "L4", None, 121),
    ("AMD Instinct MI300X", "MI300X", None, 1307), ("AMD Instinct MI325X", "MI325X", None, 1307),
]


@pytest.mark.parametrize("name,model,variant,tflops", DEVICE_PEAKS)
def test_every_peak_table_entry_matches_its_exact_device_name(name, model, variant, tflops):
    assert peak_flops(name) == PEAK_BF16_FLOPS[model][variant] == tflops * 1e12


def test_the_peak_table_is_covered_and_never_matches_a_prefix():
    assert {(m, v) for _, m, v, _ in DEVICE_PEAKS} == {(m, v) for m, vs in PEAK_BF16_FLOPS.items() for v in vs}
    # "L40" once matched "L4" (121 instead of 181), "GB200" matched "B200" (2250 instead of 2500)
    assert peak_flops("NVIDIA L40") != peak_flops("NVIDIA L4")
    assert peak_flops("NVIDIA GB200") != peak_flops("NVIDIA B200")
    for unknown in ("cpu", "NVIDIA GeForce GTX 1080", "NVIDIA L4X", "NVIDIA H1000", "NVIDIA A10", "NVIDIA RTX A6000"):
        assert peak_flops(unknown) is None, unknown


def test_mfu_uses_the_peak_and_refuses_to_guess():
    assert mfu(1000.0, 1e9, None) is None
    assert mfu(10_000.0, 7.5e9, 989e12) == pytest.approx(10_000 * 7.5e9 / 989e12)


def test_a_dcp_state_that_disagrees_with_meta_json_is_refused():
    from gristmill.trainer.meta import CheckpointError
    from gristmill.trainer.state import TrainState
    from gristmill.trainer.resume import check_states_match_meta

    meta = {"step": 4, "loader": {"next_index": 32, "seed": 0, "window_shards": None}}
    check_states_match_meta(meta, "ckpt", TrainState(step=4), {"next_index": 32, "seed": 0, "window_shards": None})
    with pytest.raises(CheckpointError, match="ckpt/meta.json: step 4 but the DCP train state says 5"):
        check_states_match_meta(meta, "ckpt", TrainState(step=5), meta["loader"])
    with pytest.raises(CheckpointError, match="differs from the DCP loader state"):
        check_states_match_meta(meta, "ckpt", TrainState(step=4), {**meta["loader"], "next_index": 40})


def test_young_daly_interval():
    assert young_daly_interval_s(30.0, 24 * 3600) == pytest.approx(math.sqrt(2 * 30 * 86400))


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_activation_checkpointing_keeps_the_gradients(mode):
    from gristmill.trainer.parallelize import apply_activation_checkpointing

    def grads(ac: str) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = Transformer(model_args("tiny", vocab_size=50, max_seq_len=8))
        apply_activation_checkpointing(model, ac)
        x = torch.randint(0, 50, (2, 8))
        model(x).logsumexp(-1).mean().backward()
        # checkpoint_wrapper inserts a module level; compare by the original parameter names
        return {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()}

    base, wrapped = grads("none"), grads(mode)
    assert base.keys() == wrapped.keys()
    for name in base:
        torch.testing.assert_close(wrapped[name], base[name], rtol=0, atol=0, msg=name)


def test_the_loaders_stored_dtype_batch_gives_the_int64_loss(tmp_path):
    """The trainer asks the loader for uint16 tokens and widens them itself: same inputs, labels, loss."""
    from helpers import build_dataset
    from gristmill.loader import Batches, Caching, Loader, Sampling
    from gristmill.trainer.step import cross_entropy, inputs_and_labels

    pub = build_dataset(str(tmp_path / "data"))
    batches = {}
    for dtype in (None, torch.int64):
        with Loader(pub.url, Sampling(global_batch=4), caching=Caching(dir=str(tmp_path / "cache")),
                    batches=Batches(token_dtype=dtype)) as ld:
            batches[dtype] = next(iter(ld))
    assert batches[None]["tokens"].dtype == torch.uint16
    x, y = inputs_and_labels(batches[None], "cpu")
    assert x.dtype == y.dtype == torch.int64
    assert torch.equal(x, batches[torch.int64]["input_ids"]) and torch.equal(y, batches[torch.int64]["labels"])
    torch.manual_seed(0)
    model = Transformer(model_args("tiny", vocab_size=512, max_seq_len=16, n_kv_heads=2))
    with torch.no_grad():
        assert torch.equal(cross_entropy(model(x), y),
                           cross_entropy(model(batches[torch.int64]["input_ids"]), batches[torch.int64]["labels"]))


def test_unsigned_tokens_widen_to_their_values():
    """Token ids past the signed range survive the trip (they travel as int16/int32 bytes)."""
    from gristmill.trainer.step import inputs_and_labels

    for np_dtype in (np.uint16, np.uint32):
        top = np.iinfo(np_dtype).max
        rows = np.array([[0, 1, top // 2 + 1, top - 1, top]], dtype=np_dtype)
        x, y = inputs_and_labels({"tokens": torch.from_numpy(rows)}, "cpu")
        assert x.dtype == y.dtype == torch.int64
        assert x.tolist() == [rows[0, :-1].astype(np.int64).tolist()] and y.tolist() == [rows[0, 1:].astype(np.int64).tolist()]
