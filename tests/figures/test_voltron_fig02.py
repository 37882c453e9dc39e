from tests.figures.golden import check


def test_golden():
    df = check("voltron_fig02")
    assert "modelled" in set(df.source)
