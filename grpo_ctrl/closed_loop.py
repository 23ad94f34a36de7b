"""Closed-loop evaluation of any controller (trained or classic): batched on
the C simulator, or on Gymnasium's own Pendulum-v1 as the independent
reference. Success: never terminated, and upright and still at the end."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from grpo_ctrl.controller import act
from grpo_ctrl.errors import UserError
from grpo_ctrl.plant import PlantSpec, plant_spec, wrap_angle
from grpo_ctrl.sim import BatchSim

UPRIGHT_TOL = 0.1   # rad: "upright" at the end of an episode
STILL_TOL = 0.5     # rad/s: "still" at the end of an episode
BALANCE_TILT = np.radians(10.0)  # rad: "balance from near upright" starts this far off


def near_upright_start(system: str, tilt: float = BALANCE_TILT) -> dict:
    """Model overrides for a start box around upright: the pendulum up to
    ``tilt`` off, everything else within 0.05 of zero."""
    low, high = plant_spec(system).near_upright_box(tilt)
    return {"x0_low": low, "x0_high": high}


@dataclass
class Episodes:
    returns: np.ndarray      # (N,) undiscounted return
    success: np.ndarray      # (N,) never terminated, upright and still at the end
    final_state: np.ndarray  # (N, nx)
    mode_switches: np.ndarray | None = None  # (N,) hand-overs between energy control and LQR
    du_mean: np.ndarray | None = None        # (N,) mean |du| / u_max per step
    du_sign_changes: np.ndarray | None = None  # (N,) share of steps where du changes sign


def command_smoothness(u: np.ndarray, u_max: float, alive: np.ndarray | None = None):
    """How smooth a command sequence is, per episode: ``u (T, N)`` (or
    ``(T,)``), counting steps while ``alive (T, N)``. Returns (mean |du| / u_max
    per step, share of steps where du changes sign: chatter). A motor
    tracking a steady command scores (0, 0); bang-bang chatter at every step
    scores up to (2, 1). Sign changes count only du above 1e-3 u_max, so
    rounding noise on a held command is not chatter."""
    u = np.asarray(u, dtype=float)
    squeeze = u.ndim == 1
    u = u.reshape(u.shape[0], -1)
    alive = np.ones(u.shape, bool) if alive is None else np.asarray(alive).reshape(u.shape)
    du = np.diff(u, axis=0) / u_max
    both = alive[1:] & alive[:-1]
    steps = np.maximum(both.sum(axis=0), 1)
    mean_du = np.where(both, np.abs(du), 0.0).sum(axis=0) / steps
    sig = np.where(np.abs(du) > 1e-3, np.sign(du), 0.0)
    flips = (sig[1:] * sig[:-1] < 0) & both[1:] & both[:-1]
    share = flips.sum(axis=0) / np.maximum((both[1:] & both[:-1]).sum(axis=0), 1)
    return (float(mean_du[0]), float(share[0])) if squeeze else (mean_du, share)


class _ModeSwitches:
    """Counts, per episode, how often a switching controller (one with a
    ``mode(obs)``) changes mode: the evidence that a memoryless region
    switch does not chatter."""

    def __init__(self, controller, n: int):
        self.mode = getattr(controller, "mode", None)
        self.count, self.last = np.zeros(n, int), None

    def see(self, obs: np.ndarray, alive: np.ndarray) -> None:
        if self.mode is None:
            return
        inside = self.mode(torch.as_tensor(obs))[:, 0].numpy()
        if self.last is not None:
            self.count += (inside != self.last) & alive
        self.last = inside

    def result(self) -> np.ndarray | None:
        return None if self.mode is None else self.count


def upright_and_still(spec: PlantSpec, x: np.ndarray) -> np.ndarray:
    """Whether states ``x (N, nx)`` have the pendulum within UPRIGHT_TOL of
    upright and turning slower than STILL_TOL: every angle that enters the
    dynamics (the pole's; both links of the double pendulum; not the
    Furuta's arm, which is cyclic)."""
    ok = np.ones(len(x), dtype=bool)
    for a, v in spec.channels:
        if spec.angles[a] and a not in spec.cyclic:
            angle = wrap_angle(x[:, a])
            ok &= (np.abs(angle) < UPRIGHT_TOL) & (np.abs(x[:, v]) < STILL_TOL)
    return ok


@torch.no_grad()
def evaluate(controller, num_episodes: int, seed: int = 0, steps: int | None = None,
             randomize=None, start_states: np.ndarray | None = None, **model) -> Episodes:
    """Run ``num_episodes`` episodes of the controller's plant at once, each
    to the preset's ``max_steps`` (or ``steps``), from draws of the preset's
    start distribution (or from ``start_states (num_episodes, nx)``). ``randomize`` (a
    ``grpo_ctrl.randomize.Randomization``) draws each episode its plant;
    ``model`` overrides model fields of the simulator (e.g. ``delay=1``,
    ``x0_low=...``)."""
    spec = controller.spec
    sim = BatchSim(spec.system, num_episodes, spec.preset, seed=seed, randomize=randomize,
                   **model)
    return run_episodes(controller, sim, steps, start_states)


@torch.no_grad()
def run_episodes(controller, sim: BatchSim, steps: int | None = None,
                 start_states: np.ndarray | None = None) -> Episodes:
    """One episode in each environment of ``sim`` (reset first, then put in
    ``start_states`` if given; plants as its plant mode says), each to the
    preset's ``max_steps`` (or ``steps``)."""
    spec, num_episodes = controller.spec, sim.num_envs
    steps = steps or sim.model.max_steps
    obs = sim.reset()
    if start_states is not None:
        sim.set_state({"x": np.asarray(start_states, dtype=float)})
        obs = sim.observe()
    returns = np.zeros(num_episodes)
    alive = np.ones(num_episodes, bool)
    commands = np.empty((steps, num_episodes), np.float32)
    was_alive = np.empty((steps, num_episodes), bool)
    switches = _ModeSwitches(controller, num_episodes)
    for t in range(steps):
        switches.see(obs, alive)
        commands[t], was_alive[t] = act(controller, obs), alive
        obs, reward, terminated, _ = sim.step(commands[t])
        returns += np.where(alive, reward, 0.0)
        alive &= ~terminated
    x = sim.get_state()["x"]
    du_mean, du_flips = command_smoothness(commands, spec.u_max, was_alive)
    return Episodes(returns, alive & upright_and_still(spec, x), x, switches.result(),
                    du_mean, du_flips)


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
    return Episodes(returns, upright_and_still(controller.spec, final_state), final_state,
                    switches.result())


def summarise(returns: np.ndarray, success: np.ndarray, du_mean=None, du_flips=None) -> dict:
    out = {"episodes": int(returns.size), "mean": float(returns.mean()),
           "median": float(np.median(returns)), "worst": float(returns.min()),
           "success": float(success.mean())}
    if du_mean is not None:
        out.update(du_mean=float(du_mean.mean()), du_sign_changes=float(du_flips.mean()))
    return out


def evaluate_on_sim(controller, episodes: int, seed: int = 0) -> dict:
    """Scores over ``episodes`` batched episodes on the C simulator."""
    ep = evaluate(controller, episodes, seed=seed)
    return summarise(ep.returns, ep.success, ep.du_mean, ep.du_sign_changes)


def evaluate_on_gym(controller, episodes: int = 100, seed: int = 0) -> dict:
    """Scores on Gymnasium's own Pendulum-v1: episode i is reset with seed
    ``seed + i``; all episodes step in lockstep so each control step is one
    batched forward pass."""
    spec = controller.spec
    if (spec.system, spec.preset) != ("pendulum", "gym"):
        raise UserError(f"--gym evaluates on Gymnasium's Pendulum-v1, which is the pendulum/gym "
                        f"preset; this controller is for {spec.system}/{spec.preset}")
    ep = evaluate_on_gymnasium_pendulum(controller, episodes, seed=seed)
    return summarise(ep.returns, ep.success)
