"""Component calibration (docs/design.md §7): the simulated components of the Xiaomi 15 Pro profile reproduce the
EdgeFlow figures within 10 %. These scenarios are the figures' own set-ups (llm.npu Fig. 1, loading Fig. 4b, §4.3
threshold); end-to-end TTFTs of EdgeFlow and the CPU baselines are not among them."""
import pytest

from sim.coldstart.calibration import TARGETS, calibration_report
from tests.sim.helpers import llama, xiaomi


@pytest.fixture(scope="module")
def report():
    return calibration_report(llama(), xiaomi())


@pytest.mark.parametrize("key", sorted(TARGETS))
def test_component_within_10_percent(report, key):
    assert report[key] == pytest.approx(TARGETS[key], rel=0.10), (key, report[key], TARGETS[key])


def test_threshold_is_exactly_the_papers(report):
    assert report["steal_threshold"] == 5


def test_calibration_is_sensitive_to_the_profile():
    """The checks would catch a wrong parameter: halving the flash bandwidth breaks the Fig. 4b loads."""
    from dataclasses import replace

    bad = calibration_report(llama(), replace(xiaomi(), flash_peak_gbps=1.4, flash_reader_gbps=1.2))
    assert bad["fig4b_load_kquant"] > 1.6 * 1.5


def test_profile_values_are_the_fit():
    """The fitted values stored in conf/device/xiaomi15pro.yaml are what `fit_profile` derives from the figures."""
    from sim.coldstart.calibration import fit_profile

    dev = xiaomi()
    fit = fit_profile(llama(), dev, rounds=3)
    for key in ("flash_peak_gbps", "flash_reader_gbps", "cpu_copy_gbps", "kquant_unpack_cycles_per_weight",
                "npu_ctx_deserialize_gbps", "npu_int8_tops", "cpu_int8_gemm_gops_per_ghz", "npu_compose_s_per_gb",
                "npu_optimize_s_per_gb", "npu_prepare_s_per_gb"):
        assert getattr(dev, key) == pytest.approx(getattr(fit, key), rel=0.01), key
