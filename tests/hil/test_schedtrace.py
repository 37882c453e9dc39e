"""hil.diagnostics.schedtrace: the replay of scheduler events into where each core's time went, on a hand-written
trace in the kernel's text format (the categories of docs/hil.md "Scheduler trace"), and the tracefs guard."""
from __future__ import annotations

import pytest

from hil.diagnostics import schedtrace
from hil.diagnostics.schedtrace import breakdown, parse

# cpu0: thread 100 runs, wakes 101 onto its own (busy) cpu while cpu1 idles; 101 waits until 100 blocks at 4 ms.
# cpu1: idle; at 6 ms 101 wakes 102 onto cpu1, whose switch-in is not traced (as this kernel sometimes does): its
# first own event at 7 ms shows it runs, taken from its wake-up at 6.1 ms.
TRACE = """\
# tracer: nop
          python-100     [000] d..2.     0.000000: sched_waking: comm=python pid=101 prio=120 target_cpu=000
          python-100     [000] d..2.     0.000001: sched_wakeup: comm=python pid=101 prio=120 target_cpu=000
          python-100     [000] d..2.     0.004000: sched_switch: prev_comm=python prev_pid=100 prev_prio=120 \
prev_state=S ==> next_comm=python next_pid=101 next_prio=120
          python-101     [000] d..2.     0.006000: sched_waking: comm=python pid=102 prio=120 target_cpu=001
          <idle>-0       [001] dNh2.     0.006100: sched_wakeup: comm=python pid=102 prio=120 target_cpu=001
          python-102     [001] d..2.     0.007000: sched_waking: comm=kworker/1:1 pid=41 prio=120 target_cpu=001
"""
ROLES = {100: "cpu0", 101: "npu0", 102: "load0"}


def test_core_time_splits_into_running_queued_waking_and_no_work():
    b = breakdown(parse(TRACE), 0.0, 0.010, ROLES, 2)
    assert b["running_s"] == pytest.approx(0.010 + 0.0039)
    assert b["queued_s"] == pytest.approx(0.004)          # cpu1 idle while 101 waited in cpu0's queue
    assert b["no_work_s"] == pytest.approx(0.002)         # cpu1 idle, nothing of the run runnable
    assert b["waking_s"] == pytest.approx(0.0001)         # cpu1 idle until the woken 102 started
    assert sum(b[f"{k}_pct"] for k in schedtrace.CATEGORIES) == pytest.approx(100.0)
    assert b["running_by_thread_s"] == pytest.approx({"cpu0": 0.004, "npu0": 0.006, "load0": 0.0039})
    assert b["wakes"] == 2 and b["wakes_other_core_idle"] == 2 and b["packed_share"] == pytest.approx(0.5)
    assert b["wake_delay_mean_s"] == pytest.approx((0.004 + 0.0001) / 2)      # waking -> running of 101 and 102
    assert b["queued_by_s"] == pytest.approx({"npu0 woken": 0.004})


def test_queued_time_names_the_thread_and_who_preempted_it():
    # 101 is woken onto cpu0 and preempts its waker 100 at once (wake-up preemption); cpu1 idles while 100 waits
    # in cpu0's queue until 101 blocks at 3 ms; from 5 ms to 6 ms 100 waits again, preempted by another process.
    text = """\
          python-100     [000] d..2.     0.000000: sched_waking: comm=python pid=101 prio=120 target_cpu=000
          python-100     [000] d..2.     0.000001: sched_wakeup: comm=python pid=101 prio=120 target_cpu=000
          python-100     [000] d..2.     0.000002: sched_switch: prev_comm=python prev_pid=100 prev_prio=120 \
prev_state=R+ ==> next_comm=python next_pid=101 next_prio=120
          python-101     [000] d..2.     0.003000: sched_switch: prev_comm=python prev_pid=101 prev_prio=120 \
prev_state=S ==> next_comm=python next_pid=100 next_prio=120
          python-100     [000] d..2.     0.005000: sched_switch: prev_comm=python prev_pid=100 prev_prio=120 \
prev_state=R ==> next_comm=kworker/0:1 next_pid=41 next_prio=120
     kworker/0:1-41      [000] d..2.     0.006000: sched_switch: prev_comm=kworker/0:1 prev_pid=41 prev_prio=120 \
prev_state=S ==> next_comm=python next_pid=100 next_prio=120
"""
    b = breakdown(parse(text), 0.0, 0.008, ROLES, 2)
    assert b["queued_by_s"] == pytest.approx({"cpu0 preempted by npu0": 0.003 - 0.000002,
                                              "cpu0 preempted by another process": 0.001,
                                              "npu0 woken": 0.000002})
    assert sum(b["queued_by_s"].values()) == pytest.approx(b["queued_s"])


def test_other_processes_and_the_window_bound_the_count():
    b = breakdown(parse(TRACE), 0.002, 0.004, ROLES, 2)   # [2 ms, 6 ms]: 101 still queued until 4 ms
    assert b["queued_s"] == pytest.approx(0.002) and b["no_work_s"] == pytest.approx(0.002)
    b = breakdown(parse(TRACE), 0.0, 0.010, {101: "npu0", 102: "load0"}, 2)   # 100 is not the run's thread
    assert b["other_s"] == pytest.approx(0.004) and b["running_s"] == pytest.approx(0.006 + 0.0039)


def test_native_helpers_count_as_the_runs_threads():
    text = TRACE.replace("python-100 ", "ef-gemm-100").replace("prev_comm=python prev_pid=100",
                                                                "prev_comm=ef-gemm prev_pid=100")
    b = breakdown(parse(text), 0.0, 0.010, {101: "npu0", 102: "load0"}, 2)
    assert b["running_by_thread_s"]["gemm-helper"] == pytest.approx(0.004)


def test_tracefs_in_use_is_left_alone(tmp_path, monkeypatch):
    d = tmp_path / "tracing"
    for e in schedtrace.EVENTS:
        (d / "events" / e).mkdir(parents=True)
        (d / "events" / e / "enable").write_text("0\n")
    for name, v in {"trace": "", "tracing_on": "0", "current_tracer": "function", "trace_clock": "[local] mono",
                    "buffer_size_kb": "1408"}.items():
        (d / name).write_text(v + "\n")
    monkeypatch.setattr(schedtrace, "TRACEFS", (str(d),))
    assert schedtrace.available() is None
    with pytest.raises(RuntimeError, match="in use"):
        with schedtrace.SchedTrace():
            pass
    assert (d / "current_tracer").read_text().strip() == "function"
    assert all((d / "events" / e / "enable").read_text().strip() == "0" for e in schedtrace.EVENTS)


def test_trace_restores_the_settings_it_changed(tmp_path, monkeypatch):
    d = tmp_path / "tracing"
    for e in schedtrace.EVENTS:
        (d / "events" / e).mkdir(parents=True)
        (d / "events" / e / "enable").write_text("0\n")
    for name, v in {"trace": TRACE, "tracing_on": "1", "current_tracer": "nop", "trace_clock": "[local] mono",
                    "buffer_size_kb": "1408"}.items():
        (d / name).write_text(v + "\n")
    monkeypatch.setattr(schedtrace, "TRACEFS", (str(d),))
    with pytest.raises(ZeroDivisionError):
        with schedtrace.SchedTrace() as tr:
            assert (d / "trace_clock").read_text() == "mono"
            assert all((d / "events" / e / "enable").read_text() == "1" for e in schedtrace.EVENTS)
            1 / 0
    assert tr.text == ""                                    # the buffer was cleared on entry
    assert (d / "trace_clock").read_text() == "local" and (d / "buffer_size_kb").read_text() == "1408"
    assert (d / "tracing_on").read_text() == "1"
    assert all((d / "events" / e / "enable").read_text() == "0" for e in schedtrace.EVENTS)


def test_no_tracefs_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr(schedtrace, "TRACEFS", (str(tmp_path / "none"),))
    assert "no tracefs" in schedtrace.available()
    with pytest.raises(RuntimeError, match="no tracefs"):
        schedtrace.SchedTrace()
