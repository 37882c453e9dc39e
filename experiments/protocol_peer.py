"""A peer protocol set (`peer: true`; conf/protocol/peer.yaml for llama.cpp, conf/protocol/mnn.yaml for MNN; docs/hil.md
"The llama.cpp policy", "The MNN peer"): the simulator's llama.cpp or MNN policy judged against that framework itself
on this host, under the validation protocol's order, rounds, cold runs and intervals (experiments.protocol). A set runs
one peer, named by its configurations' framework policy (`peer_for`).

Measured: the peer's cold TTFT (hil.peer.llamacpp_cold_ttft on a GGUF file, hil.mnn_peer.mnn_cold_ttft on an MNN
directory converted from the project's GGUF; one run per slot: the files evicted, their resident fraction recorded,
clock from before the first file is opened to the first token), its load and prompt eval. A run that starts with
more than COLD_RESIDENT_MAX of the files cached is run again up to RERUN_TRIES times and otherwise recorded uncounted.
Predicted: planner.pipeline.cpu_plan.build_llamacpp_plan for the configuration's file type, or build_mnn_plan for
its weight bits (`bits` 4 | 8, blocks of hil.mnn_convert.MNN_BLOCK), with the peer's settings (llama.cpp:
use_mmap=false, n_ubatch = the prompt; MNN: use_mmap=false, the whole prompt in one forward; the host's cores as
threads), simulated with the host profile (its peer costs: hil.calibrate_peer, hil.calibrate_mnn) and the host
runtime less the project runner's own mechanics (PEER_RUNTIME_OFF: both are C/C++ code with their own worker threads,
no interpreter lock, no per-task Python).
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

# the host runtime's mechanics of the project's Python runner, off for a peer (planner.host_runtime): its
# interpreter lock and per-tensor / per-op Python, its GEMM pool and NPU stand-in, worker wake-ups (ggml's and MNN's
# thread pools spin between ops); the kernel's page cache, reads, first touch and co-run slowdowns stay
PEER_RUNTIME_OFF = dict(interpreter_lock=False, load_tensor_s=0.0, unpack_tensor_s=0.0, cpu_op_python_s=0.0,
                            npu_on_cpu_core=False, cpu_split_gemm_only=False, gemm_pool_spin_s=0.0,
                            gemm_pool_wake_s=0.0, thread_wake_s=0.0, thread_wake_cpu_s=0.0, thread_wake_busy_s=0.0,
                            thread_wake_idle_core_s=0.0, thread_wake_pack_idle_s=0.0, thread_wake_pack_share=0.0)
BIAS_MAX_PCT = 10.0         # a peer policy's acceptance: |mean signed TTFT error| over the peer set
MEAN_ABS_MAX_PCT = 15.0     # and its mean |TTFT error|
PEERS = {"llamacpp": "llama.cpp", "mnn": "MNN"}     # framework policy -> the peer that runs it


def check_peer_spec(p: ProtocolSpec) -> str:
    """Every configuration a peer's file of a model with weights here, all of one peer (one ConfigError line
    otherwise); returns the peer's policy (llamacpp | mnn)."""
    from hil.mnn_convert import MNN_BITS

    policies = []
    for c in p.configurations:
        where = f"protocol.configurations[{c.key}]"
        pol = framework_spec(c.framework, f"{where}.framework").policy
        if pol not in PEERS:
            raise ConfigError(f"{where}.framework: a peer set runs llama.cpp (policy llamacpp) or MNN (policy mnn), "
                              f"not {c.framework}")
        if policies and pol != policies[0]:
            raise ConfigError(f"{where}.framework: a peer set runs one peer ({PEERS[policies[0]]}), not also "
                              f"{PEERS[pol]}")
        policies.append(pol)
        if pol == "llamacpp" and not c.weight_type:
            raise ConfigError(f"{where}.weight_type: a peer set names the llama.cpp file type of every configuration")
        if pol == "mnn" and c.weight_type:
            raise ConfigError(f"{where}.weight_type: an MNN configuration names its weight bits (bits), not a "
                              f"llama.cpp file type")
        if pol == "mnn" and c.bits not in MNN_BITS:
            raise ConfigError(f"{where}.bits: MNN's exporter writes {' or '.join(map(str, MNN_BITS))}-bit weights "
                              f"(got {c.bits})")
        runnable_spec(c)
    return policies[0]


def peer_threads(host) -> int:
    """llama.cpp's threads in the peer runs: every core of the host (hil.peer's default on this 2-core host)."""
    return int(host.device.cpu_cores)


def predict_peer(spec: ModelSpec, host, weight_type: str, tokens: int, threads: int) -> tuple[Any, dict[str, Any]]:
    """(plan, coldstart metrics) of the llama.cpp policy with hil.peer's settings (module doc)."""
    from planner.pipeline.cpu_plan import build_llamacpp_plan

    fw = dataclasses.replace(framework_spec("llamacpp"), weight_type=weight_type.upper(), use_mmap=False,
                             chunk_tokens=tokens, compute_threads=threads, loader_threads=1)
    return _simulate(build_llamacpp_plan(spec, host.device, fw, tokens, 8.0, peers=host.peers), host)


def predict_mnn(spec: ModelSpec, host, bits: int, tokens: int, threads: int) -> tuple[Any, dict[str, Any]]:
    """(plan, coldstart metrics) of the MNN policy with hil.mnn_peer's settings (module doc); the host profile must
    hold MNN's measured rate for `bits` (hil.calibrate_mnn), else one ConfigError line."""
    from hil.mnn_convert import MNN_BLOCK
    from planner.pipeline.cpu_plan import build_mnn_plan, mnn_rate_key

    if mnn_rate_key(host.peers, bits, spec.d_model) == "int8":
        raise ConfigError(f"the host profile has no measured MNN rate for {bits}-bit weights: python -m "
                          f"hil.calibrate_mnn (docs/hil.md \"The MNN peer\")")
    fw = dataclasses.replace(framework_spec("mnn"), chunk_tokens=tokens, compute_threads=threads, loader_threads=1)
    return _simulate(build_mnn_plan(spec, host.device, fw, tokens, weight_bits=bits, quant_block=MNN_BLOCK,
                                    peers=host.peers), host)


def _simulate(plan, host) -> tuple[Any, dict[str, Any]]:
    from planner.cost import make_cost_model
    from sim.executor import simulate
    from sim.metrics import coldstart_metrics

    dev = host.device
    rt = dataclasses.replace(host.runtime, **PEER_RUNTIME_OFF)
    tl = simulate(plan, dev, make_cost_model("table", dev, str(host.cost_table), host.peers), runtime=rt)
    return plan, coldstart_metrics(tl, dev)


def prepare_peer(p: ProtocolSpec, host, progress=print) -> list[Prepared]:
    """The peer's files (made and cached on first use: GGUF requantized, MNN converted), prompts and predictions of
    every configuration."""
    from quant.evaluate import eval_text_tokens

    policy = check_peer_spec(p)
    thr = peer_threads(host)
    out = []
    for n, c in enumerate(p.configurations):
        progress(f"  preparing {n + 1}/{len(p.configurations)}: {c.key}")
        spec = model_spec(c.model)
        if policy == "mnn":
            from hil.mnn_convert import ensure_mnn_model

            plan, pred = predict_mnn(spec, host, c.bits, c.prompt_tokens, thr)
            path = ensure_mnn_model(spec, c.bits, log=progress)
        else:
            from hil.peer import peer_gguf_file

            plan, pred = predict_peer(spec, host, c.weight_type, c.prompt_tokens, thr)
            path = Path(peer_gguf_file(spec, c.weight_type))
        out.append(Prepared(c, spec, plan, path, eval_text_tokens(spec, c.prompt_tokens), pred))
    return out


def _cold_run(policy: str, threads: int) -> Callable[[Prepared], dict]:
    """One cold run of the peer (repeats=1) on a prepared configuration."""
    if policy == "mnn":
        from hil import mnn_peer

        return lambda x: mnn_peer.mnn_cold_ttft(x.path, x.tokens, threads=threads, repeats=1, n_vocab=x.spec.vocab)
    from hil import peer

    return lambda x: peer.llamacpp_cold_ttft(x.path, x.tokens, threads=threads, repeats=1)


def execute_peer(p: ProtocolSpec, prepared: list[Prepared], threads: int,
                 progress: Callable[[int, int], None] | None = None) -> tuple[list[RunRecord], dict]:
    """Every slot of the schedule, in order, as one cold run of the peer (module doc): one record per attempt."""
    run = _cold_run(framework_spec(prepared[0].config.framework).policy, threads)
    slots = schedule([x.config for x in prepared], p.rounds, p.runs_per_round, p.warmup, p.seed)
    recs: list[RunRecord] = []
    t0 = time.perf_counter()
    for n, s in enumerate(slots):
        prep = prepared[s.config]
        load = os.getloadavg()[0]
        start = time.perf_counter() - t0
        for a in range(RERUN_TRIES):
            r = run(prep)
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


def criterion_md(m: dict[str, Any], peer: str = "llama.cpp") -> str:
    """The `peer` policy's acceptance line (BIAS_MAX_PCT, MEAN_ABS_MAX_PCT) from a peer set's metrics."""
    if m.get("protocol_n") is None:
        return ""
    bias, mae = m["protocol_bias_pct"], m["protocol_mean_abs_pct"]
    ok = abs(bias) <= BIAS_MAX_PCT and mae <= MEAN_ABS_MAX_PCT
    return (f"- {peer} policy acceptance (|mean signed error| <= {BIAS_MAX_PCT:g} %, mean |error| <= "
            f"{MEAN_ABS_MAX_PCT:g} %): **{'met' if ok else 'not met'}** — {bias:+.1f} %, {mae:.1f} %")


@dataclasses.dataclass(frozen=True)
class Peer:
    """What experiments.protocol.run_set calls for a peer set: its preparation, runs and acceptance line."""
    policy: str                 # llamacpp | mnn

    def prepare(self, p: ProtocolSpec, host, progress=print) -> list[Prepared]:
        return prepare_peer(p, host, progress)

    def execute(self, p: ProtocolSpec, prepared: list[Prepared], host,
                progress: Callable[[int, int], None] | None = None) -> tuple[list[RunRecord], dict]:
        return execute_peer(p, prepared, peer_threads(host), progress)

    def criterion_md(self, m: dict[str, Any]) -> str:
        return criterion_md(m, PEERS[self.policy])


def peer_for(p: ProtocolSpec) -> Peer:
    """The set's peer (check_peer_spec), its extra installed (one ConfigError line with the install hint otherwise)."""
    policy = check_peer_spec(p)
    if policy == "mnn":
        from hil.mnn_peer import INSTALL_HINT, available
    else:
        from hil.peer import INSTALL_HINT, available
    if not available():
        raise ConfigError(f"protocol={p.name}: {INSTALL_HINT}")
    return Peer(policy)
