"""The validation protocol (docs/hil.md "Validation protocol"): a set of configurations predicted, then run cold on
this host in one process, interleaved in a seeded random order over several rounds, and judged with intervals.

    python -m experiments.validate protocol=dev device=host          # the development set (conf/protocol/dev.yaml)
    python -m experiments.validate protocol=heldout device=host      # the held-out set, drawn by seed
    python -m experiments.validate protocol=dev protocol.rounds=1 protocol.runs_per_round=1   # a smoke run

Order. Configurations sharing (model, bits, prompt) form a group (EdgeFlow and the plans it is compared with).
Before the rounds every configuration runs `warmup` times (not counted; packed files and plans are made before
that). In round r the groups run in a permutation drawn from (seed, r); inside a group, pass k runs every member
once in its own permutation, K passes per round. So a configuration's runs are spread over the whole invocation,
and EdgeFlow's and a baseline's runs of the same pass are adjacent in time: their ratio is a paired speed-up.

Cold. Before every run the packed file is evicted (hil.pagecache.evict_cold) and its resident fraction measured; a
run that starts with more than COLD_RESIDENT_MAX of the file cached is run again up to RERUN_TRIES times
(experiments.hostrun.cold_run) and, if it stays warm, recorded in runs.csv with `counted=false` and left out of every
statistic.

Outputs in the run directory: `runs.csv` (every run: order, round, pass, configuration, phases, resident fraction,
load average, counted), `protocol.csv` (per configuration: prediction, pooled median, interval, round medians'
spread, error, inside), `speedups.csv` (per EdgeFlow-vs-other pair: predicted and measured paired speed-up with its
interval), `protocol.md` (the report), `protocol.png` (predicted vs measured with intervals) and `metrics.json`
(the set's figures, flat keys `protocol_*`). Statistics: experiments.protocol_stats.
"""
from __future__ import annotations

import csv
import io
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from omegaconf import MISSING

from experiments import protocol_stats as ps
from experiments.common import CONF_DIR, ConfigError, typed
from experiments.hostrun import COLD_RESIDENT_MAX, RERUN_TRIES, cold_run
from planner.framework import FrameworkSpec
from quant.arch import ModelSpec, WeightSource, model_spec

LOAD_BUSY = 3.0             # 1-min load average above which a set's runs shared the 2 vCPUs with other work (the
#                             runs themselves keep ~2 threads runnable)
PAIR_WITH = "edgeflow"      # the framework whose paired speed-up over each other member of its group is reported
PEER_TYPES = ("q8_0", "q4_0", "q4_k_m", "q4_1")    # llama.cpp file types a peer set runs (hil.peer.peer_gguf_file)
PROMPT_RANGE = (8, 256)     # tokens: prompt lengths a set may hold (the held-out draw's range)
BITS_RANGE = (3, 8)
SEC_PER_PARAM_RUN = 1 / 1e9  # s per parameter of one cold run with its set-up, rounded up from two sets measured on
#                              a 2-vCPU AMD EPYC VM (4 rounds x 3: the development set's 273 runs in 73 s, the held-out
#                              set's 260 in 102 s; 1/1.2e9 and 1/1.15e9); experiments.validate's estimate uses it too
PEER_SEC_PER_PARAM_RUN = 1 / 4e8   # s per parameter of one llama.cpp cold run (a peer set; SmolLM2 Q8_0 ~0.37 s, the
#                                   1B 1.1-2.3 s measured on this host: docs/hil.md "The llama.cpp policy")


@dataclass
class Configuration:
    framework: str = MISSING
    model: str = MISSING
    bits: int = 5
    prompt_tokens: int = 128
    weight_type: str = ""     # a peer set's llama.cpp file type (PEER_TYPES); "" in the host sets

    def __post_init__(self) -> None:
        if self.weight_type not in ("", *PEER_TYPES):
            raise ValueError(f"weight_type must be one of {', '.join(PEER_TYPES)} (got {self.weight_type!r})")
        if not 1 <= self.bits <= 8:
            raise ValueError(f"bits must be in 1..8 (got {self.bits})")
        if not 2 <= self.prompt_tokens <= 1024:
            raise ValueError(f"prompt_tokens must be in 2..1024 (got {self.prompt_tokens})")

    @property
    def key(self) -> str:
        if self.weight_type:
            return f"{self.framework}/{self.model}/{self.weight_type}/p{self.prompt_tokens}"
        return f"{self.framework}/{self.model}/b{self.bits}/p{self.prompt_tokens}"

    @property
    def group(self) -> tuple[str, int, int]:
        return (self.model, self.bits, self.prompt_tokens)


@dataclass
class Draw:
    """How the held-out set is drawn (`draw_configurations`): per model, `groups` groups of (bits, prompt), each
    EdgeFlow plus `partners` frameworks drawn from `frameworks` without replacement."""
    model: str = MISSING
    groups: int = 1
    partners: int = 1
    frameworks: list[str] = field(default_factory=list)


@dataclass
class ProtocolSpec:
    name: str = MISSING
    seed: int = 0
    rounds: int = 4
    runs_per_round: int = 3
    warmup: int = 1
    level: float = ps.LEVEL
    bootstrap: int = ps.N_BOOT
    heldout: bool = False             # true: a judging set, never used to choose or tune a mechanism
    peer: bool = False                # true: measured = llama.cpp or MNN itself (hil.peer, hil.mnn_peer),
    #                                   predicted = the simulator's policy of that framework for its file
    #                                   (experiments.protocol_peer)
    draw: list[Draw] = field(default_factory=list)       # non-empty: `configurations` must equal the draw
    configurations: list[Configuration] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.rounds <= 50:
            raise ValueError(f"rounds must be in 1..50 (got {self.rounds})")
        if not 1 <= self.runs_per_round <= 50:
            raise ValueError(f"runs_per_round must be in 1..50 (got {self.runs_per_round})")
        if not 0 <= self.warmup <= 10:
            raise ValueError(f"warmup must be in 0..10 (got {self.warmup})")
        if not 0.5 <= self.level < 1.0:
            raise ValueError(f"level must be in [0.5, 1) (got {self.level})")
        if not 100 <= self.bootstrap <= 100000:
            raise ValueError(f"bootstrap must be in 100..100000 (got {self.bootstrap})")
        if not self.configurations:
            raise ValueError("configurations: the set is empty")
        keys = [c.key for c in self.configurations]
        if len(set(keys)) != len(keys):
            raise ValueError(f"configurations: {next(k for k in keys if keys.count(k) > 1)} appears twice")


def framework_spec(name: str, key: str = "framework") -> FrameworkSpec:
    """conf/framework/<name>.yaml as a FrameworkSpec (one line naming `key` for an unknown name)."""
    from omegaconf import OmegaConf

    names = sorted(f.stem for f in (CONF_DIR / "framework").glob("*.yaml"))
    if name not in names:
        raise ConfigError(f"{key}: unknown framework {name!r} (one of {', '.join(names)})")
    doc = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "framework" / f"{name}.yaml"), resolve=True)
    doc.pop("defaults", None)
    return typed(doc, FrameworkSpec, key)


def draw_configurations(draws: list[Draw], seed: int) -> list[Configuration]:
    """The held-out set from its seed: per Draw, `groups` (bits, prompt) pairs — bits uniform in BITS_RANGE,
    prompt log-uniform in PROMPT_RANGE, no pair twice — each with EdgeFlow and `partners` other frameworks."""
    rng = np.random.default_rng(seed)
    out: list[Configuration] = []
    lo, hi = np.log(PROMPT_RANGE[0]), np.log(PROMPT_RANGE[1])
    for d in draws:
        seen: set[tuple[int, int]] = set()
        while len(seen) < d.groups:
            bits = int(rng.integers(BITS_RANGE[0], BITS_RANGE[1] + 1))
            prompt = int(round(float(np.exp(rng.uniform(lo, hi)))))
            if (bits, prompt) in seen:
                continue
            seen.add((bits, prompt))
            others = [str(f) for f in rng.permutation(sorted(d.frameworks))[:d.partners]]
            out += [Configuration(f, d.model, bits, prompt) for f in [PAIR_WITH, *others]]
    return out


def runnable_spec(c: Configuration) -> ModelSpec:
    """The configuration's model, which must have weights on this machine (one ConfigError line otherwise)."""
    try:
        spec = model_spec(c.model)
    except FileNotFoundError as e:
        raise ConfigError(f"protocol.configurations[{c.key}].model: {e}") from None
    if spec.weights == WeightSource.twin:
        raise ConfigError(f"protocol.configurations[{c.key}]: {c.model} has no weights on this machine")
    return spec


def check_spec(p: ProtocolSpec) -> None:
    """Every configuration runnable here and within the set's ranges; a drawn set equal to its draw."""
    if p.peer:                  # experiments.protocol_peer.check_peer_spec (validate runs it)
        return
    for c in p.configurations:
        if c.weight_type:
            raise ConfigError(f"protocol.configurations[{c.key}].weight_type: only a peer set (peer: true) names a "
                              f"llama.cpp file type")
        framework_spec(c.framework, f"protocol.configurations[{c.key}].framework")
        spec = runnable_spec(c)
        if spec.weights == WeightSource.synthetic and _method(c.framework) != "edgeflow":
            raise ConfigError(f"protocol.configurations[{c.key}]: a synthetic model is packed with EdgeFlow's "
                              f"allocation only; {c.framework} reads per-channel INT8")
    if p.draw:
        drawn = draw_configurations(p.draw, p.seed)
        if [c.key for c in drawn] != [c.key for c in p.configurations]:
            raise ConfigError(f"protocol.configurations: set {p.name} is drawn: its configurations must be its draw "
                              f"with seed {p.seed}, as stored (python -m experiments.protocol {p.name} prints it)")


def _method(framework: str) -> str:
    from hil.deploy import weight_file_kind
    from sim.coldstart import POLICIES

    recipe = getattr(POLICIES[framework_spec(framework).policy](), "recipe", None)
    return weight_file_kind(framework_spec(framework).policy, getattr(recipe, "fmt", None))[0]


def estimate_s(p: ProtocolSpec) -> float:
    """Modelled wall time of the rounds and warm-ups (SEC_PER_PARAM_RUN; file generation not included)."""
    runs = p.warmup + p.rounds * p.runs_per_round
    per = PEER_SEC_PER_PARAM_RUN if p.peer else SEC_PER_PARAM_RUN
    return sum(runs * model_spec(c.model).total_params() * per for c in p.configurations)


# ================================================ the schedule ======================================================
@dataclass
class Slot:
    kind: str                 # warmup | measured
    round: int                # -1 for warm-ups
    pass_: int                # pass k of the round (a pair of EdgeFlow and another member shares it)
    config: int               # index into the set's configurations


def schedule(configs: list[Configuration], rounds: int, runs_per_round: int, warmup: int, seed: int) -> list[Slot]:
    """The whole invocation's run order (module doc): warm-ups, then per round a permutation of the groups, each
    group `runs_per_round` passes over its members in a permutation per pass; every draw from (seed, round)."""
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(configs):
        groups.setdefault(c.group, []).append(i)
    keys = list(groups)
    out: list[Slot] = []
    rng = np.random.default_rng([seed, 0])
    for _ in range(warmup):
        out += [Slot("warmup", -1, -1, int(i)) for i in rng.permutation(len(configs))]
    for r in range(rounds):
        rng = np.random.default_rng([seed, r + 1])
        for g in rng.permutation(len(keys)):
            members = groups[keys[g]]
            for k in range(runs_per_round):
                out += [Slot("measured", r, k, members[int(j)]) for j in rng.permutation(len(members))]
    return out


# ================================================ running ===========================================================
@dataclass
class Prepared:
    config: Configuration
    spec: ModelSpec
    plan: Any
    path: Path
    tokens: np.ndarray
    predicted: dict[str, Any]


@dataclass
class RunRecord:
    order: int
    kind: str
    round: int
    pass_: int
    config: str
    attempt: int
    ttft_s: float | None
    load_s: float | None
    unpack_s: float | None
    prefill_s: float | None
    resident_before: float
    loadavg_1m: float
    t_s: float                # start, s since the first run
    counted: bool


def prepare(p: ProtocolSpec, host, quant, progress=print) -> list[Prepared]:
    """Packed files, bound plans and predictions of every configuration (before any timed run)."""
    from experiments.hostrun import build_host_plan, predict
    from quant.evaluate import eval_text_tokens

    out = []
    for n, c in enumerate(p.configurations):
        progress(f"  preparing {n + 1}/{len(p.configurations)}: {c.key}")
        spec = model_spec(c.model)
        tokens = eval_text_tokens(spec, c.prompt_tokens)
        plan, path = build_host_plan(spec, host, framework_spec(c.framework), c.bits, c.prompt_tokens, quant)
        out.append(Prepared(c, spec, plan, path, tokens, predict(plan, host)[1]))
    return out


def execute(p: ProtocolSpec, prepared: list[Prepared], dev, progress: Callable[[int, int], None] | None = None
            ) -> tuple[list[RunRecord], dict[str, np.ndarray]]:
    """Every slot of the schedule, in order: one record per attempt, and per configuration the last run's logits."""
    slots = schedule([x.config for x in prepared], p.rounds, p.runs_per_round, p.warmup, p.seed)
    recs: list[RunRecord] = []
    logits: dict[str, np.ndarray] = {}
    t0 = time.perf_counter()
    for n, s in enumerate(slots):
        prep = prepared[s.config]
        load = os.getloadavg()[0]
        start = time.perf_counter() - t0
        attempts = cold_run(prep.plan, prep.path, prep.tokens, prep.spec, dev)
        for a, (res, m) in enumerate(attempts):
            cold = res.resident_before <= COLD_RESIDENT_MAX
            recs.append(RunRecord(n, s.kind, s.round, s.pass_, prep.config.key, a, m.get("ttft_s"), m.get("load_s"),
                                  m.get("unpack_s"), m.get("prefill_s"), float(res.resident_before), load, start,
                                  s.kind == "measured" and cold))
        logits[prep.config.key] = attempts[-1][0].logits
        if progress:
            progress(n + 1, len(slots))
    return recs, logits


# ================================================ judging ===========================================================
def _rounds_of(recs: list[RunRecord], key: str, rounds: int, phase: str = "ttft_s") -> list[list[float]]:
    out: list[list[float]] = [[] for _ in range(rounds)]
    for r in recs:
        if r.counted and r.config == key and getattr(r, phase) is not None:
            out[r.round].append(float(getattr(r, phase)))
    return out


def judge_set(p: ProtocolSpec, prepared: list[Prepared], recs: list[RunRecord]) -> dict[str, Any]:
    """Per configuration (rows), per EdgeFlow pair (speed-up rows) and for the set (summary) — protocol_stats."""
    rows, judged = [], []
    for i, x in enumerate(prepared):
        c = x.config
        mine = [r for r in recs if r.config == c.key and r.kind == "measured"]
        excluded = sum(not r.counted for r in mine)
        resident = max((r.resident_before for r in mine), default=0.0)
        row: dict[str, Any] = {**asdict(c), "predicted_ttft_s": x.predicted["ttft_s"], "excluded_warm": excluded,
                               "resident_before_max": resident}
        rs = _rounds_of(recs, c.key, p.rounds)
        if any(rs):
            j = ps.judge(x.predicted["ttft_s"], rs, p.level, p.bootstrap, seed=p.seed * 1000 + i)
            judged.append(j)
            row |= {f"measured_{k}" if k in ("lo", "hi", "runs", "rounds") else k: v for k, v in j.as_dict().items()
                    if k != "predicted"}
            for ph in ("load_s", "unpack_s", "prefill_s"):
                vals = [v for r in _rounds_of(recs, c.key, p.rounds, ph) for v in r]
                pred = x.predicted.get(ph)
                row[f"predicted_{ph}"] = pred
                row[f"measured_{ph}"] = float(np.median(vals)) if vals else None
                row[f"{ph[:-2]}_error_pct"] = (ps.error_pct(pred, row[f"measured_{ph}"])
                                               if pred is not None and vals and row[f"measured_{ph}"] > 0 else None)
        rows.append(row)
    speed = []
    by_group: dict[tuple, list[int]] = {}
    for i, x in enumerate(prepared):
        by_group.setdefault(x.config.group, []).append(i)
    for members in by_group.values():
        ef = [i for i in members if prepared[i].config.framework == PAIR_WITH]
        if not ef:
            continue
        e = prepared[ef[0]]
        for i in members:
            if i == ef[0]:
                continue
            b = prepared[i]
            pairs = [[] for _ in range(p.rounds)]
            for r in range(p.rounds):
                for k in range(p.runs_per_round):
                    tb = _one(recs, b.config.key, r, k)
                    te = _one(recs, e.config.key, r, k)
                    pairs[r].append((tb, te))
            ratios = ps.paired_ratios(pairs)
            row = {"framework": b.config.framework, "versus": PAIR_WITH, "model": b.config.model,
                   "bits": b.config.bits, "prompt_tokens": b.config.prompt_tokens,
                   "predicted_speedup": b.predicted["ttft_s"] / e.predicted["ttft_s"]}
            if any(ratios):
                j = ps.judge(row["predicted_speedup"], ratios, p.level, p.bootstrap, seed=p.seed * 1000 + 500 + i)
                row |= {"measured_speedup": j.measured, "measured_lo": j.lo, "measured_hi": j.hi, "pairs": j.runs,
                        "noise_pct": j.noise_pct, "speedup_error_pct": j.error_pct, "inside": j.inside}
            speed.append(row)
    summary = ps.summarize(judged, p.level, p.bootstrap, p.seed) if judged else None
    return {"rows": rows, "speedups": speed, "summary": summary}


def _one(recs: list[RunRecord], key: str, rnd: int, k: int) -> float | None:
    for r in recs:
        if r.counted and r.config == key and r.round == rnd and r.pass_ == k:
            return r.ttft_s
    return None


# ================================================ outputs ===========================================================
def _csv(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r[k]) for k in cols})
    return buf.getvalue()


def runs_csv(recs: list[RunRecord]) -> str:
    return _csv([{("pass" if k == "pass_" else k): v for k, v in asdict(r).items()} for r in recs])


def metrics(p: ProtocolSpec, judged: dict[str, Any], recs: list[RunRecord], wall_s: float) -> dict[str, Any]:
    """metrics.json's flat keys: the set's summary (measured against modelled), the runs, the speed-ups."""
    m: dict[str, Any] = {"protocol": p.name, "protocol_heldout": p.heldout, "protocol_peer": p.peer,
                         "protocol_seed": p.seed,
                         "protocol_rounds": p.rounds, "protocol_runs_per_round": p.runs_per_round,
                         "protocol_warmup": p.warmup, "protocol_level": p.level,
                         "protocol_configurations": len(p.configurations), "protocol_stored_set": is_stored(p)}
    measured = [r for r in recs if r.kind == "measured"]
    m["protocol_runs"] = sum(r.counted for r in measured)
    m["protocol_runs_excluded_warm"] = sum(not r.counted for r in measured)
    m["protocol_resident_before_max"] = max((r.resident_before for r in recs), default=0.0)
    loads = [r.loadavg_1m for r in recs]
    m["protocol_loadavg_median"] = float(np.median(loads)) if loads else None
    m["protocol_loadavg_max"] = max(loads) if loads else None
    m["protocol_wall_s"] = wall_s
    s = judged["summary"]
    if s is not None:
        m |= {f"protocol_{k}": v for k, v in s.as_dict().items()}
    sp = [r for r in judged["speedups"] if r.get("speedup_error_pct") is not None]
    if sp:
        e = [r["speedup_error_pct"] for r in sp]
        m["protocol_speedups"] = len(sp)
        m["protocol_speedup_bias_pct"] = float(np.mean(e))
        m["protocol_speedup_mean_abs_pct"] = float(np.mean(np.abs(e)))
        m["protocol_speedups_inside"] = sum(bool(r["inside"]) for r in sp)
    return m


INPUT_KEYS = ("protocol_heldout", "protocol_peer", "protocol_seed", "protocol_rounds", "protocol_runs_per_round",
              "protocol_warmup", "protocol_level", "protocol_configurations", "protocol_stored_set")


def is_stored(p: ProtocolSpec) -> bool:
    """Whether `p`'s configurations and seed are those of conf/protocol/<name>.yaml (not overridden on the command
    line: a smoke run of a subset is not the set)."""
    from omegaconf import OmegaConf

    path = CONF_DIR / "protocol" / f"{p.name}.yaml"
    if not path.is_file():
        return False
    doc = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    return (doc.get("seed") == p.seed and [Configuration(**c).key for c in doc.get("configurations") or []]
            == [c.key for c in p.configurations])


def _f(v: Any, nd: int = 3) -> str:
    return "–" if v is None or v != v else f"{v:.{nd}f}"


def _pc(v: Any) -> str:
    return "–" if v is None or v != v else f"{v:+.1f} %"


def about_md(m: dict[str, Any]) -> str:
    """What was run (from metrics.json)."""
    lvl = f"{100 * m['protocol_level']:g} %"
    subset = "" if m.get("protocol_stored_set") else " (configurations or seed overridden: not the stored set)"
    return (f"{m['protocol_configurations']} configurations{subset}, interleaved in a seeded random order (seed "
            f"{m['protocol_seed']}), {m['protocol_rounds']} rounds × {m['protocol_runs_per_round']} cold runs each "
            f"after {m.get('protocol_warmup', 0)} warm-up run(s) of each; {m['protocol_runs']} runs counted, "
            f"{m['protocol_runs_excluded_warm']} left out "
            f"because the file stayed cached (> {COLD_RESIDENT_MAX:g} resident after {RERUN_TRIES} tries); load "
            f"average median {_f(m.get('protocol_loadavg_median'), 2)}, max {_f(m.get('protocol_loadavg_max'), 2)}. "
            f"Predicted: the simulator with the calibrated host profile (modelled); measured: the pooled median of a "
            f"configuration's runs with a {lvl} hierarchical bootstrap interval (measured)." + busy_md(m))


def busy_md(m: dict[str, Any]) -> str:
    """A warning when other work shared the cores (load average above LOAD_BUSY during the runs), else ''."""
    load = m.get("protocol_loadavg_median")
    if load is None or load <= LOAD_BUSY:
        return ""
    return (f" **Taken under load** (median 1-min load average {load:.1f} > {LOAD_BUSY:g} on this host's cores, "
            f"the runs' own threads included): other processes shared the cores, so these numbers describe that "
            f"state of the host, not the model.")


def summary_md(m: dict[str, Any]) -> str:
    """The set's verdict (from metrics.json): bias with its interval, sign test, mean |error|, noise, inside."""
    if m.get("protocol_n") is None:
        return "No configuration has a counted run."
    lvl = f"{100 * m['protocol_level']:g} %"
    out = [f"- Bias (mean signed TTFT error): {_pc(m['protocol_bias_pct'])}, {lvl} interval "
           f"{_pc(m['protocol_bias_lo_pct'])} … {_pc(m['protocol_bias_hi_pct'])}",
           f"- Signs: {m['protocol_over']} over-predicted, {m['protocol_under']} under-predicted; sign test "
           f"p = {m['protocol_sign_p']:.3g}",
           f"- Mean |error|: {m['protocol_mean_abs_pct']:.1f} %; host noise floor (median spread of round medians): "
           f"{m['protocol_median_noise_pct']:.1f} %",
           f"- Predictions inside their configuration's interval: {m['protocol_inside']} of {m['protocol_n']}"]
    if m.get("protocol_peer_criterion"):
        out.append(m["protocol_peer_criterion"])
    if m.get("protocol_speedups"):
        out.append(f"- {PAIR_WITH} speed-ups (paired): mean error {_pc(m['protocol_speedup_bias_pct'])}, mean "
                   f"|error| {m['protocol_speedup_mean_abs_pct']:.1f} %, inside {m['protocol_speedups_inside']} of "
                   f"{m['protocol_speedups']}")
    if "protocol_logits_native_exact" in m:
        exact = "bit-exact" if m["protocol_logits_native_exact"] else "DIFFER"
        out.append(f"- Logits: every runner vs the native forward op by op: {exact}")
    if "protocol_correct_ok" in m:
        from experiments.hostrun import KL_MEAN_MAX, NOISE_FACTOR, TOP1_MIN

        out.append(f"- Native forward vs the NumPy reference over {m['protocol_correct_positions']} positions, once "
                   f"per model ({m['protocol_correct_models']}): "
                   f"{'every model within' if m['protocol_correct_ok'] else 'OUTSIDE'} its tolerance (lowest top-1 "
                   f"agreement {m['protocol_correct_top1_min']:.2f}, highest mean KL "
                   f"{m['protocol_correct_kl_mean_max']:.3f} nats; tolerance: top-1 ≥ min({TOP1_MIN:g}, 1 − "
                   f"{NOISE_FACTOR:g} × the reference's own 1-ulp disagreement), mean KL ≤ max({KL_MEAN_MAX:g}, "
                   f"{NOISE_FACTOR:g} × its own 1-ulp KL))")
    return "\n".join(out)


def tables_md(rows: list[dict[str, Any]], speedups: list[dict[str, Any]], level: float) -> str:
    """Per configuration and per paired speed-up (rows of protocol.csv / speedups.csv)."""
    lvl = f"{100 * level:g} %"
    yes = lambda v: "yes" if v is True or str(v).lower() == "true" else "no"  # noqa: E731 (CSV gives strings)
    out = ["| framework | model | bits or file type | prompt | predicted s | measured s [interval] | round medians s "
           "| noise | error [at interval ends] | inside | left out |", "|" + "---|" * 11]
    for r in rows:
        out.append(f"| {r['framework']} | {r['model']} | {r.get('weight_type') or r['bits']} | {r['prompt_tokens']} | "
                   f"{_f(r['predicted_ttft_s'])} | {_f(r.get('measured'))} [{_f(r.get('measured_lo'))}–"
                   f"{_f(r.get('measured_hi'))}] | {_f(r.get('round_min'))}–{_f(r.get('round_max'))} | "
                   f"{_f(r.get('noise_pct'), 1)} % | {_pc(r.get('error_pct'))} [{_pc(r.get('error_lo_pct'))} … "
                   f"{_pc(r.get('error_hi_pct'))}] | {yes(r.get('inside'))} | {r['excluded_warm']} |")
    lines = ["## Per configuration", "", *out, "", *phases_md(rows)]
    if speedups:
        out = ["| framework | model | bits | prompt | predicted | measured [interval] | pairs | error | inside |",
               "|" + "---|" * 9]
        for r in speedups:
            out.append(f"| {r['framework']} | {r['model']} | {r['bits']} | {r['prompt_tokens']} | "
                       f"{_f(r['predicted_speedup'], 2)}× | {_f(r.get('measured_speedup'), 2)}× "
                       f"[{_f(r.get('measured_lo'), 2)}–{_f(r.get('measured_hi'), 2)}] | {r.get('pairs') or 0} | "
                       f"{_pc(r.get('speedup_error_pct'))} | {yes(r.get('inside'))} |")
        lines += [f"## {PAIR_WITH} speed-ups (paired runs of the same pass)", "",
                  f"A configuration's TTFT over {PAIR_WITH}'s in the same pass of the same round (adjacent in time), "
                  f"median over the pairs with its {lvl} interval.", "", *out, ""]
    return "\n".join(lines)


PHASE_NAMES = ("load", "unpack", "prefill")


def _num(v: Any) -> float | None:
    """A float from a row value (a CSV gives strings, empty for none)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f else None


def phases_md(rows: list[dict[str, Any]]) -> list[str]:
    """Where each TTFT error comes from: per configuration, each phase's span modelled vs measured (sim.metrics:
    first start to last end of its tasks; the measured one the median over the counted runs), and per phase the
    mean signed error and how many configurations it under-predicts. A TTFT error near zero can hide phase errors of
    opposite sign; this section shows them. [] when no row has phase figures."""
    have = [r for r in rows if any(_num(r.get(f"{ph}_error_pct")) is not None for ph in PHASE_NAMES)]
    if not have:
        return []
    out = ["| framework | model | bits or file type | prompt | TTFT error | "
           + " | ".join(f"{ph} predicted / measured s, error" for ph in PHASE_NAMES) + " |", "|" + "---|" * 8]
    for r in have:
        cells = []
        for ph in PHASE_NAMES:
            pred, meas, err = (_num(r.get(k)) for k in (f"predicted_{ph}_s", f"measured_{ph}_s", f"{ph}_error_pct"))
            cells.append("–" if err is None else f"{_f(pred)} / {_f(meas)}, {_pc(err)}")
        out.append(f"| {r['framework']} | {r['model']} | {r.get('weight_type') or r['bits']} | {r['prompt_tokens']} | "
                   f"{_pc(_num(r.get('error_pct')))} | " + " | ".join(cells) + " |")
    summary = []
    for ph in PHASE_NAMES:
        errs = [e for e in (_num(r.get(f"{ph}_error_pct")) for r in have) if e is not None]
        if errs:
            summary.append(f"- {ph}: mean error {_pc(float(np.mean(errs)))}, mean |error| "
                           f"{float(np.mean(np.abs(errs))):.1f} %, under-predicted in {sum(e < 0 for e in errs)} of "
                           f"{len(errs)}")
    return ["## Per phase", "",
            "Each phase's wall span, modelled vs measured (median over the counted runs; sim/metrics.py defines the "
            "spans: first start to last end of the phase's tasks). Phases overlap, so their errors do not add up to "
            "the TTFT error; a small TTFT error can hide phase errors of opposite sign.", "", *summary, "", *out, ""]


def report_md(m: dict[str, Any], rows: list[dict[str, Any]], speedups: list[dict[str, Any]]) -> str:
    """protocol.md: what was run, the set's verdict, per configuration, per speed-up."""
    return "\n".join([f"# Validation protocol: set `{m['protocol']}`{' (held out)' if m['protocol_heldout'] else ''}",
                      "", about_md(m), "", "## Set", "", summary_md(m), "", tables_md(rows, speedups,
                                                                                    m["protocol_level"])])


def figure(rows: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    """protocol.png: predicted vs measured TTFT per configuration, the measured interval as error bars."""
    have = [r for r in rows if r.get("measured") is not None]
    if not have:
        return None
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from quant.atomic import atomic_open

    fig, ax = plt.subplots(figsize=(5.5, 5))
    models = sorted({r["model"] for r in have})
    for mdl, marker in zip(models, "osD^v"):
        g = [r for r in have if r["model"] == mdl]
        x = np.array([r["predicted_ttft_s"] for r in g])
        y = np.array([r["measured"] for r in g])
        err = np.array([[r["measured"] - r["measured_lo"] for r in g], [r["measured_hi"] - r["measured"] for r in g]])
        ax.errorbar(x, y, yerr=err, fmt=marker, capsize=2, label=mdl)
    lim = [0.8 * min(min(r["predicted_ttft_s"], r["measured_lo"]) for r in have),
           1.25 * max(max(r["predicted_ttft_s"], r["measured_hi"]) for r in have)]
    ax.plot(lim, lim, "k-", lw=0.8, label="predicted = measured")
    ax.fill_between(lim, [v / 1.1 for v in lim], [v / 0.9 for v in lim], color="0.85", label="±10 %")
    ax.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="predicted TTFT, s (modelled)",
           ylabel="measured TTFT, s (pooled median, interval)", title=title)
    for axis in (ax.xaxis, ax.yaxis):          # plain numbers at 1, 2, 5 × 10^k: every minor label would overlap
        axis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_open(path) as f:
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)
    return path


FILES = ("runs.csv", "protocol.csv", "speedups.csv", "protocol.md", "protocol.png", "config.yaml")


def protocol_spec(node: Any) -> ProtocolSpec:
    """The `protocol` config node -> a checked ProtocolSpec (one ConfigError line on bad input)."""
    from omegaconf import DictConfig, OmegaConf

    doc = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    p = load_spec(doc)
    check_spec(p)
    return p


def run_set(p: ProtocolSpec, host_fn: Callable[[], Any], quant, out: Path, host_memory: str = "hold",
            huge: bool = True, check_logits: bool = True, peer: Any = None, change_system: bool = False
            ) -> tuple[dict[str, Any], list[str], list[str], list[str]]:
    """Prepare, run and judge the set `p` on this host; write the run directory's files (module doc). `host_fn()`:
    the calibrated host profile, called inside the memory hold. `peer`: for a peer set, the module that prepares
    and runs it (experiments.protocol_peer.Peer: `prepare(p, host, progress)`, `execute(p, prepared, host, progress)`,
    `criterion_md(metrics)`); its runs are the peer's, so no logits check. Returns (metrics, measured, modelled,
    input keys)."""
    from hil.hostmem import footprint_bytes, hold
    from hil.runner_state import huge_pages
    from quant.atomic import atomic_write_text

    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    foot = max(footprint_bytes(model_spec(c.model).total_params(), c.bits) for c in p.configurations)
    with hold(host_memory, foot, change_system=change_system) as mem, huge_pages(huge):
        host = host_fn()
        prepared = peer.prepare(p, host, say) if peer else prepare(p, host, quant, say)
        say(f"  {len(schedule([x.config for x in prepared], p.rounds, p.runs_per_round, p.warmup, p.seed))} cold "
            f"runs in a seeded interleaved order (modelled {estimate_s(p) / 60:.1f} min)")
        t0 = time.perf_counter()
        tick = lambda k, n: print(f"\r  cold run {k}/{n}", end="", file=sys.stderr, flush=True)  # noqa: E731
        recs, logits = peer.execute(p, prepared, host, tick) if peer else execute(p, prepared, host.device, tick)
        wall = time.perf_counter() - t0
        print(file=sys.stderr)
        memory = mem.metrics()
    judged = judge_set(p, prepared, recs)
    m = metrics(p, judged, recs, wall)
    if peer is None:
        say("  logits: the native forward op by op against every configuration's runner"
            + (", the NumPy reference over the check prompts once per model" if check_logits else ""))
        m |= logits_checks(prepared, logits, judged["rows"], check_logits)
    m |= {k: v for k, v in memory.items()}
    atomic_write_text(out / "runs.csv", runs_csv(recs))
    atomic_write_text(out / "protocol.csv", _csv(judged["rows"]))
    atomic_write_text(out / "speedups.csv", _csv(judged["speedups"]))
    if peer is not None:
        m["protocol_peer_criterion"] = peer.criterion_md(m)
    atomic_write_text(out / "protocol.md", report_md(m, judged["rows"], judged["speedups"]))
    figure(judged["rows"], out / "protocol.png", f"set {p.name}: predicted vs measured cold TTFT")
    inputs = [k for k in INPUT_KEYS if k in m] + [k for k in memory if k.startswith("host_prefault")]
    modelled: list[str] = []
    measured = [k for k in m if k not in inputs and not isinstance(m[k], str)]
    return m, measured, modelled, inputs


def logits_checks(prepared: list[Prepared], logits: dict[str, np.ndarray], rows: list[dict[str, Any]],
                  reference: bool = True) -> dict[str, Any]:
    """Every configuration's last runner logits against the native forward op by op (bit-exact:
    experiments.hostrun.native_check) and, with `reference`, the native forward against the NumPy reference
    (experiments.hostrun.correctness) once per model, on its first configuration's file: both forwards read the same
    unpacked weights, so the packed format does not enter that comparison; per configuration into `rows`, and the
    set's verdicts."""
    from experiments.hostrun import correctness, native_check
    from quant.packed_forward import read_model

    done: dict[tuple, dict[str, Any]] = {}
    for x, row in zip(prepared, rows):
        pm = read_model(x.path)
        if x.config.key in logits:
            row["logits_native_exact"] = native_check(pm, x.spec, x.tokens, logits[x.config.key])["logits_native_exact"]
        if reference and x.config.model not in done:
            done[x.config.model] = correctness(x.path, x.spec, pm)
            row |= {c: done[x.config.model][c] for c in ("correct_top1", "correct_kl_mean", "correct_ok")}
        del pm
    exact = [r["logits_native_exact"] for r in rows if "logits_native_exact" in r]
    m: dict[str, Any] = {"protocol_logits_native_exact": bool(exact) and all(exact),
                         "protocol_logits_native_differ": ", ".join(r["framework"] + "/" + r["model"] + f"/b{r['bits']}"
                                                                    f"/p{r['prompt_tokens']}" for r in rows
                                                                    if r.get("logits_native_exact") is False)}
    if done:
        m |= {"protocol_correct_ok": all(d["correct_ok"] for d in done.values()),
              "protocol_correct_models": len(done),
              "protocol_correct_top1_min": min(d["correct_top1"] for d in done.values()),
              "protocol_correct_kl_mean_max": max(d["correct_kl_mean"] for d in done.values()),
              "protocol_correct_positions": min(d["correct_positions"] for d in done.values())}
    return m


def main(argv: list[str]) -> int:
    """python -m experiments.protocol <set>: print a set's configurations (and its draw when it has one)."""
    from omegaconf import OmegaConf

    if len(argv) != 1 or not (CONF_DIR / "protocol" / f"{argv[0]}.yaml").is_file():
        names = sorted(f.stem for f in (CONF_DIR / "protocol").glob("*.yaml"))
        print(f"usage: python -m experiments.protocol <{'|'.join(names)}>", file=sys.stderr)
        return 2
    doc = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "protocol" / f"{argv[0]}.yaml"), resolve=True)
    doc.pop("defaults", None)
    if doc.get("draw"):                          # print the draw, whatever the file stores
        draws = [Draw(**d) for d in doc["draw"]]
        doc["configurations"] = [asdict(c) for c in draw_configurations(draws, int(doc.get("seed", 0)))]
    p = load_spec(doc)
    cfgs = p.configurations
    print("configurations:")
    for c in cfgs:
        size = f"weight_type: {c.weight_type}" if c.weight_type else f"bits: {c.bits}"
        print(f"  - {{framework: {c.framework}, model: {c.model}, {size}, prompt_tokens: {c.prompt_tokens}}}")
    print(f"# modelled wall time of the rounds: {estimate_s(p) / 60:.1f} min", file=sys.stderr)
    return 0


def load_spec(doc: dict[str, Any]) -> ProtocolSpec:
    """A ProtocolSpec from a plain dict (a config node's container); a bad value is one ConfigError line."""
    try:
        doc = dict(doc)
        doc["configurations"] = [Configuration(**c) for c in doc.get("configurations") or []]
        doc["draw"] = [Draw(**d) for d in doc.get("draw") or []]
        return ProtocolSpec(**doc)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"protocol: {str(e).splitlines()[0]}") from None


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
