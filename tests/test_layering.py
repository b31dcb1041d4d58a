"""One import name, one way: every part is `gristmill.<part>`; loader/ and trainer/ never import
pipeline/ or the reports; manifests/ imports no other part; no part imports the CLI; the pipeline
calls the reports (gristmill.report) only lazily, from inside a function."""
import ast
import os
import pathlib
import shutil
import subprocess
import sys
import venv

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PARTS = ("manifests", "pipeline", "loader", "trainer", "audit")
FORBIDDEN = {
    "manifests": {"pipeline", "loader", "trainer", "audit", "cli", "demo", "report"},
    "loader": {"pipeline", "trainer", "audit", "cli", "demo", "report"},
    "trainer": {"pipeline", "audit", "cli", "demo", "report"},
    "pipeline": {"loader", "trainer", "audit", "cli", "demo", "report"},
    "audit": {"cli", "demo", "report"},
    "gristmill/report": {"cli", "demo"},  # reads every part's files, like the CLI; no part imports it at load time
}
# (package, part) imports allowed only inside a function: prepare writes report.html at its end,
# and the report module (which reads the pipeline's files) is loaded only then.
LAZY_ONLY = {("pipeline", "report")}


def _imports(path: pathlib.Path, *, module_level: bool = False) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    nested = set()
    if module_level:  # every import under a def is not module level
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                nested |= {id(n) for n in ast.walk(fn)}
    for node in ast.walk(tree):
        if id(node) in nested:
            continue
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _python_files(*dirs: str) -> list[pathlib.Path]:
    return [f for d in dirs for f in (ROOT / d).rglob("*.py")]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_respects_the_one_way_data_flow(package):
    files = _python_files(package)
    assert files, f"{package}/ has no Python files"
    bad = {}
    lazy = {part for pkg, part in LAZY_ONLY if pkg == package}
    for f in files:
        parts = {name.split(".")[1] for name in _imports(f) if name.startswith("gristmill.") and name.count(".") >= 1}
        top = {name.split(".")[1] for name in _imports(f, module_level=True)
               if name.startswith("gristmill.") and name.count(".") >= 1}
        if hits := sorted((parts - lazy) & FORBIDDEN[package] | top & FORBIDDEN[package]):
            bad[str(f.relative_to(ROOT))] = hits
    assert bad == {}


def test_the_pipeline_never_imports_the_reports():
    """The prepare command writes the data card after the pipeline's prepare(job) returns; no
    pipeline module imports gristmill.report, not even inside a function."""
    assert [f.name for f in _python_files("pipeline") if any(n.startswith("gristmill.report") for n in _imports(f))] == []


def test_nothing_imports_a_part_by_its_bare_name():
    """`import pipeline` would load a second copy of the module (or a user's own pipeline.py)."""
    files = _python_files("gristmill", *PARTS, "tests", "benchmarks")
    bad = {str(f.relative_to(ROOT)): n for f in files for n in _imports(f) if n.split(".")[0] in PARTS}
    assert bad == {}


@pytest.mark.slow
def test_built_wheel_installs_only_the_gristmill_import_name(tmp_path):
    """From a fresh virtual environment outside the repository, with the built wheel installed:
    `gristmill.loader` imports and none of the five generic names does."""
    wheels = tmp_path / "wheels"
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources it builds.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "demo-out", "bench-out", "*.egg-info",
                                                             "__pycache__", "runs"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
                   check=True, capture_output=True)
    (wheel,) = wheels.glob("gristmill-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    deps = next(p for p in sys.path if p.endswith("site-packages"))  # torch, numpy, ...: the wheel's dependencies
    python = env_dir / "bin" / "python"
    probe = ("import importlib, gristmill, gristmill.loader, gristmill.manifests\n"
             "bad = []\n"
             "for name in ('pipeline', 'loader', 'trainer', 'manifests', 'audit'):\n"
             "    try:\n        importlib.import_module(name)\n        bad.append(name)\n"
             "    except ImportError:\n        pass\n"
             "assert gristmill.loader.__file__.startswith(%r), gristmill.loader.__file__\n"
             "print('bare names importable:', bad)\n" % str(target))
    # A .pth-free PYTHONPATH: the dependencies' folder is a plain path entry, so the repo's
    # editable-install hook in it is never run and only the wheel provides `gristmill`.
    out = subprocess.run([str(python), "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "PYTHONPATH": f"{target}{os.pathsep}{deps}"})
    assert out.returncode == 0, out.stderr
    assert "bare names importable: []" in out.stdout
