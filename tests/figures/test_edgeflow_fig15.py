from tests.figures.golden_check import check


def test_golden():
    df = check("edgeflow_fig15")
    assert set(df.source) == {"modelled"}
