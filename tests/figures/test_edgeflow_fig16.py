from tests.figures.golden_check import check


def test_golden():
    df = check("edgeflow_fig16")
    assert set(df.source) == {"modelled"}
