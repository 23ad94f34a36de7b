"""Batched closed-loop evaluation of a controller on the C simulator."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from grpo_ctrl.baselines.lqr import obs_to_state
from grpo_ctrl.controller import act
from grpo_ctrl.sim import BatchSim

# which state components are the pendulum's angle and angular velocity
POLE = {"pendulum": (0, 1), "cartpole": (2, 3), "furuta": (1, 3)}
UPRIGHT_TOL = 0.1   # rad: "upright" at the end of an episode
STILL_TOL = 0.5     # rad/s: "still" at the end of an episode
BALANCE_TILT = np.radians(10.0)  # rad: "balance from near upright" starts this far off


def near_upright_start(system: str, tilt: float = BALANCE_TILT) -> dict:
    """Model overrides for a start box around upright: the pendulum up to
    ``tilt`` off, everything else within 0.05 of zero."""
    nx = {"pendulum": 2, "cartpole": 4, "furuta": 4}[system]
    high = np.full(nx, 0.05)
    high[POLE[system][0]] = tilt
    return {"x0_low": -high, "x0_high": high}


@dataclass
class Episodes:
    returns: np.ndarray      # (N,) undiscounted return
    success: np.ndarray      # (N,) never terminated, upright and still at the end
    final_state: np.ndarray  # (N, nx)
    mode_switches: np.ndarray | None = None  # (N,) hand-overs between energy control and LQR


class _ModeSwitches:
    """Counts, per episode, how often a switching controller (one with
    ``in_lqr_region``) changes mode: the evidence that a memoryless region
    switch does not chatter."""

    def __init__(self, controller, n: int):
        self.region = getattr(controller, "in_lqr_region", None)
        self.system = controller.spec.system
        self.count, self.last = np.zeros(n, int), None

    def see(self, obs: np.ndarray, alive: np.ndarray) -> None:
        if self.region is None:
            return
        inside = self.region(obs_to_state(self.system, torch.as_tensor(obs)))[:, 0].numpy()
        if self.last is not None:
            self.count += (inside != self.last) & alive
        self.last = inside

    def result(self) -> np.ndarray | None:
        return None if self.region is None else self.count


def upright_and_still(system: str, x: np.ndarray) -> np.ndarray:
    """Whether states ``x (N, nx)`` have the pendulum within UPRIGHT_TOL of
    upright and turning slower than STILL_TOL."""
    a, v = POLE[system]
    angle = (x[:, a] + np.pi) % (2 * np.pi) - np.pi
    return (np.abs(angle) < UPRIGHT_TOL) & (np.abs(x[:, v]) < STILL_TOL)


@torch.no_grad()
def evaluate(controller, num_episodes: int, seed: int = 0, steps: int | None = None,
             start_states: np.ndarray | None = None, **model) -> Episodes:
    """Run ``num_episodes`` episodes of the controller's plant at once, each
    to the preset's ``max_steps`` (or ``steps``), from draws of the preset's
    start distribution (or from ``start_states (num_episodes, nx)``).
    ``model`` overrides model fields of the simulator (e.g. ``delay=1``,
    ``x0_low=...``)."""
    spec = controller.spec
    sim = BatchSim(spec.system, num_episodes, spec.preset, seed=seed, **model)
    steps = steps or sim.model.max_steps
    obs = sim.reset()
    if start_states is not None:
        sim.set_state({"x": np.asarray(start_states, dtype=float)})
        obs = sim.observe()
    returns = np.zeros(num_episodes)
    alive = np.ones(num_episodes, bool)
    switches = _ModeSwitches(controller, num_episodes)
    for _ in range(steps):
        switches.see(obs, alive)
        obs, reward, terminated, _ = sim.step(act(controller, obs))
        returns += np.where(alive, reward, 0.0)
        alive &= ~terminated
    x = sim.get_state()["x"]
    return Episodes(returns, alive & upright_and_still(spec.system, x), x, switches.result())


@torch.no_grad()
def evaluate_on_gymnasium_pendulum(controller, num_episodes: int, seed: int = 0) -> Episodes:
    """Run the controller on Gymnasium's own Pendulum-v1, episode i reset
    with seed ``seed + i``: the independent reference for the ``gym``
    preset. The environments step one by one in Python; the controller sees
    all of them at once."""
    import gymnasium

    if (controller.spec.system, controller.spec.preset) != ("pendulum", "gym"):
        raise ValueError("only a controller for pendulum/gym can run on Gymnasium's "
                         f"Pendulum-v1, not {controller.spec.system}/{controller.spec.preset}")
    envs = [gymnasium.make("Pendulum-v1") for _ in range(num_episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns = np.zeros(num_episodes)
    ended = np.zeros(num_episodes, bool)
    switches = _ModeSwitches(controller, num_episodes)
    while not ended.all():
        switches.see(obs, ~ended)
        u = act(controller, obs)
        for i, env in enumerate(envs):
            if ended[i]:
                continue
            obs[i], reward, terminated, truncated, _ = env.step(u[i:i + 1])
            returns[i] += reward
            ended[i] = terminated or truncated
    final_state = np.array([env.unwrapped.state for env in envs])
    for env in envs:
        env.close()
    return Episodes(returns, upright_and_still("pendulum", final_state), final_state,
                    switches.result())
