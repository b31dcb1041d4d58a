"""The house's rules, read from the source (imports at any depth, lazy ones included, and Python code
held in strings, e.g. a ``python -c`` probe):

* every part is `gristmill.<part>` (folder ``X/`` is ``gristmill.X``: the package-dir mapping of
  pyproject.toml, which this test reads, so no import is resolved by folder guesswork);
* the data flows one way: loader/ and trainer/ never import pipeline/, manifests/ imports no other part;
* the parts are libraries: none imports argparse or the application layer (`gristmill.cli`), and
  none imports the reports (`gristmill.report`), which only the commands that write a page load;
* no import cycle between modules, lazy (function-level) imports included;
* nothing imports a part by a bare name (`import pipeline`);
* a stage folder (pipeline/stages/<stage>/) stands alone: it imports no other stage's folder; what
  stages share (file formats, sections, what one hands the next) lives at the pipeline level;
* nothing but the storage module (manifests/storage.py) looks inside a URL: no ``"://" in path``,
  ``split("://")`` or ``startswith("file://")`` elsewhere; callers ask a ``Store`` or the module's
  ``is_url`` / ``split_url`` / ``local_path`` (one argued exception: the leaf gristmill/config.py's ``_is_url``);
* nothing but the storage module imports fsspec or a filesystem library (s3fs, gcsfs, adlfs,
  pyarrow.fs), lazily or not: storage is reached through ``Store.from_url``, with the owner's options;
* ``gristmill serve`` starts without torch: nothing its modules import when imported (module level, at
  any depth) imports torch; torch is imported inside the functions that make tensors (loader/tensors.py).
"""
import ast
import functools
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib
import venv

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PARTS = ("manifests", "pipeline", "loader", "trainer", "audit")
LEAVES = ("gristmill/errors.py", "gristmill/config.py", "gristmill/jit.py")  # any part may import them
APP = ("gristmill/cli", "gristmill/report", "gristmill/demo.py", "gristmill/__main__.py")
# gristmill.<X> a part must not import (at any depth), besides the application layer (cli, demo) and report
FORBIDDEN = {
    "manifests": {"pipeline", "loader", "trainer", "audit"},
    "loader": {"pipeline", "trainer", "audit"},
    "trainer": {"pipeline", "audit"},
    "pipeline": {"loader", "trainer", "audit"},
    "audit": set(),
}
APPLICATION = {"cli", "demo", "report"}
# Python's `-m` needs a part's launcher inside the part: `python -m gristmill.trainer` hands over to
# the `gristmill train` command. Nothing imports a launcher (checked below), so it adds no edge to the house.
LAUNCHERS = {"trainer/__main__.py": "gristmill.cli.train"}
# what `python -m gristmill serve` imports before it serves: torch-free at module level (a server image without torch)
TORCH_FREE = ("gristmill.__main__", "gristmill.cli.serve", "gristmill.loader.service.server")
# the commands that draw a page (report, and prepare's data card); the reports are imported nowhere else
REPORT_USERS = {"gristmill/cli/report.py", "gristmill/cli/prepare.py"}


@functools.cache
def _package_dirs() -> dict[str, str]:
    """folder -> import name, from pyproject.toml's [tool.setuptools.package-dir]."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {folder: name for name, folder in mapping.items()}


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT)
    rest = [*rel.parts[1:-1], rel.stem]
    if rest[-1] == "__init__":
        rest = rest[:-1]
    return ".".join([_package_dirs()[rel.parts[0]], *rest])


@functools.cache
def _known_modules() -> frozenset[str]:
    return frozenset(module_name(f) for f in _gristmill_files())


def _is_package(path: pathlib.Path) -> bool:
    return path.name == "__init__.py"


@functools.cache
def _trees(path: pathlib.Path) -> list[ast.AST]:
    """The file's syntax tree and that of every string constant in it that is Python code with an import."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = [tree]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import " in node.value:
            try:
                out.append(ast.parse(node.value))
            except SyntaxError:
                pass  # prose, not code
    return out


def _walk(tree: ast.AST, into_functions: bool):
    """``ast.walk``, or without the bodies of functions (what runs when the module is imported)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        todo += [c for c in ast.iter_child_nodes(node)
                 if into_functions or not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]


@functools.cache
def imports(path: pathlib.Path, module_level: bool = False) -> list[str]:
    """Every module the file imports, at module level or inside a function, or in code held in a
    string; relative imports resolved, and ``from P import m`` also names ``P.m`` (gristmill's when it is
    a submodule; any other package's always: ``from pyarrow import fs`` names ``pyarrow.fs``);
    ``importlib.import_module("x")`` and ``__import__("x")`` with a constant name count too.
    ``module_level``: only what importing the file imports (no function bodies, no strings)."""
    me = module_name(path) if path.is_relative_to(ROOT) and path.parts[len(ROOT.parts)] in _package_dirs() else None
    package = me if me and _is_package(path) else (me.rpartition(".")[0] if me else None)
    names = []
    for tree in _trees(path)[:1] if module_level else _trees(path):
        for node in _walk(tree, not module_level):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    if package is None:
                        continue
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module
                if mod.split(".")[0] != "gristmill":  # another package's: m may be a submodule (pyarrow.fs)
                    names += [mod, *(f"{mod}.{a.name}" for a in node.names)]
                    continue
                # `from P import m` imports the module P.m when there is one; otherwise names in P
                subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in _known_modules()]
                names += subs if len(subs) == len(node.names) else [mod, *subs]
            elif name := _dynamic_import(node):
                names.append(name)
    return names


def _dynamic_import(node: ast.AST) -> str | None:
    """The module ``importlib.import_module("x")`` or ``__import__("x")`` names, when it is a constant
    absolute name (a relative or computed one, as the loader's lazy exports, is left to the other rules)."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str) and not node.args[0].value.startswith(".")):
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return node.args[0].value if called in ("import_module", "__import__") else None


def _python_files(*dirs: str) -> list[pathlib.Path]:
    out = []
    for d in dirs:
        p = ROOT / d
        out += [p] if p.suffix == ".py" else sorted(p.rglob("*.py"))
    return out


def _gristmill_files() -> list[pathlib.Path]:
    return _python_files("gristmill", *PARTS)


def _modules() -> dict[str, pathlib.Path]:
    return {module_name(f): f for f in _gristmill_files()}


def _part_of(name: str) -> str | None:
    """The second component of gristmill.X.y (X), if the name is gristmill's."""
    bits = name.split(".")
    return bits[1] if bits[0] == "gristmill" and len(bits) > 1 else None


# -- the rules ---------------------------------------------------------------------------------
@pytest.mark.parametrize("part", PARTS)
def test_each_part_is_a_library_on_the_one_way_data_path(part):
    """No part imports argparse, the application layer (cli, demo), the reports, or a part
    against the data flow, at any depth (a lazy import inside a function included)."""
    bad = {}
    for f in _python_files(part):
        rel = str(f.relative_to(ROOT))
        names = [n for n in imports(f) if n != LAUNCHERS.get(rel)]
        hits = sorted({n for n in names if n == "argparse" or n.startswith("argparse.")}
                      | {n for n in names if _part_of(n) in APPLICATION | FORBIDDEN[part]})
        if hits:
            bad[rel] = hits
    assert bad == {}


def test_a_launcher_only_hands_over_to_its_command_and_nothing_imports_it():
    for rel, command in LAUNCHERS.items():
        path = ROOT / rel
        code = [n for n in ast.parse(path.read_text()).body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        assert len(code) <= 3, f"{rel} holds more than the hand-over to {command}"
        assert command in imports(path) or any(n.startswith(command) for n in imports(path))
        launcher = module_name(path)
        users = [str(f.relative_to(ROOT)) for f in _python_files("gristmill", *PARTS, "tests", "benchmarks") if launcher in imports(f)]
        assert users == []


def test_the_leaves_import_nothing_of_gristmill_but_the_error_family():
    for rel in LEAVES:
        names = {n for n in imports(ROOT / rel) if n.startswith("gristmill")}
        assert names <= {"gristmill.errors", "gristmill.errors.GristmillError", "gristmill.errors.ConfigError",
                         "gristmill.errors.UsageError"}, (rel, names)


def test_only_the_commands_that_write_a_page_import_the_reports():
    users = {str(f.relative_to(ROOT)) for f in _python_files("gristmill", *PARTS)
             if not str(f.relative_to(ROOT)).startswith("gristmill/report/")
             and any(_part_of(n) == "report" for n in imports(f))}
    assert users == REPORT_USERS


def test_no_library_imports_the_application_layer():
    """gristmill.report (the pages) and the leaves are libraries of the commands too: no argparse, no cli."""
    for f in _python_files("gristmill/report", *LEAVES):
        hits = [n for n in imports(f) if n.split(".")[0] == "argparse" or _part_of(n) in {"cli", "demo"}]
        assert hits == [], f


def _prefixes(name: str) -> list[str]:
    bits = name.split(".")
    return [".".join(bits[:k]) for k in range(1, len(bits) + 1)]


def test_the_server_imports_no_torch_when_it_starts():
    """What `gristmill serve` imports when its modules are imported (module level, at any depth, the packages
    above each included) names no torch: the server runs on an image without it, RSS at start <= 150 MB
    (issue 41). The served run itself is tested without torch in test_service.py."""
    mods = _modules()
    todo, seen, hits = [p for m in TORCH_FREE for p in _prefixes(m)], set(), {}
    while todo:
        name = todo.pop()
        if name in seen or name not in mods:
            continue
        seen.add(name)
        for n in imports(mods[name], module_level=True):
            if n.split(".")[0] == "torch":
                hits.setdefault(name, []).append(n)
            todo += _prefixes(n)
    assert "gristmill.loader.loader" in seen and "gristmill.loader.documents" in seen  # the scan reached the loader
    assert hits == {}


def find_cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # recursion depth: the longest import chain (a few dozen)
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return cycles


def test_no_import_cycle_lazy_ones_included():
    """Over the module graph of every gristmill module (edges: every import at any depth).
    Importing a submodule loads its package first; that implicit edge is not an import the code
    makes, so a package's ``__init__`` re-exporting its submodules is no cycle."""
    modules = _modules()
    graph = {m: sorted({n for n in imports(f) if n in modules and n != m}) for m, f in modules.items()}
    assert find_cycles(graph) == []


@pytest.mark.parametrize("part", PARTS + ("gristmill/report",))
def test_inside_a_part_imports_are_relative(part):
    """`from .cache import ...`, not `from gristmill.loader.cache import ...`: the import then
    says it stays in the room, whatever tool reads it (docstrings and strings aside)."""
    name = _package_dirs().get(part) or "gristmill.report"
    bad = {}
    for f in _python_files(part):
        tree = ast.parse(f.read_text())
        hits = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level and n.module
                and (n.module == name or n.module.startswith(name + "."))]
        hits += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
                 if a.name == name or a.name.startswith(name + ".")]
        if hits:
            bad[str(f.relative_to(ROOT))] = hits
    assert bad == {}


def test_nothing_imports_a_part_by_its_bare_name():
    """`import pipeline` would load a second copy of the module (or a user's own pipeline.py); code
    in strings counts (a `python -c` probe run from the repository root would find the folder)."""
    files = _python_files("gristmill", *PARTS, "tests", "benchmarks")
    bad = {str(f.relative_to(ROOT)): n for f in files for n in imports(f) if n.split(".")[0] in PARTS}
    assert bad == {}


# -- the test's own eyes ------------------------------------------------------------------------
STAGES = "gristmill.pipeline.stages"


def stage_of(module: str) -> str | None:
    """The stage folder a module belongs to (``gristmill.pipeline.stages.<stage>...``), else None."""
    bits = module.split(".")
    return bits[3] if module.startswith(STAGES + ".") and len(bits) > 3 and bits[3] != "base" else None


def test_no_stage_folder_imports_another_stages_folder():
    crossing = []
    for f in _python_files("pipeline/stages"):
        mine = stage_of(module_name(f))
        if mine:  # (the registry, stages/__init__.py, lists every stage; base.py is what they all build on)
            crossing += [f"{f.relative_to(ROOT)} imports {m}" for m in imports(f) if stage_of(m) not in (None, mine)]
    assert crossing == []
    probe = ROOT / "pipeline" / "stages" / "pack" / "stage.py"
    assert stage_of(module_name(probe)) == "pack" and stage_of("gristmill.pipeline.stages.base") is None
    assert "gristmill.pipeline.handoffs" in imports(probe)  # the scanner resolves `from ...handoffs import`


def test_the_scanner_sees_lazy_imports_code_in_strings_and_cycles(tmp_path):
    """Each rule above could fail: the scanner finds an import inside a function, one in a string
    of code, a relative one, and a lazy cycle."""
    f = ROOT / "loader" / "order.py"
    assert module_name(f) == "gristmill.loader.order" and module_name(ROOT / "gristmill" / "report" / "page.py") == "gristmill.report.page"
    probe = tmp_path / "probe.py"
    probe.write_text('def f():\n    import argparse\n    from gristmill.cli import main\n'
                     'CODE = "from pipeline.ngrams import text_grams; print(1)"\n')
    found = imports(probe)
    assert {"argparse", "gristmill.cli", "pipeline.ngrams"} <= set(found)
    assert "gristmill.loader.cache" in imports(ROOT / "loader" / "loader.py")  # `from .cache import ...`, resolved
    assert find_cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert find_cycles({"a": ["b"], "b": [], "c": ["a", "b"]}) == []


def _package_folders() -> list[pathlib.Path]:
    """Every folder of the product that is a package: a part's or gristmill's, with an __init__.py."""
    return sorted(init.parent for top in [*PARTS, "gristmill"] for init in (ROOT / top).rglob("__init__.py")
                  if "__pycache__" not in init.parts)


def test_pyproject_lists_every_package_folder():
    """setuptools installs only the packages pyproject.toml names (the mapped folders rule out
    discovery): a subpackage missing there is missing from every wheel (gristmill.pipeline.stages was)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    on_disk = {module_name(folder / "__init__.py") for folder in _package_folders()}
    assert listed == on_disk, f"missing from pyproject.toml: {sorted(on_disk - listed)}; not a folder: {sorted(listed - on_disk)}"


def _every_module() -> list[str]:
    """Each importable module of the product (launchers, which run a command when imported, excepted)."""
    return sorted(module_name(f) for folder in _package_folders() for f in folder.glob("*.py") if f.stem != "__main__")


@pytest.mark.slow
def test_built_wheel_installs_only_the_gristmill_import_name(tmp_path):
    """From a fresh virtual environment outside the repository, with the built wheel installed:
    every module of the product imports from the wheel and none of the five generic names does."""
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
    probe = ("import importlib, gristmill, gristmill.loader, gristmill.manifests, gristmill.cli\n"
             "for module in %r:\n"
             "    importlib.import_module(module)\n"
             "bad = []\n"
             "for name in ('pipeline', 'loader', 'trainer', 'manifests', 'audit'):\n"
             "    try:\n        importlib.import_module(name)\n        bad.append(name)\n"
             "    except ImportError:\n        pass\n"
             "assert gristmill.loader.__file__.startswith(%r), gristmill.loader.__file__\n"
             "print('bare names importable:', bad)\n" % (_every_module(), str(target)))
    # A .pth-free PYTHONPATH: the dependencies' folder is a plain path entry, so the repo's
    # editable-install hook in it is never run and only the wheel provides `gristmill`.
    out = subprocess.run([str(python), "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "PYTHONPATH": f"{target}{os.pathsep}{deps}"})
    assert out.returncode == 0, out.stderr
    assert "bare names importable: []" in out.stdout


STORAGE = ROOT / "manifests" / "storage.py"


def url_checks(source: str) -> list[int]:
    """The lines of each string constant that reads a URL: ``"://"`` itself (``in``, ``split``,
    ``partition``) or a ``file://`` prefix. Pieces of an f-string that builds an address (a gRPC
    endpoint's ``{scheme}://{host}``) do not read one."""
    tree = ast.parse(source)
    built = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    return sorted(node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in built
            and (node.value == "://" or node.value.startswith("file://")))


CONFIG = ROOT / "gristmill" / "config.py"


def _function_lines(path: pathlib.Path, name: str) -> range:
    (fn,) = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef) and n.name == name]
    return range(fn.lineno, fn.end_lineno + 1)


def test_only_the_storage_module_looks_inside_a_url():
    """One argued exception: gristmill/config.py's ``_is_url``. The job file's paths are resolved by the leaf
    every part imports, which may import no part (nor fsspec); tests/test_config.py holds it to
    ``storage.is_url``'s answers."""
    allowed = _function_lines(CONFIG, "_is_url")
    found = [f"{f.relative_to(ROOT)}:{n}" for f in _gristmill_files() if f != STORAGE for n in url_checks(f.read_text())
             if not (f == CONFIG and n in allowed)]
    assert not found, f"URL checks outside manifests/storage.py (ask a Store, or storage.is_url/split_url): {found}"


def test_the_url_scan_sees_checks_and_lets_addresses_be_built():
    source = ('local = "://" not in p\nproto = u.split("://")[0]\nplain = u.removeprefix("file://")\n'
              'endpoint = f"{scheme}://{host}"\n"""A docstring may say s3://bucket/key."""\n')
    assert url_checks(source) == [1, 2, 3]


# fsspec and the filesystems beneath it: a module opening any of them reaches storage without the options
# its owner resolved (the serve catalog did), and past the commit protocol of manifests/storage.py.
FILESYSTEM_LIBRARIES = ("fsspec", "s3fs", "gcsfs", "adlfs", "pyarrow.fs")


def filesystem_imports(path: pathlib.Path) -> list[str]:
    """What of FILESYSTEM_LIBRARIES the file imports, at any depth (a lazy import in a function, code in
    a string, ``importlib.import_module``)."""
    return sorted({n for n in imports(path) for lib in FILESYSTEM_LIBRARIES if n == lib or n.startswith(lib + ".")})


def test_only_the_storage_module_opens_fsspec():
    """Storage is reached through manifests/storage.py (``Store.from_url``), with no module excepted: the
    serve catalog opened fsspec itself, so its stores could not be given options the way every other
    reader is; the shard fetcher, the readers and the job file did too. What they needed of fsspec is
    the storage module's (``Store.read``, ``sized_readline``, ``is_url``; the simulated remote of the
    tests and the loader bench, an fsspec filesystem, is defined there)."""
    found = {str(f.relative_to(ROOT)): hits for f in _gristmill_files() if f != STORAGE if (hits := filesystem_imports(f))}
    assert found == {}, f"fsspec opened outside manifests/storage.py (use Store.from_url): {found}"
    assert "fsspec.core" in filesystem_imports(STORAGE)  # the scan reads the module that does open it


def test_the_fsspec_scan_sees_every_way_in(tmp_path):
    """Each way a module could reach a filesystem library is seen: lazily in a function, ``from``, a
    submodule by ``from P import m``, code in a string, ``importlib.import_module`` and ``__import__``."""
    ways = {"def f():\n    import fsspec\n": ["fsspec"],
            "def f():\n    from fsspec.core import url_to_fs\n": ["fsspec.core", "fsspec.core.url_to_fs"],
            "from pyarrow import fs\n": ["pyarrow.fs"],
            "import s3fs as s\n": ["s3fs"],
            'CODE = "import gcsfs; print(1)"\n': ["gcsfs"],
            'import importlib\ndef f():\n    return importlib.import_module("fsspec.implementations.local")\n':
                ["fsspec.implementations.local"],
            'def f():\n    return __import__("adlfs")\n': ["adlfs"],
            "import fsspecial\nfrom pyarrow import parquet\n": []}
    for i, (code, want) in enumerate(ways.items()):
        probe = tmp_path / f"probe{i}.py"
        probe.write_text(code)
        assert filesystem_imports(probe) == want, code
