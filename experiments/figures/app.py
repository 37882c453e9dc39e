"""`python -m experiments.figures figure=<name>|all|index size=full|toy out=figures progress=true workers=0`.

Thin Hydra app: resolves the figure names, writes each figure's CSV / PNG / PDF through `experiments.figures.base`
and the index page; a tqdm bar with an ETA over the figures unless `progress=false`. Figures are independent, so
`workers` processes build them in parallel (0: one per core); within a process, figures share every simulation of
the same configuration (`experiments.figures.data.run_coldstart`, `voltron_data.conversation`), so the figures that
share most go to the same worker. The files are those of a serial run: each figure's data depends on its own
configuration only, and every file is written atomically. Errors in the arguments stop
before any work with one line `error: <key>: ...` (exit 2); so does a figure asked for by name whose results are
not on disk. `all` leaves such a figure out and prints why.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from experiments.figures import NAMES, available, load, unavailable
from experiments.figures.base import SIZES, set_progress, write_figure
from experiments.figures.index import write_index

CONF = Path(__file__).resolve().parents[2] / "conf"


@dataclass
class FiguresConfig:
    figure: str = "all"        # a figure module name (experiments/figures/), `all`, or `index` (the index page only)
    size: str = "full"         # full: the paper's setting; toy: seconds (the golden tests' size)
    out: str = "figures"       # output directory (relative to the working directory)
    progress: bool = True      # tqdm progress bar with ETA on stderr
    workers: int = 0           # processes building figures in parallel; 0: one per core; 1: in this process


ConfigStore.instance().store(name="figures_schema", node=FiguresConfig)


def left_out() -> dict[str, str]:
    """Figures `all` leaves out because the results they need are not on disk: name -> why."""
    return {n: why for n in available() if (why := unavailable(n))}


def resolve(cfg: FiguresConfig) -> list[str]:
    """Figure names to build, after checking every argument (ValueError naming the key); `all` without the
    figures of `left_out`."""
    if cfg.size not in SIZES:
        raise ValueError(f"size: must be one of {', '.join(SIZES)} (got {cfg.size!r})")
    names = [n.strip() for n in str(cfg.figure).split(",") if n.strip()]
    if not names:
        raise ValueError("figure: give a figure name, all or index")
    if names == ["all"]:
        skip = left_out()
        return [n for n in available() if n not in skip]
    if names == ["index"]:
        return []
    unknown = [n for n in names if n not in NAMES or n not in available()]
    if unknown:
        raise ValueError(f"figure: unknown figure {unknown[0]!r}; one of: all, index, {', '.join(available())}")
    for n in names:
        if why := unavailable(n):
            raise ValueError(f"figure: {n}: {why}")
    return names


def validate(cfg: DictConfig) -> None:
    """The pre-check (`experiments.common.precheck`, before Hydra makes a run directory): every argument."""
    from experiments.common import ConfigError, strict_bool

    c = FiguresConfig(**OmegaConf.to_container(cfg, resolve=True))
    strict_bool(c.progress, "progress")
    if isinstance(c.workers, bool) or not isinstance(c.workers, int) or c.workers < 0:
        raise ConfigError(f"workers: a whole number ≥ 0 (0: one per core; got {c.workers!r})")
    if not isinstance(c.out, str) or not c.out.strip():
        raise ConfigError(f"out: an output directory (got {c.out!r})")
    resolve(c)


# Figures that simulate the same configurations (counted with `data.COUNTS` / `voltron_data.COUNTS`): one task
# each, built in one process so the shared runs are simulated once. Every other figure is a task of its own.
SHARED = (("edgeflow_fig02", "edgeflow_fig05", "edgeflow_fig10", "edgeflow_fig11", "edgeflow_fig13",
           "edgeflow_fig14", "edgeflow_fig15", "edgeflow_fig16", "edgeflow_critical_path"),
          ("voltron_fig11", "voltron_fig12"))
HEAVY = ("edgeflow_fig12_table4",)      # started first: the longest figure bounds the wall time


def tasks(names: list[str]) -> list[list[str]]:
    """`names` in groups built in one process each (`SHARED`), the heaviest first, otherwise in the given order."""
    groups, seen = [], set()
    for n in names:
        if n in seen:
            continue
        group = next(([m for m in g if m in names] for g in SHARED if n in g), [n])
        seen.update(group)
        groups.append(group)
    return sorted(groups, key=lambda g: not any(n in HEAVY for n in g))


def _build_group(group: list[str], size: str, out: Path, progress: bool) -> list[dict]:
    """Write the figures of one task (in a worker process, or in this one); one summary row per figure."""
    from experiments.figures import data, voltron_data

    set_progress(progress)
    rows = []
    for name in group:
        t0 = time.perf_counter()
        before = {k: data.COUNTS[k] + voltron_data.COUNTS[k] for k in data.COUNTS}
        paths = write_figure(load(name), size, out)
        runs = {k: data.COUNTS[k] + voltron_data.COUNTS[k] - before[k] for k in before}
        rows.append({"figure": name, "wall_s": time.perf_counter() - t0, **runs,
                     **{k: str(v) for k, v in paths.items()}})
    return rows


def build(names: list[str], size: str, out: Path, progress: bool = True, workers: int = 1) -> list[dict]:
    """Write every figure in `names` and the index with `workers` processes (0: one per core, 1: this process);
    returns one summary row per figure, in the order of `names` (name, seconds, simulations run / reused, files)."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    from tqdm import tqdm

    groups = tasks(names)
    workers = min(workers or os.cpu_count() or 1, len(groups)) or 1
    set_progress(progress)
    bar = tqdm(total=len(names), desc="figures", unit="fig", disable=not progress, file=sys.stderr)
    rows = []
    try:
        if workers == 1:
            for group in groups:
                bar.set_postfix_str(",".join(group))
                rows += _build_group(group, size, out, progress)
                bar.update(len(group))
        else:           # spawn: a clean interpreter per worker (no forked matplotlib / thread state)
            with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
                futures = {pool.submit(_build_group, g, size, out, False): g for g in groups}
                for f in as_completed(futures):
                    rows += f.result()
                    bar.set_postfix_str(",".join(futures[f]))
                    bar.update(len(futures[f]))
    finally:
        bar.close()
    write_index(out)
    order = {n: i for i, n in enumerate(names)}
    return sorted(rows, key=lambda r: order[r["figure"]])


def run(cfg: DictConfig) -> list[dict]:
    c = FiguresConfig(**OmegaConf.to_container(cfg, resolve=True))
    try:
        names = resolve(c)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    out = Path(c.out)
    if c.figure == "all":
        for n, why in left_out().items():
            print(f"{n}: left out: {why}", file=sys.stderr)
    rows = build(names, c.size, out, c.progress, c.workers)
    for r in rows:
        print(f"{r['figure']:24s} {r['wall_s']:7.1f} s (measured)  simulations {r['simulated']:3d} run, "
              f"{r['reused']:3d} reused  {r['png']}")
    print(f"index: {out / 'index.md'}")
    return rows


@hydra.main(config_path=str(CONF), config_name="figures", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(cfg)
