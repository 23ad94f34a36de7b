"""Study (research §19, the pendubot): a terminal value at the branch's end in place of the
height shaping. usage: python benchmarks/study_terminal_value.py W_HEIGHT C KV -- train ARGS
(e.g. 0 1000 0 -- train --system double_pendulum --preset pendubot --costs-early 0.1
--seed 0 --iterations 4400 --time-budget 0 --overlap false --out RUN).
Phi(s) = -C ((1 - h)/2 + KV (v1^2 + v2^2)) added as gamma^H Phi(s_H) to each alive branch's
return (in GRPO the start's Phi(s_0) cancels within a group: potential shaping is a terminal
value)."""
import sys
from grpo_ctrl import grpo
from grpo_ctrl.sim import BatchSim
from grpo_ctrl.cli import main

w_height, C, kv = (float(a) for a in sys.argv[1:4])
args = sys.argv[sys.argv.index("--") + 1:]
L1, L2 = 0.2, 0.3


def patched_sim(*a, **k):
    return BatchSim(*a, **{**k, "w_height": w_height})


grpo.BatchSim = patched_sim
orig_init = grpo.GroupRollout.__init__


def init(self, cfg, *a, **k):
    orig_init(self, cfg, *a, **k)
    roll = self._roll
    gamma = cfg.gamma

    def roll_tv(policy, sim, spread):
        raw, z, mu, rewards, alive = roll(policy, sim, spread)
        if C > 0:
            o = sim.observe()
            c1, s1, c2, s2, v1, v2 = o.T
            h = (L1 * c1 + L2 * (c1 * c2 - s1 * s2)) / (L1 + L2)
            phi = -C * ((1.0 - h) / 2.0 + kv * (v1 * v1 + v2 * v2))
            rewards[-1] += gamma * phi * alive[-1]
        return raw, z, mu, rewards, alive

    self._roll = roll_tv


grpo.GroupRollout.__init__ = init
sys.exit(main(args))
