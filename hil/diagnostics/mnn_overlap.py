"""Does MNN's cold load hide the weight file's read behind its weight set-up? (docs/hil.md "The MNN peer")

Per converted directory, interleaved over `rounds`: a cold `create` + `load` (every file evicted first), a warm one,
a cold plain read of the same files and a warm one. A load that read first and set up after would take the cold read's
extra time more when cold; `exposed` = cold load - warm load against `cold read - warm read` says how much of the read
shows. Host only, measured; it takes about a minute on the four directories of the MNN peer set.

    python -m hil.diagnostics.mnn_overlap [rounds]
"""
from __future__ import annotations

import gc
import statistics
import sys
import time
from pathlib import Path

from hil.calibrate_mnn import read_all
from hil.mnn_convert import MNN_DIR
from hil.mnn_peer import _mnn_llm, evict_files, model_files
from hil.timing import timing_lock

KINDS = ("cold_load", "warm_load", "cold_read", "warm_read")


def overlap(dirs: list[Path], rounds: int = 5) -> dict[str, dict[str, float]]:
    """Per directory name: the median seconds of each of KINDS and `exposed_share` (module doc)."""
    llm = _mnn_llm()

    def load(d: Path) -> float:
        gc.collect()
        t0 = time.perf_counter()
        m = llm.create(str(d / "config.json"))
        m.set_config({"thread_num": 2, "use_mmap": False})
        m.load()
        t = time.perf_counter() - t0
        del m
        return t

    times = {d.name: {k: [] for k in KINDS} for d in dirs}
    with timing_lock("MNN load overlap"):
        for _ in range(rounds):
            for d in dirs:
                files, t = model_files(d), times[d.name]
                evict_files(files)
                t["cold_load"].append(load(d))
                t["warm_load"].append(load(d))
                evict_files(files)
                t["cold_read"].append(read_all(files))
                t["warm_read"].append(read_all(files))
    out = {}
    for name, t in times.items():
        med = {k: statistics.median(v) for k, v in t.items()}
        extra_read = med["cold_read"] - med["warm_read"]
        med["exposed_share"] = (med["cold_load"] - med["warm_load"]) / extra_read if extra_read > 0 else float("nan")
        out[name] = med
    return out


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 5
    dirs = sorted(p for p in MNN_DIR.iterdir() if p.is_dir()) if MNN_DIR.is_dir() else []
    if not dirs:
        print(f"no converted MNN directories under {MNN_DIR} (python -m hil.mnn_convert)", file=sys.stderr)
        return 2
    print(f"MNN cold vs warm load and read, medians of {rounds} interleaved rounds (s, measured)")
    print(f"{'directory':44s} {'cold load':>9s} {'warm load':>9s} {'cold read':>9s} {'warm read':>9s} {'exposed':>8s}")
    for name, m in overlap(dirs, rounds).items():
        print(f"{name:44s} {m['cold_load']:9.3f} {m['warm_load']:9.3f} {m['cold_read']:9.3f} {m['warm_read']:9.3f} "
              f"{m['exposed_share']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
