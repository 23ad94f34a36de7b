"""Study (docs/research.md §19): the policy's command limited to U_LIMIT N m, below the
plant's 6, everything else the command line's. Run as `grpo-ctrl train`:

    U_LIMIT=3 python benchmarks/study_command_limit.py train --system double_pendulum \\
        --preset pendubot --costs-early 0.1 --horizon 200 --loss-steps 100 --gamma 0.995 \\
        --deploy score --eval-every 2 --seed 0 --iterations 4400 --time-budget 0 \\
        --overlap false --out runs/limit3
"""
import os
import sys

import grpo_ctrl.grpo as G
from grpo_ctrl.policy import GaussianPolicy

LIMIT = float(os.environ["U_LIMIT"])


def make_policy(cfg, spec):
    return GaussianPolicy(spec.nobs, min(LIMIT, spec.u_max), cfg.hidden, cfg.layers,
                          cfg.activation, cfg.log_std_init, cfg.log_std_min, cfg.features,
                          cfg.feature_scale)


G.make_policy = make_policy
from grpo_ctrl.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
