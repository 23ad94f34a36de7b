"""Held-out, paired evaluation: the episodes are Gymnasium's own, the
difference and its standard error are the hand formulas."""
import numpy as np
import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")

import torch

from grpo_ctrl.baselines import make_controller
from grpo_ctrl.closed_loop import evaluate_on_gymnasium_pendulum
from grpo_ctrl.cli import main
from grpo_ctrl.heldout import HELDOUT_SEED, Score, score, standard_error, start_states

torch.set_num_threads(1)


def test_held_out_episodes_are_gymnasiums_own_episodes_step_for_step():
    pytest.importorskip("gymnasium")
    controller = make_controller("swingup-lqr", "pendulum", "gym")
    ours = score(controller, 40, seed=HELDOUT_SEED)
    theirs = evaluate_on_gymnasium_pendulum(controller, 40, seed=HELDOUT_SEED)
    np.testing.assert_allclose(ours.returns, theirs.returns, atol=1e-3)
    np.testing.assert_array_equal(ours.success, theirs.success)


def test_start_states_are_fixed_by_the_seed_and_cover_the_start_box():
    for system, preset in [("pendulum", "gym"), ("furuta", "qube-servo2")]:
        a = start_states(system, preset, 300, seed=HELDOUT_SEED)
        np.testing.assert_array_equal(a, start_states(system, preset, 300, seed=HELDOUT_SEED))
        assert not np.allclose(a, start_states(system, preset, 300, seed=0))
    x = start_states("pendulum", "gym", 1000)
    assert np.abs(x[:, 0]).max() <= np.pi and np.abs(x[:, 1]).max() <= 1.0
    assert np.abs(x[:, 0]).min() < 0.05 and np.abs(x[:, 0]).max() > np.pi - 0.05


def test_paired_difference_and_standard_errors_by_hand():
    a = Score(np.array([1.0, 2.0, 3.0]), np.ones(3, bool), seed=5)
    b = Score(np.array([0.0, 1.0, 0.0]), np.ones(3, bool), seed=5)
    assert a.mean == 2.0 and a.se == pytest.approx(1 / np.sqrt(3))
    mean, se = a.minus(b)  # differences 1, 1, 3: mean 5/3, sd sqrt(4/3)
    assert mean == pytest.approx(5 / 3) and se == pytest.approx(np.sqrt(4 / 3) / np.sqrt(3))
    assert standard_error(np.array([4.0])) == 0.0
    with pytest.raises(ValueError, match="same episodes"):
        a.minus(Score(b.returns, b.success, seed=6))


def test_eval_prints_mean_standard_error_and_the_paired_difference(capsys):
    assert main(["eval", "--controller", "swingup-lqr", "--system", "pendulum", "--preset",
                 "gym", "--episodes", "200", "--against", "lqr"]) == 0
    out = capsys.readouterr().out
    assert "200 held-out episodes" in out and "s.e." in out
    assert "swingup-lqr - lqr (paired)" in out
