"""Batched closed-loop evaluation of a controller on the C simulator."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from grpo_ctrl.controller import act
from grpo_ctrl.sim import BatchSim

# which state components are the pendulum's angle and angular velocity
POLE = {"pendulum": (0, 1), "cartpole": (2, 3), "furuta": (1, 3)}
UPRIGHT_TOL = 0.1   # rad: "upright" at the end of an episode
STILL_TOL = 0.5     # rad/s: "still" at the end of an episode


@dataclass
class Episodes:
    returns: np.ndarray      # (N,) undiscounted return
    success: np.ndarray      # (N,) never terminated, upright and still at the end
    final_state: np.ndarray  # (N, nx)


def upright_and_still(system: str, x: np.ndarray) -> np.ndarray:
    """Whether states ``x (N, nx)`` have the pendulum within UPRIGHT_TOL of
    upright and turning slower than STILL_TOL."""
    a, v = POLE[system]
    angle = (x[:, a] + np.pi) % (2 * np.pi) - np.pi
    return (np.abs(angle) < UPRIGHT_TOL) & (np.abs(x[:, v]) < STILL_TOL)


@torch.no_grad()
def evaluate(controller, num_episodes: int, seed: int = 0, steps: int | None = None,
             **model) -> Episodes:
    """Run ``num_episodes`` episodes of the controller's plant at once, each
    to the preset's ``max_steps`` (or ``steps``). ``model`` overrides model
    fields of the simulator (e.g. ``delay=1``, ``x0_low=...``)."""
    spec = controller.spec
    sim = BatchSim(spec.system, num_episodes, spec.preset, seed=seed, **model)
    steps = steps or sim.model.max_steps
    obs = sim.reset()
    returns = np.zeros(num_episodes)
    alive = np.ones(num_episodes, bool)
    for _ in range(steps):
        obs, reward, terminated, _ = sim.step(act(controller, obs))
        returns += np.where(alive, reward, 0.0)
        alive &= ~terminated
    x = sim.get_state()["x"]
    return Episodes(returns, alive & upright_and_still(spec.system, x), x)
