"""`python -m experiments.figures figure=<name>|all|index size=full|toy out=figures progress=true`.

Thin Hydra app: resolves the figure names, writes each figure's CSV / PNG / PDF through `experiments.figures.base`
and the index page; a tqdm bar with an ETA over the figures unless `progress=false`. Errors in the arguments stop
before any work with one line `error: <key>: ...` (exit 2); so does a figure asked for by name whose results are
not on disk. `all` leaves such a figure out and prints why.
"""
from __future__ import annotations

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
    if not isinstance(c.out, str) or not c.out.strip():
        raise ConfigError(f"out: an output directory (got {c.out!r})")
    resolve(c)


def build(names: list[str], size: str, out: Path, progress: bool = True) -> list[dict]:
    """Write every figure in `names` and the index; returns one summary row per figure (name, seconds, files)."""
    from tqdm import tqdm

    set_progress(progress)
    rows = []
    bar = tqdm(names, desc="figures", unit="fig", disable=not progress, file=sys.stderr)
    for name in bar:
        bar.set_postfix_str(name)
        t0 = time.perf_counter()
        paths = write_figure(load(name), size, out)
        rows.append({"figure": name, "wall_s": time.perf_counter() - t0, **{k: str(v) for k, v in paths.items()}})
    write_index(out)
    return rows


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
    rows = build(names, c.size, out, c.progress)
    for r in rows:
        print(f"{r['figure']:24s} {r['wall_s']:7.1f} s (measured)  {r['png']}")
    print(f"index: {out / 'index.md'}")
    return rows


@hydra.main(config_path=str(CONF), config_name="figures", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(cfg)
