"""An optional fastText classifier filter, the way DCLM (``fasttext_oh_eli5``) and FineWeb-Edu
style quality classifiers are shipped: a ``.bin`` model at a path the job names, the
probability of one label per document as its metric ``classifier:score``, and (when a
threshold is set) documents scoring below it removed. Newlines are scored as spaces (fastText
reads one line). The model is loaded once per worker process (``pipeline.langid.fasttext_model``).
"""
from __future__ import annotations

from .rules import Rule

SET = "classifier"
RULES = [Rule(f"{SET}:score", low=lambda c: c.threshold)]


def score(text: str, cfg) -> float:
    from ..langid import fasttext_model

    model = fasttext_model(cfg.path)
    if cfg.max_chars is not None:
        text = text[:cfg.max_chars]
    labels, probs = model.predict(text.replace("\n", " ").replace("\r", " "), k=-1)
    want = f"__label__{cfg.label}"
    for label, p in zip(labels, probs):
        if label == want:
            return round(float(min(p, 1.0)), 6)
    return 0.0


def check_label(cfg) -> None:
    """A label the model does not have would score 0 everywhere: refuse it before any work."""
    from gristmill.errors import ConfigError
    from ..langid import fasttext_model

    try:
        labels = [x.removeprefix("__label__") for x in fasttext_model(cfg.path).labels]
    except ValueError as e:
        raise ConfigError(f"quality.classifier.path: {cfg.path} is not a fastText model ({e})") from None
    if cfg.label not in labels:
        raise ConfigError(f"quality.classifier.label: expected one of the model's labels {sorted(labels)}, got {cfg.label!r}")
