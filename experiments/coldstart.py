"""Cold-start study app (EdgeFlow §3–4; docs/coldstart.md): simulate one framework's cold start of a model on a device.

    python -m experiments.coldstart model=llama3_8b device=xiaomi15pro framework=edgeflow bits=5 workload=mmlu
    python -m experiments.coldstart framework=llmnpu prompt_tokens=128
    python -m experiments.coldstart -m framework=llamacpp,mnn,llmnpu_plus,edgeflow workload=lambada,hellaswag bits=4,5

Writes `metrics.json` (every number modelled, except `prompt_tokens` and `bits`: inputs echoed, `input_keys`) and
`trace.json` (Chrome/Perfetto) into the Hydra run directory. `metrics.json`'s `critical_path` says which resource
bounds each phase (`planner.critical_path`): per phase `load` / `prefill` / `total`, the window, the seconds and share
of the critical path in flash, unpack, sharing, npu, cpu, graph and idle, and the bounding one (docs/coldstart.md
"Critical path").
"""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from experiments.common import (
    ConfigError,
    Estimate,
    one_line_errors,
    precheck,
    prepare_run_dir,
    register_common,
    run_dir,
    typed,
    watch_parent,
    write_run_outputs,
)
from experiments.resume import resumable
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


SETTINGS = ("bits", "prompt_tokens", "seed", "cost_model", "cost_table", "bits_source", "preloaded_gb", "write_trace")
# Modelled resource estimate of one run, from runs measured on this 2-core host (llama3_8b, edgeflow = the slowest
# policy, trace written): 0.16 s / 69 MB at 1k prompt tokens, 3.0 s / 244 MB at 16k, 6.4 s / 441 MB at 32k.
EST_S_PER_TOKEN = 2.0e-4       # s per prompt token
EST_B_PER_TOKEN = 12e3         # bytes per prompt token (tasks, timeline, trace document)
EST_BASE_S, EST_BASE_B = 1.0, 150e6


def inputs(cfg: DictConfig):
    """Typed inputs of one run (every check of the app; no work): settings, model, device, framework, workload."""
    from sim.coldstart.run import ColdStartSettings

    missing = [k for k in SETTINGS if k not in cfg]
    if missing:
        raise ConfigError(f"{missing[0]}: missing top-level key")
    settings = typed({k: cfg[k] for k in SETTINGS}, ColdStartSettings)
    model = typed(cfg.model, ModelSpec, "model")
    if OmegaConf.get_type(cfg.device) is not SocProfile:   # e.g. a Voltron device composed through the API
        raise ConfigError(f"device: {cfg.device.get('name', '?')} is not a single-SoC cold-start profile "
                          f"(soc_schema); use one of: {', '.join(_soc_devices())}")
    device = typed(cfg.device, SocProfile, "device")
    framework = typed(cfg.framework, FrameworkSpec, "framework")
    workload = typed(cfg.workload, WorkloadSpec, "workload") if cfg.get("workload") else None
    if not (settings.prompt_tokens or (workload and workload.prompt_tokens > 0)):
        raise ConfigError("prompt_tokens: give a workload or prompt_tokens > 0")
    if settings.cost_model == "table" and not Path(settings.cost_table).is_file():
        raise ConfigError(f"cost_table: {settings.cost_table!r} is not a file (cost_model=table needs a measured cost "
                          f"table JSON)")
    if settings.cost_model == "table":
        from planner.cost.table import TableCostModel

        try:                                     # not JSON, malformed rows, no rows: before the run directory
            TableCostModel.from_json_file(settings.cost_table)
        except ValueError as e:
            raise ConfigError(f"cost_table: {e}") from None
    if settings.bits_source == "real" and model.weights.value == "twin":
        raise ConfigError(f"bits_source: real needs the model's weights; {model.name} has none on this machine "
                          f"(model.weights=twin): use bits_source=auto (the quantizer twin) or a model with weights")
    if model.weights.value == "real" and settings.bits_source in ("auto", "real"):
        from quant.gguf_model import check_gguf

        check_gguf(model)                        # a missing, corrupt or truncated GGUF: one line naming the key
    return settings, model, device, framework, workload


def validate(cfg: DictConfig) -> Estimate:
    """Every check of one run before any work; returns its modelled time / memory estimate."""
    settings, _model, _device, _framework, workload = inputs(cfg)
    tokens = settings.prompt_tokens or workload.prompt_tokens
    return Estimate(EST_BASE_S + EST_S_PER_TOKEN * tokens, EST_BASE_B + EST_B_PER_TOKEN * tokens, "prompt_tokens",
                    f"prompt_tokens={tokens}")


def _bounds(cp: dict) -> str:
    """"graph (load), npu 82 % (prefill)": each phase's bounding resource and its share of the phase's critical path."""
    return ", ".join(f"{cp[p]['bound'] or '-'} {100 * cp[p]['share'].get(cp[p]['bound'], 0.0):.0f} % ({p})"
                     for p in ("load", "prefill"))


@resumable(expected=("ttft_s",))
@one_line_errors
def run(cfg: DictConfig) -> dict:
    from sim.coldstart.run import input_keys, modelled_keys, run_one

    watch_parent()
    settings, model, device, framework, workload = inputs(cfg)
    out = run_dir()
    prepare_run_dir(out, ["trace.json", "config.yaml"])
    try:
        metrics, trace = run_one(model, device, framework, workload, settings)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if trace is not None:
        atomic_write_json(out / "trace.json", trace)
    write_run_outputs(out, cfg, metrics, measured=[], modelled=modelled_keys(metrics), inputs=input_keys(metrics))
    print(f"{metrics['framework']} {metrics['model']} {metrics['workload']} bits={metrics['bits']}: "
          f"TTFT {metrics['ttft_s']:.2f} s (load {metrics['load_s']:.2f} s, prefill {metrics['prefill_s']:.2f} s), "
          f"bound by {_bounds(metrics['critical_path'])} -> {out}")
    return metrics


@hydra.main(config_path="../conf", config_name="coldstart", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    precheck("coldstart", sys.argv[1:], validate, GROUPS, parallel=2)
    main()
