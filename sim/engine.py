"""The simulator's discrete-event core: the subset of SimPy the cold-start simulator uses (events, timeouts,
generator processes, a FIFO resource), processed in exactly SimPy's order, with less work per event.

SimPy processes events by (time, priority, insertion id): a process start (`Initialize`) is URGENT, everything else
NORMAL. Every event the simulator schedules at a later time has a positive delay, so an event due now was either
scheduled before now (a timeout that falls due: smaller insertion ids than anything scheduled now) or scheduled now
with no delay. This core keeps the three groups apart — process starts due now (a FIFO), events that fell due now (a
heap, ordered as SimPy's), events triggered now (a FIFO) — and takes them in that order, which is SimPy's order
without a heap operation for the events triggered at the current instant (most of them). A timeout whose delay is
lost in rounding (now + delay == now) is triggered now, as in SimPy (it gets the newest insertion id).
Exceptions raised inside a process propagate out of `run` at once (SimPy re-raises them when the failed process is
processed; the simulator treats either as fatal).
Compiled (`sim/engine.pxd`, docs/coldstart.md "Benchmarks"), the classes are extension types with C fields; their
methods then take no closures.
"""
from __future__ import annotations

from collections import deque
from heapq import heappop, heappush

PENDING = object()      # the value of an event not triggered yet


class _Stop(Exception):
    """Raised by the `until` event of `Environment.run` when it is processed."""


class Event:
    """An event: triggered by `succeed` (or at construction for timeouts), processed when the environment reaches it
    (its callbacks run once, in order; `callbacks` is None afterwards)."""

    __slots__ = ("env", "callbacks", "_value", "_ok")

    def __init__(self, env: Environment) -> None:
        self.env = env
        self.callbacks: list | None = []
        self._value = PENDING
        self._ok = True

    @property
    def triggered(self) -> bool:
        return self._value is not PENDING

    @property
    def processed(self) -> bool:
        return self.callbacks is None

    @property
    def value(self):
        if self._value is PENDING:
            raise AttributeError(f"value of {self} is not yet available")
        return self._value

    def succeed(self, value=None) -> Event:
        if self._value is not PENDING:
            raise RuntimeError(f"{self} has already been triggered")
        self._value = value
        self.env._now_q.append(self)
        return self


class Timeout(Event):
    """An event triggered at construction, processed `delay` seconds later."""

    __slots__ = ()

    def __init__(self, env: Environment, delay: float, value=None) -> None:
        if delay < 0.0:
            raise ValueError(f"negative delay {delay}")
        self.env = env
        self.callbacks = []
        self._value = value
        self._ok = True
        self.env.schedule(self, delay)          # (self.env: typed where compiled, a C call)


class Process(Event):
    """A generator run as a process: it yields events and is resumed with each one's value once it is processed
    (at once when it already was); the process is itself an event, triggered with the generator's return value."""

    __slots__ = ("_send", "_resume_cb")

    def __init__(self, env: Environment, generator) -> None:
        self.env = env
        self.callbacks = []
        self._value = PENDING
        self._ok = True
        self._send = generator.send             # bound once, not on every resume
        self._resume_cb = self._resume
        start = Event(env)                      # SimPy's Initialize: URGENT, before anything else due now
        start._value = None
        start.callbacks.append(self._resume_cb)
        env._urgent_q.append(start)

    def _resume(self, event: Event) -> None:
        send = self._send
        while True:
            try:
                event = send(event._value)
            except StopIteration as stop:
                self._value = stop.value
                self.env._now_q.append(self)
                return
            cbs = event.callbacks
            if cbs is not None:
                cbs.append(self._resume_cb)
                return


class AllDone(Event):
    """Fires once every one of `events` has been processed: the scheduling of SimPy's `AllOf` (triggered at the
    instant the last of them is processed, so a process waiting on it resumes in the same order), without building
    a condition value (its value is None).
    `parts`: that many more events, not built, that a shared resource (`sim.sharing`) triggers by calling `part_done`:
    each as an event triggered then whose only callback is this one's, so only the last of them to be triggered
    matters (events triggered now are processed in the order they were triggered). A barrier with parts takes no
    `events`: a timeout due now is processed before events triggered now, which would reorder the two kinds."""

    __slots__ = ("_left", "_waiting")

    def __init__(self, env: Environment, events=(), parts: int = 0) -> None:
        self.env = env
        self.callbacks = []
        self._value = PENDING
        self._ok = True
        left = parts
        if events:
            check = self._check
            for ev in events:
                cbs = ev.callbacks
                if cbs is None:                 # processed already
                    continue
                left += 1
                cbs.append(check)
        self._left = left
        if not left:
            self._value = None
            env._now_q.append(self)

    def _check(self, _ev: Event) -> None:
        self._left -= 1
        if not self._left:
            self._value = None
            self.env._now_q.append(self)

    def part_done(self) -> None:
        """One of the `parts` is triggered now: the last one's processing (one event later) triggers this."""
        self._left -= 1
        if not self._left:
            # this event stands in for the last part's event, triggered now: processed, it triggers itself
            self._waiting, self.callbacks = self.callbacks, [self._last_part]
            self.env._now_q.append(self)

    def _last_part(self, _ev: Event) -> None:
        self.callbacks = self._waiting
        self._value = None
        self.env._now_q.append(self)


class Environment:
    """Simulated time (`now`, s) and the events due."""

    def __init__(self) -> None:
        self.now = 0                             # s (an int until the first timeout, as in SimPy)
        self._urgent_q: deque[Event] = deque()     # process starts triggered now
        self._now_q: deque[Event] = deque()        # events triggered now (insertion order)
        self._heap: list = []                      # (time, insertion id, event) of events due later
        self._eid = 0

    def schedule(self, event: Event, delay: float) -> None:
        """Process the (triggered) `event` `delay` seconds from now."""
        at = self.now + delay
        if at == self.now:
            self._now_q.append(event)
        else:
            self._eid += 1
            heappush(self._heap, (at, self._eid, _process, event))

    def call_later(self, delay: float, fn, arg) -> None:
        """Call `fn(arg)` `delay` seconds from now, in the order of an event scheduled now with that delay (a
        timer that needs no event object)."""
        at = self.now + delay
        if at == self.now:
            ev = Event(self)
            ev._value = (fn, arg)
            ev.callbacks.append(_call)
            self._now_q.append(ev)
        else:
            self._eid += 1
            heappush(self._heap, (at, self._eid, fn, arg))

    def event(self) -> Event:
        return Event(self)

    def timeout(self, delay: float, value=None) -> Timeout:
        return Timeout(self, delay, value)

    def process(self, generator) -> Process:
        return Process(self, generator)

    def run(self, until: Event | float | None = None):
        """Process events until `until` (an event: until it is processed, returning its value; a time: until then)
        or, for None, until none are left. RuntimeError if none are left before the `until` event."""
        if until is not None and not isinstance(until, Event):
            at = float(until)
            if at <= self.now:
                raise ValueError(f"until ({at}) must be greater than the current simulation time")
            until = Event(self)
            until._value = None
            # SimPy schedules this stop URGENT: before the timeouts due at that instant
            heappush(self._heap, (at, -1, _process, until))
        if until is not None:
            if until.callbacks is None:
                return until._value
            until.callbacks.append(_stop)
        try:
            self._loop()
        except _Stop:
            return until._value
        if until is not None:
            raise RuntimeError(f'No scheduled events left but "until" event was not triggered: {until}')
        return None

    def _loop(self) -> None:
        heap, urgent, now_q = self._heap, self._urgent_q, self._now_q
        pop_now = now_q.popleft
        now = self.now                  # the loop is the only writer of self.now
        while True:
            if urgent:
                ev = urgent.popleft()
            elif now_q:
                if heap and heap[0][0] == now:      # due now (scheduled earlier: before anything triggered now)
                    at, _eid, fn, arg = heappop(heap)
                    self.now = now = at
                    fn(arg)
                    continue
                ev = pop_now()
            elif heap:                              # nothing left now: the next
                at, _eid, fn, arg = heappop(heap)
                self.now = now = at
                fn(arg)
                continue
            else:
                return
            cbs, ev.callbacks = ev.callbacks, None
            for cb in cbs:
                cb(ev)


def _process(ev: Event) -> None:
    """Run the callbacks of `ev` (it is processed)."""
    cbs, ev.callbacks = ev.callbacks, None
    for cb in cbs:
        cb(ev)


def _stop(_ev: Event) -> None:
    raise _Stop


def _call(ev: Event) -> None:
    """The callback of `Environment.call_later`'s event (a function, not a closure: compiled methods take none)."""
    fn, arg = ev._value
    fn(arg)


class Request(Event):
    """A request for one of a `Resource`'s slots; a context manager that releases it (or withdraws it) on exit."""

    __slots__ = ("resource",)

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.env)
        self.resource = resource
        resource.queue.append(self)
        self.callbacks.append(resource._trigger_get)
        resource._trigger_put(None)

    def __enter__(self) -> Request:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._value is PENDING:
            self.resource.queue.remove(self)
        if exc_type is not GeneratorExit:
            self.resource.release(self)


class Release(Event):
    __slots__ = ("request",)

    def __init__(self, resource: Resource, request: Request) -> None:
        super().__init__(resource.env)
        self.request = request
        resource.get_queue.append(self)
        self.callbacks.append(resource._trigger_put)
        resource._trigger_get(None)


class Resource:
    """`capacity` slots granted first come, first served (SimPy's `Resource`: the same events in the same order)."""

    def __init__(self, env: Environment, capacity: int = 1) -> None:
        if capacity <= 0:
            raise ValueError('"capacity" must be > 0.')
        self.env = env
        self.capacity = capacity
        self.users: list[Request] = []
        self.queue: list[Request] = []          # requests waiting for a slot
        self.get_queue: list[Release] = []

    @property
    def count(self) -> int:
        return len(self.users)

    def request(self) -> Request:
        return Request(self)

    def release(self, request: Request) -> Release:
        return Release(self, request)

    def _trigger_put(self, _ev) -> None:
        q = self.queue
        i = 0
        while i < len(q):
            req = q[i]
            if len(self.users) < self.capacity:
                self.users.append(req)
                req.succeed()
            if req._value is PENDING:
                i += 1
            else:
                q.pop(i)

    def _trigger_get(self, _ev) -> None:
        q = self.get_queue
        i = 0
        while i < len(q):
            rel = q[i]
            try:
                self.users.remove(rel.request)
            except ValueError:
                pass
            rel.succeed()
            q.pop(i)
