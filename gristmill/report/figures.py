"""Figures drawn by matplotlib (Agg, no display) to SVG text for inline embedding.

Why matplotlib: it is the maintained, ubiquitous plotting library of the Python data stack;
its SVG backend writes a static vector figure with no JavaScript runtime, so a page stays one
file that opens offline in any browser and prints as it shows. (Vega-Lite through altair needs
its JavaScript library inlined into each page, about 1 MB, and draws only when scripts run.)
Text stays text in the SVG (``svg.fonttype: none``) and ids are salted with a constant, so the
same numbers give the same bytes.
"""
from __future__ import annotations

import io
import re

import matplotlib

matplotlib.use("Agg", force=True)  # never a GUI backend, whatever the environment says
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

STYLE = {"svg.fonttype": "none", "svg.hashsalt": "gristmill", "font.size": 9, "axes.spines.top": False,
         "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3, "figure.dpi": 100}
COLORS = ["#3b6ea8", "#e0823d", "#4c9a5b", "#c44e52", "#8172b2", "#937860", "#da8bc3", "#8c8c8c"]
_HEADER = re.compile(r"^.*?(?=<svg)", re.S)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    # Inline in HTML: no XML prolog or doctype; no RDF metadata block (it names outside URIs).
    return _METADATA.sub("", _HEADER.sub("", buf.getvalue(), count=1), count=1)


def _fig(width: float = 7.0, height: float = 3.0):
    with plt.rc_context(STYLE):
        return plt.subplots(figsize=(width, height))


def bars(labels: list[str], series: dict[str, list[float]], *, xlabel: str = "", log: bool = False,
         horizontal: bool = True) -> str:
    """Grouped bars: one group per label, one bar per series."""
    with plt.rc_context(STYLE):
        n = max(1, len(labels))
        fig, ax = plt.subplots(figsize=(7.0, max(1.6, 0.28 * n * max(1, len(series)) ** 0.5 + 0.8)) if horizontal
                               else (7.0, 3.0))
        width = 0.8 / max(1, len(series))
        pos = np.arange(len(labels))
        for i, (name, values) in enumerate(series.items()):
            at = pos - 0.4 + width * (i + 0.5)
            if horizontal:
                ax.barh(at, values, height=width, label=name, color=COLORS[i % len(COLORS)])
            else:
                ax.bar(at, values, width=width, label=name, color=COLORS[i % len(COLORS)])
        if horizontal:
            ax.set_yticks(pos, labels)
            ax.invert_yaxis()
            ax.set_xlabel(xlabel)
            if log:
                ax.set_xscale("log")
        else:
            ax.set_xticks(pos, labels, rotation=30 if max(map(len, labels or [""])) > 6 else 0, ha="right")
            ax.set_ylabel(xlabel)
            if log:
                ax.set_yscale("log")
        if len(series) > 1:  # below the axes: never over a bar
            ax.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.22 if not horizontal else -0.12),
                      ncol=len(series))
        return _svg(fig)


def histogram(series: dict[str, np.ndarray], *, edges: np.ndarray, xlabel: str, log_x: bool = False,
              vline: float | None = None, vlabel: str = "") -> str:
    """Overlaid filled step histograms of counts already binned on ``edges`` (gristmill.report.hist)."""
    fig, ax = _fig()
    with plt.rc_context(STYLE):
        for i, (name, counts) in enumerate(series.items()):
            ax.stairs(counts, edges, fill=True, alpha=0.45, label=f"{name} ({int(np.sum(counts)):,})",
                      color=COLORS[i % len(COLORS)])
        if log_x:
            ax.set_xscale("log")
        if vline is not None:
            ax.axvline(vline, color="#c44e52", linestyle="--", label=vlabel)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("documents")
        ax.legend(frameon=False)
        return _svg(fig)


def lines(series: dict[str, tuple[list[float], list[float]]], *, xlabel: str, ylabel: str, markers: bool = False,
          log_y: bool = False) -> str:
    fig, ax = _fig()
    with plt.rc_context(STYLE):
        for i, (name, (x, y)) in enumerate(series.items()):
            ax.plot(x, y, marker="o" if markers else None, markersize=3, label=name, color=COLORS[i % len(COLORS)])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if log_y:
            ax.set_yscale("log")
        if len(series) > 1:
            ax.legend(frameon=False, fontsize=8, ncol=min(4, len(series)))
        return _svg(fig)


def lsh_curve(bands: int, rows: int, threshold: float) -> str:
    """P(candidate) = 1 - (1 - s^r)^b against Jaccard s; the area left of the threshold under the
    curve is the false-positive integral, the area right of it above the curve the false-negative one."""
    s = np.linspace(0, 1, 401)
    p = 1 - (1 - s ** rows) ** bands
    fig, ax = _fig(7.0, 3.2)
    with plt.rc_context(STYLE):
        ax.plot(s, p, color=COLORS[0], label=f"P(candidate), b={bands}, r={rows}")
        left, right = s <= threshold, s >= threshold
        ax.fill_between(s[left], 0, p[left], color=COLORS[3], alpha=0.3, label="false-positive area")
        ax.fill_between(s[right], p[right], 1, color=COLORS[1], alpha=0.3, label="false-negative area")
        ax.axvline(threshold, color="#333", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
        ax.set_xlabel("Jaccard similarity of two documents")
        ax.set_ylabel("probability of being a candidate pair")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.legend(frameon=False, loc="upper left")
        return _svg(fig)
