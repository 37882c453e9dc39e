"""Shared plumbing for the thin Hydra apps: config schemas registration, typed conversion with one-line errors,
the run directory, and the metrics writer that labels every number as measured or modelled.

Conventions every app follows (SPEC §6):
- `metrics.json` in the run directory: flat keys; `measured_keys` / `modelled_keys` list which numbers were measured on
  this machine and which come out of a model (simulation, cost model, size estimate); `input_keys` are settings of the
  run echoed for convenience (e.g. the bit budget), neither measured nor modelled.
- `config.yaml`: the resolved config of the run.
- Bad input: one line `error: ...` on stderr naming the key, exit status 2, nothing written.
"""
from __future__ import annotations

import functools
import re
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from quant.arch import ModelSpec
from quant.atomic import atomic_write_json, atomic_write_text

T = TypeVar("T")

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


class ConfigError(ValueError):
    """A config value is invalid; the message names the key."""


def register_common() -> None:
    """Schemas of the groups several apps share (idempotent): `model`, and both kinds of `device` profile — a
    single-SoC cold-start profile (`soc_schema`) and a multi-device cluster member (`edge_device_schema`) — so any
    app can compose any device file and reject the wrong kind with a clear error."""
    from planner.device import SocProfile
    from planner.voltron.devices import EdgeDevice

    cs = ConfigStore.instance()
    cs.store(group="model", name="model_schema", node=ModelSpec)
    cs.store(group="device", name="soc_schema", node=SocProfile)
    cs.store(group="device", name="edge_device_schema", node=EdgeDevice)


def typed(node: Any, cls: type[T], key: str = "") -> T:
    """Turn a (structured) config node into an instance of `cls`; a bad value becomes a ConfigError naming `key`."""
    try:
        if isinstance(node, DictConfig):
            if OmegaConf.get_type(node) is cls:
                return OmegaConf.to_object(node)  # type: ignore[return-value]
            return cls(**OmegaConf.to_container(node, resolve=True))  # type: ignore[arg-type]
        return cls(**node)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{key + ': ' if key else ''}{e}") from e


def run_dir() -> Path:
    """The Hydra run/sweep-job output directory (Hydra ≥1.2 does not chdir)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # called outside a Hydra app (tests, notebooks)
        return Path.cwd()


def write_run_outputs(out: Path, cfg: DictConfig | None, metrics: dict[str, Any],
                      measured: list[str], modelled: list[str], inputs: list[str] = ()) -> Path:
    """Write `metrics.json` (+ the resolved `config.yaml`) atomically. Every numeric key must be labelled: measured on
    this machine, modelled (simulation / cost model / estimate), or an input echoed from the run's settings."""
    labelled = set(measured) | set(modelled) | set(inputs)
    unlabelled = [k for k, v in metrics.items() if k not in labelled and not isinstance(v, str)]
    if unlabelled:
        raise ValueError(f"metrics without a measured/modelled/input label: {unlabelled}")
    doc = dict(metrics)
    doc["measured_keys"] = sorted(k for k in measured if k in metrics)
    doc["modelled_keys"] = sorted(k for k in modelled if k in metrics)
    doc["input_keys"] = sorted(k for k in inputs if k in metrics)
    if cfg is not None:
        atomic_write_text(out / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
    return atomic_write_json(out / "metrics.json", doc)


def one_line_errors(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorator for Hydra task functions: bad input exits with one line naming the problem, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except (ConfigError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapper


def group_options(group: str) -> list[str]:
    """Names of the options of a config group in conf/."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check_group_choices(argv: list[str], groups: dict[str, Callable[[], list[str]] | None]) -> None:
    """One-line error for an unknown config-group option (`framework=nope`, also inside a `-m` list) before Hydra
    composes (Hydra's own report spans many lines). `groups` maps a group to a function listing its valid options
    (None: every yaml in conf/<group>). Only plain `group=a,b` overrides are checked, and nothing when the user adds
    config directories (their options are not in conf/)."""
    if any(a.startswith(("-cd", "--config-dir", "-cp", "--config-path")) or "searchpath" in a for a in argv):
        return
    pattern = re.compile(rf"({'|'.join(map(re.escape, groups))})=([\w.,-]+)")
    for arg in argv:
        m = pattern.fullmatch(arg)
        if not m:
            continue
        group, values = m.groups()
        lister = groups[group]
        options = lister() if lister else group_options(group)
        for v in values.split(","):
            if v not in options:
                why = ("exists but is not valid for this app" if (CONF_DIR / group / f"{v}.yaml").is_file()
                       else f"is not a {group} config")
                print(f"error: {group}={v} {why}; use one of: {', '.join(options)}", file=sys.stderr)
                raise SystemExit(2)
