"""In-process sweeps of the cold-start study (frameworks x workloads x bit budgets) and the TTFT table of the docs.

The Hydra app with `-m` runs the same grid as separate jobs (joblib launcher); this module is the fast path for the
benchmark and for regenerating `docs/coldstart.md`'s table:

    python -m sim.coldstart.sweep                 # prints the Llama3-8B / xiaomi15pro tables (bits = 5) and plots TTFT
    python -m sim.coldstart.sweep collect <dir>   # TTFT tables of a Hydra `-m` sweep's metrics.json files
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from omegaconf import OmegaConf

from planner.device import SocProfile
from planner.framework import FrameworkSpec
from planner.workload import WorkloadSpec
from quant.arch import ModelSpec
from sim.coldstart.run import ColdStartSettings, run_one

CONF = Path(__file__).resolve().parents[2] / "conf"
WORKLOADS = ("lambada", "winogrande", "obqa", "mmlu", "hellaswag")
MAIN_FRAMEWORKS = ("llamacpp", "mnn", "llmnpu", "llmnpu_plus", "edgeflow")
ALL_FRAMEWORKS = ("llamacpp", "mnn", "llmnpu", "llmnpu_mat", "llmnpu_plus", "ef_mixed", "ef_pack", "ef_pipe",
                  "ef_place", "ef_priority", "edgeflow")
BITS = (4.0, 5.0, 6.0, 8.0)


def load_conf(group: str, name: str, cls: type):
    path = CONF / group / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no config {group}/{name}.yaml")
    doc = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path)).items() if k != "defaults"}
    return cls(**doc)


def sweep(model: str = "llama3_8b", device: str = "xiaomi15pro", frameworks: Iterable[str] = MAIN_FRAMEWORKS,
          workloads: Iterable[str] = WORKLOADS, bits: Iterable[float] = (5.0,), **settings: Any) -> list[dict]:
    spec = load_conf("model", model, ModelSpec)
    dev = load_conf("device", device, SocProfile)
    rows = []
    for fw_name in frameworks:
        fw = load_conf("framework", fw_name, FrameworkSpec)
        for wl_name in workloads:
            wl = load_conf("workload", wl_name, WorkloadSpec)
            for b in bits:
                m, _ = run_one(spec, dev, fw, wl, ColdStartSettings(bits=b, write_trace=False, **settings))
                rows.append(m)
    return rows


def collect(root: Path) -> list[dict]:
    """metrics.json of every job under a Hydra multirun directory (`-m` sweep of experiments.coldstart)."""
    import json

    files = sorted(Path(root).rglob("metrics.json"))
    if not files:
        raise FileNotFoundError(f"no metrics.json under {root}")
    return [json.loads(f.read_text()) for f in files]


def markdown_table(rows: list[dict], value: str = "ttft_s", fmt: str = "{:.2f}") -> str:
    """frameworks (rows) x workloads (columns) of `value`."""
    toks = {r["workload"]: r["prompt_tokens"] for r in rows}
    wls = sorted(dict.fromkeys(r["workload"] for r in rows), key=lambda w: toks[w])
    known = {f: i for i, f in enumerate(ALL_FRAMEWORKS)}
    fws = sorted(dict.fromkeys(r["framework"] for r in rows), key=lambda f: known.get(f, len(known)))
    cell = {(r["framework"], r["workload"]): r[value] for r in rows}
    head = "| framework | " + " | ".join(f"{w} ({toks[w]} tok)" for w in wls) + " |"
    lines = [head, "|---" * (len(wls) + 1) + "|"]
    for f in fws:
        lines.append(f"| {f} | " + " | ".join(fmt.format(cell[(f, w)]) if cell.get((f, w)) is not None else "–"
                                            for w in wls) + " |")
    return "\n".join(lines)


def plot_ttft(rows: list[dict], path: Path, title: str = "") -> Path:
    """Grouped bars: TTFT (s, log scale) per framework for each workload; written atomically as PNG."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from quant.atomic import atomic_write_bytes

    wls = list(dict.fromkeys(r["workload"] for r in rows))
    fws = list(dict.fromkeys(r["framework"] for r in rows))
    cell = {(r["framework"], r["workload"]): r["ttft_s"] for r in rows}
    fig, ax = plt.subplots(figsize=(11, 5))
    width = 0.8 / len(fws)
    colors = plt.get_cmap("tab20").colors
    for i, f in enumerate(fws):
        ax.bar([j + i * width for j in range(len(wls))], [cell[(f, w)] for w in wls], width, label=f,
               color=colors[i % len(colors)])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(wls))], wls)
    ax.set_yscale("log")
    ax.set_ylabel("simulated TTFT (s, modelled)")
    ax.set_title(title)
    ax.legend(ncol=6, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "collect":      # python -m sim.coldstart.sweep collect multirun/<dir>
        rows = collect(Path(sys.argv[2]))
        for b in sorted({r["bits"] for r in rows}):
            print(f"\nttft_s, bits = {b:g}\n" + markdown_table([r for r in rows if r["bits"] == b]))
        raise SystemExit(0)
    rows = sweep(frameworks=ALL_FRAMEWORKS)
    for key in ("ttft_s", "load_s", "prefill_s", "cpu_bubble_rate", "npu_bubble_rate", "energy_j", "peak_mem_gb"):
        print(f"\n{key}\n" + markdown_table(rows, key))
    out = plot_ttft(rows, CONF.parent / "outputs" / "coldstart" / "ttft_llama3_8b_xiaomi15pro.png",
                    "Llama3-8B cold start on the Xiaomi 15 Pro profile, bits = 5 (simulated)")
    print(f"\nplot: {out}")
