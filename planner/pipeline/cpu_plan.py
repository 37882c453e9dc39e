"""CPU-only cold-start plans: llama.cpp and MNN (sequential load, then compute); docs/design.md §4.4, docs/hil.md
"The llama.cpp policy".

llama.cpp (what llama-cpp-python 0.3.16's vendored llama.cpp does on a CPU; every step from its source, every cost of
its own code a `planner.peer_costs.PeerCosts` value measured by hil.calibrate_peer on the host):
1. model open: GGUF metadata and the vocabulary parse, before any weight is read; with the context (step 3) and the
   eval's fixed part (step 4) one fixed stretch of its own code, `llamacpp_fixed_s`, placed here (all of it is
   serial with the rest, so its place changes the phases' split, not the TTFT);
2. weights: with `use_mmap` (its default) the file is mapped and a layer's pages fault in when the first ubatch
   touches them (readahead-sized requests from all compute threads), interleaved with compute; without it, one
   thread reads every tensor in turn into its buffers (`read()`), all before the first eval. Either way the tensor
   types ggml-cpu repacks (planner.formats.GGML_REPACK_X86 on x86: Q4_0, Q4_K) are read and re-laid out at load, on
   the loading thread, before the context exists (`llamacpp_repack_gbps`);
3. context: KV cache, output buffer, compute-graph reserve;
4. one prompt eval of all tokens (n_ubatch = `chunk_tokens`): a fixed part (graph build and allocation, the LM head
   of the last token) then the layers in order, each ubatch through all layers before the
   next, on `compute_threads`. A matmul runs at llama.cpp's measured rate for the file type
   (`llamacpp_gemm_gops_per_ghz["<type>@<d_model>"]`, nearest d_model measured; the eval's other ops are inside that
   rate, so compute tasks carry only their matmuls); without a measured rate, Q8_0 at the device's INT8 GEMM rate and
   the K-quants slowed down (`cpu_kquant_gemm_slowdown`), every op costed.
Per-tensor types and bytes: planner.formats.ggml_tensor_types (llama.cpp's quantizer rules for a file type).
MNN: all INT8 per-channel weights are read by one loader thread, then the whole prompt is computed on the CPU with
INT8 GEMMs and dynamic activation quantization. With MNN's own costs measured on the host (hil.calibrate_mnn:
PeerCosts' `mnn_fixed_s`, `mnn_load_gbps`, `mnn_gemm_gops_per_ghz`) the plan is MNN 3.x's LLM runtime as the MNN peer
runs it (hil.mnn_peer; docs/hil.md "The MNN peer"): its own fixed code (create, load, the forward's fixed part), then
the weight file read layer by layer (`mnn_layers`: `weight_bits` weights in blocks of `quant_block` input channels, an
FP32 scale and zero point per block; the LM head shared with the token embedding) ahead of the CPU backend's weight
re-layout of each layer (measured: a cold load hides the file's read behind the set-up), then one forward of the
whole prompt at MNN's measured rate for its weight bits (other ops inside the rate, as for llama.cpp).
Without those costs (`NO_PEER_COSTS`: a phone, or the project's runner executing a llama.cpp- or MNN-style plan with
its own kernels, experiments.hostrun) the plans use the device's rates only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from planner.device import SocProfile
from planner.formats import GGML_BPW, GGML_REPACK_X86, ggml_tensor_nbytes, ggml_tensor_types, ggml_type_for_budget
from planner.framework import FrameworkSpec
from planner.peer_costs import NO_PEER_COSTS, PeerCosts
from planner.pipeline.builder import add_prefill
from planner.pipeline.dag import place_cpu
from planner.pipeline.npu_plan import add_embedding
from planner.pipeline.weights import NORM_BYTES, SCALE_BYTES, layer_refs
from planner.plan import Plan, PlanBuilder, SchedulePolicy
from quant.arch import ModelSpec


@dataclass
class GgmlLayer:
    nbytes: int             # B of the layer's tensors in the GGUF file (norms included)
    repack_bytes: int       # B of them ggml-cpu repacks at load (0 where the CPU repacks nothing)


def ggml_layers(spec: ModelSpec, ftype: str, peers: PeerCosts = NO_PEER_COSTS, embedding: bool = False
                ) -> list[GgmlLayer]:
    """n_layers + 1 entries (last: final norm + LM head, and with `embedding` an untied token embedding: read whole
    when the file is not mapped) of a llama.cpp file of type `ftype`; repacked bytes only with a measured repack rate
    (`peers.llamacpp_repack_gbps`; x86: GGML_REPACK_X86)."""
    types = ggml_tensor_types(spec, ftype)
    shapes = spec.linear_shapes()
    repacks = peers.llamacpp_repack_gbps > 0
    out = []
    for i in range(spec.n_layers):
        nb = NORM_BYTES * 2 * spec.d_model
        rp = 0
        for kind, (c, d) in shapes.items():
            t = types[kind][i]
            b = ggml_tensor_nbytes(c * d, t)
            nb += b
            if repacks and t in GGML_REPACK_X86 and c % 8 == 0:
                rp += b
        out.append(GgmlLayer(nb, rp))
    head = ggml_tensor_nbytes(spec.vocab * spec.d_model, types["output"][0]) + NORM_BYTES * spec.d_model
    if embedding and not spec.tied_embeddings:      # the token embedding: the file type's base type (never repacked)
        base = {"Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K"}.get(ftype, ftype)
        base = "Q5_0" if base.endswith("_K") and spec.d_model % 256 else base
        head += ggml_tensor_nbytes(spec.vocab * spec.d_model, base)
    out.append(GgmlLayer(head, 0))
    return out


def llamacpp_rate_key(peers: PeerCosts, ftype: str, d_model: int) -> str:
    """The matmul weight format llama.cpp's tasks carry: its measured rate for `ftype` at the nearest measured
    d_model ("<type>@<d>"), else int8 (Q8_0) / kquant (the device's rates)."""
    have = [k for k in peers.llamacpp_gemm_gops_per_ghz if k.split("@")[0] == ftype]
    if have:
        return min(have, key=lambda k: (abs(math.log(int(k.split("@")[1]) / d_model)), k))
    return "int8" if ftype == "Q8_0" else "kquant"


def build_llamacpp_plan(spec: ModelSpec, dev: SocProfile, fw: FrameworkSpec, tokens: int, bits: float, *,
                        peers: PeerCosts = NO_PEER_COSTS) -> Plan:
    ftype = ggml_type_for_budget(bits) if fw.weight_type in ("", "budget") else fw.weight_type
    layers = ggml_layers(spec, ftype, peers, embedding=not fw.use_mmap)
    wfmt = llamacpp_rate_key(peers, ftype, spec.d_model)
    b = PlanBuilder()

    # llama.cpp's own code on its main thread (measured on the host; 0 = not modelled)
    opened = b.add("llamacpp.fixed", "load", [], duration_s=peers.llamacpp_fixed_s, phase="setup") \
        if peers.llamacpp_fixed_s > 0 else -1
    readers = fw.loader_threads
    if fw.use_mmap:
        prev = opened
        for i, ly in enumerate(layers):          # repacked tensors are copied out of the mapping at load
            if ly.repack_bytes:
                prev = b.add(f"repack.L{i}", "load", [prev], layer=i, read_bytes=ly.repack_bytes,
                             request_bytes=dev.mmap_readahead_bytes, mem_alloc=ly.repack_bytes, phase="load",
                             duration_s=ly.repack_bytes / (peers.llamacpp_repack_gbps * 1e9))
        emb = add_embedding(b, spec, tokens, [prev])

        def fault_in(layer: int, after: int) -> int:
            nbytes = layers[layer].nbytes - layers[layer].repack_bytes
            parts = [nbytes // readers + (1 if r < nbytes % readers else 0) for r in range(readers)]
            ids = [b.add(f"fault.L{layer}.t{r}", "load", [after, emb], layer=layer, read_bytes=p,
                         tensors=layer_refs(spec, layer),
                         request_bytes=dev.mmap_readahead_bytes, mem_alloc=p, phase="load")
                   for r, p in enumerate(parts) if p > 0]
            return b.add(f"paged.L{layer}", "join", ids or [after], layer=layer)

        add_prefill(b, spec, tokens, fw.chunk_tokens, place_cpu, fault_in, start=emb, cpu_wfmt=wfmt,
                    layer_serial=True)
    else:
        readers = 1                               # llama_model_loader::load_all_data: one thread, tensor by tensor
        prev = opened
        loaded = []
        for i, ly in enumerate(layers):
            prev = b.add(f"read.L{i}", "load", [prev], layer=i, read_bytes=ly.nbytes, tensors=layer_refs(spec, i),
                         request_bytes=dev.flash_bulk_request_bytes, mem_alloc=ly.nbytes, phase="load",
                         duration_s=ly.repack_bytes / (peers.llamacpp_repack_gbps * 1e9) if ly.repack_bytes else 0.0)
            loaded.append(prev)
        emb = add_embedding(b, spec, tokens, [prev])
        add_prefill(b, spec, tokens, fw.chunk_tokens, place_cpu, loaded, start=emb, cpu_wfmt=wfmt, layer_serial=True)
    if wfmt not in ("int8", "kquant"):
        _matmuls_only(b, spec)
    flash = sum(ly.nbytes for ly in layers)
    bpw = GGML_BPW.get(ftype, 8.0 * flash / max(1, spec.total_params()))
    return Plan(framework="llamacpp", model=spec.name, device=dev.name, prompt_tokens=tokens,
                chunk_tokens=fw.chunk_tokens, tasks=b.tasks, loader_threads=readers, unpack_threads=1,
                cpu_threads=fw.compute_threads, schedule=SchedulePolicy(),
                info=dict(ggml_type=ftype, bits_per_weight=bpw,
                          flash_bytes=flash, repack_bytes=sum(ly.repack_bytes for ly in layers),
                          use_mmap=fw.use_mmap, gemm_rate=wfmt))


def _matmuls_only(b: PlanBuilder, spec: ModelSpec) -> None:
    """With llama.cpp's measured per-file-type rate, a compute task's cost is its layer matmuls at that rate (the
    graph's other ops are inside it; the LM head of the last token is inside PeerCosts.llamacpp_fixed_s): other works
    go. The ops stay, so the host runner still runs every op of the plan."""
    for t in b.tasks:
        if t.resource == "cpu":
            t.works = [w for w in t.works if w.kind == "matmul"]


MNN_ALPHA_BYTES = 8         # B per block: FP32 scale and zero point (llmexport's asymmetric block quantization)


def mnn_layers(spec: ModelSpec, bits: int, block: int) -> list[int]:
    """B of the MNN weight file per layer (n_layers + 1 entries, last: the LM head, which the token embedding shares)
    for `bits`-bit weights in blocks of `block` input channels (0 = one block per output channel)."""
    def nbytes(c: int, d: int) -> int:
        blocks = d * (1 if block <= 0 else -(-c // block))
        return (c * d * bits + 7) // 8 + MNN_ALPHA_BYTES * blocks

    per_layer = sum(nbytes(c, d) for c, d in spec.linear_shapes().values())
    return [per_layer] * spec.n_layers + [nbytes(spec.d_model, spec.vocab)]


def mnn_rate_key(peers: PeerCosts, bits: int, d_model: int) -> str:
    """MNN's measured rate for `bits`-bit weights at the nearest measured d_model ("b<bits>@<d>"), else int8."""
    have = [k for k in peers.mnn_gemm_gops_per_ghz if k.split("@")[0] == f"b{bits}"]
    if have:
        return min(have, key=lambda k: (abs(math.log(int(k.split("@")[1]) / d_model)), k))
    return "int8"


def build_mnn_plan(spec: ModelSpec, dev: SocProfile, fw: FrameworkSpec, tokens: int, weight_bits: int = 8,
                   quant_block: int = 0, *, peers: PeerCosts = NO_PEER_COSTS) -> Plan:
    wfmt = mnn_rate_key(peers, weight_bits, spec.d_model)
    if wfmt != "int8":
        return _mnn_measured_plan(spec, dev, peers, fw, tokens, weight_bits, quant_block, wfmt)
    b = PlanBuilder()
    emb = add_embedding(b, spec, tokens)
    linear = spec.layer_params() - 2 * spec.d_model
    channels = spec.output_channels_per_layer()
    per_layer = ([linear + SCALE_BYTES * channels] * spec.n_layers
                 + [spec.vocab * spec.d_model + SCALE_BYTES * spec.vocab])
    loads = [b.add(f"load.L{i}", "load", [], layer=i, read_bytes=n, request_bytes=dev.flash_bulk_request_bytes,
                   tensors=layer_refs(spec, i),
                   mem_alloc=n, phase="load") for i, n in enumerate(per_layer)]
    done = b.add("loaded", "join", loads + [emb])
    add_prefill(b, spec, tokens, fw.chunk_tokens, place_cpu, [done] * (spec.n_layers + 1), start=done)
    return Plan(framework="mnn", model=spec.name, device=dev.name, prompt_tokens=tokens, chunk_tokens=fw.chunk_tokens,
                tasks=b.tasks, loader_threads=fw.loader_threads, unpack_threads=1, cpu_threads=fw.compute_threads,
                schedule=SchedulePolicy(), info=dict(flash_bytes=sum(per_layer)))


def _mnn_measured_plan(spec: ModelSpec, dev: SocProfile, peers: PeerCosts, fw: FrameworkSpec, tokens: int, bits: int,
                       block: int, wfmt: str) -> Plan:
    """MNN's LLM runtime with its measured costs (module doc)."""
    per_layer = mnn_layers(spec, bits, block)
    b = PlanBuilder()
    prev = b.add("mnn.fixed", "load", [], duration_s=peers.mnn_fixed_s, phase="setup") if peers.mnn_fixed_s > 0 \
        else -1
    loaded = []
    gbps = peers.mnn_load_gbps.get(f"b{bits}", 0.0)
    read = prev
    for i, n in enumerate(per_layer):
        # The file's read runs ahead of the weight set-up (a cold create+load takes as long as a warm one while a
        # plain cold read of the same files takes 0.05-0.77 s: hil/diagnostics/mnn_overlap.py, docs/hil.md "The MNN
        # peer"): layer i is set up while layer i+1 streams in, so the load is the longer of the two chains.
        read = b.add(f"read.L{i}", "load", [read], layer=i, read_bytes=n, tensors=layer_refs(spec, i),
                     request_bytes=dev.flash_bulk_request_bytes, mem_alloc=n, phase="load")
        own = n / (gbps * 1e9) if gbps > 0 else 0.0
        prev = b.add(f"setup.L{i}", "load", [read, prev], layer=i, phase="load", duration_s=own)
        loaded.append(prev)
    emb = add_embedding(b, spec, tokens, [prev])
    add_prefill(b, spec, tokens, fw.chunk_tokens, place_cpu, loaded, start=emb, cpu_wfmt=wfmt, layer_serial=True)
    _matmuls_only(b, spec)
    return Plan(framework="mnn", model=spec.name, device=dev.name, prompt_tokens=tokens, chunk_tokens=fw.chunk_tokens,
                tasks=b.tasks, loader_threads=2, unpack_threads=1, cpu_threads=fw.compute_threads,
                schedule=SchedulePolicy(), info=dict(flash_bytes=sum(per_layer), weight_bits=bits,
                                                     quant_block=block, gemm_rate=wfmt))
