"""HTML to text with resiliparse.

Why resiliparse: it is maintained (ChatNoir, used by DCLM and FineWeb-2 tooling), its parser
and extractor are C++ (an order of magnitude faster than trafilatura's lxml + Python
heuristics, which matters when extraction is the widest stage), its ``main_content`` mode drops
navigation and boilerplate, and it detects encodings itself. Output is deterministic.
"""
from __future__ import annotations


class HtmlError(ValueError):
    """A page that cannot be turned into text; ``reason`` is its quarantine reason."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


# The options of resiliparse's extract_plain_text, fixed (docs/pipeline.md, "HTML extraction"):
# main_content is the one setting (extract.html_main_content); the others are not configurable
# because every one of them changes the text, hence the dataset. The rest (post_meta,
# hidden_elements in resiliparse 2.x) are resiliparse's defaults.
EXTRACT_OPTIONS = {
    "preserve_formatting": True,  # keep paragraphs and line breaks (block elements end lines), not one long line
    "alt_texts": False,  # no <img alt> / <area alt> texts: captions out of context, often file names
    "links": False,  # no link targets after anchor texts (resiliparse's default)
    "form_fields": False,  # no text of <input>/<textarea>/<select> fields (resiliparse's default)
    "noscript": False,  # no <noscript> fallbacks ("enable JavaScript"; resiliparse's default)
    "list_bullets": True,  # list items start with a bullet, as rendered (resiliparse's default)
    "comments": True,  # with main_content, comment sections count as main content and stay (resiliparse's default)
    "skip_elements": None,  # resiliparse's own list of elements never extracted (script, style, ...)
}


def extract_text(html: str, main_content: bool = True) -> str:
    """Text of an HTML document already decoded to ``str``."""
    from resiliparse.extract.html2text import extract_plain_text

    return extract_plain_text(html, main_content=main_content, **EXTRACT_OPTIONS)


def html_str_to_text(html: str, main_content: bool = True) -> str:
    """A jsonl/parquet field that holds HTML (``text_format: html``): the same extractor and settings as WARC pages."""
    try:
        return extract_text(html, main_content)
    except Exception as e:  # resiliparse raises plain exceptions on input it cannot parse
        raise HtmlError("invalid_html", f"{type(e).__name__}: {e}") from None


def html_to_text(body: bytes, charset: str | None, main_content: bool = True) -> str:
    """The page's text. The charset from the HTTP header wins, and must fit: a body that does not
    decode in its declared charset (UTF-8 that is really latin-1) raises ``charset_mismatch``
    rather than being decoded with a guessed fallback, since the text could be silently wrong.
    Without a charset (or an unknown one) it is detected."""
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    html = None
    if charset:
        try:
            html = bytes_to_str(body, charset, fallback_encodings=[], errors="strict")
        except UnicodeDecodeError as e:
            raise HtmlError("charset_mismatch", f"declared charset {charset!r} does not decode the body: {e}") from None
        except LookupError:  # a label Python does not know: not proof of a wrong page, detect instead
            pass
    try:
        if html is None:
            html = bytes_to_str(body, detect_encoding(body))
        return extract_text(html, main_content)
    except Exception as e:  # resiliparse raises plain exceptions on undecodable input
        raise HtmlError("invalid_html", f"{type(e).__name__}: {e}") from None
