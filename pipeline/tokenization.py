"""Hugging Face ``tokenizers`` files, shared by the stages that read one (tokenizer, tokenize, pack):
``load_tokenizer`` and its error."""
from __future__ import annotations

import functools

from gristmill.errors import GristmillError
from gristmill.manifests.storage import Store


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
        store = store or Store.from_url(path)
        if store.is_local:
            tok = Tokenizer.from_file(store.path(path))
        else:  # a work dir or tokenizer on an object store
            tok = Tokenizer.from_str(store.read(path).decode("utf-8"))
    except Exception as e:
        raise TokenizerError(f"tokenizer.path: {path} is not a tokenizers tokenizer.json: {e}") from e
    eos_id = tok.token_to_id(eos_token)
    if eos_id is None:
        raise TokenizerError(f"tokenizer.eos_token: {eos_token!r} is not in the vocabulary of {path}; set eos_token to its EOS")
    return tok, tok.get_vocab_size(with_added_tokens=True), eos_id
