"""The ``quality`` section of a prepare job: one typed sub-section per rule set.

Every threshold is the published default (docs/quality.md cites each) and ``null`` turns that
one rule off; ``enabled: false`` turns off a whole rule set. The parameter names are those of
datatrove's filters, so a datatrove configuration reads across. An input entry may override
any of these keys for its own files (``inputs[i].quality``, merged onto this section).
"""
from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from gristmill.config import Bool, Float, NonEmptyStr, NonNegativeInt, PositiveInt, ResolvedPath, Section, existing_local_file

Ratio = Annotated[Float, Field(ge=0)]


class GopherQualityConfig(Section):
    """Gopher's quality heuristics (Rae et al. 2021, appendix A.1.1)."""

    enabled: Bool = True
    min_doc_words: NonNegativeInt | None = 50  # words with a letter or digit
    max_doc_words: NonNegativeInt | None = 100_000
    min_avg_word_length: Ratio | None = 3
    max_avg_word_length: Ratio | None = 10
    max_symbol_word_ratio: Ratio | None = 0.1  # '#' per word, and '...'/'…' per word (two rules)
    max_bullet_lines_ratio: Ratio | None = 0.9  # lines starting with '•' or '-'
    max_ellipsis_lines_ratio: Ratio | None = 0.3  # lines ending with '...' or '…'
    min_alpha_words_ratio: Ratio | None = 0.8  # words with at least one letter
    min_stop_words: NonNegativeInt | None = 2  # stop-word occurrences (case-sensitive, as datatrove)
    stop_words: tuple[NonEmptyStr, ...] = ("the", "be", "to", "of", "and", "that", "have", "with")


class GopherRepetitionConfig(Section):
    """Gopher's repetition removal (Rae et al. 2021, table A1): fractions above the threshold remove."""

    enabled: Bool = True
    dup_para_frac: Ratio | None = 0.3
    dup_para_char_frac: Ratio | None = 0.2
    dup_line_frac: Ratio | None = 0.3
    dup_line_char_frac: Ratio | None = 0.2
    top_2_gram: Ratio | None = 0.2  # characters of the most frequent 2-gram (times its count) / characters
    top_3_gram: Ratio | None = 0.18
    top_4_gram: Ratio | None = 0.16
    dup_5_gram: Ratio | None = 0.15  # characters inside repeated 5-grams / characters
    dup_6_gram: Ratio | None = 0.14
    dup_7_gram: Ratio | None = 0.13
    dup_8_gram: Ratio | None = 0.12
    dup_9_gram: Ratio | None = 0.11
    dup_10_gram: Ratio | None = 0.10


class C4Config(Section):
    """C4's cleaning (Raffel et al. 2020, section 2.2; tensorflow_datasets c4_utils)."""

    enabled: Bool = True
    # true: the lines C4 would not keep are dropped from the text (an override of the quality
    # stage, docs/quality.md); false: the text is left alone and only the document rules apply.
    drop_lines: Bool = True
    remove_citations: Bool = True  # '[1]', '[edit]', '[citation needed]' cut from lines
    filter_no_terminal_punct: Bool = True  # keep only lines ending in . ? ! " ' (not '...')
    min_words_per_line: NonNegativeInt | None = 3
    max_word_length: PositiveInt | None = 1000  # a line with a longer word is dropped
    filter_javascript: Bool = True  # drop lines mentioning javascript
    filter_policy: Bool = True  # drop lines with 'terms of use', 'privacy policy', cookie phrases
    filter_lorem_ipsum: Bool = True  # document rule: a kept line has 'lorem ipsum'
    filter_curly_bracket: Bool = True  # document rule: a kept line has '{'
    min_num_sentences: NonNegativeInt | None = 5  # document rule: sentences in the kept lines


class FineWebConfig(Section):
    """FineWeb's own heuristics (Penedo et al. 2024, section 3.3; datatrove FineWebQualityFilter)."""

    enabled: Bool = True
    line_punct_thr: Ratio | None = 0.12  # fewer lines ending in terminal punctuation removes
    line_punct_exclude_zero: Bool = False  # true: a document with no such line passes that rule
    short_line_length: PositiveInt = 30  # a line of at most this many characters is short
    short_line_thr: Ratio | None = 0.67
    char_duplicates_ratio: Ratio | None = 0.01  # characters in duplicated lines / characters
    new_line_ratio: Ratio | None = 0.3  # newlines per word


class ClassifierConfig(Section):
    """A fastText classifier (DCLM / FineWeb-Edu style): the probability of ``label`` per document."""

    path: Annotated[ResolvedPath, Field(min_length=1)]  # a fastText .bin/.ftz model
    label: NonEmptyStr  # without the __label__ prefix, e.g. hq
    threshold: Ratio | None = None  # remove documents scoring below it; null: only record the score
    max_chars: PositiveInt | None = None  # only the first characters are scored (null: all)

    @field_validator("path")
    @classmethod
    def _exists(cls, v: str) -> str:
        return existing_local_file(v, "fastText classifier")


class QualityConfig(Section):
    """The ``quality`` stage (pipeline/quality/, docs/quality.md)."""

    SECTION = "quality"
    enabled: Bool = True
    gopher_repetition: GopherRepetitionConfig = GopherRepetitionConfig()
    gopher_quality: GopherQualityConfig = GopherQualityConfig()
    c4: C4Config = C4Config()
    fineweb: FineWebConfig = FineWebConfig()
    classifier: ClassifierConfig | None = None


def merge(base: dict, override: dict) -> dict:
    """``override`` onto ``base``, mapping by mapping (a per-input section onto the job's)."""
    out = dict(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
