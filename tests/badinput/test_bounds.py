"""Bad input — upper bounds: every size key has a documented maximum checked before any work, and a modelled
time / memory estimate is checked against the machine (an error when it cannot fit, a warning when merely long)."""
from __future__ import annotations

import pytest

from experiments import common
from experiments.common import SIZE_LIMITS, ConfigError, Estimate, check_resources
from tests.badinput.helpers import accept, reject


def test_documented_maxima(capsys):
    reject(capsys, "coldstart", ["prompt_tokens=1000000"], "prompt_tokens")
    reject(capsys, "multidevice", ["turns=100000000"], "turns")
    reject(capsys, "multidevice", ["workload.max_out=10000000"], "workload.max_out")
    reject(capsys, "quantize", ["quant.eval_tokens=100000"], "quant.eval_tokens")
    reject(capsys, "quantize", ["quant.alpha_steps=100000"], "quant.alpha_steps")
    reject(capsys, "demo", ["multidevice.turns=5000"], "multidevice.turns")
    assert SIZE_LIMITS["turns"] == 1000 and SIZE_LIMITS["prompt_tokens"] == 32768


def test_long_run_warns_with_the_estimate(capsys):
    err = accept(capsys, "multidevice", ["turns=1000"])
    assert err.startswith("warning: turns: about ") and " s and " in err and "GB" in err and "modelled" in err


def test_short_run_says_nothing(capsys):
    assert accept(capsys, "multidevice", ["turns=2"]) == ""


def test_memory_estimate_is_checked_against_the_machine(monkeypatch, capsys):
    monkeypatch.setattr(common, "available_memory", lambda: 100 << 20)          # a 100 MB machine
    reject(capsys, "coldstart", ["prompt_tokens=30000"], "prompt_tokens")
    with pytest.raises(ConfigError, match="only 0.1 GB available"):
        check_resources([Estimate(1.0, 2e8, "turns")])


def test_parallel_jobs_multiply_memory(monkeypatch):
    monkeypatch.setattr(common, "available_memory", lambda: int(3e8))
    check_resources([Estimate(1.0, 2e8, "prompt_tokens")], parallel=1)
    with pytest.raises(ConfigError, match="2 jobs at once"):
        check_resources([Estimate(1.0, 2e8, "prompt_tokens")], parallel=2)


def test_available_memory_reads_the_machine():
    assert common.available_memory() > 0
