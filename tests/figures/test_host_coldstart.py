"""host_coldstart reads validate results from disk: the golden test reads a stored validate metrics.json
(`golden/host_validate/`), and without results the figure says so instead of inventing numbers."""
from pathlib import Path

import pandas as pd

from experiments.figures import host_coldstart, load
from experiments.figures.base import NOT_MEASURED, write_figure
from tests.figures.golden_check import check

FIXTURE = Path(__file__).parent / "golden" / "host_validate"


def test_golden(monkeypatch):
    monkeypatch.setattr(host_coldstart, "RESULT_ROOTS", [FIXTURE])
    df = check("host_coldstart")
    assert {"modelled", "measured"} == set(df.source)


def test_not_measured(monkeypatch, tmp_path):
    monkeypatch.setattr(host_coldstart, "RESULT_ROOTS", [tmp_path / "none"])
    paths = write_figure(load("host_coldstart"), "toy", tmp_path)
    df = pd.read_csv(paths["csv"])
    assert list(df.stat) == [NOT_MEASURED] and df.value.isna().all()
    assert paths["png"].stat().st_size > 0
