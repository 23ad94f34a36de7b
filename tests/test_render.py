"""Animations: ``grpo-ctrl eval SOURCE --video`` for a baseline, a run folder
and a checkpoint on every plant, and ``grpo-ctrl replay`` of a rig's
telemetry; the frames are read back and the pole found in them where the
simulator (or the rig) had it."""
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
pytest.importorskip("matplotlib", reason="needs the train extra: pip install -e '.[train]'")

from PIL import Image

from grpo_ctrl import cli_video, render
from grpo_ctrl.firmware_bridge.telemetry import read_telemetry
from grpo_ctrl.plant import plant_spec, wrap_angle

CLI = [sys.executable, "-m", "grpo_ctrl.cli"]
SMALL = ["--video-size", "120", "--video-fps", "10"]


def frames(path):
    """The GIF's frames as RGB arrays."""
    im = Image.open(path)
    out = []
    for k in range(im.n_frames):
        im.seek(k)
        out.append(np.asarray(im.convert("RGB")))
    return out


def pole_row(img):
    """The mean image row of the pole's red pixels, as a share of the height
    (0 top, 1 bottom)."""
    red = (img[..., 0] > 150) & (img[..., 1] < 120) & (img[..., 2] < 120)
    assert red.sum() > 20
    return np.nonzero(red)[0].mean() / img.shape[0]


def cli(*args, cwd=None, timeout=300):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


@pytest.mark.parametrize("system,preset", [("pendulum", "rig"), ("cartpole", "swingup"),
                                           ("furuta", "qube-servo2")])
def test_eval_video_of_a_baseline_swings_up(system, preset, tmp_path):
    """Held-out episode 0 of each of these presets starts hanging; swing-up
    + LQR has the pole up within 3 s: the first frame shows it below the
    pivot, the last above."""
    gif = tmp_path / "x.gif"
    r = cli("eval", "--controller", "swingup-lqr", "--system", system, "--preset", preset,
            "--episodes", "1", "--video", str(gif), "--video-seconds", "4", *SMALL)
    assert r.returncode == 0, r.stderr
    assert f"wrote {gif}: 41 frames at 10 fps" in r.stdout
    shots = frames(gif)
    assert len(shots) == 41 and shots[0].shape == (120, 120, 3)
    pivot = {"pendulum": 0.5, "cartpole": 0.5, "furuta": 0.5 + 0.15 / 2.7}[system]
    assert pole_row(shots[0]) > pivot and pole_row(shots[-1]) < pivot


def test_frames_draw_the_states_the_simulator_recorded():
    """``record`` against the simulator stepped by hand, and each drawn
    frame against the state: the pole's pixels on the side its angle says."""
    from grpo_ctrl.controller import load_controller
    from grpo_ctrl.sim import BatchSim
    controller = load_controller("swingup-lqr", "pendulum", "rig")
    start = np.array([[math.pi - 0.1, 0.0]])
    (episode,) = cli_video.record(controller, start, steps=300)
    sim = BatchSim("pendulum", 1, "rig", seed=0)
    sim.reset()
    sim.set_state({"x": start})
    for k in range(300):
        np.testing.assert_allclose(sim.get_state()["x"][0], episode.x[k])
        sim.step(episode.u[k:k + 1].astype(np.float32))
    spec = plant_spec("pendulum", "rig")
    for k in range(0, 300, 25):
        img = render.frame(spec, episode.x[k], episode.u[k], 200)
        red = (img[..., 0] > 150) & (img[..., 1] < 120) & (img[..., 2] < 120)
        cols = np.nonzero(red)[1].mean() - 100
        angle = wrap_angle(episode.x[k, 0])
        if abs(math.sin(angle)) > 0.3:  # positive angles lean left (counter-clockwise)
            assert np.sign(cols) == -np.sign(math.sin(angle)), (k, angle, cols)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("video-run") / "run"
    r = cli("train", "--out", str(out), "--iterations", "2", "--time-budget", "0",
            "--num-starts", "4", "--group-size", "2", "--horizon", "8", "--loss-steps", "4",
            "--eval-episodes", "2", "--overlap", "false", "--quiet")
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.parametrize("source", ["run", "checkpoint"])
def test_eval_video_of_a_run_folder_and_of_a_checkpoint(tiny_run, tmp_path, source):
    path = tiny_run if source == "run" else tiny_run / "latest.pt"
    gif = tmp_path / "x.gif"
    r = cli("eval", str(path), "--episodes", "2", "--video", str(gif), "--video-episodes", "0,1",
            "--video-seconds", "1.5", *SMALL)
    assert r.returncode == 0, r.stderr
    assert len(frames(gif)) == 2 * 16   # two episodes, 1.5 s each at 10 fps
    assert "episodes 10000, 10001" in r.stdout


def test_replay_draws_a_rigs_run_from_its_telemetry(swingup, tmp_path):
    """A run on the HIL rig from hanging, logged, then drawn: the pole below
    the pivot at the start, above it at the end; the preset told by the
    commands (the rig's 0.15 N m, not the gym preset's 2)."""
    from grpo_ctrl.firmware_bridge.hil import HilConfig, serve_hil
    from grpo_ctrl.firmware_bridge.host import run_loop
    log = tmp_path / "run.csv"
    with serve_hil(HilConfig(system="pendulum", preset="rig", angle0=math.pi,
                             hold_until_armed=True, watchdog_ms=150)) as hil:
        s = run_loop(hil.port, swingup, 4.0, log, plot=False, print_fn=lambda *_: None)
    assert s["ended"] == "completed"
    gif = tmp_path / "replay.gif"
    r = cli("replay", str(log), "--video", str(gif), *SMALL)
    assert r.returncode == 0, r.stderr
    shots = frames(gif)
    episode = cli_video.episode_from_telemetry(read_telemetry(log), plant_spec("pendulum", "rig"))
    # a frame every 0.1 s of the device's time over the logged span (~4 s; a loaded host's
    # run spans a little more), the first at 0
    assert len(shots) == len(np.arange(0.0, episode.t[-1] + 1e-9, 0.1))
    assert 3.5 <= episode.t[-1] <= 6.0
    assert pole_row(shots[0]) > 0.5 and pole_row(shots[-1]) < 0.5
    assert cli_video.preset_of_commands("pendulum", episode.u) == "rig"


def test_eval_video_beside_the_realaigym_score(tmp_path):
    """``--score realaigym --video``: the score's table, then the held-out episode 0
    drawn, which for the double pendulum is the benchmark's start, hanging at rest: the
    second link below the shoulder in the first frame."""
    gif = tmp_path / "x.gif"
    r = cli("eval", "--controller", "lqr", "--system", "double_pendulum", "--preset",
            "pendubot", "--score", "realaigym", "--video", str(gif), "--video-seconds", "0.5",
            *SMALL)
    assert r.returncode == 0, r.stderr
    assert "RealAI score" in r.stdout and f"wrote {gif}: 6 frames at 10 fps" in r.stdout
    shots = frames(gif)
    assert len(shots) == 6 and pole_row(shots[0]) > 0.5


@pytest.mark.parametrize("args,message", [
    (["eval", "--controller", "lqr", "--system", "pendulum", "--video", "x.txt"],
     "give a .gif or .mp4"),
    (["eval", "--controller", "lqr", "--system", "double_pendulum", "--score", "realaigym",
      "--video", "x.txt"], "give a .gif or .mp4"),
    (["eval", "--controller", "lqr", "--system", "double_pendulum", "--robustness",
      "realaigym", "--video", "x.gif"], "drop --robustness"),
    (["eval", "--controller", "lqr", "--system", "pendulum", "--video", "no/such/x.gif"],
     "does not exist"),
    (["eval", "--controller", "lqr", "--system", "pendulum", "--video", "x.gif",
      "--video-episodes", "a"], "episode numbers"),
    (["replay", "missing.csv", "--video", "x.gif"], "no telemetry file"),
    (["replay", "missing.csv"], "--video"),
])
def test_bad_video_options_are_one_line_errors(tmp_path, args, message):
    r = cli(*args, cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "x.gif").exists()


@pytest.mark.skipif(shutil.which("ffmpeg") is not None, reason="ffmpeg is installed here")
def test_an_mp4_without_ffmpeg_says_so(tmp_path):
    r = cli("eval", "--controller", "lqr", "--system", "pendulum", "--video", "x.mp4",
            cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and "needs ffmpeg" in r.stderr


@pytest.mark.parametrize("preset", ["acrobot", "pendubot"])
def test_double_pendulum_frames_put_the_links_where_the_angles_say(preset):
    """The second link (red) of the drawn double pendulum against its
    forward kinematics: every red pixel lies on the elbow-to-tip segment
    (within the link's half-width) and the red reaches the tip, for link
    angles around the circle; the dark motor disc sits on the actuated joint
    (the elbow for the acrobot, the shoulder for the pendubot)."""
    from grpo_ctrl.plant_file import nominal_params
    spec = plant_spec("double_pendulum", preset)
    p = nominal_params(spec)
    size = 400
    scale = size / (2 * 1.3 * (p["l1"] + p["l2"]))
    half = 0.04 * (p["l1"] + p["l2"]) * scale  # the links' half-width in pixels
    for th1, th2 in [(0.0, 0.0), (math.pi, 0.0), (math.pi / 2, 0.0), (-math.pi / 2, math.pi / 2),
                     (0.7, -2.0), (2.5, 1.0)]:
        img = render.frame(spec, [th1, th2, 0.0, 0.0], 0.0, size)
        red = (img[..., 0] > 150) & (img[..., 1] < 120) & (img[..., 2] < 120)
        ex, ey = -p["l1"] * math.sin(th1), p["l1"] * math.cos(th1)
        tx, ty = ex - p["l2"] * math.sin(th1 + th2), ey + p["l2"] * math.cos(th1 + th2)
        (ec, er), (tc, tr) = [(size / 2 + scale * x, size / 2 - scale * y)
                              for x, y in ((ex, ey), (tx, ty))]
        rows, cols = np.nonzero(red)
        cols, rows = cols + 0.5, rows + 0.5
        dc, dr = tc - ec, tr - er
        s_ = np.clip(((cols - ec) * dc + (rows - er) * dr) / (dc * dc + dr * dr), 0, 1)
        off = np.hypot(cols - ec - s_ * dc, rows - er - s_ * dr)
        assert off.max() < half + 1.5, (th1, th2, off.max())
        assert np.hypot(cols - tc, rows - tr).min() < 1.5 and s_.max() == 1.0, (th1, th2)
        motor = (0.0, 0.0) if preset == "pendubot" else (ex, ey)
        r, c = int(size / 2 - scale * motor[1]), int(size / 2 + scale * motor[0])
        assert (img[r, c] < 80).all(), (th1, th2, img[r, c])
