"""The tokenizer stage's task: a byte-level BPE trained on the first surviving documents.

Training is deterministic: byte-level BPE on the first documents in global ``order`` up to
``sample_bytes`` (after filtering and dedup), a fixed vocabulary size, and the trainer's
deterministic merge order (ties broken by the pair itself).
"""
from __future__ import annotations

from .config import TokenizerConfig


def train_bpe(texts, cfg: TokenizerConfig, out_path: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=cfg.vocab_size, special_tokens=[cfg.eos_token], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(out_path)
