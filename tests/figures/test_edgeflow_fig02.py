from tests.figures.golden_check import check


def test_golden():
    df = check("edgeflow_fig02")
    assert {"modelled", "paper"} <= set(df.source)
