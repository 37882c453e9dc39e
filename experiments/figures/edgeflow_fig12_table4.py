"""Counterpart of EdgeFlow's accuracy evaluation: accuracy of NPU-compatible quantization methods at each bit budget,
measured on the real SmolLM2-135M on this host (perplexity and mean KL against the dequantized reference; the
paper's Table 4 shape, README "Quantization of the real SmolLM2-135M"). The paper's evaluation (Llama3-8B and
others on benchmark accuracy) is withheld from the design text and needs GPUs and datasets; this is the measurable
counterpart. Every method is evaluated on K = 4 disjoint slices of the text (offsets 0, 20000, 40000, 60000; disjoint
from the calibration slice at 100000): each row has the mean and the sample sd over the slices (`ppl` / `ppl_sd`,
`kl_mean` / `kl_mean_sd`); the plot draws mean ± sd.

`full` reads experiment runs: the measurement is `python -m experiments.quantize` (the commands are `COMMANDS`: methods
edgeflow, smoothquant, shadow_outlier, cmpq at 4-6 bits and int8 / int4, 4 slices of 512 evaluation tokens), and
the figure takes, per method and bits, the newest run under `multirun/quantize/` or `outputs/quantize/` with the
figure's settings and the same GGUF file (`runs`). `missing()` says which are not on disk; `run_missing()` runs them
(the figures app does so unless `missing=skip`). `toy` (the golden test: edgeflow with a 3-point α grid and int8 at
5 bits on 4 slices of 16 tokens, about a minute) measures in this process with `quant.pipeline.run_quantization`,
the same steps, sharing the weights, calibration and reference forwards between its rows.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from experiments.figures.base import FigureSpec, fig_legend, note, progress
from experiments.figures.data import ROOT
from experiments.figures.names import label

GRID = {
    "full": dict(methods=("edgeflow", "smoothquant", "shadow_outlier", "cmpq"), fixed=("int8", "int4"),
                 bits=(4, 5, 6), eval_tokens=512, eval_slices=4, calib_tokens=256, search_tokens=128,
                 alpha_steps=11),
    "toy": dict(methods=("edgeflow",), fixed=("int8",), bits=(5,), eval_tokens=16, eval_slices=4,
                calib_tokens=32, search_tokens=16, alpha_steps=3),
}
MODEL = "smollm2_135m"
SETTING_KEYS = ("eval_tokens", "eval_slices", "calib_tokens", "search_tokens", "alpha_steps")
FIXED_BITS = {"int8": 8, "int4": 4}             # the fixed-width methods ignore `bits`
RESULT_ROOTS = [ROOT / "multirun" / "quantize", ROOT / "outputs" / "quantize"]    # where quantize runs are read

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


def settings(size: str):
    """The quantizer settings of the figure's runs (`quant.settings.QuantSettings`; the rest at their defaults)."""
    from quant.settings import QuantSettings

    return QuantSettings(**{k: GRID[size][k] for k in SETTING_KEYS})


def wanted(size: str) -> list[tuple[str, int]]:
    """(method, bits) of every row, in the figure's order."""
    g = GRID[size]
    return [(m, b) for m in g["methods"] for b in g["bits"]] + [(m, FIXED_BITS[m]) for m in g["fixed"]]


def row(metrics: dict, bits: int) -> dict:
    """The figure's row of one run's metrics (`quant.pipeline.run_quantization`)."""
    return {"method": metrics["method"], "budget_bits": bits, "ppl": float(metrics["ppl"]),
            "ppl_sd": float(metrics["ppl_sd"]), "kl_mean": float(metrics["kl_mean"]),
            "kl_mean_sd": float(metrics["kl_mean_sd"]), "ref_ppl": float(metrics["ref_ppl"]),
            "ref_ppl_sd": float(metrics["ref_ppl_sd"]),
            "stored_bits_per_weight": float(metrics["stored_bits_per_weight"]),
            "eval_tokens": int(metrics["eval_tokens"]), "eval_slices": int(metrics["eval_slices"]),
            "source": "measured"}


def runs(roots: list[Path] | None = None, size: str = "full") -> dict[tuple[str, int], tuple[Path, dict]]:
    """(method, bits) -> (run directory, metrics) of the newest finished `experiments.quantize` run under `roots` with
    the figure's settings at `size` (model, quantizer settings, no `budget` override), the current GGUF file and the
    current `quant/` sources; a fixed-width method's runs count at its width whatever their `bits`."""
    import yaml

    from experiments.quantize import code_sha256
    from experiments.resume import file_digest
    from quant.arch import model_spec
    from quant.gguf_model import gguf_path

    want, code = dataclasses.asdict(settings(size)), code_sha256()
    gguf = Path(gguf_path(model_spec(MODEL))).resolve()
    digest = file_digest(gguf) if gguf.is_file() else None
    newest: dict[tuple[str, int], tuple[float, Path, dict]] = {}
    for root in RESULT_ROOTS if roots is None else roots:
        for path in sorted(Path(root).rglob("metrics.json")) if Path(root).is_dir() else ():
            d = path.parent
            try:
                m = json.loads(path.read_text())
                cfg = yaml.safe_load((d / "config.yaml").read_text())
                files = json.loads((d / "inputs.json").read_text())["files"]
            except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
                continue
            if (not isinstance(cfg, dict) or (cfg.get("model") or {}).get("name") != MODEL
                    or cfg.get("budget") is not None or cfg.get("quant") != want
                    or files.get(str(gguf)) != digest or m.get("quant_code_sha256") != code or "ppl" not in m):
                continue
            method = cfg.get("method")
            key = (method, FIXED_BITS.get(method, cfg.get("bits")))
            t = path.stat().st_mtime
            if key not in newest or t > newest[key][0]:
                newest[key] = (t, d, m)
    return {k: (d, m) for k, (_t, d, m) in newest.items()}


def commands(todo: list[tuple[str, int]], size: str = "full") -> list[list[str]]:
    """`experiments.quantize` sweeps that measure the (method, bits) in `todo` with the figure's settings at `size`:
    methods with the same missing bits share a sweep (and its reference forwards); the fixed-width methods share
    one."""
    g = settings(size)
    quant = [f"quant.{k}={getattr(g, k)}" for k in SETTING_KEYS]
    by_bits: dict[tuple, list[str]] = {}
    for m in dict.fromkeys(m for m, _ in todo):
        bits = tuple(sorted(b for mm, b in todo if mm == m)) if m not in FIXED_BITS else ()
        by_bits.setdefault(bits, []).append(m)
    out = []
    for bits, methods in by_bits.items():
        args = [f"model={MODEL}", "method=" + ",".join(methods)] + ([f"bits={','.join(map(str, bits))}"] if bits
                                                                      else [])
        out.append([sys.executable, "-m", "experiments.quantize", "-m", *args, *quant])
    return out


def shown(cmd: list[str]) -> str:
    return " ".join(["python", *map(shlex.quote, cmd[1:])])


def todo() -> list[tuple[str, int]]:
    """The full figure's (method, bits) with no run on disk."""
    found = runs()
    return [k for k in wanted("full") if k not in found]


def missing() -> str | None:
    """Which full-size rows have no run on disk and the commands that measure them, or None."""
    left = todo()
    if not left:
        return None
    return (f"{len(left)} of {len(wanted('full'))} quantize + evaluate runs not on disk (run: "
            + "; ".join(shown(c) for c in commands(left)) + ")")


def estimate_s() -> float:
    """Modelled seconds of the missing runs on this 2-core host (`experiments.quantize`'s estimate per run)."""
    from experiments.quantize import EST_BASE_S, EST_S_PER_TOKEN

    g = GRID["full"]
    return len(todo()) * (EST_BASE_S + EST_S_PER_TOKEN * g["eval_tokens"] * g["eval_slices"])


def run_missing() -> None:
    """Run the `experiments.quantize` sweeps of the rows `missing()` names, one after another (their output on
    stderr); an error if one fails."""
    for cmd in commands(todo()):
        t0 = time.perf_counter()
        print(f"{SPEC.name}: running {shown(cmd)}", file=sys.stderr, flush=True)
        p = subprocess.run(cmd, cwd=ROOT, stdout=sys.stderr)
        if p.returncode:
            raise RuntimeError(f"figure {SPEC.name}: {shown(cmd)} failed (exit {p.returncode})")
        print(f"{SPEC.name}: {shown(cmd)}: {time.perf_counter() - t0:.0f} s (measured)", file=sys.stderr, flush=True)


def data(size: str) -> pd.DataFrame:
    """`full`: the newest matching `experiments.quantize` run per row (an error naming the commands if one is missing;
    `run_missing` makes them); `toy`: measured here, the rows sharing one set of inputs."""
    from quant.arch import model_spec
    from quant.pipeline import quant_inputs, run_quantization

    todo = wanted(size)
    if size == "full":
        found = runs()
        if why := missing():
            raise ValueError(f"figure {SPEC.name}: {why}")
        df = pd.DataFrame([row(found[k][1], k[1]) for k in todo])
        df.attrs["runs"] = sorted({str(found[k][0].parent) for k in todo})
        return df
    spec, qs = model_spec(MODEL), settings(size)
    inputs = quant_inputs(spec, qs)
    rows = [row(run_quantization(spec, m, b, float(b), qs, None, inputs).metrics, b)
            for m, b in progress(todo, "quantize + evaluate")]
    return pd.DataFrame(rows)


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
    if df.attrs.get("runs"):
        note(fig, "runs of experiments.quantize in " + ", ".join(
            str(Path(r).relative_to(ROOT)) if Path(r).is_relative_to(ROOT) else r for r in df.attrs["runs"]))
