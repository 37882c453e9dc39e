"""Energy of a simulated cold start: active power per busy unit plus flash energy per byte (device profile values).

E = power_idle_w * ttft
  + sum over CPU compute-pool ops (incl. stolen ones): duration * sum of the pool's core powers (big/little per core)
  + sum over unpack ops: duration * power of the unpack thread's core
  + CPU part of load tasks (copy / deserialize) and graph-thread work: duration * one big core
  + NPU busy time * power_npu_w
  + bytes read * flash_nj_per_byte.
Waiting on flash does not burn CPU power (the loader thread sleeps in the I/O).
"""
from __future__ import annotations

from planner.device import SocProfile


def _core_w(dev: SocProfile, core: int) -> float:
    return dev.power_big_core_w if core < dev.cpu_big_cores else dev.power_little_core_w


def energy_j(tl, dev: SocProfile) -> float:
    plan = tl.plan
    pool_w = sum(_core_w(dev, c) for c in range(plan.cpu_first_core, plan.cpu_first_core + plan.cpu_threads))
    e = dev.power_idle_w * tl.end_s + tl.bytes_read * dev.flash_nj_per_byte * 1e-9
    for s in tl.spans:
        d = s.end - s.start
        if s.resource == "cpu":
            e += d * pool_w
        elif s.resource == "unpack":
            e += d * _core_w(dev, s.worker)
        elif s.resource == "npu":
            e += d * dev.power_npu_w
        elif s.resource == "graph":
            e += d * dev.power_big_core_w
        elif s.resource == "load":
            e += s.cpu_s * dev.power_big_core_w
    return e
