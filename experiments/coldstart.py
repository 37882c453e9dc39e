"""Cold-start study app (EdgeFlow, SPEC §3.3-3.5): simulate one framework's cold start of a model on a device.

    python -m experiments.coldstart model=llama3_8b device=xiaomi15pro framework=edgeflow bits=5 workload=mmlu
    python -m experiments.coldstart framework=llmnpu prompt_tokens=128
    python -m experiments.coldstart -m framework=llamacpp,mnn,llmnpu_plus,edgeflow workload=lambada,hellaswag bits=4,5

Writes `metrics.json` (all numbers modelled) and `trace.json` (Chrome/Perfetto) into the Hydra run directory.
"""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from experiments.common import ConfigError, check_group_choices, one_line_errors, register_common, run_dir, typed, write_run_outputs
from planner.device import SocProfile
from planner.framework import FrameworkSpec
from planner.workload import WorkloadSpec
from quant.arch import ModelSpec
from quant.atomic import atomic_write_json


def register_coldstart() -> None:
    register_common()
    cs = ConfigStore.instance()
    cs.store(group="framework", name="framework_schema", node=FrameworkSpec)
    cs.store(group="workload", name="workload_schema", node=WorkloadSpec)


CONF = Path(__file__).resolve().parents[1] / "conf"


def _soc_devices() -> list[str]:
    return sorted(p.stem for p in (CONF / "device").glob("*.yaml") if "soc_schema" in p.read_text())


GROUPS = {"model": None, "device": _soc_devices, "framework": None, "workload": None}  # for check_group_choices

register_coldstart()


@one_line_errors
def run(cfg: DictConfig) -> dict:
    from sim.coldstart.run import ColdStartSettings, modelled_keys, run_one

    settings = typed({k: cfg[k] for k in ("bits", "prompt_tokens", "seed", "cost_model", "cost_table", "bits_source",
                                          "preloaded_gb", "write_trace")}, ColdStartSettings)
    model = typed(cfg.model, ModelSpec, "model")
    if OmegaConf.get_type(cfg.device) is not SocProfile:   # e.g. a Voltron device composed through the API
        raise ConfigError(f"device: {cfg.device.get('name', '?')} is not a single-SoC cold-start profile "
                          f"(soc_schema); use one of: {', '.join(_soc_devices())}")
    device = typed(cfg.device, SocProfile, "device")
    framework = typed(cfg.framework, FrameworkSpec, "framework")
    workload = typed(cfg.workload, WorkloadSpec, "workload") if cfg.get("workload") else None
    try:
        metrics, trace = run_one(model, device, framework, workload, settings)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    out = run_dir()
    if trace is not None:
        atomic_write_json(out / "trace.json", trace)
    write_run_outputs(out, cfg, metrics, measured=[], modelled=modelled_keys(metrics))
    print(f"{metrics['framework']} {metrics['model']} {metrics['workload']} bits={metrics['bits']}: "
          f"TTFT {metrics['ttft_s']:.2f} s (load {metrics['load_s']:.2f} s, prefill {metrics['prefill_s']:.2f} s) "
          f"-> {out}")
    return metrics


@hydra.main(config_path="../conf", config_name="coldstart", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    check_group_choices(sys.argv[1:], GROUPS)
    main()
