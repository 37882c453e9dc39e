from tests.figures.golden_check import check


def test_golden():
    df = check("edgeflow_sensitivity")
    assert set(df.source) == {"modelled"}
