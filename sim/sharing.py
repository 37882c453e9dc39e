"""Processor sharing: a capacity shared max-min fairly among active jobs, as a primitive of the simulator's event core
(`sim.engine`; docs/coldstart.md).

An event core has no fair-share primitive, so this module implements one for every shared resource of the simulator:
flash bandwidth (`sim.flash`), CPU cores (`Cores` below) and DRAM bandwidth. Each active job has an amount of work left,
a rate cap (what it could use alone) and a weight; the capacity is split by weighted water filling (a job capped below
its weighted fair share keeps its cap, the rest is re-split among the others). Whenever the set of jobs changes,
progress is advanced and the next completion re-scheduled (a generation counter discards stale wake-ups).
Deterministic: jobs are kept in arrival order and ties resolve in that order.

The hot path (one call per job start and per completion; a cold start has tens of thousands) allocates no closures or
timer events and sorts only where the order can differ from arrival order: the events it schedules, and so every
result, are the same as the plain formulation's (`tests/sim/test_host_golden.py`). Float sums are `sum([...])`, never
`sum(<generator>)`: compiled (`sim/sharing.pxd`, docs/coldstart.md "Benchmarks") the latter becomes a loop of plain
additions, which differs from the builtin's compensated sum on Python >= 3.12.
"""
from __future__ import annotations

from heapq import heappush

from sim.engine import AllDone, Environment, Event

_DONE = 1e-9    # relative residue below which a job is complete (float rounding of the sharing math)
NO_SLOW = (1.0, 1.0)    # a job's co-run slowdown factors when it has none (Cores.run)


class _Job:
    """A job of a shared resource, built in `SharedRate.use` (`_Job.__new__`, no `__init__`: one call less per job;
    compiled, it is an extension type whose attributes are C fields, `sim/sharing.pxd`). `left`: units of
    work left; `cap`: its rate cap (units/s); `weight`; `rate`: its share now (units/s); `event`: fires when it is done
    (None: it is a part of barrier `part_of`); `eps`: the residue below which it is done; `owner`: the thread it
    belongs to (None: anonymous); flash (`sim.flash`): `random` (a scattered read), `request` (request size, B);
    cores (`Cores`): `slow` / `slow_mem` (x CPU time while other cores compute / run memory-system work), `memory`
    (this job is memory-system work), `neutral` (it slows no other job: a polling thread)."""

    __slots__ = ("left", "cap", "weight", "rate", "event", "eps", "random", "request", "owner", "slow", "slow_mem",
                 "memory", "neutral", "part_of")


class SharedRate:
    """`capacity` units of work per second shared by the active jobs (units: B/s for bandwidth, cores for CPUs)."""

    def __init__(self, env: Environment, capacity: float, record: bool = True) -> None:
        if capacity <= 0:
            raise ValueError(f"shared capacity must be > 0 (got {capacity})")
        self.env = env
        # every job's cap / weight is the same (Cores: cap = weight = threads): water filling needs no sort
        self.uniform_caps = False
        self.capacity = float(capacity)
        self.active: list[_Job] = []
        self.last = 0.0
        self.gen = 0
        self.record = record                                      # keep `samples` (False: nobody reads them)
        self.samples: list[tuple[float, float]] = [(0.0, 0.0)]   # (time s, total rate in use) at every change
        self.listeners: list = []                                 # called (no args) after every change of the set
        self.n_slow = 0                                           # active jobs with a co-run slowdown (Cores)
        self._timer = self._on_timer                              # bound once: one per re-split
        # water filling as below (Flash adds caps); the class's own entry: compiled, `SharedRate._share` would be a new
        # wrapper of the C method each time
        self._plain_share = type(self)._share is SharedRate.__dict__["_share"]

    def use(self, amount: float, cap: float, weight: float = 1.0, owner: object = None,
            slow: tuple[float, float] = (1.0, 1.0), memory: bool = False, neutral: bool = False,
            part_of: AllDone | None = None) -> Event | None:
        """An event that fires when `amount` units of work are done at a rate of at most `cap` units/s (`slow`,
        `memory`, `neutral`: job attributes only `Cores` uses, see there). With `part_of`, no event: the job is one
        of that barrier's parts (`AllDone.part_done` when it would fire)."""
        if part_of is None:
            ev = Event(self.env)
            if amount <= 0.0:
                ev.succeed()
                return ev
        else:
            ev = None
            if amount <= 0.0:
                part_of.part_done()
                return None
        if cap <= 0.0 or weight <= 0.0:
            raise ValueError(f"shared job needs cap > 0 and weight > 0 (got {cap}, {weight})")
        if self.uniform_caps and cap != weight:
            self.uniform_caps = False
        now = self.env.now                 # _advance, inline (once per job start)
        dt = now - self.last
        if dt > 0.0:
            for j in self.active:
                j.left -= j.rate * dt
        self.last = now
        job = _Job.__new__(_Job)
        job.left = left = float(amount)
        job.cap = float(cap)
        job.weight = float(weight)
        job.rate = 0.0
        job.event = ev
        job.part_of = part_of
        job.owner = owner
        eps = left * _DONE
        job.eps = eps if eps >= 1e-12 else 1e-12                   # max(left * _DONE, 1e-12), without the call
        job.random = False
        job.request = 0
        job.slow = s0 = slow[0]
        job.slow_mem = s1 = slow[1]
        job.memory = memory
        job.neutral = neutral
        if s0 != 1.0 or s1 != 1.0:
            self.n_slow += 1
        self.active.append(job)
        self._reschedule()
        if self.listeners:
            self._notify()
        return ev

    def cancel(self, ev: Event) -> bool:
        """End the active job of event `ev` now, its work left undone (a polling thread that found work, a wait
        that ended early); the capacity is re-split. The event never fires. False when no such job is active."""
        for job in self.active:
            if job.event is ev:
                break
        else:
            return False
        self._advance()
        self.active.remove(job)
        if job.slow != 1.0 or job.slow_mem != 1.0:
            self.n_slow -= 1
        self._reschedule()
        self._notify()
        return True

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self.last
        if dt > 0.0:
            for j in self.active:
                j.left -= j.rate * dt
        self.last = now

    def _share(self) -> None:
        left = self.capacity
        jobs = self.active
        if not self.uniform_caps and len(jobs) > 1:
            if sum([j.cap for j in jobs]) <= left * (1.0 - 1e-9):
                # every job below its fair share whatever the order: water filling gives each its cap (the
                # margin is far above the rounding of the fair shares), no sort needed
                for j in jobs:
                    j.rate = j.cap
                return
            jobs = sorted(jobs, key=_cap_per_weight)
        wsum = sum([j.weight for j in jobs])
        for j in jobs:
            fair = left * j.weight / wsum
            cap = j.cap
            j.rate = rate = fair if fair < cap else cap          # min(cap, fair), without the call
            left -= rate
            wsum -= j.weight

    def _reschedule(self) -> None:
        self.gen += 1
        env = self.env
        active = self.active
        if not active:
            if self.record:
                self.samples.append((env.now, 0.0))
            return
        dt = -1.0
        if self._plain_share and not self.uniform_caps:
            n = len(active)
            if n <= 2 and not self.record:
                # the path below for one or two jobs below the capacity (sum() of one or two caps is their plain
                # sum), unrolled: the same float operations in the same order
                j = active[0]
                if n == 1:
                    rate = j.cap
                    if rate <= self.capacity * (1.0 - 1e-9):
                        j.rate = rate
                        d = j.left
                        dt = (0.0 if 0.0 > d else d) / rate
                        now = env.now                  # _timer_in(dt), inline
                        at = now + dt
                        if at == now:
                            env.call_later(dt, self._timer, self.gen)
                        else:
                            env._eid += 1
                            heappush(env._heap, (at, env._eid, self._timer, self.gen))
                        return
                else:
                    k = active[1]
                    rate, rk = j.cap, k.cap
                    if rate + rk <= self.capacity * (1.0 - 1e-9):
                        j.rate = rate
                        k.rate = rk
                        d = j.left
                        dt = (0.0 if 0.0 > d else d) / rate
                        d = k.left
                        d = (0.0 if 0.0 > d else d) / rk
                        if d < dt:
                            dt = d
                        now = env.now                  # _timer_in(dt), inline
                        at = now + dt
                        if at == now:
                            env.call_later(dt, self._timer, self.gen)
                        else:
                            env._eid += 1
                            heappush(env._heap, (at, env._eid, self._timer, self.gen))
                        return
                below = False
            else:
                caps = (active[0].cap if n == 1 else active[0].cap + active[1].cap if n == 2
                        else sum([j.cap for j in active]))
                below = caps <= self.capacity * (1.0 - 1e-9)
        else:
            below = False
        if below:
            # `_share`'s water filling when every job is below its fair share (see there): each gets its cap; the
            # next completion in the same pass
            for j in active:
                j.rate = rate = j.cap
                d = j.left
                d = (0.0 if 0.0 > d else d) / rate                 # max(left, 0) / rate
                if dt < 0.0 or d < dt:
                    dt = d
        else:
            self._share()
            for j in active:                # the next completion (Cores: a preempted waker's jobs stand still)
                rate = j.rate
                if rate > 0.0:
                    d = j.left
                    d = (0.0 if 0.0 > d else d) / rate             # max(left, 0) / rate
                    if dt < 0.0 or d < dt:
                        dt = d
        if self.record:
            self.samples.append((env.now, sum([j.rate for j in active])))
        if dt < 0.0:
            return
        self._timer_in(dt)

    def _timer_in(self, dt: float) -> None:
        """The timer of the next completion, `dt` s from now, carrying the generation (a later change makes it
        stale)."""
        env = self.env
        now = env.now
        at = now + dt
        if at == now:
            env.call_later(dt, self._timer, self.gen)
        else:
            env._eid += 1
            heappush(env._heap, (at, env._eid, self._timer, self.gen))

    def _on_timer(self, gen: int) -> None:
        if gen != self.gen:
            return
        now = self.env.now
        dt = now - self.last
        active = self.active
        if len(active) == 1:               # one job (most timers): the general path below for one job
            j = active[0]
            if dt > 0.0:
                j.left = left = j.left - j.rate * dt
            else:
                left = j.left
            self.last = now
            if left > j.eps and not j.rate > 0.0:     # the closest running job: there is none
                raise ValueError("min() arg is an empty sequence")
            active.pop()
            if j.slow != 1.0 or j.slow_mem != 1.0:
                self.n_slow -= 1
            ev = j.event
            if ev is None:                 # j.part_of.part_done(), inline
                bar = j.part_of
                bar._left -= 1
                if not bar._left:
                    bar._waiting, bar.callbacks = bar.callbacks, [bar._last_part]
                    self.env._now_q.append(bar)
            else:                          # ev.succeed(), inline
                ev._value = None
                self.env._now_q.append(ev)
            self._reschedule()
            if self.listeners:
                self._notify()
            return
        if len(active) == 2:               # two jobs: the general path below, unrolled
            j, k = active
            if dt > 0.0:
                j.left = left = j.left - j.rate * dt
                dj = left <= j.eps
                k.left = left = k.left - k.rate * dt
                dk = left <= k.eps
            else:
                dj = j.left <= j.eps
                dk = k.left <= k.eps
            self.last = now
            if dj and dk:
                done = active
                self.active = []
            elif dj:
                done = [j]
                del active[0]
            elif dk:
                done = [k]
                active.pop()
            else:                          # float rounding: finish the closest one
                done = [_closest(active)]
                active.remove(done[0])
        else:
            done = []
            if dt > 0.0:                     # _advance, inline, with the completed jobs in the same pass
                for j in active:
                    j.left = left = j.left - j.rate * dt
                    if left <= j.eps:
                        done.append(j)
            else:
                for j in active:
                    if j.left <= j.eps:
                        done.append(j)
            self.last = now
            if not done:   # float rounding: finish the closest one
                done = [_closest(active)]
            if len(done) == 1:
                active.remove(done[0])
            else:
                self.active = [j for j in active if j not in done]
        now_q = self.env._now_q
        for j in done:
            if j.slow != 1.0 or j.slow_mem != 1.0:
                self.n_slow -= 1
            ev = j.event
            if ev is None:                 # j.part_of.part_done(), inline
                bar = j.part_of
                bar._left -= 1
                if not bar._left:
                    bar._waiting, bar.callbacks = bar.callbacks, [bar._last_part]
                    now_q.append(bar)
            else:                          # ev.succeed(), inline
                ev._value = None
                now_q.append(ev)
        self._reschedule()
        if self.listeners:
            self._notify()

    def _notify(self) -> None:
        for fn in self.listeners:
            fn()

    def refresh(self) -> None:
        """Re-split the capacity now (a cap depends on state outside this resource that just changed)."""
        self._advance()
        self._reschedule()

    def idle_since(self, t0: float) -> float:
        """Units of capacity left unused from time `t0` to now (the integral of capacity - rate in use)."""
        end, idle = self.env.now, 0.0
        for ta, used in reversed(self.samples):            # newest first: each sample holds until the next one
            a = max(ta, t0)
            if end > a:
                idle += (self.capacity - used) * (end - a)
            if ta <= t0:
                break
            end = ta
        return max(0.0, idle)

    def full_without(self, owner: object = None) -> bool:
        """The active jobs not belonging to `owner` (all of them for None) use the whole capacity by weight: for
        `Cores`, other threads occupy every core."""
        load = sum([j.weight for j in self.active if owner is None or j.owner != owner])
        return load >= self.capacity - 1e-9


def _cap_per_weight(j: _Job) -> float:
    return j.cap / j.weight


def _time_left(j: _Job) -> float:
    return j.left / j.rate


def _closest(active: list[_Job]) -> _Job:
    """The running job closest to completion (float rounding left every job above its residue). A function of its
    own: compiled methods (`sim/sharing.pxd`) take no closures."""
    return min([j for j in active if j.rate > 0.0], key=_time_left)


class Cores(SharedRate):
    """The SoC's CPU cores under the OS scheduler: every runnable thread gets an equal share (CFS), at most one core.

    A job is an op on `threads` threads that needs `seconds` when it has its threads' cores to itself (the cost
    model's time); its work is `seconds * threads` core-seconds, its cap `threads` cores, its weight `threads`.
    With more runnable threads than cores, every job slows down by cores / runnable threads.

    Co-running (docs/hil.md "Co-running cores"): a job's work also takes more CPU time while other threads run on the
    other cores — shared caches, memory bandwidth, the kernel's page and page-cache locks — by a factor measured per
    class of work and per kind of co-runner: `slow` = (x beside compute, x beside memory-system work). Each other
    job adds its factor's excess in proportion to the cores it occupies: rate / (1 + sum_o (f(o) - 1) r_o / free),
    free = the cores this job does not use.

    Wake-up packing (docs/hil.md "Wake-up packing"): `pack(wakee, waker)` confines a thread the OS put on its waker's
    busy core to that core: the jobs of a packed pair (or chain) form one entity capped at the cores the waker's jobs
    use, the most recently woken thread served first, while another core may idle (`idle_for`), until `unpack`.
    """

    def __init__(self, env: Environment, capacity: float, record: bool = True) -> None:
        super().__init__(env, capacity, record)
        self.uniform_caps = True                  # a job's cap and weight are both its threads (`run`)
        # cores occupied since the last change (at _occ_t s) and the core-seconds occupied before it: the integral of
        # `busy_core_s`, summed at every change in time order
        self._occ, self._occ_t, self._busy = 0.0, 0.0, 0.0
        self.packs: dict[object, object] = {}     # woken thread -> the waker whose core it was put on (`pack`)
        self.full_at = 0.0                        # s, when every core was last occupied (or the start)

    def pack(self, wakee: object, waker: object) -> None:
        """Put thread `wakee` on the core of thread `waker` (a wake-up the OS packed onto its waker's busy core):
        while both have work, their jobs share the cores `waker`'s jobs occupy and `wakee`'s come first (it preempted
        its waker); another core may stay idle meanwhile. Ends with `unpack`."""
        if wakee is not None and waker is not None and wakee != waker:
            self._advance()
            self.packs.pop(wakee, None)
            if self._root(waker) == wakee:               # the waker is already packed onto the woken thread's core:
                self.packs.pop(waker, None)              # the two share it, the woken thread now first
            self.packs[wakee] = waker
            self._reschedule()
            self._notify()

    def unpack(self, wakee: object) -> None:
        """End `wakee`'s pack (its task ended, it blocked, or a balance moved it to a free core)."""
        if self.packs.pop(wakee, None) is not None:
            self._advance()
            self._reschedule()
            self._notify()

    def idle_for(self) -> float | None:
        """s a core has been idle now (since every core was last occupied); None when every core is occupied."""
        return None if self._occupancy() >= self.capacity - 1e-9 else self.env.now - self.full_at

    def _root(self, owner: object) -> object:
        """The thread at the end of `owner`'s chain of packs: whose core `owner` runs on."""
        seen = set()
        while owner in self.packs and owner not in seen:
            seen.add(owner)
            owner = self.packs[owner]
        return owner

    def _entities(self) -> list[tuple[float, float, list[_Job]]]:
        """The jobs as scheduling entities (cap, weight, jobs in the order served): one per job, except that the
        threads packed onto one core (chains of `pack`s) form one entity capped at the most cores any of its jobs
        uses, served most recently woken first (each preempted the thread it was packed on)."""
        if not self.packs:
            return [(j.cap, j.weight, [j]) for j in self.active]
        order = {o: i for i, o in enumerate(self.packs)}           # pack order: later = woken more recently
        comps: dict[object, list[_Job]] = {}
        for j in self.active:
            comps.setdefault(self._root(j.owner), []).append(j)
        out = []
        for jobs in comps.values():
            if len({j.owner for j in jobs}) == 1:
                out += [(j.cap, j.weight, [j]) for j in jobs]
                continue
            jobs.sort(key=lambda j: -order.get(j.owner, -1))
            out.append((max(j.cap for j in jobs), sum([j.weight for j in jobs]), jobs))
        return out

    def _occupancy(self) -> float:
        if not self.packs:
            return min(self.capacity, sum([j.cap for j in self.active]))
        return min(self.capacity,
                   sum([min(cap, sum([j.cap for j in jobs])) for cap, _w, jobs in self._entities()]))

    def _reschedule(self) -> None:
        active = self.active
        if not active and not self.packs and not self.record:     # the general path below with nothing to share
            self.gen += 1
            now = self.env.now              # _set_occupied(0), inline
            if 0.0 >= self.capacity - 1e-9:
                self.full_at = now
            d = now - self._occ_t
            self._busy += self._occ * (d if d > 0.0 else 0.0)
            self._occ, self._occ_t = 0, now
            return
        if not (self.packs or self.record or self.n_slow or not self.uniform_caps):
            # plain water filling (cap = weight: in arrival order), the next completion and the occupancy in one
            # pass: the same float operations in the same order as the general path below
            self.gen += 1
            capacity = self.capacity
            n = len(active)     # sum() of one or two weights is their plain sum: no list for the common cases
            if n == 1:
                j = active[0]
                occ = j.weight
                if occ <= capacity * (1.0 - 1e-9):      # the path below for one job below capacity, unrolled
                    j.rate = rate = j.cap
                    d = j.left
                    dt = (0.0 if 0.0 > d else d) / rate
                    env = self.env                 # _timer_in(dt), inline
                    now = env.now
                    at = now + dt
                    if at == now:
                        env.call_later(dt, self._timer, self.gen)
                    else:
                        env._eid += 1
                        heappush(env._heap, (at, env._eid, self._timer, self.gen))
                    # _set_occupied(occ), inline (occ < capacity)
                    if occ >= capacity - 1e-9:
                        self.full_at = now
                    d = now - self._occ_t
                    self._busy += self._occ * (d if d > 0.0 else 0.0)
                    self._occ, self._occ_t = occ, now
                    return
            occ = wsum = (active[0].weight if n == 1 else active[0].weight + active[1].weight if n == 2
                          else sum([j.weight for j in active]))
            dt = -1.0
            if occ <= capacity * (1.0 - 1e-9):
                # fewer threads than cores: every fair share is above its cap (by far more than rounding), each
                # job runs at its cap, as the water filling below gives
                for j in active:
                    j.rate = rate = j.cap
                    d = j.left
                    d = (0.0 if 0.0 > d else d) / rate
                    if dt < 0.0 or d < dt:
                        dt = d
            else:
                left = capacity
                for j in active:
                    w = j.weight
                    fair = left * w / wsum
                    cap = j.cap
                    j.rate = rate = fair if fair < cap else cap
                    left -= rate
                    wsum -= w
                    if rate > 0.0:
                        d = j.left
                        d = (0.0 if 0.0 > d else d) / rate
                        if dt < 0.0 or d < dt:
                            dt = d
            if dt >= 0.0:
                self._timer_in(dt)
            self._set_occupied(occ if occ < capacity else capacity)
            return
        SharedRate._reschedule(self)
        if self.packs:
            occ = self._occupancy()
        else:                               # _occupancy, inline
            occ = sum([j.cap for j in self.active])
            if not occ < self.capacity:
                occ = self.capacity
        self._set_occupied(occ)

    def _set_occupied(self, occ: float) -> None:
        """`occ` cores are occupied from now on (`busy_core_s`, `full_at`)."""
        now = self.env.now
        if occ >= self.capacity - 1e-9:
            self.full_at = now
        d = now - self._occ_t
        self._busy += self._occ * (d if d > 0.0 else 0.0)
        self._occ, self._occ_t = occ, now

    def full_without(self, owner: object = None) -> bool:
        """Other threads than `owner` occupy every core (a packed pair occupies its waker's cores)."""
        if not self.packs:
            return super().full_without(owner)
        load = sum([min(cap, sum([j.weight for j in jobs if owner is None or j.owner != owner]))
                    for cap, _w, jobs in self._entities()])
        return load >= self.capacity - 1e-9

    def _share_entities(self) -> None:
        """Weighted water filling over the entities (`SharedRate._share` when nothing is packed); within a packed
        pair the woken thread's jobs take the pair's rate first, its waker's get what they leave."""
        if not self.packs:
            super()._share()
            return
        ents = sorted(self._entities(), key=lambda e: e[0] / e[1])
        left, wsum = self.capacity, sum([e[1] for e in ents])
        for cap, w, jobs in ents:
            rate = min(cap, left * w / wsum)
            left -= rate
            wsum -= w
            for j in jobs:
                j.rate = min(j.cap, rate)
                rate -= j.rate

    def busy_core_s(self) -> float:
        """Core-seconds the cores were occupied from 0 to now (a job slowed by co-running occupies its cores all the
        same; `samples` hold the progress rates)."""
        d = self.env.now - self._occ_t
        return self._busy + self._occ * (d if d > 0.0 else 0.0)

    def run(self, seconds: float, threads: int = 1, owner: object = None, slow: tuple[float, float] = (1.0, 1.0),
            memory: bool = False, neutral: bool = False, part_of: AllDone | None = None) -> Event | None:
        """`slow` (each >= 1): the job's work takes that many times its CPU time while the other cores are in use by
        other threads' compute / memory-system work (measured per class of work on the host: `HostRuntime.corun_*`);
        `memory`: this job is memory-system work (what others' `slow[1]` applies to); `neutral`: this job occupies
        its cores but slows no other job through co-running (a thread polling a flag in a pause loop)."""
        if slow[0] < 1.0 or slow[1] < 1.0:
            raise ValueError(f"cores job: slow factors must be >= 1 (got {slow})")
        return self.use(seconds * threads, float(threads), float(threads), owner, slow, memory, neutral, part_of)

    def _share(self) -> None:
        if self.packs:
            self._share_entities()
        else:
            SharedRate._share(self)
        if self.capacity <= 1:
            return
        for j in self.active:
            if j.slow != 1.0 or j.slow_mem != 1.0:
                break
        else:
            return
        base = [(j, j.rate) for j in self.active]     # shares before the co-run slowdown
        for j, rj in base:
            free = self.capacity - rj
            if (j.slow > 1.0 or j.slow_mem > 1.0) and free > 0:
                excess = sum([((j.slow_mem if o.memory else j.slow) - 1.0) * ro for o, ro in base
                              if o is not j and not o.neutral])
                j.rate = rj / (1.0 + excess / free)
