"""Study (research §19, the pendubot): the costs after the switch (costs_from) at LATE times
the plant's (the trainer's: 1). usage: python benchmarks/study_costs_after_switch.py 2 -- train
--system double_pendulum --preset pendubot --costs-early 0.1 --horizon 200 --loss-steps 100
--gamma 0.995 --deploy score --eval-every 2 --seed 0 --iterations 4400 --time-budget 0
--overlap false --out RUN"""
import sys
from grpo_ctrl import grpo
from grpo_ctrl.cli import main

late = float(sys.argv[1])
args = sys.argv[sys.argv.index("--") + 1:]
orig = grpo.Trainer.set_progress


def set_progress(self, fraction):
    orig(self, fraction)
    after = min(max(fraction, 0.0), 1.0) >= self.cfg.costs_from
    if after and self.cfg.costs_from < 1.0:
        self.cost_scale = late
        self.rollout.set_cost_scale(late)


grpo.Trainer.set_progress = set_progress
sys.exit(main(args))
