"""Sweep aggregation into the Table-4 shape: newest run per (method, bits), global/no-smoothing runs labelled."""
from __future__ import annotations

import json
import os

from quant.table import collect, markdown


def _run(d, method, bits, ppl, scope="tensor", smoothing=True, mtime=None):
    d.mkdir(parents=True)
    m = {"method": method, "model": "smollm2_135m", "scope": scope, "ppl": ppl, "ref_ppl": 17.83, "kl_mean": 0.1,
         "avg_bits": float(bits), "weight_bytes_linear": 1000.0 * bits, "n_linear_weights": 8000}
    (d / "metrics.json").write_text(json.dumps(m))
    (d / "config.yaml").write_text(f"quant:\n  smoothing: {str(smoothing).lower()}\n")
    if mtime:
        os.utime(d / "metrics.json", (mtime, mtime))


def test_collect_and_pivot(tmp_path):
    _run(tmp_path / "a/0", "edgeflow", 4, 30.0, mtime=1_000)
    _run(tmp_path / "b/0", "edgeflow", 4, 25.0, mtime=2_000)                  # newer run of the same cell wins
    _run(tmp_path / "b/1", "edgeflow", 5, 21.0, scope="global")
    _run(tmp_path / "b/2", "edgeflow", 5, 22.0, smoothing=False)
    _run(tmp_path / "b/3", "int8", 8, 33.0)
    runs = collect([tmp_path])
    assert runs[("edgeflow", 4.0)]["ppl"] == 25.0
    assert ("edgeflow (global)", 5.0) in runs and ("edgeflow (no smoothing)", 5.0) in runs
    md = markdown(runs)
    assert "| 4 bits | 5 bits |" in md and "| edgeflow | 25.00 / 0.100 (4.00) | – |" in md
    assert "| int8 (fixed 8 bits) | 33.00 / 0.100 (8.00)" in md
