"""Every numeric setting of every app and config group is finite and bounded, checked before any work: NaN / inf /
a magnitude no setting has (1e300) anywhere in the composed config is rejected naming the key (quant.bounds, applied
by the pre-check to every leaf); the emulated cluster's `live.*` settings have their own ranges (a NaN trace speed
ran 87 s and reported 0 disconnects; max_retries=-1 ended in a traceback)."""
from __future__ import annotations

import importlib
import math

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments.common import CONF_DIR
from quant.bounds import ConfigError, check_numbers, finite, int_in
from tests.badinput.helpers import accept, reject

APPS = ["quantize", "coldstart", "multidevice", "calibrate", "validate", "demo", "validate_cluster",
        "calibrate_cluster"]
NULL_NUMBERS = {"calibrate": ["rounds"]}        # numeric keys whose default is null


def numeric_keys(app: str) -> list[tuple[str, object]]:
    """(dotted key, value) of every number in the app's composed config (list items excluded: set as a whole)."""
    importlib.import_module(f"experiments.{app}")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name=app), resolve=True)
    out = []

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else k)
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            out.append((prefix, node))

    walk(cfg, "")
    return out + [(k, None) for k in NULL_NUMBERS.get(app, [])]


@pytest.mark.parametrize("arg, key", [("live.trace_speed=nan", "live.trace_speed"),
                                      ("live.trace_start_s=inf", "live.trace_start_s"),
                                      ("live.think_s=nan", "live.think_s"),
                                      ("live.max_retries=1000000000", "live.max_retries"),
                                      ("live.max_retries=-1", "live.max_retries"),
                                      ("live.trace_speed=0", "live.trace_speed"),
                                      ("live.link_poll_s=nan", "live.link_poll_s"),
                                      ("cluster.emulation.max_cores=nan", "cluster.emulation.max_cores"),
                                      ("rssi.disconnect_dbm=-inf", "rssi.disconnect_dbm")])
def test_cluster_settings_are_finite_and_bounded(capsys, arg, key):
    reject(capsys, "validate_cluster", ["turns=1", arg], key)


def test_good_cluster_settings_pass(capsys):
    accept(capsys, "validate_cluster", ["turns=1", "live.trace_speed=10", "live.max_retries=5"])


def test_nan_fails_every_comparison_of_the_rule():
    for v in (math.nan, math.inf, -math.inf):
        with pytest.raises(ConfigError, match="k: must be a finite number"):
            finite(v, "k", 0.0, 1.0)
        with pytest.raises(ConfigError):
            finite(v, "k")
    with pytest.raises(ConfigError, match="k: must be an integer"):
        int_in(math.nan, "k", 0, 10)
    with pytest.raises(ConfigError, match=r"a\.b\[1\]: must be a finite number"):
        check_numbers({"a": {"b": [1.0, math.nan]}})
    with pytest.raises(ConfigError, match="a: must be <= 1e"):
        check_numbers({"a": 10 ** 18})
    check_numbers({"a": [1, 2.5, True, "x", None]})


def test_one_numeric_key_per_app_fast(capsys):
    for app in APPS:
        key, _ = numeric_keys(app)[0]
        reject(capsys, app, [f"{key}=nan"], key)


@pytest.mark.slow
@pytest.mark.parametrize("app", APPS)
def test_every_numeric_key_of_every_app(capsys, app):
    """The audit: NaN, inf and 1e300 in each numeric key of each app (several hundred pre-checks)."""
    keys = numeric_keys(app)
    assert keys
    for key, _ in keys:
        for bad in ("nan", "-inf", "1e300"):
            reject(capsys, app, [f"{key}={bad}"], key)
