"""Shared fixtures: the repo's conf/ directory composed with Hydra's compose API (as the apps see it)."""
from __future__ import annotations

import os
from pathlib import Path


def _pin_blas_kernel() -> None:
    """Golden tests compare deterministic float results that depend on the OpenBLAS kernel the CPU selects: pin the
    AVX2 (Haswell) one where the CPU has AVX2, unless the caller chose (the Makefile's `test` sets it the same way).
    Effective for NumPy imported after this and for every subprocess a test starts."""
    try:
        if "OPENBLAS_CORETYPE" not in os.environ and " avx2" in Path("/proc/cpuinfo").read_text():
            os.environ["OPENBLAS_CORETYPE"] = "Haswell"
    except OSError:
        pass


_pin_blas_kernel()

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"


@pytest.fixture
def compose():
    """compose(config_name, overrides) -> DictConfig using the real conf/ tree."""
    from hydra import compose as _compose
    from hydra import initialize_config_dir

    from experiments.common import register_common

    register_common()

    def _c(config_name: str | None = None, overrides: list[str] | None = None):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return _compose(config_name=config_name, overrides=overrides or [])

    return _c


def gemm_helper_tids() -> set[int]:
    """Thread ids of this process's native GEMM-pool helpers (named "ef-gemm" by native/src/ef_pool.c): counted by
    name, so a thread some other library starts meanwhile does not change the count."""
    import os

    out = set()
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                if f.read().strip() == "ef-gemm":
                    out.add(int(t))
        except OSError:                # the thread ended meanwhile
            pass
    return out


def gemm_helpers_gone(tids: set[int], timeout_s: float = 5.0) -> bool:
    """Whether none of `tids` is a GEMM-pool helper any more, waiting up to `timeout_s`: a joined thread's
    /proc/self/task entry outlives pthread_join by a moment (the kernel wakes the joiner when it clears the thread's
    tid, before it releases the task), which one clean-clone run caught with its name still "ef-gemm"."""
    import time

    deadline = time.monotonic() + timeout_s
    while gemm_helper_tids() & tids:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
