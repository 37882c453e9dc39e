from tests.figures.golden import check


def test_golden():
    df = check("voltron_fig13")
    assert "modelled" in set(df.source)
