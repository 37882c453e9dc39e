"""Baseline: heterogeneity-aware model parallelism (paper §5.1.3, [27, 55]) and the naive equal split (paper Fig. 4).

Contiguous blocks of layers per device, in cluster order starting at the main device. `balance=hetero`: the number of
blocks per device is proportional to its predicted speed and capped by how many blocks its memory holds (excess goes to
the others by speed); `balance=equal`: L/D blocks each, regardless of speed or memory (OOM if they do not fit)."""
from __future__ import annotations

import numpy as np

from planner.voltron.options import OptionTable, PhaseEnv
from planner.voltron.static import StaticPolicy, proportional


class MPPolicy(StaticPolicy):
    name = "mp"
    uses_balance = True

    def layout(self, env: PhaseEnv, opt: OptionTable, precision: np.ndarray) -> np.ndarray:
        tb, D = self.ctx.table, self.hp.D
        L = tb.spec.n_layers
        p = int(precision[0])
        tpos = self.hp.tpos[tb.type_of]
        block_bytes = (opt.unit[tpos, p] * tb.shards[tb.type_of]).reshape(L, 2).sum(axis=1).max()
        alive = env.alive
        if self.ctx.cfg.balance == "equal":
            blocks = proportional(L, alive.astype(float))
        else:
            caps = np.floor(np.maximum(env.budgets - opt.reserve, 0) / block_bytes).astype(np.int64)
            blocks = proportional(L, self.speeds(opt, p, alive), np.where(alive, caps, 0))
            if blocks.sum() < L:                                     # does not fit: overflow onto the fastest
                blocks[int(np.argmax(self.speeds(opt, p, alive)))] += L - blocks.sum()
        owner = np.repeat(np.arange(D), blocks)                      # (L,) device per block
        shards = np.zeros((tb.n, D), dtype=np.int64)
        shards[np.arange(tb.n), np.repeat(owner, 2)] = tb.shards[tb.type_of]
        return shards
