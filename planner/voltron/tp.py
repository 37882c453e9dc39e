"""Baseline: heterogeneity-aware tensor parallelism (paper §5.1.3, [27, 55]) and the naive equal split (paper Fig. 4).

Every sublayer is sharded over all live devices. `balance=hetero`: each device's share of every layer is proportional
to its predicted speed, capped by its memory (excess shares go to the others by speed); `balance=equal`: the same
number of shards on every device (OOM if they do not fit)."""
from __future__ import annotations

import numpy as np

from planner.voltron.options import OptionTable, PhaseEnv
from planner.voltron.static import StaticPolicy, proportional


class TPPolicy(StaticPolicy):
    name = "tp"
    uses_balance = True

    def layout(self, env: PhaseEnv, opt: OptionTable, precision: np.ndarray) -> np.ndarray:
        tb, D = self.ctx.table, self.hp.D
        p = int(precision[0])
        alive = env.alive
        S = tb.shards[tb.type_of]                                    # (N,)
        tpos = self.hp.tpos[tb.type_of]
        total = (opt.unit[tpos, p] * S).sum()                        # bytes of all sublayers
        if self.ctx.cfg.balance == "equal":
            w = alive.astype(float)
        else:
            w = self.speeds(opt, p, alive)
            room = np.maximum(env.budgets - opt.reserve, 0) / total  # max fraction of the model each device holds
            frac = w / w.sum()
            for _ in range(D):                                       # cap by memory, give the excess to the others
                over = frac > room
                if not over.any():
                    break
                excess = (frac[over] - room[over]).sum()
                frac[over] = room[over]
                free = ~over & alive
                if not free.any():
                    break
                frac[free] += excess * w[free] / w[free].sum()
            w = frac
        shards = np.zeros((tb.n, D), dtype=np.int64)
        for t in np.unique(tb.type_of):
            rows = tb.type_of == t
            shards[rows] = proportional(int(tb.shards[t]), w)
        return shards
