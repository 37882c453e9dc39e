from tests.figures.golden_check import check


def test_golden():
    df = check("edgeflow_fig11")
    assert set(df.source) == {"modelled"}
