"""RealAIGym's simple-pendulum score, its published entries reproduced with our
implementations of their controllers on the realaigym preset, and the CLI."""
import math

import numpy as np
import pytest

from grpo_ctrl import realaigym as R
from grpo_ctrl.cli import main


def test_criteria_of_a_hand_made_trajectory():
    t = np.array([0.01, 0.02, 0.03, 0.04])
    q = np.array([1.0, 2.0, math.pi + 0.01, math.pi - 0.01])
    qd = np.array([3.0, 1.0, 0.1, 0.0])
    tau = np.array([1.0, -2.0, 0.5, 0.0])
    c = R.criteria(R.Trajectory(t, q, qd, tau))
    # the samples but the last, each over its dt of 0.01 s
    assert c["max_tau"] == 2.0
    assert c["energy"] == pytest.approx(abs(1.0 * 1.0) + abs(-2.0 * (math.pi + 0.01 - 2.0))
                                        + abs(0.5 * -0.02))
    assert c["integ_tau"] == pytest.approx(0.01 * 3.5)
    assert c["tau_cost"] == pytest.approx(0.01 * (1 + 4 + 0.25))
    assert c["velocity_cost"] == pytest.approx(0.01 * (9 + 1 + 0.01))
    assert c["tau_smoothness"] == pytest.approx(np.std([-3.0, 2.5]))
    # only samples 3 and 4 lie within 0.02 rad and 0.2 rad/s of upright: too few for their
    # search, which then reports the last sample's time: no success
    assert c["swingup_time"] == 0.04 and R.score(c, t[-1]) == 0.0
    penalty = sum(R.WEIGHTS[k] * c[k] / R.NORMALISERS[k] for k in R.CRITERIA)
    assert R.score(c, 1.0) == pytest.approx(1 - penalty)


def test_swingup_time_is_the_last_run_that_stays_and_failure_scores_zero():
    t = np.arange(1, 11) * 0.01
    up = np.array([0, 1, 1, 0, 0, 1, 1, 1, 1, 1], bool)
    q = np.where(up, math.pi, 0.0)
    tr = R.Trajectory(t, q, np.zeros(10), np.zeros(10))
    assert R.swingup_time(tr) == t[5]       # the run that lasts to the end, not the first
    # their search never settles on the first sample inside the region: a run that starts
    # there is timed from its second sample
    q_first = np.where(np.arange(10) >= 4, math.pi, 0.0)
    assert R.swingup_time(R.Trajectory(t, q_first, np.zeros(10), np.zeros(10))) == t[5]
    never = R.Trajectory(t, np.zeros(10), np.zeros(10), np.zeros(10))
    c = R.criteria(never)
    assert c["swingup_time"] == t[-1] and R.score(c, t[-1]) == 0.0
    # above 0.2 rad/s the pendulum is not up, however close to upright
    fast = R.Trajectory(t, np.full(10, math.pi), np.full(10, 0.25), np.zeros(10))
    assert R.score(R.criteria(fast), t[-1]) == 0.0


def test_weights_and_normalisers_are_theirs():
    assert sum(R.WEIGHTS.values()) == pytest.approx(1.0)
    assert R.NORMALISERS == {"swingup_time": 10.0, "max_tau": 2.0, "energy": 100.0,
                             "integ_tau": 20.0, "tau_cost": 40.0, "tau_smoothness": 4.0,
                             "velocity_cost": 100.0}


def test_energy_shaping_lqr_reproduces_its_published_score():
    c, s, tr = R.evaluate(R.EnergyShapingLQR())
    assert abs(s - R.PUBLISHED_SCORES["energy shaping + LQR"]) < 0.01
    assert c["max_tau"] == pytest.approx(1.0)  # its own 1 N m limit
    assert len(tr.t) == 1000 and tr.t[-1] == pytest.approx(10.0)


def test_ilqr_tvlqr_reproduces_its_published_score():
    controller = R.ILQRTVLQR()
    # the plan ends near upright
    assert abs(controller.xs[-1, 0] - math.pi) < 0.01
    c, s, _ = R.evaluate(controller)
    assert abs(s - R.PUBLISHED_SCORES["iLQR + TVLQR"]) < 0.01
    assert c["max_tau"] == pytest.approx(1.5)


def test_a_plan_is_a_trajectory_of_the_plant_it_was_planned_on():
    """The iLQR model's one-step map (and the Jacobians the plan uses) against
    central differences."""
    c = R.ILQRTVLQR.__new__(R.ILQRTVLQR)
    c.p, c.dt = R.plant_constants(), 0.01
    c.I = c.p["m"] * c.p["l"] ** 2
    q, v, u, e = 1.0, 2.0, 0.5, 1e-6
    _, _, A, B = c._step(q, v, u)
    num = np.stack([(np.array(c._step(q + e, v, u)[:2]) - c._step(q - e, v, u)[:2]) / (2 * e),
                    (np.array(c._step(q, v + e, u)[:2]) - c._step(q, v - e, u)[:2]) / (2 * e)], 1)
    np.testing.assert_allclose(A, num, rtol=1e-6)
    np.testing.assert_allclose(B, (np.array(c._step(q, v, u + e)[:2]) - c._step(q, v, u - e)[:2])
                               / (2 * e), rtol=1e-6)


def test_robustness_categories_of_energy_shaping():
    r = R.robustness(R.EnergyShapingLQR(), runs=10, seed=0)
    # it reaches upright from any start, and limits of 1 N m and more leave its own 1 N m
    assert r.consistency == 1.0
    assert r.min_torque <= 1.0
    assert 0.0 <= r.robustness <= 1.0 and 0.0 <= r.sensitivity <= 1.0
    assert r.overall == pytest.approx(0.25 * (r.consistency + r.robustness + r.sensitivity
                                              + (10 - r.min_torque) / 10))


def test_their_published_robustness_overall_scores():
    c, rob, s, t = R.PUBLISHED_ROBUSTNESS["iLQR + TVLQR"]
    assert R.RobustnessResult(c / 100, rob / 100, s / 100, t).overall == pytest.approx(0.7725)


def test_cli_scores_a_baseline_beside_their_entries(capsys):
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    assert main(["eval", "--controller", "swingup-lqr", "--system", "pendulum", "--preset",
                 "realaigym", "--score", "realaigym"]) == 0
    out = capsys.readouterr().out
    assert "swingup-lqr" in out and "iLQR + TVLQR 0.701" in out
    score_line = next(line for line in out.splitlines() if line.startswith("RealAI score"))
    ours, es, ilqr = (float(v) for v in score_line.split()[2:])
    assert ours > 0.701 and abs(es - 0.666) < 0.01 and abs(ilqr - 0.701) < 0.01


def test_cli_refuses_another_preset(capsys):
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    assert main(["eval", "--controller", "swingup-lqr", "--system", "pendulum", "--preset", "rig",
                 "--score", "realaigym"]) == 2
    assert "realaigym" in capsys.readouterr().err


def test_cli_robustness_table_beside_their_published_rows(capsys):
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    assert main(["eval", "--controller", "swingup-lqr", "--system", "pendulum", "--preset",
                 "realaigym", "--robustness", "realaigym", "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if "N m" in line}
    assert set(rows) >= {"swingup-lqr", "energy", "iLQR", "DDPG", "SAC"}
    assert "0.922" in rows["DDPG"]  # 0.25 (1 + 1 + 0.79 + 0.9)


def test_cli_score_does_not_mix_with_our_robustness_benchmark(capsys):
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    assert main(["eval", "--controller", "swingup-lqr", "--system", "pendulum", "--preset",
                 "realaigym", "--score", "realaigym", "--robustness"]) == 2
    assert "--robustness realaigym" in capsys.readouterr().err
