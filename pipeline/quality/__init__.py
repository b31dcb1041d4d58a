"""The quality stage's rules: Gopher quality and repetition, C4, FineWeb and an optional fastText
classifier, evaluated on one shared analysis of each document (``evaluate``).

Rule sets run in datatrove's FineWeb order (Gopher repetition, Gopher quality, C4, FineWeb,
then the classifier). Every enabled rule set measures every document (so the metrics of kept
and removed documents alike can be read back to tune thresholds); the first rule that fails
is the document's removal reason. See docs/quality.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import c4, classifier, fineweb, gopher
from .rules import Rule
from .text import Doc, words

if TYPE_CHECKING:  # the quality section; the stage imports these rules, so not at run time
    from ..stages.quality.config import QualityConfig


@dataclass
class Verdict:
    metrics: dict[str, float]
    reason: str | None  # the first failing rule, or None: kept
    value: float | None = None
    threshold: float | None = None
    text: str | None = None  # the new text when C4 dropped lines, else None


def rule_sets(cfg: QualityConfig) -> list[tuple[str, list[Rule], object, list[str], list]]:
    """(name, rules, its config, its metric names, each rule's (rule, low, high) thresholds read from
    that config once) of each enabled rule set, in evaluation order (none when the section is off: an
    input's ``quality: {enabled: false}`` exempts its files)."""
    out = []
    if not cfg.enabled:
        return out
    for name, rules, sub, info in ((gopher.REPETITION, gopher.REPETITION_RULES, cfg.gopher_repetition, []),
                                   (gopher.QUALITY, gopher.QUALITY_RULES, cfg.gopher_quality, []),
                                   (c4.SET, c4.RULES, cfg.c4, c4.INFO),
                                   (fineweb.SET, fineweb.RULES, cfg.fineweb, []),
                                   (classifier.SET, classifier.RULES, cfg.classifier, [])):
        if sub is not None and getattr(sub, "enabled", True):
            out.append((name, rules, sub, [r.name for r in rules] + info, [r.limits(sub) for r in rules]))
    return out


def metric_names(cfg: QualityConfig) -> list[str]:
    return [m for _, _, _, names, _ in rule_sets(cfg) for m in names]


def evaluate(text: str, cfg: QualityConfig, sets: list | None = None) -> Verdict:
    """The verdict on one document; ``sets`` is ``rule_sets(cfg)``, built once by a caller that
    evaluates many documents (a partition task), else here."""
    doc = Doc(text)
    metrics: dict[str, float] = {}
    new_text = fineweb_text = text
    sets = rule_sets(cfg) if sets is None else sets
    for name, _, sub, *_ in sets:
        if name == gopher.REPETITION:
            metrics.update(gopher.repetition_metrics(doc, sub))
        elif name == gopher.QUALITY:
            metrics.update(gopher.quality_metrics(doc, sub))
        elif name == c4.SET:
            m, kept, changed = c4.measure(doc, sub)
            metrics.update(m)
            if sub.drop_lines:
                fineweb_text = kept
                new_text = kept if changed else text
        elif name == fineweb.SET:
            n_words = len(doc.words.hashes) if fineweb_text is text else len(words(fineweb_text))
            metrics.update(fineweb.measure(fineweb_text, n_words, sub))
        else:
            metrics[f"{classifier.SET}:score"] = classifier.score(new_text, sub)
    changed = new_text if new_text != text else None
    for _, _, sub, _, limits in sets:  # Rule.verdict, with the thresholds read once a task
        for rule, lo, hi in limits:
            value = metrics[rule.name]
            if rule.exempt is not None and rule.exempt(value, sub):
                continue
            if lo is not None and value < lo:
                return Verdict(metrics, rule.name, value, lo, changed)
            if hi is not None and value > hi:
                return Verdict(metrics, rule.name, value, hi, changed)
    return Verdict(metrics, None, text=changed)
