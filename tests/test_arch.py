"""Every conf/model entry composes into a valid ModelSpec with the public parameter count."""
from __future__ import annotations

import pytest

from experiments.common import ConfigError, typed
from quant.arch import ModelSpec
from tests.conftest import CONF_DIR

MODELS = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))

# Text-decoder parameter counts from the model cards (billions); biases/norm details are ignored, so 3 % tolerance.
PUBLIC_PARAMS_B = {
    "llama3_8b": 8.03, "mistral_7b": 7.25, "phi3_3_8b": 3.82, "qwen1_5_1_8b": 1.84, "qwen1_5_4b": 3.95,
    "qwen1_5_7b": 7.72, "qwen1_5_14b": 14.17, "qwen1_5_moe_a2_7b": 14.32, "qwen2_5_3b": 3.09, "qwen2_5_7b": 7.62,
    "qwen2_5_14b": 14.77, "gemma3_4b": 3.88, "gemma3_12b": 11.77, "smollm2_135m": 0.1348,
    "llama3_2_1b_synth": 1.074,   # Llama-3.2-1B (1.236) with SmolLM2's 49152-token vocabulary instead of 128256
    "qwen2_5_0_5b_synth": 0.402,  # Qwen2.5-0.5B (0.494) with SmolLM2's 49152-token vocabulary instead of 151936
}


@pytest.mark.parametrize("name", MODELS)
def test_model_config_composes(compose, name):
    cfg = compose(overrides=[f"+model={name}"])
    spec = typed(cfg.model, ModelSpec, "model")
    assert spec.name == name
    assert spec.total_params() / 1e9 == pytest.approx(PUBLIC_PARAMS_B[name], rel=0.03)


def test_layer_variants():
    from tests.conftest import CONF_DIR  # noqa: F401

    g = ModelSpec(name="g", n_layers=12, d_model=8, d_ffn=16, n_heads=4, n_kv_heads=2, head_dim=2, vocab=10,
                  sliding_window=1024, sliding_window_pattern=6)
    assert [g.is_swa_layer(i) for i in range(6)] == [True] * 5 + [False]
    assert g.attention_kind == "GQA"


def test_bad_model_value_names_key(compose):
    cfg = compose(overrides=["+model=llama3_8b", "model.n_kv_heads=5"])
    with pytest.raises(ConfigError, match="n_kv_heads"):
        typed(cfg.model, ModelSpec, "model")


def test_weight_source_from_plain_yaml_string_is_typed_and_bad_one_named():
    from quant.arch import WeightSource
    shape = dict(name="x", n_layers=1, d_model=8, d_ffn=8, n_heads=1, n_kv_heads=1, head_dim=8, vocab=8)
    assert ModelSpec(**shape, weights="synthetic").weights is WeightSource.synthetic
    with pytest.raises(ValueError, match="model.weights must be one of"):
        ModelSpec(**shape, weights="bogus")
