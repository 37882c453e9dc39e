"""Layer-wise hybrid parallelism (Voltron paper §4.2.1): per sublayer and per phase, MP or TP, whichever the latency
model + communication model says is faster, under every device's memory budget (weights + KV cache + activations).

- MP option on device d: the whole (unpruned) sublayer on d; estimated time = regression time on d + one activation
  transfer to d (paper: "compute on one device + one activation transfer"). Sequential assignment: the fastest device
  that still fits, else the next (paper: "MP: fastest device that fits, else the next").
- TP option over a device set S: shards assigned greedily one at a time to the device that would finish them first
  (balances time by device speed, paper: "TP: shards balanced by device speed"); estimated time = slowest device +
  broadcast/aggregate (`comm.LinkState.tp_comm`). Every subset of ≥ 2 connected devices is an option, so a device behind
  a weak link can be left out of TP.
- Layers are visited in order; each takes its fastest option that fits the remaining memory (paper: "sequentially
  assigns a parallelism strategy to each layer, while considering the memory budget").
- Additions beyond the paper, each for a failure the plain rule showed here: a memory-proportional TP option (fallback
  when speed-balanced shards strand memory in fragments no whole layer fits), a boundary-aware repair of alternating
  remote MP placements, and (prefill) a second ranking that charges a remote MP transfer once per run of layers
  instead of once per layer; the plan with the lower exact estimate is kept.

Divided by concern (re-planning runs token by token, target ≤ 1 ms for a 96-sublayer model):
- `options.py`: `PhaseEnv`, `OptionTable` and the option tables per class of identical sublayers (NumPy, cached);
- `assign.py`: the sequential memory-aware pass in runs and the boundary-aware repair;
- here: `HybridPlanner` (composes both), the plan's exact estimate, the two rankings, and `fixed` — the plan object
  (memory, fit, estimated time) of any shard placement, through which baselines and the controller also build plans.
"""
from __future__ import annotations

import numpy as np

from planner.voltron.assign import SequentialAssign
from planner.voltron.devices import ACT_BYTES, PRECISIONS, Cluster
from planner.voltron.latency import LatencyModel
from planner.voltron.layers import HEAD, LayerTable
from planner.voltron.options import OptionBuilder, OptionTable, PhaseEnv, _subsets
from planner.voltron.plan import TP, PhasePlan

__all__ = ["HybridPlanner", "OptionTable", "PhaseEnv"]

P = len(PRECISIONS)


class HybridPlanner(OptionBuilder, SequentialAssign):
    """Plans one phase at a time for a fixed model and cluster with a fitted latency model."""

    def __init__(self, table: LayerTable, cluster: Cluster, latency: LatencyModel, head_precision: int = 1):
        self.table = table
        self.cluster = cluster
        self.latency = latency
        self.head_precision = head_precision
        self.D = cluster.n
        self.subsets = _subsets(self.D)                                     # (Sub, D)
        self.types = np.array(sorted(set(table.type_of.tolist())))          # present sublayer types
        self.T = len(self.types)
        self.tpos = np.full(6, -1)
        self.tpos[self.types] = np.arange(self.T)
        self._cache: dict = {}
        self._compute_cache: dict = {}
        self._base_cache: dict = {}                                         # prune-independent part (`_base`)
        self._link_cache: dict = {}                                         # per link state (`_link_part`)
        self._set_bits = 1 << np.arange(self.D)                             # device d -> bit d of a set's mask
        self._prop_cache: dict = {}
        self._static_cache: dict = {}                                       # per-planner constants (`_static`)
        self._zeros = np.zeros(table.n, dtype=np.int64)
        self._cls_base = self.tpos[table.type_of] * P * len(ACT_BYTES)       # (N,) class index at fp16 / fp16 acts
        self._ranks = np.arange(self.D + len(self.subsets) + 1)[None, :].repeat(self.T * P * len(ACT_BYTES), 0)
        # online corrections of the latency and communication models per phase (closed loop, `feedback.py`); the
        # static baselines never set them (all 1)
        self.comp_scale = np.ones((2, self.D))                              # factor on each device's compute
        self.comm_scale = np.ones((2, self.D))                              # factor on each link's messages
        self._corr_key: tuple = ()

    def set_correction(self, comp_scale: np.ndarray, comm_scale: np.ndarray) -> None:
        """Scale the fitted regression per (phase, device) and the communication model per (phase, link); plans made
        from here on (and the cached option tables they use) carry the corrections."""
        comp, comm = np.asarray(comp_scale, dtype=float), np.asarray(comm_scale, dtype=float)
        key = (comp.round(9).tobytes(), comm.round(9).tobytes())
        if key != self._corr_key:
            self.comp_scale, self.comm_scale, self._corr_key = comp.copy(), comm.copy(), key

    def class_of(self, precision: np.ndarray, act_precision: np.ndarray) -> np.ndarray:
        """(N,) class index per sublayer."""
        return self._cls_base + precision * len(ACT_BYTES) + act_precision

    # ---- estimates and plans -------------------------------------------------------------------------------------
    def _estimate(self, opt: OptionTable, cls: np.ndarray, chosen: np.ndarray, act: np.ndarray) -> tuple[float, float]:
        """(estimated step time, of which communication) for a complete assignment."""
        idx = cls * opt.comp.shape[1] + chosen                               # flat (class, option) index
        comp = opt.comp.ravel().take(idx)
        strategy = np.where(chosen < self.D, chosen, TP)
        tp_comm = opt.comm.ravel().take(idx)[strategy == TP].sum()
        comm = float(tp_comm) + self.boundary_comm(strategy, act, opt.hop)
        return float(comp.sum()) + comm + opt.head_time, comm

    def quick(self, opt: OptionTable, env: PhaseEnv, precision: np.ndarray,
              act_precision: np.ndarray | None = None) -> tuple[bool, float]:
        """(fits, estimated step time) without building a plan object (used inside the precision search)."""
        act = self._zeros if act_precision is None else act_precision
        cls = self.class_of(precision, act)
        chosen, fits = self._run(opt, env, cls)
        self.last_chosen = chosen                      # lets the caller turn a successful probe into a plan
        if not fits:
            return False, float("inf")
        return True, self._estimate(opt, cls, chosen, act)[0]

    def assign(self, opt: OptionTable, env: PhaseEnv, precision: np.ndarray,
               act_precision: np.ndarray | None = None) -> PhasePlan:
        """Full plan: the paper's ranking and the run-amortised ranking (see `_build`); the better exact estimate
        wins."""
        act = self._zeros if act_precision is None else act_precision
        cls = self.class_of(precision, act)
        chosen, fits = self._run(opt, env, cls)
        plan = self._plan(opt, env, precision, act, chosen, fits)
        alt = getattr(opt, "alt", None)
        if alt is not None and env.phase == 0:
            # prefill only: per-layer compute dwarfs one transfer, so long remote MP runs pay off; in decode a
            # transfer costs as much as a layer and the run-amortised ranking only adds alternations
            chosen2, fits2 = self._run(alt, env, cls)
            if fits2:
                plan2 = self._plan(alt, env, precision, act, chosen2, fits2)
                if plan2.fits and plan2.est_time_s < plan.est_time_s:
                    return plan2
        return plan

    def _plan(self, opt: OptionTable, env: PhaseEnv, precision, act, chosen, fits) -> PhasePlan:
        cls = self.class_of(precision, act)
        ok = chosen >= 0
        ch = np.where(ok, chosen, 0)
        shards = np.where(ok[:, None], opt.shards[cls, ch], 0)
        plan = self.fixed(opt, env, precision, act, shards, opt.pruned[self.table.type_of])
        plan.fits = plan.fits and fits
        if not plan.fits:
            plan.est_time_s = float("inf")
        return plan

    def fixed(self, opt: OptionTable, env: PhaseEnv, precision: np.ndarray, act: np.ndarray, shards: np.ndarray,
              pruned: np.ndarray, act_pruned: np.ndarray | None = None) -> PhasePlan:
        """Plan object (memory, fit, estimated time) for a given shard placement (N, D): a sublayer whose shards sit
        on one device is MP on it, otherwise TP over the devices holding shards. Baselines and the controller's
        activation pruning build plans through here; the hybrid planner does too, so all are costed alike."""
        N = self.table.n
        tpos = self.tpos[self.table.type_of]                                # (N,)
        used = shards > 0                                                    # (N, D)
        n_used = used.sum(axis=1)
        strategy = np.where(n_used > 1, TP, np.where(n_used == 1, used.argmax(axis=1), 0))
        unit = opt.unit[tpos, precision]                                     # (N,)
        mem = (shards * unit[:, None]).sum(axis=0) + opt.reserve             # (D,)
        bt = opt.b[:, precision, tpos].T                                     # (N, D)
        ut = opt.u[:, precision, tpos].T                                     # (N, D)
        t_dev = np.where(used, bt + shards * ut, 0.0)
        layer_comp = t_dev.max(axis=1)                                       # (N,)
        tp_mask = n_used > 1
        layer_comm = np.zeros(N)
        if tp_mask.any():
            links = env.links.scaled(self.comm_scale[env.phase])
            layer_comm[tp_mask] = links.tp_comm(opt.act_bytes[act[tp_mask]], used[tp_mask])
        comm = float(layer_comm.sum()) + self.boundary_comm(strategy, act, opt.hop)
        fits = bool((mem <= env.budgets * (1 + 1e-12)).all()) and not bool((used & ~env.alive).any())
        est = float(layer_comp.sum()) + comm + opt.head_time
        return PhasePlan(model=self.table.spec.name, phase=("prefill", "decode")[env.phase],
                         devices=[d.name for d in self.cluster.devices], n_tokens=env.n_tokens, kv_len=env.kv_len,
                         kv_plan=env.kv_plan, precision=precision.copy(), act_precision=act.copy(),
                         strategy=strategy, shards=shards, pruned=pruned.copy(),
                         act_pruned=np.zeros(N, dtype=bool) if act_pruned is None else act_pruned.copy(),
                         fits=fits, est_time_s=est if fits else float("inf"), est_comm_s=comm, mem_bytes=mem,
                         budget_bytes=env.budgets.astype(float), layer_comp_s=layer_comp, layer_comm_s=layer_comm)

    @staticmethod
    def boundary_comm(strategy: np.ndarray, act: np.ndarray, hop: np.ndarray) -> float:
        """Exact MP boundary transfers: activations move when consecutive sublayers live on different devices
        (TP layers live on the main device, where they aggregate); the embedding and the LM head are on the main."""
        home = np.where(strategy == TP, 0, strategy)
        if not home.any():                                                   # everything lives on the main device
            return 0.0
        prev = np.concatenate([[0], home])
        nxt = np.concatenate([home, [0]])
        a = np.concatenate([act, act[-1:]])
        moved = prev != nxt
        if not moved.any():
            return 0.0
        return float((hop[a[moved], prev[moved]] + hop[a[moved], nxt[moved]]).sum())

    def raw_parts(self, plan: PhasePlan, n_tokens: int, kv_len: int,
                  links) -> tuple[np.ndarray, float, float, np.ndarray]:
        """The *uncorrected* models' view of one step of `plan` on `links`: (N, D) regression seconds of each
        device's shards, the LM head's seconds (main device), the communication model's seconds (TP broadcast /
        aggregate + MP boundaries) and (D,) the seconds of the messages each link carries. The closed loop compares
        these with what the cluster measured."""
        tb = self.table
        phase = 0 if plan.phase == "prefill" else 1
        feats, _ = tb.features(n_tokens, kv_len)
        icpt, slope = self.latency.type_costs(phase, feats)                 # (D, P, 6)
        ty, prec = tb.type_of, plan.precision
        b = icpt[:, prec, ty].T                                             # (N, D)
        u = slope[:, prec, ty].T / tb.shards[ty][:, None]
        used = plan.shards > 0
        t_dev = np.where(used, b + plan.shards * u, 0.0)
        head = float(icpt[0, self.head_precision, HEAD] + slope[0, self.head_precision, HEAD])
        act_bytes = n_tokens * tb.act_width * ACT_BYTES                     # (A,)
        tp = used.sum(axis=1) > 1
        nb = act_bytes[plan.act_precision[tp]]
        comm = float(links.tp_comm(nb, used[tp]).sum()) if tp.any() else 0.0
        hop = links.hop(act_bytes)                                          # (A, D)
        comm += self.boundary_comm(plan.strategy, plan.act_precision, hop)
        link_s = links.message_s(nb, used[tp]) if tp.any() else np.zeros(self.D)
        home = np.where(plan.strategy == TP, 0, plan.strategy)
        prev, nxt = np.concatenate([[0], home]), np.concatenate([home, [0]])
        a = np.concatenate([plan.act_precision, plan.act_precision[-1:]])
        moved = prev != nxt
        for ends in (prev, nxt):                                            # boundary messages out of / into a device
            np.add.at(link_s, ends[moved], hop[a[moved], ends[moved]])
        link_s[0] = 0.0
        return t_dev, head, comm, link_s

    def plan(self, env: PhaseEnv, precision: np.ndarray, prune_frac: float = 0.0,
             act_precision: np.ndarray | None = None) -> PhasePlan:
        return self.assign(self.options(env, prune_frac), env, precision, act_precision)
