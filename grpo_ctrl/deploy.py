"""Which of a run's last policies it deploys when ``deploy = "calm"``.

Near upright every controller with a quantised angle holds the pendulum on
the boundary between two encoder counts, and its command answers each flip of
the reading (docs/robustness.md §3). Whether that limit cycle reverses the
command at once (chatter) turns on details of the policy's gain that change
from one update to the next: on the rig, policies ten iterations apart at the
end of one run chatter at 3 % and at 12 % with the same return (§5, fifth
session). Nothing in training sees it, since the branches are noisy and act
at the decision rate. So the run keeps its policies of the last
``calm_window`` of training and deploys the latest one whose deterministic
command, run at every control step on nominal plants, reverses direction no
more often than the hand-written swing-up + LQR's on the same episodes, and
succeeds as often as the final policy; if none does, the one that chatters
least among those that succeed as often. (The candidates live in memory: a
resumed run chooses among those since it resumed.)

The episodes are the preset's nominal starts from seeds of their own
(``CALM_SEED``), apart from training, its evaluations and every held-out set.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from grpo_ctrl.baselines import make_controller
from grpo_ctrl.closed_loop import evaluate
from grpo_ctrl.policy import GaussianPolicy

CALM_SEED = 6_000_000_000  # training draws near 0, evaluation near 1e6, held out 1e4 and 7e9
CALM_EPISODES = 50


@dataclass
class Candidate:
    iteration: int
    policy: GaussianPolicy
    chatter: float | None = None  # share of steps where du changes sign, episode mean
    success: float | None = None


class CalmChoice:
    """The candidates of one run, offered as training goes; ``choose`` picks."""

    def __init__(self, spec, episodes: int = CALM_EPISODES, catch: float = 0.0):
        self.spec, self.episodes, self.catch = spec, episodes, catch
        self.candidates: list[Candidate] = []

    def offer(self, iteration: int, policy: GaussianPolicy) -> None:
        if not self.candidates or self.candidates[-1].iteration != iteration:
            self.candidates.append(Candidate(iteration, copy.deepcopy(policy)))

    def _measure(self, controller) -> tuple[float, float]:
        ep = evaluate(controller, self.episodes, seed=CALM_SEED)
        return float(np.mean(ep.du_sign_changes)), float(np.mean(ep.success))

    def choose(self) -> tuple[Candidate, dict]:
        """The deployed candidate and a record of the choice: the reference's
        chatter, and every candidate measured (latest first; the search stops
        at the first that qualifies)."""
        reference, _ = self._measure(make_controller("swingup-lqr", self.spec.system,
                                                     self.spec.preset))
        final = self.candidates[-1]
        chosen = None
        for c in reversed(self.candidates):
            c.chatter, c.success = self._measure(c.policy.controller(self.spec, self.catch))
            if c.success >= final.success and c.chatter <= reference:
                chosen = c
                break
        measured = [c for c in self.candidates if c.chatter is not None]
        if chosen is None:
            chosen = min((c for c in measured if c.success >= final.success),
                         key=lambda c: c.chatter)
        record = {"reference_chatter": reference, "deployed_iteration": chosen.iteration,
                  "candidates": [[c.iteration, c.chatter, c.success] for c in reversed(measured)]}
        return chosen, record
