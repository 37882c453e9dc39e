from tests.figures.golden_check import check


def test_golden_and_claim():
    df = check("edgeflow_fig14")
    assert set(df.source) == {"modelled"}
    # the claim: fewer bits read fewer bytes, yet EdgeFlow's TTFT stays flat while flash is off its critical path
    ef = df[df.framework == "edgeflow"].pivot_table(index="bits", columns="metric", values="value")
    assert ef["flash_bytes"].iloc[0] < 0.8 * ef["flash_bytes"].iloc[-1]
    assert (ef["critical_path.flash_s"] == 0).all()
    assert ef["ttft_s"].max() < 1.01 * ef["ttft_s"].min()
