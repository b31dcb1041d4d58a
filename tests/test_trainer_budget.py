"""The budget arithmetic (trainer/budget.py) against numbers worked by hand in docs/trainer.md."""
from __future__ import annotations

import pytest

from gristmill.trainer.budget import (activation_bytes_per_token, expected_wall_s, format_seconds, memory_budget,
                                      planned_flops, state_bytes)
from gristmill.trainer.model import count_params, flops_per_token_terms, model_args

LLAMA3_VOCAB = 128256


def test_sixteen_bytes_per_parameter_divided_by_the_shards():
    # 8B: 16 B/param x 8e9 = 128 GB; over 8 ranks 16 GB each (4 + 4 + 8 GB).
    terms = state_bytes(8_000_000_000, 8)
    assert list(terms.values()) == [4e9, 4e9, 8e9] and sum(terms.values()) == 16e9
    assert sum(state_bytes(8_000_000_000, 1).values()) == 128e9


def test_the_8b_preset_is_llama_3_8b():
    n = count_params(model_args("8b", vocab_size=LLAMA3_VOCAB, max_seq_len=8192))
    # block 4096*4096*2 + 2*4096*1024 + 3*4096*14336 + 2*4096 = 218,112,000; x32 layers;
    # embeddings and head 525,336,576 each, + 4096 for the final norm
    assert n["block"] == 218_112_000 and n["head"] == 525_340_672
    assert n["total"] == 32 * 218_112_000 + 525_340_672 + 525_336_576 == 8_030_261_248
    assert sum(state_bytes(n["total"], 8).values()) == 16_060_522_496  # 16.06 GB per rank on 8 GPUs


def test_activation_bytes_per_token_and_layer():
    args = model_args("1b", vocab_size=LLAMA3_VOCAB, max_seq_len=2048)  # h 2048, f 8192, 8 KV heads of 64
    none = activation_bytes_per_token(args, "none", 2)
    assert none["layer"] == 12 * 2048 + 4 * 512 + 2 * (8 * 2048 + 4 * 8192) == 124_928
    assert none["head"] == (2 + 8) * LLAMA3_VOCAB and none["recompute"] == 0
    assert activation_bytes_per_token(args, "selective", 2)["layer"] == 2 * (5 * 2048 + 2 * 512 + 2 * 8192) == 55_296
    full = activation_bytes_per_token(args, "full", 2)
    assert full["layer"] == 2 * 2048 and full["recompute"] == 124_928
    with pytest.raises(ValueError, match="expected one of none, selective, full"):
        activation_bytes_per_token(args, "some", 2)


def test_memory_budget_of_the_1b_preset_on_one_gpu():
    args = model_args("1b", vocab_size=LLAMA3_VOCAB, max_seq_len=2048)
    n = count_params(args)
    assert (n["total"], n["block"], n["head"]) == (1_498_482_688, 60_821_504, 262_670_336)
    b = memory_budget(args, n_params=n["total"], shards=1, compute_bytes=2, micro_batch=8, seq_len=2048,
                      activation_checkpoint="none")
    tokens = 8 * 2048
    expected = [4 * 1_498_482_688, 4 * 1_498_482_688, 8 * 1_498_482_688,  # 23.98 GB of state
                2 * (2 * 60_821_504 + 262_670_336),  # gathered bf16: two blocks and the head unit, 0.77 GB
                (2 + 4) * 262_670_336,  # the head's unsharded gradients, bf16 + fp32, 1.58 GB
                16 * tokens * 124_928,  # 32.75 GB of activations
                tokens * 10 * LLAMA3_VOCAB]  # 21.01 GB at the loss
    assert list(b.terms.values()) == expected
    assert b.total == sum(expected) and 80e9 < b.total < 81e9
    assert "activations (none, 16,384 tokens) 32.75 GB" in b.describe()
    selective = memory_budget(args, n_params=n["total"], shards=8, compute_bytes=2, micro_batch=8, seq_len=2048,
                              activation_checkpoint="selective")
    assert selective.terms["fp32 master weights"] == 4 * 1_498_482_688 / 8
    assert selective.total < b.total


def test_planned_compute_and_wall_time():
    args = model_args("1b", vocab_size=LLAMA3_VOCAB, max_seq_len=2048)
    matmul, attention = flops_per_token_terms(args, 2048)
    assert matmul == 6 * 1_235_814_400 and attention == 12 * 16 * 2048 * 2048
    plan = planned_flops(matmul, attention, 1_000_000_000)
    assert plan == {"6ND": 7_414_886_400e9, "attention": 805_306_368e9, "total": 8_220_192_768e9}
    assert expected_wall_s(1e18, mfu=0.5, peak_flops_per_device=1e15, devices=2) == 1000.0
    # 1e9 tokens of the 1b preset on one H200 at 45% MFU: 8.22e18 / (0.45 * 989e12) s = 5.1 h
    assert format_seconds(expected_wall_s(plan["total"], mfu=0.45, peak_flops_per_device=989e12, devices=1)) == "5.1 h"
