from gristmill.pipeline.text import normalize, words


def test_normalize_folds_case_punctuation_width_and_space():
    assert normalize("  Hello,   WORLD!\n\tIt's ﬁne_ok ") == "hello world it s fine ok"
    assert normalize("Ｆｕｌｌ-width") == "full width"  # NFKC
    assert words("Straße STRASSE") == ["strasse", "strasse"]  # casefold
    assert normalize("") == "" and words("...") == []
