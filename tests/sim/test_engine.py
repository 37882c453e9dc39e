"""The simulator's event core (`sim.engine`) processes events in exactly SimPy's order: random process mixes with
ties everywhere (timeouts landing on the same instant, zero delays, delays lost in rounding, processes started mid-run,
waits on several events, a FIFO resource, stops at a time) leave the same trace on both."""
from __future__ import annotations

import random

import pytest
import simpy

from sim import engine

DELAYS = (0.0, 0.0, 0.25, 0.5, 0.5, 1.0, 1e-18)     # 1e-18: lost in rounding once the clock is past 0


def _scenario(env, all_of, resource, seed: int, until: float | None) -> list[tuple]:
    rng = random.Random(seed)
    log: list[tuple] = []
    res = resource(env, 2)
    flags = [env.event() for _ in range(4)]

    def child(name: str, d: float):
        yield env.timeout(d)
        log.append((env.now, name, "child"))
        return name

    def proc(pid: int):
        for step in range(25):
            log.append((env.now, pid, step))
            a = rng.randrange(7)
            if a == 0:
                yield env.timeout(rng.choice(DELAYS))
            elif a == 1:
                v = yield env.process(child(f"{pid}.{step}", rng.choice(DELAYS)))
                log.append((env.now, pid, v))
            elif a == 2:
                yield all_of(env, [env.timeout(rng.choice(DELAYS)), env.timeout(rng.choice(DELAYS))])
            elif a == 3:
                with res.request() as req:
                    yield req
                    log.append((env.now, pid, "slot"))
                    yield env.timeout(rng.choice(DELAYS))
            elif a == 4:
                k = rng.randrange(len(flags))
                if not flags[k].triggered:
                    flags[k].succeed(pid)
                    flags[k] = env.event()
                else:
                    yield env.timeout(0)
            elif a == 5:
                v = yield flags[rng.randrange(len(flags))] if rng.random() < 0.3 else env.timeout(0.25, pid)
                log.append((env.now, pid, "got", v))
            else:
                env.process(child(f"{pid}.{step}.bg", rng.choice(DELAYS)))

    def releaser():                      # keeps waiters on the flags from starving forever
        while True:
            yield env.timeout(0.75)
            for k, f in enumerate(flags):
                if not f.triggered:
                    f.succeed(-1)
                    flags[k] = env.event()

    for pid in range(6):
        env.process(proc(pid))
    env.process(releaser())
    if until is not None:
        env.run(until=until)
        log.append((env.now, "until"))
    env.run(until=40.0)
    log.append((env.now, "end"))
    return log


def _simpy_all_of(env, events):
    return simpy.AllOf(env, events)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("until", [None, 2.5])
def test_the_engine_orders_events_as_simpy(seed, until):
    want = _scenario(simpy.Environment(), _simpy_all_of, simpy.Resource, seed, until)
    got = _scenario(engine.Environment(), engine.AllDone, engine.Resource, seed, until)
    assert len(want) > 200
    assert got == want


def test_run_until_an_event_returns_its_value_and_reports_running_dry():
    env = engine.Environment()
    done = env.event()

    def p():
        yield env.timeout(1.5)
        done.succeed("ok")
    env.process(p())
    assert env.run(until=done) == "ok" and env.now == 1.5
    with pytest.raises(RuntimeError, match="until"):
        env.run(until=env.event())
    with pytest.raises(ValueError, match="until"):
        env.run(until=1.0)
    with pytest.raises(ValueError, match="negative"):
        env.timeout(-1.0)
