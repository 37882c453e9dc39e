from tests.figures.golden_check import check


def test_golden():
    df = check("edgeflow_fig10")
    assert "modelled" in set(df.source)
