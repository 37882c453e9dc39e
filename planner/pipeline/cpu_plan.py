"""CPU-only cold-start plans: llama.cpp (mmap + on-demand paging) and MNN (sequential load, then compute);
docs/design.md §4.4.

llama.cpp: the GGUF file is mmap'ed; the first ubatch touching a layer's weights faults them in (readahead-sized
requests, issued by all compute threads at once), so loading interleaves with compute layer by layer and never runs
ahead of it. Ubatches (`chunk_tokens`, llama.cpp's n_ubatch) run through all layers one after the other. Matmuls use
the K-quant (or Q8_0) dot-product kernels with dequantization inside (`cpu_kquant_gemm_slowdown`).
MNN: all INT8 per-channel weights are read by one loader thread, then the whole prompt is computed on the CPU with
INT8 GEMMs and dynamic activation quantization.
"""
from __future__ import annotations

from planner.device import SocProfile
from planner.formats import GGML_BPW, ggml_type_for_budget
from planner.framework import FrameworkSpec
from planner.pipeline.builder import add_prefill
from planner.pipeline.dag import place_cpu
from planner.pipeline.npu_plan import add_embedding
from planner.pipeline.weights import SCALE_BYTES, ggml_layer_bytes, layer_refs
from planner.plan import Plan, PlanBuilder, SchedulePolicy
from quant.arch import ModelSpec


def build_llamacpp_plan(spec: ModelSpec, dev: SocProfile, fw: FrameworkSpec, tokens: int, bits: float) -> Plan:
    gtype = ggml_type_for_budget(bits) if fw.weight_type in ("", "budget") else fw.weight_type
    per_layer = ggml_layer_bytes(spec, gtype)
    b = PlanBuilder()
    emb = add_embedding(b, spec, tokens)
    readers = fw.loader_threads

    def fault_in(layer: int, after: int) -> int:
        nbytes = per_layer[layer]
        parts = [nbytes // readers + (1 if r < nbytes % readers else 0) for r in range(readers)]
        ids = [b.add(f"fault.L{layer}.t{r}", "load", [after, emb], layer=layer, read_bytes=p,
                     tensors=layer_refs(spec, layer),
                     request_bytes=dev.mmap_readahead_bytes, mem_alloc=p, phase="load")
               for r, p in enumerate(parts)]
        return b.add(f"paged.L{layer}", "join", ids, layer=layer)

    wfmt = "int8" if gtype == "Q8_0" else "kquant"
    add_prefill(b, spec, tokens, fw.chunk_tokens, place_cpu, fault_in, start=emb, cpu_wfmt=wfmt, layer_serial=True)
    return Plan(framework="llamacpp", model=spec.name, device=dev.name, prompt_tokens=tokens,
                chunk_tokens=fw.chunk_tokens, tasks=b.tasks, loader_threads=readers, unpack_threads=1,
                cpu_threads=fw.compute_threads, schedule=SchedulePolicy(),
                info=dict(ggml_type=gtype, bits_per_weight=GGML_BPW[gtype], flash_bytes=sum(per_layer)))


def build_mnn_plan(spec: ModelSpec, dev: SocProfile, fw: FrameworkSpec, tokens: int) -> Plan:
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
