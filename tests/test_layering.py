"""The data path flows one way: loader/ and trainer/ never import pipeline/; manifests/ imports no other part."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "manifests": {"pipeline", "loader", "trainer", "audit", "gristmill"},
    "loader": {"pipeline", "trainer", "audit"},
    "trainer": {"pipeline", "audit"},
}


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_respects_the_one_way_data_flow(package):
    files = list((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no Python files"
    bad = {str(f.relative_to(ROOT)): sorted(_imports(f) & FORBIDDEN[package]) for f in files}
    assert {k: v for k, v in bad.items() if v} == {}
