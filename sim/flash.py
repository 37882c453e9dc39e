"""Flash (UFS) read bandwidth as a simulator resource with processor sharing (EdgeFlow §3; docs/design.md §7).

Every active read has a rate cap that depends on its request size (`SocProfile.reader_rate`: per-request latency +
transfer at the per-reader streaming cap), and the device's aggregate bandwidth `flash_peak_gbps` is shared max-min
fairly (water filling, `sim.sharing.SharedRate`) among active reads. Byte counts are integers; the residual of a read
is a float only inside the sharing math.

While two or more sequential reads stream at once the aggregate is `flash_multi_gbps` where the profile has it
(several loaders taking one file's pieces in turn: on the host VM two of them read less together than one alone;
docs/hil.md "Host profile"). On a measured host a sequential read's requests also wait for a time slice while other
threads occupy every core (`request_busy_s`, `HostRuntime.flash_request_busy_s`; 0 on a phone).
"""
from __future__ import annotations

from planner.device import SocProfile
from sim.engine import Environment, Event
from sim.sharing import SharedRate


class Flash(SharedRate):
    """Flash bandwidth (B/s) shared by the active reads, each capped by its request size's single-reader rate."""

    def __init__(self, env: Environment, dev: SocProfile, cores: SharedRate | None = None,
                 request_busy_s: float = 0.0) -> None:
        super().__init__(env, dev.flash_peak_gbps * 1e9)
        self.dev = dev
        self.request_busy_s = request_busy_s            # s per sequential request while every core is taken
        self.bytes_read = 0                             # B, integer total
        self.cores = cores
        self._busy: dict[int, bool] = {}                # id(job) -> cores busy when its cap was last set
        if cores is not None and request_busy_s > 0:
            cores.listeners.append(self._cores_changed)

    def read(self, nbytes: int, request_bytes: int, random: bool = False, owner: object = None) -> Event:
        nbytes = int(nbytes)
        if nbytes <= 0:
            return self.use(0, 1.0)
        self.bytes_read += nbytes
        req = max(1, min(request_bytes, nbytes))
        self._req_random = (req, random)                   # read by _share while `use` adds the job
        return self.use(float(nbytes), self.dev.reader_rate(req, random), owner=owner)

    def _cores_busy(self, owner: object) -> bool:
        """Other threads than the reader `owner` occupy every core (its requests wait for a time slice)."""
        return self.cores is not None and self.cores.full_without(owner)

    def _cores_changed(self) -> None:
        """Re-split when a sequential read's cores-busy state flipped (its cap changes)."""
        if any(not j.random and self._cores_busy(j.owner) != self._busy.get(id(j)) for j in self.active):
            self.refresh()

    def _share(self) -> None:
        """Scattered reads queue behind sequential streams (their readahead): while any sequential read is active, a
        random read's per-request latency is `flash_random_read_busy_s`. A sequential read's requests wait for a core
        while other threads occupy all of them (`request_busy_s`). Re-evaluated whenever either set changes."""
        pending = getattr(self, "_req_random", None)
        if pending is not None:                            # the job `use` just appended
            self.active[-1].random, self.active[-1].request = pending[1], pending[0]
            self._req_random = None
        busy = any(not j.random for j in self.active)
        multi = self.dev.flash_multi_gbps
        if multi > 0:
            streams = sum(1 for j in self.active if not j.random)
            self.capacity = 1e9 * (min(multi, self.dev.flash_peak_gbps) if streams >= 2 else self.dev.flash_peak_gbps)
        for j in self.active:
            if j.random:
                j.cap = self.dev.reader_rate(j.request, True, busy)
            elif self.request_busy_s > 0:
                b = self._busy[id(j)] = self._cores_busy(j.owner)
                j.cap = self.dev.reader_rate(j.request, False, wait_s=self.request_busy_s if b else 0.0)
        super()._share()
