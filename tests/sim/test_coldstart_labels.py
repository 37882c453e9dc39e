"""metrics.json labels of the cold-start study: the prompt length and the bit budget are inputs echoed next to the
results (`input_keys`), every other number is modelled, and each number carries exactly one label."""
import json

import pytest

from experiments.coldstart import register_coldstart, run
from planner.framework import FrameworkSpec
from quant.arch import ModelSpec
from sim.coldstart.run import INPUTS, MODELLED, ColdStartSettings, input_keys, modelled_keys, run_one
from sim.coldstart.sweep import load_conf
from tests.sim.helpers import xiaomi


def test_inputs_are_not_modelled():
    assert set(INPUTS) == {"prompt_tokens", "bits"} and not set(INPUTS) & set(MODELLED)


@pytest.mark.parametrize("fw", ["llamacpp", "edgeflow"])
def test_every_number_has_exactly_one_label(fw):
    spec = load_conf("model", "smollm2_135m", ModelSpec)
    m, _ = run_one(spec, xiaomi(), load_conf("framework", fw, FrameworkSpec), None,
                   ColdStartSettings(prompt_tokens=40, bits_source="uniform", write_trace=False))
    modelled, inputs = set(modelled_keys(m)), set(input_keys(m))
    assert inputs == {"prompt_tokens", "bits"} and not modelled & inputs
    numbers = {k for k, v in m.items() if not isinstance(v, str)}
    assert numbers == modelled | inputs


def test_app_labels_inputs(compose, tmp_path, monkeypatch):
    register_coldstart()
    monkeypatch.chdir(tmp_path)
    run(compose("coldstart", ["bits_source=uniform", "framework=edgeflow", "model=smollm2_135m", "prompt_tokens=40",
                              "write_trace=false"]))
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert doc["input_keys"] == ["bits", "prompt_tokens"] and doc["prompt_tokens"] == 40 and doc["bits"] == 5.0
    assert "bits" not in doc["modelled_keys"] and "prompt_tokens" not in doc["modelled_keys"]
    assert "ttft_s" in doc["modelled_keys"] and doc["measured_keys"] == []
