"""The page model every report is built of, and its two renderings.

A ``Page`` is sections of figures, tables, notes and small HTML blocks. A ``Figure`` holds a
``draw`` callable (matplotlib, run only when the page is rendered as HTML) and the table of
the numbers it draws, so the same page renders without the ``report`` extra as plain-text
tables: nothing is computed twice and the builders never import matplotlib.

HTML: one self-contained file (inline CSS, figures as inline SVG, no script, nothing fetched),
templated with jinja2 (autoescaped; only the SVG and the builders' escaped HTML blocks are
marked safe).
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Callable, Union

from gristmill.manifests.storage import atomic_write

EXTRA_HINT = "pip install 'gristmill[report]'"
FOLD_ROWS = 12


@dataclass
class Table:
    headers: list[str]
    rows: list[list]
    caption: str = ""


@dataclass
class Figure:
    name: str  # stable id: the page's <figure data-figure="name">
    title: str
    draw: Callable[[], str]  # -> SVG text (gristmill.report.figures)
    table: Table  # the numbers drawn: the plain-text fallback and the page's table under the figure
    caption: str = ""


@dataclass
class Note:
    text: str
    missing: bool = False  # True: data this figure needs is not in this run (styled as a warning)


@dataclass
class Html:
    """A block the builder made with html.escape (e.g. a side-by-side diff); ``text`` is its plain form."""
    html: str
    text: str


Item = Union[Figure, Table, Note, Html]


@dataclass
class Section:
    id: str
    title: str
    items: list[Item] = field(default_factory=list)

    def add(self, *items: Item) -> "Section":
        self.items.extend(items)
        return self


@dataclass
class Page:
    title: str
    subtitle: str
    totals: list[tuple[str, str, object]]  # (key, label, value): shown first, each with data-total=key; None: not shown
    sections: list[Section] = field(default_factory=list)

    def section(self, id: str, title: str) -> Section:
        s = Section(id, title)
        self.sections.append(s)
        return s

    def figures(self) -> list[Figure]:
        return [i for s in self.sections for i in s.items if isinstance(i, Figure)]


def plot():
    """``gristmill.report.figures`` (matplotlib), imported when a figure is drawn, never before."""
    from . import figures

    return figures


def fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e6 else f"{v:,.0f}"
    return str(v)


# -- plain text -------------------------------------------------------------------------------
def text_table(t: Table) -> str:
    cells = [[str(h) for h in t.headers]] + [[fmt(c) for c in r] for r in t.rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(t.headers))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(([t.caption] if t.caption else []) + lines)


def render_text(page: Page) -> str:
    out = [page.title, page.subtitle, ""]
    out += [f"{label}: {fmt(value)}" for _, label, value in page.totals if value is not None]
    for s in page.sections:
        out += ["", f"== {s.title}"]
        for it in s.items:
            if isinstance(it, Figure):
                out += ["", f"[{it.title}]", text_table(it.table)]
            elif isinstance(it, Table):
                out += ["", text_table(it)]
            elif isinstance(it, Note):
                out += [("NOTE: " if it.missing else "") + it.text]
            else:
                out += [it.text]
    return "\n".join(out) + "\n"


# -- HTML ---------------------------------------------------------------------------------------
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"DejaVu Sans",sans-serif;margin:0;color:#1d2430;background:#f6f7f9}
header{background:#1d2430;color:#fff;padding:18px 28px}header h1{margin:0;font-size:22px}header p{margin:4px 0 0;color:#c6ccd6}
nav{padding:8px 28px;background:#e8ebf0;font-size:13px}nav a{margin-right:14px;color:#24426e;text-decoration:none}
main{padding:8px 28px 40px;max-width:1180px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;margin:16px 0;padding:6px 18px 14px}
h2{font-size:17px;border-bottom:1px solid #eceff3;padding-bottom:6px}
.totals{display:flex;flex-wrap:wrap;gap:10px;margin:16px 0}
.total{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:8px 14px;min-width:120px}
.total b{display:block;font-size:18px;word-break:break-all}.total span{color:#5b6574;font-size:12px}
figure{display:inline-block;vertical-align:top;width:calc(50% - 20px);margin:10px 12px 16px 0}
figure svg{width:100%;height:auto}figcaption{color:#5b6574;font-size:12px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:12.5px}th,td{border-bottom:1px solid #eceff3;padding:3px 10px;text-align:right;vertical-align:top}
th:first-child,td:first-child{text-align:left}th{background:#f0f2f5}
details summary{cursor:pointer;color:#24426e;font-size:12.5px}
.note{color:#3b4452}.missing{background:#fff6e0;border-left:3px solid #e0a800;padding:6px 10px}
code,pre{font:12px/1.4 "DejaVu Sans Mono",monospace;background:#f0f2f5;padding:1px 4px}pre{padding:8px;overflow-x:auto}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:10px;margin:8px 0 14px}.pair>div{border:1px solid #dde1e7;padding:6px 8px;
font-size:12px;white-space:pre-wrap;word-wrap:break-word;max-height:200px;overflow:auto}.pair h4{margin:0 0 4px;font-size:12px;color:#5b6574}
del{background:#ffd7d5;text-decoration:none}ins{background:#ccf0d4;text-decoration:none}mark{background:#ffe98a}
.chain{display:flex;align-items:center;gap:8px;flex-wrap:wrap}.chain div{border:1px solid #b9c2cf;border-radius:5px;padding:6px 10px;background:#f8fafc}
"""

TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{{ page.title }}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{{ css }}</style></head>
<body><header><h1>{{ page.title }}</h1><p>{{ page.subtitle }}</p></header>
<nav>{% for s in page.sections %}<a href="#{{ s.id }}">{{ s.title }}</a>{% endfor %}</nav>
<main><div class="totals">{% for key, label, value in page.totals if value is not none %}
<div class="total"><b data-total="{{ key }}" data-value="{{ value }}">{{ fmt(value) }}</b><span>{{ label }}</span></div>{% endfor %}</div>
{% for s in page.sections %}<section id="{{ s.id }}"><h2>{{ s.title }}</h2>
{% for it in s.items %}{% if it.kind == "figure" %}<figure data-figure="{{ it.obj.name }}">{{ it.svg }}
<figcaption>{{ it.obj.title }}{% if it.obj.caption %}: {{ it.obj.caption }}{% endif %}</figcaption>
<details><summary>numbers</summary>{{ table(it.obj.table) }}</details></figure>
{% elif it.kind == "table" %}{{ table(it.obj) }}
{% elif it.kind == "note" %}<p class="{{ 'missing' if it.obj.missing else 'note' }}">{{ it.obj.text }}</p>
{% else %}{{ it.html }}{% endif %}{% endfor %}</section>
{% endfor %}</main></body></html>
"""


def _html_table(t: Table):
    from markupsafe import Markup

    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in t.headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(c))}</td>" for c in r) + "</tr>" for r in t.rows)
    cap = f"<caption>{html.escape(t.caption)}</caption>" if t.caption else ""
    out = f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    if len(t.rows) > FOLD_ROWS:  # a long table folds; the page stays a page
        out = f"<details><summary>{len(t.rows):,} rows{': ' + html.escape(t.caption) if t.caption else ''}</summary>{out}</details>"
    return Markup(out)


def render_html(page: Page) -> str:
    """The page as one HTML file; ImportError when jinja2 or matplotlib is missing."""
    import jinja2
    from markupsafe import Markup

    from . import figures  # noqa: F401  (matplotlib: fail before any work when it is missing)

    items = {}
    for s in page.sections:
        for it in s.items:
            if isinstance(it, Figure):
                items[id(it)] = {"kind": "figure", "obj": it, "svg": Markup(it.draw())}
            elif isinstance(it, Table):
                items[id(it)] = {"kind": "table", "obj": it}
            elif isinstance(it, Note):
                items[id(it)] = {"kind": "note", "obj": it}
            else:
                items[id(it)] = {"kind": "html", "html": Markup(it.html)}
    view = Page(page.title, page.subtitle, page.totals,
                [Section(s.id, s.title, [items[id(it)] for it in s.items]) for s in page.sections])
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(TEMPLATE).render(page=view, css=Markup(CSS), fmt=fmt, table=_html_table)


def render_fallback_html(page: Page, missing: str) -> str:
    """Without the ``report`` extra: the same page as plain-text tables in a <pre>, still one file."""
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(page.title)}</title></head>"
            f"<body><p>Figures need the optional extra ({html.escape(missing)} is not installed): "
            f"<code>{html.escape(EXTRA_HINT)}</code>. The numbers:</p>\n<pre>{html.escape(render_text(page))}</pre></body></html>\n")


def render(page: Page) -> tuple[str, bool]:
    """(HTML, True) with figures, or (plain-text HTML, False) when the extra is not installed."""
    try:
        return render_html(page), True
    except ImportError as e:
        return render_fallback_html(page, e.name or str(e)), False


def write_page(page: Page, path: str, store=None) -> bool:
    """Write the page atomically (through ``store``, a ``manifests.storage.Store``: None, the path's
    with no options); True when it has figures (the extra is installed)."""
    text, full = render(page)
    atomic_write(path, text.encode(), store)  # a local one makes the folders on the way
    return full
