from tests.figures.golden_check import check


def test_golden_and_claim():
    df = check("edgeflow_fig13")
    assert set(df.source) == {"modelled"}
    # the claim at a short prompt: bits, packing and the pipeline each cut the flash-bound TTFT
    t = df[df.metric == "ttft_s"].set_index("framework").value
    assert t["llmnpu_plus"] > t["ef_mixed"] > t["ef_pack"] > t["edgeflow"]
