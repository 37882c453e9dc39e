"""An emulated Voltron cluster with its model workers, and the measured profiles of its devices (docs/cluster.md).

Owns:
- `start_workers`: one `hil.cluster.profiler.ProfilingWorker` per device of an emulated cluster
  (`planner.voltron.devices.emulated_cluster`: CPU quota per device scaled from its spec-sheet sustained INT8 rate,
  the emulated memory budget), in its own network namespace and cgroup (`EmulatedCluster`); returns the cluster and
  one `RemoteWorker` per device (what the `Coordinator` drives).
- `ProfileStore`: measured layer profiles of a (cluster, model) on this machine, stored under
  `outputs/hil/cluster/<cluster>_<model>_<host id>/` (profile.npz + meta.json); a profile measured on another machine
  or with other quotas is not reused.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np

from hil.cluster.cluster import DeviceEmu, EmulatedCluster
from hil.cluster.remote import RemoteWorker
from planner.voltron.devices import Cluster
from planner.voltron.latency import Profile
from quant.arch import check_name
from quant.atomic import atomic_write_json

REPO = Path(__file__).resolve().parents[2]
DEFAULT_ROOT = REPO / "outputs" / "hil" / "cluster"
WORKER_FACTORY = "hil.cluster.profiler:make_worker"


def start_workers(cluster: Cluster, cores: np.ndarray, model: str, period_s: float, port: int = 5555,
                  call_timeout_s: float = 300.0) -> tuple[EmulatedCluster, list[RemoteWorker]]:
    """Start the emulated cluster (`cluster` carries the emulated budgets, `cores` the (D,) quotas). Workers start at a
    full core each (Python imports, reading the model file: set-up, not the device's speed) and get their device's
    quota once they answer."""
    devs = [DeviceEmu(name=f"d{i}-{d.name}"[:24], cpu_cores=1.0, factory=WORKER_FACTORY,
                      factory_args={"model": model, "device_index": i, "budget_bytes": float(d.mem_budget_bytes),
                                    "period_s": float(period_s)},
                      cpu_period_us=int(round(period_s * 1e6)))
            for i, d in enumerate(cluster.devices)]
    emu = EmulatedCluster(port=port, call_timeout_s=call_timeout_s)
    clients = emu.start(devs)
    try:
        for i, c in enumerate(cores):
            emu.set_cpu(i, float(c))
    except BaseException:
        emu.close()
        raise
    return emu, [RemoteWorker(c) for c in clients]


def identity_key(cluster: Cluster, cores: np.ndarray, model: str) -> tuple[str, dict]:
    """(short hash, identity document) of what a measured profile depends on: this machine, the devices' quotas and
    budgets, the model."""
    from hil.host import host_identity

    ident = {"host": asdict(host_identity()), "cluster": cluster.spec.name, "model": model,
             "devices": [d.name for d in cluster.devices], "cores": [round(float(c), 4) for c in cores],
             "budgets": [float(d.mem_budget_bytes) for d in cluster.devices],
             "period_ms": cluster.spec.emulation.cfs_period_ms if cluster.spec.emulation else None}
    text = json.dumps(ident, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12], json.loads(text)     # JSON form: compares with stored


class ProfileStore:
    def __init__(self, cluster: Cluster, cores: np.ndarray, model: str, root: str | os.PathLike | None = None):
        key, self.identity = identity_key(cluster, cores, model)
        base = Path(root or DEFAULT_ROOT).resolve()
        # both names become one directory name: the model.name rule (no separators, no '..'), then checked in place
        name = f"{check_name(cluster.spec.name, 'cluster.name')}_{check_name(model, 'model.name')}_{key}"
        self.dir = base / name
        if self.dir.resolve().parent != base:
            raise ValueError(f"cluster.name: profile store {self.dir} would be outside {base}")

    def load(self, points: int) -> Profile | None:
        """The stored profile if it exists with at least `points` per (device, precision, phase), else None."""
        meta, npz = self.dir / "meta.json", self.dir / "profile.npz"
        if not (meta.is_file() and npz.is_file()):
            return None
        doc = json.loads(meta.read_text())
        if doc.get("identity") != self.identity or int(doc.get("points", 0)) < points:
            return None
        z = np.load(npz)
        return Profile(**{k: z[k] for k in ("device", "prec", "phase", "ltype", "n_tokens", "kv_len", "x", "time_s")})

    def save(self, prof: Profile, points: int, seed: int, extra: dict) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".profile.{os.getpid()}.npz"
        np.savez(tmp, **asdict(prof))
        os.replace(tmp, self.dir / "profile.npz")
        atomic_write_json(self.dir / "meta.json", {"identity": self.identity, "points": points, "seed": seed,
                                                   "measured": True, **extra})
        return self.dir
