"""Voltron multi-device app (Voltron §4; docs/multidevice.md): plan a model across a cluster and simulate a conversation
under an RSSI trace.

    python -m experiments.multidevice cluster=office model=qwen2_5_14b planner=voltron trace=walk_away turns=5

Writes `metrics.json` (keys in docs/multidevice.md), `config.yaml`, `timeline.csv` (one row per step: time, TPOT,
plan id, precisions, pruned shards, RSSI per link) and `plans.jsonl` (every plan adopted, by plan id) into the Hydra
run directory.
"""
from __future__ import annotations

import sys

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from experiments.common import (
    ConfigError,
    Estimate,
    finite,
    int_in,
    one_line_errors,
    precheck,
    prepare_run_dir,
    register_common,
    run_dir,
    size_key,
    strict_bool,
    typed,
    watch_parent,
    write_run_outputs,
)
from experiments.resume import resumable

OUTPUTS = ["timeline.csv", "plans.jsonl", "config.yaml"]
# Modelled resource estimate, from runs measured on this 2-core host (office / qwen2_5_14b / voltron / walk_away,
# default workload ≈ 284 tokens per turn): 10 turns 1.7 s / 124 MB, 40 turns 5.8 s / 151 MB.
EST_S_PER_TOKEN = 5e-4         # s per simulated token (prefill + decode steps, re-planning)
EST_B_PER_TOKEN = 4e3          # bytes per simulated token (timeline rows)
EST_BASE_S, EST_BASE_B = 0.5, 150e6
MAX_SEED = 2**32 - 1


def register() -> None:
    """Schemas of the multi-device config groups (idempotent)."""
    from planner.voltron.devices import ClusterSpec
    from planner.voltron.policy import PlannerConfig
    from sim.wireless import TraceConfig

    register_common()
    cs = ConfigStore.instance()
    cs.store(group="cluster", name="cluster_schema", node=ClusterSpec)
    cs.store(group="planner", name="planner_schema", node=PlannerConfig)
    cs.store(group="trace", name="trace_schema", node=TraceConfig)


WORKLOAD_INTS = ("min_tokens", "max_in", "max_out")
WORKLOAD_FLOATS = ("mean_in", "std_in", "mean_out", "std_out", "think_s")


def inputs(cfg: DictConfig):
    """Typed inputs of one run (every check of the app, the trace file parsed; no simulation)."""
    from planner.voltron.devices import ClusterSpec
    from planner.voltron.policy import PlannerConfig
    from planner.voltron.rssi import RssiTable
    from quant.arch import ModelSpec
    from sim.multidevice.squeeze import Squeeze
    from sim.multidevice.workload import WorkloadConfig
    from sim.wireless import RssiTrace, TraceConfig

    for k in ("turns", "seed", "jitter", "timeline", "workload", "rssi"):
        if k not in cfg:
            raise ConfigError(f"{k}: missing top-level key")
    turns = size_key(cfg.turns, "turns", 1)
    seed = int_in(cfg.seed, "seed", 0, MAX_SEED)
    jitter = finite(cfg.jitter, "jitter", 0.0, 1.0)
    strict_bool(cfg.timeline, "timeline")
    if not isinstance(cfg.workload, DictConfig):
        raise ConfigError(f"workload: must be a mapping of the workload keys (got {cfg.workload!r})")
    w = OmegaConf.to_container(cfg.workload, resolve=True)
    for k in WORKLOAD_INTS:
        if k in w:
            key = f"workload.{k}"
            w[k] = size_key(w[k], key, 1) if key in SIZE_KEYS else int_in(w[k], key, 1)
    for k in WORKLOAD_FLOATS:
        if k in w:
            w[k] = finite(w[k], f"workload.{k}", 0.0, 1e6)
    wl = typed({**w, "turns": turns, "seed": seed}, WorkloadConfig, "workload")
    spec = typed(cfg.model, ModelSpec, "model")
    cluster = typed(cfg.cluster, ClusterSpec, "cluster")
    pcfg = typed(cfg.planner, PlannerConfig, "planner")
    tcfg = typed(cfg.trace, TraceConfig, "trace")
    rssi = typed(cfg.rssi, RssiTable, "rssi")
    try:
        trace = RssiTrace.load(tcfg)             # a malformed trace fails here, naming the file and row
    except (ValueError, OSError) as e:
        raise ConfigError(str(e) if str(e).startswith("trace") else f"trace.csv: {e}") from None
    check_trace_links(trace, cluster, tcfg.name)
    try:
        Squeeze.load(tcfg).check(len(cluster.devices), tcfg.name)     # and a malformed squeeze
    except (ValueError, OSError) as e:
        raise ConfigError(str(e) if str(e).startswith("trace") else f"trace.squeeze_csv: {e}") from None
    return spec, cluster, pcfg, tcfg, wl, rssi, seed, jitter


def check_trace_links(trace, cluster, trace_name: str) -> None:
    """Every link the cluster names (`cluster.links`) has a column of samples in the trace."""
    missing = [ln for ln in cluster.links if ln not in trace.times]
    if missing:
        raise ConfigError(f"trace: {trace_name} has no samples of link {missing[0]!r} of cluster {cluster.name} "
                          f"(its links: {', '.join(sorted(trace.times)) or 'none'})")


def validate(cfg: DictConfig) -> Estimate:
    """Every check of one run before any work; returns its modelled time / memory estimate."""
    *_, wl, _rssi, _seed, _jitter = inputs(cfg)
    tokens = wl.turns * (min(wl.mean_in, wl.max_in) + min(wl.mean_out, wl.max_out))
    return Estimate(EST_BASE_S + EST_S_PER_TOKEN * tokens, EST_BASE_B + EST_B_PER_TOKEN * tokens, "turns",
                    f"turns={wl.turns} (about {tokens:.0f} tokens)")


def run(cfg: DictConfig):
    from sim.multidevice.runner import simulate

    spec, cluster, pcfg, tcfg, wl, rssi, seed, jitter = inputs(cfg)
    try:
        return simulate(spec, cluster, pcfg, tcfg, wl, rssi, seed, jitter)
    except ValueError as e:                     # malformed device file, unknown link, no base score, ...
        raise ConfigError(str(e)) from e


SIZE_KEYS = ("workload.max_in", "workload.max_out")

register()

GROUPS = {"cluster": None, "model": None, "planner": None, "trace": None}   # for check_group_choices


@hydra.main(config_path="../conf", config_name="multidevice", version_base="1.3")
@resumable(expected=("ttft_s",))
@one_line_errors
def main(cfg: DictConfig) -> None:
    import pandas as pd

    from quant.atomic import atomic_write_text
    from sim.multidevice.runner import MEASURED_KEYS, MODELLED_KEYS

    watch_parent()
    out = run_dir()
    prepare_run_dir(out, OUTPUTS)
    res = run(cfg)
    if strict_bool(cfg.timeline, "timeline"):
        atomic_write_text(out / "timeline.csv", pd.DataFrame(res.timeline).to_csv(index=False))
        # every plan adopted, one JSON object per line (PhasePlan.from_json reads them back; the HIL takes the same)
        atomic_write_text(out / "plans.jsonl", "".join(f'{{"plan_id": {k}, "plan": {p.to_json()}}}\n'
                                                       for k, p in sorted((res.plans or {}).items())))
    write_run_outputs(out, cfg, res.metrics, measured=MEASURED_KEYS, modelled=MODELLED_KEYS)
    m = res.metrics
    print(f"{m['cluster']}/{m['model']}/{m['planner']}/{m['trace']}: TTFT {m['ttft_s']} s, TPOT p50 "
          f"{m['tpot_ms_p50']} ms p99 {m['tpot_ms_p99']} ms, accuracy {m['accuracy_proxy']}, oom {m['oom']} "
          f"-> {out / 'metrics.json'}")


if __name__ == "__main__":
    precheck("multidevice", sys.argv[1:], validate, GROUPS)
    main()
