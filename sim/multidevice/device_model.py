"""The simulator's own device and link model: the "real" cluster the Voltron planner's plans run on (Voltron §5).

Independent ground truth: nothing here calls the planner's cost
functions (the roofline `planner.voltron.devices.device_time` its `LatencyModel` is fitted on, `LinkState.tp_comm`,
`HybridPlanner.boundary_comm`). It shares with the planner only facts: the model's shapes and op counts
(`LayerTable.features`), the storage formats (bytes per weight / activation element), each device's spec-sheet
figures (`conf/device/*.yaml`: NEON peak = cores × clock × ops/cycle, sustained clock, LPDDR peak, and the device
file's documented efficiency factors) and the RSSI → goodput / latency table (IEEE 802.11ac sensitivity, `rssi.py`).
The planner predicts with its fitted regression; the difference is reported as its prediction error
(`pred_err_*` in metrics.json).

Device (per sublayer share f on device d, weight precision p, n new tokens, DVFS fraction φ):
    c = f·GEMM ops / (peak_p · sustained · compute_eff · φ · u(n))
      + f·attention-score ops / (peak_fp16 · sustained · compute_eff · attn_eff · φ · u(n))     u(n) = n / (n + n_half)
    m = f·(weight bytes + KV bytes) / (LPDDR peak · mem_eff)
    t = (max(c, m) + (1 − overlap)·min(c, m) + overhead / φ) · jitter_d       jitter_d ~ logN(0, σ) per device and step
The planner's roofline differs by construction: it has no separate attention-score rate (`attn_eff`) and assumes
compute and memory traffic overlap perfectly (`overlap` = 1).

Links (star around the main device, one shared channel): every message costs bytes / goodput(RSSI) + latency(RSSI) ·
ε + `msg_overhead_ms` (send + receive software path), ε ~ logN(0, `msg_jitter`) per message. A TP sublayer is an
event schedule: the main device sends the activation to each remote member in turn (airtimes serialised on the
channel), each member computes its shards once its message has arrived, the partial results come back in order of
completion, again serialised on the channel; the sublayer ends with the last arrival (or the main device's own
shards). An MP boundary moves the activation remote → main → remote (relayed by the group owner).

Parameters with no source (`TruthAssumptions`) are listed with their reason and a sensitivity table in
docs/multidevice.md ("Assumptions and sensitivity").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.voltron.comm import LinkState
from planner.voltron.devices import ACT_BYTES, BYTES_PER_WEIGHT, Cluster
from planner.voltron.layers import ATTN_GQA, ATTN_MHA, ATTN_SWA, HEAD, LayerTable
from planner.voltron.plan import PhasePlan


@dataclass(frozen=True)
class TruthAssumptions:
    """Ground-truth parameters without a published source (conservative defaults; see docs/multidevice.md)."""
    attn_eff: float = 0.5            # attention-score ops (QK^T, softmax, ·V) run at this × the GEMM efficiency
                                     # (memory-strided, not a dense GEMM); planner: 1 (no separate term)
    overlap: float = 0.8             # share of the shorter of compute / memory time hidden under the longer
                                     # (planner roofline: 1 = perfect overlap)
    msg_overhead_ms: float = 0.5     # ms per message: socket send + receive, (de)serialisation, thread wake-up
    msg_jitter: float = 0.3          # σ of the log-normal factor on each message's link latency (contention, retries)

    def __post_init__(self) -> None:
        if not 0 < self.attn_eff <= 1:
            raise ValueError(f"truth.attn_eff must be in (0, 1] (got {self.attn_eff})")
        if not 0 <= self.overlap <= 1:
            raise ValueError(f"truth.overlap must be in [0, 1] (got {self.overlap})")
        if self.msg_overhead_ms < 0 or self.msg_jitter < 0:
            raise ValueError("truth.msg_overhead_ms and truth.msg_jitter must be >= 0")


class GroundTruth:
    """Executes one step of a plan on the simulated cluster: (seconds, of which communication, joules)."""

    def __init__(self, cluster: Cluster, table: LayerTable, head_precision: int = 1,
                 assumptions: TruthAssumptions | None = None):
        self.cluster, self.table, self.head_precision = cluster, table, head_precision
        self.a = assumptions or TruthAssumptions()
        devs = cluster.devices
        # (D, P) ops/s at φ = 1: spec-sheet NEON peak × sustained clock × the device file's GEMM efficiency
        peak = np.array([[d.peak_gflops_fp16, d.peak_gops_int8, d.peak_gops_int8 * d.int4_vs_int8] for d in devs])
        self.ops_s = peak * np.array([d.sustained_clock * d.compute_eff for d in devs])[:, None] * 1e9
        self.score_ops_s = self.ops_s[:, 0] * self.a.attn_eff                      # (D,) attention-score ops/s
        self.mem_bps = np.array([d.mem_bw_peak_gbps * d.mem_eff * 1e9 for d in devs])   # (D,) bytes/s
        self.overhead_s = np.array([d.overhead_ms * 1e-3 for d in devs])           # (D,) s per sublayer
        self.n_half = np.array([d.n_half for d in devs])                           # (D,) tokens
        attn = np.zeros(len(table.params), dtype=bool)
        attn[[ATTN_MHA, ATTN_GQA, ATTN_SWA]] = True
        self._attn_type = attn                                                     # (T,)

    # ---- devices ------------------------------------------------------------------------------------------------
    def _time(self, d: int, prec, n: float, gemm_ops, score_ops, nbytes, freq: float):
        """Seconds on device d (arrays broadcast together)."""
        u = n / (n + self.n_half[d]) if self.n_half[d] > 0 else 1.0
        u = max(u, 1e-3) * freq
        c = gemm_ops / (self.ops_s[d, prec] * u) + score_ops / (self.score_ops_s[d] * u)
        m = nbytes / self.mem_bps[d]
        hi, lo = np.maximum(c, m), np.minimum(c, m)
        return hi + (1 - self.a.overlap) * lo + self.overhead_s[d] / freq

    def device_times(self, plan: PhasePlan, n_tokens: int, kv_len: int, freq: np.ndarray,
                     j_dev: np.ndarray) -> np.ndarray:
        """(N, D) seconds each device spends on its shards of each sublayer (0 where it holds none)."""
        tb = self.table
        feats, _ = tb.features(n_tokens, kv_len)                                  # (T, 3) ops, weights, KV bytes
        n = float(n_tokens)
        ty = tb.type_of
        score = np.where(self._attn_type, np.maximum(feats[:, 0] - 2 * n * tb.params, 0.0), 0.0)   # (T,)
        gemm = feats[:, 0] - score                                                # (T,)
        S = tb.shards[ty].astype(float)                                           # (N,)
        t_dev = np.zeros((tb.n, self.cluster.n))
        for d in range(self.cluster.n):
            k = plan.shards[:, d]
            if not k.any():
                continue
            f = k / S
            nbytes = f * (feats[ty, 1] * BYTES_PER_WEIGHT[plan.precision] + feats[ty, 2])
            t = self._time(d, plan.precision, n, f * gemm[ty], f * score[ty], nbytes, float(freq[d])) * j_dev[d]
            t_dev[:, d] = np.where(k > 0, t, 0.0)
        return t_dev

    def head_time(self, n_tokens: int, kv_len: int, freq0: float) -> float:
        feats, _ = self.table.features(n_tokens, kv_len)
        p = self.head_precision
        return float(self._time(0, p, 1.0, feats[HEAD, 0], 0.0, feats[HEAD, 1] * BYTES_PER_WEIGHT[p], freq0))

    def sublayer_time(self, d: int, prec: int, ltype: int, n_tokens: int, kv_len: int, frac: float) -> float:
        """Seconds of a fraction `frac` of one sublayer of type `ltype` run alone on device d (a profiling run)."""
        feats, _ = self.table.features(n_tokens, kv_len)
        n = float(n_tokens)
        score = max(feats[ltype, 0] - 2 * n * self.table.params[ltype], 0.0) if self._attn_type[ltype] else 0.0
        gemm = feats[ltype, 0] - score
        nbytes = feats[ltype, 1] * BYTES_PER_WEIGHT[prec] + feats[ltype, 2]
        return float(self._time(d, prec, n, frac * gemm, frac * score, frac * nbytes, 1.0))

    def timer(self, d: int, prec: int, ltype: int, n_tokens: int, kv_len: int, frac: float, x=None) -> float:
        """Profiling timer for `planner.voltron.latency.sample_profiles`: the planner profiles this cluster's devices
        one sublayer at a time, as Voltron profiles its devices (§4.2.1), and fits its regression on the runs."""
        return self.sublayer_time(d, prec, ltype, n_tokens, kv_len, frac)

    # ---- links ----------------------------------------------------------------------------------------------------
    def _msg(self, links: LinkState, nbytes, dev, eps):
        """Seconds of one message of `nbytes` between device `dev` and the main device (arrays broadcast)."""
        gp = links.goodput[dev]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = nbytes / gp + links.latency[dev] * eps + self.a.msg_overhead_ms * 1e-3
        return np.where(gp > 0, t, np.inf)

    def tp_layers(self, links: LinkState, nbytes: np.ndarray, used: np.ndarray, t_dev: np.ndarray,
                  eps_b: np.ndarray, eps_a: np.ndarray) -> np.ndarray:
        """(J,) seconds of TP sublayers (event schedule of the module docstring). nbytes (J,), used / t_dev /
        eps_b / eps_a (J, D): members, compute seconds, latency factors of the broadcast / aggregate messages."""
        J, D = used.shape
        gp = links.goodput
        with np.errstate(divide="ignore", invalid="ignore"):
            air = np.where(used, nbytes[:, None] / gp[None, :], 0.0)                # (J, D) s (inf: link down)
        air[:, 0] = 0.0
        ovh = self.a.msg_overhead_ms * 1e-3
        lat = links.latency[None, :]
        finish = np.full((J, D), -np.inf)
        finish[:, 0] = np.where(used[:, 0], t_dev[:, 0], 0.0)
        chan = np.zeros(J)                                       # channel busy until (broadcast: device order)
        for d in range(1, D):
            m = used[:, d]
            chan = np.where(m, chan + air[:, d], chan)
            finish[:, d] = np.where(m, chan + lat[:, d] * eps_b[:, d] + ovh + t_dev[:, d], -np.inf)
        end = finish[:, 0].copy()
        rem = np.where(used[:, 1:], finish[:, 1:], np.inf)       # (J, D-1) replies leave in order of completion
        order = np.argsort(rem, axis=1, kind="stable")
        rows = np.arange(J)
        for k in range(D - 1):
            d = order[:, k] + 1
            ok = used[rows, d]
            start = np.maximum(chan, finish[rows, d])
            chan = np.where(ok, start + air[rows, d], chan)
            arrive = chan + lat[0, d] * eps_a[rows, d] + ovh
            end = np.where(ok, np.maximum(end, arrive), end)
        return end

    # ---- one step -------------------------------------------------------------------------------------------------
    def step(self, plan: PhasePlan, n_tokens: int, kv_len: int, links: LinkState, rng: np.random.Generator,
             jitter: float) -> tuple[float, float, float]:
        """(seconds for one step, of which communication, joules) of `plan`; `jitter` = 0 draws nothing."""
        total, comm, energy, _, _ = self.step_detail(plan, n_tokens, kv_len, links, rng, jitter)
        return total, comm, energy

    def step_detail(self, plan: PhasePlan, n_tokens: int, kv_len: int, links: LinkState, rng: np.random.Generator,
                    jitter: float, slow: np.ndarray | None = None
                    ) -> tuple[float, float, float, np.ndarray, np.ndarray]:
        """As `step`, plus the (D,) compute seconds of every device (what each device can time of its own shards;
        the main device's include the LM head) and the (D,) seconds of the messages each device's link carried (from
        send to arrival, summed; 0 for the main device), which a device can time from its messages' timestamps.
        `slow` (D,): each device's compute speed as a fraction of nominal for this step (a squeeze of the scenario:
        background load, thermal throttling; None = 1)."""
        tb, D, N = self.table, self.cluster.n, self.table.n
        if jitter > 0:
            j_dev = np.exp(rng.normal(0.0, jitter, D))
            eps = np.exp(rng.normal(0.0, self.a.msg_jitter, (3, N + 1, D))) if self.a.msg_jitter > 0 \
                else np.ones((3, N + 1, D))
        else:
            j_dev, eps = np.ones(D), np.ones((3, N + 1, D))
        freq = plan.freq if plan.freq.size == D else np.ones(D)
        if slow is not None:
            j_dev = j_dev / np.asarray(slow, dtype=float)
        t_dev = self.device_times(plan, n_tokens, kv_len, freq, j_dev)             # (N, D)
        used = plan.shards > 0
        tp = used.sum(axis=1) > 1
        act = n_tokens * tb.act_width * ACT_BYTES[plan.act_precision]             # (N,) bytes per activation
        layer = t_dev.max(axis=1)                                                 # (N,) MP: its device's time
        tp_exposed = 0.0                                                             # exposed TP communication
        link_s = np.zeros(D)                                                         # message seconds per link
        if tp.any():
            with np.errstate(divide="ignore", invalid="ignore"):
                air = np.where(used[tp], act[tp][:, None] / links.goodput[None, :], 0.0)
            lat = links.latency[None, :] * (eps[0, :N][tp] + eps[1, :N][tp])
            per = np.where(used[tp], 2 * air + np.where(used[tp], lat, 0.0) + 2 * self.a.msg_overhead_ms * 1e-3, 0.0)
            link_s[1:] += per[:, 1:].sum(axis=0)
            tp_t = self.tp_layers(links, act[tp], used[tp], t_dev[tp], eps[0, :N][tp], eps[1, :N][tp])
            tp_exposed = float((tp_t - layer[tp]).sum())
            layer[tp] = tp_t
        # MP boundaries: the activation moves where consecutive sublayers live on different devices (TP sublayers
        # and the embedding / LM head live on the main device); remote → remote is relayed by the main device
        home = np.where(tp, 0, np.where(used.any(axis=1), used.argmax(axis=1), 0))
        prev = np.concatenate([[0], home])                                        # (N+1,) sender of boundary i
        nxt = np.concatenate([home, [0]])                                         # receiver of boundary i
        moved = np.flatnonzero(prev != nxt)
        boundary = 0.0
        if moved.size:
            src_layer = np.maximum(moved - 1, 0)                                  # the sending sublayer's activation
            nb = act[src_layer]
            e = eps[2, moved]
            out = np.where(prev[moved] != 0, self._msg(links, nb, prev[moved], e[np.arange(moved.size), prev[moved]]),
                           0.0)
            inn = np.where(nxt[moved] != 0, self._msg(links, nb, nxt[moved], e[np.arange(moved.size), nxt[moved]]),
                           0.0)
            boundary = float((out + inn).sum())
            np.add.at(link_s, prev[moved], out)
            np.add.at(link_s, nxt[moved], inn)
            link_s[0] = 0.0
        head = self.head_time(n_tokens, kv_len, float(freq[0])) * j_dev[0]
        total = float(layer.sum()) + boundary + head
        comm = tp_exposed + boundary
        busy = t_dev.sum(axis=0)
        busy[0] += head
        energy = 0.0
        for d, dev in enumerate(self.cluster.devices):
            if d == 0 or used[:, d].any():
                energy += float(dev.power_w(freq[d])) * min(busy[d], total) + dev.p_idle_w * max(total - busy[d], 0.0)
        return total, comm, energy, busy, link_s


def profiler(cluster: Cluster, assumptions: TruthAssumptions | None = None, head_precision: int = 1):
    """`build_context(..., profiler=…)`: table → timer profiling the simulated devices of `cluster`."""
    return lambda table: GroundTruth(cluster, table, head_precision, assumptions).timer
