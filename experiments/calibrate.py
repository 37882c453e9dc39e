"""Host calibration app (docs/hil.md "Host profile"): measure this machine as a cold-start device.

    python -m experiments.calibrate device=host               # full calibration (a few minutes on 2 cores)
    python -m experiments.calibrate device=host quick=true    # < 30 s, smaller files and grids
    python -m experiments.calibrate remeasure=false           # reuse this machine's stored profile if it exists
    python -m experiments.calibrate rounds=5                  # passes merged figure by figure (default 3; quick 1)
    python -m experiments.calibrate host_memory=as_is         # leave the VM's free page reporting alone (hil.hostmem)
    python -m experiments.calibrate change_system=true        # hold it: page_reporting_order set, restored after
    python -m experiments.calibrate huge_pages=false          # runner memory on 4 KiB pages (a profile apart)
    python -m experiments.calibrate cluster=office_emu        # an emulated cluster's devices (calibrate_cluster.py)

Runs `experiments.calibrate_fit.host_from_marker` (measurements in `hil.calibrate`, mapped by `hil.host`, the read
overlap fitted with the simulator), which stores the profile under `outputs/hil/host/<identity hash>/` (device.json,
runtime.json, cost_table.json, identity.json, measurements.json). The run directory gets `metrics.json` (every field
of the device profile as `device.<field>` and of the host runtime model as `runtime.<field>`: measured ones under
measured_keys, fitted / assumed / by-construction ones under input_keys; the read and GEMM curves, unpack rates),
`read_bandwidth.png`, `gemm_gops.png` and `config.yaml`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from experiments.common import (
    ConfigError,
    Estimate,
    fail,
    one_line_errors,
    precheck,
    prepare_run_dir,
    register_common,
    run_dir,
    strict_bool,
    write_run_outputs,
)
from experiments.resume import resumable

register_common()
GROUPS = {"device": lambda: ["host"]}
PLOTS = ("read_bandwidth.png", "gemm_gops.png")
# Modelled estimate of one calibration (measured wall times of this app on this 2-core host, docs/hil.md).
EST = {True: Estimate(15.0, 0.4e9, "quick", "quick=true"), False: Estimate(90.0, 1.2e9, "quick", "quick=false")}


def _device(cfg: DictConfig) -> dict:
    dev = OmegaConf.to_container(cfg.device, resolve=True)
    from hil.host import is_host_marker

    if not is_host_marker(dev):
        name = dev.get("name", "?") if isinstance(dev, dict) else "?"
        raise ConfigError(f"device: calibrate measures this machine; use device=host (got {name})")
    return dev


def validate(cfg: DictConfig) -> Estimate:
    """All checks before any work: the device marker and the two switches. Returns the modelled estimate."""
    dev = _device(cfg)
    extra = sorted(set(dev) - {"name", "measured", "store"})
    if extra:
        raise ConfigError(f"device.{extra[0]}: not a key of the measured host device; its values are measured")
    quick = strict_bool(cfg.quick, "quick")
    strict_bool(cfg.remeasure, "remeasure")
    memory_of(cfg)
    strict_bool(cfg.get("huge_pages", True), "huge_pages")
    strict_bool(cfg.get("change_system", False), "change_system")
    from hil.calibrate_settings import CalibrationSettings

    n = CalibrationSettings.make(quick, rounds_of(cfg)).rounds
    est = EST[quick]
    return Estimate(est.seconds * n, est.bytes, est.key, f"{est.what}, rounds={n}")


def memory_of(cfg: DictConfig) -> str:
    """`host_memory`: hold (the default) or as_is (hil.hostmem)."""
    from hil.hostmem import MODES

    v = cfg.get("host_memory", "hold")
    if v not in MODES:
        raise ConfigError(f"host_memory: must be {' or '.join(MODES)} (got {v!r})")
    return str(v)


def rounds_of(cfg: DictConfig) -> int | None:
    """`rounds`: None (the default: 3 for a full calibration, 1 for a quick one) or an integer >= 1."""
    r = cfg.get("rounds")
    if r is None:
        return None
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ConfigError(f"rounds: must be an integer >= 1 or null (got {r!r})")
    return int(r)


def _plots(meas: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for th in sorted({r["threads"] for r in meas["reads"]}):
        rows = sorted((r for r in meas["reads"] if r["threads"] == th), key=lambda r: r["request_bytes"])
        ax.errorbar([r["request_bytes"] / 1024 for r in rows], [r["gbps"] for r in rows],
                    yerr=[[r["gbps"] - r.get("gbps_min", r["gbps"]) for r in rows],
                          [r.get("gbps_max", r["gbps"]) - r["gbps"] for r in rows]],
                    marker="o", capsize=3, label=f"{th} reader{'s' if th > 1 else ''}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("request size (KiB)")
    ax.set_ylabel("cold read GB/s (measured)")
    ax.set_title("Cold pread bandwidth, page cache evicted (median, bar = min..max)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "read_bandwidth.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (k, n, th) in sorted({(r["k"], r["n"], r["threads"]) for r in meas["gemm"]}):
        rows = sorted((r for r in meas["gemm"] if (r["k"], r["n"], r["threads"]) == (k, n, th)), key=lambda r: r["m"])
        ax.plot([r["m"] for r in rows], [r["gops"] for r in rows], marker=".", ls="-" if th == 1 else "--",
                label=f"{k}->{n}, {th}t")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (tokens)")
    ax.set_ylabel("INT8 GEMM GOP/s (measured)")
    ax.set_title(f"INT8 GEMM vs M ({meas['kernels']})")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "gemm_gops.png", dpi=110)
    plt.close(fig)


def metrics_of(device_doc: dict, runtime_doc: dict, meas: dict, store: Path, table: Path, peers_doc: dict | None = None
               ) -> tuple[dict[str, Any], list[str], list[str]]:
    """Flat metrics: (metrics, measured keys, input keys). `peers_doc`: the store's peers.json (None: none, or the
    older layout's peer fields inside `device_doc`, reported as peers.* all the same)."""
    from hil.host import PEERS_FILE, peer_parts

    parts = {"device.json": json.loads(json.dumps(device_doc))} | ({PEERS_FILE: peers_doc} if peers_doc else {})
    peers_doc = peer_parts(parts)                   # the older layout's fields out of the device profile
    device_doc = parts["device.json"]
    m: dict[str, Any] = {"profile_dir": str(store), "cost_table": str(table), "kernels": meas["kernels"],
                         "cpu_model": device_doc["profile"]["soc"]}
    measured, inputs = [], []
    for prefix, doc, part in (("device", device_doc, "profile"), ("runtime", runtime_doc, "runtime"),
                              ("peers", peers_doc, "peers")):
        for k, v in doc[part].items():
            if isinstance(v, str):
                continue
            key = f"{prefix}.{k}"
            if isinstance(v, dict):              # per-key rates (llamacpp_gemm_gops_per_ghz): one metric each
                m |= {f"{key}.{kk}": vv for kk, vv in v.items()}
                src = doc["sources"].get(k, "")
                (measured if src.startswith("measured") else inputs).extend(f"{key}.{kk}" for kk in v)
                continue
            m[key] = float(v) if isinstance(v, bool) else v
            src = doc["sources"].get(k, "")
            (measured if src.startswith("measured") else inputs).append(key)
            if k in doc.get("spread", {}):
                m[f"{key}.spread"] = doc["spread"][k]
                measured.append(f"{key}.spread")
    m["calibration_wall_s"] = device_doc["wall_s"]
    m["quick"] = float(device_doc["quick"])
    m["rounds"] = int(device_doc.get("rounds", 1))
    inputs.append("rounds")
    mem = device_doc.get("host_memory") or {}
    m["host_page_reporting"] = mem.get("state", "as is")
    m["huge_pages"] = float(bool(device_doc.get("huge_pages", False)))
    inputs.append("huge_pages")
    if mem.get("reported_mib") is not None:
        m["host_pages_reported_mib"] = mem["reported_mib"]
        measured.append("host_pages_reported_mib")
    measured.append("calibration_wall_s")
    for i, span in enumerate(("1min", "5min", "15min")):          # other work on the shared host while measuring
        m[f"loadavg_{span}"] = device_doc.get("loadavg", [0.0] * 3)[i]
        measured.append(f"loadavg_{span}")
    inputs.append("quick")
    for r in meas["reads"]:
        key = f"cold_read_gbps.{r['threads']}t.{r['request_bytes']}B"
        m[key] = r["gbps"]
        measured.append(key)
    for r in meas["gemm"]:
        key = f"gemm_gops.{r['threads']}t.m{r['m']}.k{r['k']}.n{r['n']}"
        m[key] = r["gops"]
        measured.append(key)
    for r in meas["unpack"]:
        key = f"unpack_gweights_per_s.{r['fmt']}.b{r['bits']}.{r['threads']}t"
        m[key] = 1e-9 / r["s_per_weight"]
        measured.append(key)
    for name, s in meas["wall_s"].items():
        m[f"wall_s.{name}"] = s
        measured.append(f"wall_s.{name}")
    return m, measured, inputs


@resumable(expected=())
@one_line_errors
def run(cfg: DictConfig) -> dict[str, Any]:
    validate(cfg)
    dev = _device(cfg)
    out = run_dir()
    prepare_run_dir(out, ["config.yaml", *PLOTS])
    from experiments.calibrate_fit import host_from_marker
    from hil.hostmem import hold

    try:
        # the hold a calibration takes inside (hil.host.measure) is this one: system settings only with the opt-in
        with hold(memory_of(cfg), change_system=strict_bool(cfg.get("change_system", False), "change_system")) as mem:
            if mem.state.startswith("not held"):
                print(f"host memory: free page reporting {mem.state}", file=sys.stderr)
            host = host_from_marker(dev, quick=strict_bool(cfg.quick, "quick"),
                                    remeasure=strict_bool(cfg.remeasure, "remeasure"),
                                    progress=lambda msg: print(msg, file=sys.stderr), rounds=rounds_of(cfg),
                                    memory=memory_of(cfg), huge=strict_bool(cfg.get("huge_pages", True), "huge_pages"))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    prof, table = host.device, host.cost_table
    store = table.parent
    from hil.calibrate_peer import peer_step, store_link  # llama.cpp's own costs (only with the peer extra)

    peer_step(store, strict_bool(cfg.remeasure, "remeasure"), strict_bool(cfg.quick, "quick"),
              log=lambda msg: print(msg, file=sys.stderr))
    from hil.calibrate_mnn import mnn_step  # MNN's own costs (only with the mnn extra and converted models)

    mnn_step(store_link(store).resolve(), strict_bool(cfg.remeasure, "remeasure"), strict_bool(cfg.quick, "quick"),
             log=lambda msg: print(msg, file=sys.stderr))
    store = store_link(store).resolve()             # a measuring step rewrote the store whole (a new version)
    table = store / table.name
    from hil.host import PEERS_FILE

    device_doc = json.loads((store / "device.json").read_text())
    runtime_doc = json.loads((store / "runtime.json").read_text())
    # llama.cpp's and MNN's own costs, where measured (the older layout keeps them inside device.json)
    peers_doc = json.loads((store / PEERS_FILE).read_text()) if (store / PEERS_FILE).is_file() else None
    meas = json.loads((store / "measurements.json").read_text())
    _plots(meas, out)
    metrics, measured, inputs = metrics_of(device_doc, runtime_doc, meas, store, table, peers_doc)
    write_run_outputs(out, cfg, metrics, measured=measured, modelled=[], inputs=inputs)
    print(f"host {prof.soc}: cold read {prof.flash_peak_gbps:.2f} GB/s, copy {prof.cpu_copy_gbps:.1f} GB/s, "
          f"INT8 GEMM {prof.npu_int8_tops * 1e3:.0f} GOP/s/core, dispatch {prof.npu_dispatch_s * 1e6:.0f} us "
          f"(measured) -> {out}")
    return metrics


@hydra.main(config_path="../conf", config_name="calibrate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    if any(a.split("=", 1)[0].lstrip("+~") == "cluster" for a in sys.argv[1:]):
        # an emulated cluster's device profiles: its own app, run as __main__ (Hydra resolves conf/ relative to the
        # main module)
        import runpy
        runpy.run_module("experiments.calibrate_cluster", run_name="__main__", alter_sys=True)
    else:
        from hil.timing import parallel_launcher

        if (why := parallel_launcher("calibrate", sys.argv[1:])) is not None:
            fail(why)
        precheck("calibrate", sys.argv[1:], validate, GROUPS)
        main()
