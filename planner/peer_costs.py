"""What two other runtimes cost on a measured host: llama.cpp's and MNN's own code, which the simulator's llama.cpp and
MNN policies need to predict those frameworks themselves on that host (planner/pipeline/cpu_plan.py; docs/hil.md
"The llama.cpp policy", "The MNN peer").

A device profile (`planner.device.SocProfile`) says what a device is; `planner.host_runtime.HostRuntime` holds the
mechanics of a host's OS and of the project's runner. Neither is the place for what a particular framework's own
code costs: those are measured by running that framework on the host (`hil.calibrate_peer` for llama.cpp,
`hil.calibrate_mnn` for MNN), and a phone profile has none of them. The plan builders and the analytic cost model take
a `PeerCosts` beside the device; a phone takes `NO_PEER_COSTS`, every cost unmeasured, where the llama.cpp policy
costs its file at the device's INT8 / K-quant rates and the MNN policy is the paper's INT8 plan. Stored as
`peers.json` beside a host profile's `device.json` (`hil.host.load_peers`), each value's source with it.

Every default means "not measured": 0 for a time or a rate, an empty table for a per-key rate. Units: seconds
(`_s`), GB/s = 1e9 B/s (`_gbps`), GOP/s per core per GHz of the threads' effective clock (`_gops_per_ghz`,
`SocProfile.thread_ghz`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields

from planner.formats import GGML_FTYPES

# the keys of the per-key tables: "<file type>@<d_model>" (llama.cpp), "b<weight bits>@<d_model>" and "b<weight bits>"
# (MNN); the planner picks the nearest measured d_model (cpu_plan.llamacpp_rate_key / mnn_rate_key)
KEY_FORMS = {"llamacpp_gemm_gops_per_ghz": (re.compile(r"([A-Z0-9_]+)@([1-9][0-9]*)"), "'<file type>@<d_model>', "
                                            "e.g. 'Q4_0@576'"),
             "mnn_load_gbps": (re.compile(r"b([1-8])"), "'b<weight bits>', e.g. 'b8'"),
             "mnn_gemm_gops_per_ghz": (re.compile(r"b([1-8])@([1-9][0-9]*)"), "'b<weight bits>@<d_model>', "
                                       "e.g. 'b8@576'")}


@dataclass(frozen=True)
class PeerCosts:
    # ---- llama.cpp's own code on this CPU (cpu_plan.build_llamacpp_plan; hil.calibrate_peer) ---------------------
    llamacpp_fixed_s: float = 0.0             # s, its own code outside weight reads and matmuls: model open (GGUF
    #                                           metadata, vocabulary parse), context (KV cache, graph reserve) and the
    #                                           prompt eval's fixed part (graph build and allocation, LM head)
    llamacpp_repack_gbps: float = 0.0         # GB/s of one thread repacking the repacked tensor types at load
    #                                           (planner.formats.GGML_REPACK_X86); 0 = this CPU repacks nothing
    llamacpp_gemm_gops_per_ghz: dict[str, float] = field(default_factory=dict)   # GOP/s per core per GHz of its
    #                                           prompt eval per "<file type>@<d_model>" (weight matmul FLOPs per s of
    #                                           the eval's per-token time, the graph's other ops included);
    #                                           empty: Q8_0 at the device's INT8 GEMM rate, K-quants slowed down
    # ---- MNN's own code on this CPU (cpu_plan.build_mnn_plan; hil.calibrate_mnn) ---------------------------------
    mnn_fixed_s: float = 0.0                  # s, its own code outside weight reads, weight set-up and matmuls: model
    #                                           create and load (graph, tokenizer, backend) and the prompt forward's
    #                                           fixed part (graph resize and allocation, LM head)
    mnn_load_gbps: dict[str, float] = field(default_factory=dict)   # GB/s of its load's own work per weight-file
    #                                           byte beyond the read (the CPU backend's weight re-layout), one thread,
    #                                           per "b<weight bits>"; absent = not modelled
    mnn_gemm_gops_per_ghz: dict[str, float] = field(default_factory=dict)   # GOP/s per core per GHz of its prompt
    #                                           forward per "b<weight bits>@<d_model>" (weight matmul FLOPs per s of
    #                                           the forward's per-token time, the graph's other ops included);
    #                                           empty: the paper's INT8 plan at the device's rates

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in KEY_FORMS:
                self._check_table(f.name, v)
                object.__setattr__(self, f.name, dict(v))     # its own copy: a caller's later edit cannot reach it
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"peers.{f.name} must be a finite number >= 0 (got {v!r})")

    @staticmethod
    def _check_table(name: str, table: object) -> None:
        if not isinstance(table, dict):
            raise ValueError(f"peers.{name} must be a table of rates (got {table!r})")
        pattern, form = KEY_FORMS[name]
        for k, v in table.items():
            m = pattern.fullmatch(k) if isinstance(k, str) else None
            if m is None or (name == "llamacpp_gemm_gops_per_ghz" and m.group(1) not in GGML_FTYPES):
                raise ValueError(f"peers.{name}: key {k!r} must be {form}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"peers.{name}[{k!r}] must be a finite rate > 0 (got {v!r})")


PEER_FIELDS = tuple(f.name for f in fields(PeerCosts))
NO_PEER_COSTS = PeerCosts()       # no other runtime measured here (every phone profile)
