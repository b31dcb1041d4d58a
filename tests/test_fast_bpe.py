"""The fast tokenize path (pipeline.fast_bpe, pipeline.tokenization.choose_encoder): tiktoken over a
tokenizer.json's rank table gives HF tokenizers' ids exactly, and a file it cannot represent falls back.
Whole prepares with either encoder: tests/test_pipeline.py."""
import json

import numpy as np
import pytest

from gristmill.pipeline import fast_bpe
from gristmill.pipeline.stages.tokenize.tasks import encode_with_eos
from gristmill.pipeline.stages.tokenizer.config import TokenizerConfig
from gristmill.pipeline.stages.tokenizer.tasks import train_bpe
from gristmill.pipeline.tokenization import TIKTOKEN, TOKENIZERS, choose_encoder, load_encoder

EOS = "<|endoftext|>"
# what the GPT-2 regex and byte-level mapping must agree on: contractions, digits, runs of spaces and
# newlines, Unicode letters, marks and numbers, emoji (4-byte UTF-8), control characters, the EOS string
HARD = ["It's the miller's wheel; they'll've gone. I'M here 'S", "12345 67.89 ٣٤٥ Ⅻ ½", "a  b   c\n\n\n d \t\t e  ",
        "naïve café résumé Straße İstanbul ǅ", "日本語のテキスト、中文文本。한국어", "emoji 👩‍👩‍👧 🇫🇷 x", "\x00\x01\x7f\u200b\u00a0nbsp",
        "tabs\tand\r\nCRLF\u2028line\u2029para", f"before{EOS}after {EOS}", "   leading and trailing   ", "", " ", "'''",
        "∑∫√ ≠ ≤ →", "x" * 3000, "ab" * 500 + " " + "ba" * 500]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """gristmill's own byte-level BPE on mixed-script text, as the tokenizer stage trains one."""
    rng = np.random.default_rng(3)
    words = ("the mill grinds grain into flour while the river turns its wheel café naïve Straße 日本語 テキスト "
             "don't it's 1234 56 7.8 ;; -- ... \n\n  \t emoji 👩 ‍ 🇫🇷 Ⅻ ½ ٣٤٥").split(" ")
    texts = ["".join(rng.choice(words, size=int(rng.integers(20, 200)))) for _ in range(300)] + HARD
    path = str(tmp_path_factory.mktemp("bpe") / "tokenizer.json")
    train_bpe(texts, TokenizerConfig(vocab_size=600), path)
    return path, texts


def test_a_trained_byte_level_bpe_encodes_with_tiktoken_to_the_same_ids(trained):
    path, texts = trained
    assert choose_encoder(path, EOS) == (TIKTOKEN, "")
    fast, _, eos_id = load_encoder(path, EOS, None, TIKTOKEN)
    hf, _, _ = load_encoder(path, EOS, None, TOKENIZERS)
    docs = texts + HARD
    assert fast.encode_batch(docs) == hf.encode_batch(docs)
    assert EOS in HARD[8] and hf.encode_batch([HARD[8]])[0].count(eos_id) == 2  # added tokens split as HF does
    # the stage's path: joined by EOS in one call, or one by one where a document holds an EOS
    for batch in (texts, [t for t in docs if EOS not in t]):
        for got, want in zip(encode_with_eos(fast, batch, eos_id, EOS), encode_with_eos(hf, batch, eos_id, EOS)):
            assert got.dtype == want.dtype and np.array_equal(got, want)


def _spec(path):
    with open(path) as f:
        return json.load(f)


def _write(tmp_path, spec, name="t.json"):
    p = tmp_path / name
    p.write_text(json.dumps(spec))
    return str(p)


def test_what_the_rank_table_cannot_represent_falls_back(trained, tmp_path):
    path, _ = trained
    spec = _spec(path)
    normalized = {**spec, "normalizer": {"type": "NFC"}}
    prefix = {**spec, "pre_tokenizer": {**spec["pre_tokenizer"], "add_prefix_space": True}}
    stripping = {**spec, "added_tokens": [{**spec["added_tokens"][0], "lstrip": True}]}
    forced = choose_encoder(path, EOS, None, "tokenizers")
    assert forced[0] == TOKENIZERS and forced[1]
    for bad, why in ((normalized, "normalizer"), (prefix, "pre-tokenizer"), (stripping, "lstrip")):
        kind, reason = choose_encoder(_write(tmp_path, bad), EOS)
        assert kind == TOKENIZERS and why in reason


def _abc_tokenizer(ids: dict, merges: list) -> dict:
    """A byte-level BPE over every byte plus ``ids`` (extra tokens), with ``merges``."""
    b2u = fast_bpe.byte_to_unicode()
    vocab = {EOS: 0, **{b2u[b]: 1 + b for b in range(256)}, **ids}
    return {"version": "1.0", "truncation": None, "padding": None, "normalizer": None, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "added_tokens": [{"id": 0, "content": EOS, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True}],
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": merges}}


def test_a_token_tiktoken_would_reach_by_another_pair_is_refused(tmp_path):
    """'abc' is merged as ab + c, but 'bc' merges first: HF stops at [a, bc], a rank table would go on to
    [abc]. The map alone (ids in merge order, every byte a token) does not see it; the per-token check does."""
    spec = _abc_tokenizer({"bc": 300, "ab": 301, "abc": 302}, [["b", "c"], ["a", "b"], ["ab", "c"]])
    path = _write(tmp_path, spec)
    table = fast_bpe.rank_table(spec)  # representable as far as the map goes...
    naive = fast_bpe.TiktokenEncoder(table, "naive")
    hf, _, _ = load_encoder(path, EOS, None, TOKENIZERS)
    assert naive.encode_batch(["abc"]) != hf.encode_batch(["abc"])  # ...and wrong
    with pytest.raises(fast_bpe.NotRepresentable, match="abc"):
        fast_bpe.check_tokens(table, spec["model"]["merges"])
    assert choose_encoder(path, EOS)[0] == TOKENIZERS


def test_ranks_out_of_merge_order_are_refused(tmp_path):
    """Token ids are tiktoken's ranks: a merge list whose tokens' ids do not rise with it would merge in
    another order."""
    spec = _abc_tokenizer({"ab": 301, "bc": 300}, [["a", "b"], ["b", "c"]])
    with pytest.raises(fast_bpe.NotRepresentable, match="id is not above"):
        fast_bpe.rank_table(spec)
    path = _write(tmp_path, spec)
    hf, _, _ = load_encoder(path, EOS, None, TOKENIZERS)
    assert hf.encode_batch(["abc"]) == [[301, 1 + ord("c")]]  # HF: ab first (merge order), not bc (lower id)
    assert choose_encoder(path, EOS)[0] == TOKENIZERS


def test_the_fallback_is_one_log_line(trained, tmp_path):
    from gristmill.pipeline.stages.tokenizer.stage import Tokenizer

    path, _ = trained
    bad = _write(tmp_path, {**_spec(path), "normalizer": {"type": "NFC"}})
    lines = []

    class Ctx:
        log = staticmethod(lines.append)

    got = Tokenizer(TokenizerConfig(path=bad))._chosen(Ctx, bad, None)
    assert got.encoder == TOKENIZERS and len(lines) == 1 and "normalizer" in lines[0]
    assert Tokenizer(TokenizerConfig(path=path))._chosen(Ctx, path, None).encoder == TIKTOKEN and len(lines) == 1
