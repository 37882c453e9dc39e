"""Undo what killed runs left on this machine, from the project's own records only (docs/cluster.md "Clean-up",
docs/hil.md "Faults and locks").

    python -m experiments.cleanup            # both parts below
    python -m experiments.cleanup --dry-run  # list what would be done, change nothing

Host runs (`host_cleanup`): a system setting a SIGKILLed validate / calibrate left changed (its record
`outputs/hil/system-state.json`, `hil.hostmem`: the value found before and the holders' pids) is restored when no
holder is alive, and calibration scratch files of dead processes (`outputs/hil/host/scratch/read-<pid>.bin`) are
removed. Both also happen at the start of every host run.

Emulated clusters (`run`): each run of the emulated cluster writes its state record
(`/run/edgellm-cluster/<prefix>.json`: owner pid and start time, network namespaces, root veth, cpu cgroups, worker
pids, scratch directory) before it creates anything (`hil.cluster.netns`). This removes exactly what the records of
dead owners list (entries carrying the record's prefix), then the records; a namespace, link or cgroup that is in no
record is never touched, whatever its name. The same clean-up runs at the start of every cluster run.

Exit status: 0 done, 2 an unknown argument or not root (the cluster part needs network namespaces and cgroups; the
host part runs first either way).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def run(dry_run: bool = False, sdir: Path | None = None) -> list[str]:
    """Print one line per stale set (what its record lists) and remove them unless `dry_run`; returns the prefixes."""
    from hil.cluster.netns import cleanup_stale, stale_records, state_dir

    sdir = sdir or state_dir()
    stale = stale_records(sdir) if sdir.is_dir() else []
    for path, own in stale:
        what = ", ".join(f"{len(v)} {k.replace('_', ' ')}" for k, v in own.items() if v) or "nothing left"
        print(f"{'would remove' if dry_run else 'removing'} {path.stem} ({what})")
    if dry_run:
        if not stale:
            print("nothing to clean up")
        return [p.stem for p, _ in stale]
    removed = cleanup_stale(sdir)
    print(f"{len(removed)} stale cluster set(s) removed" if removed else "nothing to clean up")
    return removed


def host_cleanup(dry_run: bool = False, root: Path | None = None) -> list[str]:
    """Host runs' leftovers (module doc): one printed line per setting restored or scratch file removed; the lines."""
    from hil.calibrate_reads import remove_stale_scratch
    from hil.host import DEFAULT_ROOT
    from hil.hostmem import restore_stale

    done: list[str] = []
    restore_stale(log=done.append, dry_run=dry_run)
    for path in remove_stale_scratch((root or DEFAULT_ROOT) / "scratch", dry_run=dry_run):
        done.append(f"{path}: {'would remove' if dry_run else 'removed'} (scratch file of a dead process)")
    for line in done:
        print(line)
    if not done:
        print("host: nothing to clean up")
    return done


def main(argv: list[str]) -> int:
    unknown = [a for a in argv if a != "--dry-run"]
    if unknown:
        print(f"error: {unknown[0]}: unknown argument; usage: python -m experiments.cleanup [--dry-run]",
              file=sys.stderr)
        return 2
    host_cleanup(dry_run="--dry-run" in argv)
    if os.geteuid() != 0:
        print("error: cleanup: needs root (network namespaces, cgroups)", file=sys.stderr)
        return 2
    run(dry_run="--dry-run" in argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
