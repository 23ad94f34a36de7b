"""Gymnasium adapters for the simulator, for users of SB3 and friends.

Gymnasium is an optional extra (``pip install 'grpo-ctrl[gym]'``); nothing
else in grpo_ctrl imports this module.

* ``SimEnv``: one environment, a ``gymnasium.Env``.
* ``SimVectorEnv``: ``num_envs`` environments stepped in one C call,
  a ``gymnasium.vector.VectorEnv``.

Both work for every plant (``system="pendulum" | "cartpole" | "furuta" |
"double_pendulum"``)
and take the model overrides of ``BatchSim`` (``delay=2``,
``noise_std=[...]``, ...). Episodes end inside the simulator: ``truncated``
comes at the preset's ``max_steps``, so do not add a ``TimeLimit`` wrapper.

Registered ids (``import grpo_ctrl`` registers them when gymnasium is
installed; so does importing this module), one per plant, the preset a
keyword (default: the plant's first), other keywords as ``SimEnv`` takes them:

===============================  ==================================================
``grpo_ctrl/Pendulum-v0``        ``preset="gym"`` (Pendulum-v1 exactly), ``"rig"``
``grpo_ctrl/CartPole-v0``        ``preset="gym"`` (CartPole-v1, continuous force),
                                 ``"swingup"``
``grpo_ctrl/Furuta-v0``          ``preset="qube-servo2"``
``grpo_ctrl/DoublePendulum-v0``  ``preset="acrobot"`` (RealAIGym's simulation
                                 leaderboard v2), ``"pendubot"``, ``"acrobot-real"``,
                                 ``"pendubot-real"``
===============================  ==================================================

>>> import gymnasium as gym, grpo_ctrl
>>> env = gym.make("grpo_ctrl/Furuta-v0", render_mode="rgb_array")
>>> obs, info = env.reset(seed=0)
>>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
>>> env.render().shape
(500, 500, 3)

Rendering follows Gymnasium's conventions: ``render_mode="rgb_array"``:
``render()`` returns the current frame, 500 x 500 x 3 uint8
(``grpo_ctrl.render.frame``: the plant, and the last command as a bar at the
bottom); ``"human"``: each ``reset`` and ``step`` shows the frame in a
matplotlib window at ``metadata["render_fps"]`` (the plant's control rate,
at most 50; needs matplotlib, the train extra), and ``render()`` returns None.
"""
from __future__ import annotations

import numpy as np

try:
    import gymnasium
    from gymnasium import spaces
    from gymnasium.vector import AutoresetMode, VectorEnv
    from gymnasium.vector.utils import batch_space
except ImportError as e:  # gymnasium < 1.1 lacks AutoresetMode
    raise ImportError("grpo_ctrl.gym_env needs gymnasium >= 1.1: pip install 'grpo-ctrl[gym]' "
                      f"(or pip install 'gymnasium>=1.1'); import failed with: {e}") from e

from grpo_ctrl.sim import BatchSim

_SEED_RANGE = 2**63  # seeds drawn for BatchSim when the caller gives none


def _spaces(sim: BatchSim) -> tuple[spaces.Box, spaces.Box]:
    """(observation, action) spaces of one environment.

    cos/sin lie in [-1, 1]; an angular velocity is bounded by the model's
    clip ``v_max`` when it has one and no sensor noise is added to it;
    everything else is unbounded (the largest float32, as CartPole-v1 says it)."""
    m, spec = sim.model, sim.spec
    high = np.full(spec.nobs, np.finfo(np.float32).max, np.float32)
    for k in range(spec.nx):
        i = spec.obs_index[k]
        if spec.angles[k]:
            high[i:i + 2] = 1.0  # its cosine and sine
        elif spec.angular_velocities[k] and m.v_max > 0 and m.noise_std[k] == 0:
            high[i] = m.v_max
    u_max = np.float32(spec.u_max)
    return (spaces.Box(-high, high, dtype=np.float32),
            spaces.Box(-u_max, u_max, shape=(1,), dtype=np.float32))


class SimEnv(gymnasium.Env):
    """One simulated plant as a ``gymnasium.Env``.

    ``reset(seed=s)`` reseeds the simulator's RNG (start states and sensor
    noise); ``reset(options={"state": x})`` starts from the state ``x``
    instead of a random draw. ``self.sim`` is the underlying ``BatchSim``
    (one environment). ``render_mode``: None, ``"rgb_array"`` or ``"human"``
    (the module's docstring)."""

    metadata = {"render_modes": ["human", "rgb_array"], "render_fps": 50}

    def __init__(self, system: str = "pendulum", preset: str | None = None,
                 render_mode: str | None = None, **model):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of "
                             f"{self.metadata['render_modes']}, got {render_mode!r}")
        self.sim = BatchSim(system, 1, preset=preset, **model)
        self.plant_spec = self.sim.spec
        self.observation_space, self.action_space = _spaces(self.sim)
        self._seeded = False
        self.render_mode = render_mode
        # an instance's own copy: the frame rate is the plant's control rate, at most 50
        self.metadata = {**self.metadata,
                         "render_fps": min(50, round(1.0 / self.plant_spec.dt))}
        self._last_u = 0.0
        self._window = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None or not self._seeded:
            # without a seed, the first reset draws one from gymnasium's np_random
            self.sim.seed(seed if seed is not None else int(self.np_random.integers(_SEED_RANGE)))
            self._seeded = True
        obs = self.sim.reset()
        if options and "state" in options:
            self.sim.set_state({"x": np.asarray(options["state"], dtype=float).reshape(1, -1)})
            obs = self.sim.observe()
        self._last_u = 0.0
        if self.render_mode == "human":
            self._show()
        return obs[0].copy(), {}

    def step(self, action):
        a = np.asarray(action, dtype=np.float32).reshape(-1)
        if a.shape != (1,):
            raise ValueError(f"action must hold one number ({self.plant_spec.action_name} in "
                             f"{self.plant_spec.action_unit}), got shape {np.shape(action)}")
        obs, reward, terminated, truncated = self.sim.step(a)
        self._last_u = float(np.clip(a[0], -self.plant_spec.u_max, self.plant_spec.u_max))
        if self.render_mode == "human":
            self._show()
        return obs[0].copy(), float(reward[0]), bool(terminated[0]), bool(truncated[0]), {}

    def render(self):
        """The current frame (``"rgb_array"``), or None (``"human"`` shows
        frames as the episode steps; no render mode: a warning, as Gymnasium's
        own environments give)."""
        if self.render_mode is None:
            gymnasium.logger.warn("render() without a render_mode: pass render_mode="
                                  "'rgb_array' or 'human' to the constructor or gymnasium.make")
            return None
        if self.render_mode == "rgb_array":
            return self._frame()
        return None

    def _frame(self) -> np.ndarray:
        from grpo_ctrl.render import frame

        return frame(self.plant_spec, self.sim.get_state()["x"][0], self._last_u)

    def _show(self) -> None:
        import matplotlib.pyplot as plt

        if self._window is None:
            fig, ax = plt.subplots(figsize=(5, 5), dpi=100)
            ax.set_axis_off()
            fig.subplots_adjust(0, 0, 1, 1)
            self._window = (fig, ax.imshow(self._frame()))
            fig.canvas.manager.set_window_title(
                f"grpo_ctrl {self.plant_spec.system}/{self.plant_spec.preset}")
        fig, image = self._window
        image.set_data(self._frame())
        if plt.get_backend().lower() == "agg":  # no display (a test, a server): nothing to show
            fig.canvas.draw()
            return
        plt.pause(1.0 / self.metadata["render_fps"])

    def close(self):
        if self._window is not None:
            import matplotlib.pyplot as plt

            plt.close(self._window[0])
            self._window = None
        super().close()


class SimVectorEnv(VectorEnv):
    """``num_envs`` simulated plants as one ``gymnasium.vector.VectorEnv``,
    stepped together in C.

    Autoreset is Gymnasium's *same-step* mode (``AutoresetMode.SAME_STEP``):
    when an environment ends, the step that ends it already returns the first
    observation of its next episode, and ``info["final_obs"][i]`` (with mask
    ``info["_final_obs"]``) holds the observation it ended in, as
    ``SyncVectorEnv(..., autoreset_mode=SAME_STEP)`` reports it.

    ``reset(seed=s)`` seeds environment i with ``s + i`` (a list seeds each
    one); ``reset(options={"reset_mask": mask})`` resets only the masked
    environments. ``self.sim`` is the underlying ``BatchSim``."""

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, system: str = "pendulum", preset: str | None = None,
                 **model):
        self.sim = BatchSim(system, num_envs, preset=preset, autoreset=True, **model)
        self.num_envs = self.sim.num_envs
        self.single_observation_space, self.single_action_space = _spaces(self.sim)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._seeded = False

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        if isinstance(seed, (list, tuple, np.ndarray)):
            if len(seed) != self.num_envs:
                raise ValueError(f"need one seed per environment ({self.num_envs}), got {len(seed)}")
            self.sim.reseed(np.arange(self.num_envs), seed)
            self._seeded = True
            seed = None
        super().reset(seed=seed)
        if seed is not None or not self._seeded:
            self.sim.seed(seed if seed is not None else int(self.np_random.integers(_SEED_RANGE)))
            self._seeded = True
        mask = None if not options or "reset_mask" not in options else options["reset_mask"]
        return self.sim.reset(mask).copy(), {}

    def step(self, actions):
        obs, reward, terminated, truncated = self.sim.step(actions)
        info = {}
        ended = terminated | truncated
        if ended.any():
            final_obs = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(ended):
                final_obs[i] = self.sim.final_obs[i].copy()
            info = {"final_obs": final_obs, "_final_obs": ended.copy(),
                    "final_info": {}, "_final_info": ended.copy()}
        return obs.copy(), reward.copy(), terminated.copy(), truncated.copy(), info


# the names before cart-pole and Furuta joined (deprecated)
PendulumSimEnv, PendulumSimVectorEnv = SimEnv, SimVectorEnv

# registered id -> system; the preset is a keyword (default: the system's first)
IDS = {"grpo_ctrl/Pendulum-v0": "pendulum", "grpo_ctrl/CartPole-v0": "cartpole",
       "grpo_ctrl/Furuta-v0": "furuta", "grpo_ctrl/DoublePendulum-v0": "double_pendulum"}


def register_ids() -> None:
    """Register ``IDS`` with gymnasium (again: a no-op)."""
    for env_id, system in IDS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point="grpo_ctrl.gym_env:SimEnv",
                               kwargs={"system": system},
                               vector_entry_point="grpo_ctrl.gym_env:SimVectorEnv")


register_ids()
