"""Progress lines: tasks done / total, documents and MB per second, an ETA; a bar redrawn in place
on a terminal, plain lines at most every `interval` seconds otherwise."""
import io

from gristmill.pipeline.progress import Progress


def test_plain_lines_show_tasks_rates_and_eta():
    out = io.StringIO()
    p = Progress(out, interval=0.0, tty=False)
    p.start("fuzzy_dedup.bands", 4, resumed=1)
    p.advance("fuzzy_dedup.bands", {"documents_in": 1000, "bytes_in": 2_000_000})
    p.finish("fuzzy_dedup.bands")
    lines = out.getvalue().splitlines()
    assert lines[0] == "[fuzzy_dedup.bands] 1 of 4 tasks already done"
    assert "2/4 tasks" in lines[1] and "docs/s" in lines[1] and "MB/s" in lines[1] and "ETA" in lines[1]
    assert "\r" not in out.getvalue()
    assert lines[-1].startswith("[fuzzy_dedup.bands] [##########..........] 2/4 tasks")


def test_plain_lines_are_throttled_and_a_terminal_redraws_one_line():
    out = io.StringIO()
    p = Progress(out, interval=3600.0, tty=False)
    p.start("tokenize", 3)
    for _ in range(3):
        p.advance("tokenize", {"documents_in": 1, "bytes_in": 1})
    assert out.getvalue() == ""  # within the interval: silent until the step ends
    p.finish("tokenize")
    assert out.getvalue().count("\n") == 1 and "3/3 tasks" in out.getvalue()
    tty = io.StringIO()
    p = Progress(tty, tty=True)
    p.start("pack", 2)
    p.advance("pack", {})
    p.finish("pack")
    assert tty.getvalue().count("\r\033[K") == 2 and tty.getvalue().endswith("\n")


def test_quiet_prints_nothing():
    out = io.StringIO()
    p = Progress(out, quiet=True, interval=0.0, tty=False)
    p.start("extract", 1)
    p.advance("extract", {"documents_in": 5})
    p.finish("extract")
    assert out.getvalue() == ""
