"""Where a run's core time goes, from the kernel's scheduler events (docs/hil.md "Scheduler trace").

The simulator shares the cores among runnable threads (processor sharing): a runnable thread runs on any free core
at once. A real scheduler keeps one run queue per CPU, places a woken thread on one of them, and moves threads
between them only when it balances. On this host (a 2-vCPU KVM guest whose kernel packs wake-ups onto running vCPUs
and halts idle ones at once) that leaves a core idle while a thread of the run waits in the other core's queue.
This module measures that, so the part of a prediction error that is the OS scheduler's is a measured number:

    with SchedTrace() as tr:          # tracefs: sched_switch / sched_waking / sched_wakeup / sched_migrate_task
        res = run_plan(...)
    b = breakdown(parse(tr.text), monotonic_t0(res.info["t0_perf_counter"]), res.timeline.end_s,
                  res.info["thread_ids"], ncpu)

`breakdown` replays the events per CPU over the run's window [t0, t0 + TTFT] and splits every core-second into:
  running  - a thread of the run runs (per worker in `running_by_thread`);
  queued   - the core idles while a thread of the run is runnable in another core's queue (placement / balancing);
  waking   - the core idles while a thread of the run was woken onto it and has not started yet (the wake-up's
             latency: an inter-processor interrupt to a halted vCPU);
  no_work  - the core idles and no thread of the run is runnable (dependencies, I/O, locks);
  other    - another process or a kernel thread runs.
and summarizes the run's wake-ups (`wakes`): how many found the other core idle, and of those how many were put on
the waker's busy core anyway (`packed_share`). `queued_by_s` names who waited in the queued time and why: "npu0
woken" (placed on a busy core) or "cpu0 preempted by npu0" (switched out runnable: on this kernel mostly a thread
woken onto its waker's vCPU that preempts the waker at once, while the other vCPU idles).

Two facts of this kernel the replay handles: a switch from the idle task to a woken thread is sometimes not traced
(the next event in the thread's context is the first sign it runs: it is taken to have started at its wake-up, or
at that event if none was seen); and a thread woken while it still runs gets a `sched_waking` with no switch-in to
follow (ignored). Needs a writable tracefs (root): `available()` says why not otherwise. Tracing is global to the
machine: `SchedTrace` refuses when another tracer or scheduler events are already on, and restores every setting it
changed on exit (also after an exception).
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
EVENTS = ("sched/sched_switch", "sched/sched_waking", "sched/sched_wakeup", "sched/sched_migrate_task")
BUFFER_KB = 65536              # per CPU: ~1,000 wake-ups and switches per 100 ms of a run fit many times over
CATEGORIES = ("running", "queued", "waking", "no_work", "other")
OUR_COMMS = ("ef-",)           # native helper threads of the run (the GEMM pool's "ef-gemm")

_LINE = re.compile(r"^\s*(.+?)-(\d+)\s+\[(\d+)\]\s+\S+\s+([\d.]+): (sched_\w+): (.*)$")
_KV = re.compile(r"(\w+)=(\S+)")


@dataclass(frozen=True)
class Event:
    t: float          # s, trace clock (mono: CLOCK_MONOTONIC)
    cpu: int
    pid: int          # the thread in whose context the event was recorded (0: the idle task)
    comm: str
    name: str         # sched_switch | sched_waking | sched_wakeup | sched_migrate_task
    fields: dict


def tracefs_dir() -> Path | None:
    for d in TRACEFS:
        if (Path(d) / "trace").exists():
            return Path(d)
    return None


def available() -> str | None:
    """None when scheduler events can be traced here, else one line saying why not."""
    d = tracefs_dir()
    if d is None:
        return "no tracefs (mount it as root: mount -t tracefs nodev /sys/kernel/tracing)"
    if not all((d / "events" / e / "enable").exists() for e in EVENTS):
        return f"{d}: this kernel has no sched tracepoints"
    if not os.access(d / "tracing_on", os.W_OK):
        return f"{d}: not writable (run as root)"
    return None


class SchedTrace:
    """Context manager: traces the scheduler events of the whole machine while it is entered (`text` afterwards)."""

    def __init__(self, buffer_kb: int = BUFFER_KB) -> None:
        why = available()
        if why is not None:
            raise RuntimeError(f"scheduler trace: {why}")
        self.dir = tracefs_dir()
        self.buffer_kb = buffer_kb
        self.text = ""
        self.saved: dict[str, str] = {}

    def _rw(self, name: str, value: str | None = None) -> str:
        p = self.dir / name
        if value is None:
            return p.read_text().strip()
        p.write_text(value)
        return value

    def __enter__(self) -> "SchedTrace":
        if self._rw("current_tracer") != "nop" or any(self._rw(f"events/{e}/enable") != "0" for e in EVENTS):
            raise RuntimeError("scheduler trace: tracefs is in use (a tracer or sched events are on); not touched")
        clock = re.search(r"\[(\w+)\]", self._rw("trace_clock"))
        self.saved = {"trace_clock": clock.group(1) if clock else "local", "buffer_size_kb": self._rw("buffer_size_kb"),
                      "tracing_on": self._rw("tracing_on")}
        try:
            self._rw("tracing_on", "0")
            self._rw("trace_clock", "mono")
            self._rw("buffer_size_kb", str(self.buffer_kb))
            self._rw("trace", "")
            for e in EVENTS:
                self._rw(f"events/{e}/enable", "1")
            self._rw("tracing_on", "1")
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._rw("tracing_on", "0")
            self.text = self._rw("trace")
            lost = re.search(r"entries-in-buffer/entries-written: (\d+)/(\d+)", self.text)
            self.lost = int(lost.group(2)) - int(lost.group(1)) if lost else 0
        finally:
            self._restore()

    def _restore(self) -> None:
        for e in EVENTS:
            try:
                self._rw(f"events/{e}/enable", "0")
            except OSError:
                pass
        for k in ("trace_clock", "buffer_size_kb", "tracing_on"):
            if k in self.saved:
                try:
                    self._rw(k, self.saved[k])
                except OSError:
                    pass
        try:
            self._rw("trace", "")                   # the buffer's memory back
        except OSError:
            pass


def parse(text: str) -> list[Event]:
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out.append(Event(float(m.group(4)), int(m.group(3)), int(m.group(2)), m.group(1), m.group(5),
                             dict(_KV.findall(m.group(6)))))
    return out


def monotonic_t0(perf_t0: float) -> float:
    """A `time.perf_counter()` instant on CLOCK_MONOTONIC (the same clock on Linux; the offset is measured)."""
    return perf_t0 - (time.perf_counter() - time.clock_gettime(time.CLOCK_MONOTONIC))


def _pid(ev: Event, key: str) -> int:
    return int(ev.fields[key])


def _roles(events: list[Event], threads: dict[int, str]) -> dict[int, str]:
    """Kernel thread id -> role of the run's threads: `threads` plus its native helpers, recognised by name."""
    role = {int(k): v for k, v in threads.items()}
    for ev in events:
        for key, comm in (("pid", "comm"), ("next_pid", "next_comm"), ("prev_pid", "prev_comm")):
            if key in ev.fields and ev.fields.get(comm, "").startswith(OUR_COMMS):
                role.setdefault(int(ev.fields[key]), "gemm-helper")
        if ev.comm.startswith(OUR_COMMS) and ev.pid:
            role.setdefault(ev.pid, "gemm-helper")
    return role


class _Replay:
    """Per-CPU state replayed from the events over the window [a, b]: which thread runs on each CPU, which of the
    run's threads are runnable and in which CPU's queue, and the core-seconds of each category so far."""

    def __init__(self, role: dict[int, str], a: float, b: float, ncpu: int) -> None:
        self.role, self.a, self.b = role, a, b
        self.cur: dict[int, int | None] = {c: None for c in range(ncpu)}      # pid running on each CPU (None: idle)
        self.last: dict[int, float | None] = {c: None for c in range(ncpu)}
        self.queued: dict[int, int] = {}                                   # our runnable, not running pid -> its CPU
        self.why: dict[int, str] = {}                                      # ... -> why: woken / preempted by whom
        self.queued_by: dict[str, float] = {}                              # "<role> <why>" -> queued core-seconds
        self.woken_at: dict[int, float] = {}                               # our pid -> its sched_waking time
        self.wakeup_at: dict[int, float] = {}
        self.cat = dict.fromkeys(CATEGORIES, 0.0)
        self.by_role: dict[str, float] = {}
        self.wakes = {"n": 0, "other_idle": 0, "packed": 0}
        self.delays: list[float] = []
        self.pending: dict[int, tuple[int, bool]] = {}                    # pid -> (waker CPU, another CPU idle)

    def account(self, c: int, t: float) -> None:
        """Credit CPU `c`'s time since its last event, up to `t`, to its category."""
        if self.last[c] is not None:
            lo, hi = max(self.last[c], self.a), min(t, self.b)
            if hi > lo:
                p = self.cur[c]
                if p is None:
                    here = any(qc == c for qc in self.queued.values())
                    k = "waking" if here else ("queued" if self.queued else "no_work")
                    if k == "queued":                          # split among the threads queued elsewhere
                        q = [p for p, qc in self.queued.items() if qc != c]
                        for p in q:
                            key = f"{self.role[p]} {self.why.get(p, 'woken')}"
                            self.queued_by[key] = self.queued_by.get(key, 0.0) + (hi - lo) / len(q)
                elif p in self.role:
                    k = "running"
                    self.by_role[self.role[p]] = self.by_role.get(self.role[p], 0.0) + hi - lo
                else:
                    k = "other"
                self.cat[k] += hi - lo
        self.last[c] = t

    def account_all(self, t: float) -> None:
        for c in self.cur:
            self.account(c, t)

    def starts(self, p: int, t: float) -> None:
        """Thread `p` starts running at `t`: it leaves the queues; a woken one's wake-up delay is recorded."""
        if p in self.queued:
            del self.queued[p]
            if p in self.woken_at:
                if self.a <= t <= self.b:
                    self.delays.append(t - self.woken_at[p])
                del self.woken_at[p]

    def event(self, ev: Event) -> None:
        if ev.cpu not in self.cur:
            self.cur[ev.cpu], self.last[ev.cpu] = None, None
        if ev.pid and self.cur[ev.cpu] != ev.pid:          # a switch-in the trace did not show (module doc)
            t_in = min(max(self.wakeup_at.get(ev.pid, ev.t), self.last[ev.cpu] or ev.t), ev.t)
            self.account_all(t_in)
            self.starts(ev.pid, t_in)
            self.cur[ev.cpu] = ev.pid
        if ev.name == "sched_switch":
            self._switch(ev)
        elif ev.name == "sched_waking":
            self._waking(ev)
        elif ev.name in ("sched_wakeup", "sched_migrate_task"):
            self._placed(ev)

    def _switch(self, ev: Event) -> None:
        self.account_all(ev.t)
        prev, nxt = _pid(ev, "prev_pid"), _pid(ev, "next_pid")
        if prev in self.role:
            if ev.fields.get("prev_state", "").startswith("R"):
                self.queued[prev] = ev.cpu                  # preempted: runnable in this CPU's queue
                self.why[prev] = f"preempted by {self.role.get(nxt, 'another process') if nxt else 'idle'}"
            else:
                self.queued.pop(prev, None)
                self.woken_at.pop(prev, None)
        if nxt:
            self.starts(nxt, ev.t)
        self.cur[ev.cpu] = nxt or None

    def _waking(self, ev: Event) -> None:
        p = _pid(ev, "pid")
        if p in self.role and p not in self.cur.values():
            self.account_all(ev.t)
            self.queued[p] = int(ev.fields.get("target_cpu", ev.cpu))
            self.why[p] = "woken"
            self.woken_at[p] = ev.t
            if self.a <= ev.t <= self.b:
                other_idle = any(self.cur[c] is None for c in self.cur if c != ev.cpu)
                self.pending[p] = (ev.cpu, other_idle)

    def _placed(self, ev: Event) -> None:
        """sched_wakeup / sched_migrate_task: the CPU whose queue a woken thread joins (or moves to)."""
        p = _pid(ev, "pid")
        if ev.name == "sched_wakeup":
            self.wakeup_at[p] = ev.t
        if p in self.queued:
            self.account_all(ev.t)
            self.queued[p] = int(ev.fields.get("target_cpu", ev.fields.get("dest_cpu", self.queued[p])))
        if ev.name == "sched_wakeup" and p in self.pending:
            waker_cpu, other_idle = self.pending.pop(p)
            self.wakes["n"] += 1
            if other_idle:
                self.wakes["other_idle"] += 1
                self.wakes["packed"] += int(self.queued.get(p, -1) == waker_cpu)


def breakdown(events: list[Event], t0: float, duration: float, threads: dict[int, str], ncpu: int) -> dict:
    """Core-seconds of each category (module doc) over [t0, t0 + duration] on CLOCK_MONOTONIC, their percentages
    of `ncpu` x duration, running time per thread role, and the run's wake-ups. `threads`: kernel thread id -> role
    of the run's threads (native helpers are recognised by name)."""
    r = _Replay(_roles(events, threads), t0, t0 + duration, ncpu)
    for ev in events:
        r.event(ev)
    r.account_all(r.b)
    total = ncpu * duration
    delays = sorted(r.delays)
    out = {f"{k}_s": v for k, v in r.cat.items()} | {f"{k}_pct": 100.0 * v / total if total > 0 else 0.0
                                                      for k, v in r.cat.items()}
    out["running_by_thread_s"] = dict(sorted(r.by_role.items(), key=lambda kv: -kv[1]))
    out["queued_by_s"] = dict(sorted(r.queued_by.items(), key=lambda kv: -kv[1]))
    out["wakes"] = r.wakes["n"]
    out["wakes_other_core_idle"] = r.wakes["other_idle"]
    out["packed_share"] = r.wakes["packed"] / r.wakes["other_idle"] if r.wakes["other_idle"] else 0.0
    out["wake_delay_median_s"] = delays[len(delays) // 2] if delays else 0.0
    out["wake_delay_mean_s"] = sum(delays) / len(delays) if delays else 0.0
    return out
