"""The main device's driver of a Voltron plan over per-device executors (paper §4.2.1 hybrid MP/TP, §4.3 re-planning
token by token; docs/cluster.md "Executable Voltron plans").

Owns `Coordinator`: given the phase plans (prefill / decode `PhasePlan`s), their `ShardMap`s and one `WorkerHandle` per
device (in tests the `ShardWorker`s themselves, in a cluster the RPC proxies of hil/cluster), it runs greedy generation:
- a step walks the sublayers in order: a run of consecutive sublayers whose shards all sit on one device (MP) is one
  `run_sublayers` call on that device; a TP sublayer sends the residual h to each holder (`attn` / `ffn`, concurrently
  when `parallel`) and adds the float64 partials in device order, then float32(h) + float32(sum) (`shard_ops.residual`;
  the reference reproduces this up to float64 re-association); sublayers whose shards are all pruned are skipped;
- embeddings and the LM head run on device 0 (`embed`, `head`);
- every call is recorded as a `Span` (device, method, sublayer range, bytes sent / received, wall time and the part of
  it the device computed), the material of a Chrome trace and of the closed loop's measured steps;
- switching plans between steps (prefill → decode, or `replan`) loads the new assignment only on the devices whose
  assignment changed (a worker keeps shards it already holds at the same precision), moves the KV cache of ATTN shards
  that change device (export → import, exact), drops it for newly pruned shards, and re-prefills the cached history on
  the new plan when an ATTN shard becomes active without a cache (it was pruned, or its device left: `lost`) — the
  simplest correct choice (`shard_map.kv_switch`).
Activations travel as float32 (h) and float64 (partials) whatever `act_precision` says: activation quantization on the
wire (§4.3.2) is not emulated.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np

from hil.cluster.shard_ops import residual
from planner.voltron.plan import TP, PhasePlan
from planner.voltron.shard_map import ShardMap, kv_switch, placement_strategy

PHASES = ("prefill", "decode")


def greedy(runner, prompt_tokens, n_new: int, on_step=None) -> list[int]:
    """Greedy generation with any runner that has `prefill(tokens) -> logits` and `decode(token) -> logits` (the
    coordinator and the single-process reference): `n_new` tokens; `on_step(i, runner)` runs before decode step i."""
    logits = runner.prefill(prompt_tokens)
    out: list[int] = []
    for i in range(int(n_new)):
        out.append(int(np.argmax(logits)))
        if i == n_new - 1:
            break
        if on_step is not None:
            on_step(i, runner)
        logits = runner.decode(out[-1])
    return out


class WorkerHandle(Protocol):
    """What the coordinator calls on a device (`hil.cluster.shard_exec.ShardWorker` has exactly these methods)."""

    def load(self, assignment: str) -> dict: ...
    def memory(self) -> dict: ...
    def attn(self, layer: int, h: np.ndarray, pos0: int) -> np.ndarray: ...
    def ffn(self, layer: int, h: np.ndarray) -> np.ndarray: ...
    def run_sublayers(self, j0: int, j1: int, h: np.ndarray, pos0: int) -> np.ndarray: ...
    def run_layers(self, l0: int, l1: int, h: np.ndarray, pos0: int) -> np.ndarray: ...
    def embed(self, tokens: np.ndarray) -> np.ndarray: ...
    def head(self, h: np.ndarray) -> np.ndarray: ...
    def export_kv(self, layer: int, shard: int, n: int) -> np.ndarray: ...
    def import_kv(self, layer: int, shard: int, kv: np.ndarray) -> None: ...
    def drop_kv(self, layer: int, shard: int) -> None: ...
    def reset(self) -> None: ...


@dataclass
class Span:
    """One call on one device (measured wall time on the coordinator's clock)."""
    step: int                 # step counter (a prefill, a decode token or a history re-prefill)
    phase: str                # active phase map
    device: int
    method: str               # run_sublayers | attn | ffn | embed | head | load | export_kv | import_kv | reset
    j0: int                   # first sublayer (-1: none)
    j1: int                   # one past the last sublayer
    bytes_sent: int           # array bytes of the arguments
    bytes_recv: int           # array bytes of the result
    t0_s: float               # s since the coordinator was created (`Coordinator._t0` on the monotonic clock)
    dur_s: float              # s wall time of the call
    compute_s: float = 0.0    # s of it the device computed (the worker's own time of the method; an in-process
                              # handle: all of it); the rest is the message to and from the device

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Segment:
    kind: str                 # "mp" | "tp"
    devices: tuple[int, ...]  # MP: the one device; TP: holders in device order
    j0: int
    j1: int


def segments(m: ShardMap) -> list[Segment]:
    """Execution order of a map: maximal runs of consecutive MP sublayers on one device, single TP sublayers; fully
    pruned sublayers are skipped (identity)."""
    out: list[Segment] = []
    for s in m.sublayers:
        holders = tuple(s.holders())
        if not holders:
            continue
        st = placement_strategy(s)
        if st == TP:
            out.append(Segment("tp", holders, s.sublayer, s.sublayer + 1))
        elif out and out[-1].kind == "mp" and out[-1].devices == holders and out[-1].j1 == s.sublayer:
            out[-1] = Segment("mp", holders, out[-1].j0, s.sublayer + 1)
        else:
            out.append(Segment("mp", holders, s.sublayer, s.sublayer + 1))
    return out


def _nbytes(x) -> int:
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, str):
        return len(x.encode())
    return 0


def check_plans(plans: dict[str, PhasePlan], maps: dict[str, ShardMap]) -> tuple[dict, dict]:
    """Both phases present (a missing one uses the other's plan), maps match plans and devices."""
    if not plans or not set(plans) <= set(PHASES):
        raise ValueError(f"plans: keys must be among {PHASES} (got {sorted(plans)})")
    if set(maps) != set(plans):
        raise ValueError(f"maps: phases {sorted(maps)} != plans {sorted(plans)}")
    for ph in plans:
        if maps[ph].devices != list(plans[ph].devices) or len(maps[ph].sublayers) != len(plans[ph].strategy):
            raise ValueError(f"maps[{ph!r}]: devices / sublayers do not match plans[{ph!r}]")
    devs = {tuple(m.devices) for m in maps.values()}
    if len(devs) != 1:
        raise ValueError("plans: the phases name different device lists")
    other = {p: q for p, q in zip(PHASES, PHASES[::-1])}
    full_p = {ph: plans.get(ph, plans.get(other[ph])) for ph in PHASES}
    full_m = {ph: maps.get(ph, maps.get(other[ph])) for ph in PHASES}
    return full_p, full_m


class Coordinator:
    """Greedy generation over per-device executors (see the module docstring)."""

    def __init__(self, plans: dict[str, PhasePlan], maps: dict[str, ShardMap], handles: list, *,
                 kv_capacity: int | None = None, head_precision: int = 1, parallel: bool = True):
        self.plans, self.maps = check_plans(plans, maps)
        self.handles = list(handles)
        D = self.maps["decode"].n_devices
        if len(self.handles) != D:
            raise ValueError(f"handles: {len(self.handles)} given, the plans have {D} devices")
        self.kv_capacity = int(kv_capacity or max(p.kv_plan for p in self.plans.values()))
        if self.kv_capacity < 1:
            raise ValueError("kv_capacity: must be >= 1 (plans carry kv_plan = 0: pass kv_capacity)")
        self.head_precision = int(head_precision)
        self.pool = ThreadPoolExecutor(max_workers=D) if parallel and D > 1 else None
        self.spans: list[Span] = []
        self.loaded: list[str | None] = [None] * D       # assignment JSON each device holds
        self.active: ShardMap | None = None
        self.phase = ""
        self.lost: set[int] = set()
        self.history: list[int] = []                      # tokens whose KV is cached (positions 0..n-1)
        self.step_no = 0
        self.recomputes = 0                               # history re-prefills caused by plan switches
        self._t0 = time.monotonic()                       # s, the spans' time base (monotonic clock, as transport)
        self._segs: list[Segment] = []                   # execution order of the active map

    # ---- calls -------------------------------------------------------------------------------------------------------
    def _call(self, d: int, method: str, *args, j0: int = -1, j1: int = -1):
        if d in self.lost:
            raise RuntimeError(f"device {d} left the cluster; the active plan still uses it")
        h = self.handles[d]
        t = time.monotonic()
        out = getattr(h, method)(*args)
        dur = time.monotonic() - t
        timer = getattr(h, "last_compute_s", None)       # a remote worker times its own part of the call
        comp = float(timer()) if timer is not None else dur
        self.spans.append(Span(self.step_no, self.phase, d, method, j0, j1, sum(_nbytes(a) for a in args),
                               _nbytes(out), t - self._t0, dur, comp if np.isfinite(comp) else dur))
        return out

    # ---- plan switches -----------------------------------------------------------------------------------------------
    def _activate(self, phase: str) -> None:
        new = self.maps[phase]
        if self.active is new:
            self.phase = phase
            return
        sw = kv_switch(self.active, new, len(self.history), tuple(sorted(self.lost)))
        n = len(self.history)
        saved = [] if sw.recompute else [(b, g, dst, self._call(src, "export_kv", b, g, n, j0=2 * b, j1=2 * b + 1))
                                         for b, g, src, dst in sw.moves]
        self.phase = phase
        todo = []
        for d in range(new.n_devices):
            doc = new.assignment(d, self.kv_capacity, self.head_precision)
            if d in self.lost:
                if new.device_items(d):
                    raise ValueError(f"plan {phase}: device {d} left but still holds shards")
                continue
            if doc != self.loaded[d]:
                todo.append((d, doc))
        if self.pool is not None and len(todo) > 1:                            # devices load concurrently
            futs = [self.pool.submit(self._call, d, "load", doc) for d, doc in todo]
        else:
            futs = [None] * len(todo)
        errors = []
        for (d, doc), f in zip(todo, futs):
            try:
                f.result() if f is not None else self._call(d, "load", doc)
                self.loaded[d] = doc
            except Exception as e:          # noqa: BLE001 - re-raised below, after every device's outcome is known
                self.loaded[d] = None       # state unknown: reload next time
                errors.append(e)
        if errors:                          # devices now hold a mix of plans: the context is gone, prefill again
            self.active, self.history = None, []
            raise errors[0]
        for b, g, dst, kv in saved:
            self._call(dst, "import_kv", b, g, kv, j0=2 * b, j1=2 * b + 1)
        self.active = new
        self._segs = segments(new)
        if sw.recompute:
            hist, self.history = self.history, []
            self.recomputes += 1
            self._reset_workers()
            self._forward(np.asarray(hist, dtype=np.int64), 0)
            self.history = hist

    def replan(self, plans: dict[str, PhasePlan], maps: dict[str, ShardMap], lost: tuple[int, ...] = ()) -> None:
        """Adopt new phase plans between steps (`lost`: devices that left, their KV is gone). The switch itself happens
        at the next step (`_activate`)."""
        self.plans, self.maps = check_plans(plans, maps)
        self.lost |= {int(d) for d in lost}
        for d in lost:
            self.loaded[int(d)] = None

    # ---- steps -------------------------------------------------------------------------------------------------------
    def _reset_workers(self) -> None:
        for d in range(len(self.handles)):
            if d not in self.lost and self.loaded[d] is not None:
                self._call(d, "reset")

    def _forward(self, tokens: np.ndarray, pos0: int) -> np.ndarray:
        """One step over `tokens` at positions pos0.. on the active map; returns the last token's logits (V,)."""
        self.step_no += 1
        h = self._call(0, "embed", tokens)                                   # (T, d) float32
        for seg in self._segs:
            if seg.kind == "mp":
                h = self._call(seg.devices[0], "run_sublayers", seg.j0, seg.j1, h, pos0, j0=seg.j0, j1=seg.j1)
                continue
            j = seg.j0
            if j % 2 == 0:
                args = [("attn", j // 2, h, pos0)] * len(seg.devices)
            else:
                args = [("ffn", j // 2, h)] * len(seg.devices)
            if self.pool is not None:
                futs = [self.pool.submit(self._call, d, a[0], *a[1:], j0=j, j1=j + 1)
                        for d, a in zip(seg.devices, args)]
                parts = [f.result() for f in futs]                            # device order, whatever finishes first
            else:
                parts = [self._call(d, a[0], *a[1:], j0=j, j1=j + 1) for d, a in zip(seg.devices, args)]
            total = np.array(parts[0], dtype=np.float64)                      # (T, d)
            for p in parts[1:]:
                total += p
            h = residual(h, total)
        return np.asarray(self._call(0, "head", np.ascontiguousarray(h[-1:])), dtype=np.float32)

    def prefill(self, tokens) -> np.ndarray:
        """New conversation: run `tokens` (T,) on the prefill plan; logits (V,) of the last one."""
        tok = np.asarray(tokens, dtype=np.int64).ravel()
        if tok.size == 0:
            raise ValueError("tokens: empty prompt")
        self.history = []
        self._activate("prefill")
        self._reset_workers()
        self._check_room(tok.size)
        out = self._forward(tok, 0)
        self.history = tok.tolist()
        return out

    def decode(self, token: int) -> np.ndarray:
        """One decode step on the decode plan (after `prefill`): logits (V,)."""
        if not self.history:
            raise ValueError("decode: no context (call prefill first)")
        self._activate("decode")
        self._check_room(1)
        out = self._forward(np.array([int(token)], dtype=np.int64), len(self.history))
        self.history.append(int(token))
        return out

    def generate(self, prompt_tokens, n_new: int, on_step=None) -> list[int]:
        """Greedy: `n_new` tokens after the prompt. `on_step(i, coordinator)` runs before decode step i (re-plans)."""
        return greedy(self, prompt_tokens, n_new, on_step)

    def _check_room(self, n: int) -> None:
        if len(self.history) + n > self.kv_capacity:
            raise ValueError(f"kv_capacity: {len(self.history)} cached + {n} new tokens exceed {self.kv_capacity}")

    def memory(self) -> list[dict]:
        return [self.handles[d].memory() for d in range(len(self.handles)) if d not in self.lost]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
