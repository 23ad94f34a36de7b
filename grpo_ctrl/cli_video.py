"""Animations of controllers and of a rig's runs: ``grpo-ctrl eval SOURCE
--video`` draws chosen held-out episodes of any controller source in the C
simulator, ``grpo-ctrl replay telemetry.csv --video`` a rig's run from its
telemetry, both with ``grpo_ctrl.render``'s frames.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from grpo_ctrl.errors import UserError
from grpo_ctrl.render import Episode, check_video_path, write_animation


# ---------------------------------------------------------------- episodes
def record(controller, start_states: np.ndarray, labels=None, steps: int | None = None,
           **model) -> list[Episode]:
    """The episodes of ``controller`` on its plant in the C simulator from
    ``start_states (N, nx)``, each to the preset's end (or ``steps``) or its
    termination; the command at each step is the one applied from that
    state (the deterministic action, as ``grpo-ctrl eval`` scores it)."""
    from grpo_ctrl.controller import act
    from grpo_ctrl.sim import BatchSim

    spec = controller.spec
    n = len(start_states)
    sim = BatchSim(spec.system, n, spec.preset, seed=0, **model)
    sim.reset()
    sim.set_state({"x": np.asarray(start_states, dtype=float)})
    obs = sim.observe()
    steps = steps or sim.model.max_steps
    xs, us = [], []
    alive = np.ones(n, bool)
    ends = np.full(n, steps)
    for k in range(steps):
        xs.append(sim.get_state()["x"].copy())
        u = act(controller, obs)
        us.append(u.copy())
        obs, _, terminated, _ = sim.step(u)
        ends[alive & terminated] = k + 1
        alive &= ~terminated
        if not alive.any():
            break
    xs, us = np.stack(xs), np.stack(us)
    labels = labels or [""] * n
    return [Episode(np.arange(ends[i]) * spec.dt, xs[:ends[i], i], us[:ends[i], i], labels[i])
            for i in range(n)]


# ---------------------------------------------------------------- grpo-ctrl eval --video
def add_eval_arguments(p) -> None:
    """``grpo-ctrl eval``'s animation options."""
    from grpo_ctrl.option_types import number

    p.add_argument("--video", metavar="FILE.gif|FILE.mp4",
                   help="also draw chosen held-out episodes of the controller into an "
                        "animation (.mp4 needs ffmpeg)")
    p.add_argument("--video-episodes", type=_indices, default=[0], metavar="I,J,...",
                   help="which held-out episodes to draw, counted from --seed (default 0)")
    add_video_options(p, number)


def _indices(text: str) -> list[int]:
    import argparse

    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 0 or max(out) >= 100_000:
        raise argparse.ArgumentTypeError(f"expected episode numbers 0-99999 separated by "
                                         f"commas, got {text!r}")
    return out


def eval_video(controller, name: str, args) -> None:
    """Draw ``args.video_episodes`` of the held-out set (from ``args.seed``)."""
    from grpo_ctrl.heldout import start_states

    spec, chosen = controller.spec, args.video_episodes
    starts = start_states(spec.system, spec.preset, max(chosen) + 1, args.seed)[chosen]
    episodes = record(controller, starts, [f"episode {args.seed + i}" for i in chosen])
    n = write_animation(spec, episodes, args.video, args.video_fps, args.video_size,
                        args.video_seconds, title=f"{name}, {spec.system}/{spec.preset}")
    print(f"wrote {args.video}: {n} frames at {args.video_fps:g} fps, episodes "
          f"{', '.join(str(args.seed + i) for i in chosen)}")


# ---------------------------------------------------------------- telemetry
def episode_from_telemetry(rows: list[dict], spec) -> Episode:
    """The states a rig's run saw, from its telemetry rows (``grpo-ctrl run
    --log``): each STATE's observation turned back into the plant's state
    (an angle from its cosine and sine; velocities as observed), at the
    device's time, with the actuator value the device reported."""
    states = [r for r in rows if r.get("kind") == "state" and r.get("obs")]
    if not states:
        raise UserError("the telemetry holds no STATE rows with observations; is it a "
                        "`grpo-ctrl run --log` file?")
    width = len(states[0]["obs"])
    if width != spec.nobs:
        raise UserError(f"the telemetry's observations have {width} values, {spec.system} has "
                        f"{spec.nobs} ({', '.join(spec.obs_names)}); give the right --system")
    obs = np.array([r["obs"] for r in states], float)
    x = np.zeros((len(states), spec.nx))
    for k in range(spec.nx):
        i = spec.obs_index[k]
        x[:, k] = np.arctan2(obs[:, i + 1], obs[:, i]) if spec.angles[k] else obs[:, i]
    t = np.array([r["dev_t_us"] for r in states], float) * 1e-6
    u = np.array([r["actuator"] if r.get("actuator") is not None else 0.0 for r in states])
    return Episode(t - t[0], x, u)


def system_of_telemetry(rows: list[dict]) -> str:
    """The plant whose observation width the telemetry's STATE rows have."""
    from grpo_ctrl.plant import plant_spec, systems

    width = next((len(r["obs"]) for r in rows if r.get("kind") == "state" and r.get("obs")), None)
    matches = [s for s in systems() if plant_spec(s).nobs == width]
    if len(matches) != 1:
        raise UserError(f"cannot tell the plant from observations of {width} values; give "
                        f"--system ({', '.join(systems())})")
    return matches[0]


def preset_of_commands(system: str, u) -> str:
    """The preset of ``system`` with the smallest actuator limit that the
    commands ``u`` stay within (a rig's commands reach its limit while it
    swings up): the command bar's scale when the telemetry does not say."""
    from grpo_ctrl.plant import plant_spec, presets

    top = float(np.max(np.abs(u))) if len(u) else 0.0
    fits = [(plant_spec(system, p).u_max, p) for p in presets(system)
            if plant_spec(system, p).u_max >= top * (1 - 1e-6)]
    return min(fits)[1] if fits else max((plant_spec(system, p).u_max, p)
                                         for p in presets(system))[1]


# ---------------------------------------------------------------- grpo-ctrl replay
def add_arguments(p) -> None:
    from grpo_ctrl.option_types import number

    p.add_argument("telemetry", help="a telemetry file of `grpo-ctrl run --log` (.csv or .jsonl)")
    p.add_argument("--video", required=True, metavar="FILE.gif|FILE.mp4",
                   help="the animation to write (.mp4 needs ffmpeg)")
    p.add_argument("--system", help="plant (default: told by the observations' width)")
    p.add_argument("--preset", help="preset, for the command bar's scale (default: the one "
                                    "with the smallest actuator limit the commands stay within)")
    add_video_options(p, number)


def add_video_options(p, number) -> None:
    p.add_argument("--video-fps", type=number(float, 1.0, 60.0), default=15.0, metavar="FPS",
                   help="frames per second of plant time (default 15)")
    p.add_argument("--video-size", type=number(int, 64, 2000), default=320, metavar="PX",
                   help="width and height of the animation in pixels (default 320)")
    p.add_argument("--video-seconds", type=number(float, None, 1e6, above=0.0), default=None,
                   metavar="S", help="draw each episode's first S seconds (default: all)")


def run(args) -> int:
    from grpo_ctrl.firmware_bridge.telemetry import read_telemetry
    from grpo_ctrl.plant import plant_spec, resolve_plant

    video = check_video_path(args.video)
    path = Path(args.telemetry)
    if not path.is_file():
        raise UserError(f"no telemetry file {str(path)!r}")
    try:
        rows = read_telemetry(path)
    except (ValueError, KeyError, OSError) as e:
        raise UserError(f"cannot read the telemetry {str(path)!r}: {e}") from None
    system, preset = resolve_plant(args.system or system_of_telemetry(rows), args.preset)
    spec = plant_spec(system, preset)
    episode = episode_from_telemetry(rows, spec)
    if args.preset is None:
        preset = preset_of_commands(system, episode.u)
        spec = plant_spec(system, preset)
    episode.label = path.name
    n = write_animation(spec, [episode], video, args.video_fps, args.video_size,
                        args.video_seconds, title=f"{system}/{preset} rig")
    print(f"wrote {video}: {n} frames at {args.video_fps:g} fps, {episode.t[-1]:.1f} s of the "
          f"rig's run")
    return 0
