from experiments.figures.data import PHONE
from experiments.figures.names import label
from sim.coldstart.sensitivity import variants
from tests.figures.golden_check import check


def test_golden():
    df = check("edgeflow_sensitivity")
    assert set(df.source) == {"modelled"}


def test_every_row_has_a_display_name():
    """The full-size figure's tick labels: every parameter key of the sensitivity rows (the assumed profile values,
    the modelling assumptions and llama.cpp's host-measured costs) is shown by its display name, not as a key."""
    keys = list(dict.fromkeys(key for key, _, _ in variants(PHONE)))
    raw = [k for k in keys if "_" in label(k)]
    assert not raw, f"no display name in experiments/figures/names.py for {raw}"
