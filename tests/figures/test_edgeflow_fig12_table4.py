import pytest

from tests.figures.golden_check import check


@pytest.mark.slow      # real SmolLM2 quantization + forward: ~1 min on 2 cores
def test_golden():
    df = check("edgeflow_fig12_table4")
    assert set(df.source) == {"measured"}
    assert (df.ppl > 1).all() and (df.kl_mean >= 0).all()
