"""EdgeFlow "Fig. 12 with Table 4" counterpart: accuracy of NPU-compatible quantization methods at each bit budget,
measured on the real SmolLM2-135M on this host (perplexity and mean KL against the dequantized reference; the
paper's Table 4 shape, README "Quantization of the real SmolLM2-135M"). The paper's evaluation (Llama3-8B and
others on benchmark accuracy) is withheld from the design text and needs GPUs and datasets; this is the measurable
counterpart. Built from `quant/` (the same steps as `quant.pipeline.run_quantization`, with the weights, the
calibration and the reference forward computed once for all methods).

`full`: methods edgeflow, smoothquant, shadow_outlier, cmpq at 4-6 bits and int8 / int4, 512 evaluation tokens
(a few minutes on 2 cores); `toy`: edgeflow (3-point α grid) and int8 at 5 bits on 16 tokens (about a
minute: the golden test is marked slow).
"""
from __future__ import annotations

import pandas as pd

from experiments.figures.base import FigureSpec, note, progress

GRID = {
    "full": dict(methods=("edgeflow", "smoothquant", "shadow_outlier", "cmpq"), fixed=("int8", "int4"),
                 bits=(4, 5, 6), eval_tokens=512, calib_tokens=256, search_tokens=128, alpha_steps=11),
    "toy": dict(methods=("edgeflow",), fixed=("int8",), bits=(5,), eval_tokens=16, calib_tokens=32,
                search_tokens=16, alpha_steps=3),
}
MODEL = "smollm2_135m"

SPEC = FigureSpec(
    name="edgeflow_fig12_table4", paper="EdgeFlow", figure="Fig. 12 + Table 4", withheld=True,
    title="quantization accuracy vs bit budget under the NPU constraints, real SmolLM2-135M (measured)",
    claim="Under the NPU's constraints (static per-tensor INT8 activations, per-output-channel weights), "
          "EdgeFlow's importance-aware per-channel bit allocation with NPU-aware smoothing keeps accuracy close to "
          "the full-precision model at about 5 bits, better than the NPU-compatible baselines at the same budget.",
    simulated="",
    measured="perplexity and KL(reference‖quantized) of each method on this host (deterministic NumPy forward)",
    tolerances={"ppl": (1e-3, 1e-6), "kl_mean": (1e-3, 1e-6), "ref_ppl": (1e-3, 1e-6),
                "stored_bits_per_weight": (1e-4, 1e-9)})


def data(size: str) -> pd.DataFrame:
    from quant.calibrate import calibrate
    from quant.evaluate import eval_text_tokens, kl_mean, perplexity_from_logits
    from quant.gguf_model import load_weights, model_spec
    from quant.llama import forward_logits
    from quant.methods import METHODS
    from quant.settings import QuantSettings

    g = GRID[size]
    spec = model_spec(MODEL)
    settings = QuantSettings(eval_tokens=g["eval_tokens"], calib_tokens=g["calib_tokens"],
                             search_tokens=g["search_tokens"], alpha_steps=g["alpha_steps"])
    weights = load_weights(spec)
    calib = calibrate(weights, spec, eval_text_tokens(spec, settings.calib_tokens, settings.calib_offset))
    toks = eval_text_tokens(spec, settings.eval_tokens, settings.eval_offset)
    ref = forward_logits(weights, spec, toks)                       # (T, vocab)
    ref_ppl = perplexity_from_logits(ref, toks)
    runs = [(m, b) for m in g["methods"] for b in g["bits"]] + [(m, 8 if m == "int8" else 4) for m in g["fixed"]]
    rows = []
    for method, bits in progress(runs, "quantize + evaluate"):
        qm = METHODS[method](settings).build(weights, spec, calib, bits, float(bits), None)
        q = forward_logits(weights, spec, toks, qm)
        b, d = qm.all_bits()
        lin_bytes = sum(layer.weight_bytes() for layer in qm.layers.values())
        rows.append({"method": method, "budget_bits": bits, "ppl": perplexity_from_logits(q, toks),
                     "kl_mean": kl_mean(ref, q), "ref_ppl": ref_ppl,
                     "stored_bits_per_weight": lin_bytes * 8 / d.sum(), "eval_tokens": int(toks.size),
                     "source": "measured"})
    return pd.DataFrame(rows)


def plot(df: pd.DataFrame, fig) -> None:
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for method in dict.fromkeys(df.method):
        d = df[df.method == method].sort_values("stored_bits_per_weight")
        style = "o-" if len(d) > 1 else "s"
        ax1.plot(d.stored_bits_per_weight, d.ppl, style, label=method)
        ax2.plot(d.stored_bits_per_weight, d.kl_mean, style, label=method)
    ax1.axhline(float(df.ref_ppl.iloc[0]), color="k", ls=":", lw=1, label="reference (dequantized GGUF)")
    ax1.set_yscale("log")
    ax1.set_xlabel("stored bits per linear weight")
    ax1.set_ylabel(f"perplexity ({int(df.eval_tokens.iloc[0])} tokens)")
    ax2.set_xlabel("stored bits per linear weight")
    ax2.set_ylabel("mean KL(ref ‖ quantized), nats")
    ax1.legend(fontsize=7)
    note(ax1, "measured on this host")
