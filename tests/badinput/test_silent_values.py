"""Bad input — bad values are never accepted silently: NaN / inf in every range check, strict booleans,
and trace CSVs with a duplicate column, extra fields or binary content (the error names the file and row)."""
from __future__ import annotations

import pytest

from experiments.common import finite, strict_bool
from sim.wireless import RssiTrace, TraceConfig
from tests.badinput.helpers import reject


@pytest.mark.parametrize("app, arg, key", [("multidevice", "jitter=nan", "jitter"),
                                           ("multidevice", "jitter=inf", "jitter"),
                                           ("quantize", "quant.beta=nan", "quant.beta"),
                                           ("quantize", "quant.smoothquant_alpha=nan", "quant.smoothquant_alpha"),
                                           ("coldstart", "preloaded_gb=nan", "preloaded_gb"),
                                           ("coldstart", "bits=nan", "bits"),
                                           ("coldstart", "model.rope_base=nan", "model.rope_base"),
                                           ("multidevice", "rssi.mac_efficiency=nan", "rssi.mac_efficiency"),
                                           ("multidevice", "workload.think_s=-inf", "workload.think_s"),
                                           ("demo", "multidevice.think_s=nan", "multidevice.think_s")])
def test_nan_and_inf_are_rejected(capsys, app, arg, key):
    reject(capsys, app, [arg], key)


def test_booleans_are_strict(capsys):
    reject(capsys, "multidevice", ["timeline=abc"], "timeline")
    reject(capsys, "coldstart", ["write_trace=abc"], "write_trace")
    for v in (True, 1, "true", "TRUE", "Yes", "on", " 1 "):
        assert strict_bool(v, "k") is True
    for v in (False, 0, "false", "False", "NO", "off", "0"):
        assert strict_bool(v, "k") is False
    for v in ("abc", 2, -1, 1.0, "", None, "y"):
        with pytest.raises(ValueError, match="k: must be true or false"):
            strict_bool(v, "k")
    with pytest.raises(ValueError, match="finite"):
        finite(float("nan"), "k")


def _trace(tmp_path, body: bytes):
    p = tmp_path / "t.csv"
    p.write_bytes(body)
    return TraceConfig(name="t", csv=str(p)), p


@pytest.mark.parametrize("body, where", [
    (b"time_s,link,dbm,dbm\n0,link1,-40,-90\n",
     ":1: header must be time_s,link,dbm, each once (duplicate column 'dbm')"),
    (b"time_s,link,dbm\n0,link1,-40\n1,link1,-41,7\n", ":3: 4 fields, the header has 3"),
    (b"time_s,link,dbm\n0,link1,-40,\n", ":2: 4 fields"),
    (b"time_s,link,dbm\n0,link1,nan\n", ":2: column dbm must be in [-120, 0]"),
    (b"time_s,link,dbm\nx,link1,-40\n", ":2: column time_s must be a number"),
    (b"\x89PNG\r\n\x1a\n\x00\x00binary", ": binary file"),
    (b"time_s,link,dbm\n0,link\xff,-40\n", ": not UTF-8 text"),
])
def test_malformed_trace_names_file_and_row(tmp_path, body, where):
    cfg, p = _trace(tmp_path, body)
    with pytest.raises(ValueError) as ei:
        RssiTrace.load(cfg)
    assert f"{p}{where}" in str(ei.value) and "\n" not in str(ei.value)


def test_malformed_trace_through_the_app(capsys, tmp_path):
    _, p = _trace(tmp_path, b"time_s,link,dbm,dbm\n0,link1,-40,-90\n")
    err = reject(capsys, "multidevice", [f"trace.csv={p}"], "trace.csv")
    assert str(p) in err


def test_good_trace_loads(tmp_path):
    cfg, _ = _trace(tmp_path, b"link,time_s,dbm\nlink1,0,-40\nlink1,1.5,-41\n\n")
    tr = RssiTrace.load(cfg)
    assert list(tr.times["link1"]) == [0.0, 1.5]
