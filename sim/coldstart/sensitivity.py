"""Sensitivity of the simulated cold start to every parameter without a source (docs/coldstart.md "Assumptions").

The assumed parameters are read from the device profile itself: every value whose YAML comment says `assumed`
(`conf/device/<device>.yaml`), plus the modelling assumptions that are not profile values (NPU driver slots, the
EdgeFlow thread split, the restore cost per byte). For each, every framework's TTFT is simulated with the parameter at
½× and 2× (or under the alternative assumption) at two prompt lengths; the default is the conservative choice.

    python -m sim.coldstart.sensitivity               # markdown table (Llama3-8B, Xiaomi 15 Pro, 5 bits), modelled
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable

from planner.device import SocProfile
from planner.framework import FrameworkSpec
from planner.workload import WorkloadSpec
from quant.arch import ModelSpec
from sim.coldstart.run import ColdStartSettings, run_one
from sim.coldstart.sweep import CONF, load_conf

FRAMEWORKS = ("llamacpp", "mnn", "llmnpu_plus", "ef_pack", "ef_pipe", "edgeflow")
WORKLOADS = ("lambada", "mmlu")
FACTORS = (0.5, 2.0)
POWER_KEYS = ("power_",)     # energy only: no effect on TTFT


def assumed_keys(device: str) -> list[str]:
    """Profile keys whose YAML comment marks them `assumed` (power excluded: it does not move TTFT)."""
    keys = []
    for line in (CONF / "device" / f"{device}.yaml").read_text().splitlines():
        m = re.match(r"^(\w+):\s*[^#]*#.*\bassumed\b", line)
        if m and not m.group(1).startswith(POWER_KEYS):
            keys.append(m.group(1))
    return keys


Variant = Callable[[SocProfile, FrameworkSpec], tuple[SocProfile, FrameworkSpec]]


def variants(device: str) -> list[tuple[str, str, Variant]]:
    """(parameter, variant label, transform) for every assumption."""
    out: list[tuple[str, str, Variant]] = []
    for key in assumed_keys(device):
        for f in FACTORS:
            def t(d, fw, key=key, f=f):
                v = getattr(d, key)
                new = max(1, round(v * f)) if isinstance(v, int) else v * f
                if key.endswith("_eff"):                       # an efficiency: at most 1 (perfect scaling)
                    new = min(1.0, new)
                return dataclasses.replace(d, **{key: new}), fw
            out.append((key, f"{f:g}x" if not key.endswith("_eff") or f < 1 else "1.0 (perfect)", t))
    out.append(("npu_driver_slots", "2, with 2 restore threads (parallel restore)",
                lambda d, fw: (dataclasses.replace(d, npu_driver_slots=2),
                               dataclasses.replace(fw, graph_threads=2) if fw.graph_threads == 1 else fw)))
    for f in FACTORS:
        out.append(("npu_prepare_s_per_gb (restore cost)", f"{f:g}x",
                    lambda d, fw, f=f: (dataclasses.replace(d, npu_prepare_s_per_gb=d.npu_prepare_s_per_gb * f), fw)))
    out.append(("EdgeFlow thread split", "4 compute threads (9 threads on 8 cores)",
                lambda d, fw: (d, dataclasses.replace(fw, compute_threads=4) if fw.graph_threads == 1 and
                               fw.policy.startswith(("ef_p", "edgeflow")) and fw.policy != "ef_pack" else fw)))
    return out


def table(model: str = "llama3_8b", device: str = "xiaomi15pro", bits: float = 5.0) -> list[dict]:
    spec = load_conf("model", model, ModelSpec)
    dev0 = load_conf("device", device, SocProfile)
    rows = []

    def ttft(dev, fws: dict, wl) -> dict:
        return {f: run_one(spec, dev, fw, wl, ColdStartSettings(bits=bits, write_trace=False))[0]["ttft_s"]
                for f, fw in fws.items()}

    fws0 = {f: load_conf("framework", f, FrameworkSpec) for f in FRAMEWORKS}
    for w in WORKLOADS:
        wl = load_conf("workload", w, WorkloadSpec)
        base = ttft(dev0, fws0, wl)
        rows.append({"parameter": "(default)", "variant": "", "workload": w, **base})
        for key, label, t in variants(device):
            fws, dev = {}, dev0
            for f, fw in fws0.items():
                dev, fws[f] = t(dev0, fw)
            rows.append({"parameter": key, "variant": label, "workload": w, **ttft(dev, fws, wl)})
    return rows


def markdown(rows: list[dict]) -> str:
    head = "| parameter | variant | prompt | " + " | ".join(FRAMEWORKS) + " |"
    lines = [head, "|" + "---|" * (3 + len(FRAMEWORKS))]
    base = {r["workload"]: r for r in rows if r["parameter"] == "(default)"}
    for r in rows:
        cells = []
        for f in FRAMEWORKS:
            b = base[r["workload"]][f]
            cells.append(f"{r[f]:.2f}" if r is base[r["workload"]] else f"{r[f]:.2f} ({100 * (r[f] - b) / b:+.0f} %)")
        lines.append(f"| {r['parameter']} | {r['variant']} | {r['workload']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(table()))
