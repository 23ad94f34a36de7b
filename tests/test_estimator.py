"""The model estimator (``grpo_ctrl/estimator.py``) against
the plant it estimates: exact on exact measurements, its error's decay the
discrete loop's own recursion, and from 4096-count encoders far closer to
the true velocities than the device's filtered differences."""
import math

import numpy as np
import pytest

from grpo_ctrl.errors import UserError
from grpo_ctrl.estimator import ModelEstimator
from grpo_ctrl.plant import Observer, plant_spec, presets, state_of_observation
from grpo_ctrl.sim import BatchSim

PERIOD = 0.002                  # s, the double pendulum's 500 Hz
ACROBOT = plant_spec("double_pendulum", "acrobot")
HANGING = np.array([math.pi, 0.0, 0.0, 0.0])
COUNT = 2 * math.pi / 4096      # rad, one count of the HIL's encoders


def tick_us(k):
    return 1000 + round(PERIOD * 1e6) * k


def test_exact_measurements_give_the_plant_state_bit_for_bit_across_missed_states():
    """Fed the plant's own states and the torques applied, the prediction is
    the plant: every residual is 0 and the estimate equals the state, also
    where a STATE is missing (two ticks predicted with the torque held)."""
    plant = BatchSim("double_pendulum", 1, "acrobot")
    plant.set_state({"x": np.array([[2.0, -0.5, 1.0, -2.0]])})
    estimator = ModelEstimator(ACROBOT, PERIOD, 10.0)
    rng = np.random.default_rng(0)
    u, compared, moved = 0.0, 0, 0.0
    for k in range(2000):
        missed = k % 5 == 3                 # the host never sees this tick's STATE
        if k % 7 == 0 and not missed:       # a new torque only where the host sees it
            u = float(rng.uniform(-6, 6))
        x = plant.get_state()["x"][0]
        if not missed:
            np.testing.assert_array_equal(estimator.update(x.copy(), tick_us(k), u), x)
            compared += 1
        moved = max(moved, abs(x[3]))
        plant.step(np.array([u], np.float32))
    assert compared == 1600 and moved > 10.0   # a large, fast motion, not a rest


@pytest.mark.parametrize("system,preset", [(s, p) for s in ("pendulum", "cartpole", "furuta",
                                                               "double_pendulum")
                                            for p in presets(s)])
def test_every_plant_is_estimated_exactly_from_exact_measurements(system, preset):
    """Each preset's estimator (its channels, its period) is its plant on
    exact measurements, from a random start under random commands."""
    spec = plant_spec(system, preset)
    plant = BatchSim(system, 1, preset)
    plant.reset(seed=1)
    estimator = ModelEstimator(spec, spec.dt, 0.1 / (2 * math.pi * spec.dt))
    rng = np.random.default_rng(0)
    for k in range(300):
        u = float(rng.uniform(-spec.u_max, spec.u_max))
        x = plant.get_state()["x"][0]
        np.testing.assert_array_equal(estimator.update(x.copy(), round(spec.dt * 1e6) * k, u), x)
        plant.step(np.array([u], np.float32))


@pytest.mark.parametrize("bandwidth", [5.0, 10.0, 20.0])
def test_a_wrong_velocity_decays_as_the_discrete_loop_says(bandwidth):
    """Started 1 rad/s off on both velocities at the hanging rest, with exact
    positions from then on, the error (position, velocity, unexplained
    acceleration) follows the loop's recursion per tick, to within what
    gravity's coupling adds (measured: 0.0003-0.007): the prediction
    P = [[1, T, T^2/2], [0, 1, T], [0, 0, 1]], then the correction by the
    predicted position's error with gains (3 w T, 3 w^2 T, w^3 T)."""
    w, T = 2 * math.pi * bandwidth, PERIOD
    estimator = ModelEstimator(ACROBOT, T, bandwidth)
    estimator.update(HANGING + [0.0, 0.0, 1.0, 1.0], tick_us(0), 0.0)
    predict = np.array([[1, T, T * T / 2], [0, 1, T], [0, 0, 1]])
    step = (np.eye(3) - np.outer([3 * w * T, 3 * w * w * T, w ** 3 * T], [1, 0, 0])) @ predict
    e = np.array([0.0, 1.0, 0.0])
    worst = 0.0
    for k in range(1, 300):
        x = estimator.update(HANGING.copy(), tick_us(k), 0.0)
        e = step @ e
        worst = max(worst, abs(x[0] - math.pi - e[0]), abs(x[2] - e[1]), abs(x[3] - e[1]))
    assert worst < 0.01
    assert abs(x[2]) < 1e-4 and abs(x[3]) < 1e-4   # 0.6 s: gone


def device_velocity(counts, prev_counts, v, cutoff_hz=20.0):
    """The device's estimate (fw_core.c): the counts' difference per second
    through a first-order low-pass."""
    alpha = 1 - math.exp(-2 * math.pi * cutoff_hz * PERIOD)
    return v + alpha * ((counts - prev_counts) * COUNT / PERIOD - v)


def test_from_encoder_counts_it_beats_the_devices_filtered_differences():
    """The acrobot swung by a 1.5 Hz torque (velocities of 14-20 rad/s rms)
    and measured by 4096-count encoders: the estimate's velocity error is
    0.015 rad/s rms at 10 Hz, the device filter's (20 Hz) 1.4-2.0."""
    plant = BatchSim("double_pendulum", 1, "acrobot")
    plant.set_state({"x": HANGING[None]})
    estimator = ModelEstimator(ACROBOT, PERIOD, 10.0)
    counts = prev = None
    v_device = np.zeros(2)
    ours, device, speed = [], [], []
    for k in range(2500):
        u = 3.0 * math.sin(2 * math.pi * 1.5 * k * PERIOD)
        x = plant.get_state()["x"][0]
        counts = np.round(x[:2] / COUNT)
        if prev is not None:
            v_device = device_velocity(counts, prev, v_device)
        prev = counts
        estimate = estimator.update(np.concatenate([counts * COUNT, v_device]), tick_us(k), u)
        if k >= 250:  # after the first 0.5 s
            ours.append(estimate[2:] - x[2:])
            device.append(v_device - x[2:])
            speed.append(x[2:])
        plant.step(np.array([u], np.float32))

    def rms(a):
        return np.sqrt(np.mean(np.square(a), axis=0))
    assert np.all(rms(speed) > 10.0)
    assert np.all(rms(ours) < 0.03)
    assert np.all(rms(device) > 50 * rms(ours))


def test_it_predicts_with_the_fitted_plant_it_is_given():
    """On the real-hardware plant (friction, the motor's inertia), the
    estimator of that plant is exact and the nominal model's is not."""
    from grpo_ctrl.plant_file import PlantValues, nominal_params
    real = plant_spec("double_pendulum", "acrobot-real")
    plant = BatchSim("double_pendulum", 1, "acrobot-real")
    plant.set_state({"x": HANGING[None]})
    fitted = ModelEstimator(ACROBOT, PERIOD, 10.0, PlantValues(nominal_params(real)))
    nominal = ModelEstimator(ACROBOT, PERIOD, 10.0)
    worst_fitted = worst_nominal = 0.0
    for k in range(1000):
        u = 3.0 * math.sin(2 * math.pi * 1.5 * k * PERIOD)
        x = plant.get_state()["x"][0]
        worst_fitted = max(worst_fitted, np.max(np.abs(fitted.update(x.copy(), tick_us(k), u) - x)))
        worst_nominal = max(worst_nominal,
                            np.max(np.abs(nominal.update(x.copy(), tick_us(k), u) - x)))
        plant.step(np.array([u], np.float32))
    assert worst_fitted < 1e-9 and worst_nominal > 0.1


@pytest.mark.parametrize("bandwidth", [0.0, -1.0, 40.0, math.nan])
def test_a_bandwidth_the_loop_cannot_take_is_refused_naming_the_limit(bandwidth):
    with pytest.raises(UserError, match=r"at most 39 Hz for a 2 ms period"):
        ModelEstimator(ACROBOT, PERIOD, bandwidth)


def test_a_repeated_state_changes_nothing_and_a_stall_or_a_reset_clock_restarts():
    estimator = ModelEstimator(ACROBOT, PERIOD, 10.0)
    first = estimator.update(HANGING + [0, 0, 0.5, 0.0], tick_us(0), 1.0)
    after = estimator.update(HANGING.copy(), tick_us(1), 1.0)
    assert not np.array_equal(after, first)
    np.testing.assert_array_equal(estimator.update(HANGING + 0.3, tick_us(1), 1.0), after)
    # 60 ticks of silence (more than MAX_GAP_TICKS): the device's own state again
    device = HANGING + [0.1, 0.2, 0.3, 0.4]
    np.testing.assert_array_equal(estimator.update(device.copy(), tick_us(61), 0.0), device)
    # and a clock gone back (a device that restarted)
    estimator.update(HANGING.copy(), tick_us(62), 0.0)
    np.testing.assert_array_equal(estimator.update(device.copy(), tick_us(3), 0.0), device)


def late_tick_times(n: int, every: int = 100, late_us: int = 5400, after_us: int = 50):
    """The times a loaded host's HIL stamps its ticks at: on its schedule
    (tick_us), except that every ``every``-th runs ``late_us`` late (2.7
    periods) and those it then owes run at once, ``after_us`` apart. Its
    plant steps once a tick whatever the time."""
    t = []
    for k in range(n):
        due = tick_us(k) + (late_us if k % every == every // 2 else 0)
        t.append(max(due, t[-1] + after_us) if t else due)
    return t


def test_late_ticks_counted_by_the_caller_keep_the_estimate_the_plant():
    """Fed exact measurements at such times with the ticks counted (the run
    loop counts them by the STATEs' sequence numbers), the estimate is the
    plant bit for bit; counted from the times (a late tick two, the next none),
    its velocities are off by more than a count a period (here up to 4 rad/s;
    tests/test_hil_double_pendulum.py saw 0.28 rad/s rms over a 3 s flight on a
    loaded host, where counted they stay within 0.005)."""
    plant = BatchSim("double_pendulum", 1, "acrobot")
    plant.set_state({"x": np.array([[2.0, -0.5, 1.0, -2.0]])})
    counted = ModelEstimator(ACROBOT, PERIOD, 5.0)
    timed = ModelEstimator(ACROBOT, PERIOD, 5.0)
    times = late_tick_times(1000)
    assert sum(round((b - a) / (PERIOD * 1e6)) != 1 for a, b in zip(times, times[1:])) >= 20
    rng = np.random.default_rng(0)
    worst = 0.0
    for k, t_us in enumerate(times):
        u = float(rng.uniform(-6, 6)) if k % 7 == 0 else u
        x = plant.get_state()["x"][0]
        ticks = None if k == 0 else 1
        np.testing.assert_array_equal(counted.update(x.copy(), t_us, u, ticks), x)
        worst = max(worst, float(np.max(np.abs(timed.update(x.copy(), t_us, u)[2:] - x[2:]))))
        plant.step(np.array([u], np.float32))
    assert worst > COUNT / PERIOD   # one count a period: 0.77 rad/s


def test_the_run_loop_counts_the_ticks_between_states_by_their_sequence():
    """The loop gives the observation each STATE's ticks since the last: its
    sequence number's step, less the other frames between (a STATUS, an
    ACK, one that fails to decode); a frame the line lost counts as a tick.
    The STATEs' times are not consulted: here they are all late."""
    import threading
    from types import SimpleNamespace

    from grpo_ctrl.firmware_bridge import protocol as P
    from grpo_ctrl.firmware_bridge.loop import ControlLoop

    class Rows:
        def write(self, row):
            pass

    class Features:
        def __init__(self):
            self.ticks = []

        def __call__(self, s, ticks=None):
            self.ticks.append(ticks)
            return np.zeros(6)

        def angle(self, obs):
            return 0.0

    info = SimpleNamespace(period_us=2000, watchdog_us=4000, n_channels=2)
    loop = ControlLoop(None, info, Features(), None, Rows(), threading.Event())

    def state(seq):   # 3.1 ms apart: by the time, two ticks each
        s = P.State(7_000_000 + 3_100 * seq, 0, P.LATENCY_UNKNOWN, 0.0, 0, 0, 0, pos=(0, 0),
                    vel=(0, 0))
        return P.Frame(P.State.TYPE, seq, s.pack())

    def ack(seq):
        return P.Frame(P.Ack.TYPE, seq, P.Ack(0x02, 5, 0, 0).pack())

    def status(seq):   # fails to decode: still a frame of its own
        return P.Frame(P.Status.TYPE, seq, b"")

    for f in (state(10), state(11), ack(12), state(13), status(14), ack(15), state(16),
              state(18), state(19)):   # 17: lost in the line
        loop.take(f, 0.0, answer=False)
    assert loop.features.ticks == [None, 1, 1, 1, 2, 1]


# ------------------------------------------------- a benchmark policy on the estimate


@pytest.mark.parametrize("system,preset", [(s, p) for s in ("pendulum", "cartpole", "furuta",
                                                               "double_pendulum")
                                            for p in presets(s)])
def test_the_state_of_an_observation_is_the_observed_state(system, preset):
    spec = plant_spec(system, preset)
    observe = Observer(spec)
    x = np.random.default_rng(0).uniform(-3, 3, (50, spec.nx))
    back = state_of_observation(spec, np.array([observe(row) for row in x]))
    d = back - x
    angles = np.array(spec.angles)
    d[:, angles] = (d[:, angles] + math.pi) % (2 * math.pi) - math.pi   # whole turns apart
    assert np.max(np.abs(d)) < 1e-6                                      # float32's rounding


def lqr_runs(sigma, n=20, steps=2500):
    from grpo_ctrl import realaigym_double as R
    runs = R.Runs.nominal(n, steps)
    runs.vel_sigma[:] = sigma
    return runs


def test_on_exact_measurements_the_estimated_policy_flies_as_the_policy():
    """RealAIGym's loop, no perturbation, the acrobot's LQR from 0.02 rad off
    upright: the same trajectory to float32's rounding of the observation."""
    from grpo_ctrl import realaigym_double as R
    from grpo_ctrl.controller import load_controller
    lqr = load_controller("lqr", "double_pendulum", "acrobot")
    x0 = (0.02, -0.02, 0.0, 0.0)
    _, plain, _ = R.run_perturbed(R.controller_policy(lqr), "acrobot", lqr_runs(0, 2, 1000), x0,
                                  record=True)
    _, ours, _ = R.run_perturbed(R.controller_policy(lqr, 20.0), "acrobot", lqr_runs(0, 2, 1000),
                                 x0, record=True)
    assert np.max(np.abs(ours - plain)) < 1e-4
    assert np.max(np.abs(plain[:, :, :2])) < 0.3     # and the LQR held it (0.24 at most)


def test_the_estimated_policy_holds_through_noise_on_the_measured_velocities():
    """The acrobot's LQR from 0.02 rad off upright, 5 s, RealAIGym's velocity
    noise of 0.3 rad/s on both measured velocities (20 runs): 2 of 20 held
    on the measurements (measured), all on the estimate."""
    from grpo_ctrl import realaigym_double as R
    from grpo_ctrl.controller import load_controller
    lqr = load_controller("lqr", "double_pendulum", "acrobot")
    x0 = (0.02, -0.02, 0.0, 0.0)
    plain = R.upright(R.run_perturbed(R.controller_policy(lqr), "acrobot", lqr_runs(0.3), x0,
                                      seed=1))
    ours = R.upright(R.run_perturbed(R.controller_policy(lqr, 20.0), "acrobot", lqr_runs(0.3), x0,
                                     seed=1))
    assert plain.mean() <= 0.3 and ours.all()


def test_eval_estimator_refusals_are_one_line(capsys):
    from grpo_ctrl.cli import main
    for argv, why in [(["--system", "double_pendulum", "--preset", "acrobot"], "--score realaigym"),
                      (["--system", "double_pendulum", "--preset", "acrobot", "--score",
                        "realaigym", "--estimator", "100"], "at most 39 Hz"),
                      (["--system", "pendulum", "--preset", "realaigym", "--score", "realaigym"],
                       "single pendulum")]:
        extra = [] if "--estimator" in argv else ["--estimator", "10"]
        assert main(["eval", "--controller", "lqr", *argv, *extra]) == 2
        err = capsys.readouterr().err
        assert why in err and len(err.strip().splitlines()) == 1, err


# ------------------------------------------------- over serial, the other plants


@pytest.mark.parametrize("system,preset,controller", [
    ("pendulum", "rig", "grpo"),              # tests/data's trained rig policy, 200 Hz
    ("furuta", "qube-servo2", "swingup-lqr"),  # the exported swing-up + LQR, 500 Hz
])
def test_run_swings_up_on_the_estimate_over_the_hil(system, preset, controller, tmp_path,
                                                   tmp_path_factory):
    """``grpo-ctrl run --estimator 5`` over the HIL's pty, 10 s from hanging,
    on the single pendulum and the Furuta pendulum: upright at the end as on
    the device's velocities (measured: within 0.002 / 0.003 rad)."""
    from pathlib import Path

    from conftest import export_baseline
    from grpo_ctrl.firmware_bridge.hil import HilConfig, serve_hil
    from test_run import START, armed_span, grpo_run, summary_of, wrapped
    policy = (Path(__file__).parent / "data" / "pendulum-rig-grpo.onnx" if controller == "grpo"
              else export_baseline(tmp_path_factory, controller, system, preset))
    config = HilConfig(system=system, preset=preset, angle0=math.pi, hold_until_armed=True,
                       watchdog_ms=START["watchdog_ms"])
    with serve_hil(config) as hil:
        r = grpo_run(hil.port, policy, 10, tmp_path / "run.csv", "--quiet", "--estimator", "5")
        trace = hil.trace()
    assert r.returncode == 0, r.stderr
    assert summary_of(r)["estimator_hz"] == 5.0
    armed, span = armed_span(trace)
    assert span >= 9.9
    spec = plant_spec(system, preset)
    t, pole = trace["t"][armed], trace["x"][armed][:, spec.pole_angle]
    assert wrapped(pole[0]) > 3.0                          # it started hanging
    assert np.max(wrapped(pole[t >= t[-1] - 1.0])) < 0.05  # and is upright at the end
