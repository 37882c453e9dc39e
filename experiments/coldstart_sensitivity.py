"""The cold-start sensitivity run (docs/coldstart.md "Assumptions and sensitivity"): every framework's TTFT with each
parameter without a source at ½× / 2× (or under the alternative assumption), `sim.coldstart.sensitivity`, simulated
into one run directory, which `python -m experiments.report` turns into docs/results/coldstart-sensitivity.md.

    python -m experiments.coldstart_sensitivity --out outputs/coldstart_sensitivity   # Llama3-8B, xiaomi15pro, 5 bits
    python -m experiments.report outputs/coldstart_sensitivity                        # -> docs/results/

`--frameworks`, `--workloads` and `--parameters` (variants whose parameter name starts with one of them) take subsets
(a small run). Writes `metrics.json` (the settings and the rows: TTFT in s per framework, all modelled) and
`manifest.json` (the commit, this machine's identity and the exact command; `experiments.common.run_manifest`).
Exit status 2 on a bad argument (the usage line and a one-line error naming the argument).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

APP = "experiments.coldstart_sensitivity"


def _csv(text: str, known: tuple[str, ...], key: str) -> tuple[str, ...]:
    items = tuple(x for x in text.split(",") if x)
    bad = [x for x in items if x not in known]
    if not items or bad:
        raise ValueError(f"{key}: {'unknown ' + ', '.join(bad) if bad else 'empty list'} (known: {', '.join(known)})")
    return items


def parse(argv: list[str]) -> argparse.Namespace:
    from sim.coldstart.sensitivity import FRAMEWORKS, WORKLOADS
    from sim.coldstart.sweep import CONF

    def names(group: str) -> tuple[str, ...]:
        return tuple(sorted(p.stem for p in (CONF / group).glob("*.yaml") if not p.stem.endswith("_schema")))

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="outputs/coldstart_sensitivity", help="run directory")
    ap.add_argument("--model", default="llama3_8b")
    ap.add_argument("--device", default="xiaomi15pro")
    ap.add_argument("--bits", type=float, default=5.0)
    ap.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--parameters", default="", help="only variants whose parameter starts with one of these")
    a = ap.parse_args(argv)
    try:
        a.model = _csv(a.model, names("model"), "--model")[0]
        a.device = _csv(a.device, ("xiaomi15pro",), "--device")[0]
        a.frameworks = _csv(a.frameworks, names("framework"), "--frameworks")
        a.workloads = _csv(a.workloads, names("workload"), "--workloads")
        a.parameters = tuple(x for x in a.parameters.split(",") if x) or None
        if not 1 <= a.bits <= 8:
            raise ValueError(f"--bits must be in 1..8 (got {a.bits:g})")
    except ValueError as e:
        ap.error(str(e))
    return a


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse(argv)
    from experiments.common import finish_cli_run, start_cli_run
    from sim.coldstart.sensitivity import table

    out = Path(a.out)
    if not start_cli_run(out):
        return 2
    rows = table(a.model, a.device, a.bits, a.frameworks, a.workloads, a.parameters)
    metrics = {"model": a.model, "device": a.device, "bits": a.bits, "frameworks": list(a.frameworks),
               "workloads": list(a.workloads), "sensitivity_rows": rows}
    return finish_cli_run(out, APP, argv, metrics)


if __name__ == "__main__":
    raise SystemExit(main())
