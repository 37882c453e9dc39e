"""The host HIL runner executes the plan of every framework policy for real: same logits as the NumPy reference of the
packed file, a sane measured timeline, a cold page cache, and no thread left behind (docs/hil.md "Runner")."""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

import native
from hil.native_forward import native_last_logits
from hil.packed_index import bind_to_file, read_index
from hil.runner import run_plan
from hil.runner_ops import OpRunner
from hil.runner_state import huge_pages, huge_pages_enabled, run_state
from planner.plan import Plan
from quant.packed_forward import forward_last_logits, read_model
from sim.coldstart import POLICIES
from tests.conftest import gemm_helper_tids, gemm_helpers_gone
from tests.hil.tinymodel import bound_plan, device, tiny_spec, write_tiny
from tests.quant.conftest import needs_model

# max |logit - reference| (absolute; logits of O(1..30)). Every integer step (INT8 codes, int32 GEMM, dequant) is
# bit-exact with the reference; the native float32 rmsnorm / rope / attention / silu differ from NumPy by a few ulp.
# Tiny model (2 layers): that moves logits by ~1e-6 (measured 1.9e-6), bound 1e-4.
# SmolLM2 (30 layers, W8A8): an ulp can push an activation across an INT8 rounding boundary and the flip grows
# through the layers (one 16-token prompt: the runner 2.04 from NumPy after a flip in layer 12, while the reference's
# own 1-ulp nudge moved nothing), so no tolerance against NumPy decides a 30-layer forward. The runner is judged
# bit-exact against the same rules computed op by op with its own native kernels (hil.native_forward), on every
# model and plan; against NumPy, by top-1 wherever the reference's top-1 survives its own 1-ulp nudge.
TINY_LOGIT_ATOL = 1e-4
PROMPT = 20
CHUNK = 8


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    spec = tiny_spec()
    files = {fmt: write_tiny(d, spec, fmt) for fmt in ("weightlet", "int8")}
    toks = np.random.default_rng(3).integers(0, spec.vocab, PROMPT)
    refs = {fmt: forward_last_logits(read_model(p), spec, toks) for fmt, p in files.items()}
    return spec, files, toks, refs


def _hil_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("hil-")]


def _effective_end(plan: Plan, ends: dict[int, float], tid: int) -> float:
    """End of task tid; a join task ends when its last dependency does."""
    t = plan.tasks[tid]
    if t.resource == "join":
        return max((_effective_end(plan, ends, d) for d in t.deps), default=0.0)
    return ends[tid]


def check_timeline(plan: Plan, tl) -> None:
    assert tl.source == "measured"
    by_task: dict[int, list] = {}
    for s in tl.spans:
        by_task.setdefault(s.task, []).append(s)
    for t in plan.tasks:
        want = 0 if t.resource == "join" else 1
        assert len(by_task.get(t.id, [])) == want, (plan.framework, t.name)
    ends = {s.task: s.end for s in tl.spans}
    for s in tl.spans:
        t = plan.tasks[s.task]
        assert 0.0 <= s.start <= s.end <= tl.end_s
        for d in t.deps:
            assert s.start >= _effective_end(plan, ends, d), (plan.framework, t.name, plan.tasks[d].name)
        if s.stolen:
            assert plan.schedule.steal_threshold > 0 and t.stealable and t.resource == "npu"
            assert s.resource == "cpu" and s.unit == "cpu"
        else:
            assert s.resource == t.resource
        if t.resource == "npu" and not s.stolen:
            assert s.unit == "npu"                        # the NPU stand-in is labelled as such
    lanes: dict[tuple[str, int], list] = {}
    for s in tl.spans:
        lanes.setdefault((s.resource, s.worker), []).append((s.start, s.end))
    for lane, iv in lanes.items():
        iv.sort()
        for (a0, a1), (b0, _b1) in zip(iv, iv[1:]):
            assert b0 >= a1, (plan.framework, lane)      # one task at a time per worker


@pytest.mark.parametrize("fmt", ["weightlet", "int8"])
@pytest.mark.parametrize("fw", sorted(POLICIES))
def test_every_policy_matches_the_reference(tiny_files, fw, fmt):
    spec, files, toks, refs = tiny_files
    path = files[fmt]
    plan = bound_plan(fw, spec, path, PROMPT, chunk=CHUNK)
    before = _hil_threads()
    r = run_plan(plan, path, toks, spec=spec)
    assert _hil_threads() == before == []
    ref = refs[fmt]
    assert r.token == int(ref.argmax())
    assert np.abs(r.logits - ref).max() < TINY_LOGIT_ATOL
    assert np.array_equal(r.logits, native_last_logits(read_model(path), spec, toks))   # same kernels: bit-exact
    assert r.resident_before == 0.0
    check_timeline(plan, r.timeline)
    # the planned bytes (bound to the file) except the embedding's, which reads its distinct rows and every row scale
    # in one read, plus any norm vector a compute task faulted in before its load ran
    assert r.timeline.bytes_read == _want_bytes(plan, path, spec, toks) + r.info["faulted_bytes"]
    # packed blobs are staging buffers: later layers reuse the buffers earlier unpacks released (INT8 blobs are kept)
    if fmt == "int8":
        assert r.info["staging_reused"] == 0
    elif plan.framework == "edgeflow" and spec.n_layers > 2:
        assert r.info["staging_reused"] > 0, r.info


def test_per_consumer_activation_scales_matter(tiny_files):
    """Layer 1's attn_k has its own act scale: quantizing k with q's scale would give different logits."""
    spec, files, toks, refs = tiny_files
    pm = read_model(files["int8"])
    assert pm.act_scales["blk.1.attn_k.weight"] != pm.act_scales["blk.1.attn_q.weight"]
    pm.act_scales["blk.1.attn_k.weight"] = pm.act_scales["blk.1.attn_q.weight"]
    assert np.abs(forward_last_logits(pm, spec, toks) - refs["int8"]).max() > 10 * TINY_LOGIT_ATOL


def test_forced_isa_and_one_chunk(tiny_files):
    spec, files, toks, refs = tiny_files
    plan = bound_plan("edgeflow", spec, files["weightlet"], PROMPT, chunk=0)
    r = run_plan(plan, files["weightlet"], toks, spec=spec, isa="sse2")
    assert np.abs(r.logits - refs["weightlet"]).max() < TINY_LOGIT_ATOL
    w = r.timeline.waits_by_thread                  # measured per worker thread (getrusage RUSAGE_THREAD)
    workers = {f"{res}{i}" for res in ("load", "unpack", "graph", "cpu", "npu") for i in range(plan.workers(res))}
    assert set(w) == workers
    assert all(v >= 0 for v in w.values()) and sum(w.values()) >= 1   # the workers waited for each other


def test_setup_from_the_open_is_timed(tiny_files):
    # the peer comparison's clock starts at the open (docs/hil.md "Comparing with a peer"): the index read, buffer
    # allocation, op compilation and thread start before t0 are measured, not left out
    spec, files, toks, refs = tiny_files
    plan = bound_plan("edgeflow", spec, files["weightlet"], PROMPT)
    r = run_plan(plan, files["weightlet"], toks, spec=spec)
    assert 0.0 < r.info["open_to_t0_s"] < 60.0


def test_huge_page_memory_gives_the_same_logits(tiny_files):
    """The runner's fresh memory on transparent huge pages (hil.runner_state.huge_pages): same bits out."""
    spec, files, toks, _refs = tiny_files
    plan = bound_plan("edgeflow", spec, files["weightlet"], PROMPT, chunk=CHUNK)
    assert huge_pages_enabled()                          # the default
    huge = run_plan(plan, files["weightlet"], toks, spec=spec)
    with huge_pages(False):
        assert not huge_pages_enabled()
        plain = run_plan(plan, files["weightlet"], toks, spec=spec)
    assert huge_pages_enabled()
    assert np.array_equal(plain.logits, huge.logits) and plain.token == huge.token


def test_unbound_plan_is_refused(tiny_files):
    spec, files, toks, _ = tiny_files
    plan = bound_plan("edgeflow", spec, files["int8"], PROMPT)
    unbound = dataclasses.replace(plan, info={k: v for k, v in plan.info.items() if k != "bound"})
    with pytest.raises(ValueError, match="not bound"):
        run_plan(unbound, files["int8"], toks, spec=spec)
    with pytest.raises(ValueError, match="bind the plan to this file"):  # bound to the other file's byte ranges
        run_plan(bound_plan("edgeflow", spec, files["weightlet"], PROMPT), files["int8"], toks, spec=spec)
    with pytest.raises(ValueError, match="tokens"):
        run_plan(plan, files["int8"], toks[:5], spec=spec)


def test_plan_with_npu_graph_durations_is_refused(tiny_files):
    spec, files, toks, _ = tiny_files
    dev = dataclasses.replace(device(), npu_setup_s=0.1)
    plan = bound_plan("edgeflow", spec, files["int8"], PROMPT, dev=dev)
    with pytest.raises(RuntimeError, match="build it for device=host"):
        run_plan(plan, files["int8"], toks, spec=spec)
    assert _hil_threads() == []


def test_run_leaves_no_garbage_cycles(tiny_files):
    """A run's buffers are freed by reference counting when run_plan returns (the garbage collector is off during
    a run, and a cycle would keep every weight of every repeat alive), and the collector is back on."""
    import gc
    spec, files, toks, _ = tiny_files
    plan = bound_plan("edgeflow", spec, files["weightlet"], PROMPT, chunk=CHUNK)
    plan.cpu_threads = 2
    gc.collect()
    gc.disable()
    try:
        run_plan(plan, files["weightlet"], toks, spec=spec)
        assert not gc.isenabled()                         # left as the caller had it
        assert gc.collect() == 0
    finally:
        gc.enable()
    run_plan(plan, files["weightlet"], toks, spec=spec)
    assert gc.isenabled()


def test_unknown_op_is_refused_before_the_run(tiny_files):
    spec, files, toks, _ = tiny_files
    plan = bound_plan("edgeflow", spec, files["int8"], PROMPT, chunk=CHUNK)
    bad = next(t for t in plan.tasks if t.ops == ["attention"] and t.layer == 1)
    bad.ops = ["attention", "no_such_op"]
    with pytest.raises(ValueError, match=f"task {bad.name}.*no_such_op"):
        run_plan(plan, files["int8"], toks, spec=spec)
    assert _hil_threads() == []


def test_worker_error_stops_every_thread(tiny_files, monkeypatch):
    spec, files, toks, _ = tiny_files
    plan = bound_plan("edgeflow", spec, files["int8"], PROMPT, chunk=CHUNK)
    plan.cpu_threads = 2                                  # the native GEMM helpers must stop too
    bad = next(t for t in plan.tasks if t.ops == ["attention"] and t.layer == 1)
    compile_ = OpRunner.compile

    def failing(self, t, threads):
        steps = compile_(self, t, threads)
        if t.id != bad.id:
            return steps

        def boom():
            raise native.NativeError("attention: injected failure")
        self.steps[(t.id, threads)] = [*steps, boom]
        return self.steps[(t.id, threads)]
    monkeypatch.setattr(OpRunner, "compile", failing)
    before = gemm_helper_tids()
    with pytest.raises(RuntimeError, match=f"task {bad.name}.*injected failure"):
        run_plan(plan, files["int8"], toks, spec=spec)
    assert _hil_threads() == []
    assert gemm_helpers_gone(gemm_helper_tids() - before)  # native helper threads joined as well


def test_binding_uses_the_file_byte_ranges(tiny_files):
    spec, files, _toks, _ = tiny_files
    ix = read_index(files["weightlet"])
    plan = bound_plan("llamacpp", spec, files["weightlet"], PROMPT)
    for t in plan.tasks:
        for r in t.tensors:
            e = ix.entries[r.name]
            assert e.offset <= r.offset and r.offset + r.nbytes <= e.offset + e.size
    assert bind_to_file(plan, ix).info["bound"]


def _want_bytes(plan, path, spec, toks) -> int:
    row = read_index(path).embed_row_bytes                        # D INT8 + 4 B scale
    layers = sum(t.read_bytes for t in plan.tasks if t.resource == "load" and t.ops != ["embed"])
    return layers + np.unique(toks).size * (row - 4) + spec.vocab * 4


# ---- the real model ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def smol_pack(tmp_path_factory):
    """SmolLM2-135M quantized by EdgeFlow at 5 bits with the fast settings (conf/quant/fast.yaml), packed (the
    validate app's cache: made once per machine)."""
    from omegaconf import OmegaConf

    from hil.deploy import packed_model
    from quant.arch import smollm2_spec
    from quant.settings import QuantSettings
    from tests.conftest import CONF_DIR

    fast = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(CONF_DIR / "quant" / "fast.yaml")).items()
            if k != "defaults"}
    npu = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(CONF_DIR / "quant" / "npu.yaml")).items()
           if k != "defaults"}
    spec = smollm2_spec()
    return spec, packed_model(spec, "edgeflow", 5, "weightlet", QuantSettings(**{**npu, **fast}))   # cached


@needs_model
def test_smollm2_edgeflow_cold_start_matches_reference(smol_pack):
    from quant.evaluate import eval_text_tokens

    spec, path = smol_pack
    toks = eval_text_tokens(spec, 16, 5000)
    pm = read_model(path)
    ref = forward_last_logits(pm, spec, toks)
    nudged = forward_last_logits(pm, spec, toks, nudge=True)                      # its own 1-ulp noise
    plan = bound_plan("edgeflow", spec, path, 16)
    r = run_plan(plan, path, toks, spec=spec)
    assert r.resident_before == 0.0
    assert np.array_equal(r.logits, native_last_logits(pm, spec, toks))           # same kernels: bit-exact
    assert r.token == int(ref.argmax()) or int(nudged.argmax()) != int(ref.argmax())
    check_timeline(plan, r.timeline)
    assert r.timeline.bytes_read == _want_bytes(plan, path, spec, toks) + r.info["faulted_bytes"]
    assert _hil_threads() == []


def test_compute_buffers_start_on_cache_lines():
    """Every activation, accumulator, KV-cache and RoPE buffer of a run starts on a 64-byte boundary: a GEMM or
    attention operand off one ran 1.3x slower, and malloc's 16-byte alignment made that depend on the heap's state
    (docs/hil.md "Operand alignment")."""
    rs = run_state(tiny_spec(), [5, 3])
    arrays = [rs.cos, rs.sin, rs.hf, rs.head_x8, rs.head_acc, rs.logits, *rs.kcache, *rs.vcache]
    for c in rs.chunks:
        for v in vars(c).values():
            arrays += v if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else \
                [v] if isinstance(v, np.ndarray) else []
    assert len(arrays) > 40 and all(a.ctypes.data % native.compute.SIMD_ALIGN == 0 for a in arrays)
    ones = [c.ones for c in rs.chunks]
    assert all(not a.any() for a in arrays if not any(a is b for b in [rs.cos, rs.sin, *ones]))
    assert all((o == 1).all() for o in ones)
