"""Host calibration (hil/calibrate.py, hil/host.py), the measured-table cost model (planner/cost/table.py) and the
calibrate app. One quick calibration per module (a few seconds); no timing thresholds: only structure, the profile
store's decisions and the cost model's rules are checked."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import types

import pytest

from experiments import calibrate_fit as fit
from hil import calibrate as cal
from hil import calibrate_compute as comp
from hil import calibrate_reads as reads
from hil import calibrate_stats as stats
from hil import host
from planner.cost import AnalyticCostModel, TableCostModel, make_cost_model
from planner.device import SocProfile
from planner.host_runtime import CORUN_CLASSES, HostRuntime
from planner.plan import OpWork
from tests.conftest import REPO


@pytest.fixture(scope="module")
def quick_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("hoststore")
    lines: list[str] = []
    got = fit.host_profile(root, quick=True, log=lines.append)
    return root, got, got.cost_table, lines


def test_quick_calibration_writes_a_valid_profile_and_table(quick_store):
    root, got, table, lines = quick_store
    assert len(lines) == 1 and lines[0].startswith("host profile: measured")
    d = table.parent
    link = root / (host.host_identity().id_hash() + "-quick")
    assert link.is_symlink() and link.resolve() == d                # one version directory, swapped in whole
    assert {p.name for p in d.iterdir()} == {"device.json", "runtime.json", "cost_table.json", "identity.json",
                                             "measurements.json", "manifest.json"}
    assert host.check_manifest(d) == ""
    assert not list((root / "scratch").glob("*")), "scratch file left behind"
    doc = json.loads((d / "device.json").read_text())
    rdoc = json.loads((d / "runtime.json").read_text())
    again = SocProfile(**doc["profile"])                        # the schema accepts it (all > 0 checks)
    prof, rt = got.device, got.runtime
    assert again == prof and HostRuntime(**rdoc["runtime"]) == rt and prof.name == "host" and doc["quick"] is True
    for cls, part in ((SocProfile, doc), (HostRuntime, rdoc)):   # every value says where it comes from
        for f in dataclasses.fields(cls):
            if f.name not in ("name", "soc", "source"):
                assert part["sources"].get(f.name), f.name
    sources = {**doc["sources"], **rdoc["sources"]}
    assert prof.cpu_big_cores == host.host_identity().physical_cores and prof.cpu_little_cores == 0
    assert prof.npu_setup_s == 0 and rt.npu_on_cpu_core and prof.read_cpu_gbps > 0 and prof.dram_gbps > 0
    assert doc["sources"]["flash_peak_gbps"].startswith("measured")
    assert doc["sources"]["power_big_core_w"].startswith("assumed")
    model = make_cost_model("table", prof, str(table))
    assert ("npu", "matmul") in model.fitted_kinds() and ("cpu", "unpack") in model.fitted_kinds()
    times = [model.op_time(OpWork("matmul", m=m, k=576, n=576), "npu") for m in (1, 16, 128, 1024)]
    assert all(t > 0 for t in times) and times == sorted(times)
    bw = [0] * 9
    bw[5] = 1 << 20
    assert model.op_time(OpWork("unpack", weights=1 << 20, fmt="weightlet", bits_weights=bw), "cpu") > 0
    assert model.copy_time(1 << 20) > 0
    # the runner's per-op cost and its wake-ups, the read overlap and the first-touch curve are measured
    # a clamped difference (runner cycle minus the bare kernel calls, which carry ~5 us of wrapper Python each):
    # 0 on hosts where the runner's compiled step is as cheap as the checked wrapper (as unpack_tensor_s below)
    assert 0 <= prof.cpu_op_overhead_s < rt.thread_wake_s * 2 + 1e-3 and rt.thread_wake_s > 0
    assert 0 <= rt.read_cpu_overlap <= 1 and rt.mem_fault_gbps > 0 and rt.mem_fault_large_gbps > 0
    assert 0 <= rt.read_cpu_overlap_multi <= 1                 # measured with two readers (not the -1 default)
    assert rt.read_cpu_multi >= 1                               # two readers' CPU per byte / one's (noise: 1)
    assert rt.load_tensor_s > 0 and rt.unpack_tensor_s >= 0 and rt.interpreter_lock
    # the runner's GEMM pool: only GEMMs split, helpers poll for the runner's window, their wake-up measured
    from hil.runner_state import POOL_SPIN_US
    assert rt.cpu_split_gemm_only and rt.gemm_pool_spin_s == pytest.approx(POOL_SPIN_US * 1e-6)
    if (os.cpu_count() or 1) > 1:
        assert rt.gemm_pool_wake_s >= 0 and sources["gemm_pool_wake_s"].startswith("measured")
        assert raw_pool_wake(d) is not None
    corun = tuple(f"corun_{c}{kind}" for c in CORUN_CLASSES for kind in ("", "_mem"))   # beside compute / memory work
    assert all(getattr(rt, k) >= 1.0 for k in corun)            # busy / alone ratios (noise below 1 taken as 1)
    raw = json.loads((d / "measurements.json").read_text())
    assert set(raw["corun"]) == {k.removeprefix("corun_") for k in corun}
    assert all(v["median"] > 0 and v["n"] >= 3 for v in raw["corun"].values())
    for key in ("read_cpu_overlap", "read_cpu_overlap_multi"):    # the simulator's read model fitted to measured reads
        assert sources[key].startswith("fitted") and "measured" in sources[key], key
    st = raw["settings"]
    for readers, wall, key in ((1, "fresh_wall", "read_cpu_overlap"), (2, "fresh_wall_2", "read_cpu_overlap_multi")):
        meas = raw["cold_read_s_per_byte"][wall]["median"] * st["scratch_bytes"]
        eta = rt.read_overlap(readers)

        def sim(e: float, readers=readers, key=key) -> float:
            return fit.simulated_read_s(prof, dataclasses.replace(rt, **{key: min(1.0, max(0.0, e))}),
                                        st["scratch_bytes"], st["overlap_blob_bytes"], raw["bulk_request_bytes"],
                                        readers)
        # the fitted share brackets the measured read: the simulated read is not continuous in eta (two readers,
        # 256 MiB: 0.145 s at eta 0, 0.133 at 0.005), so the measured time can fall in a jump
        lo, hi = sorted((sim(eta + 1e-6), sim(eta - 1e-6)))
        assert lo * (1 - 1e-3) <= meas <= hi * (1 + 1e-3) or eta in (0.0, 1.0), (readers, lo, hi, meas, eta)
    for key in ("thread_wake_s", "mem_fault_large_gbps", "cpu_op_overhead_s", "load_tensor_s", "read_cpu_multi",
                "unpack_tensor_s", *corun):
        assert sources[key].startswith("measured"), key
    el = OpWork("elementwise", nbytes=4096)                     # the runner runs it on one thread in any pool
    assert model.op_time(el, "cpu", 2) == model.op_time(el, "cpu", 1)
    if (os.cpu_count() or 1) > 1:                               # wake-up packing: where woken threads ran
        pack = raw["wake_pack"]
        assert [r["gap_us"] for r in pack] == list(comp.PACK_GAPS_US)
        assert all(0 <= r["share"] <= 1 and r["idle_s"] > 0 for r in pack)
        assert (rt.thread_wake_pack_idle_s, rt.thread_wake_pack_share) == comp.pack_threshold(pack)
        assert sources["thread_wake_pack_share"].startswith("measured")


def test_pack_threshold_is_the_least_squares_step_over_the_curve():
    def rows(*pts):
        return [dict(gap_us=g, idle_s=i, share=sh) for g, (i, sh) in enumerate(pts)]

    # 0.2 below 80 us, 0.6 / 0.4 / 0.9 / 0.8 from there: the step at 80 us (SSE 0.19) beats one at 60 (0.33) or 160
    assert comp.pack_threshold(rows((60e-6, 0.2), (80e-6, 0.6), (110e-6, 0.4), (160e-6, 0.9), (260e-6, 0.8))) \
        == pytest.approx((80e-6, 0.675))
    flat = rows((1e-4, 0.1), (2e-4, 0.07), (6e-4, 0.13), (2e-3, 0.1))            # a low share at every idle time
    assert comp.pack_threshold(flat) == pytest.approx((1e-4, 0.1))
    near = rows((1e-4, 0.5), (3e-4, 0.43), (6e-4, 0.47), (1.1e-3, 0.57))         # around 0.5: no all-or-nothing
    assert comp.pack_threshold(near) == pytest.approx((1e-4, 0.4925))
    late = rows((1e-4, 0.0), (3e-4, 0.02), (1e-3, 0.8), (2e-3, 0.9))
    assert comp.pack_threshold(late) == pytest.approx((1e-3, 0.85))
    assert comp.pack_threshold(rows((1e-4, 0.0), (2e-4, 0.0))) == (0.0, 0.0)     # never: not modelled
    assert host.kernel_hz() in (None, 100, 250, 300, 1000)


def raw_pool_wake(d):
    return json.loads((d / "measurements.json").read_text()).get("pool_wake_s")


def test_stored_profile_is_loaded_when_identity_matches(quick_store, monkeypatch):
    root, prof, _table, _ = quick_store
    monkeypatch.setattr(fit, "measure_and_store", lambda *a, **k: pytest.fail("re-measured a matching profile"))
    lines: list[str] = []
    got = fit.host_profile(root, quick=True, log=lines.append)
    assert got == prof and got.cost_table.is_file()
    assert len(lines) == 1 and lines[0].startswith("host profile: loaded")


def test_a_full_profile_serves_quick_requests_and_is_preferred(quick_store, monkeypatch, tmp_path):
    _root, prof, table, _ = quick_store
    root = tmp_path / "store"
    ident = host.host_identity()
    full = root / ident.id_hash()
    shutil.copytree(table.parent, full)
    shutil.copytree(table.parent, root / f"{ident.id_hash()}-quick")
    doc = json.loads((full / "device.json").read_text())
    doc["quick"] = False
    (full / "device.json").write_text(json.dumps(doc))
    host.seal(full)                                              # an edit the manifest records
    monkeypatch.setattr(fit, "measure_and_store", lambda *a, **k: pytest.fail("re-measured"))
    lines: list[str] = []
    for quick in (True, False):
        t = fit.host_profile(root, quick=quick, log=lines.append).cost_table
        assert t == full / "cost_table.json"
    assert all(f"loaded {full} " in line for line in lines)


def _spy(calls, prof, table):
    def measure(root, ident, quick, log=None, rounds=None, memory="hold", huge=True):
        calls.append((ident, quick))
        return prof, 0.0
    return measure


def test_profile_of_another_machine_is_remeasured(quick_store, monkeypatch, tmp_path):
    root, prof, table, _ = quick_store
    calls: list = []
    monkeypatch.setattr(fit, "measure_and_store", _spy(calls, prof, table))
    real = host.host_identity()
    other = dataclasses.replace(real, cpu_model="Some Other CPU", physical_cores=real.physical_cores + 6)
    # the stored directory copied under the other machine's hash: identity.json still says the real machine
    shutil.copytree(table.parent, root / f"{other.id_hash()}-quick", dirs_exist_ok=True)
    monkeypatch.setattr(host, "host_identity", lambda: other)
    lines: list[str] = []
    fit.host_profile(root, quick=True, log=lines.append)
    assert len(calls) == 1 and calls[0][0] == other
    assert "another machine" in lines[0] and "cpu_model" in lines[0]
    # a new machine with nothing stored: measured as well
    monkeypatch.setattr(host, "host_identity", lambda: dataclasses.replace(real, kernel_release="0.0-test"))
    fit.host_profile(root, quick=True, log=lines.append)
    assert len(calls) == 2 and "no stored profile" in lines[1]


def test_profile_measured_with_another_memory_mode_is_remeasured(quick_store, monkeypatch, tmp_path):
    _root, prof, table, _ = quick_store
    stored = json.loads((table.parent / "device.json").read_text())["host_memory"]
    assert stored["mode"] == "hold" and stored["state"]          # what hil.hostmem did during the calibration
    root = tmp_path / "store"
    quick_name = host.store_dir(root, quick=True).name
    assert host.store_dir(root, quick=True, memory="as_is").name == quick_name + "-as_is"     # kept apart
    d = host.store_dir(root, quick=True, memory="as_is")
    shutil.copytree(table.parent, d)                             # a held profile where an as-is one belongs
    calls: list = []
    monkeypatch.setattr(fit, "measure_and_store", _spy(calls, prof, table))
    lines: list[str] = []
    fit.host_profile(root, quick=True, log=lines.append, memory="as_is")
    assert len(calls) == 1 and "host_memory=hold (asked: as_is)" in lines[0]
    doc = json.loads((d / "device.json").read_text())
    del doc["host_memory"]                                       # a profile from before hil.hostmem: as is
    (d / "device.json").write_text(json.dumps(doc))
    host.seal(d)
    fit.host_profile(root, quick=True, log=lines.append, memory="as_is")
    assert len(calls) == 1 and "loaded" in lines[1]


def test_profile_measured_with_other_huge_pages_is_remeasured(quick_store, monkeypatch, tmp_path):
    _root, prof, table, _ = quick_store
    assert json.loads((table.parent / "device.json").read_text())["huge_pages"] is True     # the default
    root = tmp_path / "store"
    d = host.store_dir(root, quick=True, huge=False)
    assert d.name == host.store_dir(root, quick=True).name + "-4k"     # kept apart from the huge-page profile
    shutil.copytree(table.parent, d)                             # a huge-page profile where a 4 KiB one belongs
    calls: list = []
    monkeypatch.setattr(fit, "measure_and_store", _spy(calls, prof, table))
    lines: list[str] = []
    fit.host_profile(root, quick=True, log=lines.append, huge=False)
    assert len(calls) == 1 and "huge_pages=True (asked: False)" in lines[0]
    doc = json.loads((d / "device.json").read_text())
    del doc["huge_pages"]                                        # a profile from before huge pages: 4 KiB pages
    (d / "device.json").write_text(json.dumps(doc))
    host.seal(d)
    fit.host_profile(root, quick=True, log=lines.append, huge=False)
    assert len(calls) == 1 and "loaded" in lines[1]


def test_quick_profile_does_not_serve_a_full_request(quick_store, monkeypatch):
    root, prof, table, _ = quick_store
    calls: list = []
    monkeypatch.setattr(fit, "measure_and_store", _spy(calls, prof, table))
    lines: list[str] = []
    fit.host_profile(root, quick=False, log=lines.append)
    fit.host_profile(root, quick=True, remeasure=True, log=lines.append)
    assert [q for _i, q in calls] == [False, True]
    assert "no stored profile" in lines[0] and "full calibration" in lines[0] and "remeasure requested" in lines[1]


def test_a_store_of_another_version_says_to_recalibrate(quick_store, monkeypatch, tmp_path):
    _root, prof, table, _ = quick_store
    root = tmp_path / "store"
    d = host.store_dir(root, quick=True)
    shutil.copytree(table.parent, d)
    doc = json.loads((d / "device.json").read_text())
    doc["version"] = host.STORE_VERSION - 1                      # a store from before device / runtime were split
    (d / "device.json").write_text(json.dumps(doc))
    monkeypatch.setattr(fit, "measure_and_store", lambda *a, **k: pytest.fail("re-measured an old store silently"))
    with pytest.raises(ValueError, match="recalibrate: python -m experiments.calibrate device=host remeasure=true"):
        fit.host_profile(root, quick=True, log=lambda m: None)
    calls: list = []
    monkeypatch.setattr(fit, "measure_and_store", _spy(calls, prof, table))
    fit.host_profile(root, quick=True, remeasure=True, log=lambda m: None)       # remeasure replaces it
    assert len(calls) == 1


def test_marker_config_and_bad_markers(quick_store, monkeypatch):
    root, prof, _table, _ = quick_store
    assert host.is_host_marker({"name": "host", "measured": True, "store": ""})
    assert not host.is_host_marker({"name": "xiaomi15pro", "flash_peak_gbps": 2.8})
    got = fit.host_from_marker({"name": "host", "measured": True, "store": str(root)}, quick=True,
                               log=lambda m: None)
    assert got == prof
    with pytest.raises(ValueError, match="device.flash_peak_gbps"):
        fit.host_from_marker({"name": "host", "measured": True, "store": str(root), "flash_peak_gbps": 1.0})
    with pytest.raises(ValueError, match="device.measured"):
        fit.host_from_marker({"name": "host", "measured": False})


def test_scratch_file_is_removed_on_error(tmp_path):
    with pytest.raises(RuntimeError):
        with reads.scratch_file(tmp_path, 16 * cal.MIB) as p:
            assert p.stat().st_size == 16 * cal.MIB
            raise RuntimeError("boom")
    assert not list(tmp_path.glob("*.bin"))
    (tmp_path / "read-999999999.bin").write_bytes(b"x")          # left by a dead process: cleaned up next time
    with reads.scratch_file(tmp_path, 16 * cal.MIB):
        pass
    assert not list(tmp_path.glob("*.bin"))


def test_reader_fit_recovers_latency_and_bandwidth():
    lat, bw = 1e-4, 2.0                                          # s, GB/s
    rows = [dict(request_bytes=r, threads=1, gbps=r / (lat + r / (bw * 1e9)) / 1e9, spread=0.0)
            for r in (64 << 10, 1 << 20, 16 << 20)]
    rows.append(dict(request_bytes=16 << 20, threads=2, gbps=3.5, spread=0.0))
    curve = reads.ReadCurve(rows)
    got_lat, got_bw = reads.fit_reader(curve)
    assert got_lat == pytest.approx(lat, rel=1e-6) and got_bw == pytest.approx(bw, rel=1e-6)
    assert reads.bulk_request(curve) == 16 << 20
    # rows of a 64 MiB file that each include a 10 ms stream start-up: less it, the same steady fit
    size, start = 64 << 20, 0.01
    slow = reads.ReadCurve([dict(r, gbps=size / (size / (r["gbps"] * 1e9) + start) / 1e9) for r in rows])
    assert reads.fit_reader(slow)[1] < 0.9 * bw
    got_lat, got_bw = reads.fit_reader(slow, start, size)
    assert got_lat == pytest.approx(lat, rel=1e-6) and got_bw == pytest.approx(bw, rel=1e-6)


def test_stream_start_is_the_intercept_of_a_cold_read(tmp_path, monkeypatch):
    """A real cold read of a 16 MiB scratch file on a clock under the test's control: the first 1 MiB piece takes
    5 ms more than the steady 1 ms per piece, so the intercept of time vs bytes is 5 ms (and >= 0 on the real clock;
    no comparison of two real timings, which moves with the host's load)."""
    with reads.scratch_file(tmp_path, 16 * cal.MIB) as p:
        assert reads.stream_start(p, 1 * cal.MIB) >= 0 and reads.measure_stream_start(p, cal.MIB, 2 * cal.MIB, 3).n == 3
        ticks = iter([0.0] + [0.005 + 0.001 * k for k in range(1, 17)])
        with monkeypatch.context() as m:
            m.setattr(reads, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
            assert reads.stream_start(p, 1 * cal.MIB) == pytest.approx(0.005, rel=1e-9)
    with pytest.raises(ValueError, match="fewer than 4 pieces"), reads.scratch_file(tmp_path, 16 * cal.MIB) as p:
        reads.stream_start(p, 8 * cal.MIB)


def test_unpack_first_touch_is_measured_through_the_unpack_kernel():
    """Fresh outputs written by the real unpack kernel cost first touch beyond the same unpacks again, per byte
    within the plausible range of page faults + zeroing (0.01-20 ns/B)."""
    s = cal.CalibrationSettings.make(quick=True)
    st = cal.measure_unpack_touch(s, 512, cal.UNPACK_TOUCH_D, total=16 * cal.MIB)
    assert st.n == 3 and 1e-11 < st.median < 2e-8


def test_corunner_works_only_while_busy_and_ends_on_every_exit():
    from hil.calibrate_corun import CoRunner

    with CoRunner("compute") as co:
        assert co.proc.pid != os.getpid() and co.proc.is_alive()      # compute: another process
        with co.busy():
            time.sleep(0.05)
        busy_cpu = co.cpu.value
        assert busy_cpu > 0.01 and 0 < co.utilisation() <= 1.2
        time.sleep(0.1)                                      # switched off: no work is added
        assert co.cpu.value == busy_cpu
    assert not co.proc.is_alive()
    with pytest.raises(RuntimeError, match="boom"), CoRunner("memory") as co:
        with co.busy():
            raise RuntimeError("boom")
    assert not co.proc.is_alive()
    with pytest.raises(ValueError, match="compute or memory"):
        CoRunner("gpu")


# ---- table cost model ------------------------------------------------------------------------------------------------
def _table(**kw) -> TableCostModel:
    unpack = [dict(fmt="weightlet", bits=b, threads=1, s_per_weight=1e-10 * (1 + b)) for b in (1, 3, 5, 8)]
    matmul = [dict(unit="npu", threads=1, m=m, k=k, n=n, seconds=1e-5 + 2 * m * k * n / 1e11)
              for m in (1, 16, 128) for k, n in ((576, 576), (2048, 8192))]
    return TableCostModel(kw.get("points", []), kw.get("fallback"), unpack, matmul, kw.get("over", {}))


def _bw(**by_bits: int) -> list[int]:
    out = [0] * 9
    for k, v in by_bits.items():
        out[int(k[1:])] = v
    return out


def test_table_unpack_honours_bit_width_and_format():
    t = _table(points=[{"unit": "cpu", "kind": "unpack", "work": 1e6, "seconds": 7e-4}])
    n = 1 << 20
    t3 = t.op_time(OpWork("unpack", weights=n, fmt="weightlet", bits_weights=_bw(b3=n)), "cpu")
    t5 = t.op_time(OpWork("unpack", weights=n, fmt="weightlet", bits_weights=_bw(b5=n)), "cpu")
    assert t3 < t5
    assert t3 == pytest.approx(n * 4e-10) and t5 == pytest.approx(n * 6e-10)
    mixed = t.op_time(OpWork("unpack", weights=3 * n, fmt="weightlet", bits_weights=_bw(b3=n, b5=2 * n)), "cpu")
    assert mixed == pytest.approx(t3 + 2 * t5)
    # 4 bits was not measured: nearest measured width (3 and 5 tie -> the lower), 0 bits -> the 1-bit row
    assert t.op_time(OpWork("unpack", weights=n, fmt="weightlet", bits_weights=_bw(b4=n)), "cpu") == pytest.approx(t3)
    assert t.op_time(OpWork("unpack", weights=n, fmt="weightlet", bits_weights=_bw(b0=n)), "cpu") == \
        pytest.approx(n * 2e-10)
    # no histogram, or a format / thread count without rows: the old per-weight fit
    old = OpWork("unpack", weights=n, fmt="weightlet")
    assert t.op_time(old, "cpu") == pytest.approx(n * 7e-10)
    assert t.op_time(OpWork("unpack", weights=n, fmt="kquant", bits_weights=_bw(b5=n)), "cpu") == \
        pytest.approx(n * 7e-10)
    with pytest.raises(KeyError, match="2 thread"):              # rows are 1-thread; no 2-thread fit, no fallback
        t.op_time(OpWork("unpack", weights=n, fmt="weightlet", bits_weights=_bw(b5=n)), "cpu", 2)


def test_table_matmul_grid_grows_with_m_and_kn():
    t = _table(over={"npu": 1e-6})
    def mm(m, k=576, n=576):
        return t.op_time(OpWork("matmul", m=m, k=k, n=n), "npu")
    ms = [1, 8, 16, 64, 128, 512]
    assert [mm(m) for m in ms] == sorted(mm(m) for m in ms) and mm(512) > mm(128) > mm(1)
    assert mm(16) == pytest.approx(1e-5 + 2 * 16 * 576 * 576 / 1e11 + 1e-6)          # measured point (+ overhead)
    assert mm(256) == pytest.approx((mm(128) - 1e-6) * 2 + 1e-6)                       # beyond M_max: x M / M_max
    assert mm(16, 2048, 8192) > mm(16, 576, 576)
    # (K, N) not measured: nearest curve scaled by K N / (K' N')
    assert mm(16, 576, 1152) == pytest.approx((mm(16) - 1e-6) * 2 + 1e-6)
    assert mm(16, 2048, 16384) > mm(16, 2048, 8192) > mm(16, 1024, 4096)
    head = OpWork("lm_head", m=1, k=576, n=49152)
    assert t.op_time(head, "npu") > mm(1)
    # units / thread counts without a grid and K-quant weights fall back
    fb = AnalyticCostModel(_xiaomi())
    t2 = _table(fallback=fb)
    w = OpWork("matmul", m=16, k=576, n=576)
    assert t2.op_time(w, "cpu") == fb.op_time(w, "cpu")
    assert t2.op_time(w, "npu", 2) == fb.op_time(w, "npu", 2)
    kq = OpWork("matmul", m=16, k=576, n=576, wfmt="kquant")
    assert t2.op_time(kq, "npu") == fb.op_time(kq, "npu")


def test_table_attention_costs_per_query_row_where_rows_are_given():
    """Attention points with `rows` (m x heads) fit seconds = a + r rows + b FLOPs: a 16-token prefill (144 rows, few
    keys each) and a decode token over 128 keys (9 rows) of equal FLOPs cost what was measured, not the same."""
    a, r, b = 14e-6, 0.45e-6, 4e-11
    shapes = [(1, 128, 9), (16, 0, 9), (128, 0, 9), (128, 128, 9), (16, 0, 32)]

    def work(m, past, H):
        return OpWork("attention", m=m, ctx=past + (m + 1) // 2, heads=H, head_dim=64)
    pts = [dict(unit="cpu", kind="attention", work=work(*sh).flops, seconds=a + r * sh[0] * sh[2] + b * work(*sh).flops,
                rows=sh[0] * sh[2]) for sh in shapes]
    model = TableCostModel(pts)
    for sh in shapes + [(64, 0, 9)]:
        assert model.op_time(work(*sh), "cpu") == pytest.approx(a + r * sh[0] * sh[2] + b * work(*sh).flops, rel=1e-6)
    dec, pre = model.op_time(work(1, 128, 9), "cpu"), model.op_time(work(16, 0, 9), "cpu")
    assert pre > 2 * dec
    flat = TableCostModel([{k: v for k, v in p.items() if k != "rows"} for p in pts])   # old tables: FLOPs only
    assert flat.op_time(work(16, 0, 9), "cpu") < 0.7 * pre


def test_table_noisy_curve_is_made_monotonic():
    rows = [dict(unit="cpu", m=m, k=64, n=64, seconds=s) for m, s in ((1, 2e-5), (2, 1e-5), (4, 3e-5))]
    t = TableCostModel([], matmul=rows)
    assert t.op_time(OpWork("matmul", m=2, k=64, n=64), "cpu") == pytest.approx(2e-5)


def test_old_format_tables_still_load_and_bad_rows_name_themselves(tmp_path):
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"points": [{"unit": "cpu", "kind": "matmul", "work": 1e9, "seconds": 0.01}]}))
    t = TableCostModel.from_json_file(str(p))
    assert t.op_time(OpWork("matmul", m=100, k=1000, n=1000), "cpu") == pytest.approx(0.002)
    assert t.fitted_kinds() == [("cpu", "matmul")]
    p.write_text(json.dumps({"points": [], "unpack": [{"fmt": "weightlet", "bits": 9, "s_per_weight": 1e-9}]}))
    with pytest.raises(ValueError, match="unpack row 0"):
        TableCostModel.from_json_file(str(p))
    p.write_text(json.dumps({"points": [], "matmul": [{"unit": "npu", "m": 0, "k": 1, "n": 1, "seconds": 1}]}))
    with pytest.raises(ValueError, match="matmul row 0"):
        TableCostModel.from_json_file(str(p))
    point = {"unit": "cpu", "kind": "matmul", "work": 1e9, "seconds": 0.01}
    p.write_text(json.dumps({"points": [point], "op_overhead_s": {"npu": -1}}))
    with pytest.raises(ValueError, match="op_overhead_s.npu"):
        TableCostModel.from_json_file(str(p))
    p.write_text(json.dumps({"points": [], "unpack": [], "matmul": []}))   # not a silent analytic model
    with pytest.raises(ValueError, match="no measured rows"):
        TableCostModel.from_json_file(str(p))


def _xiaomi() -> SocProfile:
    import yaml

    d = yaml.safe_load((REPO / "conf" / "device" / "xiaomi15pro.yaml").read_text())
    d.pop("defaults", None)
    return SocProfile(**d)


# ---- the app ---------------------------------------------------------------------------------------------------------
def test_calibrate_app_quick_run_and_bad_input(quick_store, tmp_path):
    root = quick_store[0]
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "experiments.calibrate", "quick=true", "remeasure=false",
                        f"device.store={root}", f"hydra.run.dir={run}"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads((run / "metrics.json").read_text())
    assert "device.flash_peak_gbps" in m["measured_keys"] and "device.power_idle_w" in m["input_keys"]
    assert m["modelled_keys"] == [] and m["profile_dir"].startswith(str(root))
    assert (run / "read_bandwidth.png").stat().st_size > 0 and (run / "gemm_gops.png").stat().st_size > 0
    bad = subprocess.run([sys.executable, "-m", "experiments.calibrate", "device=xiaomi15pro"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "device" in bad.stderr


def test_numpy_stand_in_kernels_run_when_native_compute_is_missing():
    import numpy as np

    k = comp.Kernels()
    k.nc, k.label = None, "numpy stand-in (test)"
    rng = np.random.default_rng(0)
    k.gemm_call(4, 64, 96, 2, rng)()
    for op, (fn, nbytes) in k.elementwise_calls(3, 128, rng).items():
        fn()
        assert nbytes > 0, op
    fn, flops = k.attention_call(4, 8, 4, 2, 16, rng)
    fn()
    assert flops == 4.0 * 4 * (8 + 2.5) * 4 * 16


def test_table_unpack_adds_a_per_channel_cost_where_measured():
    rows = [{"fmt": "weightlet", "bits": 5, "threads": 1, "s_per_weight": 5e-11, "s_per_channel": 2e-8}]
    t = TableCostModel([], None, rows)
    n, ch = 576 * 1536, 1536
    w = OpWork("unpack", weights=n, fmt="weightlet", bits_weights=_bw(b5=n), bits_channels=_bw(b5=ch))
    assert t.op_time(w, "cpu") == pytest.approx(n * 5e-11 + ch * 2e-8)
    no_channels = OpWork("unpack", weights=n, fmt="weightlet", bits_weights=_bw(b5=n))
    assert t.op_time(no_channels, "cpu") == pytest.approx(n * 5e-11)
    # a table without per-channel costs (older calibrations) charges weights only
    old = TableCostModel([], None, [{"fmt": "weightlet", "bits": 5, "threads": 1, "s_per_weight": 5e-11}])
    assert old.op_time(w, "cpu") == pytest.approx(n * 5e-11)


def test_unpack_calibration_separates_per_weight_and_per_channel_cost():
    """Two shapes, long and short rows: t / C = D w + c solved per bit width (quick settings, real kernels)."""
    s = cal.CalibrationSettings.make(quick=True)
    s = dataclasses.replace(s, unpack_formats=("weightlet",), unpack_bits=(5,))
    rows = cal.measure_unpack(s)
    assert len(rows) == 1 and rows[0]["s_per_weight"] > 0 and rows[0]["s_per_channel"] >= 0


def test_runner_cost_runs_the_real_runner_on_a_sequential_plan(tmp_path):
    """The runner's own per-task costs come from running it: a bound plan whose phases (loads, unpacks, ops) do not
    overlap, one worker each; the costs are per task beyond the bare kernels."""
    import numpy as np

    from hil.calibrate_runner import CAL_PROMPT, INT8_CODE, TinyRun, measure_runner_cost, sequential_plan
    from hil.packed_index import read_index
    from hil.runner import run_plan
    from hil.tinymodel import tiny_spec, write_tiny
    from quant.pack.formats import F32_CODE

    spec = tiny_spec(2)
    path = write_tiny(tmp_path, spec, "weightlet")
    ix = read_index(path)
    plan = sequential_plan(ix, spec, CAL_PROMPT)
    loads = [t for t in plan.tasks if t.resource == "load" and t.ops != ["embed"]]
    assert {r.name for t in loads for r in t.tensors} == set(ix.entries)       # every tensor read once
    packed = {n for n, e in ix.entries.items() if e.fmt not in (F32_CODE, INT8_CODE)}
    assert len(packed) >= 7 * spec.n_layers                                    # every linear weight is packed
    assert {r.name for t in plan.tasks if t.resource == "unpack" for r in t.tensors} == packed
    tl = run_plan(plan, path, np.arange(CAL_PROMPT) % spec.vocab, spec=spec, evict=False).timeline
    phase_end = {}
    for sp in tl.spans:
        phase_end[sp.resource] = max(phase_end.get(sp.resource, 0.0), sp.end)
    first = {r: min(sp.start for sp in tl.spans if sp.resource == r) for r in ("unpack", "cpu")}
    assert phase_end["load"] <= first["unpack"] and phase_end["unpack"] <= first["cpu"]
    with TinyRun(tmp_path) as tiny:
        rc = measure_runner_cost(tiny, 1, 3, read_s_per_byte=5e-10, touch_s_per_byte=5e-10)
        assert tiny.cycle() > 0
    for st in (rc.op, rc.load_tensor, rc.unpack_tensor, rc.bare_op, rc.bare_unpack):
        assert st.median >= 0 and np.isfinite(st.median) and st.n > 0
    assert rc.load_tensor.median > 0 and rc.bare_op.median > 0
    assert not list(tmp_path.glob("runner-cal-*")), "tiny model left behind"


def test_kernel_costs_are_the_expected_call_not_the_typical_one(monkeypatch):
    """A kernel that runs 1.5x slower in 2 of 5 calls costs a run its mean (1.2x), not its median; a preempted call
    (over PREEMPTED_X x the median: another thread ran) is left out. The GEMM table takes that expected cost."""
    st = stats.Stat.of([1.0, 1.0, 1.0, 1.5, 1.5])
    assert st.median == 1.0 and st.expected == pytest.approx(1.2)
    assert stats.Stat.of([1.0, 1.0, 1.0, 1.0, 10.0]).expected == pytest.approx(1.0)    # preempted: dropped
    assert stats.Stat(2.0, 0.0, 3).expected == 2.0                                     # no mean taken: the median
    calls = iter([1.0, 1.0, 1.0, 1.5, 1.5] * 10)
    monkeypatch.setattr(comp, "timed", lambda fn, reps, budget_s=0.0: stats.Stat.of([next(calls) for _ in range(5)]))
    s = dataclasses.replace(cal.CalibrationSettings.make(quick=True), gemm_kn=((64, 32),), gemm_m=(4,), threads=(1,),
                            cold_set_bytes=4096)
    rows = comp.measure_gemm(comp.Kernels(), s)
    assert [r["seconds"] for r in rows] == [pytest.approx(1.2)]


def test_interleave_deals_pieces_in_turn_and_covers_the_file_once():
    from hil.calibrate_stats import interleave

    parts = interleave(10, 2, 3)
    assert parts == [[(0, 3), (6, 9)], [(3, 6), (9, 10)]]                 # reader k: pieces k, k + 2, ...
    assert sorted(r for p in interleave(1000, 3, 7) for r in p) == [(lo, min(lo + 7, 1000)) for lo in range(0, 1000, 7)]
    with pytest.raises(ValueError, match="block"):
        interleave(10, 2, 0)


def test_cold_read_curve_reads_each_readers_pieces_through_one_descriptor(tmp_path, monkeypatch):
    """The kernel keeps readahead state per open file: a reader of the curve opens the file once for all its pieces,
    as the runner's loader threads do, and reads every byte of the file exactly once over all readers."""
    p = tmp_path / "f"
    data = bytes(range(256)) * (3 * reads.READ_BLOCK // 256 + 5)             # 3 pieces and a short fourth
    p.write_bytes(data)
    opened: list[str] = []
    got: list[int] = []
    real_open, real_pieces = os.open, reads._read_pieces
    monkeypatch.setattr(reads.os, "open", lambda path, *a, **k: (opened.append(str(path)), real_open(path, *a, **k))[1])
    monkeypatch.setattr(reads, "_read_pieces", lambda *a: (got.append(real_pieces(*a)), got[-1])[1])
    rate, _ = reads.read_rate(p, 1 * cal.MIB, 2, cold=False)
    assert opened == [str(p), str(p)] and rate > 0                          # one descriptor per reader, not per piece
    assert len(got) == 2 and sum(got) == len(data)
    monkeypatch.undo()
    assert reads._read_pieces(p, [(0, 5), (10, 12)], 4) == 7
    assert reads._read_pieces(p, [(len(data) - 3, len(data) + 100)], 64) == 3   # stops at the end of the file


def test_a_store_with_mixed_parts_is_refused(quick_store, monkeypatch, tmp_path):
    _root, prof, table, _ = quick_store
    root = tmp_path / "store"
    d = host.store_dir(root, quick=True)
    shutil.copytree(table.parent, d)
    doc = json.loads((d / "cost_table.json").read_text())
    doc["op_overhead_s"]["cpu"] *= 2                             # another calibration's table beside this device.json
    (d / "cost_table.json").write_text(json.dumps(doc))
    calls: list = []
    monkeypatch.setattr(fit, "measure_and_store", _spy(calls, prof, table))
    lines: list[str] = []
    fit.host_profile(root, quick=True, log=lines.append)
    assert len(calls) == 1 and "inconsistent: cost_table.json" in lines[0]
    (d / "manifest.json").unlink()
    fit.host_profile(root, quick=True, log=lines.append)
    assert len(calls) == 2 and "no readable manifest" in lines[1]


def test_an_unusable_cost_table_is_never_stored(quick_store, tmp_path):
    _root, _prof, table, _ = quick_store
    doc = json.loads(table.read_text())
    host.check_table(doc)
    with pytest.raises(ValueError, match="no measured matmul rows"):
        host.check_table({**doc, "matmul": []})
