"""One cold-start study run from typed inputs: plan -> simulate -> metrics (+ Chrome trace). Used by the Hydra app
`experiments.coldstart`, the sweep table and the benchmarks; never sees a DictConfig."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from planner.cost import make_cost_model
from planner.critical_path import critical_path
from planner.device import SocProfile
from planner.framework import FrameworkSpec
from planner.peer_costs import NO_PEER_COSTS, PeerCosts
from planner.workload import WorkloadSpec
from quant.arch import ModelSpec
from sim.coldstart import ColdStartInputs, run_coldstart
from sim.trace import timeline_trace

MAX_PROMPT_TOKENS = 32_768     # documented maximum of prompt_tokens (the largest workload is ~1k tokens)
MAX_SEED = 2**32 - 1

# metrics.json labels (experiments.common.write_run_outputs): numbers the simulation / plan produce, and the run's
# settings echoed next to them (the prompt length, from prompt_tokens or the workload, and the bit budget)
MODELLED = ("ttft_s", "setup_s", "load_s", "unpack_s", "graph_s", "prefill_s", "cpu_busy_s", "npu_busy_s",
            "cpu_bubble_rate", "npu_bubble_rate", "stolen_ops", "peak_mem_gb", "mem_headroom_gb", "energy_j",
            "bytes_read", "n_tasks", "flash_bytes", "steal_threshold", "critical_path")
INPUTS = ("prompt_tokens", "bits")


@dataclass
class ColdStartSettings:
    bits: float = 5.0              # average bit budget per weight (EdgeFlow allocation; llama.cpp's nearest type)
    prompt_tokens: int = 0         # > 0 overrides the workload's prompt length
    seed: int = 0                  # twin sampling seed
    cost_model: str = "analytic"   # analytic | table
    cost_table: str = ""           # measured profile JSON for cost_model=table
    bits_source: str = "auto"      # auto | real | twin | uniform
    preloaded_gb: float = 0.0      # GB of weights already in memory (prefetched, EdgeFlow Fig. 2)
    write_trace: bool = True       # write trace.json

    def __post_init__(self) -> None:
        for f in fields(self):   # the app's top-level keys have no structured schema: check types here
            v, want = getattr(self, f.name), type(f.default)
            if want is float and isinstance(v, int) and not isinstance(v, bool):
                setattr(self, f.name, float(v))
            elif not isinstance(v, want) or (want is not bool and isinstance(v, bool)):
                raise ValueError(f"{f.name} must be {'a number' if want is float else want.__name__} (got {v!r})")
            if want is float and not math.isfinite(getattr(self, f.name)):
                raise ValueError(f"{f.name} must be a finite number (got {v!r})")
        if not 1 <= self.bits <= 8:
            raise ValueError(f"bits must be in 1..8 (got {self.bits})")
        if not 0 <= self.preloaded_gb <= 1024:
            raise ValueError(f"preloaded_gb must be in [0, 1024] (got {self.preloaded_gb})")
        if not 0 <= self.prompt_tokens <= MAX_PROMPT_TOKENS:
            raise ValueError(f"prompt_tokens must be in 0..{MAX_PROMPT_TOKENS} (got {self.prompt_tokens})")
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be in 0..{MAX_SEED} (got {self.seed})")
        if self.cost_model not in ("analytic", "table"):
            raise ValueError(f"cost_model must be analytic or table (got {self.cost_model!r})")
        if self.bits_source not in ("auto", "real", "twin", "uniform"):
            raise ValueError(f"bits_source must be auto, real, twin or uniform (got {self.bits_source!r})")


def run_one(model: ModelSpec, device: SocProfile, framework: FrameworkSpec, workload: WorkloadSpec | None,
            s: ColdStartSettings, peers: PeerCosts = NO_PEER_COSTS) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Returns (flat metrics, Chrome trace document or None). `peers`: llama.cpp's and MNN's own costs for their
    policies (a phone: none, `NO_PEER_COSTS`)."""
    tokens = s.prompt_tokens or (workload.prompt_tokens if workload else 0)
    if tokens <= 0:
        raise ValueError("prompt_tokens: give a workload or prompt_tokens > 0")
    cost = make_cost_model(s.cost_model, device, s.cost_table, peers)
    x = ColdStartInputs(model, device, framework, cost, tokens, s.bits, s.seed, s.bits_source,
                        int(s.preloaded_gb * 1e9), peers=peers)
    plan, tl, m = run_coldstart(x)
    out: dict[str, Any] = {
        "framework": framework.name, "model": model.name, "device": device.name,
        "workload": f"prompt_tokens={tokens}" if s.prompt_tokens or workload is None else workload.name,
        "prompt_tokens": tokens, "bits": s.bits,
    }
    out.update(m)
    info = plan.info
    out["flash_bytes"] = int(info.get("flash_bytes", m["bytes_read"]))
    out["steal_threshold"] = int(info.get("steal_threshold", plan.schedule.steal_threshold))
    out["critical_path"] = critical_path(tl).to_json()     # per phase: seconds / share per resource, the bound
    if "bits_source" in info:
        out["bits_source"] = info["bits_source"]
        for k, v in info["bits_hist"].items():
            out[f"bits_frac_{k}"] = v
    if "ggml_type" in info:
        out["weight_format"] = info["ggml_type"]
    elif "recipe" in info:
        out["weight_format"] = info["recipe"]["fmt"]
    else:
        out["weight_format"] = "int8"
    return out, (timeline_trace(tl) if s.write_trace else None)


def modelled_keys(metrics: dict[str, Any]) -> list[str]:
    """Keys of `run_one`'s metrics that are modelled: simulated times, rates, bytes, and the plan's bit histogram."""
    return [k for k in metrics if k in MODELLED or k.startswith("bits_frac_")]


def input_keys(metrics: dict[str, Any]) -> list[str]:
    """Keys of `run_one`'s metrics that echo the run's inputs (prompt length, bit budget): neither measured nor
    modelled."""
    return [k for k in metrics if k in INPUTS]
