"""Voltron multi-device app (SPEC §4, §6): plan a model across a cluster and simulate a conversation under an RSSI trace.

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

from experiments.common import (ConfigError, check_group_choices, one_line_errors, register_common, run_dir, typed,
                                write_run_outputs)


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


def run(cfg: DictConfig):
    from planner.voltron.devices import ClusterSpec
    from planner.voltron.policy import PlannerConfig
    from planner.voltron.rssi import RssiTable
    from quant.arch import ModelSpec
    from sim.multidevice.runner import simulate
    from sim.multidevice.workload import WorkloadConfig
    from sim.wireless import TraceConfig

    spec = typed(cfg.model, ModelSpec, "model")
    cluster = typed(cfg.cluster, ClusterSpec, "cluster")
    pcfg = typed(cfg.planner, PlannerConfig, "planner")
    tcfg = typed(cfg.trace, TraceConfig, "trace")
    wl = typed({**OmegaConf.to_container(cfg.workload, resolve=True), "turns": cfg.turns, "seed": cfg.seed},
               WorkloadConfig, "workload")
    rssi = typed(cfg.rssi, RssiTable, "rssi")
    if cfg.jitter < 0:
        raise ConfigError(f"jitter must be >= 0 (got {cfg.jitter})")
    try:
        return simulate(spec, cluster, pcfg, tcfg, wl, rssi, int(cfg.seed), float(cfg.jitter))
    except ValueError as e:                     # malformed trace / device file, unknown link, no base score, ...
        raise ConfigError(str(e)) from e


register()

GROUPS = {"cluster": None, "model": None, "planner": None, "trace": None}   # for check_group_choices


@hydra.main(config_path="../conf", config_name="multidevice", version_base="1.3")
@one_line_errors
def main(cfg: DictConfig) -> None:
    import pandas as pd

    from quant.atomic import atomic_write_text
    from sim.multidevice.runner import MEASURED_KEYS, MODELLED_KEYS

    res = run(cfg)
    out = run_dir()
    if cfg.timeline:
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
    check_group_choices(sys.argv[1:], GROUPS)
    main()
