"""Paper figures from one command (docs/figures.md): one module per figure, each with a `SPEC`, `data(size)`
and `plot(df, fig)` (see `experiments.figures.base`). `python -m experiments.figures figure=<name>|all` writes
`figures/<name>.csv/.png/.pdf` and `figures/index.md`.

`NAMES` is the one registry of figure modules, in index order; `CANNOT` lists the papers' figures the framework
cannot regenerate and why. A module whose figure needs results on disk (`FigureSpec.requires`) defines
`unavailable() -> str | None`; `unavailable(name)` asks it.
"""
from __future__ import annotations

import importlib
import importlib.util

from experiments.figures.base import Figure

NAMES = (
    "edgeflow_fig01", "edgeflow_fig02", "edgeflow_fig04", "edgeflow_fig05", "edgeflow_fig10", "edgeflow_fig11",
    "edgeflow_fig12_table4", "edgeflow_fig13", "edgeflow_fig14", "edgeflow_fig15", "edgeflow_fig16",
    "edgeflow_critical_path", "edgeflow_sensitivity",
    "host_coldstart",
    "voltron_fig02", "voltron_fig03_04", "voltron_fig05_06", "voltron_fig07", "voltron_fig08", "voltron_fig10",
    "voltron_fig11", "voltron_fig12", "voltron_fig13",
)

# (paper, figure, why the framework cannot regenerate it)
CANNOT = (
    ("EdgeFlow", "Fig. 3", "NPU matmul times of AWQ/CMPQ-quantized tensors need Qualcomm's QNN toolchain on a Hexagon "
     "NPU; the simulator takes the 2.59x / 2.63x / 2.66x factors as inputs, so a plot would only echo them"),
    ("EdgeFlow", "Figs. 6-9, 17", "design diagrams (overview, weightlet layout, unpacking steps, scheduling, operator "
     "placement), not data; docs/packing.md and docs/coldstart.md describe the implemented versions"),
    ("EdgeFlow", "Figs. 5a, 5b", "5a is a per-subgraph timeline: the Perfetto trace of "
     "`python -m experiments.coldstart framework=llmnpu_mat` shows it; 5b (RMSNorm / SwiGLU / quantize on NPU vs "
     "CPU) is the profile's input `npu_inefficient_factor` = 2.1x, so a plot would only echo it (edgeflow_fig05 "
     "draws 5c)"),
    ("Voltron", "Figs. 1, 9", "architecture and system-overview diagrams, not data"),
    ("Voltron", "Fig. 3", "(a, b) diagrams of MP and TP; (c) their TPOT breakdown on a homogeneous cluster, which is "
     "not a configured cluster (voltron_fig03_04 shows the same contrast on the heterogeneous ones, as Fig. 4)"),
)


def available() -> tuple[str, ...]:
    """Registered figure modules that exist (a module may land later than its name)."""
    return tuple(n for n in NAMES if importlib.util.find_spec(f"experiments.figures.{n}") is not None)


def unavailable(name: str) -> str | None:
    """Why figure `name` cannot be drawn now (results it needs are not on disk), or None."""
    mod = importlib.import_module(f"experiments.figures.{name}")
    check = getattr(mod, "unavailable", None)
    return check() if check else None


def load(name: str) -> Figure:
    if name not in NAMES:
        raise ValueError(f"figure: unknown figure {name!r}; one of: all, {', '.join(available())}")
    mod = importlib.import_module(f"experiments.figures.{name}")
    return Figure(mod.SPEC, mod.data, mod.plot)
