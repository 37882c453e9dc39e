"""Golden-data check of the figure CSVs (regenerated deliberately, never silently: docs/figures.md "Golden data").

`check(name)` builds the figure's data at toy size, writes it as the figure writer does (CSV, 6 significant digits)
and compares it with `tests/figures/golden/<name>.csv`: same columns, same rows in the same order, text cells equal,
numbers within the figure's named tolerances (`SPEC.tolerances`, else DEFAULT_REL / DEFAULT_ABS). Columns that are
timings on this host (`SPEC.measured_columns`) are left out: they change run to run. Measured values that are
deterministic (perplexity of a fixed NumPy forward) are compared, within their figure's tolerance.
Regenerate on purpose with `UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/figures`.

The same data is then drawn as the figure writer draws it and must pass the layout check
(`tests/figures/layout_check.py`: no legend over data, no text cut by the figure's edge), so every figure's test
checks its layout too.
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.figures import load
from experiments.figures.base import check_frame, draw
from tests.figures.layout_check import problems

GOLDEN = Path(__file__).parent / "golden"
DEFAULT_REL = 1e-4     # relative: above the CSV's 6-digit rounding, far below any modelling change
DEFAULT_ABS = 1e-9     # absolute, for values that are 0 in the golden


def _stable(spec, df: pd.DataFrame) -> pd.DataFrame:
    df = df.drop(columns=[c for c in spec.measured_columns if c in df.columns])
    buf = io.StringIO()
    df.to_csv(buf, index=False, float_format="%.6g")
    return pd.read_csv(io.StringIO(buf.getvalue()), keep_default_na=False, na_values=[""])


def check_layout(fig, df: pd.DataFrame) -> None:
    import matplotlib.pyplot as plt

    drawn = draw(fig, df)
    try:
        found = problems(drawn)
    finally:
        plt.close(drawn)
    assert not found, f"{fig.spec.name}: " + "; ".join(found)


def check(name: str) -> pd.DataFrame:
    """The golden comparison of the figure's toy data, then the layout check of its drawing; returns the data."""
    fig = load(name)
    raw = check_frame(fig.spec, fig.data("toy"))
    got = _compare(name, fig, _stable(fig.spec, raw))
    check_layout(fig, raw)
    return got


def _compare(name: str, fig, got: pd.DataFrame) -> pd.DataFrame:
    path = GOLDEN / f"{name}.csv"
    if os.environ.get("UPDATE_GOLDEN") == "1" or not path.exists():
        if os.environ.get("UPDATE_GOLDEN") != "1":
            raise AssertionError(f"no golden file {path}; create it with UPDATE_GOLDEN=1")
        GOLDEN.mkdir(exist_ok=True)
        got.to_csv(path, index=False, float_format="%.6g")
        return got
    want = pd.read_csv(path, keep_default_na=False, na_values=[""])
    assert list(got.columns) == list(want.columns), f"{name}: columns {list(got.columns)} != {list(want.columns)}"
    assert len(got) == len(want), f"{name}: {len(got)} rows, golden has {len(want)}"
    for col in want.columns:
        g, w = got[col], want[col]
        if pd.api.types.is_numeric_dtype(w) and pd.api.types.is_numeric_dtype(g):
            rel, abs_ = fig.spec.tolerances.get(col, (DEFAULT_REL, DEFAULT_ABS))
            ok = np.isclose(g.to_numpy(float), w.to_numpy(float), rtol=rel, atol=abs_, equal_nan=True)
            bad = np.flatnonzero(~ok)
            assert not len(bad), (f"{name}: column {col} row {bad[0]}: {g.iloc[bad[0]]} vs golden {w.iloc[bad[0]]} "
                                  f"(rel {rel}, abs {abs_}); {len(bad)} rows differ")
        else:
            gs, ws = g.astype(str).to_numpy(), w.astype(str).to_numpy()
            bad = np.flatnonzero((gs != ws) & ~(g.isna().to_numpy() & w.isna().to_numpy()))
            assert not len(bad), f"{name}: column {col} row {bad[0]}: {gs[bad[0]]!r} vs golden {ws[bad[0]]!r}"
    return got
