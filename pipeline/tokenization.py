"""Hugging Face ``tokenizers`` files, shared by the stages that read one (tokenizer, tokenize, pack):
``load_tokenizer`` and its error, and the encoder tokenize runs (``choose_encoder``, ``load_encoder``): the
fastest exact one for the file, the same ids either way (``pipeline.fast_bpe``)."""
from __future__ import annotations

import functools

from gristmill.errors import GristmillError
from gristmill.manifests.storage import Store

from . import fast_bpe

TOKENIZERS, TIKTOKEN = "tokenizers", "tiktoken"


class TokenizerError(GristmillError):
    pass


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str, eos_token: str, store: Store | None = None):
    """(tokenizer, vocab_size, eos_id) of ``path`` of ``store`` (None: the store of ``path``); the EOS
    token must be in the vocabulary.

    Cached per worker process: a worker tokenizes many partitions with the same file.
    """
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_str(_read(path, store))
    except Exception as e:
        raise TokenizerError(f"tokenizer.path: {path} is not a tokenizers tokenizer.json: {e}") from e
    eos_id = tok.token_to_id(eos_token)
    if eos_id is None:
        raise TokenizerError(f"tokenizer.eos_token: {eos_token!r} is not in the vocabulary of {path}; set eos_token to its EOS")
    return tok, tok.get_vocab_size(with_added_tokens=True), eos_id


def _read(path: str, store: Store | None) -> str:
    store = store or Store.from_url(path)
    if store.is_local:
        with open(store.path(path), encoding="utf-8") as f:
            return f.read()
    return store.read(path).decode("utf-8")  # a work dir or tokenizer on an object store


class HFEncoder:
    """HF ``tokenizers`` itself: any tokenizer.json."""

    name = TOKENIZERS

    def __init__(self, tok):
        import tokenizers

        self.tok, self.version = tok, tokenizers.__version__

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)  # no offsets: we do not use them
        return [e.ids for e in encode(texts, add_special_tokens=False)]

    def encode_joined(self, texts: list[str], eos: str):
        return None  # one call per document: encode_batch


def choose_encoder(path: str, eos_token: str, store: Store | None = None, wanted: str = "auto") -> tuple[str, str]:
    """(the encoder tokenize runs for ``path``, why not the fast one: "" when it is). ``wanted``:
    ``auto`` (tiktoken when the file maps onto its rank table exactly, else tokenizers) or ``tokenizers``."""
    load_tokenizer(path, eos_token, store)  # a usable file and EOS first, whichever encoder
    if wanted == TOKENIZERS:
        return TOKENIZERS, "tokenizer.encoder: tokenizers"
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return TOKENIZERS, "tiktoken is not installed"
    try:
        spec = fast_bpe.spec_of(_read(path, store))
        fast_bpe.check_tokens(fast_bpe.rank_table(spec), spec["model"].get("merges") or [])
    except fast_bpe.NotRepresentable as e:
        return TOKENIZERS, str(e)
    return TIKTOKEN, ""


@functools.lru_cache(maxsize=4)
def load_encoder(path: str, eos_token: str, store: Store | None = None, kind: str = TOKENIZERS):
    """(encoder, vocab_size, eos_id): ``kind`` as ``choose_encoder`` chose it (cached per worker)."""
    tok, vocab, eos_id = load_tokenizer(path, eos_token, store)
    if kind == TIKTOKEN:
        return fast_bpe.TiktokenEncoder(fast_bpe.rank_table(fast_bpe.spec_of(_read(path, store))), path), vocab, eos_id
    return HFEncoder(tok), vocab, eos_id


def encoder_label(kind: str) -> str:
    """``kind`` and its library's version, as the manifest records it (``tokenizer.encoder``)."""
    import importlib.metadata

    return f"{kind} {importlib.metadata.version(kind)}"
