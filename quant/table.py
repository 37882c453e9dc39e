"""Aggregate quantize-app runs into the paper's Table-4 shape (methods × bits: ppl, KL, avg bits), as Markdown.

    python -m quant.table outputs/quant_sweep [more dirs]   # every */metrics.json below, newest run per (method, bits)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = ["int8", "int4", "smoothquant", "shadow_outlier", "cmpq", "edgeflow (no smoothing)",
         "edgeflow, uniform bits (min_bits = max_bits)", "edgeflow", "edgeflow (global)"]


def collect(roots: list[Path]) -> dict[tuple[str, float], dict]:
    runs: dict[tuple[str, float], tuple[float, dict]] = {}
    for root in roots:
        for p in sorted(Path(root).rglob("metrics.json")):
            m = json.loads(p.read_text())
            if "ppl" not in m or "method" not in m:
                continue
            label, scope, smoothing = m["method"], m.get("scope"), True
            if (p.parent / "config.yaml").is_file():
                from omegaconf import OmegaConf

                cfg = OmegaConf.load(p.parent / "config.yaml")
                scope = scope or OmegaConf.select(cfg, "quant.scope")        # runs from before `scope` was a metric
                smoothing = OmegaConf.select(cfg, "quant.smoothing", default=True)
                fixed = OmegaConf.select(cfg, "quant.min_bits", default=1) == OmegaConf.select(cfg, "quant.max_bits",
                                                                                              default=8)
            else:
                fixed = False
            if label == "edgeflow" and fixed:
                label = "edgeflow, uniform bits (min_bits = max_bits)"
            elif label == "edgeflow" and scope == "global":
                label = "edgeflow (global)"
            elif label == "edgeflow" and not smoothing:
                label = "edgeflow (no smoothing)"
            key = (label, round(m["avg_bits"], 3))
            if key not in runs or p.stat().st_mtime > runs[key][0]:
                runs[key] = (p.stat().st_mtime, m)
    return {k: v[1] for k, v in runs.items()}


def _eff_bits(r: dict) -> float:
    """Stored bits per linear weight incl. scales, widths and shadow FP16 columns (from the size estimate)."""
    n = r.get("n_linear_weights")
    if not n:
        from quant.gguf_model import model_spec

        spec = model_spec(r["model"])
        n = spec.n_layers * sum(o * i for o, i in spec.linear_shapes().values())
    return r["weight_bytes_linear"] * 8 / n


def markdown(runs: dict[tuple[str, float], dict]) -> str:
    """Pivot: one row per method, one column per budget 4..7 bits, cells `ppl / KL (stored bits per weight)`."""
    ref = next(iter(runs.values()))["ref_ppl"] if runs else float("nan")
    budgets = sorted({b for (m, b) in runs if m not in ("int8", "int4")})
    lines = [f"Reference (dequantized GGUF, fp32): ppl {ref:.2f}. Cells: ppl / mean KL(ref‖q) nats "
             "(stored bits per linear weight incl. scales/widths/outlier columns).", "",
             "| method | " + " | ".join(f"{b:g} bits" for b in budgets) + " |",
             "|---|" + "---|" * len(budgets)]
    for method in ORDER:
        have = {b: r for (m, b), r in runs.items() if m == method}
        if not have:
            continue
        if method in ("int8", "int4"):
            (b, r), = have.items()
            lines.append(f"| {method} (fixed {b:g} bits) | {r['ppl']:.2f} / {r['kl_mean']:.3f} ({_eff_bits(r):.2f})"
                         + " |" * len(budgets))
            continue
        cells = [f"{have[b]['ppl']:.2f} / {have[b]['kl_mean']:.3f} ({_eff_bits(have[b]):.2f})" if b in have else "–"
                 for b in budgets]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(collect([Path(a) for a in sys.argv[1:]] or [Path("outputs/quant_sweep")])))
