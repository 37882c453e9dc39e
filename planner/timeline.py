"""Execution records of a cold-start `Plan`: the shape both executors write (EdgeFlow §4.3; docs/hil.md).

The simulator (`sim.executor`, simulated seconds) and the HIL runner (`hil.runner`, wall seconds from the start of the
cold start) both produce a `Timeline` of `Span`s, so metrics, traces and the predicted-vs-measured comparison are one
code path. `Timeline.source` says which: "modelled" or "measured".
"""
from __future__ import annotations

from dataclasses import dataclass, field

from planner.plan import Plan


@dataclass
class Span:
    task: int
    resource: str        # resource whose worker ran it ("cpu" for stolen NPU ops)
    worker: int
    start: float         # s from the start of the cold start
    end: float           # s
    unit: str            # cpu | npu | io | graph
    stolen: bool = False
    cpu_s: float = 0.0   # s of CPU work of the span. Simulated: the modelled core-seconds of its own work (a load's
    #                      read CPU side and copies, an op's time x threads, an unpack's kernel and first touch);
    #                      measured: the CPU time the span's thread used (time.thread_time)


@dataclass
class Timeline:
    plan: Plan
    spans: list[Span]
    end_s: float                      # s, end of the last task (the first token's logits)
    bytes_read: int                   # B read from flash / disk
    peak_mem_bytes: int               # B
    flash_samples: list[tuple[float, float]] = field(default_factory=list)   # (time s, aggregate B/s)
    mem_samples: list[tuple[float, int]] = field(default_factory=list)       # (time s, allocated B) at every change
    source: str = "modelled"          # modelled (simulator) | measured (HIL run)
    core_busy_s: float | None = None  # core-s of CPU work in [0, end_s], every thread (modelled: the cores' shared
    #                                   work; measured: the process's user + system CPU time over the run)
    waits: int | None = None          # times a thread blocked and was woken (modelled: idle workers woken +
    #                                   interpreter-lock hand-offs; measured: the process's voluntary context switches)
    waits_by_thread: dict[str, int] | None = None   # the same per plan worker ("cpu0", "load1", ...; measured: each
    #                                   worker thread's voluntary context switches, getrusage(RUSAGE_THREAD))
    packed_wakes: int | None = None   # wake-ups put on the waker's busy core while another core idled (modelled:
    #                                   HostRuntime.thread_wake_pack_*; measured: the scheduler trace's packed wake-ups)
