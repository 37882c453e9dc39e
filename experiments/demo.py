"""`make demo`: the main job on its embedded defaults (docs/design.md §9), end to end, in a few minutes.

1. Real SmolLM2-135M quantization: each method of `demo.quantize.methods` runs `experiments.quantize` (real weights,
   real perplexity/KL — measured).
2. Simulated Llama3-8B cold start on the Xiaomi 15 Pro profile for every framework and workload (modelled).
3. A Voltron plan over an RSSI trace on the Office cluster, against the MP/TP/single-device baselines (modelled).
4. Hardware in the loop on this host: `experiments.validate` predicts each framework's SmolLM2 cold start with the
   measured host profile and runs the same plan for real (page cache evicted): predicted vs measured TTFT and phases,
   EdgeFlow's host speed-up over each baseline plan, and llama.cpp's cold TTFT on the same model and prompt when the
   `peer` extra is installed (docs/hil.md).

Each app runs as its own process with its own run directory under `out_dir`, so every piece leaves the same
`metrics.json` + `config.yaml` a user would get by running it by hand. The demo then prints a summary and writes
`report.md` with figures into `out_dir`.
"""
from __future__ import annotations

import ctypes
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from experiments.common import SIZE_LIMITS, check_name, finite, group_options, int_in, one_line_errors, precheck, typed
from quant.atomic import atomic_write_json, atomic_write_text


@dataclass
class DemoQuantize:
    methods: list[str] = field(default_factory=lambda: ["edgeflow", "int8", "int4"])
    bits: int = 4
    overrides: list[str] = field(default_factory=list)


@dataclass
class DemoColdstart:
    model: str = "llama3_8b"
    device: str = "xiaomi15pro"
    bits: float = 5.0


@dataclass
class DemoMultidevice:
    cluster: str = "office"
    model: str = "qwen2_5_14b"
    trace: str = "walk_away_disconnect"
    planners: list[str] = field(default_factory=lambda: ["voltron", "mp", "tp", "single"])
    turns: int = 3
    think_s: float = 20.0              # s between turns (LMSYS-like default 20 s)


@dataclass
class DemoHost:
    frameworks: list[str] = field(default_factory=lambda: ["edgeflow", "llamacpp", "mnn", "llmnpu_plus"])
    bits: int = 5
    prompt_tokens: int = 128
    repeats: int = 3
    peer: str = "auto"                 # auto: llama.cpp beside EdgeFlow when the `peer` extra is installed | none


@dataclass
class DemoConfig:
    out_dir: str = "outputs/demo"
    quantize: DemoQuantize = field(default_factory=DemoQuantize)
    coldstart: DemoColdstart = field(default_factory=DemoColdstart)
    multidevice: DemoMultidevice = field(default_factory=DemoMultidevice)
    host: DemoHost = field(default_factory=DemoHost)

    def __post_init__(self) -> None:
        from quant.methods import METHODS

        if not isinstance(self.out_dir, str) or not self.out_dir.strip() or "\0" in self.out_dir:
            raise ValueError(f"out_dir: must be a directory path (got {self.out_dir!r})")
        if Path(self.out_dir).exists() and not Path(self.out_dir).is_dir():
            raise ValueError(f"out_dir: {self.out_dir} exists and is not a directory")
        if not 1 <= self.quantize.bits <= 8:
            raise ValueError(f"quantize.bits must be in 1..8 (got {self.quantize.bits})")
        for m in self.quantize.methods:          # each names a run directory under out_dir/quantize
            check_name(m, "quantize.methods")
            if m not in METHODS:
                raise ValueError(f"quantize.methods: {m!r} is not a method ({', '.join(sorted(METHODS))})")
        c, d = self.coldstart, self.multidevice
        finite(c.bits, "coldstart.bits", 1, 8)
        for key, val, group in (("coldstart.model", c.model, "model"), ("coldstart.device", c.device, "device"),
                                ("multidevice.cluster", d.cluster, "cluster"), ("multidevice.model", d.model, "model"),
                                ("multidevice.trace", d.trace, "trace"),
                                *(("multidevice.planners", p, "planner") for p in d.planners)):
            if val not in group_options(group):
                raise ValueError(f"{key}: {val!r} is not a {group} config ({', '.join(group_options(group))})")
        int_in(d.turns, "multidevice.turns", 1, SIZE_LIMITS["turns"])
        finite(d.think_s, "multidevice.think_s", 0, 1e6)
        h = self.host
        for f in h.frameworks:
            check_name(f, "host.frameworks")
            if f not in group_options("framework"):
                raise ValueError(f"host.frameworks: {f!r} is not a framework config")
        int_in(h.bits, "host.bits", 1, 8)
        int_in(h.prompt_tokens, "host.prompt_tokens", 1, 1024)
        int_in(h.repeats, "host.repeats", 1, 50)
        if h.peer not in ("auto", "none"):
            raise ValueError(f"host.peer: must be auto or none (got {h.peer!r})")


ConfigStore.instance().store(name="demo_schema", node=DemoConfig)


PR_SET_PDEATHSIG = 1                          # linux/prctl.h


def _die_with_parent() -> None:
    """In the child, before exec: Linux sends it SIGTERM when the demo ends in any way, SIGKILL included, so a
    killed demo leaves no app running (subprocess.run already kills the child when the demo raises)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):        # not Linux: the parent's exception path still kills the child
        pass


def _app(module: str, run_dir: Path, args: list[str]) -> dict:
    """Run one Hydra app as a subprocess into `run_dir`; return its metrics.json."""
    cmd = [sys.executable, "-m", module, *args, f"hydra.run.dir={run_dir}"]
    print(f"  $ {' '.join(cmd[2:])}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=_die_with_parent)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    print(f"    done in {time.perf_counter() - t0:.1f} s", flush=True)
    return json.loads((run_dir / "metrics.json").read_text())


def _fmt(v, nd: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def _md_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def run_demo(cfg: DemoConfig) -> dict:
    out = Path(cfg.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    report: list[str] = ["# Demo report", "",
                         "Every number is labelled: **measured** on this machine, or **modelled** (simulation, "
                         "cost model, size estimate).", ""]
    summary: dict = {}

    # 1. Real-model quantization (measured accuracy) --------------------------------------------------------------
    print(f"[1/4] quantize SmolLM2-135M (real weights): {', '.join(cfg.quantize.methods)} at {cfg.quantize.bits} bits")
    qrows = []
    for m in cfg.quantize.methods:
        met = _app("experiments.quantize", out / "quantize" / m,
                   [f"method={m}", f"bits={cfg.quantize.bits}", *cfg.quantize.overrides])
        qrows.append([m, met["avg_bits"], met["ppl"], met["ref_ppl"], met["kl_mean"], met["model_bytes"] / 1e6])
        summary[f"quantize.{m}"] = met
    report += [f"## 1. SmolLM2-135M quantization at {cfg.quantize.bits} bits (real model)", "",
               "ppl / KL are measured (NumPy reference forward, static per-tensor INT8 activations); model MB is a "
               "modelled size estimate of the packed file.", "",
               _md_table(["method", "avg bits", "ppl (measured)", "ref ppl (measured)", "KL (measured)",
                          "model MB (modelled)"], qrows), ""]

    # 2. Simulated cold start ---------------------------------------------------------------------------------------
    from sim.coldstart.sweep import ALL_FRAMEWORKS, markdown_table, plot_ttft, sweep

    c = cfg.coldstart
    print(f"[2/4] simulate cold start: {c.model} on {c.device}, every framework x workload, {c.bits} bits", flush=True)
    t0 = time.perf_counter()
    rows = sweep(model=c.model, device=c.device, frameworks=ALL_FRAMEWORKS, bits=(c.bits,))
    print(f"    {len(rows)} simulations in {time.perf_counter() - t0:.1f} s", flush=True)
    fig = plot_ttft(rows, out / "coldstart_ttft.png", title=f"{c.model} on {c.device}, {c.bits:g} bits (simulated)")
    atomic_write_json(out / "coldstart_rows.json", rows)
    summary["coldstart"] = {f"{r['framework']}.{r['workload']}.ttft_s": r["ttft_s"] for r in rows}
    report += [f"## 2. Cold start of {c.model} on {c.device} (modelled: SimPy simulation)", "",
               "TTFT in seconds (simulated), every framework x workload:", "", markdown_table(rows), "",
               f"![TTFT]({fig.name})", ""]

    # 3. Voltron over an RSSI trace ---------------------------------------------------------------------------------
    d = cfg.multidevice
    print(f"[3/4] multi-device: {d.model} on {d.cluster}, trace {d.trace}: {', '.join(d.planners)}", flush=True)
    mrows = []
    for p in d.planners:
        met = _app("experiments.multidevice", out / "multidevice" / p,
                   [f"cluster={d.cluster}", f"model={d.model}", f"planner={p}", f"trace={d.trace}",
                    f"turns={d.turns}", f"workload.think_s={d.think_s}"])
        mrows.append([p, met["ttft_s"], met["qos_ttft_ok"], met["tpot_ms_p50"], met["tpot_ms_p99"],
                      met["qos_tpot_violation_rate"], met["accuracy_proxy"], met["replans"], met["oom"]])
        summary[f"multidevice.{p}"] = met
    from sim.multidevice.report import figure

    fig2 = Path(figure(d.trace, d.cluster, d.model, d.turns, out, think_s=d.think_s)["figure"])
    report += [f"## 3. {d.model} on the {d.cluster} cluster under RSSI trace `{d.trace}` (modelled)", "",
               "QoS: TTFT ≤ 10 s, TPOT ≤ 400 ms. All values simulated; accuracy is a proxy (docs/multidevice.md).", "",
               _md_table(["planner", "TTFT s", "TTFT QoS ok", "TPOT p50 ms", "TPOT p99 ms", "TPOT QoS violations",
                          "accuracy proxy", "re-plans", "OOM"], mrows), "", f"![timeline]({fig2.name})", ""]

    report += _host_section(cfg.host, out, summary)
    atomic_write_text(out / "report.md", "\n".join(report))
    atomic_write_json(out / "summary.json", summary)
    print("\n" + "\n".join(report[6:]).replace("![", "figure: ["))
    print(f"\nreport: {out / 'report.md'}")
    return summary


def _peer_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def _exact(met: dict) -> str:
    return {True: "yes", False: "NO"}.get(met.get("logits_native_exact"), "n/a")


def _top1(met: dict) -> str:
    if met.get("logits_top1_match"):
        return "yes"
    return "no (undecidable: the reference's own top-1 flips under 1-ulp noise)" \
        if not met.get("logits_ref_top1_stable", True) else "no"


def _host_section(h: DemoHost, out: Path, summary: dict) -> list[str]:
    """4. Host HIL: each framework's SmolLM2 plan predicted (modelled) and run cold on this host (measured)."""
    print(f"[4/4] host cold start, predicted vs measured: smollm2_135m, {', '.join(h.frameworks)}, {h.bits} bits, "
          f"{h.prompt_tokens} tokens, {h.repeats} cold runs each", flush=True)
    peer = h.peer == "auto" and _peer_installed()
    rows, ttft = [], {}
    for f in h.frameworks:
        args = [f"framework={f}", f"bits={h.bits}", f"prompt_tokens={h.prompt_tokens}", f"repeats={h.repeats}"]
        if peer and f == "edgeflow":
            args.append("peer=llamacpp")
        met = _app("experiments.validate", out / "host" / f, args)
        summary[f"host.{f}"] = met
        ttft[f] = (met["predicted_ttft_s"], met["measured_ttft_s"])
        rows.append([f, met["predicted_ttft_s"], met["measured_ttft_s"],
                     f"{met['measured_ttft_min_s']:.3f}–{met['measured_ttft_max_s']:.3f}", met["ttft_error_pct"],
                     met["predicted_load_s"], met["measured_load_s"], met["predicted_prefill_s"],
                     met["measured_prefill_s"], _exact(met), _top1(met)])
    lines = ["## 4. Hardware in the loop: SmolLM2-135M cold start on this host, predicted vs measured", "",
             f"{h.bits}-bit EdgeFlow weights (baselines: per-channel INT8), {h.prompt_tokens}-token prompt, page cache "
             f"evicted before each of {h.repeats} cold runs. Predicted = simulator with the measured host profile "
             "(modelled); measured = median (min–max) of the runs; error = (predicted − measured) / measured. "
             "The 'NPU' of the plans is a CPU core on this host (docs/hil.md).", "",
             _md_table(["framework", "TTFT predicted s", "TTFT measured s", "measured min–max", "TTFT error %",
                        "load pred s", "load meas s", "prefill pred s", "prefill meas s",
                        "logits = native-kernel forward", "top-1 = NumPy reference"], rows),
             ""]
    if "edgeflow" in ttft:
        e = ttft["edgeflow"]
        sp = [[f, p / e[0], m / e[1], 100 * ((p / e[0]) - (m / e[1])) / (m / e[1])]
              for f, (p, m) in ttft.items() if f != "edgeflow"]
        if sp:
            lines += ["EdgeFlow's host speed-up over each baseline plan:", "",
                      _md_table(["baseline", "predicted ×", "measured ×", "error %"], sp), ""]
        ef = summary.get("host.edgeflow", {})
        if "peer_ttft_s" in ef:
            lines += [f"llama.cpp ({ef['peer_weight_type']}, llama-cpp-python, same model file family, prompt and "
                      f"eviction; measured in the same run): cold TTFT {ef['peer_ttft_s']:.3f} s vs ours "
                      f"{ef['measured_ttft_s']:.3f} s → {ef['speedup_vs_peer']:.2f}× (measured).", ""]
        else:
            lines += ["llama.cpp peer: not installed (`pip install 'edgellm[peer]'`, ~4 min build); no peer ratio.",
                      ""]
    return lines


@hydra.main(config_path="../conf", config_name="demo", version_base="1.3")
@one_line_errors
def main(cfg: DictConfig) -> None:
    run_demo(typed(cfg, DemoConfig))


def validate(cfg: DictConfig) -> None:
    typed(cfg, DemoConfig)


if __name__ == "__main__":
    precheck("demo", sys.argv[1:], validate)
    main()
