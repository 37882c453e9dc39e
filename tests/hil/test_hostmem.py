"""hil.hostmem: holding the guest's free page reporting around host measurements, on a fake parameter directory
(regular files accept any order, so the first order tried holds)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hil import hostmem


@pytest.fixture
def fake(tmp_path):
    params = tmp_path / "params"
    params.mkdir()
    (params / "page_reporting_order").write_text("5\n")
    (params / "reported_kib").write_text("1000\n")
    return params, tmp_path / "state.json"


def order(params) -> int:
    return int((params / "page_reporting_order").read_text())


def test_hold_sets_the_largest_order_and_restores(fake):
    params, state = fake
    with hostmem.hold("hold", params=params, state_file=state, change_system=True) as m:
        assert m.state == "held" and m.order_before == 5 and m.order_held == hostmem.MAX_ORDER_TRIED
        assert order(params) == hostmem.MAX_ORDER_TRIED
        assert json.loads(state.read_text())["holders"] == [os.getpid()]
        (params / "reported_kib").write_text("3048\n")
        assert m.metrics()["host_pages_reported_mib"] == pytest.approx(2.0)
        assert "5 -> 16" in m.describe()
    assert order(params) == 5 and not state.exists()


def test_restored_when_the_body_raises(fake):
    params, state = fake
    with pytest.raises(RuntimeError), hostmem.hold("hold", params=params, state_file=state, change_system=True):
        raise RuntimeError("boom")
    assert order(params) == 5 and not state.exists()


def test_nested_holds_share_one(fake):
    params, state = fake
    with hostmem.hold("hold", params=params, state_file=state, change_system=True) as a:
        with hostmem.hold("hold", params=params, state_file=state, change_system=True) as b:
            assert b is a
        assert order(params) == hostmem.MAX_ORDER_TRIED          # the inner exit does not restore
    assert order(params) == 5


def test_another_live_holder_keeps_it_held_and_a_dead_one_is_pruned(fake):
    params, state = fake
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state.write_text(json.dumps({"order_before": 5, "holders": [other.pid]}))
        (params / "page_reporting_order").write_text("16\n")    # as the other holder left it
        with hostmem.hold("hold", params=params, state_file=state, change_system=True) as m:
            assert m.order_before == 5                           # the first holder's value, not the held one
        assert order(params) == 16                               # the other holder is still running
        assert json.loads(state.read_text())["holders"] == [other.pid]
    finally:
        other.kill()
        other.wait()
    # the killed holder's record is restored at the next start, and this hold restores again at its exit
    with hostmem.hold("hold", params=params, state_file=state, change_system=True):
        pass
    assert order(params) == 5 and not state.exists()


def test_as_is_and_absent_change_nothing(fake, tmp_path):
    params, state = fake
    with hostmem.hold("as_is", prefault_bytes=1 << 20, params=params, state_file=state) as m:
        assert m.state == "as is" and order(params) == 5 and m.prefault_bytes == 0
        assert m.metrics()["host_page_reporting"] == "as is (page_reporting_order 5)"
    with hostmem.hold("hold", params=tmp_path / "missing", state_file=state, change_system=True) as m:
        assert m.state == "absent" and "host_pages_reported_mib" not in m.metrics()
    assert not state.exists()


def test_no_permission_measures_as_is(fake, monkeypatch):
    params, state = fake
    def deny(p, v):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(hostmem, "_write_order", deny)
    lines = []
    with hostmem.hold("hold", params=params, state_file=state, log=lines.append, change_system=True) as m:
        assert m.state.startswith("not held: no permission")
    assert len(lines) == 1 and "not held" in lines[0] and order(params) == 5 and not state.exists()


def test_bad_mode_is_one_line_error(fake):
    params, state = fake
    with pytest.raises(ValueError, match="host_memory: must be one of hold, as_is"):
        with hostmem.hold("keep", params=params, state_file=state):
            pass


def test_prefault_touches_and_frees(fake):
    params, state = fake
    with hostmem.hold("hold", prefault_bytes=8 << 20, params=params, state_file=state, change_system=True) as m:
        assert m.prefault_bytes == 8 << 20 and m.prefault_s > 0
        with hostmem.hold("hold", prefault_bytes=16 << 20, params=params, state_file=state,
                          change_system=True) as n:
            assert n.prefault_bytes == 16 << 20                  # a larger nested request touches more


def test_footprint_is_bounded():
    assert hostmem.footprint_bytes(1000, 5) == min(256 << 20, hostmem._available_bytes() // 2)
    big = hostmem.footprint_bytes(10**9, 8, extra_bytes=10**9)
    assert big == min(5 * 10**9, hostmem._available_bytes() // 2)


def test_prefault_backs_huge_page_blocks_too(monkeypatch):
    """The prefault touches one mapping advised MADV_HUGEPAGE (the 2 MiB blocks huge-page buffers are given) and one
    plain mapping (4 KiB pages), each once per page (docs/hil.md "Host memory")."""
    import mmap as _mmap

    made = []

    class Rec(_mmap.mmap):
        def madvise(self, option, *a):
            made[-1].append(option)
            return super().madvise(option, *a)

    def fake_mmap(*a, **kw):
        made.append([])
        return Rec(*a, **kw)

    monkeypatch.setattr(hostmem.mmap, "mmap", fake_mmap)
    assert hostmem.prefault(4 << 20) > 0
    assert len(made) == 2
    if hasattr(_mmap, "MADV_HUGEPAGE"):
        assert made == [[_mmap.MADV_HUGEPAGE], []]


def test_without_the_opt_in_no_system_setting_changes(fake):
    params, state = fake
    with hostmem.hold("hold", prefault_bytes=1 << 20, params=params, state_file=state) as m:
        assert order(params) == 5 and not state.exists() and m.prefault_bytes == 1 << 20
        assert m.state == hostmem.OFF and "change_system=false" in m.metrics()["host_page_reporting"]
    assert order(params) == 5


def test_a_sigkilled_holder_is_restored_at_the_next_start(fake):
    import signal

    params, state = fake
    code = ("import os, signal, sys; from pathlib import Path; from hil import hostmem\n"
            f"with hostmem.hold('hold', params=Path({str(params)!r}), state_file=Path({str(state)!r}), "
            "change_system=True):\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
                       timeout=60)
    assert r.returncode == -signal.SIGKILL
    assert order(params) == hostmem.MAX_ORDER_TRIED and json.loads(state.read_text())["order_before"] == 5
    lines: list[str] = []
    assert hostmem.restore_stale(params, state, lines.append, dry_run=True).startswith(f"{params}")
    assert order(params) == hostmem.MAX_ORDER_TRIED                 # a dry run changes nothing
    with hostmem.hold("as_is", params=params, state_file=state, log=lines.append):
        assert order(params) == 5                                    # restored before anything else
    assert not state.exists() and len(lines) == 2 and "restored 5" in lines[1] and str(r.args) not in lines[1]
