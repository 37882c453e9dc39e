"""llama.cpp's and MNN's own costs on a host (planner/peer_costs.py): their own model, not the device profile's. A
phone profile has none of them; the model checks its values and the keys of its rate tables."""
from __future__ import annotations

import dataclasses
import math

import pytest

from planner.device import SocProfile
from planner.peer_costs import NO_PEER_COSTS, PEER_FIELDS, PeerCosts
from sim.coldstart.sweep import CONF, load_conf


def test_a_phone_profile_has_no_peer_cost_fields():
    names = {f.name for f in dataclasses.fields(SocProfile)}
    assert set(PEER_FIELDS) == {"llamacpp_fixed_s", "llamacpp_repack_gbps", "llamacpp_gemm_gops_per_ghz",
                                "mnn_fixed_s", "mnn_load_gbps", "mnn_gemm_gops_per_ghz"}
    assert not names & set(PEER_FIELDS)
    phone = load_conf("device", "xiaomi15pro", SocProfile)
    assert not any(hasattr(phone, k) for k in PEER_FIELDS)
    text = (CONF / "device" / "xiaomi15pro.yaml").read_text()
    assert not any(line.startswith(PEER_FIELDS) for line in text.splitlines())
    with pytest.raises(TypeError, match="llamacpp_fixed_s"):         # a phone profile cannot carry one
        SocProfile(**{**dataclasses.asdict(phone), "llamacpp_fixed_s": 0.05})


def test_no_peer_costs_means_nothing_measured():
    assert NO_PEER_COSTS == PeerCosts()
    assert NO_PEER_COSTS.llamacpp_fixed_s == 0 and NO_PEER_COSTS.mnn_fixed_s == 0
    assert not NO_PEER_COSTS.llamacpp_gemm_gops_per_ghz and not NO_PEER_COSTS.mnn_gemm_gops_per_ghz
    with pytest.raises(dataclasses.FrozenInstanceError):
        NO_PEER_COSTS.llamacpp_fixed_s = 1.0


def test_measured_values_are_kept_as_given():
    rates = {"Q8_0@576": 39.98445500754937, "Q4_K_M@2048": 65.67930908167963}
    p = PeerCosts(llamacpp_fixed_s=0.07177323638982648, llamacpp_repack_gbps=95.85114608030712,
                  llamacpp_gemm_gops_per_ghz=rates, mnn_fixed_s=3.76702840406444e-05,
                  mnn_load_gbps={"b8": 0.5606979156361424, "b4": 0.23149708379300374},
                  mnn_gemm_gops_per_ghz={"b8@576": 34.47543845267556, "b4@2048": 52.91868630597895})
    assert p.llamacpp_gemm_gops_per_ghz == rates and p.llamacpp_fixed_s == 0.07177323638982648
    rates["Q8_0@576"] = 1.0                                   # its own copy: a caller's later edit does not reach it
    assert p.llamacpp_gemm_gops_per_ghz["Q8_0@576"] == 39.98445500754937
    assert PeerCosts(**dataclasses.asdict(p)) == p


@pytest.mark.parametrize("kw,msg", [
    (dict(llamacpp_fixed_s=-0.1), r"peers\.llamacpp_fixed_s must be a finite number >= 0 \(got -0\.1\)"),
    (dict(mnn_fixed_s=math.nan), r"peers\.mnn_fixed_s must be a finite number >= 0 \(got nan\)"),
    (dict(llamacpp_repack_gbps=math.inf), r"peers\.llamacpp_repack_gbps must be a finite number >= 0"),
    (dict(llamacpp_repack_gbps="1.0"), r"peers\.llamacpp_repack_gbps must be a finite number >= 0 \(got '1\.0'\)"),
    (dict(mnn_fixed_s=True), r"peers\.mnn_fixed_s must be a finite number"),
    (dict(llamacpp_gemm_gops_per_ghz=[("Q8_0@576", 20.0)]), r"peers\.llamacpp_gemm_gops_per_ghz must be a table"),
    (dict(llamacpp_gemm_gops_per_ghz={"Q8_0": 20.0}), r"key 'Q8_0' must be '<file type>@<d_model>'"),
    (dict(llamacpp_gemm_gops_per_ghz={"Q9_9@576": 20.0}), r"key 'Q9_9@576' must be '<file type>@<d_model>'"),
    (dict(llamacpp_gemm_gops_per_ghz={"Q8_0@0": 20.0}), r"key 'Q8_0@0'"),
    (dict(llamacpp_gemm_gops_per_ghz={"Q8_0@576": 0.0}),
     r"peers\.llamacpp_gemm_gops_per_ghz\['Q8_0@576'\] must be a finite rate > 0 \(got 0\.0\)"),
    (dict(mnn_gemm_gops_per_ghz={"b8@576": -3.0}), r"mnn_gemm_gops_per_ghz\['b8@576'\] must be a finite rate > 0"),
    (dict(mnn_gemm_gops_per_ghz={"8@576": 3.0}), r"key '8@576' must be 'b<weight bits>@<d_model>'"),
    (dict(mnn_load_gbps={"b8@576": 0.5}), r"peers\.mnn_load_gbps: key 'b8@576' must be 'b<weight bits>'"),
    (dict(mnn_load_gbps={"b8": None}), r"mnn_load_gbps\['b8'\] must be a finite rate > 0 \(got None\)"),
])
def test_a_bad_value_is_an_error_naming_the_field(kw, msg):
    with pytest.raises(ValueError, match=msg):
        PeerCosts(**kw)
