"""This machine as a device (docs/hil.md "Host profile"): its identity, the mapping of its measurements onto a
device profile and a host runtime model, and the store of both.

Identity: CPU model name, vendor/family/model/stepping, logical and physical cores, the ISA flags the kernels care
about, total RAM (GiB) and kernel release — hashed into an id. The store `outputs/hil/host/<id-hash>/` (a quick
calibration: `<id-hash>-quick/`, so it never replaces a full one) holds
- `identity.json`: the identity the profile was measured on;
- `device.json`: `{"version", "profile": <SocProfile fields>, "sources": {field: "measured: how" | "assumed: why" |
  ...}, "spread": {field: (max - min) / median of the repeats}, "quick", "measured_at", "identity_hash", "wall_s",
  "host_memory": {"mode", "state", "reported_mib"} (guest free page reporting during the calibration, hil.hostmem)}`;
- `runtime.json`: `{"version", "runtime": <HostRuntime fields>, "sources", "spread", ...}`: the mechanics of this
  host's OS and of the runner the simulator adds to predict it (`planner.host_runtime`, docs/design.md §6.1);
- `peers.json` (optional, written by the llama.cpp and MNN calibration steps, hil.calibrate_peer /
  hil.calibrate_mnn): `{"version", "identity_hash", "peers": <PeerCosts fields>, "sources", "llamacpp_calibration",
  "mnn_calibration"}`: what llama.cpp's and MNN's own code cost on this host (`planner.peer_costs`). A store without it
  has none measured, or holds them in the older layout, inside device.json's "profile" with the raw records beside
  (`load_peers` reads both; the next calibration step moves them, `peer_parts`);
- `cost_table.json`: the table the `table` cost model loads (`planner.cost.table`);
- `measurements.json`: the raw curves (read bandwidth per request size / threads, GEMM per shape, ...);
- `manifest.json`: the store version and the SHA-256 of each part (the optional one where it is there).
The store is written as one unit (`write_store`): a new hidden directory `.<name>.v-<random>` holds every part,
fsynced, and `<name>` is a symlink swapped to it by one rename, so a process killed at any point leaves the old store
or the new one; the loader refuses a store whose parts are not those of its manifest. `load_stored` loads the
stored profile when its identity equals this machine's and it was measured with the asked `memory` mode; a profile
from another machine is re-measured, never used, and one written by another `STORE_VERSION` is an error that says to
recalibrate. A quick profile (`quick=True`,
< 30 s, smaller grids) only serves quick requests; a full one serves both (and is preferred). `measure` calibrates
(`hil.calibrate`) and `store` writes; the step between them that needs the simulator (fitting the read overlap) and
the load-or-measure policy are `experiments.calibrate_fit`'s: hil/ never imports sim/.

The mapping of the measurements onto the phone-shaped `SocProfile` (EdgeFlow §3 components) and the `HostRuntime` is
`build_profile`: cpu_big_cores = physical cores, no little cores, GHz = the nominal clock; the NPU fields describe the
NPU stand-in (one CPU core running the INT8 GEMM); no NPU graph exists here, so its set-up / compose / optimize /
prepare costs are 0. It fills a `ProfileFields` (value, source, spread per field of either) with one `put_*` function
per measurement group (flash reads, memory copy, random reads, memory touch, cores, INT8 GEMM, float kernels, unpack,
NPU stand-in, assumed power).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from planner.device import SocProfile
from planner.host_runtime import HostRuntime
from planner.peer_costs import NO_PEER_COSTS, PEER_FIELDS, PeerCosts
from quant.atomic import atomic_open

if TYPE_CHECKING:
    from hil.calibrate import Measurements

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROOT = REPO / "outputs" / "hil" / "host"
GIB = 1 << 30
ISA_FLAGS = ("sse2", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
             "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "asimd", "asimddp", "i8mm", "sve")
STORE_VERSION = 21    # bumped whenever what a store holds changes meaning; 21: one directory written whole and
#                       swapped in by one rename, its parts' digests in manifest.json (a mixed store is refused)
STORE_FILES = ("identity.json", "device.json", "runtime.json", "cost_table.json", "measurements.json")
PEERS_FILE = "peers.json"      # optional part: a store without it has no peer costs measured (or the older layout)
PEER_RECORDS = ("llamacpp_calibration", "mnn_calibration")   # raw records of the peer calibration steps
MANIFEST = "manifest.json"


# ================================================ identity ===========================================================
@dataclass(frozen=True)
class HostIdentity:
    cpu_model: str                 # /proc/cpuinfo "model name" (or "Processor"/"CPU part" on Arm)
    cpu_signature: str             # vendor family/model/stepping
    logical_cores: int
    physical_cores: int
    isa_flags: tuple[str, ...]     # the ISA_FLAGS this CPU has
    mem_gib: int                   # GiB, MemTotal rounded to the nearest GiB
    kernel_release: str            # uname -r
    machine: str                   # uname -m
    thp: str = "unknown"           # transparent huge pages mode (the runner's fresh memory asks for them)

    def id_hash(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_json(self) -> dict:
        return {**asdict(self), "isa_flags": list(self.isa_flags)}

    @classmethod
    def from_json(cls, d: dict) -> "HostIdentity":
        return cls(**{**d, "isa_flags": tuple(d["isa_flags"])})


def _cpuinfo() -> list[dict[str, str]]:
    procs, cur = [], {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        if not line.strip():
            if cur:
                procs.append(cur)
            cur = {}
            continue
        k, _, v = line.partition(":")
        cur[k.strip()] = v.strip()
    if cur:
        procs.append(cur)
    return procs


def _mem_total() -> int:
    """B, /proc/meminfo MemTotal."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def host_identity() -> HostIdentity:
    """This machine's identity (from /proc/cpuinfo, /proc/meminfo, uname)."""
    procs = _cpuinfo()
    p0 = procs[0] if procs else {}
    model = p0.get("model name") or p0.get("Processor") or p0.get("CPU part") or platform.processor() or "unknown"
    sig = "/".join(p0.get(k, "?") for k in ("vendor_id", "cpu family", "model", "stepping"))
    logical = os.cpu_count() or len(procs) or 1
    cores = {(p.get("physical id", "0"), p.get("core id")) for p in procs if p.get("core id") is not None}
    physical = len(cores) or logical
    flags = set((p0.get("flags") or p0.get("Features") or "").split())
    return HostIdentity(cpu_model=model, cpu_signature=sig, logical_cores=logical, physical_cores=physical,
                        isa_flags=tuple(f for f in ISA_FLAGS if f in flags), mem_gib=round(_mem_total() / GIB),
                        kernel_release=platform.release(), machine=platform.machine(), thp=thp_mode())


def thp_mode() -> str:
    """The kernel's transparent huge page mode, the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled
    ("always", "madvise", "never"), or "unavailable": it decides what a first touch of the runner's memory costs
    (hil.runner_state.FreshArena), so a profile measured under another mode is not used."""
    with contextlib.suppress(OSError):
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
        m = re.search(r"\[(\w+)\]", text)
        if m:
            return m.group(1)
    return "unavailable"


def nominal_ghz() -> tuple[float, str]:
    """(GHz, how): cpufreq base_frequency, else the "@ x.xxGHz" of the model name, else cpufreq max, else the
    /proc/cpuinfo "cpu MHz" of core 0 (a VM reports the host's nominal TSC clock there)."""
    base = Path("/sys/devices/system/cpu/cpu0/cpufreq")
    with contextlib.suppress(OSError, ValueError):
        return int((base / "base_frequency").read_text()) / 1e6, "cpufreq base_frequency"
    model = ((_cpuinfo() or [{}])[0]).get("model name", "")
    if "@" in model and model.rstrip().endswith("GHz"):
        with contextlib.suppress(ValueError):
            return float(model.rsplit("@", 1)[1].strip()[:-3]), "model name"
    with contextlib.suppress(OSError, ValueError):
        return int((base / "cpuinfo_max_freq").read_text()) / 1e6, "cpufreq cpuinfo_max_freq"
    with contextlib.suppress(KeyError, ValueError, IndexError):
        return float(_cpuinfo()[0]["cpu MHz"]) / 1e3, "/proc/cpuinfo cpu MHz"
    raise ValueError("cannot determine this CPU's clock (no cpufreq, no GHz in the model name, no cpu MHz)")


# ================================================ profile mapping ====================================================
@dataclass
class ProfileFields:
    """SocProfile and HostRuntime field values mapped from measurements, with each field's source and (when
    repeated) its spread."""
    values: dict[str, float | int | bool] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)     # field -> "measured: how" | "assumed: why" | ...
    spread: dict[str, float] = field(default_factory=dict)    # field -> (max - min) / median of the repeats

    def put(self, key: str, val: float | int | bool, how: str, spread: float | None = None) -> None:
        """Set field `key` to `val`, sourced by `how` (spread: of the repeats it was measured from)."""
        self.values[key], self.sources[key] = val, how
        if spread is not None:
            self.spread[key] = float(spread)


def build_profile(m: Measurements, ident: HostIdentity, ghz: float, ghz_how: str
                  ) -> tuple[SocProfile, HostRuntime, ProfileFields]:
    """Map a `hil.calibrate.Measurements` onto the fields of the device profile and of the host's runtime model:
    (profile, runtime, the fields with their sources and spread) — see the module doc. ghz: nominal clock (GHz) and
    ghz_how its source (`nominal_ghz`). `read_cpu_overlap` / `_multi` are the closed form here; the simulator's fit
    of them is `experiments.calibrate_fit.fit_read_overlaps`."""
    f = ProfileFields()
    put_flash_reads(f, m)
    put_memory_copy(f, m)
    put_random_reads(f, m)
    put_memory_touch(f, m)
    put_cores(f, ident, ghz, ghz_how)
    put_gemm(f, m, ghz)
    put_float_kernels(f, m, ghz)
    put_unpack(f, m, ghz)
    put_npu_stand_in(f, m)
    put_assumed_power(f)
    for cls in (SocProfile, HostRuntime):                   # fields this calibration does not know: schema default
        for fl in dataclasses.fields(cls):
            if fl.name not in f.values and fl.name not in ("name", "soc", "source"):
                f.sources[fl.name] = f"default: not calibrated on this host (schema default {fl.default!r})"
    rt_names = {fl.name for fl in dataclasses.fields(HostRuntime)}
    prof = SocProfile(name="host", soc=ident.cpu_model,
                      source=f"measured on this host by hil.calibrate ({'quick' if m.settings.quick else 'full'}; "
                             f"compute kernels: {m.kernels}); per-field sources in device.json",
                      **{k: v for k, v in f.values.items() if k not in rt_names})
    rt = HostRuntime(**{k: v for k, v in f.values.items() if k in rt_names})
    return prof, rt, f


def put_flash_reads(f: ProfileFields, m: Measurements) -> None:
    """Sequential cold reads: peak rate, several readers' rate, the 1-reader latency / bandwidth fit, bulk request
    size, mmap readahead."""
    from hil.calibrate_reads import READ_BLOCK

    reads = m.reads.rows
    best = max(reads, key=lambda r: r["gbps"])
    f.put("flash_peak_gbps", best["gbps"], f"measured: best aggregate cold pread rate over request sizes x readers "
          f"({best['request_bytes']} B, {best['threads']} readers; scratch file evicted before each)", best["spread"])
    multi = [r for r in reads if r["threads"] >= 2]
    if multi:
        bm = max(multi, key=lambda r: r["gbps"])
        f.put("flash_multi_gbps", min(bm["gbps"], best["gbps"]), f"measured: best aggregate cold pread rate of 2 or "
              f"more readers taking the file's {READ_BLOCK >> 20} MiB pieces in turn, as a plan's loaders take its "
              f"layers ({bm['request_bytes']} B, {bm['threads']} readers; hil.calibrate_reads.read_rate)",
              bm["spread"])
    one = [r for r in reads if r["threads"] == 1]
    rg = min(m.reader_gbps, best["gbps"])
    f.put("flash_reader_gbps", rg, "measured: 1-reader fit of reader_rate(request) = request / (latency + request / "
          "reader_bw) to the cold pread curve" + (" (clipped to flash_peak_gbps)" if rg < m.reader_gbps else ""),
          max(r["spread"] for r in one))
    f.put("flash_request_latency_s", m.reader_latency_s, "measured: latency term of the same fit (kernel readahead "
          "hides most of it for sequential preads)")
    if m.stream_start is not None:
        f.put("flash_stream_start_s", m.stream_start.median, f"measured: a cold 1-reader sequential read of the "
              f"scratch file into fresh {m.settings.overlap_blob_bytes >> 20} MiB buffers in "
              f"{m.bulk_request_bytes >> 10} KiB preads, total time minus size / its second half's rate "
              f"(hil.calibrate_reads.stream_start); the reader fit above uses the rows less it", m.stream_start.spread)
    f.put("flash_bulk_request_bytes", int(m.bulk_request_bytes), "measured: smallest request size within 5 % of the "
          "best cold read rate while other threads occupy every core (each request waits flash_request_busy_s for a "
          "time slice: the loaders run beside the unpack and compute threads)")
    if m.pread_readahead is not None:
        f.put("read_ahead_bytes", int(m.pread_readahead.median) // 4096 * 4096,
              f"measured: bytes resident right after the end of a sequential pread stream of "
              f"{m.bulk_request_bytes >> 10} KiB chunks with 5 ms pauses (mincore; "
              "hil.calibrate_reads.pread_readahead)",
              m.pread_readahead.spread)
    f.put("mmap_readahead_bytes", int(round(m.readahead.median / 4096) * 4096) or 4096,
          "measured: bytes made resident by one mmap page fault on an evicted file (mincore)", m.readahead.spread)


def put_memory_copy(f: ProfileFields, m: Measurements) -> None:
    """Memory capacity, single-thread copy rate and DRAM bandwidth (2-thread copy, when measured)."""
    s = m.settings
    f.put("mem_capacity_bytes", _mem_total(), "measured: /proc/meminfo MemTotal")
    c1 = m.copy[1]
    f.put("cpu_copy_gbps", 1.0 / c1.median / 1e9, f"measured: native.memcpy of {s.copy_bytes} B, 1 thread", c1.spread)
    c2 = m.copy.get(2)
    if c2 is not None:
        f.put("dram_gbps", 2.0 / c2.median / 1e9, f"measured: native.memcpy of {s.copy_bytes} B split over 2 threads "
              "(DRAM traffic = 2 x bytes copied / s: a copy reads and writes each byte, as CostModel.dram_bytes "
              "counts)", c2.spread)


def put_random_reads(f: ProfileFields, m: Measurements) -> None:
    """Cold random 4 KiB reads (embedding rows), alone and behind a sequential stream; sequential requests while
    the cores are busy."""
    rb = m.read_busy
    f.put("flash_request_busy_s", rb.per_request.median, "measured: cold 1-thread sequential reads in "
          "flash_bulk_request_bytes preads, with one CPU-bound thread per core minus alone, per request (the reader "
          "waits for a time slice each time it blocks on the disk)", rb.per_request.spread)
    f.put("read_irq_gbps", 1.0 / max(rb.other_cpu.median, 1e-13) / 1e9, "measured: core time the CPU-bound threads "
          "lose per byte of the same busy read beyond the reader's own CPU time (interrupt and block-completion "
          "work, charged to whichever thread runs)", rb.other_cpu.spread)
    f.put("flash_random_read_s", m.random_read.median, "measured: cold 4 KiB preads at random offsets of the evicted "
          "scratch file, 1 thread (embedding rows of a prompt)", m.random_read.spread)
    if m.random_read_cpu is not None:
        f.put("flash_random_read_cpu_s", m.random_read_cpu.median, "measured: the reading thread's CPU time per read "
              "of the same cold random preads (time.thread_time: syscall, page allocation, I/O submission and "
              "completion, copy)", m.random_read_cpu.spread)
    f.put("flash_random_read_busy_s", m.random_read_busy.median, "measured: the same random reads while another "
          "thread streams the file sequentially in flash_bulk_request_bytes preads (queued behind its readahead)",
          m.random_read_busy.spread)


def put_memory_touch(f: ProfileFields, m: Measurements) -> None:
    """First touch of fresh memory and page-cache-resident reads into user buffers."""
    pages = "transparent huge pages asked for" if m.huge_pages else "4 KiB pages"
    f.put("mem_fault_gbps", 1.0 / m.first_touch.median / 1e9, "measured: first touch of freshly allocated memory "
          f"(64 x 1 MiB fresh_empty buffers, as the runner allocates tensors; {pages}; each repeat's freed before "
          "the next, as runs free theirs): copy into them fresh minus again, 1 thread",
          m.first_touch.spread)
    f.put("mem_fault_small_bytes", 1 << 20, "measurement size of mem_fault_gbps")
    f.put("mem_fault_large_gbps", 1.0 / m.first_touch_large.median / 1e9, "measured: the same with 4 x 16 MiB "
          "buffers (whether large allocations fault for less per byte)", m.first_touch_large.spread)
    from hil.calibrate import LARGE_ALLOC

    f.put("mem_fault_large_bytes", LARGE_ALLOC, "measurement size of mem_fault_large_gbps")
    for key, st, what in (("unpack_fault_gbps", m.unpack_touch, "64 x 1 MiB"),
                          ("unpack_fault_large_gbps", m.unpack_touch_large, "4 x 16 MiB")):
        if st is not None:
            f.put(key, 1.0 / st.median / 1e9, f"measured: thread CPU time of the weightlet unpack kernel (5 bits) "
                  f"into {what} fresh_empty outputs, as the runner's unpacks, minus the same unpacks again "
                  "(its stores fault the pages in; the same buffers cost more through memcpy)", st.spread)
    cr = m.cold_read
    blob_mib = m.settings.overlap_blob_bytes >> 20
    f.put("read_cpu_gbps", 1.0 / cr.reused_cpu.median / 1e9, "measured: thread CPU time of a cold sequential pread "
          f"into one reused {blob_mib} MiB buffer (flash_bulk_request_bytes requests), 1 thread: the syscall's "
          "page-cache work and copy", cr.reused_cpu.spread)
    extra = max(cr.fresh_cpu.median - cr.reused_cpu.median, 1e-12)
    f.put("read_fault_gbps", 1.0 / extra / 1e9, f"measured: thread CPU time of the same read into fresh kept "
          f"{blob_mib} MiB buffers (hil.runner_state.fresh_empty, as the runner's loads) minus into the reused one "
          f"({cr.fresh_cpu.median * 1e9:.3f} - {cr.reused_cpu.median * 1e9:.3f} ns/B): the kernel faults the pages "
          "in inside its copy", max(cr.fresh_cpu.spread, cr.reused_cpu.spread))
    T, C, F = cr.reused_wall.median, cr.fresh_cpu.median, cr.fresh_wall.median    # s per B
    eta = float(np.clip(1.0 - (F - max(T, C)) / min(T, C), 0.0, 1.0))
    f.put("read_cpu_overlap", eta, f"measured: a cold 1-thread read into fresh kept {blob_mib}"
          f" MiB buffers took {F * 1e9:.3f} ns/B of wall time, into a reused buffer {T * 1e9:.3f} ns/B (transfer), "
          f"its thread CPU time {C * 1e9:.3f} ns/B: overlap = 1 - (fresh - max) / min, clipped to [0, 1]",
          max(cr.fresh_wall.spread, cr.reused_wall.spread))
    if cr.fresh_wall_2 is not None and cr.reused_wall_2 is not None and cr.fresh_cpu_2 is not None:
        # per reader: each moves half the bytes, so its wall / transfer time per own byte is twice the aggregate's
        T2, C2, F2 = 2 * cr.reused_wall_2.median, cr.fresh_cpu_2.median, 2 * cr.fresh_wall_2.median
        eta2 = float(np.clip(1.0 - (F2 - max(T2, C2)) / min(T2, C2), 0.0, 1.0))
        f.put("read_cpu_overlap_multi", eta2, "measured: the same with 2 readers at once, taking its 2 MiB pieces in "
              "turn: "
              f"per reader {F2 * 1e9:.3f} ns/B of wall time into fresh buffers, {T2 * 1e9:.3f} into reused ones "
              f"(transfer, the device shared), CPU {C2 * 1e9:.3f} ns/B; overlap by the same formula",
              max(cr.fresh_wall_2.spread, cr.reused_wall_2.spread))
        ratio = C2 / C
        f.put("read_cpu_multi", max(1.0, ratio), f"measured: thread CPU time per byte of 2 readers at once into fresh "
              f"kept {blob_mib} MiB buffers, taking its pieces in turn (summed over both), / 1 reader's: "
              f"{C2 * 1e9:.3f} / {C * 1e9:.3f} ns/B = {ratio:.2f} (the sequential read's CPU side while another "
              "reader streams; below 1 = noise, taken as 1)", max(cr.fresh_cpu_2.spread, cr.fresh_cpu.spread))


def put_cores(f: ProfileFields, ident: HostIdentity, ghz: float, ghz_how: str) -> None:
    """Core counts and clock: physical cores as big cores at the nominal clock (GHz), no little cores."""
    f.put("cpu_big_cores", ident.physical_cores, "measured: physical cores (/proc/cpuinfo core ids)")
    f.put("cpu_big_ghz", ghz, f"measured: nominal clock ({ghz_how})")
    f.put("cpu_little_cores", 0, "this host has one core type")
    f.put("cpu_little_ghz", 0.0, "this host has one core type")


def put_gemm(f: ProfileFields, m: Measurements, ghz: float) -> None:
    """INT8 GEMM rates (CPU and the NPU stand-in), GEMV weight bandwidth and 2-thread parallel efficiency."""
    kern = m.kernels
    g1 = [r for r in m.gemm if r["threads"] == 1]
    ms = sorted({r["m"] for r in g1})
    large = ms[-2:] if len(ms) > 2 else ms[-1:]                 # "large M": the two largest measured M
    big1 = [r for r in g1 if r["m"] in large]
    gops = float(np.median([r["gops"] for r in big1]))
    gspread = float(np.median([r["spread"] for r in big1]))
    mtxt = "/".join(map(str, large))
    f.put("cpu_int8_gemm_gops_per_ghz", gops / ghz, f"measured: {kern} INT8 GEMM, 1 thread, M={mtxt}, median GOP/s "
          f"over {len(big1)} (M, K, N) points / GHz", gspread)
    f.put("npu_int8_tops", gops / 1e3, f"measured: NPU stand-in = one core running {kern} INT8 GEMM, M={mtxt}, "
          "median over shapes", gspread)
    gemv = max((r for r in g1 if r["m"] == min(x["m"] for x in g1)), key=lambda r: r["k"] * r["n"])
    f.put("npu_weight_gbps", gemv["k"] * gemv["n"] / gemv["seconds"] / 1e9, f"measured: GEMV (M={gemv['m']}) of the "
          f"largest weight ({gemv['k']}x{gemv['n']} INT8), weight bytes / s, 1 thread", gemv["spread"])
    g2 = {(r["m"], r["k"], r["n"]): r for r in m.gemm if r["threads"] == 2}
    effs = [big["seconds"] / g2[(big["m"], big["k"], big["n"])]["seconds"] - 1.0
            for big in big1 if (big["m"], big["k"], big["n"]) in g2]
    if effs:
        eff = float(min(1.0, max(0.05, np.median(effs))))
        f.put("cpu_parallel_eff", eff, f"measured: INT8 GEMM M={mtxt} 1-thread time / 2-thread time - 1, median over "
              "shapes (clipped to [0.05, 1]; low when other work occupies the second core)")
    else:
        f.put("cpu_parallel_eff", 1.0, "assumed: 2-thread GEMM not measured (quick calibration)")
    f.put("cpu_kquant_gemm_slowdown", 1.0, "assumed: the host runner has no K-quant GEMM (it unpacks to INT8 first)")


def put_float_kernels(f: ProfileFields, m: Measurements, ghz: float) -> None:
    """Float attention and elementwise rates, and the per-task dispatch overhead."""
    kern = m.kernels
    att = m.attention
    f.put("cpu_fp16_gflops_per_ghz", sum(r["flops"] for r in att) / sum(r["seconds"] for r in att) / 1e9 / ghz,
          f"measured: {kern} float32 attention (FP32 here, no FP16), total FLOPs / total s over "
          f"{len(att)} shapes / GHz", float(np.median([r["spread"] for r in att])))
    el = m.elementwise
    emax = max(r["m"] for r in el)
    eb = [r for r in el if r["m"] == emax]
    f.put("cpu_elementwise_gbps_per_core", sum(r["bytes"] for r in eb) / sum(r["seconds"] for r in eb) / 1e9,
          f"measured: {kern} float32 rmsnorm/quantize/dequant/rope/silu_mul/add at M={emax}, bytes read + written / s",
          float(np.median([r["spread"] for r in eb])))
    f.put("thread_wake_s", m.dispatch.median / 2, "measured: half the round trip of a task handed to a waiting "
          "thread through a threading.Condition and its completion handed back (two wake-ups)", m.dispatch.spread)
    f.put("thread_wake_cpu_s", m.dispatch_worker_cpu.median, "measured: the worker thread's CPU time per hand-off "
          "of the same round trips (woken from its Condition, re-taking the lock and the interpreter lock, "
          "notifying back, going back to sleep): core time a woken worker spends besides its task",
          m.dispatch_worker_cpu.spread)
    if m.wake_idle_core is not None:
        f.put("thread_wake_idle_core_s", m.wake_idle_core.median, "measured: from a notify through a "
              "threading.Condition until the woken thread runs, pinned to another, idle core, while its waker keeps "
              "computing (a layer GEMM): the runner's compute workers hand each other ops and go on (mean per "
              "hand-off)", m.wake_idle_core.spread)
    put_wake_pack(f, m)
    f.put("thread_wake_busy_s", m.dispatch_busy.median / 2, "measured: the same hand-off while one CPU-bound "
          "thread per core runs short native calls from a Python loop (the woken thread waits for a time slice and "
          "the interpreter lock), half the round trip", m.dispatch_busy.spread)
    r = m.runner
    f.put("cpu_op_overhead_s", r.op.median, "measured: the HIL runner run on a tiny model (hil.calibrate_runner), one "
          "op per task back to back on an idle machine: median start-to-start cycle of its compute ops "
          f"({r.op.median + r.bare_op.median:.2e} s) minus the bare kernel calls at the same shapes "
          f"({r.bare_op.median:.2e} s): worker loop + the op's Python path; a worker that waited is charged "
          "thread_wake_s on top", r.op.spread)
    if r.op_python is not None:
        f.put("cpu_op_python_s", r.op_python.median, "measured: the same run's median gap between two compute ops' "
              "spans (the worker loop: finish, pop, notify, under the GIL), the share of each op's cost the simulator "
              "holds the interpreter lock for (the cycle above is the total: its bare calls went through checked "
              "wrappers, ~5 us of Python counted as kernel time)", r.op_python.spread)
    from hil.runner_state import POOL_SPIN_US

    f.put("cpu_split_gemm_only", True, "by construction: the runner splits only GEMMs over the CPU unit's threads "
          "(hil.runner_ops.OpRunner.gemm, the native pool); its other ops run on the worker's own thread")
    f.put("gemm_pool_spin_s", POOL_SPIN_US * 1e-6, "by construction: the runner's GEMM helpers poll for the next GEMM "
          "this long after their part (hil.runner_state.POOL_SPIN_US)")
    if m.pool_wake is not None:
        f.put("gemm_pool_wake_s", m.pool_wake.median, "measured: a 2-thread 16x576x1536 GEMM on DRAM-cycled weights "
              "after its helper slept (three poll windows apart) minus right after another one (helper polling), "
              "median (hil.calibrate_compute.measure_pool_wake)", m.pool_wake.spread)
    f.put("interpreter_lock", True, "by construction: the runner's workers are Python threads; their per-task code "
          "(worker loop, op path, buffer set-up: cpu_op_overhead_s, load_tensor_s, unpack_tensor_s) holds the GIL, "
          "the kernels and reads release it")
    for key, st in m.corun.items():
        beside = ("another thread of this process on the other core faulting in fresh memory (its address space "
                  "shared, as the runner's threads share it; hil.calibrate_corun.CoRunner), per busy core (excess / "
                  "its CPU utilisation)" if key.endswith("_mem") else
                  "another process on the other core looping native GEMM calls (hil.calibrate_corun.CoRunner: "
                  "hardware sharing only, the interpreter lock's hand-offs are modelled apart)")
        f.put(f"corun_{key}", max(1.0, st.median), "measured: thread CPU time of this class of work "
              f"(hil.calibrate_corun) with {beside} / alone, median of alternating runs ({st.median:.3f}; below 1 = "
              "noise, taken as 1)", st.spread)
    f.put("load_tensor_s", r.load_tensor.median, "measured: the same run's loads (one tensor each, page-cache hits): "
          "median start-to-start cycle minus the tensor's bytes at the fresh-buffer read CPU rate: buffer mapping, "
          "read syscall, arrival bookkeeping, worker loop", r.load_tensor.spread)
    f.put("unpack_tensor_s", r.unpack_tensor.median, "measured: the same run's unpacks (one tensor each): median "
          "start-to-start cycle minus the first touch of the INT8 output and the kernel's per-weight / per-channel "
          f"work ({r.bare_unpack.median:.2e} s): output mapping, scale copy, the call's fixed cost, worker loop",
          r.unpack_tensor.spread)


def put_wake_pack(f: ProfileFields, m: Measurements) -> None:
    """Wake-up packing (docs/hil.md "Wake-up packing"): the idle time from which the OS puts a woken thread on its
    waker's busy core, the share it does so from there, and the balance tick that splits such a pair."""
    from hil.calibrate_compute import pack_threshold

    if not m.wake_pack:
        return
    idle, share = pack_threshold(m.wake_pack)
    pts = ", ".join(f"{1e6 * r['idle_s']:.0f} us: {r['share']:.2f}" for r in sorted(m.wake_pack,
                                                                                     key=lambda r: r["idle_s"]))
    how = ("measured (hil.calibrate_compute.measure_wake_pack): unpinned threads, a Condition hand-off whose waker "
           "keeps computing (a layer GEMM); share of hand-offs whose woken thread started on its waker's CPU by how "
           f"long it had slept ({pts})")
    f.put("thread_wake_pack_idle_s", idle, how + ": the idle time of the least-squares step over that curve "
          "(hil.calibrate_compute.pack_threshold; 0: no step fits better than no packing)")
    f.put("thread_wake_pack_share", share, how + ": the step's share, the mean share from that idle time on")
    hz = kernel_hz()
    if hz:
        f.put("sched_balance_s", 1.0 / hz, f"read: the kernel's scheduler tick, CONFIG_HZ={hz} (/proc/config.gz); "
              "a busy core with two runnable threads has the idle one pull one at its next tick (nohz idle balance)")


def kernel_hz() -> int | None:
    """CONFIG_HZ of the running kernel from /proc/config.gz (None when the kernel does not expose its config)."""
    import gzip

    try:
        with gzip.open("/proc/config.gz", "rt") as fh:
            for line in fh:
                if line.startswith("CONFIG_HZ="):
                    return int(line.split("=", 1)[1])
    except (OSError, ValueError):
        return None
    return None


def put_unpack(f: ProfileFields, m: Measurements, ghz: float) -> None:
    """Unpack speed: effective SIMD IPC of the weightlet unpack, cycles per weight of the K-quant one (when
    measured)."""
    from planner.formats import unpack_work

    C, D = m.settings.unpack_shape
    wl = [r for r in m.unpack if r["fmt"] == "weightlet" and r["threads"] == 1]
    if wl:
        ipcs = [unpack_work(np.full(C, r["bits"]), D, "weightlet")[0] / (C * D) / (r["s_per_weight"] * ghz * 1e9)
                for r in wl]
        f.put("cpu_simd_ipc", float(np.median(ipcs)), "measured (effective): planner.formats weightlet instruction "
              "count (16-weight stripes) / measured native unpack time x GHz, median over bit widths, 1 thread",
              float(np.median([r["spread"] for r in wl])))
    kq = [r for r in m.unpack if r["fmt"] == "kquant" and r["threads"] == 1]
    if kq:
        f.put("kquant_unpack_cycles_per_weight", float(np.median([r["s_per_weight"] for r in kq])) * ghz * 1e9,
              "measured: native kquant unpack s/weight x GHz, median over bit widths, 1 thread",
              float(np.median([r["spread"] for r in kq])))


def put_npu_stand_in(f: ProfileFields, m: Measurements) -> None:
    """The NPU stand-in: a worker thread on a CPU core, no QNN graph; context deserialization = a copy. Needs
    `cpu_copy_gbps` and `mem_fault_gbps` already put."""
    f.put("npu_on_cpu_core", True, "by construction: the runner's NPU worker is a thread on a CPU core")
    f.put("npu_inefficient_factor", 1.0, "by construction: the NPU stand-in is a CPU core running the same kernels")
    f.put("npu_dispatch_s", m.runner.op.median, "measured: same as cpu_op_overhead_s (the runner's NPU worker is a "
          "thread running the same loop and op path)", m.runner.op.spread)
    for key in ("npu_setup_s", "npu_compose_s_per_gb", "npu_optimize_s_per_gb", "npu_prepare_s_per_gb"):
        f.put(key, 0.0, "this host has no NPU graph (no QNN set-up / compose / optimize / prepare)")
    fresh_copy = 1.0 / (1.0 / f.values["cpu_copy_gbps"] + 1.0 / f.values["mem_fault_gbps"])
    f.put("npu_ctx_deserialize_gbps", fresh_copy, "measured: cpu_copy_gbps with the first touch of the fresh buffer "
          "(mem_fault_gbps) in series (the runner's stand-in for deserializing a context binary is a real copy into "
          "a new buffer)", f.spread.get("cpu_copy_gbps"))


def put_assumed_power(f: ProfileFields) -> None:
    """Power and flash energy: assumed (no power sensor readable on this host)."""
    f.put("power_idle_w", 5.0, "assumed: idle share of a server host (no power sensor readable here)")
    f.put("power_big_core_w", 3.75, "assumed: server CPU TDP per core order (e.g. 360 W / 96 cores)")
    f.put("power_little_core_w", 0.0, "this host has one core type")
    f.put("power_npu_w", 3.75, "assumed: = power_big_core_w (the NPU stand-in is a core)")
    f.put("flash_nj_per_byte", 1.5, "assumed: datacenter SSD order (~5 W at ~3 GB/s)")


def cost_table(m) -> dict:
    """The cost table of `planner.cost.table.TableCostModel` from a `hil.calibrate.Measurements` (docs/hil.md)."""
    pts: list[dict] = []
    s = m.settings
    for th, st in sorted(m.copy.items()):
        pts.append(dict(unit="cpu", kind="copy", threads=th, work=s.copy_bytes, seconds=st.median * s.copy_bytes,
                        spread=st.spread))
    C, D = s.unpack_shape
    for r in m.unpack:
        pts.append(dict(unit="cpu", kind="unpack", threads=r["threads"], work=C * D,
                        seconds=(r["s_per_weight"] * D + r.get("s_per_channel", 0.0)) * C, spread=r["spread"],
                        fmt=r["fmt"], bits=r["bits"]))
    # the runner splits only GEMMs over a unit's threads (hil.runner_ops.OpRunner.gemm); elementwise ops and attention
    # run on the worker's own thread whatever the pool size, so their 1-thread times are what a k-thread unit takes
    pool_sizes = range(1, max(os.cpu_count() or 1, *s.threads) + 1)
    for unit in ("cpu", "npu"):                                     # npu = the stand-in core: same kernels
        for th in pool_sizes if unit == "cpu" else [1]:
            for r in m.elementwise:
                pts.append(dict(unit=unit, kind="elementwise", threads=th, work=r["bytes"], seconds=r["seconds"],
                                spread=r["spread"], op=r["op"]))
            for r in m.attention:
                pts.append(dict(unit=unit, kind="attention", threads=th, work=r["flops"], seconds=r["seconds"],
                                rows=r["m"] * r["heads"], spread=r["spread"]))
    unpack = [dict(fmt=r["fmt"], bits=r["bits"], threads=r["threads"], s_per_weight=r["s_per_weight"],
                   s_per_channel=r.get("s_per_channel", 0.0), spread=r["spread"]) for r in m.unpack]
    matmul = [dict(unit="cpu", threads=r["threads"], m=r["m"], k=r["k"], n=r["n"], seconds=r["seconds"],
                   spread=r["spread"]) for r in m.gemm]
    matmul += [dict(unit="npu", threads=1, m=r["m"], k=r["k"], n=r["n"], seconds=r["seconds"], spread=r["spread"])
               for r in m.gemm if r["threads"] == 1]
    return dict(version=2, source=f"measured on this host by hil.calibrate ({m.kernels})", points=pts, unpack=unpack,
                matmul=matmul, op_overhead_s=dict(cpu=m.runner.op.median, npu=m.runner.op.median))


def check_table(doc: dict) -> None:
    """ValueError unless a cost table has measured rows of every kind the `table` cost model needs from a host
    calibration (GEMM grid, unpack, per-op points): without them it would fall back to the analytic model for
    everything, silently (docs/hil.md "Faults and locks")."""
    empty = [k for k in ("points", "unpack", "matmul") if not doc.get(k)]
    if empty:
        raise ValueError(f"cost table: no measured {', '.join(empty)} rows; a host profile without them is unusable "
                         f"and is not stored")


def measurements_json(m) -> dict:
    """The raw curves of a `Measurements` (JSON-ready)."""
    s = m.settings

    def stat(st) -> dict:
        return dict(median=st.median, spread=st.spread, n=st.n)

    return dict(settings={**asdict(s)}, kernels=m.kernels, reads=m.reads.rows,
                reader_fit=dict(latency_s=m.reader_latency_s, reader_gbps=m.reader_gbps),
                bulk_request_bytes=m.bulk_request_bytes, mmap_readahead_bytes=stat(m.readahead),
                warm_read_s_per_byte={str(k): stat(v) for k, v in m.warm_read.items()},
                copy_s_per_byte={str(k): stat(v) for k, v in m.copy.items()}, unpack=m.unpack, gemm=m.gemm,
                elementwise=m.elementwise, attention=m.attention, dispatch_s=stat(m.dispatch),
                runner_s={k: stat(v) for k, v in vars(m.runner).items() if v is not None},
                dispatch_worker_cpu_s=stat(m.dispatch_worker_cpu),
                huge_pages=m.huge_pages,
                corun={k: stat(v) for k, v in m.corun.items()}, dispatch_busy_s=stat(m.dispatch_busy),
                first_touch_s_per_byte=stat(m.first_touch),
                first_touch_large_s_per_byte=stat(m.first_touch_large),
                cold_read_s_per_byte={k: stat(v) for k, v in vars(m.cold_read).items() if v is not None},
                read_busy={k: stat(v) for k, v in vars(m.read_busy).items()}, random_read_s=stat(m.random_read),
                random_read_busy_s=stat(m.random_read_busy), wall_s=m.wall_s,
                loadavg=m.loadavg, host_probe=m.host_probe,
                pread_readahead_bytes=stat(m.pread_readahead) if m.pread_readahead is not None else None,
                pool_wake_s=stat(m.pool_wake) if m.pool_wake is not None else None,
                unpack_touch_s_per_byte=stat(m.unpack_touch) if m.unpack_touch is not None else None,
                unpack_touch_large_s_per_byte=stat(m.unpack_touch_large) if m.unpack_touch_large is not None
                else None,
                wake_idle_core_s=stat(m.wake_idle_core) if m.wake_idle_core is not None else None,
                random_read_cpu_s=stat(m.random_read_cpu) if m.random_read_cpu is not None else None,
                wake_pack=m.wake_pack)


# ================================================ store ==============================================================
def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=1, default=_np_default) + "\n").encode()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def store_parts(d: Path) -> tuple[str, ...]:
    """The parts of store directory `d`: STORE_FILES, and PEERS_FILE where it is there."""
    return STORE_FILES + ((PEERS_FILE,) if (d / PEERS_FILE).is_file() else ())


def seal(d: Path) -> None:
    """Write `d/manifest.json`: the store version and the SHA-256 of each part (`store_parts`) as it is now."""
    doc = {"version": STORE_VERSION, "files": {n: _sha256(d / n) for n in store_parts(d)}}
    with atomic_open(d / MANIFEST) as f:
        f.write(_json_bytes(doc))


def check_manifest(d: Path) -> str:
    """"" when every part of store directory `d` has the digest its manifest records, else why not (one phrase)."""
    try:
        files = json.loads((d / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return "stored profile has no readable manifest (cut while written, or copied in part)"
    for n in STORE_FILES + tuple(n for n in (PEERS_FILE,) if n in files or (d / n).exists()):
        try:
            same = files.get(n) == _sha256(d / n)
        except OSError:
            same = False
        if not same:
            return f"stored profile is inconsistent: {n} is not the one its manifest records (mixed or edited parts)"
    return ""


def write_store(d: Path, parts: dict[str, object]) -> Path:
    """Write the store `d` as one unit: every part into a new hidden directory beside it (`.<name>.v-<random>`),
    fsynced with its manifest, then `d` — a symlink to that directory — swapped by one rename. A process killed at any
    point leaves either the old store or the new one, never a mix; leftovers of a killed write and the previous
    version are removed (the caller holds `store_lock`). Returns the new version directory."""
    root = d.parent
    root.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(prefix=f".{d.name}.v-", dir=root))
    try:
        for name in STORE_FILES + tuple(n for n in (PEERS_FILE,) if n in parts):
            with open(new / name, "wb") as f:
                f.write(_json_bytes(parts[name]))
                f.flush()
                os.fsync(f.fileno())
        seal(new)
        _fsync_dir(new)
        if d.is_dir() and not d.is_symlink():          # a store written before stores were swapped whole
            shutil.rmtree(d)
        link = root / f".{d.name}.link-{os.getpid()}"
        link.unlink(missing_ok=True)
        os.symlink(new.name, link)
        os.replace(link, d)                            # the one step that switches versions
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    for old in root.glob(f".{d.name}.v-*"):
        if old != new:
            shutil.rmtree(old, ignore_errors=True)
    return new


def _np_default(o):
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


@dataclass
class HostProfile:
    """This host as the simulator and the planner see it: what the device is, the runtime mechanics the simulator
    adds to predict it (`planner.host_runtime`), the cost table of its kernels (`planner.cost.table`), and what
    llama.cpp's and MNN's own code cost here (`planner.peer_costs`; none where not measured)."""
    device: SocProfile
    runtime: HostRuntime
    cost_table: Path
    peers: PeerCosts = NO_PEER_COSTS


def load_device_json(path: str | os.PathLike) -> SocProfile:
    """The SocProfile of a stored `device.json` (peer costs of the older layout inside its "profile" left out:
    `load_peers`); ValueError naming the file when it is malformed."""
    return _load_fields(path, "profile", SocProfile, drop=PEER_FIELDS)


def load_peers(d: str | os.PathLike) -> PeerCosts:
    """The PeerCosts of store directory `d`: its `peers.json`, else the older layout's fields inside device.json's
    "profile" (`NO_PEER_COSTS` where neither has any); ValueError naming the file when it is malformed."""
    d = Path(d)
    if (d / PEERS_FILE).is_file():
        return _load_fields(d / PEERS_FILE, "peers", PeerCosts)
    p = d / "device.json"
    try:
        profile = json.loads(p.read_text())["profile"]
        return PeerCosts(**{k: v for k, v in profile.items() if k in PEER_FIELDS})
    except FileNotFoundError:
        raise
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{p}: not valid host peer costs ({_first_line(e)})") from None


def peer_parts(parts: dict[str, dict]) -> dict:
    """The peers.json document of a store's `parts` (name -> JSON document), made there from the older layout
    where it is missing: the peer fields, their sources and spread and the raw records moved out of device.json, so
    device.json's "profile" is a device profile only. Returns that document (in `parts`)."""
    if PEERS_FILE in parts:
        return parts[PEERS_FILE]
    dev = parts["device.json"]
    doc = {"version": dev.get("version", STORE_VERSION), "identity_hash": dev.get("identity_hash"), "peers": {},
           "sources": {}, "spread": {}}
    for k in PEER_FIELDS:
        for section in ("profile", "sources", "spread"):
            if k in dev.get(section, {}):
                doc["peers" if section == "profile" else section][k] = dev[section].pop(k)
    for key in PEER_RECORDS:
        if key in dev:
            doc[key] = dev.pop(key)
    parts[PEERS_FILE] = doc
    return doc


def load_runtime_json(path: str | os.PathLike) -> HostRuntime:
    """The HostRuntime of a stored `runtime.json`; ValueError naming the file when it is malformed."""
    return _load_fields(path, "runtime", HostRuntime)


def _load_fields(path: str | os.PathLike, key: str, cls, drop: tuple[str, ...] = ()):
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
        return cls(**{k: v for k, v in doc[key].items() if k not in drop})
    except FileNotFoundError:
        raise
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{p}: not a valid host {key} ({_first_line(e)})") from None


def _first_line(e: Exception) -> str:
    """The first line of an exception's message, or its repr when it has none."""
    return str(e).splitlines()[0] if str(e) else repr(e)


def recalibrate_error(d: Path, version: object) -> str:
    """The one-line error of a store written by another store version."""
    return (f"{d}: stored host profile has store version {version}, this code reads version {STORE_VERSION} "
            f"(one directory with a manifest of its parts); recalibrate: python -m experiments.calibrate "
            f"device=host remeasure=true")


def _stored(d: Path, ident: HostIdentity, need_full: bool, memory: str = "hold", huge: bool = True
            ) -> tuple[HostProfile | None, str]:
    """(profile, "") when `d` holds a usable profile for `ident` measured with `memory` (hil.hostmem) and fresh
    memory on huge pages or not (`huge`, hil.runner_state.huge_pages), else (None, why not). ValueError
    (`recalibrate_error`) for a profile of this machine written by another store version."""
    if not (d / "device.json").is_file():
        return None, "no stored profile"
    d = d.resolve()                                    # one version of the store, whatever is swapped in meanwhile
    try:
        stored_id = HostIdentity.from_json(json.loads((d / "identity.json").read_text()))
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        return None, f"stored identity unreadable ({type(e).__name__})"
    if stored_id != ident:
        diff = [k for k in asdict(ident) if getattr(ident, k) != getattr(stored_id, k)]
        return None, f"stored profile is from another machine ({', '.join(diff)} differ)"
    try:
        doc = json.loads((d / "device.json").read_text())
    except (OSError, ValueError) as e:
        return None, f"stored profile unreadable ({str(e)[:80]})"
    if doc.get("version") != STORE_VERSION:
        raise ValueError(recalibrate_error(d, doc.get("version")))
    if why := check_manifest(d):
        return None, why
    try:
        prof, rt = load_device_json(d / "device.json"), load_runtime_json(d / "runtime.json")
        peers = load_peers(d)
    except (OSError, ValueError) as e:
        return None, f"stored profile unreadable ({str(e)[:80]})"
    if doc.get("identity_hash") != ident.id_hash():
        return None, "stored profile has another identity hash"
    if need_full and doc.get("quick", True):
        return None, "stored profile is a quick calibration and a full one was asked for"
    if not (d / "cost_table.json").is_file():
        return None, "stored cost table missing"
    stored_memory = (doc.get("host_memory") or {}).get("mode", "as_is")      # not recorded: left as it was
    if stored_memory != memory:
        return None, f"stored profile was measured with host_memory={stored_memory} (asked: {memory})"
    if bool(doc.get("huge_pages", False)) != bool(huge):                     # not recorded: 4 KiB pages
        return None, f"stored profile was measured with huge_pages={bool(doc.get('huge_pages', False))} (asked: {huge})"
    return HostProfile(prof, rt, d / "cost_table.json", peers), ""


def store_dir(root: str | os.PathLike | None = None, ident: HostIdentity | None = None, quick: bool = False,
              memory: str = "hold", huge: bool = True) -> Path:
    """`<root>/<identity hash>` (full calibration) or `<root>/<identity hash>-quick` (quick calibration: kept apart,
    so a quick run never replaces a full profile); `-as_is` appended for a profile measured with free page reporting
    left alone (hil.hostmem), so the two modes never replace each other's profile; `-4k` for one measured with the
    runner's fresh memory on 4 KiB pages only (`huge=False`; the default asks for transparent huge pages,
    hil.runner_state.huge_pages)."""
    name = (ident or host_identity()).id_hash() + ("-quick" if quick else "")
    name += "" if memory == "hold" else f"-{memory}"
    name += "" if huge else "-4k"
    return Path(root or DEFAULT_ROOT) / name


def load_stored(root: Path, ident: HostIdentity, quick: bool, memory: str = "hold", huge: bool = True
                ) -> tuple[HostProfile | None, Path, str]:
    """(the stored profile of this machine or None, its store directory, why not): the full profile, or with `quick`
    the quick one when no full one is usable."""
    reasons = []
    for q in ((False, True) if quick else (False,)):
        d = store_dir(root, ident, q, memory, huge)
        got, why = _stored(d, ident, need_full=not q, memory=memory, huge=huge)
        if got is not None:
            return got, d, ""
        reasons.append(why)
    return None, store_dir(root, ident, quick, memory, huge), next(
        (w for w in reasons if w != "no stored profile"), "no stored profile")


@contextlib.contextmanager
def store_lock(root: Path):
    """One calibration of this machine at a time (they disturb each other): an exclusive lock on `<root>/.lock`."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        yield


CALIBRATION_PREFAULT = {False: 2 << 30, True: 512 << 20}   # B touched before a calibration (hil.hostmem.prefault):
#                                                            its scratch file's page cache, read buffers, probes


@dataclass
class Calibration:
    """One calibration of this host, before it is stored: the merged measurements (and each round's), the
    profile and runtime model mapped from them with every field's source and spread, and its conditions."""
    meas: Measurements
    per_round: list
    device: SocProfile
    runtime: HostRuntime
    fields: ProfileFields
    quick: bool
    wall_s: float
    host_memory: dict
    huge: bool


def measure(root: Path, ident: HostIdentity, quick: bool, log: Callable[[str], None] = lambda m: None,
            rounds: int | None = None, memory: str = "hold", huge: bool = True) -> Calibration:
    """Calibrate this host (`rounds` passes merged, None: the settings' default; guest free page reporting held or
    not by `memory`, hil.hostmem; fresh memory on huge pages or not by `huge`, hil.runner_state.huge_pages) and map
    the measurements (`build_profile`). Nothing is stored (`store`)."""
    from hil.calibrate_merge import measure_rounds
    from hil.calibrate_settings import CalibrationSettings
    from hil.hostmem import hold
    from hil.runner_state import huge_pages

    ghz, how = nominal_ghz()
    with hold(memory, CALIBRATION_PREFAULT[quick]) as mem, huge_pages(huge):
        t0 = time.perf_counter()
        meas, per_round = measure_rounds(root / "scratch", CalibrationSettings.make(quick, rounds), log)
        wall = time.perf_counter() - t0
        host_memory = {"mode": memory, "state": mem.describe(), "reported_mib": mem.reported_mib()}
    prof, rt, f = build_profile(meas, ident, ghz, how)
    return Calibration(meas, per_round, prof, rt, f, quick, wall, host_memory, huge)


def store(root: Path, ident: HostIdentity, cal: Calibration, memory: str = "hold") -> HostProfile:
    """Write calibration `cal` into this machine's store directory as one unit (`write_store`; module doc); the
    stored profile. A cost table the `table` cost model could not use is refused before anything is written."""
    d = store_dir(root, ident, cal.quick, memory, cal.huge)
    meas = cal.meas
    doc = measurements_json(meas)
    if len(cal.per_round) > 1:          # what each round measured: the merged figures' movement between rounds
        doc["rounds"] = [{k: v for k, v in measurements_json(r).items() if k != "settings"} for r in cal.per_round]
    rt_names = {fl.name for fl in dataclasses.fields(HostRuntime)}

    def part(names) -> tuple[dict, dict]:
        return ({k: v for k, v in cal.fields.sources.items() if k in names},
                {k: v for k, v in cal.fields.spread.items() if k in names})

    dev_src, dev_spr = part({fl.name for fl in dataclasses.fields(SocProfile)})
    rt_src, rt_spr = part(rt_names)
    head = dict(version=STORE_VERSION, identity_hash=ident.id_hash(), quick=cal.quick)
    table = cost_table(meas)
    check_table(table)
    new = write_store(d, {
        "measurements.json": doc, "cost_table.json": table, "identity.json": ident.to_json(),
        "runtime.json": dict(head, runtime=asdict(cal.runtime), sources=rt_src, spread=rt_spr),
        "device.json": dict(head, measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            wall_s=cal.wall_s, rounds=len(cal.per_round), loadavg=meas.loadavg,
                            host_memory=cal.host_memory, huge_pages=bool(cal.huge),
                            profile=asdict(cal.device), sources=dev_src, spread=dev_spr)})
    return HostProfile(cal.device, cal.runtime, new / "cost_table.json")


# ================================================ the `device=host` marker ==========================================
MARKER_KEYS = {"name", "measured", "store"}


def is_host_marker(device: dict) -> bool:
    """True for the plain dict of `conf/device/host.yaml` (`measured: true`): a device that is this machine,
    resolved by measuring it (`experiments.calibrate_fit.host_from_marker`) instead of read from the config."""
    return isinstance(device, dict) and device.get("measured") is True


def marker_store(device: dict) -> Path | None:
    """The store root a `device=host` marker dict names (keys: name, measured, store; None: the default root);
    ValueError naming the key for anything else."""
    extra = sorted(set(device) - MARKER_KEYS)
    if extra:
        raise ValueError(f"device.{extra[0]}: not a key of the measured host device (keys: "
                         f"{', '.join(sorted(MARKER_KEYS))}); its values are measured, not configured")
    if device.get("measured") is not True:
        raise ValueError(f"device.measured: must be true for the measured host device (got {device.get('measured')!r})")
    store_root = device.get("store") or ""
    if not isinstance(store_root, str):
        raise ValueError(f"device.store: must be a directory path or empty (got {store_root!r})")
    return Path(store_root) if store_root else None


# ================================================ report =============================================================
def _unit(field_name: str) -> str:
    for suffix, unit in (("_gbps_per_core", "GB/s per core"), ("_gops_per_ghz", "GOP/s per GHz"),
                         ("_gflops_per_ghz", "GFLOP/s per GHz"), ("_s_per_gb", "s/GB"), ("_gbps", "GB/s"),
                         ("_tops", "TOP/s"), ("_bytes", "B"), ("_ghz", "GHz"), ("_cores", "cores"),
                         ("_nj_per_byte", "nJ/B"), ("_per_weight", "cycles/weight"), ("_w", "W"), ("_s", "s")):
        if field_name.endswith(suffix):
            return unit
    return "1"


def markdown_table(doc: dict, key: str = "profile") -> str:
    """A stored `device.json` (key "profile") or `runtime.json` (key "runtime") as a Markdown table: field, value,
    unit, how measured, spread (docs/hil.md)."""
    rows = ["| field | value | unit | how | spread |", "|---|---|---|---|---|"]
    for k, v in doc[key].items():
        if k in ("name", "soc", "source"):
            continue
        val = f"{v:.4g}" if isinstance(v, float) else str(v)
        sp = doc.get("spread", {}).get(k)
        rows.append(f"| `{k}` | {val} | {_unit(k)} | {doc['sources'].get(k, '')} | "
                    f"{'' if sp is None else f'{sp:.2f}'} |")
    return "\n".join(rows)


if __name__ == "__main__":        # python -m hil.host: print this machine's stored profile (never measures)
    import sys

    d = store_dir()
    if not (d / "device.json").is_file():
        d = store_dir(quick=True)
    if not (d / "device.json").is_file():
        print(f"error: no stored profile for this machine in {d}; run python -m experiments.calibrate", file=sys.stderr)
        raise SystemExit(2)
    doc = json.loads((d / "device.json").read_text())
    if doc.get("version") != STORE_VERSION:
        print(f"error: {recalibrate_error(d, doc.get('version'))}", file=sys.stderr)
        raise SystemExit(2)
    print(f"{d} ({'quick' if doc['quick'] else 'full'}, measured {doc['measured_at']}, {doc['wall_s']:.0f} s, "
          f"load average {doc.get('loadavg')})\n\ndevice profile:\n")
    parts = {"device.json": doc} | ({PEERS_FILE: json.loads((d / PEERS_FILE).read_text())}
                                   if (d / PEERS_FILE).is_file() else {})
    peers = peer_parts(parts)                        # the older layout's peer costs apart from the device profile
    print(markdown_table(doc))
    print("\nhost runtime:\n")
    print(markdown_table(json.loads((d / "runtime.json").read_text()), "runtime"))
    if peers["peers"]:
        print("\npeer costs (llama.cpp's and MNN's own code):\n")
        print(markdown_table(peers, "peers"))
