"""The metrics writer refuses unlabelled numbers and records measured / modelled / input labels."""
from __future__ import annotations

import json

import pytest

from experiments.common import write_run_outputs


def test_every_number_is_labelled(tmp_path):
    write_run_outputs(tmp_path, None, {"method": "x", "ppl": 1.5, "model_bytes": 10, "bits": 4},
                      measured=["ppl"], modelled=["model_bytes"], inputs=["bits"])
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert doc["measured_keys"] == ["ppl"] and doc["modelled_keys"] == ["model_bytes"] and doc["input_keys"] == ["bits"]


def test_unlabelled_number_is_refused_and_nothing_written(tmp_path):
    with pytest.raises(ValueError, match="ttft_s"):
        write_run_outputs(tmp_path, None, {"ttft_s": 1.0, "oom": False}, measured=[], modelled=["oom"])
    assert not (tmp_path / "metrics.json").exists()
