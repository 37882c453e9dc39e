"""Several invocations of one validation-protocol set judged as one (docs/hil.md "Validation protocol").

On a host whose speed drifts between minutes (this 2-vCPU VM: two invocations of the held-out set four minutes apart,
same commit and calibration, gave a bias of -5.3 % and +5.4 %), one invocation's bias is a draw; its bootstrap
interval resamples the rounds of that invocation only. Pooling gives every invocation's rounds to one judgement: the
rounds of invocation i are numbered after those of invocations 0..i-1, and `protocol.judge_set` runs on them as on
one longer invocation, so the interval of the bias spans the differences between invocations as far as they show in
their rounds.

Only invocations that predicted the same figures are pooled (the same configurations, runs per round and predicted
TTFT and phases to the last digit: the same model commit and calibration); `pool` says which of the others it left
out and why. The page shows each invocation's own bias beside the pooled one. The logits checks hold for the pool
when they held in every pooled invocation.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from experiments.common import ConfigError
from experiments.protocol import Configuration, Prepared, RunRecord, judge_set, load_spec, metrics

PHASES = ("ttft_s", "load_s", "unpack_s", "prefill_s")


@dataclass
class Invocation:
    dir: Path
    spec: Any                       # ProtocolSpec of the invocation (its config.yaml)
    prepared: list[Prepared]        # configurations with their predictions (config + predicted only)
    recs: list[RunRecord]
    metrics: dict[str, Any]


def _float(v: str) -> float | None:
    return None if v in ("", None) else float(v)


def _bool(v: str) -> bool:
    if v not in ("True", "False"):
        raise ValueError(f"not a boolean: {v!r}")
    return v == "True"


def read_invocation(d: Path) -> Invocation:
    """One protocol run directory (config.yaml, protocol.csv, runs.csv, metrics.json) -> Invocation."""
    import yaml

    try:
        doc = yaml.safe_load((d / "config.yaml").read_text())["protocol"]
        spec = load_spec(doc)
        with open(d / "protocol.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        with open(d / "runs.csv", newline="") as f:
            runs = list(csv.DictReader(f))
        m = json.loads((d / "metrics.json").read_text())
        prepared = []
        for r in rows:
            c = Configuration(r["framework"], r["model"], int(r["bits"]), int(r["prompt_tokens"]),
                              r.get("weight_type") or "")
            pred = {"ttft_s": float(r["predicted_ttft_s"])}
            for ph in PHASES[1:]:
                if r.get(f"predicted_{ph}") not in (None, ""):
                    pred[ph] = float(r[f"predicted_{ph}"])
            prepared.append(Prepared(c, None, None, None, None, pred))
        recs = [RunRecord(int(r["order"]), r["kind"], int(r["round"]), int(r["pass"]), r["config"], int(r["attempt"]),
                          _float(r["ttft_s"]), _float(r["load_s"]), _float(r["unpack_s"]), _float(r["prefill_s"]),
                          float(r["resident_before"]), float(r["loadavg_1m"]), float(r["t_s"]), _bool(r["counted"]))
                for r in runs]
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError) as e:
        raise ConfigError(f"{d}: not a readable protocol run ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    return Invocation(d, spec, prepared, recs, m)


def _signature(x: Invocation) -> tuple:
    """What must be equal for two invocations to be one judgement: the set, its shape and every prediction."""
    return (x.spec.name, x.spec.runs_per_round, x.spec.level, x.spec.bootstrap, x.spec.seed,
            tuple((p.config.key, tuple(sorted(p.predicted.items()))) for p in x.prepared))


def pool(invocations: list[Invocation]) -> tuple[dict[str, Any], dict[str, Any], list[Invocation], list[str]]:
    """Judge the newest invocation (the last) together with every other one that predicted the same figures.
    Returns (metrics of the pooled judgement, judged rows / speed-ups / summary, the pooled invocations in order,
    one line per invocation left out)."""
    if not invocations:
        raise ValueError("pool: no invocations")
    newest = invocations[-1]
    sig = _signature(newest)
    pooled = [x for x in invocations if _signature(x) == sig]
    left = [f"{x.dir.name}: other predictions or set shape (another model commit, calibration or set): not pooled"
            for x in invocations if _signature(x) != sig]
    recs: list[RunRecord] = []
    offset = 0
    for x in pooled:
        recs += [replace(r, round=r.round + offset if r.round >= 0 else r.round) for r in x.recs]
        offset += x.spec.rounds
    spec = replace(newest.spec, rounds=offset)
    judged = judge_set(spec, newest.prepared, recs)
    m = metrics(spec, judged, recs, sum(float(x.metrics.get("protocol_wall_s") or 0.0) for x in pooled))
    m["protocol_invocations"] = len(pooled)
    for k in ("protocol_stored_set", "protocol_configurations"):
        m[k] = newest.metrics.get(k, m.get(k))
    for k, v in newest.metrics.items():     # the correctness checks of the logits: every invocation's must hold
        if k.startswith(("protocol_logits", "protocol_correct")) and k not in m:
            m[k] = all(bool(x.metrics.get(k)) for x in pooled) if isinstance(v, bool) else v
    return m, judged, pooled, left
