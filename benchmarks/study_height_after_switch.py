"""Study (docs/research.md §19): the height shaping w_height at H_LATE of the plant's once the
costs of effort are on (a cost scale of 1 or more: after costs_from, or throughout a run whose
costs_early is at least 1, as a whole-episode fine-tuning's). Run as `grpo-ctrl train`:

    H_LATE=0.3 python benchmarks/study_height_after_switch.py train --system double_pendulum \\
        --preset pendubot --costs-early 0.1 --horizon 200 --loss-steps 100 --gamma 0.995 \\
        --deploy score --eval-every 2 --seed 0 --iterations 4400 --time-budget 0 \\
        --overlap false --out runs/height03
"""
import os
import sys

import grpo_ctrl.sim as S

H_LATE = float(os.environ["H_LATE"])
_scale_costs = S.BatchSim.scale_costs


def scale_costs(self, scale):
    _scale_costs(self, scale)
    if not hasattr(self, "_w_height_made"):
        self._w_height_made = self._model.w_height
    self._model.w_height = self._w_height_made * (H_LATE if scale >= 1.0 else 1.0)


S.BatchSim.scale_costs = scale_costs
from grpo_ctrl.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
