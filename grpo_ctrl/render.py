"""Pictures of the plants: one frame of a state, and animations of episodes.

``frame(spec, x, u)`` draws state ``x`` of a plant and its command ``u`` as an
RGB image (``uint8``, ``size x size x 3``) in numpy alone: Gymnasium's
``render_mode="rgb_array"`` returns these. ``write_animation`` turns episodes
into a GIF (matplotlib's PillowWriter) or an MP4 (its FFMpegWriter, where
ffmpeg is installed), with the time, command and pendulum angle written on
each frame; ``grpo-ctrl eval SOURCE --video`` and ``grpo-ctrl replay
telemetry.csv --video`` write them.

What is drawn (a grey bar at the bottom shows the command, its length
``u / u_max`` of the half-width, orange to the right for positive):

* ``pendulum``: the pole from its pivot at the centre, upright at angle 0,
  positive angles counter-clockwise (Gymnasium's Pendulum-v1);
* ``cartpole``: the track, the cart at its position (the track's ends at
  +-2.4 m, where an episode ends) and the pole, positive angles clockwise
  (Gymnasium's CartPole-v1);
* ``furuta``: the arm turning in a horizontal plane and the pendulum at its
  tip, seen from the front and 25 degrees above (an oblique projection; the
  arm's circle drawn in grey), so that the swing and the arm's turn show
  together.
"""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np

from grpo_ctrl.errors import UserError

BACKGROUND = (255, 255, 255)
POLE = (204, 77, 77)        # Gymnasium's classic-control pole colour
BODY = (60, 60, 60)
TRACK = (150, 150, 150)
COMMAND = (235, 140, 40)
FRAME_SIZE = 500            # Gymnasium's classic-control frames are 500 x 500 (x 600 for CartPole)
ELEVATION = math.radians(25.0)  # the Furuta view's height above the arm's plane


# ---------------------------------------------------------------- geometry
def shapes(spec, x) -> tuple[list, list, tuple[float, float, float, float]]:
    """What to draw for state ``x`` in world units: ``(segments, discs, view)``,
    segments ``(x0, y0, x1, y1, half-width, colour)``, discs ``(x, y, radius,
    colour)``, the view ``(x_min, x_max, y_min, y_max)``; y points up."""
    x = np.asarray(x, dtype=float)
    if spec.system == "pendulum":
        th = x[spec.pole_angle]
        tip = (-math.sin(th), math.cos(th))
        return ([(0.0, 0.0, *tip, 0.06, POLE)],
                [(0.0, 0.0, 0.05, BODY), (*tip, 0.04, POLE)], (-1.3, 1.3, -1.3, 1.3))
    if spec.system == "cartpole":
        pos, th = x[0], x[spec.pole_angle]
        tip = (pos + math.sin(th), math.cos(th))
        return ([(-2.4, 0.0, 2.4, 0.0, 0.015, TRACK), (pos - 0.25, 0.0, pos + 0.25, 0.0, 0.12, BODY),
                 (pos, 0.0, *tip, 0.05, POLE)],
                [(-2.4, 0.0, 0.04, TRACK), (2.4, 0.0, 0.04, TRACK), (pos, 0.0, 0.04, TRACK)],
                (-2.7, 2.7, -1.6, 1.6))
    if spec.system == "furuta":
        arm, alpha = x[0], x[spec.pole_angle]
        r, length = 0.66, 1.0

        def project(p):  # (X, Y, Z) -> screen: front view from ELEVATION above
            return (p[0], p[2] * math.cos(ELEVATION) + p[1] * math.sin(ELEVATION))
        a = (r * math.cos(arm), r * math.sin(arm), 0.0)
        t = (-math.sin(arm), math.cos(arm), 0.0)  # the pendulum swings across the arm
        tip = tuple(a[k] + length * (math.sin(alpha) * t[k] + (math.cos(alpha) if k == 2 else 0))
                    for k in range(3))
        ring = [project((r * math.cos(f), r * math.sin(f), 0.0))
                for f in np.linspace(0, 2 * math.pi, 49)]
        segments = [(*ring[k], *ring[k + 1], 0.008, TRACK) for k in range(len(ring) - 1)]
        segments += [(0.0, -0.6, 0.0, 0.0, 0.04, TRACK), (0.0, 0.0, *project(a), 0.035, BODY),
                     (*project(a), *project(tip), 0.045, POLE)]
        return segments, [(0.0, 0.0, 0.05, BODY), (*project(tip), 0.035, POLE)], (
            -1.35, 1.35, -1.2, 1.5)
    raise ValueError(f"no drawing for the system {spec.system!r}")


def frame(spec, x, u: float = 0.0, size: int = FRAME_SIZE) -> np.ndarray:
    """State ``x`` and command ``u`` of the plant ``spec`` as an RGB image
    ``(size, size, 3)`` uint8 (anti-aliased, white background)."""
    segments, discs, (x0, x1, y0, y1) = shapes(spec, x)
    scale = size / max(x1 - x0, y1 - y0)
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    img = np.empty((size, size, 3), np.float32)
    img[:] = BACKGROUND
    px = np.arange(size, dtype=np.float32) + 0.5

    def to_px(wx, wy):
        return (wx - cx) * scale + size / 2, size / 2 - (wy - cy) * scale

    def paint(cover, colour, box):
        r0, r1, c0, c1 = box
        sub = img[r0:r1, c0:c1]
        sub += cover[..., None] * (np.asarray(colour, np.float32) - sub)

    def box_of(xa, ya, xb, yb, pad):
        c0, c1 = int(max(min(xa, xb) - pad - 1, 0)), int(min(max(xa, xb) + pad + 2, size))
        r0, r1 = int(max(min(ya, yb) - pad - 1, 0)), int(min(max(ya, yb) + pad + 2, size))
        return r0, r1, c0, c1

    for wx0, wy0, wx1, wy1, half, colour in segments:
        (ax, ay), (bx, by), w = to_px(wx0, wy0), to_px(wx1, wy1), half * scale
        r0, r1, c0, c1 = box_of(ax, ay, bx, by, w)
        if r0 >= r1 or c0 >= c1:
            continue
        gx, gy = px[None, c0:c1], px[r0:r1, None]
        dx, dy = bx - ax, by - ay
        s = np.clip(((gx - ax) * dx + (gy - ay) * dy) / max(dx * dx + dy * dy, 1e-12), 0, 1)
        d = np.hypot(gx - ax - s * dx, gy - ay - s * dy)
        paint(np.clip(w + 0.5 - d, 0, 1), colour, (r0, r1, c0, c1))
    for wx, wy, radius, colour in discs:
        (ax, ay), w = to_px(wx, wy), radius * scale
        r0, r1, c0, c1 = box_of(ax, ay, ax, ay, w)
        if r0 >= r1 or c0 >= c1:
            continue
        d = np.hypot(px[None, c0:c1] - ax, px[r0:r1, None] - ay)
        paint(np.clip(w + 0.5 - d, 0, 1), colour, (r0, r1, c0, c1))
    # the command: a bar from the centre of the bottom edge
    h = max(2, size // 40)
    img[size - 2 * h:size - h, size // 10:size - size // 10] = (230, 230, 230)
    share = float(np.clip(u / spec.u_max, -1, 1)) if spec.u_max > 0 else 0.0
    end = int(round(size / 2 + share * (size / 2 - size / 10)))
    lo, hi = sorted((size // 2, end))
    img[size - 2 * h:size - h, lo:max(hi, lo + 1)] = COMMAND if share >= 0 else BODY
    return np.round(img).astype(np.uint8)


# ---------------------------------------------------------------- episodes
class Episode:
    """One episode to draw: times ``t (T,)`` s, states ``x (T, nx)``,
    commands ``u (T,)``, and a label."""

    def __init__(self, t, x, u, label: str = ""):
        self.t, self.x, self.u, self.label = (np.asarray(t, float), np.asarray(x, float),
                                              np.asarray(u, float), label)


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


def wrapped(angle):
    return (np.asarray(angle) + np.pi) % (2 * np.pi) - np.pi


# ---------------------------------------------------------------- animations
VIDEO_SUFFIXES = (".gif", ".mp4")


def check_video_path(path) -> Path:
    """A one-line refusal for a name the writers cannot write, before any work."""
    from grpo_ctrl.files import check_writable

    path = Path(path)
    if path.suffix.lower() not in VIDEO_SUFFIXES:
        raise UserError(f"--video {str(path)!r}: give a .gif or .mp4 file name")
    if path.suffix.lower() == ".mp4" and shutil.which("ffmpeg") is None:
        raise UserError(f"--video {str(path)!r}: an MP4 needs ffmpeg, which is not installed; "
                        "write a .gif instead")
    check_writable(path)
    return path


def write_animation(spec, episodes: list[Episode], path, fps: float = 15.0, size: int = 320,
                    seconds: float | None = None, title: str = "") -> int:
    """Draw ``episodes`` one after the other into ``path`` (.gif or .mp4),
    ``fps`` frames per second of plant time (a frame every ``1 / fps`` s,
    the nearest recorded state), each episode cut at ``seconds``; returns
    the number of frames written. The time, command and pendulum angle of
    each frame are written at the top."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import animation

    path = Path(path)
    picks = []  # (episode, index)
    for e in episodes:
        if not len(e.t):
            continue
        end = e.t[-1] if seconds is None else min(e.t[-1], e.t[0] + seconds)
        for when in np.arange(e.t[0], end + 1e-9, 1.0 / fps):
            picks.append((e, int(np.searchsorted(e.t, when - 1e-9))))
    if not picks:
        raise UserError("nothing to draw: the episodes are empty")
    dpi = 100
    fig = plt.figure(figsize=(size / dpi, size / dpi), dpi=dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_axis_off()
    first_e, first_i = picks[0]
    image = ax.imshow(frame(spec, first_e.x[first_i], first_e.u[first_i], size),
                      interpolation="none")
    font = max(6.0, size / 40)
    text = ax.text(0.03, 0.97, "", transform=ax.transAxes, va="top", ha="left",
                   family="monospace", fontsize=font)
    head = ax.text(0.97, 0.97, "", transform=ax.transAxes, va="top", ha="right", fontsize=font,
                   color="0.35")
    unit = spec.action_unit

    def draw(k):
        e, i = picks[k]
        image.set_data(frame(spec, e.x[i], e.u[i], size))
        angle = float(wrapped(e.x[i, spec.pole_angle]))
        text.set_text(f"t {e.t[i]:5.2f} s\nu {e.u[i]:+.3f} {unit}\nangle {angle:+.2f} rad")
        head.set_text("\n".join(s for s in (title, e.label) if s))
        return image, text, head

    anim = animation.FuncAnimation(fig, draw, frames=len(picks), blit=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".partial" + path.suffix)
    writer = (animation.PillowWriter(fps=fps) if path.suffix.lower() == ".gif"
              else animation.FFMpegWriter(fps=fps))
    try:
        anim.save(str(tmp), writer=writer, dpi=dpi)
        tmp.replace(path)
    finally:
        plt.close(fig)
        if tmp.exists():
            tmp.unlink()
    return len(picks)


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
