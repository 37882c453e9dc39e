"""hil.cluster.shard_ops on a tiny random Llama (no GGUF): per-precision quantization, the stacked front GEMM equals the
per-shard GEMMs bit for bit, any split of a sublayer's shards sums to the whole, and the all-FP16 shard forward
matches quant.llama's float forward."""
from __future__ import annotations

import numpy as np
import pytest

from hil.cluster.shard_ops import FP16, INT4, INT8, QLinear, ShardState, residual
from quant.arch import ModelSpec
from quant.llama import forward_logits


def tiny_spec() -> ModelSpec:
    return ModelSpec(name="tiny", n_layers=2, d_model=64, d_ffn=96, n_heads=4, n_kv_heads=2, head_dim=16, vocab=97,
                     tied_embeddings=True)


class FakeSource:
    """The `TensorSource` interface over a dict of random float32 tensors (GGUF names, (out, in) shapes)."""

    def __init__(self, spec: ModelSpec, seed: int = 0):
        rng = np.random.default_rng(seed)
        d = spec.d_model
        w = {"token_embd.weight": rng.normal(0, 1, (spec.vocab, d)), "output_norm.weight": 1 + 0.1 * rng.normal(size=d)}
        for i in range(spec.n_layers):
            p = f"blk.{i}."
            w[p + "attn_norm.weight"] = 1 + 0.1 * rng.normal(size=d)
            w[p + "ffn_norm.weight"] = 1 + 0.1 * rng.normal(size=d)
            for name, shape in spec.linear_shapes().items():
                w[p + name + ".weight"] = rng.normal(0, 1 / np.sqrt(shape[1]), shape)
        self.w = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in w.items()}

    def get(self, name: str) -> np.ndarray:
        return self.w[name]

    def cached_bytes(self) -> int:
        return 0


def _state(spec, src, items, head=FP16, ffn_shards=4):
    st = ShardState(spec, src)
    st.set(items, 32, head, ffn_shards)
    return st


def test_qlinear_codes_and_bytes():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(6, 40)).astype(np.float32)
    q8, q4, q16 = QLinear.quantize(w, INT8), QLinear.quantize(w, INT4), QLinear.quantize(w, FP16)
    assert q8.w.dtype == np.int8 and np.abs(q8.w).max() == 127 and np.abs(q4.w).max() == 7
    assert (np.abs(q4.w) <= 7).all() and q16.w.dtype == np.float16
    assert q8.nominal_bytes() == 6 * 40 + 24 and q4.nominal_bytes() == 6 * 20 + 24 and q16.nominal_bytes() == 480
    x = rng.normal(size=(3, 40)).astype(np.float32)
    exact = x @ w.T
    for q, tol in ((q16, 1e-2), (q8, 0.05), (q4, 0.6)):
        assert np.abs(q(x) - exact).max() < tol * np.abs(exact).max()
    with pytest.raises(ValueError, match="precision"):
        QLinear.quantize(w, 3)


@pytest.mark.parametrize("prec", [INT8, INT4])
def test_stacked_front_equals_per_shard(prec):
    spec = tiny_spec()
    src = FakeSource(spec)
    h = np.random.default_rng(2).normal(size=(5, spec.d_model)).astype(np.float32)
    both = _state(spec, src, [(0, (0, 1), prec), (1, (0, 1, 2, 3), prec)])
    assert both.held[0].front is not None and both.held[1].front is not None
    for j in (0, 1):
        parts = [_state(spec, src, [(j, (s,), prec)]).partial(j, h, 0) for s in sorted(both.held[j].shards)]
        whole = both.partial(j, h, 0)
        np.testing.assert_array_equal(whole, sum(parts[1:], parts[0]))  # exact: float64 sums of the same float32s


def test_split_sums_to_whole_and_kv_roundtrip():
    spec = tiny_spec()
    src = FakeSource(spec)
    h = np.random.default_rng(3).normal(size=(4, spec.d_model)).astype(np.float32)
    a = _state(spec, src, [(1, (0, 1), INT8)])
    b = _state(spec, src, [(1, (2, 3), INT8)])
    whole = _state(spec, src, [(1, (0, 1, 2, 3), INT8)])
    np.testing.assert_array_equal(a.partial(1, h, 0) + b.partial(1, h, 0), whole.partial(1, h, 0))
    st = _state(spec, src, [(0, (1,), INT8)])
    st.partial(0, h, 0)
    kv = st.export_kv(0, 1, 4)
    other = _state(spec, src, [(0, (1,), INT4)])
    other.import_kv(0, 1, kv)
    np.testing.assert_array_equal(other.export_kv(0, 1, 4), kv)
    with pytest.raises(ValueError, match="not held here"):
        st.export_kv(0, 0, 4)
    with pytest.raises(ValueError, match="KV capacity"):
        st.partial(0, h, 30)


def test_fp16_shards_match_float_forward():
    spec = tiny_spec()
    src = FakeSource(spec)
    tokens = np.array([3, 14, 15, 92, 65, 35])
    items = [(j, tuple(range(spec.n_kv_heads if j % 2 == 0 else 4)), FP16) for j in range(2 * spec.n_layers)]
    st = _state(spec, src, items, head=FP16)
    h = st.embed(tokens)
    for j in range(2 * spec.n_layers):
        h = residual(h, st.partial(j, h, 0))
    got = st.logits(h[-1:])
    want = forward_logits(src.w, spec, tokens)[-1]
    assert np.abs(got - want).max() < 2e-2 * np.abs(want).max()
    assert np.argmax(got) == np.argmax(want)
