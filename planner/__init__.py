"""Planning: devices, cost models, plans, schedules.

`use_compiled` is the import hook of the modules setup.py compiles with Cython from their own `.py` sources (the
simulator's hot path in `sim`; docs/coldstart.md "Benchmarks"): a package calls it from its `__init__` before any of
them is imported.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

PURE_ENV = "EDGELLM_PURE_PYTHON"     # "1": run the .py sources even where compiled modules are built
MANIFEST = "_compiled.json"          # per package: module -> {source file name: SHA-256} at build time (setup.py)


def source_hashes(directory: Path, module: str) -> dict[str, str]:
    """SHA-256 of the sources a compiled `module` of the package in `directory` is built from (its .py and, where
    present, its augmenting .pxd): what setup.py records and `use_compiled` checks."""
    out = {}
    for suffix in (".py", ".pxd"):
        path = directory / (module + suffix)
        if path.exists():
            out[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _built(directory: Path, module: str) -> bool:
    return any((directory / (module + s)).exists() for s in importlib.machinery.EXTENSION_SUFFIXES)


def _extension_stems(directory: Path) -> set[str]:
    """Modules of `directory` present as an extension module beside their .py (built in place)."""
    return {p.name[:-len(s)] for s in importlib.machinery.EXTENSION_SUFFIXES for p in directory.glob("*" + s)
            if (directory / (p.name[:-len(s)] + ".py")).exists()}


class _SourceFinder:
    """A meta-path finder that loads the named modules from their .py files, ahead of the compiled ones beside them."""

    def __init__(self, sources: dict[str, Path]) -> None:
        self.sources = sources

    def find_spec(self, fullname: str, path=None, target=None):
        src = self.sources.get(fullname)
        if src is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, src, loader=importlib.machinery.SourceFileLoader(fullname, str(src)))


def use_compiled(package: str, directory: str) -> bool:
    """Whether the compiled modules of `package` (its directory `directory`; each a .py with an augmenting .pxd
    beside it, as setup.py builds them) run compiled. An extension module shadows its .py, so the .py sources run
    instead — all of them together, as they use each other's C declarations — when EDGELLM_PURE_PYTHON=1, or when any
    one is not built or its .py / .pxd differs from the one it was built from (the package's `_compiled.json`; one
    warning then: rebuild with `pip install -e .` or `make setup`), or when an extension module has no .pxd (left
    from an earlier build; one warning). Nothing built (no Cython at install time): the sources run, silently."""
    here = Path(directory)
    modules = sorted(p.stem for p in here.glob("*.pxd") if p.with_suffix(".py").exists())
    # an extension module left from a build whose .pxd is gone (a checkout, a dropped module) would shadow its .py
    # unchecked, and its C declarations may be the others': the whole package runs from its sources
    orphans = sorted(_extension_stems(here) - set(modules))
    if orphans:
        warnings.warn(f"{package}: compiled {', '.join(orphans)} has no .pxd (left from an earlier build): running "
                      f"the .py sources (make clean, then make setup)", RuntimeWarning, stacklevel=2)
        sys.meta_path.insert(0, _SourceFinder({f"{package}.{m}": here / f"{m}.py" for m in [*modules, *orphans]}))
        return False
    built = [m for m in modules if _built(here, m)]
    if not built:
        return False
    pure = os.environ.get(PURE_ENV, "") == "1"
    if not pure:
        try:
            recorded = json.loads((here / MANIFEST).read_text())
        except (OSError, ValueError):
            recorded = {}
        stale = [m for m in modules if m not in built or recorded.get(m) != source_hashes(here, m)]
        if not stale:
            return True
        warnings.warn(f"{package}: compiled {', '.join(stale)} not built from the current sources: running the .py "
                      f"sources (rebuild: pip install -e . or make setup)", RuntimeWarning, stacklevel=2)
    sys.meta_path.insert(0, _SourceFinder({f"{package}.{m}": here / f"{m}.py" for m in modules}))
    return False
