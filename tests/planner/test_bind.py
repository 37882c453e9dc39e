"""Executable plans: tensor names on every task that moves or uses weights, and binding to a file's byte ranges."""
from planner.cost import AnalyticCostModel
from planner.device import SocProfile
from planner.framework import FrameworkSpec
from planner.pipeline.bind import _split, bind_plan
from planner.pipeline.dag import head_tensor_names, layer_tensor_names
from planner.plan import Plan, TensorRef
from quant.arch import ModelSpec
from sim.coldstart import POLICIES, ColdStartInputs
from sim.coldstart.sweep import load_conf


def tiny() -> ModelSpec:
    return ModelSpec(name="tiny", n_layers=2, d_model=64, d_ffn=96, n_heads=4, n_kv_heads=2, head_dim=16, vocab=97,
                     tied_embeddings=True)


def plan_for(fw: str, tokens: int = 20) -> Plan:
    dev = load_conf("device", "xiaomi15pro", SocProfile)
    f = load_conf("framework", fw, FrameworkSpec)
    f.chunk_tokens = 8
    x = ColdStartInputs(tiny(), dev, f, AnalyticCostModel(dev), tokens, 5.0, bits_source="uniform")
    return POLICIES[f.policy]().build(x)


def entries(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    names = [n for i in range(spec.n_layers) for n in layer_tensor_names(i)] + head_tensor_names(spec)
    return {n: (4096 * (k + 1), 1000 + k) for k, n in enumerate(names)}


def test_split_is_exact_and_ordered():
    r = [TensorRef("a", 0, 10), TensorRef("b", 100, 7)]
    parts = _split(r, [1, 1, 1])
    assert [sum(p.nbytes for p in ps) for ps in parts] == [5, 6, 6]
    flat = [(p.name, p.offset, p.nbytes) for ps in parts for p in ps]
    assert flat == [("a", 0, 5), ("a", 5, 5), ("b", 100, 1), ("b", 101, 6)]


def test_every_policy_names_its_tensors_and_binds():
    spec = tiny()
    ent = entries(spec)
    for fw in POLICIES:
        p = plan_for(fw)
        for t in p.tasks:
            if t.resource in ("cpu", "npu"):
                assert t.ops, t.name
            if t.resource in ("load", "unpack"):
                assert t.tensors, t.name
        b = bind_plan(p, ent, embed_row_bytes=64)
        for layer in range(spec.n_layers + 1):
            loads = [t for t in b.tasks if t.resource == "load" and t.layer == layer]
            want = sum(ent[n][1] for n in (layer_tensor_names(layer) if layer < spec.n_layers
                                           else head_tensor_names(spec)))
            assert sum(t.read_bytes for t in loads) == want, (fw, layer)
            for t in loads:
                assert t.read_bytes == sum(r.nbytes for r in t.tensors)
        emb = [t for t in b.tasks if t.ops == ["embed"]]
        assert len(emb) == 1 and emb[0].read_bytes == 20 * 64
        assert Plan.from_json(b.to_json()).tasks[5].tensors == b.tasks[5].tensors


def test_bind_names_missing_tensor():
    import pytest
    ent = entries(tiny())
    del ent["blk.1.ffn_up.weight"]
    with pytest.raises(ValueError, match="blk.1.ffn_up.weight"):
        bind_plan(plan_for("edgeflow"), ent, 64)
