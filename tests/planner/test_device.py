"""The device profile holds what a device is; the host runtime model holds a measured host's OS and runner mechanics
(docs/design.md §6.1). A phone profile needs no runtime model, and the runtime's defaults switch every mechanic off."""
from __future__ import annotations

import dataclasses

import pytest

from planner.device import SocProfile
from planner.host_runtime import NO_RUNTIME, HostRuntime
from sim.coldstart.sweep import load_conf

MAX_DEVICE_FIELDS = 48          # a lean device: flash, memory, CPU, NPU, power, its name and the two peers' own costs


def test_the_device_profile_is_lean_and_apart_from_the_runtime():
    dev = {f.name for f in dataclasses.fields(SocProfile)}
    rt = {f.name for f in dataclasses.fields(HostRuntime)}
    assert len(dev) <= MAX_DEVICE_FIELDS
    assert not dev & rt                                            # one home per field
    phone = load_conf("device", "xiaomi15pro", SocProfile)
    assert phone.cpu_cores == 8


def test_runtime_defaults_mean_not_modelled():
    rt = HostRuntime()
    assert rt == NO_RUNTIME
    assert rt.fault_s_per_byte(1 << 20) == 0.0 and rt.read_fault_s_per_byte(1 << 20) == 0.0
    assert rt.corun("gemm") == (1.0, 1.0) and rt.read_overlap(2) == 0.0
    assert not (rt.interpreter_lock or rt.npu_on_cpu_core or rt.cpu_split_gemm_only)


@pytest.mark.parametrize("key,bad", [("corun_gemm", 0.9), ("read_cpu_overlap", 1.5), ("read_cpu_overlap_multi", -0.5),
                                     ("read_cpu_multi", 0.5), ("thread_wake_pack_share", 2.0), ("thread_wake_s", -1.0)])
def test_runtime_rejects_out_of_range_values_naming_the_key(key, bad):
    with pytest.raises(ValueError, match=f"runtime.{key}"):
        HostRuntime(**{key: bad})


def test_a_wait_adds_to_each_sequential_request_only():
    phone = load_conf("device", "xiaomi15pro", SocProfile)
    req = 1 << 20
    assert phone.reader_rate(req, wait_s=0.0) == phone.reader_rate(req)
    assert phone.reader_rate(req, wait_s=1e-3) == pytest.approx(
        req / (phone.flash_request_latency_s + 1e-3 + req / (phone.flash_reader_gbps * 1e9)))
