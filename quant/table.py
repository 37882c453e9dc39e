"""Aggregate quantize-app runs into the paper's Table-4 shape (methods × bits: ppl, KL, avg bits), as Markdown.
Runs evaluated on K disjoint slices (`quant.eval_slices`) show mean ± sd over the slices.

    python -m quant.table outputs/quant_sweep [more dirs]   # every */metrics.json below, newest run per (method, bits)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from quant.arch import model_spec

ORDER = ["int8", "int4", "smoothquant (NPU smoothing, default)", "smoothquant original (eq. 4)", "shadow_outlier",
         "cmpq (NPU smoothing, default)", "cmpq original (no smoothing)", "edgeflow (no smoothing)",
         "edgeflow, uniform bits (min_bits = max_bits)", "edgeflow", "edgeflow (global)"]


def collect(roots: list[Path]) -> dict[tuple[str, float], dict]:
    runs: dict[tuple[str, float], tuple[float, dict]] = {}
    for root in roots:
        for p in sorted(Path(root).rglob("metrics.json")):
            m = json.loads(p.read_text())
            if "ppl" not in m or "method" not in m:
                continue
            label, scope, smoothing, baseline = m["method"], m.get("scope"), True, "npu"
            if (p.parent / "config.yaml").is_file():
                from omegaconf import OmegaConf

                cfg = OmegaConf.load(p.parent / "config.yaml")
                scope = scope or OmegaConf.select(cfg, "quant.scope")        # runs from before `scope` was a metric
                smoothing = OmegaConf.select(cfg, "quant.smoothing", default=True)
                baseline = OmegaConf.select(cfg, "quant.baseline_smoothing", default="npu")
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
            elif label in ("smoothquant", "cmpq") and baseline == "original":
                label += " original (eq. 4)" if label == "smoothquant" else " original (no smoothing)"
            elif label in ("smoothquant", "cmpq"):
                label += " (NPU smoothing, default)"
            key = (label, round(m["avg_bits"], 3))
            if key not in runs or p.stat().st_mtime > runs[key][0]:
                runs[key] = (p.stat().st_mtime, m)
    return {k: v[1] for k, v in runs.items()}


def _eff_bits(r: dict) -> float:
    """Stored bits per linear weight incl. scales, widths and shadow FP16 columns (from the size estimate)."""
    n = r.get("n_linear_weights")
    if not n:
        spec = model_spec(r["model"])
        n = spec.n_layers * sum(o * i for o, i in spec.linear_shapes().values())
    return r["weight_bytes_linear"] * 8 / n


def _cell(r: dict) -> str:
    """`ppl ± sd / KL ± sd (stored bits)` (mean ± sd over the evaluation slices), `ppl / KL (bits)` for one slice."""
    if r.get("eval_slices", 1) > 1 and "ppl_sd" in r:
        return (f"{r['ppl']:.2f} ± {r['ppl_sd']:.2f} / {r['kl_mean']:.3f} ± {r['kl_mean_sd']:.3f} "
                f"({_eff_bits(r):.2f})")
    return f"{r['ppl']:.2f} / {r['kl_mean']:.3f} ({_eff_bits(r):.2f})"


def markdown(runs: dict[tuple[str, float], dict]) -> str:
    """Pivot: one row per method, one column per budget 4..7 bits, cells `ppl / KL (stored bits per weight)`
    (mean ± sd over the evaluation slices when there are several)."""
    r0 = next(iter(runs.values())) if runs else {}
    ref = r0.get("ref_ppl", float("nan"))
    k = r0.get("eval_slices", 1)
    spread = (f"ppl {ref:.2f} ± {r0.get('ref_ppl_sd', 0.0):.2f} (mean ± sd over {k} disjoint slices of "
              f"{r0.get('eval_tokens', '?')} tokens)" if k > 1 else f"ppl {ref:.2f}")
    budgets = sorted({b for (m, b) in runs if m not in ("int8", "int4")})
    lines = [f"Reference (dequantized GGUF, fp32): {spread}. Cells: ppl / mean KL(ref‖q) nats "
             "(stored bits per linear weight incl. scales/widths/outlier columns).", "",
             "| method | " + " | ".join(f"{b:g} bits" for b in budgets) + " |",
             "|---|" + "---|" * len(budgets)]
    for method in ORDER:
        have = {b: r for (m, b), r in runs.items() if m == method}
        if not have:
            continue
        if method in ("int8", "int4"):
            (b, r), = have.items()
            lines.append(f"| {method} (fixed {b:g} bits) | {_cell(r)}" + " |" * len(budgets))
            continue
        cells = [_cell(have[b]) if b in have else "–" for b in budgets]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown_rel(runs: dict[tuple[str, float], dict]) -> str:
    """The same pivot with the paired relative perplexity increase ppl/ref_ppl − 1 per slice, mean ± sd over the
    slices, in % (the slices differ in difficulty: reference ppl from 7.6 to 22.4 on the default 512-token slices,
    which dominates the sd of the raw ppl; the paired ratio removes it). Empty for single-slice runs."""
    runs = {k: r for k, r in runs.items() if r.get("eval_slices", 1) > 1 and "dppl_rel" in r}
    if not runs:
        return ""
    budgets = sorted({b for (m, b) in runs if m not in ("int8", "int4")})
    lines = ["Paired relative perplexity increase ppl/ref_ppl − 1 (mean ± sd over the same slices, %):", "",
             "| method | " + " | ".join(f"{b:g} bits" for b in budgets) + " |", "|---|" + "---|" * len(budgets)]

    def cell(r: dict) -> str:
        return f"{100 * r['dppl_rel']:+.1f} ± {100 * r['dppl_rel_sd']:.1f} %"

    for method in ORDER:
        have = {b: r for (m, b), r in runs.items() if m == method}
        if not have:
            continue
        if method in ("int8", "int4"):
            (b, r), = have.items()
            lines.append(f"| {method} (fixed {b:g} bits) | {cell(r)}" + " |" * len(budgets))
            continue
        lines.append(f"| {method} | " + " | ".join(cell(have[b]) if b in have else "–" for b in budgets) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    _runs = collect([Path(a) for a in sys.argv[1:]] or [Path("outputs/quant_sweep")])
    print(markdown(_runs))
    print(markdown_rel(_runs))
