"""hil.runner_state.FreshArena: the runner's fresh memory (page-aligned, untouched, never recycled, freed with its
arrays), with and without transparent huge pages."""
from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

from hil.host import thp_mode
from hil.runner_state import PAGE, FreshArena


@pytest.mark.parametrize("huge", [True, False])
def test_buffers_are_page_aligned_disjoint_and_zero(huge):
    a = FreshArena(chunk=1 << 20, huge=huge)
    sizes = [1, 4095, 4096, 4097, 100_003, 300_000, 262_144]
    bufs = [a.empty(n) for n in sizes]
    for b, n in zip(bufs, sizes):
        assert b.dtype == np.uint8 and b.size == n and b.ctypes.data % PAGE == 0
        assert not b.any()                                # fresh anonymous memory reads as zeros
    spans = sorted((b.ctypes.data, b.ctypes.data + b.size) for b in bufs)
    assert all(hi <= lo2 for (_, hi), (lo2, _) in zip(spans, spans[1:]))
    for i, b in enumerate(bufs):                          # writing one leaves the others as they were
        b[:] = i + 1
    assert all((b == i + 1).all() for i, b in enumerate(bufs))


def test_zero_bytes_and_large_buffers():
    a = FreshArena(chunk=1 << 20)
    assert a.empty(0).size == 0
    big = a.empty(3 << 20)                                # beyond half a chunk: a mapping of its own
    small = a.empty(4096)
    assert big.size == 3 << 20 and not (big.ctypes.data <= small.ctypes.data < big.ctypes.data + big.size)


def test_a_chunk_is_unmapped_when_its_arrays_are_gone():
    a = FreshArena(chunk=1 << 20)
    b = a.empty(600_000)
    chunk = b.base                                        # the chunk's array (its buffer is the mmap)
    ref = weakref.ref(chunk)
    a.empty(600_000)                                      # does not fit: a new chunk becomes current
    del b, chunk
    gc.collect()
    assert ref() is None


def test_concurrent_allocations_do_not_overlap():
    a = FreshArena(chunk=1 << 20)
    got: list[np.ndarray] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [a.empty(5000 + 4096 * (i % 7)) for i in range(200)]
        with lock:
            got.extend(mine)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    spans = sorted((b.ctypes.data, b.ctypes.data + b.size) for b in got)
    assert len(spans) == 800 and all(hi <= lo2 for (_, hi), (lo2, _) in zip(spans, spans[1:]))


def test_thp_mode_is_a_known_word():
    assert thp_mode() in {"always", "madvise", "never", "unavailable"}
