"""Option tables of the hybrid MP/TP planner (Voltron paper §4.2.1): for every class of identical sublayers
c = (type, weight precision, activation precision), the cost, memory and shard placement of every parallel option —
MP on each live device, TP over every subset of ≥ 2 live devices (greedy speed-balanced shards), and a
memory-proportional TP fallback — priced with the fitted latency regression and the communication model.

Design for speed (re-planning runs token by token): option costs are computed once per class with NumPy; the greedy
shard assignment of all classes and subsets is one sort (the greedy picks the S smallest of the per-device finishing
times b_d + k·u_d, k = 1..S). The link-independent compute/memory part is cached separately from the communication
part, so an RSSI change only re-prices communication. The sequential memory-aware pass over these tables is in
`assign.py`; `hybrid.py` composes both into `HybridPlanner`.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np

from planner.voltron.comm import LinkState
from planner.voltron.devices import ACT_BYTES, BYTES_PER_WEIGHT, PRECISIONS
from planner.voltron.layers import ACT_WORK_BYTES, HEAD

P = len(PRECISIONS)


@dataclass
class PhaseEnv:
    """What one planning call sees: the phase workload, links, live devices and memory budgets."""
    phase: int                   # 0 prefill, 1 decode
    n_tokens: int                # new tokens per step
    kv_len: int                  # tokens already cached (time estimate)
    kv_plan: int                 # cached tokens to reserve memory for
    links: LinkState
    budgets: np.ndarray          # (D,) bytes available to the LLM per device (0 for devices that left)

    @property
    def alive(self) -> np.ndarray:
        return self.links.connected & (self.budgets > 0)


@dataclass
class OptionTable:
    """Per class c = (type, weight precision, act precision) and option o (MP on d for o < D, else TP over a subset)."""
    comp: np.ndarray             # (C, O) s compute time (slowest device for TP)
    comm: np.ndarray             # (C, O) s communication time used for the choice (MP: one transfer; TP: bcast+agg)
    mem: np.ndarray              # (C, O, D) bytes per device
    shards: np.ndarray           # (C, O, D) shards per device
    order: np.ndarray            # (C, O) options sorted by comp + comm (invalid last)
    n_valid: np.ndarray          # (C,) number of valid options
    pruned: np.ndarray           # (T,) pruned shards per type
    reserve: np.ndarray          # (D,) bytes reserved before layers (workspace, LM head)
    head_time: float             # s LM head on the main device
    act_bytes: np.ndarray        # (A,) bytes per activation transfer at each activation precision
    hop: np.ndarray              # (A, D) one-hop time per activation precision
    n_dev: int
    b: np.ndarray                # (D, P, T) s regression intercept per device, precision and present type
    u: np.ndarray                # (D, P, T) s per shard of each present type
    unit: np.ndarray             # (T, P) resident bytes per shard (weights + KV at kv_plan)
    w_unit: np.ndarray           # (T, P) weight bytes per shard
    sorted_mem: np.ndarray       # (C, O, D) memory of each class's options in preference order
    valid: np.ndarray            # (C, O) option rank < n_valid


def _subsets(D: int) -> np.ndarray:
    """(Sub, D) bool masks of all device subsets with ≥ 2 members."""
    out = [np.isin(np.arange(D), c) for k in range(2, D + 1) for c in itertools.combinations(range(D), k)]
    return np.array(out, dtype=bool).reshape(-1, D)


class OptionBuilder:
    """Mixin of `HybridPlanner`: builds and caches the option tables (needs table, D, T, types, subsets, latency,
    head_precision and the caches set up by `HybridPlanner.__init__`)."""

    # ---- option tables --------------------------------------------------------------------------------------------
    def clear_tables(self) -> None:
        """Forget every option table and its parts that depend on the workload, links or budgets (the per-planner
        constants stay): the next plan rebuilds them as a re-plan under new conditions does."""
        self._cache.clear()
        self._compute_cache.clear()
        self._base_cache.clear()
        self._link_cache.clear()

    def options(self, env: PhaseEnv, prune_frac: float = 0.0) -> OptionTable:
        key = (env.phase, env.n_tokens, env.kv_len, env.kv_plan, env.links.mcs_key,
               tuple(env.budgets.tolist()), round(prune_frac, 6), self._corr_key)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if len(self._cache) > 4096:
            self._cache.clear()
        opt = self._build(env, prune_frac)
        self._cache[key] = opt
        return opt

    def _build(self, env: PhaseEnv, prune_frac: float) -> OptionTable:
        """Option table = link-independent compute/memory part (cached separately: an RSSI change only re-prices
        communication) + the communication part of this link state."""
        D, T = self.D, self.T
        alive = env.alive
        budgets = tuple(env.budgets.tolist())
        ckey = (env.phase, env.n_tokens, env.kv_len, env.kv_plan, budgets, tuple(alive.tolist()),
                round(prune_frac, 6), self._corr_key)
        part = self._compute_cache.get(ckey)
        if part is None:
            if len(self._compute_cache) > 1024:
                self._compute_cache.clear()
            part = self._compute_cache[ckey] = self._build_compute(env, prune_frac, alive, ckey[:6] + ckey[7:])
        comp, used, b, u, unit, w_unit, pruned, reserve, head_time, run_len, comp_c, mem_c, shards_c = part
        act_bytes, hop, tp_by_set = self._link_part(env)
        A = len(ACT_BYTES)
        O = comp.shape[2]
        comm = np.empty((T, P, A, O))
        # MP: the paper charges one activation transfer per layer (`comm`); the alternative ranking (`comm_run`)
        # charges the transfer into and out of a remote device once per *run* of layers on it, shared by the run's
        # layers, a run lasting as many sublayers as the device can hold. The search ranks with the paper's charge;
        # the final plan is built with both rankings and the one with the lower exact estimate is kept.
        comm[:, :, :, :D] = hop[None, None, :, :]
        comm[:, :, :, D:] = tp_by_set[:, used[:, :, D:] @ self._set_bits].transpose(1, 2, 0, 3)
        if env.phase == 0:
            comm_run = comm.copy()
            comm_run[:, :, :, :D] = 2 * hop[None, None, :, :] / run_len[:, :, None, :]
        comm_c = comm.reshape(-1, O)                                        # classes c = (t, p, a)
        total = comp_c + comm_c
        total = np.where(np.isfinite(total), total, np.inf)
        order = np.argsort(total, axis=1, kind="stable")
        n_valid = np.isfinite(total).sum(axis=1)
        main = OptionTable(comp=comp_c, comm=comm_c, mem=mem_c, shards=shards_c, order=order, n_valid=n_valid,
                           pruned=pruned, reserve=reserve, head_time=head_time, act_bytes=act_bytes, hop=hop, n_dev=D,
                           b=b, u=u, unit=unit, w_unit=w_unit,
                           sorted_mem=mem_c[np.arange(len(order))[:, None], order],
                           valid=np.arange(O)[None, :] < n_valid[:, None])
        if env.phase == 0:                   # the run-amortised ranking is only used for prefill (see `assign`)
            total_run = comp_c + comm_run.reshape(-1, O)
            order_run = np.argsort(np.where(np.isfinite(total_run), total_run, np.inf), axis=1, kind="stable")
            main.alt = dataclasses.replace(main, order=order_run,
                                           sorted_mem=mem_c[np.arange(len(order_run))[:, None], order_run])
        return main

    def _link_part(self, env: PhaseEnv) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(activation bytes (A,), one-hop times (A, D), TP broadcast + aggregate time (A, 2^D) of every set of
        devices, indexed by the set's bit mask) for this phase workload and link state; every option table of one
        re-plan (one per pruned fraction) shares them."""
        lk = env.links
        key = (env.phase, env.n_tokens, lk.goodput.tobytes(), lk.latency.tobytes(), lk.shared, self._corr_key)
        hit = self._link_cache.get(key)
        if hit is None:
            if len(self._link_cache) > 1024:
                self._link_cache.clear()
            act_bytes = env.n_tokens * self.table.act_width * ACT_BYTES         # (A,)
            links = env.links.scaled(self.comm_scale[env.phase])                # closed-loop correction (1: none)
            hop = links.hop(act_bytes)                                          # (A, D)
            sets = (np.arange(2 ** self.D)[:, None] & self._set_bits[None, :]) > 0   # (2^D, D)
            tp = links.tp_comm(act_bytes[:, None], sets[None, :, :])            # (A, 2^D)
            hit = self._link_cache[key] = (act_bytes, hop, tp)
        return hit

    def _static(self, prune_frac: float) -> tuple:
        """What the compute part needs that depends on the model, the cluster and `prune_frac` only (not on the KV
        length, the links or the budgets): built once per planner, so a token-level re-plan does not rebuild it."""
        key = round(prune_frac, 6)
        hit = self._static_cache.get(key)
        if hit is None:
            tb, D, T, ty = self.table, self.D, self.T, self.types
            S = tb.shards[ty].astype(float)                                 # (T,)
            pruned = np.minimum(np.rint(prune_frac * tb.shards), tb.shards - 1).astype(np.int64)   # (6,)
            Sk = (tb.shards[ty] - pruned[ty])                               # (T,) kept shards
            k = np.arange(1, int(Sk.max()) + 1)                             # (K,) shard counts
            hit = self._static_cache[key] = dict(
                S=S, pruned=pruned, Sk=Sk, k=k,
                tie=np.arange(D)[None, None, :, None] * 1e-12,              # deterministic ties
                beyond=~(k[None, None, None, :] <= Sk[:, None, None, None]),     # (T, 1, 1, K): k > Sk
                t_idx=np.arange(T)[:, None], p_idx=np.arange(P)[None, :],
                w_unit=tb.params[ty][:, None] * BYTES_PER_WEIGHT[None, :] / S[:, None])
        return hit

    def _live_subsets(self, alive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(indices, masks) of the device subsets whose members are all live; cached per live set."""
        key = alive.tobytes()
        hit = self._static_cache.get(key)
        if hit is None:
            subs = np.flatnonzero(~(self.subsets & ~alive[None, :]).any(axis=1))
            hit = self._static_cache[key] = (subs, self.subsets[subs])
        return hit

    def _base(self, env: PhaseEnv, alive: np.ndarray, key: tuple) -> dict:
        """What the compute part needs that does not depend on the pruned fraction: the corrected regression at this
        workload, the resident bytes per shard, the reserve and, for the speed-balanced TP options, every live subset's
        finishing times b_d + k·u_d (k = 1..all shards) sorted once. The search evaluates one workload at several
        pruned fractions (bisection over `prune_steps`), so they share this; `key`: everything it depends on (the
        option table's compute key without the pruned fraction)."""
        hit = self._base_cache.get(key)
        if hit is not None:
            return hit
        if len(self._base_cache) > 1024:
            self._base_cache.clear()
        tb, ty = self.table, self.types
        feats, _ = tb.features(env.n_tokens, env.kv_len)                    # (6, 3)
        _, kv_res = tb.features(0, env.kv_plan)                             # resident KV per type at kv_plan
        icpt, slope = self.latency.type_costs(env.phase, feats)             # (D, P, 6), (D, P, 6)
        k_dev = self.comp_scale[env.phase][:, None, None]                   # closed-loop correction (1: none)
        icpt, slope = icpt * k_dev, slope * k_dev
        st = self._static(0.0)
        S = st["S"]
        unit = (tb.params[ty][:, None] * BYTES_PER_WEIGHT[None, :] + kv_res[ty][:, None]) / S[:, None]  # (T, P) bytes
        u = slope[:, :, ty] / S[None, None, :]                              # (D, P, T) s per shard
        b = icpt[:, :, ty]                                                  # (D, P, T)
        bT, uT = np.transpose(b, (2, 1, 0)), np.transpose(u, (2, 1, 0))    # (T, P, D)
        # finishing times of the k-th shard on each device, k = 1..all shards (K0)
        fin = bT[..., None] + uT[..., None] * st["k"]                      # (T, P, D, K0)
        fin += st["tie"]                                                    # deterministic ties
        subs, members = self._live_subsets(alive)                           # (s,), (s, D)
        # When every device's finishing times strictly increase with k, the S smallest of a subset's times never
        # include a k > S (each is preceded by its device's k - 1 smaller ones), so one sort over k = 1..K0 serves every
        # kept-shard count S: the S-th smallest and the counts below it are those of the times cut at k <= S.
        shared = subs.size > 0 and bool((fin[..., 1:] > fin[..., :-1]).all())
        f_sorted = None
        if shared:
            ns, (T, P, D, K0) = len(subs), fin.shape
            f_sorted = np.where(members[:, None, None, :, None], fin[None], np.inf).reshape(ns, T, P, D * K0)
            f_sorted.sort(axis=-1)
        reserve = self._reserve(env, alive)
        free = np.where(alive, np.maximum(env.budgets - reserve, 0.0), 0.0)                 # (D,) bytes
        head_time = float(icpt[0, self.head_precision, HEAD] + slope[0, self.head_precision, HEAD])
        hit = self._base_cache[key] = dict(icpt=icpt, slope=slope, unit=unit, u=u, b=b, bT=bT, uT=uT, fin=fin,
                                           f_sorted=f_sorted, subs=subs, members=members, reserve=reserve,
                                           free=free, head_time=head_time)
        return hit

    def _build_compute(self, env: PhaseEnv, prune_frac: float, alive: np.ndarray, base_key: tuple):
        tb, D, T = self.table, self.D, self.T
        base = self._base(env, alive, base_key)
        unit, u, b, bT, uT = base["unit"], base["u"], base["b"], base["bT"], base["uT"]
        st = self._static(prune_frac)
        S, pruned, Sk = st["S"], st["pruned"], st["Sk"]
        Sub = len(self.subsets)
        O = D + Sub + 1                      # + TP over all live devices with shards ∝ free memory (fallback)
        comp = np.full((T, P, O), np.inf)
        mem = np.zeros((T, P, O, D))
        shards = np.zeros((T, P, O, D), dtype=np.int64)
        used_all = np.zeros((T, P, O, D), dtype=bool)
        # MP on each live device
        mp_time = bT + (Sk / S)[:, None, None] * uT * S[:, None, None]                     # (T,P,D)
        live = np.nonzero(alive)[0]
        comp[:, :, live] = mp_time[:, :, live]
        mem[:, :, live, live] = (Sk[:, None] * unit)[:, :, None]
        shards[:, :, live, live] = Sk[:, None, None]
        used_all[:, :, live, live] = True
        # TP over each subset of live devices: greedy = the Sk smallest finishing times b_d + k·u_d
        # (all subsets of live devices at once: the same per-subset arithmetic, batched along a leading axis)
        subs, members = base["subs"], base["members"]
        if subs.size:
            if base["f_sorted"] is not None:                                # one sort shared by every pruning
                fin, f = base["fin"], base["f_sorted"]
            else:                                                           # times cut at k <= Sk, sorted here
                k = st["k"]
                fin = bT[..., None] + uT[..., None] * k                                    # (T, P, D, K)
                fin += st["tie"]
                np.putmask(fin, np.broadcast_to(st["beyond"], fin.shape), np.inf)
                f = np.where(members[:, None, None, :, None], fin[None], np.inf).reshape(len(subs), T, P, -1)
                f.sort(axis=-1)
            thr = f[:, st["t_idx"], st["p_idx"], (Sk - 1)[:, None]]                          # (s, T, P)
            cnt = (fin[None] <= thr[..., None, None]) & members[:, None, None, :, None]
            kd = cnt.sum(axis=-1)                                                           # (s, T, P, D)
            used = kd > 0
            t_dev = np.where(used, bT[None] + kd * uT[None], 0.0)
            o = D + subs
            comp[:, :, o] = t_dev.max(axis=-1).transpose(1, 2, 0)                             # (T, P, s)
            mem[:, :, o, :] = (kd * unit[None, :, :, None]).transpose(1, 2, 0, 3)             # (T, P, s, D)
            shards[:, :, o, :] = kd.transpose(1, 2, 0, 3)
            used_all[:, :, o, :] = used.transpose(1, 2, 0, 3)
        # memory-proportional TP over all live devices: fills every device at the same rate, so memory left over by
        # the speed-balanced options is not stranded in fragments no whole layer fits into (fallback option)
        reserve, free = base["reserve"], base["free"]
        if alive.sum() >= 2 and free.sum() > 0:
            o = D + Sub
            kd = self._proportional(free, Sk)                                               # (T, D)
            used = kd > 0
            t_dev = np.where(used[:, None, :], bT + kd[:, None, :] * uT, 0.0)                # (T, P, D)
            comp[:, :, o] = t_dev.max(axis=2)
            mem[:, :, o, :] = kd[:, None, :] * unit[:, :, None]
            shards[:, :, o, :] = kd[:, None, :]
            used_all[:, :, o, :] = used[:, None, :]
        head_time = base["head_time"]
        w_unit = st["w_unit"]
        layer_bytes = np.maximum(Sk[:, None] * unit, 1.0)                                  # (T, P)
        run_len = np.minimum(np.maximum(free[None, None, :] / layer_bytes[:, :, None], 1.0), tb.n)   # (T, P, D) layers
        # per class c = (t, p, a): the compute side does not depend on the activation precision
        A = len(ACT_BYTES)
        comp_c = np.repeat(comp[:, :, None, :], A, axis=2).reshape(-1, O)
        mem_c = np.repeat(mem[:, :, None], A, axis=2).reshape(-1, O, D)
        shards_c = np.repeat(shards[:, :, None], A, axis=2).reshape(-1, O, D)
        return comp, used_all, b, u, unit, w_unit, pruned, reserve, head_time, run_len, comp_c, mem_c, shards_c

    def _proportional(self, free: np.ndarray, Sk: np.ndarray) -> np.ndarray:
        """(T, D) per type: shards per device ∝ free memory (largest remainder). Depends on memory only, not on the
        KV length or the links, so it is cached across the token-level re-plans."""
        key = (free.tobytes(), Sk.tobytes())
        hit = self._prop_cache.get(key)
        if hit is None:
            if len(self._prop_cache) > 1024:
                self._prop_cache.clear()
            hit = []
            for sk in Sk:
                share = sk * free / free.sum()
                kd = np.floor(share).astype(np.int64)
                for j in np.argsort(-(share - kd), kind="stable")[:int(sk - kd.sum())]:
                    kd[j] += 1
                hit.append(kd)
            hit = self._prop_cache[key] = np.array(hit).reshape(len(Sk), -1)
        return hit

    def _reserve(self, env: PhaseEnv, alive: np.ndarray) -> np.ndarray:
        """(D,) bytes reserved before layers: activation workspace on every live device (two buffers of the widest
        per-token activation, fp32; attention assumed fused as with llama.cpp's flash attention, so the
        n_tokens × context score matrix is not materialised), LM head and, for untied models, the token-embedding
        table on the main device (both at `head_precision`, as llama.cpp quantizes output.weight / token_embd), and the
        RMSNorm gains (fp32, d_model per sublayer) of every sublayer a device might run (an upper bound: tiny next to
        the weights, but a plan that fills a budget to the byte must count them)."""
        tb = self.table
        norms = tb.n * tb.act_width * 4.0                                    # bytes: fp32 gains of all sublayers
        reserve = np.where(alive, env.n_tokens * (tb.act_width + tb.ffn_width) * ACT_WORK_BYTES * 2 + norms, 0.0)
        reserve[0] += (tb.params[HEAD] + tb.embed_params) * BYTES_PER_WEIGHT[self.head_precision]
        return reserve
