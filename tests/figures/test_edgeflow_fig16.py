from tests.figures.golden_check import check


def test_golden_and_claim():
    df = check("edgeflow_fig16")
    assert set(df.source) == {"modelled"}
    # the claim at short prompts: the graph thread's restores bound EdgeFlow's prefill, so stealing changes nothing
    v = df.set_index(["framework", "metric"]).value
    assert v["edgeflow", "ttft_s"] == v["ef_priority", "ttft_s"]
    path = {m: x for (f, m), x in v.items() if f == "edgeflow" and m.startswith("critical_path.")}
    assert max(path, key=path.get) == "critical_path.graph_s"
