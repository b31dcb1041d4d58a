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


def html_to_text(body: bytes, charset: str | None, main_content: bool = True) -> str:
    """The page's text. The charset from the HTTP header wins, and must fit: a body that does not
    decode in its declared charset (UTF-8 that is really latin-1) raises ``charset_mismatch``
    rather than being decoded with a guessed fallback, since the text could be silently wrong.
    Without a charset (or an unknown one) it is detected."""
    from resiliparse.extract.html2text import extract_plain_text
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
        return extract_plain_text(html, main_content=main_content, preserve_formatting=True, alt_texts=False)
    except Exception as e:  # resiliparse raises plain exceptions on undecodable input
        raise HtmlError("invalid_html", f"{type(e).__name__}: {e}") from None
