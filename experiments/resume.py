"""Resumable sweeps (docs/sweeps.md "Resuming a killed sweep"): a job whose run directory already holds a valid
`metrics.json` for the same configuration is not re-run.

A run directory counts as finished (`finished`) when
- `metrics.json` exists, parses as a JSON object, and carries the label lists every app writes (`measured_keys`,
  `modelled_keys`, `input_keys`), with every labelled key present, plus any `expected` keys of the app;
- no partial file is left beside it (the hidden `.<name>.<random>.tmp` files of `quant.atomic` writes, which a
  killed job can leave);
- its `config.yaml` equals the configuration of the job about to run (when given), so a changed setting re-runs.

Apps call it at the start of a job through the `resumable` decorator (outermost, above `one_line_errors`):

    @resumable(expected=("ttft_s",))
    @one_line_errors
    def run(cfg: DictConfig) -> dict: ...

Re-running a killed `-m` sweep with the same `hydra.sweep.dir=<dir>` then finishes only the missing jobs. Set
`EDGELLM_RESUME=0` to re-run every job regardless.
"""
from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from omegaconf import OmegaConf

from experiments.common import run_dir
from quant.atomic import TMP_RE

RESUME_ENV = "EDGELLM_RESUME"                           # "0": never skip
LABEL_LISTS = ("measured_keys", "modelled_keys", "input_keys")


def partial_files(run_dir: str | os.PathLike) -> list[Path]:
    """Leftovers of interrupted atomic writes in `run_dir`."""
    d = Path(run_dir)
    return sorted(p for p in d.iterdir() if p.is_file() and TMP_RE.match(p.name)) if d.is_dir() else []


def load_finished(run_dir: str | os.PathLike, expected: Iterable[str] = (), config_yaml: str | None = None
                  ) -> dict[str, Any] | None:
    """The metrics of a finished run in `run_dir` (see the module docstring), else None."""
    d = Path(run_dir)
    path = d / "metrics.json"
    if not path.is_file() or partial_files(d):
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or any(not isinstance(doc.get(k), list) for k in LABEL_LISTS):
        return None
    labelled = {k for lst in LABEL_LISTS for k in doc[lst]}
    if any(k not in doc for k in labelled) or any(k not in doc for k in expected):
        return None
    if config_yaml is not None:
        try:
            if (d / "config.yaml").read_text() != config_yaml:
                return None
        except OSError:
            return None
    return doc


def finished(run_dir: str | os.PathLike, expected: Iterable[str] = (), config_yaml: str | None = None) -> bool:
    """True when `run_dir` holds a valid, complete result (see the module docstring)."""
    return load_finished(run_dir, expected, config_yaml) is not None


def enabled() -> bool:
    return os.environ.get(RESUME_ENV, "1") != "0"


def resumable(expected: Iterable[str] = ()) -> Callable:
    """Decorator for an app's `run(cfg)`: return the stored metrics instead of running when the job's run directory
    (`experiments.common.run_dir`) is finished for the same resolved config; otherwise run."""
    expected = tuple(expected)

    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(cfg, *args, **kwargs):
            if enabled():
                out = run_dir()
                doc = load_finished(out, expected, OmegaConf.to_yaml(cfg, resolve=True))
                if doc is not None:
                    print(f"{out}: finished earlier (valid metrics.json, same config): not re-run", file=sys.stderr)
                    return doc
            return fn(cfg, *args, **kwargs)

        wrapper.resumable = True
        return wrapper

    return deco
