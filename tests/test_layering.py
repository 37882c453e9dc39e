"""Dependencies point one way (docs/design.md §2): experiments → sim, hil → planner → quant → native."""
from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO

# package -> packages it must never import
FORBIDDEN = {
    "native": {"quant", "planner", "sim", "hil", "experiments"},
    "quant": {"planner", "sim", "hil", "experiments"},
    "planner": {"sim", "hil", "experiments"},
    "sim": {"hil", "experiments"},
    "hil": {"experiments"},
}


def _imports(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]


@pytest.mark.parametrize("pkg", sorted(FORBIDDEN))
def test_no_upward_imports(pkg):
    bad = [(str(p.relative_to(REPO)), m) for p in (REPO / pkg).rglob("*.py") for m in _imports(p)
           if m in FORBIDDEN[pkg]]
    assert not bad, f"{pkg}/ imports upward: {bad}"
