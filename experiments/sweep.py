"""Batch sweeps (docs/sweeps.md "Batch sweeps"): every configuration of a grid (`conf/grid/*.yaml`) of an app, run in
a few worker processes that import once, in chunks, into one results table with the `experiments.results` schema.

    python -m experiments.sweep app=coldstart grid=coldstart_small               # 12 configurations
    python -m experiments.sweep app=coldstart grid=coldstart_10k workers=2       # 10,000
    python -m experiments.sweep app=coldstart grid=coldstart_paper engine=ray    # on Ray's local cluster (ray extra)

A grid names fixed overrides and swept factors (`key: [values]`); each configuration is the app's command line
`key=value ...` of one job, and its row is the one a Hydra `-m` job with those overrides gets (`sweep.<key>` columns
for every override, `modelled.*` / `input.*` / `info.*` for its metrics). Each finished chunk is appended atomically
as `<out>/parts/part-<hash>.parquet`; a re-run skips the configurations already present there (by key: app and
overrides), so a killed sweep continues where it stopped (`resume=false` starts over). At the end the parts become
`<out>/results.parquet` and `results.csv` (`experiments.results.write`). A tqdm bar with an ETA follows the
configurations (`progress=false` or `EDGELLM_PROGRESS=0` silences it).
"""
from __future__ import annotations

import functools
import hashlib
import io
import math
import os
import shutil
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any, Callable, Iterator

import hydra
import pandas as pd
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from experiments import results
from experiments.common import ConfigError, check_group_choices, one_line_errors, typed
from experiments.progress import PROGRESS_ENV
from quant.atomic import atomic_write_bytes

ENGINES = ("local", "ray")
MAX_CHUNK = 256           # configurations per chunk at most (a part file; what a kill can lose)
CHUNKS_PER_WORKER = 4     # chunks per worker at least, so the workers finish together and the ETA moves


@dataclass
class GridSpec:
    name: str = MISSING                                         # the grid's name (the default output directory)
    fixed: dict[str, Any] = field(default_factory=dict)          # override -> one value, in every configuration
    factors: dict[str, Any] = field(default_factory=dict)        # override -> list of values, swept (product)


@dataclass
class SweepSpec:
    app: str = "coldstart"          # the app whose jobs the configurations are (APPS)
    grid: GridSpec = field(default_factory=GridSpec)
    out: str = ""                   # results directory; "" = multirun/sweep/<app>_<grid name>
    workers: int = 2                # worker processes (engine=local) or Ray CPUs (engine=ray)
    chunk: int = 0                  # configurations per chunk; 0 = auto (CHUNKS_PER_WORKER per worker, <= MAX_CHUNK)
    engine: str = "local"           # local (a process pool) | ray (ray.init's local cluster; the `ray` extra)
    resume: bool = True             # skip configurations already in <out>/parts
    progress: bool = True           # tqdm bar with an ETA on stderr

    def __post_init__(self) -> None:
        if self.app not in APPS:
            raise ValueError(f"app must be one of {', '.join(APPS)} (got {self.app!r})")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)} (got {self.engine!r})")
        if not 1 <= self.workers <= 1024:
            raise ValueError(f"workers must be in 1..1024 (got {self.workers})")
        if not 0 <= self.chunk <= 1_000_000:
            raise ValueError(f"chunk must be in 0..1000000 (got {self.chunk})")
        if isinstance(self.grid, dict):
            self.grid = GridSpec(**self.grid)


@dataclass
class SweepSummary:
    total: int                      # configurations of the grid
    ran: int                        # run now
    skipped: int                    # already in the parts (resume)
    failed: int                     # raised a one-line error (no row)
    first_error: str                # the first failure's message ("" if none)
    wall_s: float                   # measured
    table: Path | None              # results.parquet (None: no row at all)


# ---- configurations -----------------------------------------------------------------------------------------------
def _text(v: Any) -> str:
    """A value as on the command line (YAML reads it back as the same value: `sweep_columns`)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def points(grid: GridSpec) -> list[tuple[str, dict[str, Any]]]:
    """(key, overrides) of every configuration, in grid order (the last factor varies fastest). The key is the job's
    command line `k=v ...`: fixed overrides, then the factors."""
    for k, v in grid.factors.items():
        if not isinstance(v, (list, tuple)) or not v:
            raise ConfigError(f"grid.factors.{k}: must be a non-empty list of values (got {v!r:.60})")
    both = set(grid.fixed) & set(grid.factors)
    if both:
        raise ConfigError(f"grid.{sorted(both)[0]}: both fixed and a factor")
    keys = [*grid.fixed, *grid.factors]
    out = []
    for combo in product(*grid.factors.values()):
        ovr = {**grid.fixed, **dict(zip(grid.factors, combo))}
        out.append((" ".join(f"{k}={_text(ovr[k])}" for k in keys), ovr))
    if len({k for k, _ in out}) != len(out):
        raise ConfigError("grid.factors: a factor lists the same value twice")
    return out


# ---- apps -----------------------------------------------------------------------------------------------------------
class ColdStartApp:
    """`experiments.coldstart` jobs, without Hydra: the same typed inputs (`sim.coldstart.run.run_one`) and metrics."""

    GROUPS = ("model", "device", "framework", "workload")

    def __init__(self) -> None:
        from experiments.coldstart import CONF, SETTINGS

        self.settings = tuple(k for k in SETTINGS if k != "write_trace")
        base = OmegaConf.load(CONF / "coldstart.yaml")          # the app's defaults: groups and settings
        self.defaults = {}
        for d in base.defaults:
            if isinstance(d, DictConfig) and next(iter(d)) in self.GROUPS:
                self.defaults[next(iter(d))] = str(d[next(iter(d))])
        self.base = {k: base[k] for k in self.settings}

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def _group(group: str, name: str):
        """Group option `name` typed by its schema (once per process)."""
        from experiments.coldstart import CONF, _soc_devices
        from planner.device import SocProfile
        from planner.framework import FrameworkSpec
        from planner.workload import WorkloadSpec
        from quant.arch import ModelSpec

        cls = {"model": ModelSpec, "device": SocProfile, "framework": FrameworkSpec, "workload": WorkloadSpec}[group]
        path = CONF / group / f"{name}.yaml"
        if not path.is_file():
            opts = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
            raise ConfigError(f"{group}: no option {name!r} (one of: {', '.join(opts)})")
        if group == "device" and name not in _soc_devices():
            raise ConfigError(f"device: {name} is not a single-SoC cold-start profile (soc_schema); use one of: "
                              f"{', '.join(_soc_devices())}")
        doc = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        try:                             # typed by its schema, as Hydra composes it for the app
            node = OmegaConf.merge(OmegaConf.structured(cls), {k: v for k, v in doc.items() if k != "defaults"})
        except Exception as e:           # noqa: BLE001 - OmegaConf validation: one line naming the key
            raise ConfigError(f"{group}: {name}: {' '.join(str(e).split())[:200]}") from None
        return typed(node, cls, group)

    def inputs(self, ovr: dict[str, Any]):
        """Typed inputs of one configuration (every check; no work)."""
        from sim.coldstart.run import ColdStartSettings

        unknown = [k for k in ovr if k not in self.GROUPS and k not in self.settings]
        if unknown:
            raise ConfigError(f"{unknown[0]}: not a setting of coldstart (settings: {', '.join(self.settings)}; "
                              f"groups: {', '.join(self.GROUPS)})")
        groups = {g: self._group(g, str(ovr.get(g, self.defaults[g]))) for g in self.GROUPS}
        settings = typed({**self.base, "write_trace": False,
                          **{k: v for k, v in ovr.items() if k in self.settings}}, ColdStartSettings)
        return groups, settings

    def run(self, ovr: dict[str, Any]) -> dict[str, Any]:
        """The job's metrics.json document (metrics + label lists)."""
        from sim.coldstart.run import input_keys, modelled_keys, run_one

        g, settings = self.inputs(ovr)
        try:
            metrics, _ = run_one(g["model"], g["device"], g["framework"], g["workload"], settings)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        doc = dict(metrics)
        doc["measured_keys"] = []
        doc["modelled_keys"] = sorted(modelled_keys(metrics))
        doc["input_keys"] = sorted(input_keys(metrics))
        return doc


APPS: dict[str, Callable[[], Any]] = {"coldstart": ColdStartApp}


@functools.lru_cache(maxsize=None)
def _app(name: str):
    return APPS[name]()


def run_chunk(app: str, chunk: list[tuple[str, dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Run the configurations of one chunk in this process: (rows of the finished ones, one-line errors)."""
    a, rows, errors = _app(app), [], []
    for key, ovr in chunk:
        try:
            doc = a.run(ovr)
        except (ConfigError, FileNotFoundError, ValueError) as e:
            errors.append(f"{key}: {' '.join(str(e).split())}")
            continue
        rows.append(results.row(key, app, results.sweep_columns([f"{k}={_text(v)}" for k, v in ovr.items()]), doc))
    return rows, errors


# ---- parts ----------------------------------------------------------------------------------------------------------
def _parts(out: Path) -> list[Path]:
    return sorted((out / "parts").glob("part-*.parquet"))


def done_keys(out: Path) -> set[str]:
    """Keys of the configurations in `out`'s parts (a partial file of an interrupted write is not a part)."""
    keys: set[str] = set()
    for p in _parts(out):
        keys.update(pd.read_parquet(p, columns=["job"])["job"])
    return keys


def _write_part(out: Path, rows: list[dict[str, Any]]) -> Path:
    name = hashlib.sha1("\n".join(r["job"] for r in rows).encode()).hexdigest()[:16]
    buf = io.BytesIO()
    results.table(rows).to_parquet(buf, engine="pyarrow", index=False)
    return atomic_write_bytes(out / "parts" / f"part-{name}.parquet", buf.getvalue())


def merge(out: Path, order: list[str]) -> Path | None:
    """Every part as `<out>/results.parquet` + `results.csv`, rows in grid order (`order`: keys), then any others."""
    parts = _parts(out)
    if not parts:
        return None
    df = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    rank = {k: i for i, k in enumerate(order)}
    df = df.drop_duplicates("job").assign(_rank=df["job"].map(lambda k: rank.get(k, len(rank))))
    df = df.sort_values(["_rank", "job"], kind="stable").drop(columns="_rank").reset_index(drop=True)
    # columns in order of first appearance over the sorted rows (whatever order the parts were written in)
    first = {c: (int(df[c].notna().to_numpy().argmax()) if df[c].notna().any() else len(df), c) for c in df.columns}
    df = df[sorted(df.columns, key=first.__getitem__)]
    return results.write(results.table(df), out)["parquet"]


# ---- engines --------------------------------------------------------------------------------------------------------
def _local(app: str, chunks: list, workers: int) -> Iterator[tuple[int, tuple[list, list]]]:
    """(chunk size, result) as chunks finish, on a process pool (or in this process for one worker)."""
    if workers == 1:
        for c in chunks:
            yield len(c), run_chunk(app, c)
        return
    # by module name, also under `python -m`
    from experiments.sweep import _worker_init
    from experiments.sweep import run_chunk as task

    pool = ProcessPoolExecutor(max_workers=workers, initializer=_worker_init)
    finished = False
    try:
        pending = {pool.submit(task, app, c): len(c) for c in chunks}
        while pending:
            fin, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in fin:
                yield pending.pop(f), f.result()
        finished = True
    finally:
        if not finished:        # Ctrl-C or an error: stop the running chunks now (their parts are not written)
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)


def _worker_init() -> None:
    """A pool worker leaves Ctrl-C to the sweep's process (one line, exit 130), which stops the workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _ray(app: str, chunks: list, workers: int) -> Iterator[tuple[int, tuple[list, list]]]:
    """The same on Ray: a running cluster (RAY_ADDRESS) or a local one with `workers` CPUs."""
    try:
        import ray
    except ImportError:
        raise ConfigError("engine: ray is not installed (pip install -e '.[ray]'); use engine=local") from None
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=None if os.environ.get("RAY_ADDRESS") else workers, include_dashboard=False,
                 log_to_driver=False)
    from experiments.sweep import run_chunk as task  # by module name, also under `python -m`

    try:
        remote = ray.remote(task)
        pending = {remote.remote(app, c): len(c) for c in chunks}
        while pending:
            fin, _ = ray.wait(list(pending), num_returns=1)
            for f in fin:
                yield pending.pop(f), ray.get(f)
    finally:
        if started:
            ray.shutdown()


def _chunks(todo: list, spec: SweepSpec) -> list[list]:
    size = spec.chunk or max(1, min(MAX_CHUNK, math.ceil(len(todo) / (CHUNKS_PER_WORKER * spec.workers))))
    return [todo[i:i + size] for i in range(0, len(todo), size)]


def run_sweep(spec: SweepSpec) -> SweepSummary:
    """Run every configuration of `spec.grid` not yet in the parts; write the results table. Bad input (an unknown
    key or option, a bad value in any configuration) is a ConfigError before any work."""
    t0 = time.perf_counter()
    pts = points(spec.grid)
    app = _app(spec.app)
    for key, ovr in pts:                                  # every check before any work
        try:
            app.inputs(ovr)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{' '.join(str(e).split())} (configuration {key})") from None
    out = Path(spec.out or f"multirun/sweep/{spec.app}_{spec.grid.name}")
    if not spec.resume and (out / "parts").is_dir():
        shutil.rmtree(out / "parts")
    have = done_keys(out) if spec.resume else set()
    todo = [p for p in pts if p[0] not in have]
    ran = failed = 0
    first_error = ""
    bar = _bar(len(pts), len(pts) - len(todo), spec)
    engine = _ray if spec.engine == "ray" else _local
    try:
        for n, (rows, errors) in engine(spec.app, _chunks(todo, spec), spec.workers):
            if rows:
                _write_part(out, rows)
            ran += len(rows)
            failed += len(errors)
            first_error = first_error or (errors[0] if errors else "")
            if bar is not None:
                bar.update(n)
    finally:
        if bar is not None:
            bar.close()
    table = merge(out, [k for k, _ in pts])
    return SweepSummary(len(pts), ran, len(pts) - len(todo), failed, first_error, time.perf_counter() - t0, table)


def _bar(total: int, done: int, spec: SweepSpec):
    if not spec.progress or os.environ.get(PROGRESS_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, unit="cfg", desc=f"sweep {spec.grid.name}", file=sys.stderr,
                smoothing=0.1, dynamic_ncols=True)


# ---- Hydra app ------------------------------------------------------------------------------------------------------
ConfigStore.instance().store(group="grid", name="grid_schema", node=GridSpec)


@one_line_errors
def run(cfg: DictConfig) -> SweepSummary:
    doc = OmegaConf.to_container(cfg, resolve=True)
    doc = {k: v for k, v in doc.items() if k != "hydra"}
    spec = typed(doc, SweepSpec)
    s = run_sweep(spec)
    fail = f", {s.failed} failed (first: {s.first_error})" if s.failed else ""
    print(f"sweep {spec.grid.name}: {s.total} configurations, {s.ran} run, {s.skipped} already done{fail} in "
          f"{s.wall_s:.1f} s -> {s.table}")
    return s


@hydra.main(config_path="../conf", config_name="sweep", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    check_group_choices(sys.argv[1:], {"grid": None})
    main()
