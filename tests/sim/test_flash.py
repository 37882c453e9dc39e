"""Flash processor sharing: per-reader caps, max-min fair sharing, re-scheduling when readers join, integer bytes."""
from dataclasses import replace

import pytest

from sim.engine import Environment
from sim.flash import Flash
from tests.sim.helpers import xiaomi

MB = 1_000_000


def _dev(peak=2.0, reader=1.5, lat=0.0):
    return replace(xiaomi(), flash_peak_gbps=peak, flash_reader_gbps=reader, flash_request_latency_s=lat)


def _run(dev, reads):
    """reads: (start s, nbytes, request bytes) -> finish times."""
    env = Environment()
    fl = Flash(env, dev)
    done = {}

    def proc(i, t0, n, req):
        yield env.timeout(t0)
        yield fl.read(n, req)
        done[i] = env.now

    for i, r in enumerate(reads):
        env.process(proc(i, *r))
    env.run()
    return done, fl


def test_single_reader_is_capped_by_the_reader_rate():
    done, fl = _run(_dev(), [(0, 300 * MB, 8 * MB)])
    assert done[0] == pytest.approx(300 * MB / 1.5e9)
    assert fl.bytes_read == 300 * MB and isinstance(fl.bytes_read, int)


def test_two_readers_share_the_peak():
    done, _ = _run(_dev(), [(0, 200 * MB, 8 * MB), (0, 200 * MB, 8 * MB)])
    assert done[0] == pytest.approx(400 * MB / 2.0e9) and done[1] == pytest.approx(done[0])


def test_reader_joining_midway_slows_the_first():
    # A alone at 1.5 GB/s for 0.1 s (150 MB), then both at 1.0 GB/s: A's last 150 MB take 0.15 s -> 0.25 s;
    # B has 150 MB left at 0.25 s and runs alone at 1.5 GB/s -> 0.35 s.
    done, _ = _run(_dev(), [(0, 300 * MB, 8 * MB), (0.1, 300 * MB, 8 * MB)])
    assert done[0] == pytest.approx(0.25)
    assert done[1] == pytest.approx(0.35)


def test_small_requests_pay_latency():
    dev = _dev(lat=100e-6)
    done, _ = _run(dev, [(0, 64 * MB, 131072)])
    rate = 131072 / (100e-6 + 131072 / 1.5e9)
    assert done[0] == pytest.approx(64 * MB / rate)
    assert done[0] > 64 * MB / 1.5e9 * 1.5


def test_capped_reader_leaves_bandwidth_to_others():
    # reader 0 with tiny requests is capped far below the fair share; reader 1 gets the rest (max-min fairness)
    dev = _dev(lat=1e-3)
    cap0 = dev.reader_rate(4096)
    done, _ = _run(dev, [(0, 1 * MB, 4096), (0, 100 * MB, 8 * MB)])
    assert done[1] == pytest.approx(100 * MB / dev.reader_rate(8 * MB), rel=1e-6)   # only its own cap binds it
    assert done[0] == pytest.approx(1 * MB / cap0, rel=1e-6)


def test_two_streams_share_the_multi_reader_rate_one_keeps_the_peak():
    dev = replace(_dev(peak=2.0, reader=2.0), flash_multi_gbps=1.0)
    done, _ = _run(dev, [(0, 200 * MB, 8 * MB)])
    assert done[0] == pytest.approx(200 * MB / 2.0e9)                       # one stream: the full rate
    done, _ = _run(dev, [(0, 100 * MB, 8 * MB), (0, 100 * MB, 8 * MB)])
    assert done[0] == pytest.approx(200 * MB / 1.0e9)                       # two: 1 GB/s together
    done, _ = _run(replace(dev, flash_multi_gbps=0.0), [(0, 100 * MB, 8 * MB), (0, 100 * MB, 8 * MB)])
    assert done[0] == pytest.approx(200 * MB / 2.0e9)                       # 0: not modelled
