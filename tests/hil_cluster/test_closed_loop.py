"""The cluster conversation closes Voltron's QoS loop with measured steps (docs/cluster.md "Closed loop on the
cluster"): every step's measured compute per device (the calls' spans) goes to the same `Policy.observe` the simulator
calls, and the corrections it produces are logged in the step's row. Three in-process ShardWorkers of SmolLM2-135M, a
fixed strong link, no namespaces."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hil.cluster.conversation import LiveConfig, LiveConversation, Turn
from hil.cluster.shard_exec import ShardWorker
from planner.voltron.policy import PlannerConfig
from planner.voltron.registry import build_context, make_policy
from quant.gguf_model import encode, gguf_path
from tests.hil_cluster import plans as P


class _Client:                       # what the link driver calls on an RPC client when there is no emulated network
    def set_latency(self, s: float) -> None:
        self.latency_s = s

    def set_link_down(self, down: bool) -> None:
        self.down = down


@pytest.fixture(scope="module")
def run():
    spec = P.spec()
    cl = P.cluster()
    ctx, _ = build_context(spec, cl, PlannerConfig(name="voltron", profile_points=48))
    policy = make_policy(ctx)
    seen = []
    observe = policy.observe

    def spy(plan, n_tokens, kv_len, links, step_s, busy_s, link_s):
        seen.append(SimpleNamespace(plan=plan, n=n_tokens, kv=kv_len, links=links, step_s=step_s,
                                    busy=np.array(busy_s), link=np.array(link_s),
                                    log_comp=policy.fb.ph[0 if plan.phase == "prefill" else 1].log_comp.copy()))
        observe(plan, n_tokens, kv_len, links, step_s, busy_s, link_s)

    policy.observe = spy
    path = str(gguf_path(spec))
    handles = [ShardWorker(path, spec, d, 1e9) for d in range(3)]
    links = P.links()
    prompt = encode(spec, "The Eiffel Tower is in Paris, the capital of France.")[:8]
    conv = LiveConversation(policy, ctx, handles, [_Client() for _ in handles], None, lambda t: links,
                            [Turn(np.asarray(prompt), 5)], LiveConfig())
    res = conv.run()
    conv.coord.close()
    return conv, res, seen, policy


def test_every_step_is_observed_with_its_measured_compute(run):
    conv, res, seen, _ = run
    rows = res["rows"]
    assert len(rows) == 5 and len(seen) == 5
    for r, ob in zip(rows, seen):
        used = np.flatnonzero((ob.plan.shards > 0).any(axis=0))
        assert (ob.busy[used] > 0).all() and ob.busy[0] > 0               # the main device runs embed + head
        assert ob.link.tolist() == [0.0, 0.0, 0.0]                         # in-process workers: no messages
        assert 0 < ob.step_s <= r["measured_s"] + 1e-9
        assert (ob.busy <= ob.step_s * 1.05).all()                         # a device's calls lie inside its step
        for k in range(3):
            assert r[f"busy_s_d{k}"] == pytest.approx(ob.busy[k])


def test_corrections_follow_the_measurements_and_are_logged(run):
    """The first observation of a phase sets each used device's correction to measured / estimated compute (running
    mean, n = 1; quantized to `quantum`); the row logs what the planner uses from then on."""
    conv, res, seen, policy = run
    rows, q = res["rows"], policy.fb.cfg.quantum
    for i, phase in ((0, "prefill"), (1, "decode")):
        ob = seen[i]
        t_dev, head, _, _ = policy.hp.raw_parts(ob.plan, ob.n, ob.kv, ob.links)
        est = t_dev.sum(axis=0)
        est[0] += head
        assert np.all(ob.log_comp == 0)                                    # nothing learned before it
        for d in np.flatnonzero((ob.busy > 0) & (est > 0)):
            want = np.exp(np.rint(np.clip(np.log(ob.busy[d] / est[d]), -np.log(100), np.log(100)) / q) * q)
            assert rows[i][f"corr_{phase}_d{d}"] == pytest.approx(want, rel=1e-9)
    # the host's in-process workers are not the Office cluster's phones: the loop moved the model
    assert any(abs(np.log(rows[-1][f"corr_decode_d{d}"])) > 0.05 for d in range(3))
    for r in rows:
        assert {"margin_prefill", "margin_decode", "target_tpot_s", "corr_link1", "corr_link2"} <= set(r)
        assert 0 < r["target_tpot_s"] <= policy.ctx.cfg.qos_tpot_s
