"""Dependencies point one way and form no cycle (docs/design.md §2): experiments → sim, hil → planner → quant → native.

Two checks over every import statement, the ones inside functions and under `if TYPE_CHECKING:` included (a deferred
import is still a dependency):
- `FORBIDDEN`: a package never imports a package above it, and `hil/` and `sim/` never import each other.
- the module-level import graph of all project packages has no cycle. A module depends on every module it names and on
  the `__init__` of every package it enters on the way; `from a import b` depends on `a.b` when `b` is a submodule.
"""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import networkx as nx
import pytest

from tests.conftest import REPO

PACKAGES = ("native", "quant", "planner", "sim", "hil", "experiments")

# package -> packages it must never import
FORBIDDEN = {
    "native": {"quant", "planner", "sim", "hil", "experiments"},
    "quant": {"planner", "sim", "hil", "experiments"},
    "planner": {"sim", "hil", "experiments"},
    "sim": {"hil", "experiments"},
    "hil": {"sim", "experiments"},
}


def _module_name(root: Path, path: Path) -> str:
    """tests/x.py -> 'tests.x'; pkg/__init__.py -> 'pkg'."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path, packages) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file under the given top-level packages of `root`."""
    return {_module_name(root, p): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}


def _imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """Dotted names an import statement of `module` loads (possibly outside the project; the caller filters)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:                                                     # relative: resolve against the package
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
    # `from a import b` runs a's __init__ and, when b is a submodule, a.b; a plain attribute of a is a.
    return subs + ([target] if len(subs) < len(node.names) else [])


def _entered(module: str, name: str) -> list[str]:
    """`name` and the packages importing it enters: a.b.c -> a, a.b, a.b.c, less the packages `module` lives in
    (Python initialised them before `module` ran, so they are no dependency of `module`'s own)."""
    parts = name.split(".")
    own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    return [n for n in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if n == name or n not in own]


def import_graph(root: Path, packages=PACKAGES) -> nx.DiGraph:
    """Module import graph of the given packages under `root`; every edge carries the `file:line` of its imports."""
    mods = _modules(root, packages)
    known = set(mods)
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported(mod, path.name == "__init__.py", node, known):
                for dep in _entered(mod, name):
                    if dep in known and dep != mod:
                        where = f"{path.relative_to(root)}:{node.lineno}"
                        g.add_edge(mod, dep)
                        g.edges[mod, dep].setdefault("at", []).append(where)
    return g


def cycles(g: nx.DiGraph) -> list[str]:
    """One line per strongly connected component of more than one module: its members and one cycle through them,
    each step with the line that makes it."""
    out = []
    for scc in sorted((sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1)):
        loop = nx.find_cycle(g.subgraph(scc), source=scc[0])
        steps = " -> ".join(f"{a} ({g.edges[a, b]['at'][0]})" for a, b in loop)
        out.append(f"{len(scc)} modules {scc}: {steps} -> {loop[0][0]}")
    return out


@lru_cache(maxsize=1)
def _repo_graph() -> nx.DiGraph:
    return import_graph(REPO)


@pytest.mark.parametrize("pkg", sorted(FORBIDDEN))
def test_no_upward_imports(pkg):
    g = _repo_graph()
    bad = sorted(f"{at} imports {dst}" for src, dst, d in g.edges(data=True) for at in d["at"]
                 if src.split(".")[0] == pkg and dst.split(".")[0] in FORBIDDEN[pkg])
    assert not bad, f"{pkg}/ imports upward:\n" + "\n".join(bad)


def test_no_import_cycles():
    found = cycles(_repo_graph())
    assert not found, f"{len(found)} import cycle(s):\n" + "\n".join(found)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_graph_resolves_every_import_form(tmp_path):
    _write(tmp_path, {
        "pa/__init__.py": "",
        "pa/a.py": "import pa.sub.deep\nfrom . import b\nfrom .sub import deep\n",
        "pa/b.py": "def f():\n    from pa.c import X\n",
        "pa/c.py": "X = 1\nimport numpy\n",
        "pa/sub/__init__.py": "from .deep import Y\n",
        "pa/sub/deep.py": "from .. import c\nY = 2\n",
        "pb/__init__.py": "",
        "pb/x.py": "from pa import sub\nimport pa\n",
    })
    g = import_graph(tmp_path, ("pa", "pb"))
    assert set(g.successors("pa.a")) == {"pa.sub", "pa.sub.deep", "pa.b"}      # own package pa is no dependency
    assert set(g.successors("pa.b")) == {"pa.c"}                                # function-level import counted
    assert set(g.successors("pa.sub")) == {"pa.sub.deep"}
    assert set(g.successors("pa.sub.deep")) == {"pa.c"}                         # `from .. import c` -> pa.c
    assert set(g.successors("pb.x")) == {"pa", "pa.sub"}
    assert cycles(g) == []


def test_graph_finds_cycles(tmp_path):
    _write(tmp_path, {
        "pa/__init__.py": "from pa.a import A\n",                               # re-export ...
        "pa/a.py": "A = 1\n",
        "pa/b.py": "def f():\n    import pa.c\n",
        "pa/c.py": "from pa.b import f\n",
        "pb/__init__.py": "",
        "pb/x.py": "from pa import A\n",
        "pa/d.py": "def g():\n    from pb import x\n",                          # ... and a module that it reaches
        "pa/e.py": "from pa import A\n",                                         # own __init__ named: a dependency
    })
    g = import_graph(tmp_path, ("pa", "pb"))
    found = cycles(g)
    assert len(found) == 1 and "['pa.b', 'pa.c']" in found[0] and "pa/b.py:2" in found[0], found
    g.add_edge("pa.a", "pa.e", at=["synthetic"])                                # pa -> pa.a -> pa.e -> pa
    assert any("'pa', 'pa.a', 'pa.e'" in c for c in cycles(g)), cycles(g)
