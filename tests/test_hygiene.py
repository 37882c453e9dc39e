"""Repository hygiene (docs/design.md §10): `ruff check` is clean, and code, configs, tests and docs cite `docs/` and
the papers (EdgeFlow / Voltron, by section), never files a user of the repository does not have."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCANNED = ("*.py", "*.md", "*.yaml", "*.c", "*.h", "*.toml", "Makefile")
SKIPPED_DIRS = {".venv", "outputs", "multirun", "build", ".git", ".pytest_cache", "__pycache__", "edgellm.egg-info"}
# a citation of the product spec ("SPEC §3.2", "SPEC:") or of notes outside the repository ("NOTES.md", "NOTES
# check"); `SPEC = FigureSpec(...)`, `mod.SPEC` and `NOTES = "_figure_notes"` in experiments/figures are variables
FORBIDDEN = re.compile(r"\bSPEC(?:\s*§|:)|\.\./shared|\bNOTES(?:\.md\b|(?=\s+[a-z]))")
PENDING: set[str] = set()     # files temporarily exempt (none)

# No dates in code, configs or tests: history lives in git, a comment says why the code is as it is today
# (docs/design.md §10). A calendar date: ISO (2026-12-06, also inside 2026-12-06_12-00-00), a clock time in UTC
# (18:03 UTC, 18:03-19:12 UTC), "12-06 UTC", or a month-name date (Dec 6, 2026 / 6 December 2026).
DATED_DIRS = ("quant", "planner", "sim", "hil", "native", "experiments", "tests", "conf")
DATED_SUFFIXES = (".py", ".c", ".h", ".yaml")
_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?|"
          r"Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
DATE = re.compile(r"(?<!\d)20\d\d-[01]\d-[0-3]\d(?!\d)|\b\d\d:\d\d(?:[–-]\d\d:\d\d)? UTC\b|\b\d\d-\d\d UTC\b|"
                  rf"\b{_MONTH}\.? [0-3]?\d(?:st|nd|rd|th)?,? 20\d\d\b|\b[0-3]?\d {_MONTH} 20\d\d\b")
# lines where a date is data, not history: (file, text on the line)
DATE_ALLOWED = {("tests/hil_cluster/test_transport.py", 'dtype="M8[s]"')}   # a datetime64 value sent over the wire
ISSUE = re.compile(r"\b[Ii]ssue #?\d+")


def _repo_files():
    for pattern in SCANNED:
        for path in REPO.rglob(pattern):
            rel = path.relative_to(REPO)
            if not SKIPPED_DIRS.intersection(rel.parts[:-1]) and path.is_file():
                yield rel.as_posix(), path


def test_forbidden_pattern_matches_what_it_should():
    assert FORBIDDEN.search("(SPEC §3.2)") and FORBIDDEN.search("SPEC: median") and FORBIDDEN.search("NOTES.md")
    assert FORBIDDEN.search("see ../shared/x") and FORBIDDEN.search("(NOTES check)")
    assert not FORBIDDEN.search("SPEC = FigureSpec(") and not FORBIDDEN.search("mod.SPEC, mod.data")
    assert not FORBIDDEN.search('NOTES = "_figure_notes"') and not FORBIDDEN.search("getattr(fig, NOTES, [])")
    assert not FORBIDDEN.search("docs/design.md §7") and not FORBIDDEN.search("SPEC.tolerances")


def test_no_citations_of_files_outside_the_repository():
    bad = []
    for rel, path in _repo_files():
        if rel in PENDING or rel == "tests/test_hygiene.py":
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if FORBIDDEN.search(line):
                bad.append(f"{rel}:{n}: {line.strip()[:100]}")
    assert not bad, "cite docs/<page>.md or the papers instead:\n" + "\n".join(bad)


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff not installed (pip install ruff)")
def test_ruff_clean():
    # the [tool.ruff] section of pyproject.toml selects the rules and excludes outputs/, multirun/, figures/
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "--no-cache", "."],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    findings = [ln for ln in r.stdout.splitlines()
                if re.match(r"\S+:\d+:\d+: ", ln) and ln.split(":")[0] not in PENDING]
    assert r.returncode in (0, 1), r.stderr
    assert not findings, "ruff check:\n" + "\n".join(findings)


def _dated_files():
    for top in DATED_DIRS:
        for path in sorted((REPO / top).rglob("*")):
            rel = path.relative_to(REPO)
            if path.suffix in DATED_SUFFIXES and path.is_file() and not SKIPPED_DIRS.intersection(rel.parts[:-1]):
                yield rel.as_posix(), path


def test_date_pattern_matches_what_it_should():
    for dated in ("measured 2026-12-06", "multirun/x/2026-11-30_12-00-00", "(18:03 UTC)", "18:03–19:12 UTC",
                  "at 12-06 UTC", "Dec 6, 2026", "6 December 2026", "since 2026-12-04;"):
        assert DATE.search(dated), dated
    for fine in ("${now:%Y-%m-%d_%H-%M-%S}", "%Y-%m-%dT%H:%M:%SZ", "shape 2048 x 8192", "seed 20261206",
                 "0.2026-12", "v2026.12", "May 5 cores", "1 - 12 - 06"):
        assert not DATE.search(fine), fine


def test_no_dates_in_code_configs_or_tests():
    bad = []
    for rel, path in _dated_files():
        if rel == "tests/test_hygiene.py":
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if DATE.search(line) and not any(rel == f and text in line for f, text in DATE_ALLOWED):
                bad.append(f"{rel}:{n}: {line.strip()[:100]}")
    assert not bad, "dates in code (history lives in git; say why the code is as it is):\n" + "\n".join(bad)


def test_no_issue_numbers_in_code_configs_or_tests():
    bad = [f"{rel}:{n}: {line.strip()[:100]}" for rel, path in _dated_files() if rel != "tests/test_hygiene.py"
           for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if ISSUE.search(line)]
    assert not bad, "issue numbers mean nothing to the repository's users; cite docs/ or the papers:\n" + "\n".join(bad)
