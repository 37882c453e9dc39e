"""Closed-loop QoS of the elastic controller (Voltron §4.3: "continuously monitors the execution environment"): the
controller compares every step it runs with its own estimate of that step and keeps its plans on target.

It keeps, per phase (prefill, decode):
- an online correction of the latency model: a factor per device on that device's estimated compute (observed busy
  seconds / the fitted regression's seconds for the shards it ran) and a factor per link on its messages (observed
  seconds of the messages the link carried / the communication model's seconds for them: software overhead, latency
  jitter, interference the RSSI table does not show; one per link, shared by both phases), each an exponentially
  weighted mean of the log ratio (weight `ewma` per observation; a jump beyond `jump_z` standard deviations restarts
  it), clipped to [1/`max_factor`, `max_factor`];
- the residual error of the corrected estimate, log(observed step / corrected estimate), over the last `window`
  steps, and from it a planning margin for a stated percentile: the step is planned to QoS / exp(q), where q is the
  `percentile` quantile of the residuals estimated robustly as median + z_p · 1.4826 · MAD (the normal quantile of a
  spread measured with the median absolute deviation, which a few outliers cannot move; the raw empirical quantile of
  a 64-step window is not defined at p99). Until `min_samples` residuals exist, the prior `prior_margin` is the
  margin (with the loop off, `planner.qos_margin` always is).

The margin is never below 0 (q ≥ 0): a pessimistic model is corrected by the factors, not by planning above the QoS.
Corrections and margin are quantized to `quantum` (log units) so that the controller re-plans when they move, not on
every token's noise.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np


@dataclass
class FeedbackConfig:
    """planner.feedback (Voltron only; the static baselines plan open loop)."""
    enabled: bool = True               # closed loop on; off = plan to (1 - qos_margin) × QoS from the fitted model
    percentile: float = 0.99           # QoS is planned to hold at this percentile of the observed step-time error
    window: int = 64                   # steps: residuals kept per phase for the margin (≈ 25 s of decode)
    min_samples: int = 8               # residuals needed before the observed spread replaces the prior margin
    prior_margin: float = 0.15         # margin (share of QoS) before that: the open-loop planner's decode estimates
                                       # were up to 14 % optimistic against the simulated cluster (docs/multidevice.md)
    ewma: float = 0.2                  # weight of one observation in the correction factors (≈ 5-step memory)
    max_factor: float = 100.0          # corrections clipped to [1/max_factor, max_factor]: a broken measurement (a
                                       # zero, a clock jump) cannot drive one to 0 or ∞, while a link at a few % of
                                       # its RSSI goodput (interference) is still followed
    quantum: float = 0.01              # log units (≈ 1 %): corrections / margin changes below this do not re-plan
    jump_z: float = 4.0                # an observation this many (exponentially weighted) standard deviations away
                                       # from a correction is a step change (a device squeezed, a link degraded), not
                                       # noise: the correction jumps to it instead of averaging it in
    jump_min: float = 0.05             # log units: floor of that threshold (a near-noiseless history must not turn
                                       # every 1 % wobble into a jump)

    def __post_init__(self) -> None:
        if not 0.5 <= self.percentile < 1:
            raise ValueError(f"planner.feedback.percentile must be in [0.5, 1) (got {self.percentile})")
        if self.window < 4 or not 2 <= self.min_samples <= self.window:
            raise ValueError("planner.feedback.window >= 4 and 2 <= planner.feedback.min_samples <= window required")
        if not 0 < self.ewma <= 1:
            raise ValueError(f"planner.feedback.ewma must be in (0, 1] (got {self.ewma})")
        if self.max_factor <= 1:
            raise ValueError(f"planner.feedback.max_factor must be > 1 (got {self.max_factor})")
        if not 0 <= self.prior_margin < 1:
            raise ValueError(f"planner.feedback.prior_margin must be in [0, 1) (got {self.prior_margin})")
        if self.jump_z <= 0 or self.jump_min < 0:
            raise ValueError("planner.feedback.jump_z > 0 and planner.feedback.jump_min >= 0 required")
        if not 0 < self.quantum < 1:
            raise ValueError(f"planner.feedback.quantum must be in (0, 1) (got {self.quantum})")


@dataclass
class Observation:
    """One executed step as the cluster measured it, and the planner's uncorrected estimate of the same step."""
    phase: int                         # 0 prefill, 1 decode
    step_s: float                      # measured step time (without reload / KV-recompute stalls)
    busy_s: np.ndarray                 # (D,) measured compute seconds per device (0: device ran nothing)
    link_s: np.ndarray                 # (D,) measured seconds of the messages each link carried (0: none; main 0)
    est_busy_s: np.ndarray             # (D,) the regression's seconds for the same shards (uncorrected)
    est_link_s: np.ndarray             # (D,) the communication model's seconds for the same messages (uncorrected)
    est_corr_s: float                  # the corrected estimate of the step (corrections before this observation)


@dataclass
class _Phase:
    log_comp: np.ndarray               # (D,) log correction per device
    log_comm: np.ndarray = None        # (D,) log correction per link (index 0 unused)
    n_comp: np.ndarray = None          # (D,) observations per device so far
    var_comp: np.ndarray = None        # (D,) exponentially weighted variance of the log ratios
    n_comm: np.ndarray = None
    var_comm: np.ndarray = None
    resid: list = field(default_factory=list)

    def __post_init__(self) -> None:
        D = self.log_comp.size
        self.n_comp, self.n_comm = np.zeros(D, dtype=np.int64), np.zeros(D, dtype=np.int64)
        self.var_comp, self.log_comm, self.var_comm = np.zeros(D), np.zeros(D), np.zeros(D)


class QosFeedback:
    def __init__(self, cfg: FeedbackConfig, n_devices: int, open_loop_margin: float):
        """`open_loop_margin`: `planner.qos_margin`, the margin when the loop is off."""
        self.cfg = cfg
        self.prior = -np.log1p(-(cfg.prior_margin if cfg.enabled else open_loop_margin))   # log factor
        self.z = NormalDist().inv_cdf(cfg.percentile)
        self.ph = [_Phase(np.zeros(n_devices)), _Phase(np.zeros(n_devices))]
        # a link's correction is the link's, not the phase's: both phases update and use one (a prefill is observed
        # once a turn; a link that degraded during the decode of the last turn has degraded for the next prefill)
        p0, p1 = self.ph
        p0.log_comm, p0.var_comm, p0.n_comm = p1.log_comm, p1.var_comm, p1.n_comm
        self.violations = 0

    # ---- learning ----------------------------------------------------------------------------------------------------
    def observe(self, ob: Observation) -> None:
        if not self.cfg.enabled:
            return
        ph, lim = self.ph[ob.phase], np.log(self.cfg.max_factor)
        if ob.est_corr_s > 0 and ob.step_s > 0:
            ph.resid.append(float(np.log(ob.step_s / ob.est_corr_s)))
            del ph.resid[:-self.cfg.window]
        for obs, est, mean, var, n in ((ob.busy_s, ob.est_busy_s, ph.log_comp, ph.var_comp, ph.n_comp),
                                       (ob.link_s, ob.est_link_s, ph.log_comm, ph.var_comm, ph.n_comm)):
            ok = (obs > 0) & (est > 0) & np.isfinite(obs) & np.isfinite(est)
            if ok.any():
                n[ok] += 1
                m, v = self._update(mean[ok], var[ok], n[ok], np.log(obs[ok] / est[ok]))
                mean[ok], var[ok] = np.clip(m, -lim, lim), v

    def _update(self, mean: np.ndarray, var: np.ndarray, n: np.ndarray, r: np.ndarray):
        """One observation r of log ratios into exponentially weighted mean / variance. Weight max(ewma, 1/n) for the
        n-th observation (a running mean until the EWMA's horizon, so the first observations correct the prior model
        at once); a deviation beyond max(jump_z·sd, jump_min) after the first few observations is a step change and
        restarts the mean at r."""
        a = self.cfg.ewma
        w = np.maximum(a, 1.0 / n)
        dev = r - mean
        jump = (n > 3) & (np.abs(dev) > np.maximum(self.cfg.jump_z * np.sqrt(var), self.cfg.jump_min))
        w = np.where(jump, 1.0, w)
        new_mean = mean + w * dev
        new_var = np.where(jump, var, (1 - w) * (var + w * dev * dev))
        return new_mean, new_var

    # ---- what the planner uses ---------------------------------------------------------------------------------------
    def comp_scale(self, phase: int) -> np.ndarray:
        """(D,) factor on each device's estimated compute."""
        return np.exp(self._q(self.ph[phase].log_comp)) if self.cfg.enabled else np.ones_like(self.ph[0].log_comp)

    def comm_scale(self, phase: int) -> np.ndarray:
        """(D,) factor on the messages of each link (index 0, the main device, has none)."""
        return np.exp(self._q(self.ph[phase].log_comm)) if self.cfg.enabled else np.ones_like(self.ph[0].log_comm)

    def margin_log(self, phase: int) -> float:
        """log of the factor the corrected estimate must stay below QoS by (≥ 0)."""
        r = self.ph[phase].resid
        if not self.cfg.enabled or len(r) < self.cfg.min_samples:
            return self.prior
        a = np.asarray(r)
        med = float(np.median(a))
        mad = float(np.median(np.abs(a - med)))
        return float(self._q(max(med + self.z * 1.4826 * mad, 0.0)))

    def target(self, phase: int, qos_s: float) -> float:
        """Time the planner plans a step of `phase` to: QoS over the margin of the stated percentile."""
        return qos_s * float(np.exp(-self.margin_log(phase)))

    def key(self) -> tuple:
        """Hashable state of the quantized corrections and margins (a change re-plans)."""
        out = []
        for p in (0, 1):
            out += [tuple(self._i(self.ph[p].log_comp).tolist()), tuple(self._i(self.ph[p].log_comm).tolist()),
                    int(self._i(self.margin_log(p)))]
        return tuple(out)

    def _i(self, x):
        return np.rint(np.asarray(x) / self.cfg.quantum).astype(np.int64)

    def _q(self, x):
        return self._i(x) * self.cfg.quantum
