from tests.figures.golden_check import check


def test_golden():
    df = check("voltron_fig05_06")
    assert set(df.source) == {"modelled"}
