"""HTML to text with resiliparse.

Why resiliparse: it is maintained (ChatNoir, used by DCLM and FineWeb-2 tooling), its parser
and extractor are C++ (an order of magnitude faster than trafilatura's lxml + Python
heuristics, which matters when extraction is the widest stage), its ``main_content`` mode drops
navigation and boilerplate, and it detects encodings itself. Output is deterministic.
"""
from __future__ import annotations


def html_to_text(body: bytes, charset: str | None, main_content: bool = True) -> tuple[str, str | None]:
    """(text, None) or ("", error). The charset from the HTTP header wins; else it is detected."""
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    try:
        html = bytes_to_str(body, charset or detect_encoding(body))
        return extract_plain_text(html, main_content=main_content, preserve_formatting=True, alt_texts=False), None
    except Exception as e:  # resiliparse raises plain exceptions on undecodable input
        return "", f"{type(e).__name__}: {e}"
