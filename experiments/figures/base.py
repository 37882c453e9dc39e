"""The contract of one paper-figure module and the writer of its outputs (issue 10; docs/figures.md).

A figure module under `experiments/figures/` defines `SPEC` (a `FigureSpec`: which paper figure, what is simulated,
what is measured on real hardware, the paper's claim in our words), `data(size) -> pandas.DataFrame` (the CSV behind
the figure, built from the library functions of `sim/`, `planner/` and `quant/`; every row carries a `source` column:
`modelled`, `measured` or `paper`) and `plot(df, fig)` (draws into a matplotlib Figure). `write_figure` writes
`<out>/<name>.csv`, `.png` and `.pdf` atomically. `size` is `full` (the paper's setting) or `toy` (seconds; the
golden tests of `tests/figures/` pin its CSV).
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from quant.atomic import atomic_write_bytes

SIZES = ("full", "toy")
SOURCES = ("modelled", "measured", "paper")     # values of the `source` column
NOT_MEASURED = "not measured in this run"       # written on a figure whose measured part has no results on disk


@dataclass(frozen=True)
class FigureSpec:
    name: str                   # module and file stem, e.g. "edgeflow_fig01"
    paper: str                  # "EdgeFlow" | "Voltron"
    figure: str                 # the paper's numbering, e.g. "Fig. 1" or "Fig. 12 + Table 4"
    title: str                  # what the figure shows
    claim: str                  # the paper's claim in our own words (from its design sections)
    simulated: str              # what this framework simulates for it ("" if nothing)
    measured: str = ""          # what is measured on real hardware (this host) for it ("" if nothing)
    withheld: bool = False      # True: the paper's figure is in its withheld evaluation; this is our counterpart
    # golden-test tolerances per CSV column: column -> (relative, absolute); columns not listed compare exactly
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)
    # columns that are measured on this host (never compared with a golden file: they change run to run)
    measured_columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class Figure:
    spec: FigureSpec
    data: Callable[[str], pd.DataFrame]             # size -> the CSV behind the figure
    plot: Callable[[pd.DataFrame, object], None]    # (data, matplotlib Figure) -> draws


_PROGRESS = {"on": True}        # set by the app (`progress=false` silences every bar)


def set_progress(on: bool) -> None:
    _PROGRESS["on"] = bool(on)


def progress(items, desc: str):
    """tqdm bar with ETA on stderr over a figure's long loop (nested under the app's bar); silenced by the app."""
    import sys

    from tqdm import tqdm

    items = list(items)
    return tqdm(items, desc=desc, leave=False, disable=not _PROGRESS["on"] or len(items) < 2, file=sys.stderr)


def check_size(size: str) -> str:
    if size not in SIZES:
        raise ValueError(f"size: must be one of {', '.join(SIZES)} (got {size!r})")
    return size


def check_frame(spec: FigureSpec, df: pd.DataFrame) -> pd.DataFrame:
    """Every figure's CSV is non-empty and labels each row modelled / measured / paper."""
    if df.empty:
        raise ValueError(f"figure {spec.name}: no data")
    if "source" not in df.columns:
        raise ValueError(f"figure {spec.name}: the CSV has no `source` column (modelled / measured / paper)")
    bad = sorted(set(df["source"]) - set(SOURCES))
    if bad:
        raise ValueError(f"figure {spec.name}: unknown source labels {bad}")
    return df


def render(fig_obj: Figure, df: pd.DataFrame) -> tuple[bytes, bytes]:
    """(PNG bytes, PDF bytes) of the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(10, 5.5))
    try:
        fig_obj.plot(df, fig)
        fig.suptitle(f"{fig_obj.spec.paper} {fig_obj.spec.figure}: {fig_obj.spec.title}", fontsize=10)
        fig.tight_layout()
        png, pdf = io.BytesIO(), io.BytesIO()
        fig.savefig(png, format="png", dpi=110)
        fig.savefig(pdf, format="pdf", metadata={"CreationDate": None, "ModDate": None})
        return png.getvalue(), pdf.getvalue()
    finally:
        plt.close(fig)


def write_figure(fig_obj: Figure, size: str, out: Path) -> dict[str, Path]:
    """Build the data at `size`, write `<out>/<name>.csv/.png/.pdf` atomically; returns the paths."""
    df = check_frame(fig_obj.spec, fig_obj.data(check_size(size)))
    png, pdf = render(fig_obj, df)
    out = Path(out)
    stem = fig_obj.spec.name
    paths = {"csv": out / f"{stem}.csv", "png": out / f"{stem}.png", "pdf": out / f"{stem}.pdf"}
    atomic_write_bytes(paths["csv"], df.to_csv(index=False, float_format="%.6g").encode())
    atomic_write_bytes(paths["png"], png)
    atomic_write_bytes(paths["pdf"], pdf)
    return paths


def note(ax, text: str) -> None:
    """A grey note in the corner of an axis (e.g. NOT_MEASURED, or 'modelled')."""
    ax.text(0.99, 0.98, text, transform=ax.transAxes, ha="right", va="top", fontsize=8, color="0.35")
