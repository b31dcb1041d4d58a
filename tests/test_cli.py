"""The CLI's error contract: a GristmillError is one line and exit 2 (with its traceback under
-v); any other exception is a bug and keeps its whole traceback."""
import pytest

from gristmill import cli
from gristmill.errors import ConfigError, GristmillError


def _raising(monkeypatch, exc):
    def handler(args):
        raise exc

    real = cli.build_parser

    def parser():
        p = real()
        parse = p.parse_args

        def parse_args(argv=None):
            args = parse(argv)
            args.handler = handler  # the real command, its handler swapped for one that raises
            return args

        p.parse_args = parse_args
        return p

    monkeypatch.setattr(cli, "build_parser", parser)


def test_a_gristmill_error_is_one_line_and_exit_2(monkeypatch, capsys):
    _raising(monkeypatch, ConfigError("job.yaml: pack.seq_len: expected an integer >= 1, got 0"))
    assert cli.main(["manifest", "list", "/nowhere"]) == 2
    err = capsys.readouterr().err
    assert err == "gristmill manifest: error: job.yaml: pack.seq_len: expected an integer >= 1, got 0\n"


def test_verbose_adds_the_traceback(monkeypatch, capsys):
    _raising(monkeypatch, ConfigError("bad"))
    assert cli.main(["-v", "manifest", "list", "/nowhere"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.rstrip().endswith("gristmill manifest: error: bad")


@pytest.mark.parametrize("exc", [FileNotFoundError("/some/file"), KeyError("x"), RuntimeError("boom")])
def test_an_unexpected_exception_is_never_reduced_to_one_line(monkeypatch, exc):
    _raising(monkeypatch, exc)
    with pytest.raises(type(exc)):
        cli.main(["manifest", "list", "/nowhere"])


def test_a_real_missing_dataset_is_a_manifest_error_line(tmp_path, capsys):
    assert cli.main(["manifest", "show", str(tmp_path / "store" / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gristmill manifest: error: ") and err.count("\n") == 1


def test_prepare_writes_the_data_card_from_the_run_result(toy_dataset, tmp_path, monkeypatch, capsys):
    """The prepare command, not the pipeline, draws report.html, once: from the RunResult's URL
    (its hash pinned) into its run dir. The page itself is test_report.py's (and the browser
    test's, end to end); here the drawing is recorded, not done."""
    import gristmill.report
    from gristmill.cli.prepare import write_data_card
    from gristmill.pipeline.executor import RunResult

    calls = []

    def draw(published, run_dir, work_dir_options=None):
        calls.append((published.url, published.manifest.sha256, run_dir))
        return f"{run_dir}/report.html"

    monkeypatch.setattr(gristmill.report, "write_dataset_report", draw)
    m = toy_dataset.manifest
    assert write_data_card(RunResult(m.sha256, toy_dataset.url, m.version, {}, str(tmp_path))) == f"{tmp_path}/report.html"
    assert calls == [(toy_dataset.url, m.sha256, str(tmp_path))]
    assert capsys.readouterr().err == f"[report] {tmp_path}/report.html\n"
    with pytest.raises(GristmillError):  # the page is of the version prepare published, nothing else
        write_data_card(RunResult("0" * 64, toy_dataset.url, m.version, {}, str(tmp_path)), quiet=True)
    assert len(calls) == 1


def test_every_command_has_its_module_and_its_readme_row():
    """gristmill/cli/<command>.py for each command (README's table and --help agree with the code)."""
    import os
    import re

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    registered = set(cli.build_parser()._subparsers._group_actions[0].choices)
    modules = {m.__name__.rsplit(".", 1)[1] for m in cli.COMMANDS}
    on_disk = {f[:-3] for f in os.listdir(os.path.join(root, "gristmill", "cli")) if f.endswith(".py")} - {"__init__", "__main__", "common"}
    assert modules == on_disk
    assert {m.replace("_", "-").replace("inspection", "inspect") for m in modules} == registered
    with open(os.path.join(root, "README.md")) as f:
        readme = set(re.findall(r"^\| `gristmill ([a-z-]+)", f.read(), flags=re.M))
    assert readme == registered


@pytest.mark.slow
def test_ctrl_c_during_prepare_is_one_line_exit_130_and_the_same_command_resumes(tmp_path):
    """SIGINT in the middle of a prepare: Ray is shut down, stderr says how to resume (no
    traceback), exit 130; the same command then finishes, skipping the tasks committed before."""
    import glob
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml
    from helpers import demo_job_dict, sigint_as_a_terminal_sends_it

    from gristmill.pipeline.demo_corpus import write_demo_corpus

    write_demo_corpus(str(tmp_path / "demo"))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(demo_job_dict(tmp_path / "demo", tmp_path)))
    cmd = [sys.executable, "-m", "gristmill", "prepare", str(job)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_a_terminal_sends_it)
    deadline = time.monotonic() + 180  # a hang guard, not a timing assertion
    while not glob.glob(str(tmp_path / "work" / "*" / "_done" / "extract" / "*.json")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    with open(f"/proc/{proc.pid}/status") as f:  # how the driver handles SIGINT (bit 1): a diagnosis if it ignores it
        masks = {k: int(v, 16) >> 1 & 1 for k, v in (line.split(":\t") for line in f) if k in ("SigIgn", "SigCgt")}
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, f"SIGINT ignored: {masks['SigIgn']}, caught: {masks['SigCgt']}\n{err[-3000:]}"
    assert "the same command resumes" in err and "Traceback" not in err, err[-3000:]
    assert not (tmp_path / "store" / "demo").exists()  # nothing published
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (report,) = glob.glob(str(tmp_path / "work" / "*" / "report.json"))
    (extract,) = [s for s in json.load(open(report))["stages"] if s["stage"] == "extract"]
    assert extract["resumed_parts"] >= 1
