from tests.figures.golden import check


def test_golden():
    df = check("edgeflow_fig02")
    assert {"modelled", "paper"} <= set(df.source)
