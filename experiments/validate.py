"""Host hardware-in-the-loop validation app (docs/hil.md): predict a cold start, run it for real, report the error.

    python -m experiments.validate device=host model=smollm2_135m framework=edgeflow bits=5 prompt_tokens=128 repeats=5
    python -m experiments.validate -m framework=edgeflow,llamacpp,mnn,llmnpu_plus      # + speedups.csv in the sweep dir
    python -m experiments.validate peer=llamacpp                 # + llama.cpp's cold TTFT (interleaved with ours)
    python -m experiments.validate -m framework=llamacpp,mnn,llmnpu_plus versus=edgeflow
                                                                 # EdgeFlow's speed-up, its runs interleaved with each
    python -m experiments.validate cluster=office_emu planner=voltron trace=walk_away_disconnect turns=3
                                                                 # Voltron on the emulated cluster (validate_cluster.py)

Writes `metrics.json` (predicted_* modelled; measured_* measured: median, min, max over `repeats` cold runs; *_error_pct
= (predicted - measured) / measured), `ops.csv` (the same per op kind: summed span time and span CPU time, predicted
vs measured), `trace.json` (predicted and measured tracks side by side) and `plan.json` into the run directory. Jobs
of a sweep run one after the other (timing runs must not share the cores).
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from hydra.experimental.callback import Callback
from omegaconf import MISSING, DictConfig, OmegaConf

from experiments.common import (
    ConfigError,
    Estimate,
    fail,
    one_line_errors,
    precheck,
    prepare_run_dir,
    register_common,
    run_dir,
    typed,
    watch_parent,
    write_run_outputs,
)
from experiments.resume import resumable
from hil.hostmem import MODES as HOST_MEMORY_MODES
from hil.timing import parallel_launcher, timing_lock
from planner.framework import FrameworkSpec
from quant.arch import ModelSpec, WeightSource, model_spec
from quant.atomic import atomic_write_json, atomic_write_text
from quant.settings import QuantSettings

MAX_PROMPT = 1024       # tokens: KV cache and activations of a host run stay small; longer prompts are not validated
MAX_REPEATS = 50
PEER_GGUFS = ("q4_1", "q8_0", "q4_0", "q4_k_m")   # llama.cpp's weight files: Q8_0 and Q4_0 have its fast x86 prefill


@dataclass
class ValidateConfig:
    model: ModelSpec = MISSING
    framework: FrameworkSpec = MISSING
    quant: QuantSettings = field(default_factory=QuantSettings)
    device: Any = MISSING
    bits: int = 5
    prompt_tokens: int = 128
    repeats: int = 5
    warmup: int = 1
    peer: str = "none"
    peer_gguf: str = "q4_1"
    check_logits: bool = True
    remeasure: bool = False
    quick_profile: bool = False
    write_trace: bool = True
    host_memory: str = "hold"
    huge_pages: bool = True
    sched_trace: bool = False
    versus: str = "none"
    diagnostics: bool = False
    protocol: Any = None        # a set of conf/protocol/ (experiments.protocol); None: one configuration
    change_system: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= 8:
            raise ValueError(f"bits must be in 1..8 (got {self.bits})")
        if not 1 <= self.prompt_tokens <= MAX_PROMPT:
            raise ValueError(f"prompt_tokens must be in 1..{MAX_PROMPT} (got {self.prompt_tokens})")
        if not 1 <= self.repeats <= MAX_REPEATS:
            raise ValueError(f"repeats must be in 1..{MAX_REPEATS} (got {self.repeats})")
        if not 0 <= self.warmup <= 10:
            raise ValueError(f"warmup must be in 0..10 (got {self.warmup})")
        if self.peer not in ("none", "llamacpp"):
            raise ValueError(f"peer must be none or llamacpp (got {self.peer!r})")
        if self.peer_gguf not in PEER_GGUFS:
            raise ValueError(f"peer_gguf must be one of {', '.join(PEER_GGUFS)} (got {self.peer_gguf!r})")
        if self.host_memory not in HOST_MEMORY_MODES:
            raise ValueError(f"host_memory must be {' or '.join(HOST_MEMORY_MODES)} (got {self.host_memory!r})")


def register() -> None:
    register_common()
    cs = ConfigStore.instance()
    cs.store(group="quant", name="quant_schema", node=QuantSettings)
    cs.store(group="framework", name="framework_schema", node=FrameworkSpec)
    cs.store(name="validate_schema", node=ValidateConfig)


register()
GROUPS = {"model": None, "framework": None, "device": lambda: ["host"], "quant": None, "protocol": None}


def _host(cfg: DictConfig, remeasure: bool, quick: bool, memory: str, huge: bool):
    from experiments.calibrate_fit import host_from_marker

    doc = OmegaConf.to_container(cfg.device, resolve=True)
    try:
        return host_from_marker(doc, quick=quick, remeasure=remeasure, memory=memory, huge=huge)
    except ValueError as e:
        raise ConfigError(str(e)) from None


KEYS = ("bits", "prompt_tokens", "repeats", "warmup", "peer", "peer_gguf", "check_logits", "remeasure", "quick_profile",
        "write_trace", "host_memory", "huge_pages", "sched_trace", "versus", "diagnostics", "change_system")


def settings(cfg: DictConfig) -> ValidateConfig:
    """Typed settings; every check that needs no work (one line naming the key on bad input)."""
    from hil.host import is_host_marker

    doc = OmegaConf.to_container(cfg.device, resolve=True) if isinstance(cfg.device, DictConfig) else None
    if not is_host_marker(doc):
        name = doc.get("name") if isinstance(doc, dict) else doc
        raise ConfigError(f"device: validate runs plans on this machine: use device=host (got {name!r})")
    c = typed({k: cfg[k] for k in KEYS} | {"model": typed(cfg.model, ModelSpec, "model"),
                                           "framework": typed(cfg.framework, FrameworkSpec, "framework"),
                                           "quant": typed(cfg.quant, QuantSettings, "quant"), "device": "host"},
              ValidateConfig)
    if c.model.weights == WeightSource.twin:
        raise ConfigError(f"model: {c.model.name} has no weights on this machine (model.weights=twin); validate needs "
                          f"real or synthetic weights, e.g. model=smollm2_135m")
    if c.model.weights == WeightSource.real:
        from quant.gguf_model import check_gguf

        check_gguf(c.model)          # package name, file, shipped digest, header: one line naming model.gguf_*
    else:                            # a synthetic model's files are generated later: nothing may need what it lacks
        from experiments.hostrun import host_weight_file

        for key, fw in (("framework", c.framework), ("versus", None if c.versus == "none" else
                                                     versus_framework(c.versus))):
            if fw is not None and host_weight_file(fw)[0] != "edgeflow":
                raise ConfigError(f"{key}: {fw.name} reads per-channel INT8 weights quantized from a real model; "
                                  f"{c.model.name} is synthetic (packed with EdgeFlow's allocation only): use a "
                                  f"framework with an EdgeFlow recipe, e.g. framework=edgeflow, or model=smollm2_135m")
    if c.peer == "llamacpp":
        from hil.peer import INSTALL_HINT, available

        if not available():                                 # one line naming the install command, before any work
            raise ConfigError(f"peer: {INSTALL_HINT}")
    if c.versus != "none":
        versus_framework(c.versus)                          # an unknown name: one line, before any work
    if c.sched_trace:
        from hil.diagnostics.schedtrace import available as tracefs_missing

        if (why := tracefs_missing()) is not None:
            raise ConfigError(f"sched_trace: {why}")
    return c


def versus_framework(name: str) -> FrameworkSpec:
    """The framework config `conf/framework/<name>.yaml` as a FrameworkSpec (`versus=`: the plan whose cold runs
    alternate with this one's, so both see the same host; docs/hil.md "Speed-ups from interleaved runs")."""
    from experiments.protocol import framework_spec

    return framework_spec(name, "versus")


def peer_gguf(spec: ModelSpec, kind: str):
    """The GGUF file llama.cpp reads (hil.peer.peer_gguf_file)."""
    from hil.peer import peer_gguf_file

    return peer_gguf_file(spec, kind)


def validate(cfg: DictConfig) -> Estimate:
    """Checks before any work, and the modelled cost of the run: quantization once per packed file (~params / 5e6
    s, cached afterwards), each cold run ~params / 2e8 s, ~12 B of memory per parameter (fp32 weights, calibration
    and the NumPy reference forward) — per-unit costs measured with SmolLM2 on this 2-core host."""
    c = settings(cfg)
    if cfg.get("protocol") is not None:
        from experiments.protocol import estimate_s, protocol_spec

        p = protocol_spec(cfg.protocol)
        params = max(model_spec(x.model).total_params() for x in p.configurations)
        return Estimate(60.0 + estimate_s(p), 12.0 * params, "protocol", f"protocol={p.name}")
    params = c.model.total_params()
    runs = (c.warmup + c.repeats) * (2 if c.versus != "none" else 1)
    est = Estimate(20.0 + params / 5e6 + runs * params / 2e8, 12.0 * params, "model", f"model={c.model.name}")
    why = _calibration_first(cfg, c)
    if why is None:
        return est
    from experiments.calibrate import EST as CALIBRATION
    from hil.calibrate_settings import CalibrationSettings

    cal = CALIBRATION[c.quick_profile]
    cal_s = cal.seconds * CalibrationSettings.make(c.quick_profile, None).rounds
    kind = "quick" if c.quick_profile else "full"
    return Estimate(est.seconds + cal_s, max(est.bytes, cal.bytes), "device",
                    f"{est.what}, after a {kind} host calibration of ~{cal_s:.0f} s ({why}; python -m "
                    f"experiments.calibrate device=host{' quick=true' if c.quick_profile else ''} makes it apart)")


_counted_calibrations: set[str] = set()       # store directories whose calibration an estimate already counts


def _calibration_first(cfg: DictConfig, c: ValidateConfig) -> str | None:
    """Why this run calibrates the host before its runs (no usable stored profile, remeasure=true), or None; counted
    once per store over the jobs of a sweep (only the first job calibrates). A store of another version is the
    one-line recalibrate error here, before any work."""
    from hil.host import DEFAULT_ROOT, host_identity, load_stored, marker_store

    root = marker_store(OmegaConf.to_container(cfg.device, resolve=True)) or DEFAULT_ROOT
    got, d, why = load_stored(Path(root), host_identity(), c.quick_profile, c.host_memory, c.huge_pages)
    if c.remeasure:
        why = "remeasure=true"
    elif got is not None:
        return None
    if str(d) in _counted_calibrations:
        return None
    _counted_calibrations.add(str(d))
    return why


def profile_files(cfg: DictConfig) -> list[Path]:
    """The stored host profile a run with `cfg` would load (docs/hil.md "Host profile"): its files are inputs of the
    run, so a recalibrated host re-runs a finished job (experiments.resume). [] when none is stored or the config
    is bad (the run itself then says why)."""
    from hil.host import host_identity, marker_store, store_dir, store_parts

    try:
        c = settings(cfg)
        root = marker_store(OmegaConf.to_container(cfg.device, resolve=True))
    except (ValueError, TypeError):
        return []
    ident = host_identity()
    for quick in ((False, True) if c.quick_profile else (False,)):
        d = store_dir(root, ident, quick, c.host_memory, c.huge_pages)
        if (d / "device.json").is_file():
            return [d / name for name in store_parts(d)]
    return []


@resumable(expected=("measured_ttft_s",), files=profile_files)
@one_line_errors
def run(cfg: DictConfig) -> dict[str, Any]:
    watch_parent()
    c = settings(cfg)
    out = run_dir()
    prepare_run_dir(out, ["trace.json", "plan.json", "ops.csv", "runs.csv", "config.yaml", "peer_table.csv",
                          "peer_table.md", "peer_table.png"])
    with timing_lock(f"validate {out}"):              # one timing run on this machine at a time (hil.timing)
        return _run(cfg, c, out)


def _run(cfg: DictConfig, c: ValidateConfig, out: Path) -> dict[str, Any]:
    from experiments.hostrun import compare, compare_per_run, logits_check, merged_trace, per_op
    from hil.deploy import plan_summary
    from hil.diagnostics.drift import SPEED_KEYS, drift_pct, run_speeds, speeds_before
    from quant.evaluate import eval_text_tokens

    tokens = eval_text_tokens(c.model, c.prompt_tokens)
    gguf = None
    if c.peer == "llamacpp":
        gguf = peer_gguf(c.model, c.peer_gguf)
        os.sync()                                    # a fresh GGUF copy's writeback must not overlap the cold runs
    from hil.hostmem import footprint_bytes, hold
    from hil.runner_state import huge_pages

    # guest free page reporting held during the profile and the runs (hil.hostmem; docs/hil.md "Host memory"); the
    # runs' fresh memory on huge pages or not, as the profile's calibration had it (docs/hil.md "Huge pages")
    with hold(c.host_memory, footprint_bytes(c.model.total_params(), c.bits, gguf.stat().st_size if gguf else 0),
              change_system=c.change_system) as mem, huge_pages(c.huge_pages):
        host = _host(cfg, c.remeasure, c.quick_profile, c.host_memory, c.huge_pages)
        dev, table = host.device, host.cost_table
        run_, probes, around, before, peer_runs, vs, places = _measure(c, host, tokens, gguf)
        sched = _sched_trace(run_, tokens, c.model, dev.cpu_cores) if c.sched_trace else None
        memory = mem.metrics()
    m: dict[str, Any] = {"framework": c.framework.name, "model": c.model.name, "device": dev.name,
                         "bits": c.bits, "prompt_tokens": c.prompt_tokens, "repeats": c.repeats,
                         "packed_file": run_.packed_path.name, "packed_file_bytes": run_.packed_path.stat().st_size}
    m.update({k: v for k, v in plan_summary(run_.plan).items() if not isinstance(v, str)})
    m["priority"] = run_.plan.schedule.priority
    m.update(compare(run_))
    speeds: list[float | None] = []
    pred_runs: list[float | None] = []
    if c.diagnostics:          # the host probes around the runs (hil.diagnostics.drift): opt-in
        reference = _probe_reference(Path(table))
        for key, v in drift_pct(reference, probes).items():
            m[f"host_drift_{key.removesuffix('_s').removesuffix('_s_per_byte')}_pct"] = v
        speeds = run_speeds(reference, around)[c.warmup:]    # one per measured run
        m.update(speed_summary(speeds))
        m.update(_at_host_speed(run_, host, {cls: run_speeds(reference, around, key)[c.warmup:]
                                             for cls, key in SPEED_KEYS.items()}))
        at_run, pred_runs = compare_per_run(run_, host, speeds_before(reference, before)[c.warmup:])
        m.update(at_run)
        m.update(_at_run_placement(run_, host, places))
    m.update(memory)
    if sched is not None:
        m.update({f"measured_sched_{k}": v for k, v in sched.items() if not isinstance(v, dict)})
        top = list(sched.get("queued_by_s", {}).items())[:3]     # who waited while a core idled, and why
        m["measured_sched_queued_top"] = "; ".join(f"{k} {1e3 * v:.1f} ms" for k, v in top)
        atomic_write_json(out / "sched.json", sched)
    # the native forward always; the NumPy reference with check_logits (docs/hil.md "Logits")
    m.update(logits_check(run_.packed_path, c.model, tokens, run_.logits, run_.token, reference=c.check_logits))
    if vs is not None:
        m.update(versus_metrics(c.versus, vs, m["predicted_ttft_s"], m["measured_ttft_s"]))
    if peer_runs:
        m.update(_peer_metrics(peer_runs, run_.token, c.peer_gguf, m.get("measured_ttft_from_open_s")))
        from experiments.peer_table import quality
        from experiments.protocol_peer import predict_peer

        # the simulator's llama.cpp policy for the same file and settings (modelled; docs/hil.md "The llama.cpp
        # policy"): beside the measured peer, never part of our own prediction's error
        m["predicted_peer_ttft_s"] = predict_peer(c.model, host, c.peer_gguf, c.prompt_tokens,
                                                  host.device.cpu_cores)[1]["ttft_s"]
        m["peer_ttft_error_pct"] = 100.0 * (m["predicted_peer_ttft_s"] / m["peer_ttft_s"] - 1.0)

        m.update(quality(c.model, c.quant, gguf, run_.packed_path, dev.cpu_cores))   # perplexities, untimed
    atomic_write_text(out / "plan.json", run_.plan.to_json())
    atomic_write_text(out / "runs.csv", runs_csv(run_.meas_metrics, speeds, peer_runs, pred_runs, run_.warm))
    atomic_write_text(out / "ops.csv", ops_csv(per_op(run_)))
    if c.write_trace:
        atomic_write_json(out / "trace.json", merged_trace(run_))
    m["huge_pages"] = float(c.huge_pages)
    inputs = ["versus_framework", "bits", "prompt_tokens", "repeats", "loader_threads", "unpack_threads", "cpu_threads",
              "huge_pages",
              "steal_threshold", "n_tasks", "packed_file_bytes", "peer_file_bytes", "host_prefault_bytes"]
    modelled = [k for k in m if k.startswith("predicted_")]
    measured = [k for k in m if k not in inputs and k not in modelled and not isinstance(m[k], str)]
    write_run_outputs(out, cfg, m, measured=measured, modelled=modelled, inputs=inputs)
    if peer_runs:
        from experiments.peer_table import write_peer_table

        write_peer_table(out, [(out.name, m)])       # peer_table.md / .csv / .png: TTFT beside perplexity
    _print(m, out, c.diagnostics)
    return m


def _peer_metrics(peer_runs: list[dict], token: int, weight_type: str, measured_ttft_from_open_s: float | None
                  ) -> dict[str, Any]:
    """llama.cpp's measured runs merged (median load / prefill / TTFT, min and max TTFT, and its own llama_perf
    load / prompt-eval split), whether its first token matched ours, and our speed-up over it: its TTFT (from before
    `Llama()` opens the file) over ours from the open (`measured_ttft_from_open_s`: index read, buffers, op
    compilation and thread start included; hil.runner), the same clock start."""
    from hil.peer import merge_runs

    peer = merge_runs(peer_runs)
    m: dict[str, Any] = {f"peer_{k}": peer[k]["median"]
                         for k in ("load_s", "prefill_s", "ttft_s", "perf_load_s", "perf_prompt_eval_s") if k in peer}
    m["peer_ttft_min_s"], m["peer_ttft_max_s"] = peer["ttft_s"]["min"], peer["ttft_s"]["max"]
    m["peer_file_bytes"] = peer["file_bytes"]
    m["peer_resident_before_max"] = max(peer["resident_before"])     # its GGUF's cached fraction at t0 (measured)
    m["peer_first_token_matches"] = bool(all(t == token for t in peer["first_token"]))
    m["peer_weight_type"] = weight_type.upper()
    if m.get("peer_ttft_s") and measured_ttft_from_open_s:
        m["speedup_vs_peer"] = m["peer_ttft_s"] / measured_ttft_from_open_s
        m["speedup_vs_peer_basis"] = "peer_ttft_s / measured_ttft_from_open_s"
    return m


def ops_csv(rows: list[dict[str, Any]]) -> str:
    """ops.csv: per kind of op, predicted and measured wall and CPU seconds, counts and errors."""
    def pct(v: float | None) -> str:
        return "" if v is None else str(round(v, 1))

    return "op,predicted_s,predicted_n,measured_s,measured_n,error_pct,predicted_cpu_s,measured_cpu_s,cpu_error_pct\n" \
        + "".join(f"{r['op']},{r['predicted_s']:.6f},{r['predicted_n']},{r['measured_s']:.6f},{r['measured_n']},"
                  f"{pct(r['error_pct'])},{r['predicted_cpu_s']:.6f},{r['measured_cpu_s']:.6f},"
                  f"{pct(r['cpu_error_pct'])}\n" for r in rows)


def _measure(c: ValidateConfig, host, tokens, gguf):
    """The cold runs (`c.warmup` + `c.repeats`), llama.cpp's run after each when `gguf`, and with `c.diagnostics` a
    speed probe after each; (HostRun, host probes before / after, speed probes around the runs, the probe right
    before each run, the peer's measured runs, the `versus` runs, the wake-up placement probed before / after the
    runs; the probes' lists empty without `c.diagnostics`)."""
    from experiments.hostrun import run_host
    from hil.calibrate_reads import scratch_file
    from hil.diagnostics.drift import READ_PROBE_BYTES, placement_probe, probe, speed_probe

    peer_runs: list = []
    run_peer = None
    vs = None
    if c.versus != "none":
        vs = Versus(c, host, tokens)
    if gguf is not None:
        # llama.cpp runs once after each of our runs (its first run, after our warm-up, is its own warm-up): both see
        # the same host conditions, which on this shared host drift by 10-30 % within an hour (docs/hil.md)
        from hil.peer import llamacpp_cold_ttft

        def _peer(k: int) -> None:
            r = llamacpp_cold_ttft(gguf, tokens, threads=host.device.cpu_cores, repeats=1)
            if k >= c.warmup:
                peer_runs.append(r)
        run_peer = _peer
    probes: list = []
    places: list = []
    around: list = []                                    # speed probes around the runs: [k] before run k
    before: list = []                                    # [k]: the last probe before run k started

    def between(k: int, scratch: Path | None = None) -> None:
        if scratch is not None:
            around.append(speed_probe(scratch))          # right after run k, before anything else
        if vs is not None:
            vs.run(k >= c.warmup)
        if run_peer is not None:
            run_peer(k)
        if scratch is None:
            return
        if vs is not None or run_peer is not None:
            before.append(speed_probe(scratch))          # others ran since: probe again, right before run k + 1
        else:
            before.append(around[-1])

    def runs(after_each) -> object:
        return run_host(c.model, host, c.framework, c.bits, tokens, c.quant, c.repeats, c.warmup,
                        progress=lambda k, n: print(f"\r  cold run {k}/{n}", end="", file=sys.stderr, flush=True),
                        between=after_each)

    if not c.diagnostics:
        run_ = runs(between)
    else:
        # a scratch file for the read probe, as the calibration's (hil.diagnostics.drift.read_probe), removed on
        # every exit path
        with scratch_file(host.cost_table.parent.parent / "scratch", READ_PROBE_BYTES) as scratch:
            probes.append(probe(read_path=scratch))      # the host now vs when its profile was measured
            places.append(placement_probe())             # where the OS puts woken threads now (and after the runs)
            around.append(probes[0])
            before.append(probes[0])
            run_ = runs(lambda k: between(k, scratch))
            probes.append(probe(read_path=scratch))
            places.append(placement_probe())
    print(file=sys.stderr)
    return run_, probes, around, before, peer_runs, vs, places


class Versus:
    """The `versus=` plan (same model, bits, prompt): predicted once, then one cold run after each of this plan's
    runs (its first, after our warm-up, is its own warm-up), so the speed-up compares runs minutes apart at most."""

    def __init__(self, c: ValidateConfig, host, tokens) -> None:
        from experiments.hostrun import build_host_plan, predict

        self.spec, self.tokens = c.model, tokens
        self.plan, self.path = build_host_plan(c.model, host, versus_framework(c.versus), c.bits,
                                               int(tokens.size), c.quant)
        self.predicted_ttft_s = predict(self.plan, host)[1]["ttft_s"]
        self.measured: list[float] = []

    def run(self, counted: bool) -> None:
        from hil.runner import run_plan

        res = run_plan(self.plan, self.path, self.tokens, spec=self.spec)
        if counted:
            self.measured.append(res.timeline.end_s)


def versus_metrics(name: str, vs: "Versus", predicted_ttft_s: float, measured_ttft_s: float) -> dict[str, Any]:
    """The versus plan's TTFT (predicted: modelled; median / min / max of its interleaved cold runs: measured) and its
    speed-up over this plan (this plan's TTFT / its TTFT), predicted and measured, with the speed-up's error."""
    med = float(statistics.median(vs.measured))
    ps, ms = predicted_ttft_s / vs.predicted_ttft_s, measured_ttft_s / med
    return {"versus_framework": name, "predicted_versus_ttft_s": vs.predicted_ttft_s, "measured_versus_ttft_s": med,
            "measured_versus_ttft_min_s": min(vs.measured), "measured_versus_ttft_max_s": max(vs.measured),
            "predicted_versus_speedup": ps, "measured_versus_speedup": ms,
            "versus_speedup_error_pct": 100.0 * (ps - ms) / ms}


def _sched_trace(run_, tokens, spec, ncpu: int) -> dict[str, Any]:
    """One more cold run, after the measured ones and not counted in their medians, with the kernel's scheduler
    events traced: where its core time went (measured; hil.diagnostics.schedtrace, docs/hil.md "Scheduler trace")."""
    from hil.diagnostics.schedtrace import SchedTrace, breakdown, monotonic_t0, parse
    from hil.runner import run_plan

    with SchedTrace() as tr:
        res = run_plan(run_.plan, run_.packed_path, tokens, spec=spec)
    out = breakdown(parse(tr.text), monotonic_t0(res.info["t0_perf_counter"]), res.timeline.end_s,
                    res.info["thread_ids"], ncpu)
    return {"ttft_s": res.timeline.end_s, "events_lost": tr.lost, **out}


def speed_summary(speeds: list[float | None]) -> dict[str, float]:
    """host_speed (median), host_speed_min / _max over the measured runs (measured;
    hil.diagnostics.drift.run_speeds)."""
    vals = [v for v in speeds if v is not None]
    if not vals:
        return {}
    return {"host_speed": float(statistics.median(vals)), "host_speed_min": min(vals), "host_speed_max": max(vals)}


def _at_host_speed(run_, host, per_class: dict[str, list[float | None]]) -> dict[str, Any]:
    """The plan re-simulated with its kernels at the host speed measured around the runs (`per_class`: each speed
    class's speed per measured run, hil.diagnostics.drift.run_speeds; their medians; planner.cost.scaled): modelled,
    conditioned on that measurement — the calibrated prediction's error minus this one's is the host's drift
    (docs/hil.md "Prediction at the run-time host speed")."""
    from experiments.hostrun import compare_at_speed, predict

    speeds = {cls: float(statistics.median(v)) for cls, vals in per_class.items()
              if (v := [x for x in vals if x is not None])}
    if not speeds:
        return {}
    _tl, pm = predict(run_.plan, host, speeds)
    out: dict[str, Any] = {f"host_speed_{k}": v for k, v in speeds.items() if k != "gemm"}
    return out | compare_at_speed(run_, pm)


def _at_run_placement(run_, host, places: list) -> dict[str, Any]:
    """The wake-up placement measured around the runs (`hil.diagnostics.drift.placement_probe` before and after,
    merged) and the plan re-simulated with it instead of the calibrated one: modelled, conditioned on that
    measurement, like the prediction at the run-time host speed (docs/hil.md "Wake-up packing"). {} where the probe
    cannot run."""
    import dataclasses

    from experiments.hostrun import compare_at_speed, predict
    from hil.calibrate_compute import pack_threshold
    from hil.diagnostics.drift import merge_placements

    rows = merge_placements(places)
    if rows is None:
        return {}
    idle, share = pack_threshold(rows)
    rt = dataclasses.replace(host.runtime, thread_wake_pack_idle_s=idle, thread_wake_pack_share=share)
    _tl, pm = predict(run_.plan, dataclasses.replace(host, runtime=rt))
    out = {"measured_run_pack_idle_s": idle, "measured_run_pack_share": share,
           "measured_run_pack_curve": ", ".join(f"{1e6 * r['idle_s']:.0f} us: {r['share']:.2f}" for r in rows),
           "measured_calibration_pack_idle_s": host.runtime.thread_wake_pack_idle_s,
           "measured_calibration_pack_share": host.runtime.thread_wake_pack_share}
    return out | compare_at_speed(run_, pm, "at_run_placement")


def runs_csv(meas_metrics: list[dict[str, Any]], speeds: list[float | None], peer_runs: list[dict],
             predicted_at_run_speed: list[float | None] | None = None, warm: list[dict[str, Any]] = ()) -> str:
    """One row per measured run: its TTFT and phases, the fraction of its file cached at its start and whether it
    counted (a run that stayed warm does not: experiments.hostrun.cold_run), the host speed around it, llama.cpp's
    TTFT in the run after it and its file's cached fraction (when the peer ran) — all measured — the TTFT
    predicted at the speed probed right before it (modelled), and its TTFT from the file's open (the peer's clock,
    measured)."""
    def f(v) -> str:
        return "" if v is None else f"{v:.9f}"     # ns: the clocks' resolution

    pr = dict(zip((mm.get("run", k) for k, mm in enumerate(meas_metrics)), predicted_at_run_speed or []))
    slots = sorted([(mm.get("run", k), True, mm) for k, mm in enumerate(meas_metrics)]
                   + [(mm["run"], False, mm) for mm in warm], key=lambda x: x[0])
    rows = ["run,measured_ttft_s,measured_load_s,measured_unpack_s,measured_prefill_s,resident_before,counted,"
            "host_speed,peer_ttft_s,peer_resident_before,predicted_at_run_speed_ttft_s,measured_ttft_from_open_s"]
    for k, counted, mm in slots:
        peer = peer_runs[k]["ttft_s"]["runs"][0] if k < len(peer_runs) else None
        peer_res = peer_runs[k]["resident_before"][0] if k < len(peer_runs) else None
        rows.append(",".join([str(k), f(mm.get("ttft_s")), f(mm.get("load_s")), f(mm.get("unpack_s")),
                              f(mm.get("prefill_s")), f(mm.get("resident_before")), str(counted).lower(),
                              f(speeds[k] if k < len(speeds) else None), f(peer), f(peer_res), f(pr.get(k)),
                              f(mm.get("ttft_from_open_s"))]))
    return "\n".join(rows) + "\n"


def _probe_reference(table: Path) -> dict[str, float]:
    """The host probe stored with the profile (hil.diagnostics.drift; {} when it has none)."""
    try:
        return dict(json.loads((table.parent / "measurements.json").read_text()).get("host_probe") or {})
    except (OSError, ValueError):
        return {}


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _print(m: dict[str, Any], out: Path, diagnostics: bool = True) -> None:
    print(f"{m['framework']} {m['model']} bits={m['bits']} prompt={m['prompt_tokens']} on this host -> {out}")
    print(f"  {'phase':<16}{'predicted':>11}{'measured (median, min-max)':>32}{'error':>9}")
    for ph in ("ttft", "load", "unpack", "prefill", "cpu_bubble_rate", "npu_bubble_rate"):
        unit = "" if "rate" in ph else "_s"
        p, med = m.get(f"predicted_{ph}{unit}"), m.get(f"measured_{ph}{unit}")
        lo, hi = m.get(f"measured_{ph}_min{unit}"), m.get(f"measured_{ph}_max{unit}")
        e = m.get(f"{ph}_error_pct")
        print(f"  {ph:<16}{_fmt(p):>11}{_fmt(med):>14} ({_fmt(lo)}-{_fmt(hi)}){'' if e is None else f'{e:+8.1f}%':>9}")
    if m.get("predicted_core_busy_pct") is not None and m.get("measured_core_busy_pct") is not None:
        print(f"  cores busy until the first token: predicted {m['predicted_core_busy_pct']:.0f} %, measured "
              f"{m['measured_core_busy_pct']:.0f} %; threads blocked and woken: predicted "
              f"{m['predicted_thread_waits']} (idle workers + interpreter-lock hand-offs), measured "
              f"{m['measured_thread_waits']:.0f} (voluntary context switches)")
    pw, mw = m.get("predicted_waits_by_thread") or {}, m.get("measured_waits_by_thread") or {}
    if pw or mw:
        names = sorted(set(pw) | set(mw))
        print("  per worker, blocked and woken (predicted / measured median): "
              + ", ".join(f"{n} {pw.get(n, 0)} / {mw.get(n, 0):.0f}" for n in names))
    if "logits_native_exact" in m:
        print(f"  logits vs the same forward op by op with the native kernels: "
              f"{'bit-exact' if m['logits_native_exact'] else 'DIFFER'} "
              f"(max |Δ| {m['logits_native_max_abs_diff']:.3g})")
    if "logits_max_abs_diff" in m:
        print(f"  logits vs NumPy reference: top-1 {'match' if m['logits_top1_match'] else 'MISMATCH'}"
              f"{'' if m['logits_ref_top1_stable'] else ' (the reference flips its own top-1 under 1-ulp noise)'}, "
              f"max |Δ| {m['logits_max_abs_diff']:.4f} (tolerance {m['logits_tolerance']:.3f} = max(0.02, 3 x the "
              f"reference's own 1-ulp noise {m['logits_ref_noise']:.4f}))")
    if not diagnostics:
        print("  host probes: off (diagnostics=true probes the host's drift since its calibration, its kernel speeds "
              "around each run and its wake-up placement, and re-predicts at them; docs/hil.md \"Host drift\")")
    drift = {k.removeprefix("host_drift_").removesuffix("_pct"): v for k, v in m.items() if k.startswith("host_drift_")}
    if drift:
        print("  host since its calibration (measured, probes before and after the runs): " +
              ", ".join(f"{k.replace('_', ' ')} {v:+.1f} %" for k, v in drift.items()) +
              ("  -> re-measure: python -m experiments.calibrate device=host remeasure=true"
               if max(abs(v) for v in drift.values()) > 10 else ""))
    if "host_speed" in m:
        print(f"  host speed during the runs vs its calibration (measured, GEMM probe around each run; 1.00 = as "
              f"calibrated): {m['host_speed']:.2f} ({m['host_speed_min']:.2f}-{m['host_speed_max']:.2f}), per run "
              f"in runs.csv")
    if m.get("predicted_at_host_speed_ttft_s") is not None:
        e = m.get("ttft_error_at_host_speed_pct")
        other = "".join(f", {name} {m[f'host_speed_{k}']:.2f}" for k, name in
                        (("gemm_mt", "2-thread GEMM"), ("elementwise", "elementwise"), ("unpack", "unpack"),
                         ("read", "cold read"), ("read_cpu", "read CPU"))
                        if f"host_speed_{k}" in m)
        print(f"  predicted with the kernels at that measured speed (GEMM {m['host_speed']:.2f}{other}; modelled): "
              f"TTFT {m['predicted_at_host_speed_ttft_s']:.3f} s"
              f"{'' if e is None else f', error {e:+.1f} %'} (the calibrated prediction above is the one judged)")
    if m.get("predicted_at_run_speed_ttft_s") is not None:
        print(f"  predicted per run at the kernel speeds probed right before it (modelled, a prediction: nothing of "
              f"the run had happened): TTFT {m['predicted_at_run_speed_ttft_s']:.3f} s (median), error "
              f"{m['ttft_error_at_run_speed_pct']:+.1f} % (median of the runs' errors, "
              f"{m['ttft_error_at_run_speed_min_pct']:+.1f} ... {m['ttft_error_at_run_speed_max_pct']:+.1f} %)")
    if m.get("predicted_at_run_placement_ttft_s") is not None:
        e = m.get("ttft_error_at_run_placement_pct")
        print(f"  wake-up placement around the runs (measured, probes before and after): "
              f"{100 * m['measured_run_pack_share']:.0f} % of hand-offs put on the waker's busy core from "
              f"{1e6 * m['measured_run_pack_idle_s']:.0f} us of idle on (calibrated: "
              f"{100 * m['measured_calibration_pack_share']:.0f} % from "
              f"{1e6 * m['measured_calibration_pack_idle_s']:.0f} us); predicted at that placement "
              f"(modelled): TTFT {m['predicted_at_run_placement_ttft_s']:.3f} s"
              f"{'' if e is None else f', error {e:+.1f} %'}")
    if "measured_sched_running_pct" in m:
        g = lambda k: m[f"measured_sched_{k}"]  # noqa: E731
        print(f"  one more cold run with the kernel's scheduler traced (measured, not in the medians; TTFT "
              f"{g('ttft_s'):.3f} s), core time: running {g('running_pct'):.1f} %, idle while a thread of the run "
              f"waits in the other core's queue {g('queued_pct'):.1f} %, idle until a woken thread starts "
              f"{g('waking_pct'):.1f} %, idle with nothing runnable {g('no_work_pct'):.1f} %, other processes "
              f"{g('other_pct'):.1f} %; {100 * g('packed_share'):.0f} % of {g('wakes_other_core_idle'):.0f} wake-ups "
              f"that found the other core idle were put on the waker's busy core (modelled: "
              f"{m.get('predicted_packed_wakes') or 0} wake-ups packed, docs/hil.md \"Wake-up packing\")")
        if m.get("measured_sched_queued_top"):
            print(f"  core time idle while a thread waited in the other core's queue, by thread and why (measured): "
                  f"{g('queued_top')}")
    if "host_page_reporting" in m:
        mib = m.get("host_pages_reported_mib")
        print(f"  guest free page reporting: {m['host_page_reporting']}"
              f"{'' if mib is None else f', {mib:.0f} MiB reported during the runs (measured)'}; "
              f"{m['host_prefault_bytes'] / 2**30:.2f} GiB prefaulted in {m['host_prefault_s']:.1f} s")
    if "peer_ttft_s" in m:
        ours = m.get("measured_ttft_from_open_s")
        print(f"  llama.cpp ({m['peer_weight_type']}) cold TTFT {m['peer_ttft_s']:.3f} s (load {m['peer_load_s']:.3f}"
              f" s + prefill {m['peer_prefill_s']:.3f} s), ours from the open "
              f"{float('nan') if ours is None else ours:.3f} s (huge pages {'on' if m.get('huge_pages') else 'off'})"
              f" -> ours {m.get('speedup_vs_peer', float('nan')):.2f}x faster (measured, same run)")
    if "measured_versus_speedup" in m:
        print(f"  {m['versus_framework']} interleaved (one cold run after each of ours): TTFT predicted "
              f"{m['predicted_versus_ttft_s']:.3f} s (modelled), measured {m['measured_versus_ttft_s']:.3f} s "
              f"({m['measured_versus_ttft_min_s']:.3f}-{m['measured_versus_ttft_max_s']:.3f}); its speed-up over "
              f"{m['framework']}: predicted {m['predicted_versus_speedup']:.2f}x, measured "
              f"{m['measured_versus_speedup']:.2f}x, error {m['versus_speedup_error_pct']:+.1f} %")


class SpeedupCallback(Callback):
    """After a `-m` sweep: EdgeFlow's host speed-up over each other framework, predicted and measured (speedups.csv),
    and with the peer the TTFT-vs-perplexity table (experiments.peer_table: peer_table.md / .csv / .png)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(config.hydra.sweep.dir)
        rows = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/metrics.json"))]
        table = speedup_table(rows)
        if table:
            atomic_write_text(sweep / "speedups.csv", "\n".join(",".join(map(str, r)) for r in table) + "\n")
            print("\n".join("  ".join(f"{x}" for x in r) for r in table))
        from experiments.peer_table import write_peer_table

        if write_peer_table(sweep, [(p.parent.name, json.loads(p.read_text()))
                                    for p in sorted(sweep.glob("*/metrics.json"))]):
            print((sweep / "peer_table.md").read_text())


def speedup_table(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """[[header], [framework, bits, prompt, predicted speed-up, measured speed-up, error %], ...]: EdgeFlow vs each
    (experiments.hostrun.speedup_pairs: interleaved runs where a row has them)."""
    from experiments.hostrun import speedup_pairs

    out: list[list[Any]] = [["baseline", "model", "bits", "prompt_tokens", "predicted_speedup", "measured_speedup",
                             "speedup_error_pct"]]
    out += [[r["framework"], r["model"], r["bits"], r["prompt_tokens"], round(ps, 3), round(ms, 3),
             round(100 * (ps - ms) / ms, 1)] for r, ps, ms in speedup_pairs(rows)]
    return out if len(out) > 1 else []


@one_line_errors
def run_protocol(cfg: DictConfig) -> dict[str, Any]:
    """`protocol=<set>`: the set's configurations interleaved over rounds in this process and judged with intervals
    (experiments.protocol; docs/hil.md "Validation protocol")."""
    from experiments.protocol import FILES, protocol_spec, run_set

    watch_parent()
    c, p = settings(cfg), protocol_spec(cfg.protocol)
    peer = None
    if p.peer:                                  # measured: llama.cpp or MNN itself (experiments.protocol_peer)
        from experiments.protocol_peer import PEERS, peer_for

        peer = peer_for(p)
        if c.huge_pages:                        # the peer's buffers get none here: its first touch is 4 KiB pages'
            print(f"protocol={p.name}: huge_pages=false ({PEERS[peer.policy]}'s buffers get no transparent huge "
                  f"pages; the profile calibrated so is used: calibrate huge_pages=false)", file=sys.stderr)
            c = dataclasses.replace(c, huge_pages=False)
    out = run_dir()
    prepare_run_dir(out, FILES)
    with timing_lock(f"validate protocol={p.name} {out}"):    # one timing run on this machine at a time (hil.timing)
        m, measured, modelled, inputs = run_set(
            p, lambda: _host(cfg, c.remeasure, c.quick_profile, c.host_memory, c.huge_pages), c.quant, out,
            c.host_memory, c.huge_pages, c.check_logits, peer, c.change_system)
    write_run_outputs(out, cfg, m, measured=measured, modelled=modelled, inputs=inputs)
    print((out / "protocol.md").read_text())
    return m


@hydra.main(config_path="../conf", config_name="validate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    if cfg.get("protocol") is not None:
        run_protocol(cfg)
    else:
        run(cfg)


def _cluster_run(argv: list[str]) -> bool:
    """A command line naming a cluster (`cluster=…`) runs on the emulated cluster (experiments.validate_cluster)."""
    return any(a.split("=", 1)[0].lstrip("+~") == "cluster" for a in argv)


if __name__ == "__main__":
    if _cluster_run(sys.argv[1:]):
        # its own app, run as __main__ (Hydra resolves conf/ relative to the main module)
        import runpy
        runpy.run_module("experiments.validate_cluster", run_name="__main__", alter_sys=True)
    else:
        if (why := parallel_launcher("validate", sys.argv[1:])) is not None:
            fail(why)
        precheck("validate", sys.argv[1:], validate, GROUPS)
        main()
