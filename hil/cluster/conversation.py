"""A conversation on the emulated cluster under an RSSI trace: the elastic controller drives real workers (Voltron
§4.3 "token by token"; docs/cluster.md "Live conversation").

The same `Policy` objects the simulator drives (`planner.voltron`) decide, before every prefill and decode step, the
plan for the links of that instant; the `Coordinator` runs it on the device workers for real. Meanwhile a link driver
thread plays the trace in wall-clock time: it re-shapes each link (`tc tbf` rate = the RSSI's goodput, one-way
latency added by the controller's RPC client) and takes a link down below the disconnect threshold (calls on it fail
with `LinkDown`), up again with hysteresis (`sim.wireless.LinkTracker` semantics, passed in as `links_at`).

Trace clock: trace time = `trace_start_s` + `trace_speed` × (wall time spent generating) + `think_s` per turn gap
(the user's think time is not waited for). A step that fails because its link went down mid-step is re-planned on
the links of that instant and run again (the device's KV is lost: the policy's declared `lost_kv()` — pruned by the
plan, or the coordinator re-prefills the context); the re-plan happens at the very step during which the link fell.
A device whose link comes back is used again (its worker kept running; it reloads its shards).

Closed loop (`planner.voltron.feedback`, docs/cluster.md "Closed loop on the cluster"): after every step the runner
reports what the workers measured to the policy (`Policy.observe`, the simulator's call): the step's wall time without
plan switches, each device's compute seconds (the workers' own time of their calls, `Span.compute_s`) and each link's
message seconds (the rest of the calls to that device: latency, transfer, RPC). The policy's corrections per device /
phase and per link and its planning margin after the step are logged in the step's row. A bridge the policy returns
(the running plan with communication scaling or pruning, while a re-planned placement would load) runs for that step
as in the simulator. The workers load plans in the foreground, so a placement the simulator would load in the
background (a non-urgent re-plan) loads in the user's think time instead, the loaded placement (or its bridge) running
until then; an urgent re-plan or a device change loads at once; a turn's decode placement is activated before its
first token is shown (its load counts in the TTFT).

Every row carries the planner's estimate of the step (`predicted_s`, modelled: the fitted latency regression + the
planner's comm model, for the plan that ran, re-costed for the links and KV length of that step — a plan kept by the
controller's hysteresis was searched under older links; its estimate at search time is `predicted_plan_s`), the
planner's estimate of the one-time cost of the switch it decided (`predicted_switch_s`: the KV rebuild of restored ATTN
shards, `planner.voltron.policy.restores_kv`; `kv_held` when it deferred a restore instead) and the wall time it took
(`measured_s`, measured, switch / reload / KV work included; `recompute` when the coordinator re-prefilled the
context before the step).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from hil.cluster.coordinator import Coordinator
from hil.cluster.transport import LinkDown
from planner.voltron.comm import LinkState
from planner.voltron.policy import Decision, Policy, PolicyContext
from planner.voltron.shard_map import assign_shards
from quant.bounds import finite, int_in

COMPUTE_CALLS = frozenset({"embed", "head", "run_sublayers", "attn", "ffn"})   # a step's own calls (not loads / KV)
MIN_RATE_BPS = 1e6         # bit/s: tbf floor for a link that is up (the RSSI table's MCS 0 goodput is above this)


@dataclass
class LiveConfig:
    trace_start_s: float = 150.0    # s of trace time at the first token
    trace_speed: float = 30.0       # trace seconds per wall second of generation (compresses a walk to a short run)
    think_s: float = 250.0          # s of trace time between turns (skipped, not waited)
    link_poll_s: float = 0.02       # s wall between link-driver updates
    max_retries: int = 3            # re-plans of one step after links fell during it

    def __post_init__(self) -> None:
        # quant.bounds: finite and in range (NaN fails every comparison there); the maxima bound a run, not the trace
        self.trace_start_s = finite(self.trace_start_s, "live.trace_start_s", 0.0, 1e6)
        self.trace_speed = finite(self.trace_speed, "live.trace_speed", 0.0, 1e4, lo_open=True)
        self.think_s = finite(self.think_s, "live.think_s", 0.0, 1e6)
        self.link_poll_s = finite(self.link_poll_s, "live.link_poll_s", 0.001, 1.0)
        self.max_retries = int_in(self.max_retries, "live.max_retries", 1, 100)


class TraceClock:
    """Trace time that advances with wall time while generating, and jumps by the think time between turns."""

    def __init__(self, start_s: float, speed: float):
        self.speed = speed
        self._base = start_s
        self._t0 = time.monotonic()
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._base + self.speed * (time.monotonic() - self._t0)

    def skip(self, seconds: float) -> None:
        with self._lock:
            self._base += seconds


class LinkDriver(threading.Thread):
    """Applies `links_at(trace time)` to the emulated network (`net.set_link`) and the RPC clients, every
    `poll_s`; records every change (trace time, wall time, link, goodput, latency, up)."""

    def __init__(self, links_at, clock: TraceClock, net, clients: list, poll_s: float):
        super().__init__(daemon=True, name="link-driver")
        self.links_at, self.clock, self.net, self.clients, self.poll_s = links_at, clock, net, clients, poll_s
        self.events: list[dict] = []
        self._halt = threading.Event()
        self._last: list[tuple | None] = [None] * len(clients)
        self._lock = threading.Lock()
        self.state: LinkState = self.apply()

    def apply(self) -> LinkState:
        with self._lock:
            t = self.clock.now()
            links = self.links_at(t)
            for k in range(1, len(self.clients)):
                up = bool(np.isfinite(links.latency[k]) and links.goodput[k] > 0)
                rate = float(max(links.goodput[k] * 8.0, MIN_RATE_BPS)) if up else None
                lat = float(links.latency[k]) if up else 0.0
                key = (up, None if rate is None else round(rate, -4), round(lat, 5))
                if key == self._last[k]:
                    continue
                if self.net is not None:
                    self.net.set_link(k, rate_bps=rate, latency_s=lat, up=up)
                else:
                    self.clients[k].set_latency(lat)
                    self.clients[k].set_link_down(not up)
                self._last[k] = key
                self.events.append({"trace_s": t, "wall_s": time.monotonic(), "device": k, "up": up,
                                    "rate_bps": rate, "latency_s": lat, "rssi_dbm": float(links.rssi_dbm[k])})
            self.state = links
            return links

    def run(self) -> None:
        while not self._halt.wait(self.poll_s):
            self.apply()

    def stop(self) -> None:
        self._halt.set()


class LiveCoordinator(Coordinator):
    """The coordinator of a multi-turn conversation: a turn's prompt extends the cached context; a device whose
    link came back is used again; each phase's plan reserves its own KV capacity (`caps`, set by the caller: what the
    planner reserved for that phase, at least what the turn needs), so a device holds what its plan was checked for."""

    caps: dict[str, int] | None = None
    switch_s: float = 0.0          # s measured in plan switches: loads, KV moves, history re-prefills
    dirty: bool = False            # a switch failed part-way: caches must be rebuilt

    def _activate(self, phase: str) -> None:
        t0 = time.monotonic()
        if self.caps:
            self.kv_capacity = max(self.caps[phase], len(self.history) + 1)
        hist = list(self.history)
        try:
            super()._activate(phase)
            if self.dirty and self.history:             # a previous switch failed part-way: rebuild every cache
                self.dirty = False
                self.history = []
                self.recomputes += 1
                self._reset_workers()
                self._forward(np.asarray(hist, dtype=np.int64), 0)
                self.history = hist
        except BaseException:
            # a switch that failed part-way (a link fell during a reload or a history re-prefill) keeps the context;
            # the next attempt loads the new map from scratch and re-prefills the history
            self.history, self.active, self.dirty = hist, None, True
            raise
        finally:
            self.switch_s += time.monotonic() - t0

    def extend(self, tokens) -> np.ndarray:
        """Run a turn's prompt (T,) after the cached context on the prefill plan; logits (V,) of its last token."""
        if not self.history:
            return self.prefill(tokens)
        tok = np.asarray(tokens, dtype=np.int64).ravel()
        if tok.size == 0:
            raise ValueError("tokens: empty prompt")
        self._activate("prefill")
        self._check_room(tok.size)
        out = self._forward(tok, len(self.history))
        self.history.extend(tok.tolist())
        return out

    def rejoin(self, d: int) -> None:
        """Device d is reachable again: it may hold shards of the next plan (reloaded: its state is unknown)."""
        self.lost.discard(int(d))
        self.loaded[int(d)] = None


@dataclass
class Turn:
    prompt: np.ndarray        # (n_in,) token ids
    n_out: int                # tokens to generate


class LiveConversation:
    """One conversation of `policy` on the workers `handles` (see the module docstring)."""

    def __init__(self, policy: Policy, ctx: PolicyContext, handles: list, clients: list, net, links_at,
                 turns: list[Turn], cfg: LiveConfig, call_s: np.ndarray | None = None):
        self.policy, self.ctx, self.handles, self.clients, self.net = policy, ctx, handles, clients, net
        self.links_at, self.turns, self.cfg = links_at, turns, cfg
        self.call_s = None if call_s is None else np.asarray(call_s, dtype=float)   # (D,) measured RPC round trip
        self.budgets = ctx.cluster.budgets()
        self.rows: list[dict] = []
        self.replans: list[dict] = []
        self.tokens: list[list[int]] = []
        self.coord: Coordinator | None = None
        self.lost: set[int] = set()
        self.prefill_plan = None
        self.pending = None             # a decode plan whose load waits for the user's think time (`_background`)
        self.oom = False

    def planner_view(self, links: LinkState) -> LinkState:
        """The links as the planner costs them: each remote device's one-way latency plus half its measured RPC
        round trip (`call_s`: request handling on the quota-limited worker, which the latency regression does not
        time), so an MP segment on a device (in + out) and a TP call (2 · max latency) each pay one round trip. The
        link driver applies the links themselves (tc rate, injected latency) unchanged."""
        if self.call_s is None:
            return links
        extra = np.concatenate([[0.0], self.call_s[1:] / 2])
        lat = np.where(links.connected, links.latency + extra, links.latency)
        return LinkState(rssi_dbm=links.rssi_dbm, goodput=links.goodput, latency=lat, shared=links.shared)

    # ---- plans -------------------------------------------------------------------------------------------------------
    def _maps(self, prefill, decode) -> tuple[dict, dict]:
        tb = self.ctx.table
        return {"prefill": prefill, "decode": decode}, {"prefill": assign_shards(prefill, tb),
                                                          "decode": assign_shards(decode, tb)}

    @staticmethod
    def _caps(prefill, decode, need: int) -> dict[str, int]:
        return {"prefill": max(int(prefill.kv_plan), int(need)), "decode": max(int(decode.kv_plan), int(need))}

    def _adopt(self, prefill, decode, links: LinkState, need: int) -> None:
        """Adopt plans: KV capacity = what the planner reserved (`kv_plan`), at least the `need`ed tokens."""
        plans, maps = self._maps(prefill, decode)
        caps = self._caps(prefill, decode, need)
        cap = max(caps.values())
        down = {k for k in range(1, len(self.handles)) if not bool(links.connected[k])}
        newly_lost, back = down - self.lost, self.lost - down
        if self.coord is None:
            self.coord = LiveCoordinator(plans, maps, self.handles, kv_capacity=cap,
                                         head_precision=self.ctx.cfg.head_precision)
            self.coord.caps = caps
            if down:
                self.coord.replan(plans, maps, lost=tuple(sorted(down)))
        else:
            self.coord.caps = caps
            for d in back:
                self.coord.rejoin(d)
            self.coord.replan(plans, maps, lost=tuple(sorted(newly_lost)))
        self.lost = down

    def measured_parts(self) -> tuple[np.ndarray, np.ndarray]:
        """(D,) compute seconds per device and (D,) message seconds per link (0 for the main device) of the last step
        the coordinator ran (its calls' spans; a history re-prefill before it is a step of its own)."""
        D = len(self.handles)
        busy, link = np.zeros(D), np.zeros(D)
        for sp in reversed(self.coord.spans):
            if sp.step != self.coord.step_no:
                break
            if sp.method in COMPUTE_CALLS:
                busy[sp.device] += sp.compute_s
                link[sp.device] += max(sp.dur_s - sp.compute_s, 0.0)
        link[0] = 0.0
        return busy, link

    def corrections(self) -> dict:
        """The closed loop's state after the last observation (what the next plan uses): factor per device and phase
        on the latency model, per link on the communication model, margin per phase as a share of QoS, TPOT target.
        Empty for a policy without a closed loop."""
        fb = getattr(self.policy, "fb", None)
        if fb is None:
            return {}
        out = {}
        for p, name in enumerate(("prefill", "decode")):
            for k, f in enumerate(fb.comp_scale(p)):
                out[f"corr_{name}_d{k}"] = float(f)
        for k, f in enumerate(fb.comm_scale(1)[1:], start=1):
            out[f"corr_link{k}"] = float(f)
        for p, name in enumerate(("prefill", "decode")):
            out[f"margin_{name}"] = float(1.0 - np.exp(-fb.margin_log(p)))
        out["target_tpot_s"] = float(fb.target(1, self.ctx.cfg.qos_tpot_s))
        return out

    def _row(self, turn, tok, phase, d: Decision, plan, measured, trace_s, links, retries, switch_s,
             n_tokens: int, step_s: float, recomputes: int) -> None:
        prec = np.bincount(plan.precision, minlength=3)
        kv_after = len(self.coord.history)
        now = self.policy.estimate(plan, n_tokens, kv_after - n_tokens, links)     # this step's links and KV
        busy, link = self.measured_parts()
        # the simulator's call: measured step (no switch stalls), per-device compute, per-link messages
        self.policy.observe(plan, n_tokens, kv_after - n_tokens, links, step_s, busy, link)
        r = {"turn": turn, "token": tok, "phase": phase, "trace_s": trace_s, "kv_len": kv_after,
             "predicted_s": float(now.est_time_s), "predicted_comm_s": float(now.est_comm_s),
             "predicted_plan_s": float(plan.est_time_s), "predicted_switch_s": float(d.switch_est_s),
             "kv_held": bool(d.kv_held), "load_deferred": self.pending is not None,
             "measured_s": measured, "switch_s": switch_s, "measured_step_s": measured - switch_s,
             "observed_step_s": step_s, "replanned": bool(d.replanned), "bridge": plan is d.bridge,
             "retries": retries, "recompute": self.coord.recomputes > recomputes,
             "recomputes": self.coord.recomputes,
             "n_fp16": int(prec[0]), "n_int8": int(prec[1]), "n_int4": int(prec[2]), "n_tp": plan.n_tp,
             "pruned_shards": int(plan.pruned.sum()), "connected": int(links.connected.sum()),
             "accuracy_proxy": float(self.policy.accuracy(plan))}
        for k in range(1, len(links.rssi_dbm)):
            r[f"rssi_{k}"] = float(links.rssi_dbm[k])
        for k in range(len(busy)):
            r[f"busy_s_d{k}"] = float(busy[k])
        for k in range(1, len(link)):
            r[f"link_s_{k}"] = float(link[k])
        r.update(self.corrections())
        self.rows.append(r)

    # ---- steps -------------------------------------------------------------------------------------------------------
    def _step(self, run, decide, phase: str, turn: int, tok: int, driver: LinkDriver, need: int, n_tokens: int):
        """Decide (maybe re-plan), run; on a link that fell during the step, decide again and re-run."""
        retries = 0
        t_first, sw_first = time.monotonic(), (self.coord.switch_s if self.coord is not None else 0.0)
        rc_first = self.coord.recomputes if self.coord is not None else 0
        while True:
            links = self.planner_view(driver.apply())
            trace_s = self.clock.now()
            d, prefill, decode = decide(links)
            if d.oom:
                self.oom = True
                return None
            down = {k for k in range(1, len(self.handles)) if not bool(links.connected[k])}
            kept = phase == "decode" and self._background(d, down)
            if kept:                  # the loaded placement (or the policy's bridge of it) runs while the new loads
                decode = d.bridge if d.bridge is not None else self.coord.plans["decode"]
            fresh = self.coord is None or prefill is not self.coord.plans["prefill"] or \
                decode is not self.coord.plans["decode"]
            if fresh or self.lost != down:          # (a re-plan to the plans the coordinator holds loads nothing)
                self._adopt(prefill, decode, links, need)
                self.replans.append({"turn": turn, "token": tok, "phase": phase, "trace_s": trace_s,
                                     "wall_s": time.monotonic(),
                                     "connected": int(links.connected.sum()), "retry": retries,
                                     "bridge": d.bridge is not None and decode is d.bridge,
                                     "summary": d.plan.summary()})
            else:
                self.coord.caps = self._caps(prefill, decode, need)
            t_run, sw_run = time.monotonic(), self.coord.switch_s
            try:
                out = run()
            except LinkDown:
                retries += 1
                if retries > self.cfg.max_retries:
                    raise
                continue
            t1 = time.monotonic()
            ran = decode if phase == "decode" else prefill
            # measured from the first attempt: re-planning and re-running after a link fell are part of the step;
            # the closed loop observes the attempt that ran, without its plan switch
            self._row(turn, tok, phase, d, ran, t1 - t_first, trace_s, links, retries,
                      self.coord.switch_s - sw_first, n_tokens, (t1 - t_run) - (self.coord.switch_s - sw_run),
                      rc_first)
            self.rows[-1].update(t_start=t_first, t_end=t1)
            return out

    def _decode_ready(self) -> None:
        """The turn's decode placement is activated before its first token is shown: the simulator loads it in the
        background during the prefill, the workers cannot, so its load (and any KV move or rebuild) counts in the
        TTFT (10 s target) rather than in the first token's TPOT; added to the prefill row as switch time."""
        t0, rc = time.monotonic(), self.coord.recomputes
        try:
            self.coord._activate("decode")
        except LinkDown:                # the coordinator rebuilds its caches at the next step (`dirty`)
            pass
        dt, r = time.monotonic() - t0, self.rows[-1]
        r["measured_s"] += dt
        r["switch_s"] += dt
        r["t_end"] += dt
        r["recompute"] = bool(r["recompute"] or self.coord.recomputes > rc)
        r["recomputes"] = self.coord.recomputes

    def _background(self, d: Decision, down: set[int]) -> bool:
        """A non-urgent decode re-plan loads in the background in the simulator (the running plan keeps running,
        paper §4.3 "Overhead Mitigation"); the workers load in the foreground, so the cluster defers the load to
        the user's think time (`_idle_switch`) and keeps running the loaded placement — or the bridge the policy
        makes of it — as the simulator does while a load is pending. True while such a load is pending."""
        if self.coord is None or self.lost != down or self.coord.active is not self.coord.maps["decode"] \
                or d.plan is self.coord.plans["decode"]:
            self.pending = None
            return False
        if d.replanned:
            self.pending = None if d.urgent else d.plan
        return self.pending is not None and d.plan is self.pending

    def _idle_switch(self, turn: int, kv: int, driver: LinkDriver) -> None:
        """The user's think time (`think_s`, not waited for): the policy's switch for the wait (`Policy.end_turn`)
        runs now — its loads and KV rebuild outside the turns' TTFT and TPOT; logged in `replans.json` (phase
        `idle`, measured `switch_s`, the planner's `predicted_switch_s`)."""
        links = self.planner_view(driver.apply())
        d = self.policy.end_turn(links, self.budgets, kv, self.cfg.think_s)
        pending, self.pending = self.pending, None
        if d is None or d.oom:
            if pending is None:
                return
            d = Decision(plan=pending, replanned=True)          # the deferred load, in the wait
        t0, rc = time.monotonic(), self.coord.recomputes
        self._adopt(self.prefill_plan, d.plan, links, kv + 1)
        try:
            self.coord._activate("decode")
        except LinkDown:                # the coordinator rebuilds its caches at the next step (`dirty`)
            pass
        self.replans.append({"turn": turn, "token": -1, "phase": "idle", "trace_s": self.clock.now(),
                             "wall_s": time.monotonic(), "connected": int(links.connected.sum()), "retry": 0,
                             "bridge": False, "summary": d.plan.summary(), "switch_s": time.monotonic() - t0,
                             "predicted_switch_s": float(d.switch_est_s), "recompute": self.coord.recomputes > rc})

    def warm_up(self, driver: LinkDriver) -> float:
        """Load the first turn's plan (links at the trace start) before the conversation starts: the model is resident
        when the user starts talking, as in the paper's set-up. Returns the measured load seconds (reported apart)."""
        links = self.planner_view(driver.apply())
        first = self.turns[0]
        d = self.policy.start_turn(links, self.budgets, int(first.prompt.size), 0)
        if d.oom:
            return 0.0
        t0 = time.monotonic()
        self.prefill_plan = d.plan
        self._adopt(d.plan, d.next_plan if d.next_plan is not None else d.plan, links, int(first.prompt.size))
        self.coord._activate("prefill")
        return time.monotonic() - t0

    def run(self) -> dict:
        self.clock = TraceClock(self.cfg.trace_start_s, self.cfg.trace_speed)
        driver = LinkDriver(self.links_at, self.clock, self.net, self.clients, self.cfg.link_poll_s)
        self.warm_up_s = self.warm_up(driver)
        self.clock = driver.clock = TraceClock(self.cfg.trace_start_s, self.cfg.trace_speed)   # starts now
        driver.start()
        try:
            kv = 0
            for ti, turn in enumerate(self.turns):
                if ti:
                    self.clock.skip(self.cfg.think_s)
                n_in = int(turn.prompt.size)

                def decide_prefill(links, n_in=n_in, kv=kv):
                    d = self.policy.start_turn(links, self.budgets, n_in, kv)
                    if not d.oom:
                        self.prefill_plan = d.plan
                    return d, d.plan, d.next_plan if d.next_plan is not None else d.plan

                logits = self._step(lambda t=turn: self.coord.extend(t.prompt), decide_prefill, "prefill", ti, 0,
                                    driver, kv + n_in, n_in)
                if logits is None:
                    break
                self._decode_ready()
                kv += n_in
                out = [int(np.argmax(logits))]
                for k in range(1, turn.n_out):
                    def decide_decode(links, kv=kv):
                        d = self.policy.step(links, self.budgets, kv)
                        return d, self.prefill_plan, d.bridge if d.bridge is not None else d.plan

                    logits = self._step(lambda t=out[-1]: self.coord.decode(t), decide_decode, "decode", ti, k,
                                        driver, kv + 1, 1)
                    if logits is None:
                        break
                    kv += 1
                    out.append(int(np.argmax(logits)))
                self.tokens.append(out)
                kv = len(self.coord.history)            # the turn's last token is answered, not fed back
                if self.oom:
                    break
                self._idle_switch(ti, kv, driver)
        finally:
            driver.stop()
            driver.join(timeout=2)
        self.link_events = driver.events
        return {"rows": self.rows, "replans": self.replans, "tokens": self.tokens, "links": driver.events,
                "oom": self.oom, "warm_up_s": self.warm_up_s}
