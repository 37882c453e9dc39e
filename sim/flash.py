"""Flash (UFS) read bandwidth as a SimPy resource with processor sharing (EdgeFlow §3, SPEC §3.5).

SimPy has no fair-share bandwidth primitive, so this module implements one: every active read has a rate cap that
depends on its request size (`SocProfile.reader_rate`: per-request latency + transfer at the per-reader streaming cap),
and the device's aggregate bandwidth `flash_peak_gbps` is shared max-min fairly (water filling) among active reads.
Whenever the set of readers changes, progress is advanced and the next completion is re-scheduled (a generation counter
discards stale wake-ups). Byte counts are integers; the residual of a read is a float only inside the sharing math.
"""
from __future__ import annotations

import simpy

from planner.device import SocProfile

_DONE_BYTES = 0.5   # B, a read with less than this left is complete (float residue of the sharing math)


class _Read:
    __slots__ = ("left", "cap", "rate", "event")

    def __init__(self, left: float, cap: float, event: simpy.Event) -> None:
        self.left, self.cap, self.rate, self.event = left, cap, 0.0, event


class Flash:
    def __init__(self, env: simpy.Environment, dev: SocProfile) -> None:
        self.env = env
        self.dev = dev
        self.peak = dev.flash_peak_gbps * 1e9          # B/s
        self.active: list[_Read] = []
        self.last = 0.0
        self.gen = 0
        self.bytes_read = 0                             # B, integer total
        self.samples: list[tuple[float, float]] = [(0.0, 0.0)]   # (time s, aggregate B/s) at every change

    def read(self, nbytes: int, request_bytes: int) -> simpy.Event:
        ev = self.env.event()
        nbytes = int(nbytes)
        if nbytes <= 0:
            ev.succeed()
            return ev
        self.bytes_read += nbytes
        self._advance()
        self.active.append(_Read(float(nbytes), self.dev.reader_rate(max(1, min(request_bytes, nbytes))), ev))
        self._reschedule()
        return ev

    # ---- processor sharing -------------------------------------------------------------------------------------
    def _advance(self) -> None:
        dt = self.env.now - self.last
        if dt > 0:
            for r in self.active:
                r.left -= r.rate * dt
        self.last = self.env.now

    def _share(self) -> None:
        """Max-min fair rates: readers capped below the fair share keep their cap, the rest split what is left."""
        left, n = self.peak, len(self.active)
        for r in sorted(self.active, key=lambda r: r.cap):
            fair = left / n
            r.rate = min(r.cap, fair)
            left -= r.rate
            n -= 1

    def _reschedule(self) -> None:
        self.gen += 1
        if not self.active:
            self.samples.append((self.env.now, 0.0))
            return
        self._share()
        self.samples.append((self.env.now, sum(r.rate for r in self.active)))
        dt = min(max(r.left, 0.0) / r.rate for r in self.active)
        gen = self.gen
        t = self.env.timeout(dt)
        t.callbacks.append(lambda _e: self._on_timer(gen))

    def _on_timer(self, gen: int) -> None:
        if gen != self.gen:
            return
        self._advance()
        done = [r for r in self.active if r.left < _DONE_BYTES]
        if not done:   # float rounding: finish the closest one
            done = [min(self.active, key=lambda r: r.left)]
        self.active = [r for r in self.active if r not in done]
        for r in done:
            r.event.succeed()
        self._reschedule()
