"""The robustness benchmark and the smoothness metrics: hand-computed command
sequences, a controller that never acts against one that swings up, and the
command line's files and errors."""
import json

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")

import torch

from grpo_ctrl import cli, robustness
from grpo_ctrl.baselines import make_controller
from grpo_ctrl.closed_loop import command_smoothness
from grpo_ctrl.sim import BatchSim


def test_smoothness_of_hand_computed_sequences():
    u_max = 2.0
    assert command_smoothness(np.full(50, 1.3), u_max) == (0.0, 0.0)
    ramp = np.linspace(0.0, 1.0, 11)  # du = 0.1 every step, never turning
    mean, flips = command_smoothness(ramp, u_max)
    assert mean == pytest.approx(0.05) and flips == 0.0
    bang = np.array([2.0, -2.0] * 10)  # full-scale chatter: du = -+4 every step
    assert command_smoothness(bang, u_max) == (pytest.approx(2.0), 1.0)
    # per episode, only while alive: the second episode chatters until it ends
    u = np.stack([ramp, np.r_[0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 9.0, -9.0, 9.0, -9.0, 9.0]], axis=1)
    alive = np.ones_like(u, bool)
    alive[5:, 1] = False
    mean, flips = command_smoothness(u, u_max, alive)
    np.testing.assert_allclose(mean, [0.05, 0.5])  # |du| = 1, 1, 1, 1 over 4 steps / 2
    np.testing.assert_allclose(flips, [0.0, 1.0])  # signs +, -, +, -: every pair flips


class Idle(torch.nn.Module):
    """A controller that never acts."""

    def __init__(self, spec):
        super().__init__()
        self.spec = spec

    def forward(self, obs):
        return torch.zeros(obs.shape[0], 1)


def test_a_controller_that_never_acts_scores_zero_and_swing_up_lqr_scores():
    idle = Idle(BatchSim("pendulum", 1, preset="gym").spec)
    r_idle = robustness.benchmark(idle, episodes=2, realistic_episodes=8)
    # (a free pendulum can coast through upright slowly at the last step: rarely)
    assert r_idle["score"] < 0.02 and r_idle["realistic"]["success"] <= 0.125
    assert r_idle["nominal"]["du_mean"] == 0.0
    lqr = robustness.benchmark(make_controller("swingup-lqr", "pendulum", "gym"), episodes=2,
                               realistic_episodes=8)
    assert lqr["categories"]["model"] > 0.5 and lqr["nominal"]["success"] == 1.0
    # every parameter but g, x0.5 ... x1.5
    swept = {(p.label, p.value) for p in lqr["points"] if p.category == "model"}
    assert swept == {(n, float(s)) for n in ("m", "l", "b", "fc") for s in robustness.SCALES}
    assert [p.value for p in lqr["points"] if p.category == "delay"] == [0.0]  # dt is 50 ms


@pytest.mark.parametrize("preset, steps", [("rig", list(range(9))),
                                           ("qube-servo2", list(range(0, 21, 2)))])
def test_delay_grid_is_0_to_40_ms_in_whole_steps(preset, steps):
    system = "pendulum" if preset == "rig" else "furuta"
    spec = BatchSim(system, 1, preset=preset).spec
    grid = [v for c, _, _, v in robustness._grid_points(system, preset, spec) if c == "delay"]
    assert [v["delay"] for v in grid] == steps


def test_realistic_ranges_follow_the_issue():
    spec = BatchSim("furuta", 1, preset="qube-servo2").spec
    r = robustness.realistic(spec)
    assert r.params == 0.3 and r.delay == (1, 2) and r.motor_k[0] < 1.0
    assert r.noise_std == {"theta": 0.002, "alpha": 0.002, "theta_dot": 0.05, "alpha_dot": 0.05}


def test_cli_writes_table_json_and_png(tmp_path, capsys):
    out = tmp_path / "rb"
    assert cli.main(["eval", "--controller", "swingup-lqr", "--system", "pendulum", "--preset",
                     "gym", "--robustness", "--episodes", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "robustness score" in printed and "realistic row" in printed
    data = json.loads((out / "robustness.json").read_text())
    assert set(data["swingup-lqr"]["categories"]) == set(robustness.CATEGORIES)
    assert (out / "robustness.png").stat().st_size > 10_000
    assert "| model |" in (out / "robustness.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["eval", "--controller", "lqr", "--system", "pendulum", "--robustness", "--gym"],
     "drop --gym"),
    (["eval", "a", "b"], "several only with --robustness"),
])
def test_cli_errors(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_score_stderr_and_paired_difference_by_hand():
    # two categories' worth of points is enough to check the weights: model has
    # 2 points, pushes 1 (the other categories are empty here and weigh nothing)
    P = robustness.Point
    a = [P("model", "m", 0.5, 0.5, 0, 0, 0, [1, 0, 1, 0]), P("model", "m", 1.5, 1.0, 0, 0, 0,
                                                          [1, 1, 1, 1]),
         P("pushes", "push", 2.0, 0.25, 0, 0, 0, [0, 0, 0, 1])]
    # by hand: var of a 0/1 sample with ddof 1 over n = 4, divided by n, times the
    # weight squared: model points 1 / (6 * 2), the push point 1 / (6 * 1)
    v_half, v_quarter = (4 / 3 * 0.25) / 4, (4 / 3 * 0.1875) / 4
    expected = (v_half / 12 ** 2 + 0.0 + v_quarter / 6 ** 2) ** 0.5
    assert robustness._score_stderr(a, [p.outcomes for p in a]) == pytest.approx(expected)
    b = [P(p.category, p.label, p.value, 0, 0, 0, 0, list(p.outcomes)) for p in a]
    b[2].outcomes = [0, 0, 0, 0]  # b fails the one push a survives
    ra, rb = {"points": a, "score": 0.4}, {"points": b, "score": 0.35}
    diff, se = robustness.paired_difference(ra, rb)
    # per-episode differences: 0 everywhere but [0, 0, 0, 1] on the push point
    assert diff == pytest.approx(0.05) and se == pytest.approx(v_quarter ** 0.5 / 6)
    with pytest.raises(ValueError, match="same grid"):
        robustness.paired_difference(ra, {"points": a[:2], "score": 0.0})


def test_controllers_meet_the_same_episodes():
    """Two runs of one controller give the same outcomes episode for episode
    (the pairing the paired difference relies on), and the table prints it."""
    lqr = make_controller("swingup-lqr", "pendulum", "gym")
    r1 = robustness.benchmark(lqr, episodes=3, realistic_episodes=3)
    r2 = robustness.benchmark(lqr, episodes=3, realistic_episodes=3)
    assert [p.outcomes for p in r1["points"]] == [p.outcomes for p in r2["points"]]
    assert robustness.paired_difference(r1, r2) == (0.0, 0.0)
    assert 0.0 < r1["score_stderr"] < 0.2
    text = robustness.table({"a": r1, "swingup-lqr": r2})
    assert "score minus swingup-lqr's, paired | +0.0 +- 0.0 |" in text


def test_runs_that_read_alike_get_their_folder_in_the_column_name():
    from grpo_ctrl.cli_eval import column_names
    assert column_names(["runs/a/latest.pt", "runs/b/latest.pt", "runs/c"]) == \
        ["a/latest.pt", "b/latest.pt", "c"]
