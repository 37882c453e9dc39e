"""Table 4 over K evaluation slices: cells show mean ± sd, the paired relative table, baseline-smoothing labels."""
from __future__ import annotations

import json

from quant.table import collect, markdown, markdown_rel


def _run(d, method, ppl, ppl_sd, kl, kl_sd, rel, rel_sd, baseline="npu"):
    d.mkdir(parents=True)
    m = {"method": method, "model": "smollm2_135m", "scope": "tensor", "ppl": ppl, "ppl_sd": ppl_sd, "ref_ppl": 14.88,
         "ref_ppl_sd": 6.52, "kl_mean": kl, "kl_mean_sd": kl_sd, "dppl_rel": rel, "dppl_rel_sd": rel_sd,
         "eval_slices": 4, "eval_tokens": 512, "avg_bits": 5.0, "weight_bytes_linear": 5000.0,
         "n_linear_weights": 8000}
    (d / "metrics.json").write_text(json.dumps(m))
    (d / "config.yaml").write_text(f"quant:\n  baseline_smoothing: {baseline}\n")


def test_mean_sd_cells_and_labels(tmp_path):
    _run(tmp_path / "a", "edgeflow", 17.41, 8.02, 0.152, 0.015, 0.159, 0.044)
    _run(tmp_path / "b", "cmpq", 18.16, 8.02, 0.183, 0.021, 0.216, 0.035)
    _run(tmp_path / "c", "cmpq", 30.0, 9.0, 1.0, 0.1, 1.0, 0.2, baseline="original")
    runs = collect([tmp_path])
    md = markdown(runs)
    assert "ppl 14.88 ± 6.52 (mean ± sd over 4 disjoint slices of 512 tokens)" in md
    assert "| edgeflow | 17.41 ± 8.02 / 0.152 ± 0.015 (5.00) |" in md
    assert "| cmpq (NPU smoothing, default) | 18.16 ± 8.02 / 0.183 ± 0.021 (5.00) |" in md
    assert "| cmpq original (no smoothing) | 30.00 ± 9.00 / 1.000 ± 0.100 (5.00) |" in md
    rel = markdown_rel(runs)
    assert "| edgeflow | +15.9 ± 4.4 % |" in rel
