"""conf/device, conf/cluster, conf/planner, conf/trace compose into valid typed objects; bad values name the key."""
from __future__ import annotations

import pytest

from experiments.common import ConfigError, typed
from experiments.multidevice import register
from planner.voltron.devices import ClusterSpec, EdgeDevice, load_cluster
from planner.voltron.policy import PLANNER_NAMES, PlannerConfig
from planner.voltron.registry import POLICIES
from sim.wireless import TraceConfig
from tests.conftest import CONF_DIR

DEVICES = ["legion_y700", "galaxy_s22_ultra", "pixel7", "pixel5", "pixel2xl", "nexus5x"]
AVAILABLE_GB = {"legion_y700": 8.3, "galaxy_s22_ultra": 7.3, "pixel7": 4.7, "pixel5": 4.7, "pixel2xl": 2.3,
                "nexus5x": 1.2}   # Voltron Table 1


@pytest.fixture(autouse=True)
def _schemas():
    register()


@pytest.mark.parametrize("name", DEVICES)
def test_device_profiles(compose, name):
    cfg = compose(overrides=[f"+device={name}"])
    dev = typed(cfg.device, EdgeDevice, "device")
    assert dev.mem_budget_gb == AVAILABLE_GB[name]
    ops = dev.ops_per_s()
    assert ops[1] > ops[0] and ops[1] > ops[2] > 0          # int8 fastest (SDOT / widening MLA), int4 pays unpacking


def test_device_bad_value_names_key(compose):
    cfg = compose(overrides=["+device=pixel5", "device.mem_budget_gb=9.0"])
    with pytest.raises(ConfigError, match="mem_budget_gb"):
        typed(cfg.device, EdgeDevice, "device")


@pytest.mark.parametrize("name,devices", [("car", ["galaxy_s22_ultra", "pixel7", "pixel5"]),
                                          ("office", ["galaxy_s22_ultra", "legion_y700", "pixel2xl"]),
                                          ("home", ["galaxy_s22_ultra", "pixel2xl", "nexus5x"])])
def test_clusters(compose, name, devices):
    spec = typed(compose(overrides=[f"+cluster={name}"]).cluster, ClusterSpec, "cluster")
    assert spec.devices == devices                           # Voltron Table 2 clusters, main device first
    assert load_cluster(name).n == 3


@pytest.mark.parametrize("name", list(POLICIES))
def test_planner_configs(compose, name):
    p = typed(compose(overrides=[f"+planner={name}"]).planner, PlannerConfig, "planner")
    assert p.name == name and p.qos_ttft_s == 10.0 and p.qos_tpot_s == 0.4


def test_one_registry_of_policy_names():
    """conf/planner/*.yaml, the names PlannerConfig accepts, the registry and the policy classes agree (the registry
    is the only map from names to classes)."""
    assert sorted(p.stem for p in (CONF_DIR / "planner").glob("*.yaml")) == sorted(POLICIES) == sorted(PLANNER_NAMES)
    assert all(cls.name == name for name, cls in POLICIES.items())


def test_planner_bad_name(compose):
    cfg = compose(overrides=["+planner=voltron", "planner.name=magic"])
    with pytest.raises(ConfigError, match="planner.name"):
        typed(cfg.planner, PlannerConfig, "planner")


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF_DIR / "trace").glob("*.yaml")))
def test_trace_configs(compose, name):
    from sim.wireless import RssiTrace

    t = typed(compose(overrides=[f"+trace={name}"]).trace, TraceConfig, "trace")
    tr = RssiTrace.load(t)
    assert set(tr.times) == {"link1", "link2"}
