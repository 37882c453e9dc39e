"""validate's peer formats (peer_gguf; docs/hil.md "Comparing with a peer"): the like-for-like choices are accepted
and anything else is one line before any work. Running llama.cpp itself needs the `peer` extra
(tests/hil/test_peer.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from experiments.validate import PEER_GGUFS
from tests.conftest import REPO


def test_like_for_like_formats_are_offered():
    assert {"q8_0", "q4_0", "q4_k_m", "q4_1"} <= set(PEER_GGUFS)


@pytest.mark.parametrize("kind", ["q5_0", "Q8_0"])
def test_unknown_peer_format_is_one_line_before_any_work(kind, tmp_path):
    r = subprocess.run([sys.executable, "-m", "experiments.validate", f"peer_gguf={kind}",
                        f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and not (tmp_path / "run").exists()
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: peer_gguf") and "one of q4_1, q8_0, q4_0, q4_k_m" in line
