"""The cold-start calibration run (docs/coldstart.md "Calibration"): the fit of the phone profile to the EdgeFlow
component figures, the simulated components against the figures, the derived stealing threshold, and EdgeFlow's TTFT
with the threshold fixed and every framework's at
the CPU GEMM rate the paper's threshold implies (`sim.coldstart.calibration`), simulated into one run directory, which
`python -m experiments.report` turns into docs/results/coldstart-calibration.md (fit and checks) and, with
`--topic coldstart-threshold`, docs/results/coldstart-threshold.md (the threshold table).

    python -m experiments.coldstart_calibration --out outputs/coldstart_calibration    # Llama3-8B, xiaomi15pro
    python -m experiments.report outputs/coldstart_calibration
    python -m experiments.report outputs/coldstart_calibration --topic coldstart-threshold

The figures are of Llama3-8B on the Xiaomi 15 Pro, so model and device are fixed. `--workloads` takes the prompts of
the threshold tables, `--rounds` the fit's rounds. Writes `metrics.json` (every row, all modelled) and `manifest.json`
(the commit, this machine's identity and the exact command; `experiments.common.run_manifest`). Exit status 2 on a bad
argument (the usage line and a one-line error naming the argument).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

APP = "experiments.coldstart_calibration"
MODEL, DEVICE = "llama3_8b", "xiaomi15pro"


def parse(argv: list[str]) -> argparse.Namespace:
    from sim.coldstart.calibration import THRESHOLD_WORKLOADS
    from sim.coldstart.sweep import CONF

    known = tuple(sorted(p.stem for p in (CONF / "workload").glob("*.yaml") if not p.stem.endswith("_schema")))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="outputs/coldstart_calibration", help="run directory")
    ap.add_argument("--workloads", default=",".join(THRESHOLD_WORKLOADS), help="prompts of the threshold tables")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of the joint fit (1..10)")
    a = ap.parse_args(argv)
    items = tuple(x for x in a.workloads.split(",") if x)
    bad = [x for x in items if x not in known]
    if not items or bad:
        ap.error(f"--workloads: {'unknown ' + ', '.join(bad) if bad else 'empty list'} (known: {', '.join(known)})")
    if not 1 <= a.rounds <= 10:
        ap.error(f"--rounds must be in 1..10 (got {a.rounds})")
    a.workloads = items
    return a


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse(argv)
    from experiments.common import finish_cli_run, start_cli_run
    from planner.device import SocProfile
    from planner.framework import FrameworkSpec
    from planner.workload import WorkloadSpec
    from quant.arch import ModelSpec
    from sim.coldstart import calibration as cal
    from sim.coldstart.sweep import load_conf

    out = Path(a.out)
    if not start_cli_run(out):
        return 2
    spec, dev = load_conf("model", MODEL, ModelSpec), load_conf("device", DEVICE, SocProfile)
    fws = {f: load_conf("framework", f, FrameworkSpec) for f in ("ef_priority", "edgeflow")}
    wls = {w: load_conf("workload", w, WorkloadSpec).prompt_tokens for w in a.workloads}
    metrics = {"model": MODEL, "device": DEVICE, "bits": cal.FIG4B_BUDGET, "rounds": a.rounds,
               "fit_rows": cal.fit_rows(spec, dev, cal.fit_profile(spec, dev, rounds=a.rounds)),
               "check_rows": cal.check_rows(spec, dev),
               "threshold_rows": cal.threshold_rows(spec, dev, fws, wls),
               "consistent_rows": cal.consistent_rate_rows(
                   spec, dev, {f: load_conf("framework", f, FrameworkSpec) for f in cal.CONSISTENT_FRAMEWORKS}, wls)}
    return finish_cli_run(out, APP, argv, metrics)


if __name__ == "__main__":
    raise SystemExit(main())
