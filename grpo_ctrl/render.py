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
  together;
* ``double_pendulum``: both links from the shoulder at the centre, upright
  at angle 0, counter-clockwise positive, the elbow angle relative to the
  first link (RealAIGym's acrobot and pendubot), the motor drawn as a dark
  disc on the joint it drives.
"""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np

from grpo_ctrl.errors import UserError
from grpo_ctrl.plant import wrap_angle
from grpo_ctrl.plant_file import nominal_params

BACKGROUND = (255, 255, 255)
POLE_COLOUR = (204, 77, 77)        # Gymnasium's classic-control pole colour
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
        return ([(0.0, 0.0, *tip, 0.06, POLE_COLOUR)],
                [(0.0, 0.0, 0.05, BODY), (*tip, 0.04, POLE_COLOUR)], (-1.3, 1.3, -1.3, 1.3))
    if spec.system == "cartpole":
        pos, th = x[0], x[spec.pole_angle]
        tip = (pos + math.sin(th), math.cos(th))
        return ([(-2.4, 0.0, 2.4, 0.0, 0.015, TRACK), (pos - 0.25, 0.0, pos + 0.25, 0.0, 0.12, BODY),
                 (pos, 0.0, *tip, 0.05, POLE_COLOUR)],
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
                     (*project(a), *project(tip), 0.045, POLE_COLOUR)]
        return segments, [(0.0, 0.0, 0.05, BODY), (*project(tip), 0.035, POLE_COLOUR)], (
            -1.35, 1.35, -1.2, 1.5)
    if spec.system == "double_pendulum":
        p = nominal_params(spec)
        th1, th12 = x[0], x[0] + x[1]
        elbow = (-p["l1"] * math.sin(th1), p["l1"] * math.cos(th1))
        tip = (elbow[0] - p["l2"] * math.sin(th12), elbow[1] + p["l2"] * math.cos(th12))
        reach = 1.3 * (p["l1"] + p["l2"])
        w = 0.04 * (p["l1"] + p["l2"])
        motor = (0.0, 0.0) if spec.preset.startswith("pendubot") else elbow
        return ([(0.0, 0.0, *elbow, w, BODY), (*elbow, *tip, w, POLE_COLOUR)],
                [(0.0, 0.0, 0.8 * w, TRACK), (*motor, 1.4 * w, BODY), (*tip, 0.7 * w, POLE_COLOUR)],
                (-reach, reach, -reach, reach))
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
        angle = float(wrap_angle(e.x[i, spec.pole_angle]))
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
