"""Tiny objects served by the emulated-cluster tests' workers (`tests.hil_cluster.factories:make_echo`)."""
from __future__ import annotations

import os
import time

import numpy as np


class Echo:
    def __init__(self, tag: str = ""):
        self.tag = tag
        self.calls = 0

    def echo(self, *arrays):                       # arrays back unchanged (list, even for one)
        self.calls += 1
        return list(arrays) if arrays else None

    def add(self, a, b):                           # (n,) + (n,) -> (n,)
        return a + b

    def scale_inplace(self, a, factor: float = 2.0):   # received arrays are writable views of the message
        a *= factor
        return a

    def value(self, **kwargs):                     # a JSON value back
        return {"tag": self.tag, "kwargs": kwargs, "calls": self.calls}

    def fail(self, message: str = "boom"):
        raise ValueError(message)

    def sleep(self, seconds: float):
        time.sleep(seconds)
        return seconds

    def info(self):
        """Where this worker runs: pid, network namespace inode, cgroup lines."""
        with open("/proc/self/cgroup") as f:
            cg = f.read().splitlines()
        return {"pid": os.getpid(), "netns": os.readlink("/proc/self/ns/net"), "cgroup": cg, "tag": self.tag}

    def burn(self, seconds: float):
        """Spin for `seconds` of wall time; returns the CPU seconds obtained (quota check)."""
        t0, c0 = time.monotonic(), time.process_time()
        x = np.float64(0)
        while time.monotonic() - t0 < seconds:
            for _ in range(2000):
                x += 1.0
        return {"wall_s": time.monotonic() - t0, "cpu_s": time.process_time() - c0}


def make_echo(tag: str = "") -> Echo:
    return Echo(tag)


def make_broken():
    raise RuntimeError("factory refuses on purpose")
