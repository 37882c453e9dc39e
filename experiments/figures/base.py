"""The contract of one paper-figure module and the writer of its outputs (docs/figures.md).

A figure module under `experiments/figures/` defines `SPEC` (a `FigureSpec`: which paper figure, what is simulated,
what is measured on real hardware, the paper's claim in our words), `data(size) -> pandas.DataFrame` (the CSV behind
the figure, built from the library functions of `sim/`, `planner/` and `quant/`; every row carries a `source` column:
`modelled`, `measured` or `paper`) and `plot(df, fig)` (draws into a matplotlib Figure). `write_figure` writes
`<out>/<name>.csv`, `.png` and `.pdf` atomically. `size` is `full` (the paper's setting) or `toy` (seconds; the
golden tests of `tests/figures/` pin its CSV).

Presentation rules every figure follows (`tests/figures/layout_check.py` checks the first two on every figure):
legends sit outside the axes (`legend`) or in a figure-level row (`fig_legend`), never over data; no text leaves the
figure (constrained layout); what is simulated or measured is said under the heading (`note`), not inside an axis;
identifiers are shown by their display names (`experiments.figures.names.label`).
"""
from __future__ import annotations

import io
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from quant.atomic import atomic_write_bytes

SIZES = ("full", "toy")
SOURCES = ("modelled", "measured", "paper")     # values of the `source` column


@dataclass(frozen=True)
class FigureSpec:
    name: str                   # module and file stem, e.g. "edgeflow_fig01"
    paper: str                  # "EdgeFlow" | "Voltron" | "This host"
    figure: str                 # the paper's figure as its design text references it, e.g. "Fig. 1"; "" if none
    topic: str                  # what the figure is about, in a reader's words, e.g. "Cold-start ablation"
    title: str                  # the setting shown: model, device, prompt, budget …
    claim: str                  # the paper's claim in our own words (from its design sections)
    simulated: str              # what this framework simulates for it ("" if nothing)
    measured: str = ""          # what is measured on real hardware (this host) for it ("" if nothing)
    withheld: bool = False      # True: a counterpart of the paper's evaluation (not in its design text)
    # golden-test tolerances per CSV column: column -> (relative, absolute); columns not listed compare exactly
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)
    # columns that are measured on this host (never compared with a golden file: they change run to run)
    measured_columns: tuple[str, ...] = ()
    # what must exist on disk for the figure to be drawn ("" = nothing: it is always drawn); the module's
    # `unavailable()` then says whether it is there
    requires: str = ""

    def __post_init__(self):
        if self.withheld and self.figure:
            raise ValueError(f"figure {self.name}: a counterpart of the withheld evaluation names no paper figure "
                             f"(the design text does not say which number the paper gave it; got {self.figure!r})")

    @property
    def heading(self) -> str:
        """The figure's heading: its topic and the paper figure it stands for, as far as the design text says."""
        if self.withheld:
            return f"{self.topic} (counterpart of {self.paper}'s evaluation)"
        if self.figure:
            return f"{self.topic} ({self.paper} {self.figure})"
        return f"{self.topic} (not a paper figure)"


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


FIGSIZE = (10.0, 5.5)       # inches; every figure is drawn at this size (the PNG at 110 dpi)
DPI = 110
HEADING_CHARS = 140         # heading lines wrap here: about the figure's width at 10 pt


def draw(fig_obj: Figure, df: pd.DataFrame):
    """The matplotlib Figure of `fig_obj` over `df`, laid out (constrained layout) and drawn; the caller closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    try:
        fig_obj.plot(df, fig)
        notes = "; ".join(getattr(fig, NOTES, []))
        lines = [fig_obj.spec.heading, fig_obj.spec.title + (f" — {notes}" if notes else "")]
        fig.suptitle("\n".join(textwrap.fill(line, HEADING_CHARS) for line in lines), fontsize=10)
        fig.canvas.draw()
    except BaseException:
        plt.close(fig)
        raise
    return fig


def render(fig_obj: Figure, df: pd.DataFrame) -> tuple[bytes, bytes]:
    """(PNG bytes, PDF bytes) of the figure."""
    import matplotlib.pyplot as plt

    fig = draw(fig_obj, df)
    try:
        png, pdf = io.BytesIO(), io.BytesIO()
        fig.savefig(png, format="png", dpi=DPI)
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


NOTES = "_figure_notes"      # attribute of a matplotlib Figure holding its notes until the heading is drawn


def note(fig, text: str) -> None:
    """A note on what the figure's numbers are (e.g. "simulated"), shown after the setting line of the
    heading, never inside an axis. `fig` is the matplotlib Figure (or one of its axes)."""
    fig = fig if hasattr(fig, "suptitle") else fig.figure
    notes = getattr(fig, NOTES, [])
    setattr(fig, NOTES, notes + [text])


def legend(ax, **kw):
    """The axis' legend outside it, right of the plot area (constrained layout makes room for it)."""
    kw.setdefault("fontsize", 8)
    return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kw)


def fig_legend(fig, axes, **kw):
    """One legend for several axes (their handles, each label once), in a row under the plots."""
    seen: dict[str, object] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    kw.setdefault("fontsize", 8)
    kw.setdefault("ncol", min(len(seen), 5) or 1)
    return fig.legend(list(seen.values()), list(seen), loc="outside lower center", **kw)
