"""A peer protocol set (`peer: true`, conf/protocol/peer.yaml; docs/hil.md "The llama.cpp policy"): the simulator's
llama.cpp policy judged against llama.cpp itself on this host, under the validation protocol's order, rounds, cold
runs and intervals (experiments.protocol).

Measured: llama.cpp's cold TTFT (hil.peer.llamacpp_cold_ttft, one run per slot: the GGUF evicted, its resident
fraction recorded, clock from before `Llama()` opens the file to the first token), its load (`Llama()`) and prompt
eval. A run that starts with more than COLD_RESIDENT_MAX of the file cached is run again up to RERUN_TRIES times and
otherwise recorded uncounted.
Predicted: planner.pipeline.cpu_plan.build_llamacpp_plan for the configuration's file type, with hil.peer's
settings (use_mmap=false, n_ubatch = the prompt, the host's cores as threads), simulated with the host profile (its
measured llama.cpp fields: hil.calibrate_peer) and the host runtime less the project runner's own mechanics
(LLAMACPP_RUNTIME_OFF: llama.cpp is C code with spinning worker threads, no interpreter lock, no per-task Python).
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Callable

from experiments.common import ConfigError
from experiments.hostrun import COLD_RESIDENT_MAX, RERUN_TRIES
from experiments.protocol import Prepared, ProtocolSpec, RunRecord, framework_spec, runnable_spec, schedule
from quant.arch import ModelSpec, model_spec

# the host runtime's mechanics of the project's Python runner, off for llama.cpp (planner.host_runtime): its
# interpreter lock and per-tensor / per-op Python, its GEMM pool and NPU stand-in, worker wake-ups (ggml's
# threadpool spins between ops); the kernel's page cache, reads, first touch and co-run slowdowns stay
LLAMACPP_RUNTIME_OFF = dict(interpreter_lock=False, load_tensor_s=0.0, unpack_tensor_s=0.0, cpu_op_python_s=0.0,
                            npu_on_cpu_core=False, cpu_split_gemm_only=False, gemm_pool_spin_s=0.0,
                            gemm_pool_wake_s=0.0, thread_wake_s=0.0, thread_wake_cpu_s=0.0, thread_wake_busy_s=0.0,
                            thread_wake_idle_core_s=0.0, thread_wake_pack_idle_s=0.0, thread_wake_pack_share=0.0)
BIAS_MAX_PCT = 10.0         # the llama.cpp policy's acceptance: |mean signed TTFT error| over the peer set
MEAN_ABS_MAX_PCT = 15.0     # and its mean |TTFT error|


def check_peer_spec(p: ProtocolSpec) -> None:
    """Every configuration a llama.cpp file of a model with weights here (one ConfigError line otherwise)."""
    for c in p.configurations:
        where = f"protocol.configurations[{c.key}]"
        if framework_spec(c.framework, f"{where}.framework").policy != "llamacpp":
            raise ConfigError(f"{where}.framework: a peer set runs llama.cpp (policy llamacpp), not {c.framework}")
        if not c.weight_type:
            raise ConfigError(f"{where}.weight_type: a peer set names the llama.cpp file type of every configuration")
        runnable_spec(c)


def peer_threads(host) -> int:
    """llama.cpp's threads in the peer runs: every core of the host (hil.peer's default on this 2-core host)."""
    return int(host.device.cpu_cores)


def predict_peer(spec: ModelSpec, host, weight_type: str, tokens: int, threads: int) -> tuple[Any, dict[str, Any]]:
    """(plan, coldstart metrics) of the llama.cpp policy with hil.peer's settings (module doc)."""
    from planner.cost import make_cost_model
    from planner.pipeline.cpu_plan import build_llamacpp_plan
    from sim.executor import simulate
    from sim.metrics import coldstart_metrics

    fw = dataclasses.replace(framework_spec("llamacpp"), weight_type=weight_type.upper(), use_mmap=False,
                             chunk_tokens=tokens, compute_threads=threads, loader_threads=1)
    dev = host.device
    plan = build_llamacpp_plan(spec, dev, fw, tokens, 8.0)
    rt = dataclasses.replace(host.runtime, **LLAMACPP_RUNTIME_OFF)
    tl = simulate(plan, dev, make_cost_model("table", dev, str(host.cost_table)), runtime=rt)
    return plan, coldstart_metrics(tl, dev)


def prepare_peer(p: ProtocolSpec, host, progress=print) -> list[Prepared]:
    """The GGUF files (made and cached on first use), prompts and predictions of every configuration."""
    from hil.peer import peer_gguf_file
    from quant.evaluate import eval_text_tokens

    thr = peer_threads(host)
    out = []
    for n, c in enumerate(p.configurations):
        progress(f"  preparing {n + 1}/{len(p.configurations)}: {c.key}")
        spec = model_spec(c.model)
        path = Path(peer_gguf_file(spec, c.weight_type))
        plan, pred = predict_peer(spec, host, c.weight_type, c.prompt_tokens, thr)
        out.append(Prepared(c, spec, plan, path, eval_text_tokens(spec, c.prompt_tokens), pred))
    return out


def execute_peer(p: ProtocolSpec, prepared: list[Prepared], threads: int,
                 progress: Callable[[int, int], None] | None = None) -> tuple[list[RunRecord], dict]:
    """Every slot of the schedule, in order, as one llama.cpp cold run (module doc): one record per attempt."""
    from hil.peer import llamacpp_cold_ttft

    slots = schedule([x.config for x in prepared], p.rounds, p.runs_per_round, p.warmup, p.seed)
    recs: list[RunRecord] = []
    t0 = time.perf_counter()
    for n, s in enumerate(slots):
        prep = prepared[s.config]
        load = os.getloadavg()[0]
        start = time.perf_counter() - t0
        for a in range(RERUN_TRIES):
            r = llamacpp_cold_ttft(prep.path, prep.tokens, threads=threads, repeats=1)
            res = float(r["resident_before"][0])
            cold = res <= COLD_RESIDENT_MAX
            recs.append(RunRecord(n, s.kind, s.round, s.pass_, prep.config.key, a, r["ttft_s"]["runs"][0],
                                  r["load_s"]["runs"][0], None, r["prefill_s"]["runs"][0], res, load, start,
                                  s.kind == "measured" and cold))
            if cold:
                break
        if progress:
            progress(n + 1, len(slots))
    return recs, {}


def prepare(p: ProtocolSpec, host, progress=print) -> list[Prepared]:
    return prepare_peer(p, host, progress)


def execute(p: ProtocolSpec, prepared: list[Prepared], host, progress: Callable[[int, int], None] | None = None
            ) -> tuple[list[RunRecord], dict]:
    return execute_peer(p, prepared, peer_threads(host), progress)


def criterion_md(m: dict[str, Any]) -> str:
    """The llama.cpp policy's acceptance line (BIAS_MAX_PCT, MEAN_ABS_MAX_PCT) from a peer set's metrics."""
    if m.get("protocol_n") is None:
        return ""
    bias, mae = m["protocol_bias_pct"], m["protocol_mean_abs_pct"]
    ok = abs(bias) <= BIAS_MAX_PCT and mae <= MEAN_ABS_MAX_PCT
    return (f"- llama.cpp policy acceptance (|mean signed error| <= {BIAS_MAX_PCT:g} %, mean |error| <= "
            f"{MEAN_ABS_MAX_PCT:g} %): **{'met' if ok else 'not met'}** — {bias:+.1f} %, {mae:.1f} %")
