from tests.figures.golden import check


def test_golden():
    df = check("edgeflow_fig04")
    assert {"modelled", "paper"} <= set(df.source)
