"""Progress of a `-m` sweep with an ETA, for any launcher (docs/sweeps.md "Progress").

`SweepProgress` is a Hydra callback: at the start of a multirun it counts the jobs of the sweep (the product of the
command line's sweep overrides) and starts a thread that polls the sweep directory for finished jobs (`metrics.json`
files: every app writes it last) and drives a tqdm bar on stderr, whatever process runs the jobs (basic, joblib,
Ray, SLURM). Jobs already finished when the sweep starts (a resumed sweep) count as done. The bar closes at the end
of the multirun. Silenced by a top-level `progress=false` in the app's config or `EDGELLM_PROGRESS=0`.

    hydra:
      callbacks:
        progress:
          _target_: experiments.progress.SweepProgress
"""
from __future__ import annotations

import math
import os
import sys
import threading
from pathlib import Path
from typing import Any

try:
    from hydra.experimental.callback import Callback
except ImportError:                                  # pragma: no cover - hydra is a dependency
    Callback = object

PROGRESS_ENV = "EDGELLM_PROGRESS"                    # "0": no bar
POLL_S = 1.0                                         # s between polls of the sweep directory


def sweep_size(task_overrides: list[str]) -> int | None:
    """Number of jobs of a sweep given its command-line overrides; None when it cannot be known (e.g. intervals)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        ovs = OverridesParser.create().parse_overrides(list(task_overrides))
        return math.prod(len(list(o.sweep_iterator())) if o.is_sweep_override() else 1 for o in ovs)
    except Exception:                                # noqa: BLE001 - any unsupported sweep form: unknown total
        return None


def finished_jobs(sweep_dir: Path) -> int:
    return sum(1 for _ in Path(sweep_dir).glob("*/metrics.json")) if Path(sweep_dir).is_dir() else 0


class SweepProgress(Callback):
    def __init__(self, poll_s: float = POLL_S) -> None:
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.bar = None

    def __getstate__(self) -> dict:            # launchers pickle the callbacks into the job processes
        return {"poll_s": self.poll_s}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        if os.environ.get(PROGRESS_ENV, "1") == "0" or not bool(config.get("progress", True)):
            return
        from tqdm import tqdm

        root = Path(config.hydra.sweep.dir)
        total = sweep_size(list(config.hydra.overrides.task))
        self.bar = tqdm(total=total, initial=finished_jobs(root), desc="sweep jobs", unit="job", file=sys.stderr,
                        dynamic_ncols=True)
        self._stop.clear()

        def poll() -> None:
            while not self._stop.wait(self.poll_s):
                self._update(root)

        self._thread = threading.Thread(target=poll, name="sweep-progress", daemon=True)
        self._thread.start()

    def _update(self, root: Path) -> None:
        done = finished_jobs(root)
        if self.bar is not None and done > self.bar.n:
            self.bar.update(done - self.bar.n)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        if self.bar is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._update(Path(config.hydra.sweep.dir))
        self.bar.close()
        self.bar = None
