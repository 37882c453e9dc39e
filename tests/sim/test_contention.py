"""Shared cores: a plan with more runnable threads than cores takes longer (docs/coldstart.md "Shared resources").
Most cases run a phone profile with host runtime mechanics (planner.host_runtime) switched on one at a time."""
import dataclasses

import pytest

from planner.host_runtime import HostRuntime
from planner.plan import OpWork, Plan, PlanBuilder, TensorRef
from sim import executor
from sim.engine import Environment, Event
from sim.sharing import Cores, SharedRate
from tests.sim.helpers import FakeCost, xiaomi

RT_FIELDS = {f.name for f in dataclasses.fields(HostRuntime)}


@dataclasses.dataclass(frozen=True)
class Host:
    """A device profile and a host runtime model, their fields read by name from either (the tests' shorthand)."""
    dev: object
    rt: HostRuntime

    def __getattr__(self, name):
        return getattr(self.dev if hasattr(self.dev, name) else self.rt, name)


def replace(h: Host, **kw) -> Host:
    """`h` with fields of the device profile and of the runtime model replaced by name."""
    rt = {k: v for k, v in kw.items() if k in RT_FIELDS}
    dev = {k: v for k, v in kw.items() if k not in RT_FIELDS}
    return Host(dataclasses.replace(h.dev, **dev), dataclasses.replace(h.rt, **rt))


def host(**kw) -> Host:
    return replace(Host(xiaomi(), HostRuntime()), **kw)


def simulate(plan: Plan, h: Host, cost) -> object:
    return executor.simulate(plan, h.dev, cost, runtime=h.rt)


def PlanExecutor(plan: Plan, h: Host, cost) -> executor.PlanExecutor:  # noqa: N802 - the executor, built from a Host
    return executor.PlanExecutor(plan, h.dev, cost, runtime=h.rt)


def unpack_plan(n: int, seconds: float = 1.0) -> Plan:
    b = PlanBuilder()
    for i in range(n):
        b.add(f"unpack{i}", "unpack", works=[OpWork("unpack", n=seconds)])   # type: ignore[arg-type]
    return Plan("t", "m", "d", 1, 0, b.tasks, unpack_threads=n)


def device(cores: int, **kw) -> Host:
    return host(cpu_big_cores=cores, cpu_little_cores=0, **kw)


@pytest.mark.parametrize("threads,cores,want", [(3, 2, 1.5), (3, 4, 1.0), (2, 2, 1.0), (4, 1, 4.0)])
def test_threads_beyond_cores_share_them(threads, cores, want):
    tl = simulate(unpack_plan(threads), device(cores), FakeCost())
    assert tl.end_s == pytest.approx(want)


def test_npu_stand_in_occupies_a_core_only_when_it_is_one():
    b = PlanBuilder()
    b.add("u", "unpack", works=[OpWork("unpack", n=1.0)])                    # type: ignore[arg-type]
    b.add("m", "npu", works=[OpWork("matmul", k=1.0, n=5.0)])                # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks)
    assert simulate(plan, device(1), FakeCost()).end_s == pytest.approx(1.0)            # a real NPU: in parallel
    assert simulate(plan, device(1, npu_on_cpu_core=True), FakeCost()).end_s == pytest.approx(2.0)   # one core


def test_read_cpu_work_overlaps_the_transfer_and_competes_for_cores():
    b = PlanBuilder()
    b.add("ld", "load", read_bytes=10**9, request_bytes=1 << 23)
    b.add("u", "unpack", works=[OpWork("unpack", n=1.0)])                    # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks)
    fast = simulate(plan, device(1), FakeCost())
    copy = simulate(plan, device(1, read_cpu_gbps=1.0), FakeCost())   # 1 s of CPU work for 1 GB, one core
    ld = lambda tl: next(s for s in tl.spans if s.task == 0)           # noqa: E731
    assert ld(copy).end - ld(copy).start > ld(fast).end - ld(fast).start
    assert copy.end_s == pytest.approx(2.0, rel=1e-6)                  # 1 s read-copy + 1 s unpack on one core


def test_weighted_water_filling():
    env = Environment()
    r = SharedRate(env, 10.0)
    done = {}
    for name, amount, cap in (("a", 2.0, 1.0), ("b", 18.0, 100.0)):
        ev = r.use(amount, cap)
        ev.callbacks.append(lambda _e, n=name: done.setdefault(n, env.now))
    env.run()
    assert done["a"] == pytest.approx(2.0)          # capped at 1/s
    assert done["b"] == pytest.approx(2.0)          # 9/s while a runs, then alone: 18 = 9*2
    c = Cores(Environment(), 2)
    assert c.capacity == 2


def test_overlapping_ops_share_dram_bandwidth():
    b = PlanBuilder()
    for i in range(2):   # each: 1 s alone, 10 GB of DRAM traffic (5 GB written + 5 GB read) -> demand 10 GB/s
        b.add(f"u{i}", "unpack", works=[OpWork("unpack", n=1.0, nbytes=5 * 10**9)])   # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks, unpack_threads=2)
    assert simulate(plan, device(2), FakeCost()).end_s == pytest.approx(1.0)                   # not modelled
    assert simulate(plan, device(2, dram_gbps=40.0), FakeCost()).end_s == pytest.approx(1.0)   # enough for both
    assert simulate(plan, device(2, dram_gbps=15.0), FakeCost()).end_s == pytest.approx(20 / 15)   # 7.5 GB/s each


def _load_plan(n_loads: int, nbytes: int = 10**9, unpack_s: float = 0.0) -> Plan:
    b = PlanBuilder()
    for i in range(n_loads):
        b.add(f"ld{i}", "load", read_bytes=nbytes, request_bytes=1 << 23, mem_alloc=nbytes)
    if unpack_s:
        b.add("u", "unpack", works=[OpWork("unpack", n=unpack_s)])          # type: ignore[arg-type]
    return Plan("t", "m", "d", 1, 0, b.tasks, loader_threads=n_loads)


def test_read_overlap_between_serial_and_concurrent():
    """A sequential load takes max(T, C) + (1 − η)·min(T, C): T + C with no overlap, max(T, C) with full overlap."""
    dev = device(2, flash_peak_gbps=1.0, flash_reader_gbps=1.0, flash_request_latency_s=0.0,
                 read_cpu_gbps=2.0)                                      # T = 1 s, C = 0.5 s per GB
    t = {eta: simulate(_load_plan(1), replace(dev, read_cpu_overlap=eta), FakeCost()).end_s
         for eta in (0.0, 0.5, 1.0)}
    assert t[0.0] == pytest.approx(1.5, rel=1e-6)
    assert t[0.5] == pytest.approx(1.25, rel=1e-6)
    assert t[1.0] == pytest.approx(1.0, rel=1e-6)


def test_two_readers_at_once_overlap_by_their_own_measured_share():
    """read_cpu_overlap_multi applies while another sequential reader streams; T is the transfer as it went (the
    device shared): two 1 GB loads on a 1 GB/s device take 2 s of transfer each, C = 0.5 s."""
    dev = device(2, flash_peak_gbps=1.0, flash_reader_gbps=1.0, flash_request_latency_s=0.0, read_cpu_gbps=2.0,
                 read_cpu_overlap=1.0)
    assert simulate(_load_plan(2), dev, FakeCost()).end_s == pytest.approx(2.0, rel=1e-6)      # -1: same share
    multi = replace(dev, read_cpu_overlap_multi=0.0)
    assert simulate(_load_plan(2), multi, FakeCost()).end_s == pytest.approx(2.5, rel=1e-6)    # T + C
    assert simulate(_load_plan(1), multi, FakeCost()).end_s == pytest.approx(1.0, rel=1e-6)    # alone: 1.0
    with pytest.raises(ValueError, match="read_cpu_overlap_multi"):
        replace(dev, read_cpu_overlap_multi=-0.5)


def test_readahead_fills_the_page_cache_while_the_device_is_idle():
    """read_ahead_bytes: after a sequential load, the kernel reads on past its end while the device has nothing else
    to do (measured on the host); a later load of the following bytes transfers only the rest. Two 10 MB loads on a
    1 GB/s device, the second after a 1 s compute gap: 10 ms + 1 s + 2 ms with an 8 MB window."""
    def plan(gap: bool) -> Plan:
        b = PlanBuilder()
        mb = 10**6
        b.add("a", "load", read_bytes=10 * mb, request_bytes=1 << 20, tensors=[TensorRef("a", 0, 10 * mb)])
        deps = [b.add("c", "cpu", deps=[0], works=[OpWork("elementwise", n=1.0)])] if gap else [0]  # type: ignore
        b.add("b", "load", deps=deps, read_bytes=10 * mb, request_bytes=1 << 20,
              tensors=[TensorRef("b", 10 * mb, 10 * mb)])
        return Plan("t", "m", "d", 1, 0, b.tasks)
    dev = device(2, flash_peak_gbps=1.0, flash_reader_gbps=1.0, flash_request_latency_s=0.0)
    ra = replace(dev, read_ahead_bytes=8 * 10**6)
    assert simulate(plan(True), dev, FakeCost()).end_s == pytest.approx(1.02)
    assert simulate(plan(True), ra, FakeCost()).end_s == pytest.approx(1.012)
    assert simulate(plan(False), ra, FakeCost()).end_s == pytest.approx(0.02)     # no idle time: nothing ahead


def test_a_new_sequential_stream_waits_its_start_up_once():
    """flash_stream_start_s (measured on the host): a loader's first sequential read waits it, the reads that continue
    its stream do not, one that goes back before the end of its stream starts a new one; random reads never do.
    Two 10 MB loads on a 1 GB/s device: 20 ms + 5 ms in file order, + 10 ms when the second goes back."""
    def plan(back: bool, random: bool = False) -> Plan:
        b = PlanBuilder()
        mb = 10**6
        offs = (20 * mb, 0) if back else (0, 10 * mb)
        for k, off in enumerate(offs):
            b.add(f"l{k}", "load", deps=[k - 1] if k else [], read_bytes=10 * mb, request_bytes=1 << 20,
                  tensors=[TensorRef(f"t{k}", off, 10 * mb)], random_reads=random)
        return Plan("t", "m", "d", 1, 0, b.tasks)
    dev = device(2, flash_peak_gbps=1.0, flash_reader_gbps=1.0, flash_request_latency_s=0.0,
                 flash_stream_start_s=0.005)
    assert simulate(plan(False), dev, FakeCost()).end_s == pytest.approx(0.025)
    assert simulate(plan(True), dev, FakeCost()).end_s == pytest.approx(0.030)
    assert simulate(plan(False, random=True), dev, FakeCost()).end_s == pytest.approx(0.020)
    assert simulate(plan(False), replace(dev, flash_stream_start_s=0.0), FakeCost()).end_s == \
        pytest.approx(0.020)


def test_page_faults_of_threads_run_in_parallel_on_their_cores():
    """Two threads first-touching 1 GB each fault in parallel (measured on the host: each spends the CPU per byte of
    one alone), so they take as long as one when each has a core and twice as long on one core."""
    dev = device(4, flash_peak_gbps=1e6, flash_reader_gbps=1e6, flash_request_latency_s=0.0,
                 mem_fault_gbps=1.0)                                      # transfer ~0, touch 1 s / GB
    one = simulate(_load_plan(1), dev, FakeCost()).end_s
    two = simulate(_load_plan(2), dev, FakeCost()).end_s
    assert one == pytest.approx(1.0, rel=1e-3)
    assert two == pytest.approx(1.0, rel=1e-3)
    assert simulate(_load_plan(2), replace(dev, cpu_big_cores=1), FakeCost()).end_s == \
        pytest.approx(2.0, rel=1e-3)
    no_faults = replace(dev, mem_fault_gbps=0.0)
    assert simulate(_load_plan(2), no_faults, FakeCost()).end_s < 1e-3


def test_a_read_into_fresh_memory_pays_the_read_fault_rate():
    dev = device(4, flash_peak_gbps=1e6, flash_reader_gbps=1e6, flash_request_latency_s=0.0, mem_fault_gbps=1.0)
    assert simulate(_load_plan(1), replace(dev, read_fault_gbps=0.5), FakeCost()).end_s == \
        pytest.approx(2.0, rel=1e-3)                                      # 1 GB at 0.5 GB/s instead of 1 GB/s
    assert dev.read_fault_s_per_byte(1 << 20) == dev.fault_s_per_byte(1 << 20)   # 0 = the user-space touch rate


def _staging_plan(sizes: list[int]) -> Plan:
    """Per layer: a load of one packed tensor, then its unpack to an INT8 tensor twice its size (bound refs)."""
    b = PlanBuilder()
    for i, n in enumerate(sizes):
        ref = [TensorRef(f"blk.{i}.w", 1000 * i, n)]
        ld = b.add(f"ld{i}", "load", read_bytes=n, request_bytes=1 << 23, mem_alloc=n, tensors=ref)
        b.add(f"u{i}", "unpack", [ld], mem_alloc=2 * n, mem_free=n, tensors=ref)
    return Plan("t", "m", "d", 1, 0, b.tasks, loader_threads=1, unpack_threads=1)


def test_staging_blobs_reuse_released_buffers_best_fit_and_unpacked_tensors_are_fresh():
    """As the runner: a load's packed blob takes a buffer an earlier unpack released when one is large enough; the
    unpacked INT8 tensors are always fresh memory."""
    dev = device(4, flash_peak_gbps=1e6, flash_reader_gbps=1e6, flash_request_latency_s=0.0, mem_fault_gbps=1.0)
    ex = PlanExecutor(_staging_plan([10**8, 10**8, 2 * 10**8, 5 * 10**7]), dev, FakeCost())
    seen = []
    orig = ex._fresh_bytes
    ex._fresh_bytes = lambda t: seen.append((t.name, orig(t))) or seen[-1][1]
    ex.run()
    fresh = dict(seen)
    assert fresh["ld0"] == 10**8                    # nothing released yet
    assert fresh["u0"] == 2 * 10**8                 # unpacked tensors: always fresh
    assert fresh["ld2"] == 2 * 10**8                # no released buffer holds 200 MB
    assert fresh["ld3"] == 0                        # a released 100 MB buffer holds 50 MB
    assert sum(v for k, v in fresh.items() if k.startswith("u")) == 2 * (4 * 10**8 + 5 * 10**7)


def test_first_touch_cost_depends_on_allocation_size():
    dev = host(mem_fault_gbps=2.0, mem_fault_small_bytes=1 << 20, mem_fault_large_gbps=8.0,
               mem_fault_large_bytes=16 << 20)
    assert dev.fault_s_per_byte(4096) == pytest.approx(0.5e-9)
    assert dev.fault_s_per_byte(1 << 30) == pytest.approx(0.125e-9)
    assert dev.fault_s_per_byte(4 << 20) == pytest.approx(0.25e-9)          # halfway in log size
    assert replace(dev, mem_fault_large_gbps=0.0).fault_s_per_byte(1 << 30) == pytest.approx(0.5e-9)
    assert replace(dev, mem_fault_gbps=0.0).fault_s_per_byte(1 << 20) == 0.0
    with pytest.raises(ValueError, match="read_cpu_overlap"):
        replace(dev, read_cpu_overlap=1.5)


def test_an_unpack_first_touches_its_output_at_the_unpack_fault_rate():
    """An unpack's fresh 1 GB output costs unpack_fault_s_per_byte (its own curve) when measured, else the memcpy
    first-touch rate; a load's fresh buffer keeps fault_s_per_byte either way."""
    dev = host(mem_fault_gbps=2.0, mem_fault_small_bytes=1 << 20, mem_fault_large_gbps=8.0,
               mem_fault_large_bytes=16 << 20)
    assert dev.unpack_fault_s_per_byte(1 << 30) == dev.fault_s_per_byte(1 << 30)
    own = replace(dev, unpack_fault_gbps=4.0, unpack_fault_large_gbps=16.0)
    assert own.unpack_fault_s_per_byte(4096) == pytest.approx(0.25e-9)
    assert own.unpack_fault_s_per_byte(4 << 20) == pytest.approx(0.125e-9)
    assert own.unpack_fault_s_per_byte(1 << 30) == pytest.approx(0.0625e-9)
    assert own.fault_s_per_byte(1 << 30) == pytest.approx(0.125e-9)

    b = PlanBuilder()
    b.add("u", "unpack", works=[OpWork("unpack", n=0.0)], mem_alloc=10**9)   # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks)
    base = device(2, mem_fault_gbps=1.0)
    assert simulate(plan, base, FakeCost()).end_s == pytest.approx(1.0, rel=1e-3)
    assert simulate(plan, replace(base, unpack_fault_gbps=4.0), FakeCost()).end_s == \
        pytest.approx(0.25, rel=1e-3)


def test_woken_worker_starts_after_its_wake_up_time():
    b = PlanBuilder()
    u0 = b.add("u0", "unpack", works=[OpWork("unpack", n=1.0)])             # type: ignore[arg-type]
    b.add("m", "cpu", [u0], works=[OpWork("matmul", k=1.0, n=1.0)])          # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks)
    base = simulate(plan, device(2), FakeCost()).end_s
    woke = simulate(plan, device(2, thread_wake_s=0.25), FakeCost()).end_s
    assert woke == pytest.approx(base + 0.25)                               # the cpu worker waited for u0


def _read_with_busy_cores(busy_threads: int, **kw) -> float:
    """One 1 GB sequential load (1 MB requests) while `busy_threads` CPU-bound unpack ops of 4 s run."""
    b = PlanBuilder()
    b.add("ld", "load", read_bytes=10**9, request_bytes=10**6)
    for i in range(busy_threads):
        b.add(f"u{i}", "unpack", works=[OpWork("unpack", n=4.0)])            # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks, loader_threads=1, unpack_threads=max(1, busy_threads))
    tl = simulate(plan, device(2, flash_peak_gbps=1.0, flash_reader_gbps=1.0, flash_request_latency_s=0.0, **kw),
                  FakeCost())
    return next(s.end - s.start for s in tl.spans if s.resource == "load")


def test_read_requests_wait_for_a_core_only_while_other_threads_occupy_every_core():
    """flash_request_busy_s: 1000 requests x 1 ms more while two other threads keep both cores busy; nothing with one
    (a core is free for the reader) or when the parameter is 0."""
    assert _read_with_busy_cores(2) == pytest.approx(1.0, rel=1e-6)
    assert _read_with_busy_cores(2, flash_request_busy_s=1e-3) == pytest.approx(2.0, rel=1e-6)
    assert _read_with_busy_cores(1, flash_request_busy_s=1e-3) == pytest.approx(1.0, rel=1e-6)


def test_read_interrupt_work_takes_core_time_from_other_threads():
    """read_irq_gbps: a 1 GB read's completion work (0.5 core-s here) shares the cores with the busy threads."""
    b = PlanBuilder()
    b.add("ld", "load", read_bytes=10**9, request_bytes=10**6)
    b.add("u", "unpack", works=[OpWork("unpack", n=1.0)])                   # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks, loader_threads=1, unpack_threads=1)
    dev = device(1, flash_peak_gbps=1.0, flash_reader_gbps=1.0, flash_request_latency_s=0.0)
    assert simulate(plan, dev, FakeCost()).end_s == pytest.approx(1.0, rel=1e-6)
    # one core: the unpack shares it with the interrupt work while the read runs -> 0.5 s of it lost
    assert simulate(plan, replace(dev, read_irq_gbps=2.0), FakeCost()).end_s == pytest.approx(1.5, rel=1e-3)


def test_a_worker_woken_while_every_core_is_busy_waits_longer():
    """thread_wake_busy_s applies when, at the wake, other threads occupy every core (here two 4 s unpacks on two
    cores); thread_wake_s otherwise."""
    b = PlanBuilder()
    u0 = b.add("u0", "unpack", works=[OpWork("unpack", n=1.0)])             # type: ignore[arg-type]
    b.add("u1", "unpack", works=[OpWork("unpack", n=4.0)])                  # type: ignore[arg-type]
    b.add("u2", "unpack", works=[OpWork("unpack", n=4.0)])                  # type: ignore[arg-type]
    b.add("m", "cpu", [u0], works=[OpWork("matmul", k=1.0, n=0.5)])          # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks, unpack_threads=3)
    dev = device(2, thread_wake_s=0.01, thread_wake_busy_s=0.25)

    def m_start(d) -> float:
        return next(s.start for s in simulate(plan, d, FakeCost()).spans if plan.tasks[s.task].name == "m")
    quiet = replace(dev, thread_wake_busy_s=0.0)
    assert m_start(dev) - m_start(quiet) == pytest.approx(0.24, rel=1e-6)


def test_a_worker_woken_onto_an_idle_core_while_others_run_waits_its_own_time():
    """thread_wake_idle_core_s applies when, at the wake, another thread keeps running and a core is idle (the woken
    thread starts on that core); thread_wake_s when nothing else runs (its waker's core takes it)."""
    b = PlanBuilder()
    u0 = b.add("u0", "unpack", works=[OpWork("unpack", n=1.0)])             # type: ignore[arg-type]
    b.add("u1", "unpack", works=[OpWork("unpack", n=4.0)])                  # type: ignore[arg-type]
    b.add("m", "cpu", [u0], works=[OpWork("matmul", k=1.0, n=0.5)])          # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks, unpack_threads=2)
    dev = device(3, thread_wake_s=0.01, thread_wake_idle_core_s=0.05)

    def start(d, name: str) -> float:
        return next(s.start for s in simulate(plan, d, FakeCost()).spans if plan.tasks[s.task].name == name)
    quiet = replace(dev, thread_wake_idle_core_s=0.0)
    assert start(dev, "m") - start(quiet, "m") == pytest.approx(0.04, rel=1e-6)    # u1 still runs at the wake
    b1 = PlanBuilder()
    v0 = b1.add("u0", "unpack", works=[OpWork("unpack", n=1.0)])            # type: ignore[arg-type]
    b1.add("m", "cpu", [v0], works=[OpWork("matmul", k=1.0, n=0.5)])        # type: ignore[arg-type]
    alone = Plan("t", "m", "d", 1, 0, b1.tasks, unpack_threads=1)
    assert next(s.start for s in simulate(alone, dev, FakeCost()).spans if alone.tasks[s.task].name == "m") == \
        pytest.approx(1.01)                                                # nothing else runs: thread_wake_s


def test_scattered_reads_cost_their_measured_core_time_per_request():
    """flash_random_read_cpu_s: each request of a random-read load (the prompt's embedding rows) costs that much of
    the reader's core time (kernel work per cold page), after its transfer (no readahead overlaps it); 0 = the
    per-byte read_cpu_gbps."""
    b = PlanBuilder()
    b.add("rows", "load", read_bytes=10 * 1000, request_bytes=1000, random_reads=True)
    plan = Plan("t", "m", "d", 1, 0, b.tasks)
    dev = device(2, flash_random_read_s=0.001, read_cpu_gbps=1e3)
    base = simulate(plan, dev, FakeCost())
    tl = simulate(plan, replace(dev, flash_random_read_cpu_s=0.002), FakeCost())
    assert tl.spans[0].cpu_s == pytest.approx(0.02)
    assert tl.end_s - base.end_s == pytest.approx(0.02 - base.spans[0].cpu_s, rel=1e-3)


def test_per_tensor_costs_of_loads_and_unpacks_are_core_time():
    """A runtime's fixed cost per loaded / unpacked tensor (load_tensor_s, unpack_tensor_s; measured for the host
    runner) is core time of the worker: it lengthens the task, shows in its span's CPU time and competes for cores."""
    b = PlanBuilder()
    refs = [TensorRef(f"t{i}", 4096 * i, 4096) for i in range(3)]
    b.add("ld", "load", read_bytes=3 * 4096, request_bytes=4096, tensors=refs)
    b.add("u", "unpack", works=[OpWork("unpack", n=0.0)], tensors=refs[:2], deps=[0])   # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks)
    base = simulate(plan, device(1), FakeCost())
    cost = simulate(plan, device(1, load_tensor_s=0.01, unpack_tensor_s=0.1), FakeCost())
    span = {s.task: s for s in cost.spans}
    assert span[0].cpu_s == pytest.approx(0.03) and span[1].cpu_s == pytest.approx(0.2)
    assert cost.end_s - base.end_s == pytest.approx(0.03 + 0.2)
    b2 = PlanBuilder()                                   # two unpackers on one core: their fixed costs share it
    b2.add("u0", "unpack", works=[OpWork("unpack", n=0.0)], tensors=refs[:1])   # type: ignore[arg-type]
    b2.add("u1", "unpack", works=[OpWork("unpack", n=0.0)], tensors=refs[1:2])  # type: ignore[arg-type]
    two = Plan("t", "m", "d", 1, 0, b2.tasks, unpack_threads=2)
    assert simulate(two, device(1, unpack_tensor_s=0.1), FakeCost()).end_s == pytest.approx(0.2)
    assert simulate(two, device(2, unpack_tensor_s=0.1), FakeCost()).end_s == pytest.approx(0.1)


def test_corun_slowdown_applies_only_while_other_threads_use_the_other_cores():
    """HostRuntime.corun_*: a class of work takes that many times its CPU time while other threads run on the other
    cores (measured on the host); alone, or beside a real NPU, it takes its own time."""
    one = unpack_plan(1)
    two = unpack_plan(2)
    slow = dict(corun_unpack=1.5)
    assert simulate(one, device(2, **slow), FakeCost()).end_s == pytest.approx(1.0)        # alone: no slowdown
    assert simulate(two, device(2), FakeCost()).end_s == pytest.approx(1.0)
    assert simulate(two, device(2, **slow), FakeCost()).end_s == pytest.approx(1.5)        # both cores in use
    assert simulate(two, device(2, corun_gemm=3.0), FakeCost()).end_s == pytest.approx(1.0)  # another class
    b = PlanBuilder()                              # a 1 s and a 0.5 s unpack: the long one is slowed while both run
    b.add("u0", "unpack", works=[OpWork("unpack", n=1.0)])                   # type: ignore[arg-type]
    b.add("u1", "unpack", works=[OpWork("unpack", n=0.5)])                   # type: ignore[arg-type]
    mixed = Plan("t", "m", "d", 1, 0, b.tasks, unpack_threads=2)
    # both at rate 1/1.5 until u1 ends at 0.75 s (0.5 s of work); u0 then has 0.5 s left, alone: ends at 1.25 s
    assert simulate(mixed, device(2, **slow), FakeCost()).end_s == pytest.approx(1.25)


def test_corun_slowdown_depends_on_what_the_other_cores_run():
    """A job beside memory-system work (cold reads into fresh buffers, first touch: HostRuntime.corun_*_mem) is slowed
    by that factor, beside compute by the other one; each co-runner counts by the cores it occupies."""
    def finish(n_cores: int, others: list[bool]) -> float:
        env = Environment()
        cores = Cores(env, n_cores)
        done = {}

        def job(name: str, ev: Event):
            yield ev
            done[name] = env.now
        env.process(job("a", cores.run(1.0, slow=(1.5, 2.0))))
        for i, mem in enumerate(others):
            env.process(job(f"o{i}", cores.run(1.0, memory=mem)))
        env.run()
        return done["a"]
    # beside a 1 s compute job: rate 1/1.5 for 1 s (2/3 done), then alone
    assert finish(2, [False]) == pytest.approx(1.0 + 1.0 / 3.0)
    # beside a 1 s memory job: rate 1/2 for 1 s, then alone
    assert finish(2, [True]) == pytest.approx(1.5)
    # 3 cores, one of each on the two others: rate 1 / (1 + (0.5 + 1.0) / 2) for 1 s, then alone
    assert finish(3, [False, True]) == pytest.approx(1.0 + (1.0 - 1.0 / 1.75))


def test_cores_reject_a_speed_up_factor():
    with pytest.raises(ValueError, match="slow"):
        Cores(Environment(), 2).run(1.0, slow=(0.5, 1.0))
    with pytest.raises(ValueError, match="corun_read_mem"):
        host(corun_read_mem=0.9)


def test_a_thread_that_finds_the_interpreter_lock_held_pays_a_hand_off():
    """interpreter_lock: two unpackers' per-tensor runtime code at the same instant: one runs, the other blocks and is
    handed the lock (thread_wake_cpu_s of core time on top, and of lock time: it runs under the lock)."""
    refs = [TensorRef(f"t{i}", 0, 0) for i in range(2)]
    b = PlanBuilder()
    b.add("u0", "unpack", works=[OpWork("unpack", n=0.0)], tensors=refs[:1])   # type: ignore[arg-type]
    b.add("u1", "unpack", works=[OpWork("unpack", n=0.0)], tensors=refs[1:2])  # type: ignore[arg-type]
    two = Plan("t", "m", "d", 1, 0, b.tasks, unpack_threads=2)
    base = dict(unpack_tensor_s=0.1, interpreter_lock=True)
    assert simulate(two, device(2, **base), FakeCost()).end_s == pytest.approx(0.2)          # one after the other
    ex = PlanExecutor(two, device(2, thread_wake_cpu_s=0.05, **base), FakeCost())
    assert ex.run().end_s == pytest.approx(0.25) and ex.gil_waits == 1
    # ... and it runs thread_wake_s after the release (woken like any futex waiter), the lock reserved meanwhile
    ex = PlanExecutor(two, device(2, thread_wake_cpu_s=0.05, thread_wake_s=0.02, **base), FakeCost())
    assert ex.run().end_s == pytest.approx(0.27) and ex.gil_waits == 1


class _OverheadCost(FakeCost):
    """FakeCost whose compute ops carry 0.01 s of per-op dispatch overhead (within their op_time)."""

    def overhead_time(self, work: OpWork, unit: str) -> float:
        return 0.01 if work.kind == "elementwise" else 0.0


def test_an_ops_python_share_under_the_interpreter_lock_is_cpu_op_python_s():
    """Two CPU-unit workers (npu_on_cpu_core), 0.1 s elementwise ops each: alone in time, with 0.01 s of each op
    under the lock they overlap but for 0.01 s; with cpu_op_python_s = 0.05 half of each op is held, so the second
    op's held part waits for the first: the total per op is unchanged, the contention grows."""
    b = PlanBuilder()
    b.add("a", "cpu", works=[OpWork("elementwise", n=0.1)])                  # type: ignore[arg-type]
    b.add("b", "npu", works=[OpWork("elementwise", k=0.1)])                  # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks)
    dev = device(2, interpreter_lock=True, npu_on_cpu_core=True)
    assert simulate(plan, dev, _OverheadCost()).end_s == pytest.approx(0.11)
    assert simulate(plan, replace(dev, cpu_op_python_s=0.05), _OverheadCost()).end_s == \
        pytest.approx(0.15)
    one = Plan("t", "m", "d", 1, 0, b.tasks[:1])
    assert simulate(one, replace(dev, cpu_op_python_s=0.05), _OverheadCost()).end_s == \
        pytest.approx(0.1)                                       # alone: the same total


def test_timeline_reports_core_occupancy_and_wake_ups():
    """Timeline.core_busy_s: core-seconds the cores were occupied (a co-run-slowed job occupies its core all the
    same); Timeline.waits: idle workers woken + interpreter-lock hand-offs."""
    b = PlanBuilder()
    b.add("u", "unpack", works=[OpWork("unpack", n=1.0)])                    # type: ignore[arg-type]
    b.add("c", "cpu", deps=[0], works=[OpWork("elementwise", n=1.0)])        # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks)
    tl = simulate(plan, device(2, thread_wake_cpu_s=0.1), FakeCost())
    assert tl.end_s == pytest.approx(2.1) and tl.core_busy_s == pytest.approx(2.1)   # one core busy throughout
    assert tl.waits == 1                           # the cpu worker, idle until the unpack ends, woken once
    assert tl.waits_by_thread == {"cpu0": 1}       # ... per worker: only that one waited
    two = PlanBuilder()
    two.add("a", "unpack", works=[OpWork("unpack", n=1.0)])                  # type: ignore[arg-type]
    two.add("b", "cpu", works=[OpWork("elementwise", n=1.0)])                # type: ignore[arg-type]
    tl = simulate(Plan("t", "m", "d", 1, 0, two.tasks), device(2, corun_elementwise=2.0), FakeCost())
    assert tl.core_busy_s == pytest.approx(tl.end_s + 1.0)    # both cores for 1 s, then one core slowed by co-run


def test_a_woken_worker_spends_core_time_on_the_wake_up():
    """thread_wake_cpu_s: CPU work of being woken (futex, re-taking locks; measured for the host runner), besides the
    hand-off latency thread_wake_s: it occupies a core, so it competes with the other threads."""
    b = PlanBuilder()
    b.add("u", "unpack", works=[OpWork("unpack", n=1.0)])                    # type: ignore[arg-type]
    b.add("c", "cpu", deps=[0], works=[OpWork("elementwise", n=1.0)])        # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks)
    assert simulate(plan, device(2), FakeCost()).end_s == pytest.approx(2.0)
    assert simulate(plan, device(2, thread_wake_cpu_s=0.1), FakeCost()).end_s == pytest.approx(2.1)
    assert simulate(plan, device(2, thread_wake_cpu_s=0.1, thread_wake_s=0.05), FakeCost()).end_s == \
        pytest.approx(2.15)


def _cpu_ops(kinds_seconds, threads: int = 2) -> Plan:
    """One cpu task per (kind, seconds), in a chain, on a `threads`-thread CPU unit."""
    b = PlanBuilder()
    prev: list[int] = []
    for i, (kind, sec) in enumerate(kinds_seconds):
        prev = [b.add(f"op{i}", "cpu", deps=prev, order=i, works=[OpWork(kind, n=sec)])]   # type: ignore[arg-type]
    return Plan("t", "m", "d", 1, 0, b.tasks, cpu_threads=threads)


def test_runtime_that_splits_only_gemms_runs_other_ops_on_one_core():
    """cpu_split_gemm_only (the host runner): a 2-thread CPU unit's elementwise op occupies one core, its GEMM two;
    otherwise both occupy the unit's threads. Seen in the timeline's core-seconds."""
    plan = _cpu_ops([("elementwise", 1.0), ("matmul", 1.0)])
    split_all = simulate(plan, device(2), FakeCost())
    gemm_only = simulate(plan, device(2, cpu_split_gemm_only=True), FakeCost())
    assert split_all.end_s == gemm_only.end_s == pytest.approx(2.0)
    assert split_all.core_busy_s == pytest.approx(4.0)
    assert gemm_only.core_busy_s == pytest.approx(3.0)
    assert [s.cpu_s for s in gemm_only.spans] == pytest.approx([1.0, 2.0])


def test_gemm_pool_helpers_poll_after_a_gemm_and_are_woken_otherwise():
    """gemm_pool_spin_s / gemm_pool_wake_s (measured for the host runner's pool): the first multi-threaded GEMM wakes
    the helpers (starts wake_s late); a GEMM within the poll window after the previous one finds them polling (no
    delay, their polling ends); one after a longer gap wakes them again. The polling occupies a core meanwhile."""
    dev = device(2, cpu_split_gemm_only=True, gemm_pool_spin_s=0.5, gemm_pool_wake_s=0.1)
    near = _cpu_ops([("matmul", 1.0), ("elementwise", 0.2), ("matmul", 1.0)])
    far = _cpu_ops([("matmul", 1.0), ("elementwise", 0.7), ("matmul", 1.0)])
    ex = PlanExecutor(near, dev, FakeCost())
    tl = ex.run()
    assert tl.end_s == pytest.approx(0.1 + 1.0 + 0.2 + 1.0) and ex.pool_wakes == 1
    assert tl.core_busy_s == pytest.approx(2.0 + 0.2 + 0.2 + 2.0)    # + the helper polling through the 0.2 s op
    ex = PlanExecutor(far, dev, FakeCost())
    tl = ex.run()
    assert tl.end_s == pytest.approx(0.1 + 1.0 + 0.7 + 0.1 + 1.0) and ex.pool_wakes == 2
    one = _cpu_ops([("matmul", 1.0), ("elementwise", 0.2), ("matmul", 1.0)], threads=1)   # no pool: nothing of it
    assert simulate(one, dev, FakeCost()).end_s == pytest.approx(2.2)


def test_polling_gemm_helpers_take_a_core_share_from_other_threads():
    """While the pool's helper polls (after a GEMM), an unpack thread shares the cores with it and the worker: on 2
    cores, the 0.6 s unpack that starts with the elementwise op runs at 2/3 of a core until the next GEMM."""
    b = PlanBuilder()
    g0 = b.add("g0", "cpu", works=[OpWork("matmul", n=0.1)])                       # type: ignore[arg-type]
    e = b.add("e", "cpu", deps=[g0], order=1, works=[OpWork("elementwise", n=0.3)])   # type: ignore[arg-type]
    b.add("g1", "cpu", deps=[e], order=2, works=[OpWork("matmul", n=0.1)])         # type: ignore[arg-type]
    b.add("u", "unpack", deps=[g0], works=[OpWork("unpack", n=0.6)])               # type: ignore[arg-type]
    plan = Plan("t", "m", "d", 1, 0, b.tasks, cpu_threads=2)
    base = device(2, cpu_split_gemm_only=True)
    spin = replace(base, gemm_pool_spin_s=10.0)
    u = {p: next(s for s in simulate(plan, d, FakeCost()).spans if plan.tasks[s.task].name == "u")
         for p, d in (("quiet", base), ("spin", spin))}
    # quiet: u has a core of its own beside e (0.3 s), then shares with the 2-thread g1 (4/3 + 2/3 cores for
    # 0.15 s: u does 0.1 instead of 0.15), then runs alone: 0.65 s
    assert u["quiet"].end - u["quiet"].start == pytest.approx(0.65)
    # spin: e, the polling helper and u share the 2 cores (2/3 each) for 0.45 s (e's 0.3 s of work; u does 0.3);
    # g1 then ends the polling and shares with u as above (u does 0.1 in 0.15 s), then u alone (0.2): 0.8 s
    assert u["spin"].end - u["spin"].start == pytest.approx(0.8)
    with pytest.raises(ValueError, match="gemm_pool_spin_s"):
        replace(base, gemm_pool_spin_s=-1.0)


def test_shared_rate_cancel_ends_a_job_and_resplits():
    env = Environment()
    r = SharedRate(env, 1.0)
    a = r.use(1.0, cap=1.0)
    b = r.use(1.0, cap=1.0)
    done = {}
    for name, ev in (("a", a), ("b", b)):
        ev.callbacks.append(lambda _e, n=name: done.setdefault(n, env.now))
    env.run(until=0.5)
    assert r.cancel(b) and not r.cancel(b)
    env.run()
    assert done == {"a": pytest.approx(1.25)}               # 0.25 done by 0.5 s at half rate, then 0.75 alone


def test_readahead_follows_each_loaders_stream_past_small_reads_elsewhere():
    """A layer's load also reads its norm vectors, stored with every other layer's at the end of the file: the
    stream still continues with the next layer (the kernel's readahead follows the main extent), and it is credited
    only from when the read call returned, per loader (its own descriptor)."""
    mb = 10**6

    def plan(norms: bool) -> Plan:
        b = PlanBuilder()
        for k in range(2):
            refs = [TensorRef(f"w{k}", k * 10 * mb, 10 * mb)]
            if norms:
                refs.append(TensorRef(f"n{k}", 500 * mb + 4096 * k, 2304))
            deps = [b.add(f"c{k}", "cpu", deps=[b.tasks[-1].id], works=[OpWork("elementwise", n=1.0)])] if k else []
            b.add(f"ld{k}", "load", deps=deps, read_bytes=sum(r.nbytes for r in refs), request_bytes=1 << 20,
                  tensors=refs)                                                      # type: ignore[arg-type]
        return Plan("t", "m", "d", 1, 0, b.tasks)
    dev = device(2, flash_peak_gbps=1.0, flash_reader_gbps=1.0, flash_request_latency_s=0.0,
                 read_ahead_bytes=8 * 10**6)
    plain, with_norms = simulate(plan(False), dev, FakeCost()), simulate(plan(True), dev, FakeCost())
    assert plain.end_s == pytest.approx(0.01 + 1.0 + 0.002)
    assert with_norms.end_s == pytest.approx(0.0100023 + 1.0 + 0.0020023, rel=1e-4)


def test_an_unpack_re_takes_the_interpreter_lock_after_each_kernel_call():
    """An unpack task's work is `calls` kernel calls (one per packed tensor, as the runner makes them), each followed
    by the re-take of the interpreter lock: with another thread holding the lock for 0.5 s, one 0.3 s call waits for
    it once at its end (0.5 + the hand-off's 0.01 s), three 0.1 s calls wait after the first and run the other two
    after the release (0.51 + 0.2)."""
    dev = device(2, interpreter_lock=True, npu_on_cpu_core=True, thread_wake_cpu_s=0.01, cpu_op_python_s=0.5)
    ends = {}
    for calls in (1, 3):
        b = PlanBuilder()
        b.add("u", "unpack", works=[OpWork("unpack", n=0.3, calls=calls)])       # type: ignore[arg-type]
        b.add("held", "npu", works=[OpWork("elementwise", k=0.5)])               # type: ignore[arg-type]
        ex = PlanExecutor(Plan("t", "m", "d", 1, 0, b.tasks), dev, _OverheadCost())
        ends[calls] = ex.run().end_s
        assert ex.waits_by.get("unpack0") == 1                                   # one hand-off either way
    assert ends[1] == pytest.approx(0.51) and ends[3] == pytest.approx(0.71)


def _handoff_plan() -> Plan:
    """One unpacker runs u0 then u1 back to back; the CPU worker's m waits for u0: at u0's end the unpacker wakes
    the CPU worker and keeps computing, while the second core has been idle since the start."""
    b = PlanBuilder()
    u0 = b.add("u0", "unpack", works=[OpWork("unpack", n=1.0)])             # type: ignore[arg-type]
    b.add("u1", "unpack", works=[OpWork("unpack", n=2.0)])                  # type: ignore[arg-type]
    b.add("m", "cpu", [u0], works=[OpWork("matmul", k=1.0, n=0.5)])          # type: ignore[arg-type]
    return Plan("t", "m", "d", 1, 0, b.tasks, unpack_threads=1)


def _ends(plan: Plan, dev) -> dict[str, float]:
    tl = simulate(plan, dev, FakeCost())
    return {plan.tasks[s.task].name: s.end for s in tl.spans} | {"packs": tl.packed_wakes}


def test_a_wake_up_packed_onto_its_wakers_core_preempts_the_waker():
    """thread_wake_pack_*: the woken worker is put on its waker's busy core (the other one idle long enough) and
    runs first; its waker stands still until the woken task ends, or until the next balance tick splits them."""
    plan = _handoff_plan()
    base = _ends(plan, device(2))
    assert base["m"] == pytest.approx(1.5) and base["u1"] == pytest.approx(3.0) and base["packs"] == 0
    packed = _ends(plan, device(2, thread_wake_pack_idle_s=0.5, thread_wake_pack_share=1.0))
    assert packed["m"] == pytest.approx(1.5)            # the woken task runs at once, on the waker's core
    assert packed["u1"] == pytest.approx(3.5)           # its waker lost the woken task's 0.5 s
    assert packed["packs"] == 1
    ticked = _ends(plan, device(2, thread_wake_pack_idle_s=0.5, thread_wake_pack_share=1.0, sched_balance_s=0.4))
    assert ticked["u1"] == pytest.approx(3.2)           # split at the tick at 1.2 s: the waker lost 0.2 s
    short = _ends(plan, device(2, thread_wake_pack_idle_s=1.5, thread_wake_pack_share=1.0))
    assert short["u1"] == pytest.approx(3.0) and short["packs"] == 0    # the idle core idled 1 s < 1.5 s: used
    half = _ends(plan, device(2, thread_wake_pack_idle_s=0.5, thread_wake_pack_share=0.5))
    assert half["packs"] == 0                           # a share of 0.5: the first of two such wake-ups is not


def test_packed_threads_share_their_core_most_recent_first():
    env = Environment()
    cores = Cores(env, 2.0)
    done: dict[str, float] = {}
    for name, sec in (("a", 1.0), ("b", 1.0), ("c", 1.0)):
        cores.run(sec, owner=name).callbacks.append(lambda _e, n=name: done.setdefault(n, env.now))
    cores.pack("b", "a")
    cores.pack("c", "b")                                # a chain: a, b, c on one core, c woken last
    assert cores.idle_for() == pytest.approx(0.0)       # one core idle since now
    env.run(until=0.5)
    assert cores.idle_for() == pytest.approx(0.5)
    env.run()
    assert done == pytest.approx({"c": 1.0, "b": 2.0, "a": 3.0})
    assert cores.busy_core_s() == pytest.approx(3.0)    # one core occupied for 3 s, the other idle
    with pytest.raises(ValueError, match="thread_wake_pack_share"):
        device(2, thread_wake_pack_share=1.5)


def test_two_loaders_at_once_pay_the_measured_cpu_per_byte_factor():
    """read_cpu_multi (measured on the host: two cold readers' CPU per byte / one's) applies to a load while another
    loader reads too, not to a load alone. T = 1 s per GB alone, C = 0.5 s per GB, no overlap: one load 1.5 s; two at
    once share the device (2 s each) and pay C x 1.5 = 0.75 s after it."""
    dev = device(2, flash_peak_gbps=1.0, flash_reader_gbps=1.0, flash_request_latency_s=0.0, read_cpu_gbps=2.0,
                 read_cpu_overlap=0.0)
    multi = replace(dev, read_cpu_multi=1.5)
    assert simulate(_load_plan(1), multi, FakeCost()).end_s == pytest.approx(1.5, rel=1e-6)
    assert simulate(_load_plan(2), dev, FakeCost()).end_s == pytest.approx(2.5, rel=1e-6)
    tl = simulate(_load_plan(2), multi, FakeCost())
    assert tl.end_s == pytest.approx(2.75, rel=1e-6)
    assert [s.cpu_s for s in tl.spans] == pytest.approx([0.75, 0.75])
    with pytest.raises(ValueError, match="read_cpu_multi"):
        replace(dev, read_cpu_multi=0.9)
