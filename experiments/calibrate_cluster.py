"""Emulated-cluster calibration app (docs/cluster.md "Profiles"): measure each emulated device's layer variants on its
quota-limited worker and fit the Voltron planner's latency regression on them (Voltron §4.2.1).

    python -m experiments.calibrate cluster=office_emu model=smollm2_135m profile_points=48
    (`experiments.calibrate` hands any command line with `cluster=` to this app.)

Writes `metrics.json` (measured: profile points, wall time, the regression's held-out accuracy / MAPE / R², per phase),
`profile.csv` (every measured variant with the fitted model's prediction) into the run directory, and stores the
profile under `outputs/hil/cluster/` where `experiments.validate cluster=…` finds it.
"""
from __future__ import annotations

import os
import sys
import time

import hydra
from omegaconf import DictConfig

from experiments.common import (
    ConfigError,
    Estimate,
    int_in,
    one_line_errors,
    precheck,
    prepare_run_dir,
    run_dir,
    strict_bool,
    typed,
    watch_parent,
    write_run_outputs,
)
from experiments.multidevice import register
from experiments.resume import resumable

OUTPUTS = ["profile.csv", "config.yaml"]
MEASURED_KEYS = ["profile_points_total", "profile_s", "latency_model_accuracy", "latency_model_mape",
                 "latency_model_r2", "latency_model_mape_prefill", "latency_model_mape_decode", "held_out_points",
                 "median_time_s_per_device"]
INPUT_KEYS = ["cores"]          # the devices' CPU quotas, derived from the cluster config


def inputs(cfg: DictConfig):
    """The keys both cluster apps share (this one and `validate_cluster`), typed and checked: (model, cluster,
    planner, profile_points, seed, remeasure, port, profile_dir)."""
    from planner.voltron.devices import ClusterSpec
    from planner.voltron.policy import PlannerConfig
    from quant.arch import ModelSpec

    for k in ("profile_points", "seed", "remeasure", "port"):
        if k not in cfg:
            raise ConfigError(f"{k}: missing top-level key")
    points = int_in(cfg.profile_points, "profile_points", 4, 1000)
    seed = int_in(cfg.seed, "seed", 0, 2**32 - 1)
    port = int_in(cfg.port, "port", 1024, 65535)
    remeasure = strict_bool(cfg.remeasure, "remeasure")
    spec = typed(cfg.model, ModelSpec, "model")
    cluster = typed(cfg.cluster, ClusterSpec, "cluster")
    if cluster.emulation is None:
        raise ConfigError(f"cluster: {cluster.name} has no `emulation` block; use an emulated cluster "
                          f"(e.g. cluster=office_emu)")
    real_weights(spec)
    pcfg = typed(cfg.planner, PlannerConfig, "planner")
    pdir = cfg.get("profile_dir")
    if pdir is not None and (not isinstance(pdir, str) or not pdir.strip()):
        raise ConfigError(f"profile_dir: a directory path or null (got {pdir!r})")
    if (short := fit_short(len(cluster.devices), points, seed)) is not None:
        least = next((n for n in range(points + 1, 1001) if fit_short(len(cluster.devices), n, seed) is None), 1000)
        raise ConfigError(f"profile_points: {points} per (device, precision, phase) leave the latency fit fewer than "
                          f"{FIT_MIN} points for {short} in its seeded 80 % split (seed {seed}); use "
                          f"profile_points >= {least}")
    return spec, cluster, pcfg, points, seed, remeasure, port, pdir


FIT_MIN = 4     # points per (device, precision, phase) planner.voltron.latency.LatencyModel.fit needs


def fit_short(n_devices: int, points: int, seed: int) -> str | None:
    """The (device, precision, phase) cell the latency fit would get fewer than FIT_MIN points for, from the same
    seeded split `context_from_profile` makes of the rows `profile_cluster` measures (`points` per cell, in order);
    None when every cell has enough. Known before anything is measured."""
    import numpy as np

    from planner.voltron.devices import PRECISIONS
    from planner.voltron.latency import PHASES, Profile, split

    cells = np.array([(d, p, ph) for d in range(n_devices) for p in range(len(PRECISIONS)) for ph in range(2)
                      for _ in range(points)], dtype=np.int64).reshape(-1, 3)
    z = np.zeros(len(cells))
    train, _ = split(Profile(cells[:, 0], cells[:, 1], cells[:, 2], z, z, z, np.zeros((len(cells), 4)), z), seed=seed)
    for d in range(n_devices):
        for p in range(len(PRECISIONS)):
            for ph in range(2):
                if int(((train.device == d) & (train.prec == p) & (train.phase == ph)).sum()) < FIT_MIN:
                    return f"device {d} {PRECISIONS[p]} {PHASES[ph]}"
    return None


def real_weights(spec) -> int:
    """The emulated cluster's workers run the model's real weights: its GGUF must be installed here. Returns the
    model's context length in tokens (the GGUF's `<arch>.context_length`)."""
    from quant.arch import WeightSource
    from quant.gguf_model import gguf_path

    if spec.weights != WeightSource.real:
        raise ConfigError(f"model: {spec.name} has no weights on this machine (a statistical twin); the emulated "
                          f"cluster runs real weights (e.g. model=smollm2_135m)")
    path = gguf_path(spec)
    if not path.is_file():
        raise ConfigError(f"model.gguf_file: {path} not found")
    import gguf

    try:
        fields = gguf.GGUFReader(str(path)).fields
        key = next(k for k in fields if k.endswith(".context_length"))
        return int(fields[key].parts[fields[key].data[0]][0])
    except Exception as e:                      # unreadable or without the key: the loader names the problem
        raise ConfigError(f"model.gguf_file: {path}: no readable context_length ({type(e).__name__})") from None


def check_machine() -> None:
    """What an emulated cluster needs of this machine (root; a cgroup hierarchy with the cpu controller)."""
    if os.geteuid() != 0:
        raise ConfigError("cluster: the emulated cluster needs root (ip netns, tc, cgroups); run as root")
    from hil.cluster.cgroup import detect_cpu_controller

    if detect_cpu_controller() is None:
        raise ConfigError("cluster: no cgroup hierarchy with the cpu controller is mounted (CPU quotas)")


def validate(cfg: DictConfig) -> Estimate:
    _, _, _, points, *_ = inputs(cfg)
    check_machine()
    return Estimate(20.0 + 0.3 * points * 6, 1.0e9, "profile_points", f"profile_points={points}")


register()
GROUPS = {"cluster": None, "model": None, "planner": None}


@hydra.main(config_path="../conf", config_name="calibrate_cluster", version_base="1.3")
@resumable(expected=("latency_model_accuracy",))
@one_line_errors
def main(cfg: DictConfig) -> None:
    import numpy as np
    import pandas as pd

    from hil.cluster.profiler import profile_cluster
    from hil.cluster.session import ProfileStore, start_workers
    from planner.voltron.devices import PRECISIONS, Cluster, emulated_cluster, load_device
    from planner.voltron.latency import PHASES
    from planner.voltron.layers import TYPES, layer_table
    from planner.voltron.registry import context_from_profile
    from quant.atomic import atomic_write_text

    watch_parent()
    spec, cspec, pcfg, points, seed, remeasure, port, pdir = inputs(cfg)
    out = run_dir()
    prepare_run_dir(out, OUTPUTS)
    cluster, cores = emulated_cluster(Cluster(cspec, [load_device(d) for d in cspec.devices]))
    store = ProfileStore(cluster, cores, spec.name, pdir)
    table = layer_table(spec, pcfg.ffn_shards)
    t0 = time.monotonic()
    prof = None if remeasure else store.load(points)
    store_new = prof is None
    if prof is None:
        emu, handles = start_workers(cluster, cores, spec.name, cspec.emulation.cfs_period_ms / 1e3, port=port)
        try:
            prof = profile_cluster([h.client for h in handles], table, points=points, seed=seed)
        finally:
            emu.close()
    profile_s = time.monotonic() - t0
    ctx, acc = context_from_profile(spec, cluster, pcfg, prof, seed)      # fitted first: a profile the fit cannot
    if store_new:                                                          # use is never stored
        store.save(prof, points, seed, {"cores": cores.tolist()})
    pred = ctx.latency.predict(prof)
    df = pd.DataFrame({"device": [cluster.devices[d].name for d in prof.device],
                       "cores": cores[prof.device], "precision": [PRECISIONS[p] for p in prof.prec],
                       "phase": [PHASES[p] for p in prof.phase], "type": [TYPES[t] for t in prof.ltype],
                       "n_tokens": prof.n_tokens, "kv_len": prof.kv_len, "measured_s": prof.time_s,
                       "fitted_s": pred, "rel_err": (pred - prof.time_s) / prof.time_s})
    atomic_write_text(out / "profile.csv", df.to_csv(index=False))
    m = {"profile_points_total": int(len(prof.time_s)), "profile_s": profile_s, "store": str(store.dir),
         "latency_model_accuracy": acc["accuracy"], "latency_model_mape": acc["mape"], "latency_model_r2": acc["r2"],
         "latency_model_mape_prefill": acc["mape_prefill"], "latency_model_mape_decode": acc["mape_decode"],
         "cores": [float(c) for c in cores], "held_out_points": acc["n_points"],
         "median_time_s_per_device": [float(np.median(prof.time_s[prof.device == d])) for d in range(cluster.n)]}
    write_run_outputs(out, cfg, m, measured=MEASURED_KEYS, modelled=[], inputs=INPUT_KEYS)
    print(f"{cspec.name}/{spec.name}: {m['profile_points_total']} measured variants in {profile_s:.1f} s; latency "
          f"model held-out accuracy {100 * acc['accuracy']:.1f} % (MAPE prefill {100 * acc['mape_prefill']:.1f} %, "
          f"decode {100 * acc['mape_decode']:.1f} %) -> {out / 'metrics.json'}")


if __name__ == "__main__":
    precheck("calibrate_cluster", sys.argv[1:], validate, GROUPS)
    main()
