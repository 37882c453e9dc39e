from tests.figures.golden_check import check


def test_golden():
    df = check("voltron_fig11")
    assert "modelled" in set(df.source)
