"""RealAIGym's double pendulum robustness benchmark v2 (grpo_ctrl.realaigym_double):
its grids equal theirs (leaderboard/<robot>/robustness_v2/benchmark_controller.py),
each perturbation does what their simulator does, controllers whose results can be
predicted by hand score as predicted, and the categories average as theirs; the CLI.

Their repository ships no robustness results (no benchmark_results.pkl or scores.yml
of any entry), so no published entry is reproduced here."""
import numpy as np
import pytest

from grpo_ctrl import realaigym_double as R
from grpo_ctrl.cli import main
from grpo_ctrl.sim import BatchSim

UPRIGHT = (0.0, 0.0, 0.0, 0.0)


def nominal(preset="acrobot"):
    return {k: float(v[0]) for k, v in BatchSim("double_pendulum", 1, preset).plant().items()}


# ----------------------------------------------------------------- the grids


@pytest.mark.parametrize("preset", ["acrobot", "pendubot"])
def test_the_grids_are_theirs(preset):
    g, p = R.grids(preset), nominal(preset)
    assert list(g["model"]) == ["Ir", "m1r1", "I1", "b1", "cf1", "m2r2", "m2", "I2", "b2", "cf2"]
    for values in [*g["model"].values(), *(g[c] for c in R.CATEGORIES[1:-1])]:
        assert len(values) == 21 and np.all(np.diff(values) > 0)
    ends = {k: (v[0], v[-1]) for k, v in g["model"].items()}
    assert ends["Ir"] == (0.0, 1e-4)
    assert ends["b1"] == ends["b2"] == (-0.1, 0.1) and ends["cf1"] == ends["cf2"] == (-0.2, 0.2)
    for name, base in [("m1r1", p["m1"] * p["r1"]), ("I1", p["I1"]), ("m2r2", p["m2"] * p["r2"]),
                       ("m2", p["m2"]), ("I2", p["I2"])]:
        np.testing.assert_allclose(ends[name], (0.75 * base, 1.25 * base), rtol=1e-15)
        assert g["model"][name][10] == pytest.approx(base, rel=1e-15)
    assert (g["velocity_noise"][[0, -1]] == [0, 0.5]).all()
    assert (g["torque_noise"][[0, -1]] == [0, 1.1]).all()
    assert (g["torque_response"][[0, 10, -1]] == [0.1, 1.05, 2.0]).all()
    assert (g["delay"][[0, 1, -1]] == [0, 0.002, 0.04]).all()


def test_a_preset_enters_its_robots_leaderboard():
    assert [R.robot_of(p) for p in ("acrobot", "acrobot-real", "pendubot", "pendubot-real")] == [
        "acrobot", "acrobot", "pendubot", "pendubot"]
    with pytest.raises(ValueError, match="preset"):
        R.robot_of("gym")


def test_the_722_runs_carry_their_settings():
    runs, where = R.benchmark_runs("acrobot")
    p = nominal()
    sizes = {c: w.size for c, w in where.items()}
    assert sizes == {"model": 210, "velocity_noise": 210, "torque_noise": 210,
                     "torque_response": 21, "delay": 21, "perturbation": 50}
    assert runs.delay.size == 722 and np.array_equal(np.sort(np.concatenate(
        [w.ravel() for w in where.values()])), np.arange(722))
    # m1 r1 moves r1 (m1 kept), m2 r2 moves r2; every other run keeps the nominal plant
    m1r1, m2r2, m2 = (where["model"][R.MODEL_PARAMS.index(k)] for k in ("m1r1", "m2r2", "m2"))
    np.testing.assert_allclose(runs.params["r1"][m1r1[[0, -1]]], [0.75 * p["r1"], 1.25 * p["r1"]])
    np.testing.assert_allclose(runs.params["r2"][m2r2[[0, -1]]], [0.75 * p["r2"], 1.25 * p["r2"]])
    assert (runs.params["m2"][m2r2] == p["m2"]).all()
    np.testing.assert_allclose(runs.params["m2"][m2[[0, -1]]], [0.75 * p["m2"], 1.25 * p["m2"]])
    others = np.setdiff1d(np.arange(722), where["model"])
    for name, v in runs.params.items():
        assert (v[others] == p[name]).all(), name
    # their int(delay / dt) + 1 samples back: 0 to 20 steps
    assert runs.delay[where["delay"]].tolist() == list(range(21))
    assert (runs.vel_sigma[where["velocity_noise"][-1]] == 0.5).all()
    assert (runs.u_sigma[where["torque_noise"][3]] == pytest.approx(3 * 1.1 / 20))
    # every perturbation run has pulses, no other run has any
    assert (np.abs(runs.push[where["perturbation"]]).max(axis=1) > 0.49).all()
    assert not runs.push[others[others < where["perturbation"][0]]].any()


def test_pulses_follow_their_definition():
    rng = np.random.default_rng(1)
    dt = 0.002
    for _ in range(20):
        push = R.draw_pushes(rng, 5000, dt)
        assert push.shape == (2, 5000)
        peaks = []
        for joint in range(2):
            a = np.abs(push[joint])
            inner = np.nonzero((a[1:-1] > a[:-2]) & (a[1:-1] >= a[2:]) & (a[1:-1] > 0.1))[0] + 1
            assert len(inner) == 3          # three pulses a joint
            peaks += [(i * dt, a[i]) for i in inner]
        t, height = np.array(sorted(peaks)).T
        # six centres: the first 1 to 1.5 s in, each next one 1 to 1.5 s later
        assert 1 - dt <= t[0] <= 1.5 + dt
        assert np.all((np.diff(t) >= 1 - dt) & (np.diff(t) <= 1.5 + dt))
        assert np.all((height >= 0.5 * 0.999) & (height <= 5.0))
        assert np.abs(push[:, :250]).max() < 1e-6   # nothing in the first half second


# ----------------------------------------------------------------- each perturbation


def test_a_delay_of_k_steps_shows_the_state_k_steps_old():
    runs = R.Runs.nominal(21, 200)
    runs.delay[:] = np.arange(21)
    x0 = (np.pi - 0.5, 0.3, 1.0, -2.0)
    seen = []

    def policy(obs):
        seen.append(obs.copy())
        return 0.1 * obs[:, 4].astype(float)   # the measured shoulder velocity
    _, xs, us = R.run_perturbed(policy, "acrobot", runs, x0, record=True)
    seen = np.array(seen)
    for k in range(200):
        old = xs[np.maximum(k - np.arange(21), 0), np.arange(21)]
        np.testing.assert_array_equal(seen[k][:, 4], old[:, 2].astype(np.float32))
        np.testing.assert_array_equal(seen[k][:, 5], old[:, 3].astype(np.float32))
        np.testing.assert_array_equal(seen[k][:, 0], np.cos(old[:, 0]).astype(np.float32))
    np.testing.assert_allclose(us, 0.1 * seen[:, :, 4].astype(float), rtol=1e-15, atol=1e-17)
    # different delays, different runs; the first `delay` steps see the start state
    assert np.abs(xs[-1, 0] - xs[-1, 20]).max() > 1e-3
    assert (seen[:20, 20, 4] == np.float32(1.0)).all()


def test_the_motor_response_lags_or_overshoots_as_their_formula():
    runs = R.Runs.nominal(3, 50)
    runs.response[:] = [0.1, 1.0, 2.0]
    _, _, us = R.run_perturbed(lambda obs: np.full(len(obs), 2.0), "acrobot", runs,
                               record=True)
    k = np.arange(50)
    np.testing.assert_allclose(us[:, 0], 2 * (1 - 0.9 ** (k + 1)), rtol=1e-13)
    assert (us[:, 1] == 2.0).all()
    # tau = last + 2 (2 - last): 4, 0, 4, 0, ...
    np.testing.assert_allclose(us[:, 2], np.where(k % 2 == 0, 4.0, 0.0), atol=1e-13)


def test_noise_on_the_measured_velocities_and_on_the_torque():
    runs = R.Runs.nominal(2, 5000)
    runs.vel_sigma[0] = 0.5
    runs.u_sigma[1] = 1.1
    seen = []

    def policy(obs):
        seen.append(obs.copy())
        return np.zeros(len(obs))
    _, xs, us = R.run_perturbed(policy, "acrobot", runs, record=True)
    seen = np.array(seen)
    # run 0: hangs still (no torque; sin(pi) is 1.2e-16); its measured velocities are noise
    assert (us[:, 0] == 0).all() and np.abs(xs[:, 0] - R.HANGING).max() < 1e-12
    assert seen[:, 0, 4:].std() == pytest.approx(0.5, rel=0.03)
    np.testing.assert_allclose(seen[:, 0, :4], np.broadcast_to([-1, 0, 1, 0], (5000, 4)),
                               atol=1e-7)   # the angles are measured exactly
    # run 1: its velocities are measured exactly; its torque is noise of std 1.1
    np.testing.assert_array_equal(seen[:, 1, 4:], xs[:-1, 1, 2:].astype(np.float32))
    assert us[:, 1].std() == pytest.approx(1.1, rel=0.03) and abs(us[:, 1].mean()) < 0.05


def test_pulses_add_to_the_clipped_command_at_their_index():
    runs = R.Runs.nominal(1, 5000)
    runs.push[0] = R.draw_pushes(np.random.default_rng(3), 5000)[1]
    _, _, us = R.run_perturbed(lambda obs: np.full(len(obs), 9.0), "acrobot", runs, record=True)
    # their index int(t / dt) of a time summed step by step lags the step from step 1007 on
    np.testing.assert_allclose(us[:1007, 0], 6.0 + runs.push[0, :1007], rtol=1e-15)
    np.testing.assert_allclose(us[1007:1010, 0], 6.0 + runs.push[0, 1006:1009], rtol=1e-15)
    assert us[:, 0].max() > 6.4   # the pulse goes beyond the motor's limit


def test_a_policy_that_answers_nan_gives_that_run_no_torque_and_stops_nothing():
    def policy(obs):
        u = np.zeros(len(obs))
        u[0] = np.nan
        return u
    runs = R.Runs.nominal(2, 100)
    x = R.run_perturbed(policy, "pendubot", runs, x0=UPRIGHT)
    assert R.upright(x).tolist() == [True, True]       # no torque at upright: it stays
    x = R.run_perturbed(lambda obs: np.full(len(obs), np.inf), "pendubot", runs)
    assert np.isfinite(x).all()                        # +inf clips to the limit
    # a damping of -50 N m s blows the first run up (it fails); the second swings on
    runs = R.Runs.nominal(2, 5000)
    runs.params = {"b1": np.array([-50.0, 0.0])}
    x = R.run_perturbed(lambda obs: np.zeros(len(obs)), "pendubot", runs, x0=(3.0, 0, 1.0, 0))
    assert not np.isfinite(x[0]).all() and np.isfinite(x[1]).all()
    assert not R.upright(x).any()


def test_an_unperturbed_run_is_the_benchmark_simulation():
    def policy(obs):
        return 3.0 * obs[:, 1].astype(float) - 0.5 * obs[:, 5]
    (tr,) = R.simulate(policy, "pendubot")
    _, xs, us = R.run_perturbed(policy, "pendubot", R.Runs.nominal(1), record=True)
    np.testing.assert_array_equal(xs[:5000, 0, :2], tr.q)
    np.testing.assert_array_equal(xs[:5000, 0, 2:], tr.qd)
    np.testing.assert_array_equal(np.float32(us[:, 0]), tr.tau[:, 0])


# ----------------------------------------------------------------- scores


def test_doing_nothing_fails_every_run_from_hanging():
    r = R.robustness(lambda obs: np.zeros(len(obs)), "acrobot")
    assert not any(s.any() for s in r.successes.values())
    assert r.score == 0.0


def test_doing_nothing_at_upright_scores_as_predicted():
    """Upright at rest is an equilibrium of every varied plant and stays exact
    without torque; only torque noise (all but sigma 0) and the pulses move it."""
    r = R.robustness(lambda obs: np.zeros(len(obs)), "pendubot", x0=UPRIGHT)
    s = r.scores()
    assert s == {"model": 1.0, "velocity_noise": 1.0, "torque_noise": 1 / 21,
                 "torque_response": 1.0, "delay": 1.0, "perturbation": 0.0}
    assert r.successes["torque_noise"][0].all() and not r.successes["torque_noise"][1:].any()
    assert r.score == pytest.approx((4 + 1 / 21) / 6, rel=1e-15)


def test_lqr_from_upright_holds_every_model_delay_and_response():
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    from grpo_ctrl.baselines.lqr import make_lqr
    for preset in ("acrobot", "pendubot"):
        r = R.robustness(R.controller_policy(make_lqr("double_pendulum", preset)), preset,
                         x0=UPRIGHT)
        s = r.scores()
        assert s["model"] == s["delay"] == s["torque_response"] == s["torque_noise"] == 1.0


def test_the_categories_average_as_theirs():
    z = np.zeros
    s = {"model": z((10, 21), bool), "velocity_noise": z((21, 10), bool),
         "torque_noise": z((21, 10), bool), "torque_response": z(21, bool),
         "delay": z(21, bool), "perturbation": z(50, bool)}
    s["model"][:, :7] = True                  # 70 of 210
    s["velocity_noise"][0, :6] = True         # 6 of 10: counts
    s["velocity_noise"][1, :5] = True         # 5 of 10: does not (more than half needed)
    s["torque_noise"][:, :6] = True           # every value
    s["delay"][:3] = True
    s["perturbation"][:10] = True
    r = R.Robustness("acrobot", s)
    want = {"model": 1 / 3, "velocity_noise": 1 / 21, "torque_noise": 1.0,
            "torque_response": 0.0, "delay": 3 / 21, "perturbation": 0.2}
    assert r.scores() == pytest.approx(want, rel=1e-15)
    assert r.score == pytest.approx(sum(want.values()) / 6, rel=1e-15)


@pytest.mark.parametrize("robot", ["acrobot", "pendubot"])
def test_their_published_rows_fit_our_category_sizes_and_average(robot):
    """Every published percentage is a whole number of our runs or grid values
    (model k/210, the noises, response and delay k/21, perturbations k/50), and
    those counts, scored by ``Robustness``, give the published overall score."""
    sizes = (210, 21, 21, 21, 21, 50)
    assert R.PUBLISHED_TOPS[(robot, "robustness_v2")][1] == max(
        row[6] for row in R.PUBLISHED_ROBUSTNESS[robot].values())
    for name, row in R.PUBLISHED_ROBUSTNESS[robot].items():
        counts = [round(pct / 100 * n) for pct, n in zip(row[:6], sizes)]
        assert all(abs(100 * k / n - pct) <= 0.05 + 1e-9
                   for k, n, pct in zip(counts, sizes, row[:6])), name
        model = np.arange(210).reshape(10, 21) < counts[0]
        noise = [np.tile(np.arange(10) < 6, (21, 1)) & (np.arange(21) < k)[:, None]
                 for k in counts[1:3]]
        flags = [np.arange(n) < k for k, n in zip(counts[3:], sizes[3:])]
        r = R.Robustness(robot, dict(zip(R.CATEGORIES, [model, *noise, *flags])))
        assert round(r.score, 3) == row[6], name


def test_success_is_their_wrapped_final_state():
    x = np.array([[0.3, -0.3, 0.9, -0.9], [2 * np.pi + 0.3, 2 * np.pi - 0.3, 0, 0],
                  [0.36, 0, 0, 0], [0, 0.36, 0, 0], [0, 0, 1.01, 0], [np.pi, 0, 0, 0]])
    assert R.upright(x).tolist() == [True, True, False, False, False, False]


# ----------------------------------------------------------------- the CLI


def test_cli_scores_the_lqr_baseline_beside_the_published_tops(capsys):
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    assert main(["eval", "--controller", "lqr", "--system", "double_pendulum", "--preset",
                 "pendubot", "--score", "realaigym", "--robustness", "realaigym"]) == 0
    out = capsys.readouterr().out
    assert "History-SAC*" in out and "AR-EAPO*" in out
    rows = {line.split("  ")[0]: line.split()[-2:] for line in out.splitlines()}
    assert set(R.TITLES.values()) <= set(rows)
    # an LQR does not swing up from hanging; the published top beside it
    assert rows["RealAI score"] == ["0.000", "0.682"]
    ours, top = (float(v) for v in rows["robustness score"])
    assert 0 <= ours < 0.1 and top == 0.913
    assert rows["Perturbations"] == ["0.0", "98.0"]


def test_cli_refuses_episodes_for_the_double_pendulum(capsys):
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    assert main(["eval", "--controller", "lqr", "--system", "double_pendulum", "--preset",
                 "acrobot", "--robustness", "realaigym", "--episodes", "3"]) == 2
    err = capsys.readouterr().err
    assert "--episodes" in err and len(err.strip().splitlines()) == 1
