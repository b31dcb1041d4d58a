"""An exact fast encoder for byte-level BPE: a ``tokenizer.json`` mapped onto tiktoken's rank table.

HF ``tokenizers`` merges the adjacent *pair* of lowest merge rank; tiktoken merges the adjacent pair
whose *concatenation* has the lowest token rank, and returns a whole regex piece that is itself a token
without merging. The two give the same ids for every text when (checked by ``rank_table``, else the
tokenizer is not representable and ``load_tokenizer`` falls back to HF):

* the pre-tokenizer is exactly GPT-2's byte-level regex (``ByteLevel``, ``use_regex``, no prefix space),
  no normalizer, a plain BPE model (no dropout, byte fallback, subword prefix or word suffix);
* every byte is a token, and the token merge ``i`` makes has an id above merge ``i - 1``'s, so token
  ranks order the merges as the merge list does;
* every vocabulary token, encoded alone by both, gives the same ids. Where the two rules first part on
  some text, tiktoken merges a pair (x, y) into a token t that HF has no merge for; the merges inside
  t's span up to then are the same as in t's bytes alone (BPE decides them by rank, and nothing outside
  the span merged into it), so encoding t's bytes alone parts the two as well. Checking every token
  therefore checks every text. It also covers tiktoken's whole-piece shortcut: a piece that is a token
  encodes as that token in HF too;
* added tokens (split out of the text before BPE by both) match no other added token's substring and
  strip nothing around them.

The regex engines (HF: Oniguruma; tiktoken: fancy-regex) agree on GPT-2's pattern; that part is
verified on text, not proved (tests/test_fast_bpe.py, benchmarks/bench_tokenize.py: 100k+ documents).
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class NotRepresentable(Exception):
    """The tokenizer cannot be encoded by the rank table with the same ids (the message says why)."""


@functools.lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's (and ``ByteLevel``'s) printable stand-in character for each byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return {b: chr(b) if b in keep else chr(next(extra)) for b in range(256)}


@dataclass(frozen=True)
class RankTable:
    ranks: dict[bytes, int]  # token bytes -> id (= its rank)
    specials: dict[str, int]  # added tokens, matched in the text before BPE


def rank_table(spec: dict) -> RankTable:
    """``spec`` (a parsed tokenizer.json) as a rank table; ``NotRepresentable`` if it is not one exactly.
    The per-token check against HF is ``check_tokens``."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise NotRepresentable(f"model {model.get('type')!r} is not BPE")
    for key, ok in (("dropout", None), ("continuing_subword_prefix", None), ("end_of_word_suffix", None)):
        if model.get(key) not in (ok, ""):
            raise NotRepresentable(f"BPE {key} is {model.get(key)!r}")
    if model.get("byte_fallback") or model.get("ignore_merges"):
        raise NotRepresentable("BPE byte_fallback / ignore_merges is set")
    if spec.get("normalizer") is not None:
        raise NotRepresentable("it has a normalizer")
    if not _gpt2_byte_level(spec.get("pre_tokenizer")):
        raise NotRepresentable("its pre-tokenizer is not GPT-2's byte-level regex without a prefix space")
    char_byte = {c: b for b, c in byte_to_unicode().items()}
    added = {a["content"]: a["id"] for a in spec.get("added_tokens") or []}
    for a in spec.get("added_tokens") or []:
        if a.get("single_word") or a.get("lstrip") or a.get("rstrip"):
            raise NotRepresentable(f"added token {a['content']!r} has single_word / lstrip / rstrip")
        if any(a["content"] != b and a["content"] in b for b in added):
            raise NotRepresentable(f"added token {a['content']!r} is inside another added token")
    ranks: dict[bytes, int] = {}
    for token, i in model["vocab"].items():
        if token in added:
            continue
        try:
            ranks[bytes(char_byte[c] for c in token)] = i
        except KeyError:
            raise NotRepresentable(f"vocabulary token {token!r} is not byte-level") from None
    if any(bytes([b]) not in ranks for b in range(256)):
        raise NotRepresentable("not every byte is a token")
    last = -1
    for m in model.get("merges") or []:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        i = model["vocab"].get(a + b)
        if i is None or i <= last:
            raise NotRepresentable(f"merge {a!r} + {b!r}: its token's id is not above the previous merge's")
        last = i
    if len(set(ranks.values()) | set(added.values())) != len(ranks) + len(added):
        raise NotRepresentable("two tokens share an id")
    return RankTable(ranks, added)


def _gpt2_byte_level(pre) -> bool:
    if pre and pre.get("type") == "Sequence" and len(pre.get("pretokenizers", [])) == 1:
        pre = pre["pretokenizers"][0]
    return bool(pre) and pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space")


class TiktokenEncoder:
    """tiktoken over a ``RankTable``; ``encode_batch`` returns the ids of each text (no EOS)."""

    name = "tiktoken"

    def __init__(self, table: RankTable, label: str):
        import tiktoken

        self.version = tiktoken.__version__
        self.enc = tiktoken.Encoding(label, pat_str=GPT2_PATTERN, mergeable_ranks=table.ranks,
                                     special_tokens=table.specials)
        self.specials = tuple(table.specials)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.enc.encode(t, allowed_special="all") for t in texts]

    def encode_joined(self, texts: list[str], eos: str):
        """All texts' ids with ``eos``'s id after each, as one uint32 array, in one call: an added token
        ends the regex pieces on both sides, as the end of a text does. None where ``eos`` is no added
        token, or could match across a text's end (it overlaps itself). The caller checks that the EOS ids
        are as many as the texts (a text may hold the EOS string)."""
        if eos not in self.specials or any(eos[:k] == eos[-k:] for k in range(1, len(eos))):
            return None
        return self.enc.encode_to_numpy(eos.join(texts) + eos, allowed_special="all")


def check_tokens(table: RankTable, merges: list) -> None:
    """Every vocabulary token's bytes, merged alone by HF's rule (lowest merge rank, leftmost first) and by
    tiktoken's (lowest token rank, leftmost first), end as that one token (see the module's docstring);
    ``NotRepresentable`` naming the first that does not. Pure Python over the bytes: tokens that are not
    whole UTF-8 characters cannot be handed to either library as text."""
    unicode_byte = {c: b for b, c in byte_to_unicode().items()}
    pair_rank = {}
    for r, m in enumerate(merges):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        pair_rank.setdefault((bytes(unicode_byte[c] for c in a), bytes(unicode_byte[c] for c in b)), r)
    for token in table.ranks:
        if len(token) > 1:
            by_pair = _merge(token, lambda x, y: pair_rank.get((x, y)))
            by_rank = _merge(token, lambda x, y: table.ranks.get(x + y))
            if by_pair != [token] or by_rank != [token]:
                raise NotRepresentable(f"token {token!r} (id {table.ranks[token]}) merges alone into {by_pair} by the "
                                       f"merge list and {by_rank} by rank")


def _merge(word: bytes, rank) -> list[bytes]:
    parts = [word[i:i + 1] for i in range(len(word))]
    while len(parts) > 1:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = rank(parts[i], parts[i + 1])
            if r is not None and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts


def spec_of(json_text: str) -> dict:
    return json.loads(json_text)
