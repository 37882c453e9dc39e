from tests.figures.golden_check import check


def test_golden():
    df = check("edgeflow_critical_path")
    assert set(df.source) == {"modelled"}


def test_claim_holds_on_the_data():
    # the claim: flash bounds llama.cpp's and llm.npu+'s cold starts; EdgeFlow's critical path does not read flash
    df = check("edgeflow_critical_path")
    tot = df.groupby(["framework", "resource"]).seconds.sum()
    assert tot["llamacpp"].idxmax() in ("flash", "cpu") and tot["llmnpu_plus"].idxmax() == "flash"
    assert tot["edgeflow"]["flash"] == 0.0 and tot["edgeflow"].idxmax() == "graph"
