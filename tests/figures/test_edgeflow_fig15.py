from tests.figures.golden_check import check


def test_golden_and_claim():
    df = check("edgeflow_fig15")
    assert set(df.source) == {"modelled"}
    # the claim: EdgeFlow costs the least energy; its peak memory is 0.15-0.3 GB above llm.npu+'s, not below
    v = df.set_index(["framework", "metric"]).value
    assert v["edgeflow", "energy_j"] == min(v[f, "energy_j"] for f in ("mnn", "llmnpu_plus", "edgeflow"))
    assert 0.1 < v["edgeflow", "peak_mem_gb"] - v["llmnpu_plus", "peak_mem_gb"] < 0.35
