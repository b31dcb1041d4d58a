"""The CLI's error contract: a GristmillError is one line and exit 2 (with its traceback under
-v); any other exception is a bug and keeps its whole traceback."""
import pytest

from gristmill import cli
from gristmill.errors import ConfigError


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
