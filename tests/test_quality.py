"""The quality stage's rules (pipeline/quality/): each rule removes under its own name and can be
turned off, the n-gram kernel counts what Gopher's definitions count, C4 drops lines or only
judges, a fastText classifier trained here scores documents, and per-source settings merge."""
import random
from collections import Counter

import numpy as np
import pytest

from gristmill.errors import ConfigError
from gristmill.pipeline.quality import evaluate, metric_names
from gristmill.pipeline.stages.quality.config import QualityConfig
from gristmill.pipeline.quality.gopher import DUP_N, TOP_N, _ngram_chars
from gristmill.pipeline.quality.text import word_hashes

VOCAB = ("the of and to that with have be river stone garden morning letter window village music harbour "
         "market teacher painter evening question answer summer winter careful quiet bright narrow ancient "
         "traveller kitchen orchard lantern bridge meadow").split()


def prose(seed: int, paragraphs: int = 3, sentences: int = 3) -> str:
    """English-looking prose every default rule keeps: sentences of 9-14 words, each paragraph a line."""
    rng = random.Random(seed)
    paras = []
    for _ in range(paragraphs):
        sents = []
        for _ in range(sentences):
            words = [rng.choice(VOCAB) for _ in range(rng.randint(9, 14))]
            sents.append(" ".join(words).capitalize() + ".")
        paras.append(" ".join(sents))
    return "\n\n".join(paras)


def _reference_ngram_chars(words: list[str]):
    """Gopher's top and duplicate n-gram characters as datatrove writes them (strings, a Counter, a set)."""
    top = []
    for n in TOP_N:
        grams = [" ".join(words[i:i + n]) for i in range(len(words) - n + 1)]
        if not grams:
            top.append(0)
            continue
        gram, count = Counter(grams).most_common(1)[0]
        top.append(len(gram) * count)
    dup = []
    for n in DUP_N:
        seen, rep, i = set(), 0, 0
        while i < len(words) - n + 1:
            gram = "".join(words[i:i + n])
            if gram in seen:
                rep += len(gram)
                i += n
            else:
                seen.add(gram)
                i += 1
        dup.append(rep)
    return top, dup


@pytest.mark.parametrize("seed", range(10))
def test_ngram_kernel_counts_what_gopher_defines(seed):
    rng = random.Random(seed)
    vocab = [rng.choice("abcdefgh") * rng.randint(1, 4) for _ in range(rng.randint(2, 9))]
    words = [rng.choice(vocab) for _ in range(rng.randint(0, 300))]
    if seed % 2:  # planted repeats, so the duplicate counts are not all zero
        words = words[:40] * 4 + words
    if seed >= 6:  # prose-like: every 5-gram distinct but a planted phrase of seed - 3 words (the kernel stops early)
        words = [f"w{i}" for i in range(120)]
        words[60:60 + seed - 3] = words[10:10 + seed - 3]
    top, dup = _ngram_chars(word_hashes(words), np.array([len(w) for w in words], np.int64), np.array(TOP_N), np.array(DUP_N))
    assert (list(top), list(dup)) == _reference_ngram_chars(words)


def test_clean_prose_passes_every_rule_and_keeps_its_metrics():
    v = evaluate(prose(1), QualityConfig())
    assert v.reason is None and v.text is None
    assert set(v.metrics) == set(metric_names(QualityConfig()))
    assert v.metrics["gopher_quality:word_count"] >= 50


NO_REPETITION = {"gopher_repetition": {"enabled": False}}  # a short page's one 2-gram is its "top 2-gram" too


@pytest.mark.parametrize("text, rule, off", [
    ("Too short to be a page.", "gopher_quality:word_count", {**NO_REPETITION, "gopher_quality": {"min_doc_words": None}}),
    (prose(2) + "\n\nLorem ipsum dolor sit amet, consectetur adipiscing elit.", "c4:lorem_ipsum",
     {"c4": {"filter_lorem_ipsum": False}}),
    (prose(3) + "\n\nThe config reads {\"a\": 1} from the file.", "c4:curly_bracket", {"c4": {"filter_curly_bracket": False}}),
    ("\n\n".join([prose(4, 1, 2)] * 3), "gopher_repetition:dup_para_frac", {"gopher_repetition": {"dup_para_frac": None}}),
    ("\n".join(f"- {w} near {VOCAB[i - 3]}" for i, w in enumerate(VOCAB)) + "\n" + prose(5, 1, 3), "gopher_quality:bullet_lines",
     {"gopher_quality": {"max_bullet_lines_ratio": None}}),
])
def test_each_rule_removes_under_its_name_and_can_be_turned_off(text, rule, off):
    base = NO_REPETITION if rule == "gopher_quality:word_count" else {}
    v = evaluate(text, QualityConfig.model_validate(base))
    assert v.reason == rule
    assert v.value == v.metrics[rule] and v.threshold is not None
    assert evaluate(text, QualityConfig.model_validate(off)).reason != rule


def test_stop_words_count_occurrences_as_datatrove():
    # one stop word said twice passes min_stop_words: 2 (datatrove sums occurrences, not distinct words)
    text = "The " + " ".join(w for w in VOCAB[8:] * 2) + " the end."
    v = evaluate(text, QualityConfig.model_validate(NO_REPETITION))
    assert v.metrics["gopher_quality:stop_words"] == 1.0  # "The" is not "the": case-sensitive
    v = evaluate(text.replace("The ", "the "), QualityConfig.model_validate(NO_REPETITION))
    assert v.metrics["gopher_quality:stop_words"] == 2.0 and v.reason != "gopher_quality:stop_words"


def test_c4_drops_lines_only_with_drop_lines():
    text = prose(6) + "\nPlease enable JavaScript to view this page.\nShare"
    kept = evaluate(text, QualityConfig())
    assert kept.reason is None
    assert "JavaScript" not in kept.text and "Share" not in kept.text and kept.text.startswith(prose(6).split("\n")[0])
    assert kept.metrics["c4:dropped_lines"] > 0
    judged = evaluate(text, QualityConfig.model_validate({"c4": {"drop_lines": False}}))
    assert judged.reason is None and judged.text is None


def test_fastText_classifier_scores_and_filters(tmp_path):
    import fasttext

    assert hasattr(fasttext, "train_supervised"), (
        "the installed `fasttext` module is fasttext-predict's (no training): "
        "pip install --force-reinstall --no-deps fasttext-community (the Makefile does)")
    train = tmp_path / "train.txt"
    rng = random.Random(0)
    with open(train, "w") as f:
        for i in range(200):
            f.write(f"__label__hq {prose(100 + i, 1, 1)}\n")
            f.write("__label__lq " + " ".join(rng.choice(["click", "buy", "now", "free", "win", "$$$", "!!!", "deal"])
                                              for _ in range(12)) + "\n")
    model = fasttext.train_supervised(str(train), epoch=10, dim=16, thread=1, seed=1, verbose=0)  # one thread: reproducible
    path = str(tmp_path / "hq.bin")
    model.save_model(path)
    cfg = QualityConfig.model_validate({"classifier": {"path": path, "label": "hq", "threshold": 0.5}})
    good = evaluate(prose(7), cfg)
    assert good.reason is None and good.metrics["classifier:score"] > 0.5
    heuristics_off = {k: {"enabled": False} for k in ("gopher_repetition", "gopher_quality", "c4", "fineweb")}
    only = QualityConfig.model_validate({**heuristics_off, "classifier": {"path": path, "label": "hq", "threshold": 0.5}})
    bad = evaluate("click buy now free win deal $$$ !!!", only)
    assert bad.reason == "classifier:score" and bad.value < 0.5 and bad.threshold == 0.5
    assert set(bad.metrics) == {"classifier:score"}
    scored = only.model_copy(update={"classifier": only.classifier.model_copy(update={"threshold": None})})
    kept = evaluate("click buy now free win deal $$$ !!!", scored)  # no threshold: scored, kept
    assert kept.reason is None and kept.metrics == bad.metrics

    from gristmill.pipeline.quality.classifier import check_label
    with pytest.raises(ConfigError, match=r"quality.classifier.label: expected one of the model's labels \['hq', 'lq'\]"):
        check_label(cfg.classifier.model_copy(update={"label": "good"}))


def _job(**over):
    from gristmill.pipeline.config import PrepareConfig

    return PrepareConfig.from_dict({"inputs": [{"path": "a.jsonl", **over}], "output": {"store": "s", "dataset": "d"},
                                "work_dir": "w", "quality": {"c4": {"drop_lines": False}}})


def test_per_source_quality_settings_merge_onto_the_job_section(tmp_path):
    job = _job(quality={"gopher_quality": {"min_doc_words": 3}})
    cfg = job.quality_for(0)
    assert cfg.gopher_quality.min_doc_words == 3 and cfg.gopher_quality.max_doc_words == 100_000
    assert cfg.c4.drop_lines is False  # the job's own setting stays
    assert _job().quality_for(0) == _job().quality
    exempt = _job(quality={"enabled": False}).quality_for(0)
    assert evaluate("short", exempt).reason is None and evaluate("short", exempt).metrics == {}
    with pytest.raises(ConfigError, match=r"inputs\[0\]\.quality\.gopher_quality\.min_doc_wrds: .*did you mean 'min_doc_words'"):
        _job(quality={"gopher_quality": {"min_doc_wrds": 3}})
    with pytest.raises(ConfigError, match=r"inputs\[0\]\.language_threshold: "):
        _job(language_threshold=1.5)
    from gristmill.pipeline.config import PrepareConfig

    (tmp_path / "m.bin").write_bytes(b"")
    job = PrepareConfig.from_dict({"inputs": [{"path": "a.jsonl", "quality": {"classifier": {"path": "m.bin", "label": "hq"}}}],
                               "output": {"store": "s", "dataset": "d"}, "work_dir": "w", "quality": {}},
                              base_dir=str(tmp_path))
    assert job.quality_for(0).classifier.path == str(tmp_path / "m.bin")  # relative to the job file, as everywhere


# Texts for the shortcuts of pipeline/quality/text.py (each must equal the plain definition it replaces):
# every kind of white space str.split and \\s share, marks after words, contractions in any case,
# abbreviations, paths, numbers, newline runs of every length at both ends.
SHORTCUT_TEXTS = [
    "Don't stop. It can't be; we CANNOT go, cannot? Cannot! I'M sure you'll've seen it's O.K. e.g. U.S.A.",
    "word, word. word; word: word! word? (word) word) \"word\" word\" -word word- well-known 3/4 a/b os.path",
    "tab\tsep\x0bvt\x0cff\x1cfs\x1dgs\x1ers\x1fus\x85nel\xa0nbsp\u1680ogham\u2000en\u2028ls\u2029ps\u3000ideo\u200bzwsp",
    "x, ., ,, a,, b.. c... d-- e'' f): g_h __init__ -1 -2.5 --flag \\n \\begin Ⅻ, ½. ١٢٣, 日本語。 naïve, ŀ,",
    "can not cannot, cannot. Cannot) cANNOT\" n't don't, won't. isn’t’ ’s 'tis", "", "   ", "\n", "\n\n\na\n\nb\n\n\n\nc\n",
    "a\nb\n\nc\n\n\nd\n", "\n\nlead", "trail\n\n", "one\n\n\n", "a\r\nb\r\n\r\nc", "x\n \ny\n\n \n\nz",
]


def test_word_shortcut_is_the_regex():
    from gristmill.pipeline.quality.text import _WORD, words

    for text in SHORTCUT_TEXTS + [" ".join(SHORTCUT_TEXTS), "\n".join(SHORTCUT_TEXTS)]:
        assert words(text) == _WORD.findall(text), text


def test_line_and_paragraph_shortcuts_are_the_regex_splits():
    from gristmill.pipeline.quality.text import _LINES, _PARAGRAPHS, Doc, find_duplicates

    for text in SHORTCUT_TEXTS:
        doc = Doc(text)
        assert doc.newline_runs == _LINES.split(text) and doc.paragraphs == _PARAGRAPHS.split(text.strip()), repr(text)
        for items in (doc.newline_runs, doc.paragraphs, ["a", "b", "a", "", "", "a", "bb", "b"]):
            seen, n, chars = set(), 0, 0
            for x in items:  # Gopher's definition: an element equal to an earlier one
                n, chars = (n + 1, chars + len(x)) if x in seen else (n, chars)
                seen.add(x)
            assert find_duplicates(items) == (n, chars)


def _analysed_as_the_regex(text: str) -> bool:
    from gristmill.pipeline.quality.text import _WORD, analyse, has_alnum, has_alpha

    words = _WORD.findall(text)
    got = analyse(text)
    return (list(got.hashes) == list(word_hashes(words)) and list(got.lengths) == [len(w) for w in words]
            and list(got.kinds) == [has_alnum(w) | has_alpha(w) << 1 for w in words])


def test_analyse_gives_the_regex_words_with_their_lengths_and_kinds():
    from gristmill.pipeline.quality.text import Tokens

    tokens = Tokens()
    tokens.MAX = 5  # starts over several times, between texts
    extra = " ".join(["_", "__", "½", "١", "Ⅻ", "'", "x_y", "a/b,", "cannot", "xcannot", "CANNOTs", "(cannot)", "cannot/not",
                      "don’t", "“quoted”", "naïve,", "e.g.", "U.S.A.", "-3.14", "1/2", "\\n", "isn't", "'re", "...", "--", "''", "):"])
    texts = SHORTCUT_TEXTS + [extra, " ".join(SHORTCUT_TEXTS), "\n".join(SHORTCUT_TEXTS), extra.replace("cannot", "")]
    from unittest import mock

    with mock.patch("gristmill.pipeline.quality.text.TOKENS", tokens):
        for text in texts * 2:  # met first, then known
            assert _analysed_as_the_regex(text), text
    non_ascii = {t for text in texts for t in text.split() if not t.isascii()}
    assert tokens.MAX < len(tokens.known) < len(non_ascii)  # it started over, and keeps what it met since


def test_the_ascii_scanner_is_the_regex_on_random_tokens():
    """Tokens of the characters each alternative of _WORD turns on (letters of can/not/n't/'s..., digits,
    quotes, - / = . _ \\ and marks), joined by ASCII and Unicode white space."""
    rng = random.Random(0)
    chars = "aAcCnNoOtTsSrReEvVlLdDmMxX09'-/=._\\():,!?\"#"
    for _ in range(5000):
        toks = ["".join(rng.choice(chars) for _ in range(rng.randint(1, 9))) for _ in range(rng.randint(1, 6))]
        toks.append(rng.choice(["cannot", "CanNot", "don't", "e.g.", "U.S.A", "-3.14", "1/2", "a/b", "can't", "'re", "x--y"]))
        rng.shuffle(toks)
        text = rng.choice([" ", "\n", "\t", " \u00a0", "\u3000", "\x1c"]).join(toks)
        assert _analysed_as_the_regex(text), repr(text)


def test_tokens_split_at_str_split_white_space_for_every_code_point():
    from gristmill.pipeline.quality.text import _tokens

    text = "".join(f"a{chr(c)}b" for c in range(0x110000) if not 0xD800 <= c < 0xE000)  # each between two letters
    raw = text.encode()
    starts, ends, _ = _tokens(np.frombuffer(raw, np.uint8))
    assert [raw[s:e].decode() for s, e in zip(starts.tolist(), ends.tolist())] == text.split()
