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


# Test files that use machine-wide state: network namespaces, cgroups, fixed TCP ports, the kernel's tracefs, or
# checks that no cluster resources of any process are left (`leftovers(None)`). Under pytest-xdist they are one unit of
# scheduling, so no two of them run at the same time.
MACHINE_WIDE = ("tests/hil_cluster/", "tests/badinput/test_cluster_cleanup.py", "tests/hil/test_schedtrace.py",
                "tests/hil/test_validate_app.py")


@pytest.hookimpl(optionalhook=True)        # a pytest-xdist hook: `make test` runs `-n 2`
def pytest_xdist_make_scheduler(config, log):
    """Each test file is one unit of scheduling, so its module- and session-scoped fixtures (the real model, packed
    files, a calibrated store) are built once, not once per worker; the MACHINE_WIDE files are one unit together.
    (A scheduler, not `--dist loadgroup` marks: xdist 3.8 renames grouped items through `Item._nodeid`, which pytest 9
    no longer reads, so the groups would be silently ignored.)"""
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "machine" if path.startswith(MACHINE_WIDE) else path

    return FileScheduling(config, log)


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
