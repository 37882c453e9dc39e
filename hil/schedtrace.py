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
the waker's busy core anyway (`packed_share`).

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


def breakdown(events: list[Event], t0: float, duration: float, threads: dict[int, str], ncpu: int) -> dict:
    """Core-seconds of each category (module doc) over [t0, t0 + duration] on CLOCK_MONOTONIC, their percentages
    of `ncpu` x duration, running time per thread role, and the run's wake-ups. `threads`: kernel thread id -> role
    of the run's threads (native helpers are recognised by name)."""
    role = {int(k): v for k, v in threads.items()}
    for ev in events:
        for key, comm in (("pid", "comm"), ("next_pid", "next_comm"), ("prev_pid", "prev_comm")):
            if key in ev.fields and ev.fields.get(comm, "").startswith(OUR_COMMS):
                role.setdefault(int(ev.fields[key]), "gemm-helper")
        if ev.comm.startswith(OUR_COMMS) and ev.pid:
            role.setdefault(ev.pid, "gemm-helper")
    a, b = t0, t0 + duration
    cur: dict[int, int | None] = {c: None for c in range(ncpu)}      # pid running on each CPU (None: idle)
    last: dict[int, float | None] = {c: None for c in range(ncpu)}
    queued: dict[int, int] = {}                                       # our runnable, not running pid -> its CPU
    woken_at: dict[int, float] = {}                                    # our pid -> its sched_waking time
    wakeup_at: dict[int, float] = {}
    cat = dict.fromkeys(CATEGORIES, 0.0)
    by_role: dict[str, float] = {}
    wakes = {"n": 0, "other_idle": 0, "packed": 0, "delays": []}
    pending: dict[int, tuple[int, bool]] = {}                          # pid -> (waker CPU, another CPU idle)

    def account(c: int, t: float) -> None:
        if last[c] is not None:
            lo, hi = max(last[c], a), min(t, b)
            if hi > lo:
                p = cur[c]
                if p is None:
                    here = any(qc == c for qc in queued.values())
                    k = "waking" if here else ("queued" if queued else "no_work")
                elif p in role:
                    k = "running"
                    by_role[role[p]] = by_role.get(role[p], 0.0) + hi - lo
                else:
                    k = "other"
                cat[k] += hi - lo
        last[c] = t

    def account_all(t: float) -> None:
        for c in cur:
            account(c, t)

    def starts(p: int, t: float) -> None:
        if p in queued:
            del queued[p]
            if p in woken_at:
                if a <= t <= b:
                    wakes["delays"].append(t - woken_at[p])
                del woken_at[p]

    for ev in events:
        if ev.cpu not in cur:
            cur[ev.cpu], last[ev.cpu] = None, None
        if ev.pid and cur[ev.cpu] != ev.pid:          # a switch-in the trace did not show (module doc)
            t_in = min(max(wakeup_at.get(ev.pid, ev.t), last[ev.cpu] or ev.t), ev.t)
            account_all(t_in)
            starts(ev.pid, t_in)
            cur[ev.cpu] = ev.pid
        if ev.name == "sched_switch":
            account_all(ev.t)
            prev, nxt = _pid(ev, "prev_pid"), _pid(ev, "next_pid")
            if prev in role:
                if ev.fields.get("prev_state", "").startswith("R"):
                    queued[prev] = ev.cpu                  # preempted: runnable in this CPU's queue
                else:
                    queued.pop(prev, None)
                    woken_at.pop(prev, None)
            if nxt:
                starts(nxt, ev.t)
            cur[ev.cpu] = nxt or None
        elif ev.name == "sched_waking":
            p = _pid(ev, "pid")
            if p in role and p not in cur.values():
                account_all(ev.t)
                queued[p] = int(ev.fields.get("target_cpu", ev.cpu))
                woken_at[p] = ev.t
                if a <= ev.t <= b:
                    other_idle = any(cur[c] is None for c in cur if c != ev.cpu)
                    pending[p] = (ev.cpu, other_idle)
        elif ev.name in ("sched_wakeup", "sched_migrate_task"):
            p = _pid(ev, "pid")
            if ev.name == "sched_wakeup":
                wakeup_at[p] = ev.t
            if p in queued:
                account_all(ev.t)
                queued[p] = int(ev.fields.get("target_cpu", ev.fields.get("dest_cpu", queued[p])))
            if ev.name == "sched_wakeup" and p in pending:
                waker_cpu, other_idle = pending.pop(p)
                wakes["n"] += 1
                if other_idle:
                    wakes["other_idle"] += 1
                    wakes["packed"] += int(queued.get(p, -1) == waker_cpu)
    account_all(b)
    total = ncpu * duration
    delays = sorted(wakes.pop("delays"))
    out = {f"{k}_s": v for k, v in cat.items()} | {f"{k}_pct": 100.0 * v / total if total > 0 else 0.0
                                                    for k, v in cat.items()}
    out["running_by_thread_s"] = dict(sorted(by_role.items(), key=lambda kv: -kv[1]))
    out["wakes"] = wakes["n"]
    out["wakes_other_core_idle"] = wakes["other_idle"]
    out["packed_share"] = wakes["packed"] / wakes["other_idle"] if wakes["other_idle"] else 0.0
    out["wake_delay_median_s"] = delays[len(delays) // 2] if delays else 0.0
    out["wake_delay_mean_s"] = sum(delays) / len(delays) if delays else 0.0
    return out
