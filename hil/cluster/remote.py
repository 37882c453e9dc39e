"""A device worker seen through RPC with the `ShardWorker` method signatures (docs/cluster.md).

The RPC of `hil.cluster.transport` calls `obj.<method>(*arrays, **kwargs)`; the executors' methods mix scalars and
arrays positionally (`attn(layer, h, pos0)`). `RemoteWorker` turns any positional call into one `invoke` RPC: arrays
travel as raw frames, the other arguments in the JSON header with a layout saying where each goes; the served object
(`Invokable`) rebuilds the call. So the `Coordinator` drives local executors and remote workers with the same code.
"""
from __future__ import annotations

import numpy as np


class Invokable:
    """Mixin of served objects: `invoke(*arrays, fn=, layout=)` → `self.<fn>(*args)`."""

    def invoke(self, *arrays, fn: str, layout: list):
        if not isinstance(fn, str) or fn.startswith("_") or fn == "invoke":
            raise AttributeError(f"invoke: no method {fn!r}")
        name, fn = fn, getattr(self, fn, None)
        if not callable(fn):
            raise AttributeError(f"invoke: {type(self).__name__} has no method {name!r}")
        args = [arrays[a["a"]] if "a" in a else a["v"] for a in layout]
        return fn(*args)


def _jsonable(v):
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


class RemoteWorker:
    """Proxy of one worker: `proxy.attn(layer, h, pos0)` → `client.call("invoke", h, fn="attn", layout=…)`."""

    def __init__(self, client):
        self.client = client

    def last_compute_s(self) -> float:
        """The worker's own seconds of this thread's last call (`RpcClient.last_server_s`): compute, not messages."""
        return self.client.last_server_s()

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args):
            arrays, layout = [], []
            for a in args:
                if isinstance(a, np.ndarray):
                    layout.append({"a": len(arrays)})
                    arrays.append(np.ascontiguousarray(a))
                else:
                    layout.append({"v": _jsonable(a)})
            return self.client.call("invoke", *arrays, fn=method, layout=layout)

        return call
