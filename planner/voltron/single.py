"""Baseline: single-device execution (paper §5.1.3, footnote 6): the whole model on the highest-performing device of
the cluster (highest predicted speed), uniform precision (the highest that fits). The "largest model that fits" choice
is made across models by the report (`sim/multidevice/report.py`)."""
from __future__ import annotations

import numpy as np

from planner.voltron.options import OptionTable, PhaseEnv
from planner.voltron.static import StaticPolicy


class SinglePolicy(StaticPolicy):
    name = "single"

    def layout(self, env: PhaseEnv, opt: OptionTable, precision: np.ndarray) -> np.ndarray:
        tb = self.ctx.table
        speed = self.speeds(opt, int(precision[0]), env.alive)
        d = int(np.argmax(speed))
        shards = np.zeros((tb.n, self.hp.D), dtype=np.int64)
        shards[:, d] = tb.shards[tb.type_of]
        return shards
