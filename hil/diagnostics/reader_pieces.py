"""How fast do two cold readers taking a file's pieces in turn read, by piece size? (docs/hil.md "Limits")

The simulator gives two or more sequential readers one aggregate device rate, `flash_multi_gbps` (the best two- or
four-reader rate of the calibration's read curve, taken with 4 MiB pieces). A plan's loaders take its load tasks
in turn, and a task's stream is a layer's blob or one tensor: 0.1-50 MB here. This measures the aggregate rate of one
and of two readers taking `piece`-byte pieces of a cold scratch file in turn (`hil.calibrate_stats.interleave`, each
reader through one descriptor in `flash_bulk_request_bytes`-sized preads into a reused buffer: the device's side
only: `hil.calibrate_reads.read_rate` at that piece size), every (piece, readers) pair once per round in a seeded
shuffled order.
Host only, measured; 15 rounds take about 30 s with a 256 MiB file.

    python -m hil.diagnostics.reader_pieces [rounds]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from hil.calibrate_reads import read_rate, scratch_file
from hil.calibrate_stats import MIB
from hil.host import DEFAULT_ROOT
from hil.timing import timing_lock

PIECES = tuple(int(p * MIB) for p in (0.25, 0.5, 1, 2, 4, 8, 16))   # B per piece
READERS = (1, 2)
REQUEST = 4 * MIB          # B per pread (at most the piece): the runner's loaders' bulk request size here
FILE_BYTES = 256 * MIB
COLD_MAX = 0.001           # resident fraction above which a read is not cold (the protocol's COLD_RESIDENT_MAX)


def rate(path: Path, piece: int, readers: int, request: int = REQUEST) -> float:
    """Aggregate GB/s of one cold read of `path` by `readers` threads taking `piece`-byte pieces in turn."""
    bps, before = read_rate(path, min(request, piece), readers, cold=True, block=piece)
    if before > COLD_MAX:
        raise RuntimeError(f"{path} stayed in the page cache after eviction: no cold read to measure")
    return bps / 1e9


def measure(path: Path, rounds: int = 15, seed: int = 1) -> dict[tuple[int, int], list[float]]:
    """(piece B, readers) -> the GB/s of each round."""
    rng = np.random.default_rng(seed)
    out: dict[tuple[int, int], list[float]] = {(p, r): [] for p in PIECES for r in READERS}
    keys = list(out)
    for _ in range(rounds):
        for k in rng.permutation(len(keys)):
            p, r = keys[k]
            out[(p, r)].append(rate(path, p, r))
    return out


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 15
    if rounds < 3:
        print("rounds must be >= 3 (medians)", file=sys.stderr)
        return 2
    with timing_lock("reader pieces"), scratch_file(Path(DEFAULT_ROOT) / "scratch", FILE_BYTES) as path:
        res = measure(path, rounds)
    print(f"cold aggregate read rate, GB/s (measured): median [min-max] of {rounds} interleaved rounds, "
          f"{FILE_BYTES >> 20} MiB file, {REQUEST >> 20} MiB requests")
    print(f"{'piece MiB':>9s} {'1 reader':>20s} {'2 readers':>20s} {'2 / 1':>6s}")
    for p in PIECES:
        a, b = np.asarray(res[(p, 1)]), np.asarray(res[(p, 2)])
        print(f"{p / MIB:9.2f} {np.median(a):6.2f} [{a.min():.2f}-{a.max():.2f}] "
              f"{np.median(b):6.2f} [{b.min():.2f}-{b.max():.2f}] {np.median(b) / np.median(a):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
