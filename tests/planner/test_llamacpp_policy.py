"""The llama.cpp policy (planner/pipeline/cpu_plan.py): per-tensor types of a file type as llama.cpp's quantizer
writes them, and the plan's structure per file type and loading mode."""
from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from planner.device import SocProfile
from planner.formats import ggml_tensor_types
from planner.framework import FrameworkSpec
from planner.peer_costs import NO_PEER_COSTS, PeerCosts
from planner.pipeline.cpu_plan import build_llamacpp_plan, ggml_layers, llamacpp_rate_key
from quant.arch import model_spec
from sim.coldstart.sweep import load_conf

MODELS = Path(__file__).resolve().parents[2] / "outputs" / "models"


def _phone() -> SocProfile:
    return load_conf("device", "xiaomi15pro", SocProfile)


# llama.cpp's own costs measured on a host (made-up values: the structure is under test, not them)
MEASURED = PeerCosts(llamacpp_fixed_s=0.13, llamacpp_repack_gbps=1.0,
                     llamacpp_gemm_gops_per_ghz={"Q8_0@576": 20.0, "Q4_0@576": 25.0, "Q4_0@2048": 30.0})


def _fw(**kw) -> FrameworkSpec:
    return dataclasses.replace(load_conf("framework", "llamacpp", FrameworkSpec), **kw)


def test_use_more_bits_layers_of_q4_k_m_and_the_row_fallback():
    spec = model_spec("smollm2_135m")              # 576-wide rows: no K-quant fits them
    t = ggml_tensor_types(spec, "Q4_K_M")
    more = [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
    assert [i for i, x in enumerate(t["ffn_down"]) if x == "Q6_K"] == more        # 1536-wide: K-quants fit
    assert set(t["ffn_down"]) == {"Q4_K", "Q6_K"}
    assert [i for i, x in enumerate(t["attn_v"]) if x == "Q8_0"] == more          # Q6_K -> Q8_0 fallback
    assert set(t["attn_q"]) == {"Q5_0"} and t["output"] == ["Q8_0"]               # Q4_K -> Q5_0
    assert ggml_tensor_types(spec, "Q8_0")["output"] == ["Q8_0"]
    one_b = model_spec("llama3_2_1b_synth")
    assert ggml_tensor_types(one_b, "Q4_0")["output"] == ["Q6_K"]
    assert set(ggml_tensor_types(one_b, "Q4_K_M")["attn_q"]) == {"Q4_K"}
    with pytest.raises(ValueError, match="ftype must be one of"):
        ggml_tensor_types(spec, "Q4_K_X")


@pytest.mark.parametrize("model,stem,ftype", [("smollm2_135m", "SmolLM2-135M-Instruct", "q4_0"),
                                              ("smollm2_135m", "SmolLM2-135M-Instruct", "q4_k_m"),
                                              ("smollm2_135m", "SmolLM2-135M-Instruct", "q8_0"),
                                              ("llama3_2_1b_synth", "llama3_2_1b_synth-0-*", "q4_k_m"),
                                              ("llama3_2_1b_synth", "llama3_2_1b_synth-0-*", "q4_0")])
def test_tensor_types_and_bytes_equal_a_file_llama_cpp_wrote(model, stem, ftype):
    gguf = pytest.importorskip("gguf")
    files = sorted(MODELS.glob(f"{stem}.{ftype}.gguf"))
    if not files:
        pytest.skip(f"no {stem}.{ftype}.gguf here (made by hil.peer.ensure_requantized)")
    spec = model_spec(model)
    want = ggml_tensor_types(spec, ftype.upper())
    r = gguf.GGUFReader(str(files[0]))
    got: dict[str, list[str]] = {}
    nbytes = 0
    for t in r.tensors:
        parts = t.name.split(".")
        nbytes += int(t.n_bytes)
        if parts[0] == "blk" and parts[2] in want:
            got.setdefault(parts[2], [""] * spec.n_layers)[int(parts[1])] = t.tensor_type.name
        elif t.name in ("output.weight", "token_embd.weight") and (t.name == "output.weight"
                                                                  or spec.tied_embeddings):
            got["output"] = [t.tensor_type.name]
    assert got == want
    layers = ggml_layers(spec, ftype.upper(), embedding=True)
    assert sum(ly.nbytes for ly in layers) == pytest.approx(nbytes, rel=1e-3)   # tensor data; the header apart


def test_read_mode_loads_every_byte_on_one_thread_before_the_first_op():
    spec = model_spec("smollm2_135m")
    plan = build_llamacpp_plan(spec, _phone(), _fw(use_mmap=False, weight_type="Q4_0", compute_threads=2), 64, 5,
                               peers=MEASURED)
    reads = [t for t in plan.tasks if t.name.startswith("read.L")]
    assert plan.loader_threads == 1 and len(reads) == spec.n_layers + 1
    assert all(t.deps == [reads[i - 1].id] for i, t in enumerate(reads) if i)          # one after the other
    assert sum(t.read_bytes for t in reads) == plan.info["flash_bytes"]
    # repack: every Q4_0 linear tensor of a layer (the head is Q8_0: none), at the device's rate
    assert all(t.duration_s == pytest.approx(ly.repack_bytes / 1e9)
               for t, ly in zip(reads, ggml_layers(spec, "Q4_0", MEASURED, embedding=True)))
    assert all(t.duration_s > 0 for t in reads[:-1]) and reads[-1].duration_s == 0
    names = [t.name for t in plan.tasks]
    fixed = plan.tasks[names.index("llamacpp.fixed")]
    assert fixed.duration_s == 0.13 and reads[0].deps == [fixed.id]
    cpu = [t for t in plan.tasks if t.resource == "cpu"]
    assert cpu and min(t.id for t in cpu) > reads[-1].id
    works = [w for t in cpu for w in t.works]
    assert works and all(w.kind == "matmul" and w.wfmt == "Q4_0@576" for w in works)   # the eval's rate
    assert all(t.ops for t in cpu)                          # the runner still runs every op


def test_q8_0_is_not_repacked_and_takes_its_own_rate():
    spec = model_spec("smollm2_135m")
    plan = build_llamacpp_plan(spec, _phone(), _fw(use_mmap=False, weight_type="Q8_0"), 64, 5, peers=MEASURED)
    assert plan.info["repack_bytes"] == 0 and plan.info["gemm_rate"] == "Q8_0@576"
    assert all(t.duration_s == 0 for t in plan.tasks if t.name.startswith("read.L"))


def test_rate_key_takes_the_nearest_measured_width_and_falls_back_without_one():
    assert llamacpp_rate_key(MEASURED, "Q4_0", 2048) == "Q4_0@2048"
    assert llamacpp_rate_key(MEASURED, "Q4_0", 960) == "Q4_0@576"
    assert llamacpp_rate_key(MEASURED, "Q4_K_M", 2048) == "kquant"
    assert llamacpp_rate_key(NO_PEER_COSTS, "Q8_0", 4096) == "int8"


def test_a_phone_without_measured_llamacpp_costs_keeps_the_paged_plan():
    """use_mmap (llama.cpp's default): pages fault in as the first ubatch reaches a layer; no fixed stretches and no
    repack where the device has none measured; every op costed at the device's rates."""
    spec = model_spec("smollm2_135m")
    plan = build_llamacpp_plan(spec, _phone(), _fw(), 64, 5)
    names = Counter(t.name.split(".")[0] for t in plan.tasks)
    assert names["fault"] > 0 and names["llamacpp"] == 0 and names["repack"] == 0 and names["read"] == 0
    assert {w.kind for t in plan.tasks if t.resource == "cpu" for w in t.works} > {"matmul"}


def test_mapped_file_on_a_repacking_cpu_reads_repacked_tensors_before_the_context():
    spec = model_spec("smollm2_135m")
    plan = build_llamacpp_plan(spec, _phone(), _fw(weight_type="Q4_0"), 64, 5, peers=MEASURED)
    rp = [t for t in plan.tasks if t.name.startswith("repack.L")]
    faults = [t for t in plan.tasks if t.name.startswith("fault.L")]
    emb = next(t for t in plan.tasks if t.ops == ["embed"])
    assert len(rp) == spec.n_layers and emb.deps == [rp[-1].id] and rp[0].deps == [plan.tasks[0].id]
    assert all(f.id > rp[-1].id for f in faults)
    assert sum(t.read_bytes for t in rp + faults) == plan.info["flash_bytes"]


def test_the_runner_builds_llamacpps_schedule_without_llamacpps_own_costs():
    """The project's runner executes a llama.cpp-style plan with its own kernels (experiments.hostrun): built
    without peer costs, no fixed stretches of llama.cpp's code, no repack, the device's INT8 rates."""
    spec = model_spec("smollm2_135m")
    plan = build_llamacpp_plan(spec, _phone(), _fw(weight_type="Q8_0"), 64, 5)
    assert not [t for t in plan.tasks if t.name.startswith(("llamacpp.", "repack."))]
    assert plan.info["gemm_rate"] == "int8" and plan.info["repack_bytes"] == 0


def test_a_plan_with_measured_rates_needs_a_cost_model_with_them():
    """A plan built with peer costs names their rates; the analytic cost model costs them only when it was given
    the same PeerCosts, and says so otherwise instead of taking the device's INT8 rate."""
    from planner.cost import AnalyticCostModel

    plan = build_llamacpp_plan(model_spec("smollm2_135m"), _phone(), _fw(weight_type="Q4_0"), 64, 5, peers=MEASURED)
    mm = next(w for t in plan.tasks if t.resource == "cpu" for w in t.works)
    t = AnalyticCostModel(_phone(), MEASURED).op_time(mm, "cpu", 2)
    assert t == mm.flops / (25.0 * 1e9 * _phone().thread_ghz(2))
    with pytest.raises(ValueError, match="'Q4_0@576'.*PeerCosts"):
        AnalyticCostModel(_phone()).op_time(mm, "cpu", 2)
