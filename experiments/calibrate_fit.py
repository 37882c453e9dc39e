"""The host profile as the apps use it (docs/hil.md "Host profile"): the stored calibration of this machine, or a new
one measured, fitted and stored. The one step of a calibration that needs the simulator lives here, beside `sim/`,
because hil/ never imports sim/: `hil.host.measure` returns the measurements mapped onto a device profile and a host
runtime model (`planner.host_runtime`), `fit_read_overlaps` fits the runtime's read overlap with the simulator's read
model, `hil.host.store` writes the result. Used by `experiments.calibrate` and `experiments.validate`.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable

from hil import host as hil_host
from hil.calibrate_reads import remove_stale_scratch
from hil.calibrate_settings import CalibrationSettings
from hil.host import (
    DEFAULT_ROOT,
    Calibration,
    HostProfile,
    load_stored,
    marker_store,
    measure,
    store,
    store_lock,
)
from hil.timing import timing_lock
from planner.cost.analytic import AnalyticCostModel
from planner.device import SocProfile
from planner.host_runtime import HostRuntime
from planner.plan import Plan, PlanBuilder, TensorRef
from sim.executor import simulate


def simulated_read_s(prof: SocProfile, rt: HostRuntime, size: int, blob: int, request: int, readers: int) -> float:
    """Simulated wall time of the calibration's cold read: `readers` loader threads reading `size` bytes in
    `blob`-byte fresh buffers, `request`-byte requests (sim.executor, the profile's and the runtime's read model)."""
    b = PlanBuilder()
    for k, off in enumerate(range(0, size, blob)):        # bound to the file's byte ranges, as a runner's plan is,
        n = min(blob, size - off)                         # so the kernel's readahead is modelled as in a plan
        b.add(f"read{k}", "load", read_bytes=n, request_bytes=request, mem_alloc=n,
              tensors=[TensorRef(f"scratch{k}", off, n)])
    plan = Plan("read", "scratch", prof.name, 1, 0, b.tasks, loader_threads=readers)
    return simulate(plan, prof, AnalyticCostModel(prof), runtime=rt).end_s


def _bisect(fn: Callable[[float], float], target: float, lo: float, hi: float, falling: bool) -> float:
    """x in [lo, hi] with fn(x) = target, fn monotone (falling or rising in x); clipped to the ends."""
    for _ in range(30):
        mid = (lo + hi) / 2
        if (fn(mid) < target) == falling:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def fit_read_overlaps(cal: Calibration) -> None:
    """`read_cpu_overlap` (one reader) and `read_cpu_overlap_multi` (two at once) as the simulator needs them: the
    share at which its read model (sim.executor: device shared by the readers, CPU side on the cores, the part that
    does not overlap after) reproduces the measured wall time of the calibration's cold reads into fresh buffers.
    The closed form max(T, C) + (1 - eta) min(T, C) with measured T, C (hil.host.put_memory_touch, kept in the
    sources) assumes the device stays busy while a reader copies; with two readers it does not in the simulator (one
    reader's exposed part gives the other the whole device), so the closed form would make two readers too fast.
    Bisection on eta in [0, 1]. Two fresh readers of one file together can be slower than the simulator's
    no-overlap bound (eta = 0); that rest is not modelled (docs/hil.md "Host profile"). Updates `cal.runtime` and
    `cal.fields` in place."""
    m, f, prof = cal.meas, cal.fields, cal.device
    cr, s = m.cold_read, m.settings
    size, blob, req = s.scratch_bytes, s.overlap_blob_bytes, int(m.bulk_request_bytes)
    targets = [("read_cpu_overlap", 1, cr.fresh_wall.median * size)]
    if cr.fresh_wall_2 is not None:
        targets.append(("read_cpu_overlap_multi", 2, cr.fresh_wall_2.median * size))
    rt = cal.runtime
    for key, readers, target in targets:
        closed = float(f.values.get(key, rt.read_overlap(readers)))

        def t(eta: float, key=key, readers=readers) -> float:
            return simulated_read_s(prof, dataclasses.replace(rt, **{key: eta}), size, blob, req, readers)

        how = (f"fitted: the share at which the simulator's read of the calibration file ({size >> 20} MiB, "
               f"{readers} reader(s), {blob >> 20} MiB fresh buffers, {req >> 10} KiB requests) takes the measured "
               f"{target * 1e3:.1f} ms (experiments.calibrate_fit.fit_read_overlaps; clipped to [0, 1]: at 0 it "
               f"takes {t(0.0) * 1e3:.1f} ms, at 1 {t(1.0) * 1e3:.1f}); closed form {closed:.3f}. ")
        if t(1.0) >= target:
            eta = 1.0
        elif t(0.0) <= target:
            eta = 0.0
        else:
            eta = _bisect(t, target, 0.0, 1.0, falling=True)
        f.sources[key] = how + f.sources.get(key, "")
        f.values[key] = eta
        rt = dataclasses.replace(rt, **{key: eta})
    cal.runtime = rt


def host_profile(root: str | os.PathLike | None = None, remeasure: bool = False, quick: bool = False,
                 log: Callable[[str], None] = print, progress: Callable[[str], None] = lambda m: None,
                 rounds: int | None = None, memory: str = "hold", huge: bool = True) -> HostProfile:
    """This machine's profile: the stored full one when its identity, `memory` mode and `huge` (fresh memory on
    transparent huge pages) match (with `quick`, else the stored quick one), otherwise measured now (a quick
    calibration with `quick`; `rounds` passes, None: 3 full, 1 quick; free page reporting held or not by `memory`,
    hil.hostmem), fitted and stored. A store of another version is a ValueError that says to recalibrate (unless
    `remeasure`). Prints one line (`log`) saying which."""
    root = Path(root or DEFAULT_ROOT)
    remove_stale_scratch(root / "scratch")             # a killed run's 32-256 MiB scratch file (docs/hil.md)
    ident = hil_host.host_identity()
    # the machine's timing lock first, then the store's (always in this order: validate holds the first around its
    # whole run); a calibration is a timing run (hil.timing)
    with timing_lock(f"calibrate {root}"), store_lock(root):
        if remeasure:
            why = "remeasure requested"
        else:
            got, d, why = load_stored(root, ident, quick, memory, huge)
            if got is not None:
                log(f"host profile: loaded {d} (identity {ident.id_hash()} matches this machine)")
                return got
        prof, wall = measure_and_store(root, ident, quick, progress, rounds=rounds, memory=memory, huge=huge)
        n = CalibrationSettings.make(quick, rounds).rounds
        log(f"host profile: measured this host ({why}; {'quick' if quick else 'full'} calibration, "
            f"{f'{n} rounds merged, ' if n > 1 else ''}{wall:.1f} s) -> {prof.cost_table.parent}")
        return prof


def measure_and_store(root: Path, ident, quick: bool, log: Callable[[str], None] = lambda m: None,
                      rounds: int | None = None, memory: str = "hold", huge: bool = True) -> tuple[HostProfile, float]:
    """Calibrate this host (`hil.host.measure`), fit its read overlap (`fit_read_overlaps`) and store it
    (`hil.host.store`): (the stored profile, the calibration's wall s)."""
    cal = measure(root, ident, quick, log, rounds=rounds, memory=memory, huge=huge)
    fit_read_overlaps(cal)
    return store(root, ident, cal, memory), cal.wall_s


def host_from_marker(device: dict, quick: bool = False, remeasure: bool = False,
                     log: Callable[[str], None] = print, progress: Callable[[str], None] = lambda m: None,
                     rounds: int | None = None, memory: str = "hold", huge: bool = True) -> HostProfile:
    """The profile for a `device=host` marker dict (keys: name, measured, store; `hil.host.marker_store`);
    ValueError naming the key for anything else. `memory`: hil.hostmem mode of a calibration (and of a stored
    profile); `huge`: the runner's fresh memory on transparent huge pages (hil.runner_state.huge_pages)."""
    return host_profile(marker_store(device), remeasure=remeasure, quick=quick, log=log, progress=progress,
                        rounds=rounds, memory=memory, huge=huge)
