"""The multi-device report's run (Voltron §5 setting; docs/multidevice.md "Results"): the cluster × model family ×
planner tables of `sim.multidevice.report` simulated into one run directory, which `python -m experiments.report`
turns into docs/results/multidevice-report.md.

    python -m experiments.multidevice_report --out outputs/multidevice_report        # every section
    python -m experiments.report outputs/multidevice_report                          # -> docs/results/

Sections (`--only`, comma-separated; default all): `qos` and `largest` (the table under each model-choice rule,
trace `--trace`), `equal_split` (paper Fig. 4b on Office), `latency` (held-out accuracy of the planner's latency
regression), `energy` (Voltron's decode energy per token, energy mode off / on, against the single device; trace
`--energy-trace`), `gains` (Voltron − single accuracy per `accuracy.int4_scale` of `--gains`), `ablation` (Voltron's
run-time mechanisms each off on the trace that needs it, Office / Qwen2.5-14B, `sim.multidevice.report.ABLATION`),
`sensitivity` (every model parameter without a source at ½× / 2×, Office / Qwen2.5-14B, trace `walk_away`,
`sim.multidevice.sensitivity`).
`--clusters` and `--families` take subsets (a small run). `--figure` also plots TPOT / RSSI over time (office,
qwen2_5_14b).

Writes `metrics.json` (the settings and every section's rows: the simulator's metrics per run, all modelled except
the planner's search times `plan_ms_*`, measured on this host) and `manifest.json` (the commit, this machine's
identity and the exact command; `experiments.common.run_manifest`). Exit status 2 on a bad argument (the usage
line and a one-line error naming the argument).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

APP = "experiments.multidevice_report"
SECTIONS = ("qos", "largest", "equal_split", "latency", "energy", "gains", "ablation", "sensitivity")
ENERGY_MAX_VIOLATION = 0.01     # share of tokens over the TPOT QoS Voltron may have in the energy comparison


def _csv(text: str, known: tuple[str, ...] | None, key: str) -> tuple[str, ...]:
    items = tuple(x for x in text.split(",") if x)
    if not items:
        raise ValueError(f"{key}: empty list")
    bad = [x for x in items if known is not None and x not in known]
    if bad:
        raise ValueError(f"{key}: unknown {', '.join(bad)} (known: {', '.join(known)})")
    return items


def parse(argv: list[str]) -> argparse.Namespace:
    from planner.voltron.accuracy import FAMILIES
    from sim.multidevice.report import CLUSTERS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="outputs/multidevice_report", help="run directory")
    ap.add_argument("--trace", default="walk_away")
    ap.add_argument("--energy-trace", default="steady_strong", help="trace of the energy section")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"sections, of {', '.join(SECTIONS)}")
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--gains", default="0.5,1,2", help="accuracy.int4_scale values of the gains section")
    ap.add_argument("--figure", action="store_true", help="also plot TPOT/RSSI over time (office, qwen2_5_14b)")
    a = ap.parse_args(argv)
    try:
        a.only = _csv(a.only, SECTIONS, "--only")
        a.clusters = _csv(a.clusters, CLUSTERS, "--clusters")
        a.families = _csv(a.families, tuple(FAMILIES), "--families")
        a.gains = tuple(float(x) for x in _csv(a.gains, None, "--gains"))
        if a.turns < 1 or a.seed < 0:
            raise ValueError("--turns must be >= 1 and --seed >= 0")
        for office_only in ("equal_split", "ablation", "sensitivity"):
            if office_only in a.only and "office" not in a.clusters:
                raise ValueError(f"--only {office_only} runs on the office cluster: keep office in --clusters")
        if any(not (x > 0) for x in a.gains):
            raise ValueError("--gains: every int4_scale must be > 0")
    except ValueError as e:
        ap.error(str(e).replace("could not convert string to float", "--gains: not a number"))
    return a


def sections(a: argparse.Namespace) -> dict:
    """Every requested section's rows."""
    from planner.voltron.accuracy import AccuracyConfig
    from sim.multidevice.report import ablation, equal_split, latency_rows, table

    kw = dict(clusters=a.clusters, families=a.families)
    out: dict = {}
    for rule in ("qos", "largest"):
        if rule in a.only:
            out[rule] = table(a.trace, a.turns, a.seed, rule=rule, **kw)
    if "equal_split" in a.only:
        out["equal_split"] = equal_split(a.trace, a.turns, seed=a.seed, families=a.families)
    if "latency" in a.only:
        out["latency"] = latency_rows(a.seed, **kw)
    if "energy" in a.only:
        e = dict(rule="qos", planners=("voltron", "single"), max_violation=ENERGY_MAX_VIOLATION, **kw)
        out["energy"] = {"normal": table(a.energy_trace, a.turns, a.seed, **e),
                         "energy_mode": table(a.energy_trace, a.turns, a.seed, energy_mode=True, **e)}
    if "gains" in a.only:
        out["gains"] = {f"{s:g}": table(a.trace, a.turns, a.seed, rule="qos", planners=("voltron", "single"),
                                        accuracy=AccuracyConfig(int4_scale=s), **kw) for s in a.gains}
    if "ablation" in a.only:
        out["ablation"] = ablation(seed=a.seed)
    if "sensitivity" in a.only:
        from sim.multidevice.sensitivity import run

        out["sensitivity"] = run(a.turns, a.seed)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse(argv)
    from experiments.common import finish_cli_run, start_cli_run

    out = Path(a.out)
    if not start_cli_run(out):
        return 2
    if a.figure:
        from sim.multidevice.report import figure

        print(figure(a.trace, "office", "qwen2_5_14b", max(a.turns, 5), out, a.seed)["figure"])
    metrics = {"trace": a.trace, "energy_trace": a.energy_trace, "turns": a.turns, "seed": a.seed,
               "clusters": list(a.clusters), "families": list(a.families), "energy_max_violation":
               ENERGY_MAX_VIOLATION, "sections": sections(a)}
    return finish_cli_run(out, APP, argv, metrics)


if __name__ == "__main__":
    raise SystemExit(main())
