"""Policy registry and run context construction: planner name → policy class; model + cluster → fitted context.

The policy is selected by the Hydra `planner` group (`conf/planner/<name>.yaml`, field `name`, checked against
`policy.PLANNER_NAMES`); this table is the only place names map to classes, keyed by each class's `name`.
"""
from __future__ import annotations

from planner.voltron.controller import VoltronPolicy
from planner.voltron.devices import Cluster
from planner.voltron.importance import importance_for
from planner.voltron.latency import LatencyModel, Profile, accuracy, fit_for, split
from planner.voltron.layers import layer_table
from planner.voltron.mp import MPPolicy
from planner.voltron.policy import PlannerConfig, Policy, PolicyContext
from planner.voltron.single import SinglePolicy
from planner.voltron.tp import TPPolicy
from quant.arch import ModelSpec

POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (VoltronPolicy, SinglePolicy, MPPolicy, TPPolicy)}


def build_context(spec: ModelSpec, cluster: Cluster, cfg: PlannerConfig, seed: int = 0,
                  profiler=None) -> tuple[PolicyContext, dict]:
    """Sublayer table, latency regression fitted on profiling runs (+ its held-out accuracy), importance.
    `profiler(table)` returns the timer of the devices to profile (`latency.sample_profiles`): the simulated
    cluster in a simulation run, measured runs on hardware; None = the spec roofline (planner alone)."""
    table = layer_table(spec, cfg.ffn_shards)
    latency, acc = fit_for(cluster.devices, table, points=cfg.profile_points, noise=cfg.profile_noise, seed=seed,
                           timer=None if profiler is None else profiler(table), by_type=cfg.latency_by_type)
    return PolicyContext(table=table, cluster=cluster, latency=latency, importance=importance_for(spec), cfg=cfg), acc


def context_from_profile(spec: ModelSpec, cluster: Cluster, cfg: PlannerConfig, prof: Profile,
                         seed: int = 0) -> tuple[PolicyContext, dict]:
    """As `build_context`, with the latency regression fitted on given (measured) profile points: 80 % to fit, the
    held-out 20 % for its accuracy (the paper's method on a real cluster)."""
    table = layer_table(spec, cfg.ffn_shards)
    train, test = split(prof, seed=seed)
    latency = LatencyModel.fit(train, [d.name for d in cluster.devices], cfg.latency_by_type)
    return (PolicyContext(table=table, cluster=cluster, latency=latency, importance=importance_for(spec), cfg=cfg),
            accuracy(latency, test))


def make_policy(ctx: PolicyContext) -> Policy:
    return POLICIES[ctx.cfg.name](ctx)
