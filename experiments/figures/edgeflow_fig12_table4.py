"""Counterpart of EdgeFlow's accuracy evaluation: accuracy of NPU-compatible quantization methods at each bit budget,
measured on the real SmolLM2-135M on this host (perplexity and mean KL against the dequantized reference; the
paper's Table 4 shape, README "Quantization of the real SmolLM2-135M"). The paper's evaluation (Llama3-8B and
others on benchmark accuracy) is withheld from the design text and needs GPUs and datasets; this is the measurable
counterpart. Built from `quant/` (the same steps as `quant.pipeline.run_quantization`, with the weights, the
calibration and the reference forwards computed once for all methods). Every method is evaluated on K = 4 disjoint
slices of the text (offsets 0, 20000, 40000, 60000; disjoint from the calibration slice at 100000): each row has the
mean and the sample sd over the slices (`ppl` / `ppl_sd`, `kl_mean` / `kl_mean_sd`); the plot draws mean ± sd.

`full`: methods edgeflow, smoothquant, shadow_outlier, cmpq at 4-6 bits and int8 / int4, 4 slices of 512 evaluation
tokens (several minutes on 2 cores); `toy`: edgeflow (3-point α grid) and int8 at 5 bits on 4 slices of 16 tokens
(about a minute: the golden test is marked slow).
"""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note, progress
from experiments.figures.names import label

GRID = {
    "full": dict(methods=("edgeflow", "smoothquant", "shadow_outlier", "cmpq"), fixed=("int8", "int4"),
                 bits=(4, 5, 6), eval_tokens=512, eval_slices=4, calib_tokens=256, search_tokens=128,
                 alpha_steps=11),
    "toy": dict(methods=("edgeflow",), fixed=("int8",), bits=(5,), eval_tokens=16, eval_slices=4,
                calib_tokens=32, search_tokens=16, alpha_steps=3),
}
MODEL = "smollm2_135m"

SPEC = FigureSpec(
    name="edgeflow_fig12_table4", paper="EdgeFlow", figure="", withheld=True,
    topic="Quantization accuracy vs bit budget under the NPU's constraints",
    title="real SmolLM2-135M, perplexity and KL against the dequantized reference",
    claim="Under the NPU's constraints (static per-tensor INT8 activations, per-output-channel weights), "
          "EdgeFlow's importance-aware per-channel bit allocation with NPU-aware smoothing keeps accuracy close to "
          "the full-precision model at about 5 bits, better than the NPU-compatible baselines at the same budget.",
    simulated="",
    measured="perplexity and KL(reference‖quantized) of each method on this host (deterministic NumPy forward)",
    tolerances={"ppl": (1e-3, 1e-6), "kl_mean": (1e-3, 1e-6), "ref_ppl": (1e-3, 1e-6),
                "ppl_sd": (1e-2, 1e-5), "kl_mean_sd": (1e-2, 1e-6), "ref_ppl_sd": (1e-2, 1e-5),
                "stored_bits_per_weight": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    """At `full`, each (method, bits) row is cached on disk (`experiments.figures.data.measured_cache`, keyed by the
    GGUF file's hash, method, bits, settings and the `quant/` sources), so a re-run reuses it; the heading says how
    many rows were reused. `toy` (the golden test) always measures."""
    import dataclasses
    import sys

    import numpy as np

    from experiments.figures.data import measured_cache, sha256_code, sha256_file
    from quant.arch import model_spec
    from quant.calibrate import calibrate
    from quant.evaluate import eval_text_tokens, evaluate_slices, settings_slices
    from quant.gguf_model import gguf_path, load_weights
    from quant.llama import forward_logits
    from quant.methods import METHODS
    from quant.settings import QuantSettings

    g = GRID[size]
    spec = model_spec(MODEL)
    settings = QuantSettings(eval_tokens=g["eval_tokens"], eval_slices=g["eval_slices"],
                             calib_tokens=g["calib_tokens"], search_tokens=g["search_tokens"],
                             alpha_steps=g["alpha_steps"])
    inputs: dict = {}

    def measure(method: str, bits: int) -> dict:
        if not inputs:                                                  # loaded on the first measurement only
            weights = load_weights(spec)
            inputs.update(weights=weights, slices=settings_slices(spec, settings),  # (K, L) disjoint slices
                          calib=calibrate(weights, spec, eval_text_tokens(spec, settings.calib_tokens,
                                                                          settings.calib_offset)))
            inputs["refs"] = [forward_logits(weights, spec, t) for t in inputs["slices"]]    # K × (L, vocab)
        weights, slices = inputs["weights"], inputs["slices"]
        qm = METHODS[method](settings).build(weights, spec, inputs["calib"], bits, float(bits), None)
        ev = evaluate_slices(weights, spec, slices, qm, inputs["refs"]).metrics()
        b, d = qm.all_bits()
        lin_bytes = sum(layer.weight_bytes() for layer in qm.layers.values())
        return {"method": method, "budget_bits": bits, "ppl": float(ev["ppl"]), "ppl_sd": float(ev["ppl_sd"]),
                "kl_mean": float(ev["kl_mean"]), "kl_mean_sd": float(ev["kl_mean_sd"]),
                "ref_ppl": float(ev["ref_ppl"]), "ref_ppl_sd": float(ev["ref_ppl_sd"]),
                "stored_bits_per_weight": float(lin_bytes * 8 / d.sum()), "eval_tokens": int(slices.shape[1]),
                "eval_slices": int(slices.shape[0]), "source": "measured"}

    runs = [(m, b) for m in g["methods"] for b in g["bits"]] + [(m, 8 if m == "int8" else 4) for m in g["fixed"]]
    base = {} if size != "full" else {
        "model": MODEL, "gguf_sha256": sha256_file(gguf_path(spec)), "settings": dataclasses.asdict(settings),
        "quant_code_sha256": sha256_code("quant"), "numpy": np.__version__}
    rows, reused = [], 0
    for method, bits in progress(runs, "quantize + evaluate"):
        if base:
            row, hit = measured_cache(SPEC.name, {**base, "method": method, "bits": bits},
                                      lambda: measure(method, bits))
            reused += hit
        else:
            row = measure(method, bits)
        rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs["reused"] = (reused, len(runs))
    if reused:
        print(f"{SPEC.name}: {reused} of {len(runs)} measurements reused from outputs/cache/{SPEC.name}/ "
              "(measured earlier on this host by the same model file and code)", file=sys.stderr)
    return df


def plot(df: pd.DataFrame, fig) -> None:
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for method in dict.fromkeys(df.method):
        d = df[df.method == method].sort_values("stored_bits_per_weight")
        style = "o-" if len(d) > 1 else "s"
        ax1.errorbar(d.stored_bits_per_weight, d.ppl, yerr=d.ppl_sd, fmt=style, capsize=2, label=label(method))
        ax2.errorbar(d.stored_bits_per_weight, d.kl_mean, yerr=d.kl_mean_sd, fmt=style, capsize=2,
                     label=label(method))
    ax1.axhline(float(df.ref_ppl.iloc[0]), color="k", ls=":", lw=1, label="reference (dequantized GGUF)")
    ax1.set_yscale("log")
    ax1.set_xlabel("stored bits per linear weight")
    ax1.set_ylabel(f"perplexity, mean ± sd over {int(df.eval_slices.iloc[0])} slices of "
                   f"{int(df.eval_tokens.iloc[0])} tokens")
    ax2.set_xlabel("stored bits per linear weight")
    ax2.set_ylabel("mean KL(ref ‖ quantized), nats (mean ± sd over slices)")
    fig_legend(fig, (ax1, ax2), ncol=7)
    note(fig, "measured on this host")
    reused, total = df.attrs.get("reused", (0, 0))
    if reused:
        note(fig, f"{reused} of {total} rows reused from an earlier measurement (outputs/cache)")
