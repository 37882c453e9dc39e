"""Benchmarks measure this host with the VM's free page reporting held (hil.hostmem; docs/hil.md "Host memory"), as
the validate and calibrate apps do, so that llama.cpp's and our cold runs see fresh memory at the same cost."""
from __future__ import annotations

import pytest

PREFAULT = 4 << 30        # B: the 1B model's page cache (Q8_0 GGUF 1.3 GB, packed file) and its INT8 tensors


@pytest.fixture(scope="session", autouse=True)
def held_page_reporting():
    from hil.hostmem import footprint_bytes, hold

    with hold("hold", footprint_bytes(0, 8, PREFAULT)) as mem:
        yield mem
