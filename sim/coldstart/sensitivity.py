"""Sensitivity of the simulated cold start to every parameter without a source (docs/coldstart.md "Assumptions").

The assumed parameters are read from the device profile itself: every value whose YAML comment says `assumed`
(`conf/device/<device>.yaml`), plus the modelling assumptions that are not profile values (NPU driver slots, the
EdgeFlow thread split, the restore cost per byte) and llama.cpp's own costs, which were measured on the project's
host but not on a phone (`planner.peer_costs.PeerCosts`' `llamacpp_fixed_s`, `llamacpp_repack_gbps`: a phone has
none, `NO_PEER_COSTS`, the choice that favours the llama.cpp baseline). For each, every framework's TTFT is simulated
with the parameter at ½× and 2× (or under the alternative assumption) at two prompt lengths; the default is the
conservative choice.

    python -m sim.coldstart.sensitivity               # markdown table (Llama3-8B, Xiaomi 15 Pro, 5 bits), modelled
    python -m experiments.coldstart_sensitivity       # the same rows into a run directory -> docs/results/ page
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable

from planner.device import SocProfile
from planner.framework import FrameworkSpec
from planner.peer_costs import NO_PEER_COSTS, PeerCosts
from planner.workload import WorkloadSpec
from quant.arch import model_spec
from sim.coldstart.run import ColdStartSettings, run_one
from sim.coldstart.sweep import CONF, load_conf

FRAMEWORKS = ("llamacpp", "mnn", "llmnpu_plus", "ef_pack", "ef_pipe", "edgeflow")
WORKLOADS = ("lambada", "mmlu")
FACTORS = (0.5, 2.0)
POWER_KEYS = ("power_",)     # energy only: no effect on TTFT
BASELINE, OURS = "llamacpp", "edgeflow"     # the speed-up column: BASELINE's TTFT / OURS'


def assumed_keys(device: str) -> list[str]:
    """Profile keys whose YAML comment marks them `assumed` (power excluded: it does not move TTFT)."""
    keys = []
    for line in (CONF / "device" / f"{device}.yaml").read_text().splitlines():
        m = re.match(r"^(\w+):\s*[^#]*#.*\bassumed\b", line)
        if m and not m.group(1).startswith(POWER_KEYS):
            keys.append(m.group(1))
    return keys


# (device, framework, peer costs) -> the same under the variant
Variant = Callable[[SocProfile, FrameworkSpec, PeerCosts], tuple[SocProfile, FrameworkSpec, PeerCosts]]

# llama.cpp's own code outside weight reads and matmuls (planner/pipeline/cpu_plan.py step 1, 3, 4), measured on the
# project's host by hil.calibrate_peer (llama-cpp-python 0.3.16, 2 threads, warm files; docs/hil.md "The llama.cpp
# policy"; the host of docs/results/host-protocol-peer-amd-epyc-family-26-model-2.md): medians over 6 files
# (SmolLM2-135M and the synthetic 1B, Q8_0 / Q4_0 / Q4_K_M) of the model open (52.9 ms: GGUF metadata, 49,152-token
# vocabulary parse, Llama()'s own set-up), the context (1.3 ms) and the first eval's intercept (1.3 ms).
HOST_LLAMACPP_FIXED_S = 0.0554      # s, measured (sum of the three medians)
HOST_CPU_GHZ = 2.596                # GHz, measured: that host's nominal clock (/proc/cpuinfo), where it ran
# ggml-cpu's repack layouts in llama.cpp 0.3.16 (the version the policy models): the repack traits compiled into its
# libggml-cpu are q4_0 4x4 / 4x8 / 8x8, q4_K 8x8, q2_K 8x8 and iq4_nl 4x4 / 8x8 (ggml/src/ggml-cpu/repack.cpp,
# ggml_repack_get_optimal_repack_type); on ARM with i8mm / dotprod Q4_0 becomes q4_0_4x8 / 4x4 and IQ4_NL iq4_nl_4x4.
# No Q8_0 layout exists in it, so the phone figures' Q8_0 file (conf/framework/llamacpp.yaml) is used as read on any
# CPU. Later llama.cpp adds q8_0_4x8 / 4x4 for ARM (the same function), which this policy does not model.
GGML_REPACK_ARM_0_3_16 = ("Q4_0", "IQ4_NL")


def phone_llamacpp_fixed_s(dev: SocProfile) -> float:
    """s, llama.cpp's fixed part transferred from the host measurement: the open, the vocabulary parse and the graph
    set-up run on one thread, so the host's time is scaled by the clock ratio of the fastest cores (equal work per
    cycle assumed: the profiles carry no scalar IPC; the ½× / 2× rows bracket it)."""
    return HOST_LLAMACPP_FIXED_S * HOST_CPU_GHZ / dev.cpu_big_ghz


def llamacpp_variants(dev: SocProfile) -> list[tuple[str, str, Variant]]:
    """llama.cpp's own costs, which a phone has none of (not measured on a phone; the default favours the llama.cpp
    baseline): its fixed part transferred from the host at ½×, 1× and 2×, and a repack rate."""
    out: list[tuple[str, str, Variant]] = []
    fixed = phone_llamacpp_fixed_s(dev)
    for f in (0.5, 1.0, 2.0):
        out.append(("llamacpp_fixed_s (host, clock-scaled)", f"{f:g}x: {1e3 * f * fixed:.1f} ms",
                    lambda d, fw, p, v=f * fixed: (d, fw, dataclasses.replace(p, llamacpp_fixed_s=v))))
    rate = dev.cpu_copy_gbps             # a repack reads and rewrites every byte it re-lays out, as a copy does
    wt = load_conf("framework", "llamacpp", FrameworkSpec).weight_type
    why = (f"{wt}: repacked on ARM" if wt in GGML_REPACK_ARM_0_3_16
           else f"{wt}: no repack layout in llama.cpp 0.3.16")
    out.append(("llamacpp_repack_gbps", f"{rate:g} GB/s (copy rate); {why}",
                lambda d, fw, p: (d, fw, dataclasses.replace(p, llamacpp_repack_gbps=rate))))
    return out


def variants(device: str) -> list[tuple[str, str, Variant]]:
    """(parameter, variant label, transform) for every assumption; llama.cpp's own costs last."""
    out: list[tuple[str, str, Variant]] = []
    for key in assumed_keys(device):
        for f in FACTORS:
            def t(d, fw, p, key=key, f=f):
                v = getattr(d, key)
                new = max(1, round(v * f)) if isinstance(v, int) else v * f
                if key.endswith("_eff"):                       # an efficiency: at most 1 (perfect scaling)
                    new = min(1.0, new)
                return dataclasses.replace(d, **{key: new}), fw, p
            out.append((key, f"{f:g}x" if not key.endswith("_eff") or f < 1 else "1.0 (perfect)", t))
    out.append(("npu_driver_slots", "2, with 2 restore threads (parallel restore)",
                lambda d, fw, p: (dataclasses.replace(d, npu_driver_slots=2),
                                  dataclasses.replace(fw, graph_threads=2) if fw.graph_threads == 1 else fw, p)))
    for f in FACTORS:
        out.append(("npu_prepare_s_per_gb (restore cost)", f"{f:g}x",
                    lambda d, fw, p, f=f: (dataclasses.replace(d, npu_prepare_s_per_gb=d.npu_prepare_s_per_gb * f), fw,
                                           p)))
    out.append(("EdgeFlow thread split", "4 compute threads (9 threads on 8 cores)",
                lambda d, fw, p: (d, dataclasses.replace(fw, compute_threads=4) if fw.graph_threads == 1 and
                                  fw.policy.startswith(("ef_p", "edgeflow")) and fw.policy != "ef_pack" else fw, p)))
    out.extend(llamacpp_variants(load_conf("device", device, SocProfile)))
    return out


def table(model: str = "llama3_8b", device: str = "xiaomi15pro", bits: float = 5.0,
          frameworks: tuple[str, ...] = FRAMEWORKS, workloads: tuple[str, ...] = WORKLOADS,
          parameters: tuple[str, ...] | None = None) -> list[dict]:
    """One row per (prompt, variant): each framework's TTFT in s (modelled) under the variant; the `(default)` row
    first per prompt. `parameters` keeps only the variants whose parameter name starts with one of them."""
    spec = model_spec(model)                           # the weight source typed (a real model's bits: its weights)
    dev0 = load_conf("device", device, SocProfile)
    vs = [v for v in variants(device) if parameters is None or v[0].startswith(tuple(parameters))]
    rows = []

    def ttft(dev, fws: dict, wl, peers: PeerCosts = NO_PEER_COSTS) -> tuple[dict, int]:
        out = {f: run_one(spec, dev, fw, wl, ColdStartSettings(bits=bits, write_trace=False), peers)[0]
               for f, fw in fws.items()}
        return {f: m["ttft_s"] for f, m in out.items()}, next(iter(out.values()))["prompt_tokens"]

    fws0 = {f: load_conf("framework", f, FrameworkSpec) for f in frameworks}
    for w in workloads:
        wl = load_conf("workload", w, WorkloadSpec)
        base, tokens = ttft(dev0, fws0, wl)
        rows.append({"parameter": "(default)", "variant": "", "workload": w, "prompt_tokens": tokens, **base})
        for key, label, t in vs:
            fws, dev, peers = {}, dev0, NO_PEER_COSTS
            for f, fw in fws0.items():
                dev, fws[f], peers = t(dev0, fw, NO_PEER_COSTS)    # a phone: no peer costs but the variant's
            rows.append({"parameter": key, "variant": label, "workload": w, "prompt_tokens": tokens,
                         **ttft(dev, fws, wl, peers)[0]})
    return rows


def frameworks_of(rows: list[dict]) -> list[str]:
    return [f for f in rows[0] if f not in ("parameter", "variant", "workload", "prompt_tokens")]


def markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table: TTFT in s and its change from the default per framework, and EdgeFlow's
    speed-up over llama.cpp (their TTFT ratio; default -> variant) where both frameworks are in the rows."""
    fws = frameworks_of(rows)
    speedup = BASELINE in fws and OURS in fws
    head = "| parameter | variant | prompt | " + " | ".join(fws) + (f" | {OURS} speed-up over {BASELINE} |"
                                                                  if speedup else " |")
    lines = [head, "|" + "---|" * (3 + len(fws) + speedup)]
    base = {r["workload"]: r for r in rows if r["parameter"] == "(default)"}
    for r in rows:
        b, cells = base[r["workload"]], []
        for f in fws:
            cells.append(f"{r[f]:.2f}" if r is b else f"{r[f]:.2f} ({100 * (r[f] - b[f]) / b[f]:+.1f} %)")
        if speedup:
            s0, s1 = b[BASELINE] / b[OURS], r[BASELINE] / r[OURS]
            cells.append(f"{s0:.2f}x" if r is b else f"{s0:.2f}x -> {s1:.2f}x")
        lines.append(f"| {r['parameter']} | {r['variant']} | {r['workload']} ({r['prompt_tokens']} tok) | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(table()))
