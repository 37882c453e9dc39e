"""Voltron helpers of the figure modules: one simulated conversation of a planner on a cluster under an RSSI trace,
with the planner context (latency regression fit, importance) built once per (cluster, model) and reused — the same
calls as `sim.multidevice.report`; each conversation is simulated once per process (`figure=all` shares it between
figures). All numbers are modelled except plan times (measured on this host)."""
from __future__ import annotations

import copy
import dataclasses
from functools import lru_cache

import numpy as np
import pandas as pd

from planner.voltron.accuracy import BASE_MMLU, FAMILIES
from planner.voltron.devices import load_cluster
from planner.voltron.policy import PlannerConfig
from planner.voltron.registry import make_policy
from planner.voltron.rssi import RssiTable
from quant.arch import model_spec
from sim.multidevice.runner import RunResult, build_run_context, run_conversation
from sim.multidevice.squeeze import Squeeze, trace_config
from sim.multidevice.workload import WorkloadConfig
from sim.wireless import RssiTrace, TraceConfig

__all__ = ["BASE_MMLU", "FAMILIES", "QOS_TPOT_MS", "QOS_TTFT_S", "context", "conversation", "trace", "largest",
           "summary", "qos_line", "gapped"]

QOS_TPOT_MS = 1e3 * PlannerConfig().qos_tpot_s      # ms, the planners' TPOT target (Voltron §5.1.3)
QOS_TTFT_S = PlannerConfig().qos_ttft_s             # s, the planners' TTFT target (Voltron §5.1.3)

KEYS = ("ttft_s", "ttft_s_max", "tpot_ms_p50", "tpot_ms_p99", "qos_tpot_violation_rate", "accuracy_proxy",
        "energy_mj_per_token", "replans")


def summary(res: RunResult, keys=KEYS) -> dict:
    """The run's modelled metrics of interest (None -> NaN) plus `oom` as 0/1."""
    out = {k: float("nan") if res.metrics.get(k) is None else float(res.metrics[k]) for k in keys}
    out["oom"] = float(bool(res.metrics["oom"]))
    return out


@lru_cache(maxsize=8)
def trace(name: str) -> RssiTrace:
    return RssiTrace.load(TraceConfig(name=name, csv=f"{name}.csv"))


@lru_cache(maxsize=8)
def squeeze(name: str) -> Squeeze:
    """The trace's compute / goodput squeeze (conf/trace/<name>.yaml `squeeze_csv`; none for most traces)."""
    return Squeeze.load(trace_config(name))


@lru_cache(maxsize=32)
def context(cluster: str, model: str, seed: int):
    # the planner profiles the simulated devices, as in every simulated run (sim.multidevice.runner)
    return build_run_context(model_spec(model), load_cluster(cluster), PlannerConfig(), seed)


_RUNS: dict[str, RunResult] = {}     # repr of the run's configuration -> its one simulated conversation
COUNTS = {"simulated": 0, "reused": 0}      # conversations simulated / answered from `_RUNS` in this process


def conversation(cluster: str, model: str, planner: str, trace_name: str, turns: int, seed: int = 0,
                 balance: str = "hetero", think_s: float | None = None, **planner_cfg) -> RunResult:
    """`sim.multidevice.runner.run_conversation` of one planner (`planner.voltron.registry` name); `planner_cfg`
    overrides other `PlannerConfig` fields (ablations, energy mode). Simulated once per process per configuration
    (cluster, model and trace by name, the typed `PlannerConfig` and `WorkloadConfig`, seed); a reused run is a copy
    of the first, so its measured plan times are those of the first run."""
    cfg = PlannerConfig(name=planner, balance=balance, **planner_cfg)
    wl = WorkloadConfig(turns=turns, seed=seed, **({} if think_s is None else {"think_s": think_s}))
    key = repr((cluster, model, trace_name, seed, cfg, wl))
    if key in _RUNS:
        COUNTS["reused"] += 1
    else:
        COUNTS["simulated"] += 1
        base, _acc = context(cluster, model, seed)
        ctx = dataclasses.replace(base, cfg=cfg)
        _RUNS[key] = run_conversation(make_policy(ctx), ctx, trace(trace_name), RssiTable(), wl, seed=seed,
                                      squeeze=squeeze(trace_name))
    return copy.deepcopy(_RUNS[key])


def qos_line(ax, value: float = QOS_TPOT_MS, what: str = "TPOT", vertical: bool = False) -> None:
    """The QoS target as a dotted line across a TPOT (or TTFT) axis, labelled for the legend."""
    unit = "ms" if what == "TPOT" else "s"
    kw = dict(color="k", ls=":", lw=1, label=f"{what} QoS target ({value:g} {unit})")
    (ax.axvline if vertical else ax.axhline)(value, **kw)


def gapped(d: pd.DataFrame, factor: float = 20.0) -> tuple[np.ndarray, np.ndarray]:
    """(time, value) with a NaN wherever the decode steps pause (think time, prefill) for more than `factor` median
    steps, so a line does not draw a trend across a gap where nothing was decoded."""
    t, v = d.time_s.to_numpy(float), d.value.to_numpy(float)
    if len(t) < 3:
        return t, v
    gap = np.flatnonzero(np.diff(t) > factor * np.median(np.diff(t))) + 1
    return np.insert(t, gap, np.nan), np.insert(v, gap, np.nan)


def largest(family: str) -> str:
    """The family's model with the highest published base score (the accuracy ceiling)."""
    return max(FAMILIES[family], key=lambda m: BASE_MMLU[m])
