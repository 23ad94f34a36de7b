"""Held-out, paired evaluation: every controller on the same episodes.

A headline return is a mean over ``HELDOUT_EPISODES`` (1,000) episodes with
its standard error, and two controllers are compared on the same episodes:
the paired difference has a far smaller standard error than the two means
(the start state moves a return by tens of points; a better controller is
better on nearly every start).

The episodes are fixed start states from fixed seeds, not the ones training
selects ``deployed.pt`` on (its in-training evaluation draws 100 starts from the C
simulator's RNG, seeds 1000003 + the training seed on). For the gym pendulum
they are Gymnasium's own Pendulum-v1
resets (``reset(seed=s)``, s = ``HELDOUT_SEED`` + i), then stepped in the C
simulator's ``gym`` preset, which matches Gymnasium step for step
(``tests/test_sim_parity.py``; ``tests/test_heldout.py`` checks the whole
episodes); for the other plants, the preset's start distribution drawn by
the C simulator from the same seeds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_ctrl.closed_loop import Episodes, evaluate
from grpo_ctrl.errors import UserError
from grpo_ctrl.sim import BatchSim

HELDOUT_SEED = 10_000
HELDOUT_EPISODES = 1_000


def start_states(system: str, preset: str, episodes: int = HELDOUT_EPISODES,
                 seed: int = HELDOUT_SEED) -> np.ndarray:
    """Start states ``(episodes, nx)`` of episodes ``seed`` .. ``seed + episodes - 1``."""
    if (system, preset) == ("pendulum", "gym"):
        try:
            import gymnasium
        except ImportError:
            raise UserError("held-out episodes of the gym pendulum are Gymnasium's own "
                            "Pendulum-v1 resets: pip install gymnasium") from None
        env = gymnasium.make("Pendulum-v1").unwrapped
        x = np.empty((episodes, 2))
        for i in range(episodes):
            env.reset(seed=seed + i)
            x[i] = env.state
        return x
    sim = BatchSim(system, episodes, preset, seed=seed)
    sim.reset()
    return sim.get_state()["x"]


HANGING_WITHIN = 0.64  # rad: one fifth of Gymnasium's uniform start angles


def near_hanging(system: str, preset: str, episodes: int = HELDOUT_EPISODES,
                 seed: int = HELDOUT_SEED) -> np.ndarray:
    """Which held-out episodes start within ``HANGING_WITHIN`` of hanging down
    (pole angle pi): where most of GRPO's gap to the optimum sits (docs/grpo.md §8)."""
    angle = start_states(system, preset, episodes, seed)[:, 0]
    return np.abs(np.abs(angle) - np.pi) < HANGING_WITHIN


@dataclass
class Score:
    """Per-episode results of one controller on the held-out episodes."""
    returns: np.ndarray   # (N,)
    success: np.ndarray   # (N,) upright and still at the end, never terminated
    seed: int

    @property
    def mean(self) -> float:
        return float(self.returns.mean())

    @property
    def se(self) -> float:
        return standard_error(self.returns)

    def minus(self, other: "Score") -> tuple[float, float]:
        """Paired difference of the returns, self - other: (mean, standard error)."""
        if self.returns.shape != other.returns.shape or self.seed != other.seed:
            raise ValueError("a paired difference needs the same episodes: scored with "
                             f"seeds {self.seed} and {other.seed}, {self.returns.size} and "
                             f"{other.returns.size} episodes")
        d = self.returns - other.returns
        return float(d.mean()), standard_error(d)

    def __str__(self) -> str:
        return f"{self.mean:.1f} (s.e. {self.se:.1f})"


def standard_error(x: np.ndarray) -> float:
    """Standard error of the mean of ``x`` (0 for a single value)."""
    x = np.asarray(x, dtype=float)
    return float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else 0.0


def format_difference(d: tuple[float, float]) -> str:
    return f"{d[0]:+.1f} (s.e. {d[1]:.1f})"


_STARTS: dict = {}  # (system, preset, episodes, seed) -> start states: resets cost a little


def run(controller, episodes: int = HELDOUT_EPISODES, seed: int = HELDOUT_SEED) -> Episodes:
    """The held-out episodes of the controller's plant, stepped in the C simulator, batched."""
    spec = controller.spec
    key = (spec.system, spec.preset, episodes, seed)
    if key not in _STARTS:
        _STARTS[key] = start_states(*key)
    return evaluate(controller, episodes, seed=seed, start_states=_STARTS[key])


def score(controller, episodes: int = HELDOUT_EPISODES, seed: int = HELDOUT_SEED) -> Score:
    """The controller's returns on the held-out episodes."""
    ep = run(controller, episodes, seed)
    return Score(ep.returns, ep.success, seed)
