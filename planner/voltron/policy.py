"""Base class of the multi-device execution policies (Voltron and the baselines) — the contract the simulator drives.

A policy is built once per run (`PolicyContext`: model sublayer table, cluster, fitted latency model, importance,
config). The simulator calls `start_turn` at the beginning of every conversation turn (prefill + decode plans) and
`step` before every decode token; both see only what a device could observe (link goodput/latency from RSSI, which
devices are reachable, the KV length). Policies return plans plus the weight bytes each device must (re)load from
its flash for the new plan, which the simulator turns into stalls (overlapped with compute or not, per policy).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np

from planner.voltron.accuracy import AccuracyConfig, accuracy_proxy
from planner.voltron.comm import LinkState
from planner.voltron.devices import BYTES_PER_WEIGHT, Cluster
from planner.voltron.feedback import FeedbackConfig
from planner.voltron.hybrid import HybridPlanner, PhaseEnv
from planner.voltron.importance import Importance
from planner.voltron.latency import LatencyModel
from planner.voltron.layers import ATTN_GQA, ATTN_MHA, ATTN_SWA, LayerTable
from planner.voltron.plan import PhasePlan

# The planner names a config may select, one policy module each. `registry.POLICIES` maps them to their classes; it
# sits above the policies, which build on this module, so the names the config checks against are kept here.
PLANNER_NAMES = ("voltron", "single", "mp", "tp")


@dataclass
class PlannerConfig:
    """conf/planner/<name>.yaml (schema `planner_schema`)."""
    name: str = "voltron"              # one of PLANNER_NAMES: voltron | single | mp | tp
    balance: str = "hetero"            # mp/tp baselines: hetero (by device speed) | equal (paper Fig. 4 naive split)
    qos_ttft_s: float = 10.0           # s, paper §5.1.3 (TTFT QoS)
    qos_tpot_s: float = 0.4            # s, paper §5.1.3 (TPOT QoS)
    qos_margin: float = 0.05           # voltron plans to (1 - margin) × QoS: headroom for the latency model's error
    kv_bucket: int = 64                # tokens: KV memory is reserved (and plans cached) in buckets of this size
    restore_gain: float = 0.05         # voltron: adopt a non-required new plan only if accuracy_proxy rises by this
    prune_steps: int = 16              # pruning granularity: fractions k/prune_steps of each layer's shards
    ffn_shards: int = 32               # TP shard count of a dense FFN (channel groups)
    head_precision: int = 1            # LM head precision id (1 = INT8 / Q8_0, llama.cpp's usual output.weight type)
    comm_scaling: bool = True          # voltron: activation quantization / pruning when comm breaks QoS (§4.3.2)
    overlap_reload: bool = True        # voltron: shard reloads overlap with compute (§4.3 "Overhead Mitigation")
    disconnect_kv: str = "prune"       # voltron, a device holding ATTN shards leaves: prune (its shards + their KV are
                                       # pruned until it is back, paper §4.3) | recompute (re-prefill the context: an
                                       # upper bound). The static baselines always recompute.
    compute_pruning: bool = True       # voltron: prune shards (uniform fraction, ≤ prune_steps) when compute breaks
                                       # the TPOT QoS even at all-INT4 (trades accuracy for QoS, paper §4.3.1)
    energy_mode: bool = False          # voltron: spend the TPOT QoS slack on lower DVFS levels (§4.4)
    energy_margin: float = 0.1         # energy mode keeps this fraction of the TPOT QoS as headroom
    energy_scaling: float = 0.2        # energy mode first plans decode to (1 - this) × its target (lower precision)
                                       # to create the latency margin DVFS then spends (§4.4)
    profile_points: int = 160          # simulated profile runs per (device, precision, phase) for the regression
    profile_noise: float = 0.05        # σ of the log-normal noise of simulated profiles
    latency_by_type: bool = False      # fit the latency regression per layer type too (paper: layer type is a feature);
                                       # on for measured cluster profiles (conf/validate_cluster.yaml), off in the
                                       # simulator's runs (their tables were made with the pooled fit)
    accuracy: AccuracyConfig = field(default_factory=AccuracyConfig)
    feedback: FeedbackConfig = field(default_factory=FeedbackConfig)   # voltron: closed-loop QoS (feedback.py)

    def __post_init__(self) -> None:
        if self.name not in PLANNER_NAMES:
            raise ValueError(f"planner.name must be one of {'|'.join(PLANNER_NAMES)} (got {self.name!r})")
        if self.balance not in ("hetero", "equal"):
            raise ValueError(f"planner.balance must be hetero|equal (got {self.balance!r})")
        if self.qos_ttft_s <= 0 or self.qos_tpot_s <= 0:
            raise ValueError("planner.qos_ttft_s and planner.qos_tpot_s must be > 0")
        if not 0 <= self.qos_margin < 1:
            raise ValueError(f"planner.qos_margin must be in [0, 1) (got {self.qos_margin})")
        if not 0 <= self.energy_scaling < 1:
            raise ValueError(f"planner.energy_scaling must be in [0, 1) (got {self.energy_scaling})")
        if not 0 <= self.energy_margin < 1:
            raise ValueError(f"planner.energy_margin must be in [0, 1) (got {self.energy_margin})")
        if self.kv_bucket < 1 or self.prune_steps < 2 or self.ffn_shards < 1:
            raise ValueError("planner.kv_bucket >= 1, planner.prune_steps >= 2, planner.ffn_shards >= 1 required")
        if self.disconnect_kv not in ("prune", "recompute"):
            raise ValueError(f"planner.disconnect_kv must be prune|recompute (got {self.disconnect_kv!r})")
        if self.head_precision not in (0, 1, 2):
            raise ValueError(f"planner.head_precision must be 0, 1 or 2 (got {self.head_precision})")
        if self.profile_points < 8 or self.profile_noise < 0:
            raise ValueError("planner.profile_points >= 8 and planner.profile_noise >= 0 required")
        if isinstance(self.accuracy, dict):
            self.accuracy = AccuracyConfig(**self.accuracy)
        if isinstance(self.feedback, dict):
            self.feedback = FeedbackConfig(**self.feedback)


@dataclass
class PolicyContext:
    table: LayerTable
    cluster: Cluster
    latency: LatencyModel
    importance: Importance
    cfg: PlannerConfig


@dataclass
class Decision:
    """What a policy answers for a turn start or a token."""
    plan: PhasePlan                         # plan to run now (prefill at turn start, else decode)
    next_plan: PhasePlan | None = None      # turn start: the decode plan that follows the prefill
    reload_bytes: np.ndarray | None = None  # (D,) weight bytes to load from flash before/while running `plan`
    replanned: bool = False                 # the plan changed
    plan_ms: float = 0.0                    # wall-clock time spent planning (measured)
    searched: bool = False                  # the planner ran (not answered from its cache)
    oom: bool = False                       # no plan fits the memory budgets
    urgent: bool = True                     # the previous plan cannot keep running (memory / device lost): the
                                            # switch cannot wait for the reload to finish in the background
    bridge: PhasePlan | None = None         # run this now, until `plan` is loaded: the running plan with the
                                            # run-time levers that need no reload (Voltron's closed loop)
    bridge_of: PhasePlan | None = None      # the loaded plan `bridge` is made of: a runtime that has meanwhile
                                            # swapped in the re-planned placement does not put a bridge of the
                                            # replaced plan back over it
    switch_est_s: float = 0.0               # modelled: the one-time cost of the switch this decision takes (the
                                            # KV of restored ATTN shards, `restores_kv`), charged before its step
    kv_held: bool = False                   # a restore of pruned ATTN shards was deferred: its KV rebuild would
                                            # have put the step above the target


def restores_kv(table: LayerTable, frm: PhasePlan, to: PhasePlan) -> bool:
    """Switching from the plan that ran (`frm`) to `to` activates ATTN shards `frm` had pruned. A sublayer's pruned
    shards are the first `pruned[j]` of a fixed order (least important first, `shard_map.assign_shards`), so fewer
    pruned shards in any ATTN sublayer means shards with no KV for the cached context: it must be recomputed before
    `to` runs a step, and that needs every earlier layer's hidden states of the context, i.e. a re-prefill of the
    context on `to` (what the cluster's coordinator does, `shard_map.kv_switch`)."""
    attn = np.isin(table.type_of, [ATTN_MHA, ATTN_GQA, ATTN_SWA])
    return bool((to.pruned[attn] < frm.pruned[attn]).any())


class Policy:
    """Base policy. Behaviour differences between policies are declared as class capabilities, never derived from
    `name` (which only labels outputs):
    - `overlap_reload`: weight reloads of a new plan overlap with compute (else they stall in full);
    - `uses_balance`: the layout follows `planner.balance` (hetero / equal), so the label carries it;
    - `lost_kv()`: what happens to the context KV a departed device held — "prune" (the policy prunes those shards
      and their KV, nothing is recomputed) or "recompute" (the simulator charges a re-prefill of the context)."""
    name = "base"
    overlap_reload = False
    uses_balance = False

    def lost_kv(self) -> str:
        return "recompute"

    def label(self) -> str:
        """Output label: the policy name, plus the balance rule for policies that use one (e.g. `mp-hetero`)."""
        return f"{self.name}-{self.ctx.cfg.balance}" if self.uses_balance else self.name

    def __init__(self, ctx: PolicyContext):
        self.ctx = ctx
        self.hp = HybridPlanner(ctx.table, ctx.cluster, ctx.latency, ctx.cfg.head_precision)
        self.resident: np.ndarray | None = None           # (N, D) weight bytes resident per sublayer and device
        self.current: PhasePlan | None = None
        self._key = None

    # ---- helpers shared by all policies ---------------------------------------------------------------------------
    def env(self, phase: int, n_tokens: int, kv_len: int, links: LinkState, budgets: np.ndarray) -> PhaseEnv:
        """Phase environment with KV time/memory rounded up to the next bucket (plans stay valid for a bucket)."""
        b = self.ctx.cfg.kv_bucket
        kv_plan = int(np.ceil((kv_len + n_tokens + 1) / b) * b)
        kv_est = kv_len if phase == 0 else kv_plan
        return PhaseEnv(phase, n_tokens, kv_est, kv_plan, links, np.where(links.connected, budgets, 0.0))

    def estimate(self, plan: PhasePlan, n_tokens: int, kv_len: int, links: LinkState) -> PhasePlan:
        """`plan` re-costed (modelled) for the step it runs in: the links of that instant and the exact KV length.
        A plan is kept while its KV bucket and link state allow (hysteresis), so its own `est_time_s`, made when it
        was searched, can describe links that have since changed; the step's prediction is this re-costing. Memory
        is not re-checked (the running plan was admitted under the budgets it carries)."""
        phase = 0 if plan.phase == "prefill" else 1
        env = PhaseEnv(phase, n_tokens, kv_len, plan.kv_plan, links,
                       np.where(links.connected, plan.budget_bytes, 0.0))
        out = self.hp.fixed(self.hp.options(env, 0.0), env, plan.precision, plan.act_precision, plan.shards,
                            plan.pruned, plan.act_pruned)
        if out.fits and plan.freq.size and np.any(plan.freq != 1.0):     # energy mode: DVFS as planned
            comp = out.est_time_s - out.est_comm_s
            out = dataclasses.replace(out, freq=plan.freq, est_time_s=comp / plan.freq.min() + out.est_comm_s)
        return out

    def weight_bytes(self, plan: PhasePlan) -> np.ndarray:
        """(N, D) weight bytes a plan keeps resident."""
        tb = self.ctx.table
        unit = tb.params[tb.type_of] * BYTES_PER_WEIGHT[plan.precision] / tb.shards[tb.type_of]
        return plan.shards * unit[:, None]

    def adopt(self, plan: PhasePlan) -> np.ndarray:
        """Make `plan` current; return (D,) bytes to load (new or re-quantized shards)."""
        new = self.weight_bytes(plan)
        if self.resident is None:
            self.resident = new
            self.current = plan
            return np.zeros(new.shape[1])
        same_prec = (self.current.precision == plan.precision)[:, None]
        need = np.where(same_prec, np.maximum(new - self.resident, 0.0), new)
        self.resident = new
        self.current = plan
        return need.sum(axis=0)

    def accuracy(self, plan: PhasePlan) -> float:
        tb = self.ctx.table
        frac = plan.pruned / tb.shards[tb.type_of]
        return accuracy_proxy(tb.spec.name, self.ctx.importance, self.ctx.cfg.accuracy, plan.precision,
                              plan.act_precision, frac)

    @staticmethod
    def changed(a: PhasePlan | None, b: PhasePlan) -> bool:
        if a is None:
            return True
        return not (np.array_equal(a.shards, b.shards) and np.array_equal(a.precision, b.precision)
                    and np.array_equal(a.act_precision, b.act_precision) and np.array_equal(a.pruned, b.pruned))

    # ---- the contract ---------------------------------------------------------------------------------------------
    def start_turn(self, links: LinkState, budgets: np.ndarray, n_in: int, kv_len: int) -> Decision:
        raise NotImplementedError

    def step(self, links: LinkState, budgets: np.ndarray, kv_len: int) -> Decision:
        raise NotImplementedError

    def end_turn(self, links: LinkState, budgets: np.ndarray, kv_len: int, idle_s: float) -> Decision | None:
        """The turn is answered and the cluster waits `idle_s` for the user's next prompt: a plan switch to make in
        that wait (its reload and KV rebuild run in it), or None."""
        return None

    def observe(self, plan: PhasePlan, n_tokens: int, kv_len: int, links: LinkState, step_s: float,
                busy_s: np.ndarray, link_s: np.ndarray) -> None:
        """What the cluster measured for one step of `plan` on `links` (as the policy saw them): step seconds without
        reload stalls, (D,) compute seconds per device, (D,) seconds of the messages each link carried. Open-loop
        policies ignore it."""


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, (time.perf_counter() - t0) * 1e3
