"""``grpo-ctrl trajopt``: the feedforward's torque, the benchmark runs it is judged on (the
torque recorded is the torque the plant received, the catch's included), the search's
bookkeeping, the clone into a trained network and the command's refusals."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_ctrl import realaigym_double as R
from grpo_ctrl import trajopt
from grpo_ctrl.baselines.lqr import LQRCatch, design, region_matrix
from grpo_ctrl.cli import main
from grpo_ctrl.controller import act
from grpo_ctrl.plant import plant_spec
from grpo_ctrl.policy import load_policy_controller
from grpo_ctrl.trajopt import Feedforward, Search, TrajoptConfig, clone, run_candidates, search

SWING = json.loads((Path(__file__).parent / "data" / "pendubot_feedforward.json").read_text())


def test_the_feedforward_interpolates_its_knots_and_stops_after_the_last():
    ff = Feedforward([[0.0, 1.0, -1.0], [2.0, 2.0, 2.0]], knot_s=0.05, dt=0.002)
    assert ff.duration == pytest.approx(0.1)
    got = [ff(None) for _ in range(60)]      # steps 0 .. 59, t = 2 ms each
    np.testing.assert_allclose(got[0], [0.0, 2.0])
    np.testing.assert_allclose(got[12], [0.48, 2.0], atol=1e-12)     # t = 0.024
    np.testing.assert_allclose(got[25], [1.0, 2.0], atol=1e-12)      # t = 0.05, the knot
    np.testing.assert_allclose(got[37], [0.04, 2.0], atol=1e-12)     # 1 - 2 (0.024 / 0.05)
    np.testing.assert_allclose(got[50], [0.0, 0.0])                  # t = 0.1: after the last
    ff.reset()
    np.testing.assert_allclose(ff(None), [0.0, 2.0])


def test_a_caught_run_records_the_torque_the_plant_received():
    """The stored swing-up, caught by the LQR in the simulator's step: its recorded torques,
    replayed on the plant without the catch, fly the same swing-up into the catch (1.4 s; the
    hold after it is unstable without feedback, so a replay's round-off grows there)."""
    (caught,) = R.simulate(Feedforward(SWING["knots"], SWING["knot_s"], 0.002), "pendubot",
                           catch=100.0)
    tau = caught.tau[:, 0]

    class Replay:
        k = 0

        def __call__(self, obs):
            self.k += 1
            return tau[self.k - 1:self.k]

    (replayed,) = R.simulate(Replay(), "pendubot")
    steps = 700
    assert np.max(np.abs(replayed.q[:steps] - caught.q[:steps])) < 1e-4
    # the catch did act by then: the recorded torque departs from the feedforward's
    ff = Feedforward(SWING["knots"], SWING["knot_s"], 0.002)
    commanded = np.array([ff(None)[0] for _ in range(steps)])
    assert np.max(np.abs(tau[:steps] - commanded)) > 0.1
    assert np.abs(tau[:500] - commanded[:500]).max() < 1e-5  # before it, the feedforward's


def test_fitness_is_the_score_of_a_success_and_ranks_a_failure_by_its_nearest_approach():
    cfg = TrajoptConfig()
    knots = np.array([SWING["knots"], np.zeros(len(SWING["knots"]))])
    fitness, criteria, runs = run_candidates(knots, "pendubot", cfg)
    assert criteria[0]["success"] and fitness[0] == criteria[0]["score"] > 0.69
    assert criteria[0] == R.evaluate(runs[0])
    # no torque: it hangs still, nearest the catch at the start, x = (-pi, 0, 0, 0) wrapped
    P = region_matrix(plant_spec("double_pendulum", "pendubot"),
                      design("double_pendulum", "pendubot"))
    assert not criteria[1]["success"]
    assert fitness[1] == pytest.approx(-np.log1p(P[0, 0] * np.pi ** 2) / 10, rel=1e-9)


def test_the_search_keeps_its_best_run_and_repeats_with_its_seed():
    cfg = TrajoptConfig(population=8, generations=3, seed=5)
    found = search("pendubot", cfg, log=lambda line: None)
    best = [b for b, _ in found.history]
    assert best == sorted(best) and best[-1] == max(g for _, g in found.history)
    assert len(found.knots) == round(cfg.duration / cfg.knot_s) + 1
    assert np.all(np.abs(found.knots) <= 6.0)
    _, criteria, _ = run_candidates(found.knots[None], "pendubot", cfg)
    assert criteria[0] == found.criteria
    again = search("pendubot", cfg, log=lambda line: None)
    np.testing.assert_array_equal(again.knots, found.knots)
    other = search("pendubot", TrajoptConfig(population=8, generations=3, seed=6),
                   log=lambda line: None)
    assert not np.array_equal(other.knots, found.knots)


def test_cma_es_keeps_its_best_run_and_repeats_with_its_seed():
    cfg = TrajoptConfig(method="cma", population=8, generations=3, seed=0)
    found = search("acrobot", cfg, log=lambda line: None)
    best = [b for b, _ in found.history]
    assert len(best) == 3 and best == sorted(best) and best[-1] == max(g for _, g in found.history)
    assert np.all(np.abs(found.knots) <= 6.0)
    _, criteria, _ = run_candidates(found.knots[None], "acrobot", cfg)
    assert criteria[0] == found.criteria
    # seed 0 repeats (pycma would take it for "the time")
    again = search("acrobot", cfg, log=lambda line: None)
    np.testing.assert_array_equal(again.knots, found.knots)
    other = search("acrobot", TrajoptConfig(method="cma", population=8, generations=3, seed=1),
                   log=lambda line: None)
    assert not np.array_equal(other.knots, found.knots)
    # the default, the cross-entropy method, draws other candidates with the same seed
    cem = search("acrobot", TrajoptConfig(population=8, generations=3, seed=0),
                 log=lambda line: None)
    assert not np.array_equal(cem.knots, found.knots)


def test_cma_es_stops_where_it_has_converged_and_says_so():
    lines = []
    # a step size below pycma's tolerance on it: converged after its first generation
    found = search("pendubot", TrajoptConfig(method="cma", cma_sigma=1e-13, population=6,
                                             generations=50), log=lines.append)
    assert len(found.history) == 1
    assert "CMA-ES converged" in lines[-1] and "generation 1/50" in lines[-1]


@pytest.fixture(scope="module")
def pendubot_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("trajopt") / "pendubot"
    assert main(["train", "--system", "double_pendulum", "--preset", "pendubot",
                 "--iterations", "2", "--time-budget", "0", "--overlap", "false",
                 "--num-starts", "4", "--group-size", "2", "--eval-episodes", "1",
                 "--out", str(out)]) == 0
    return out


def test_the_clone_learns_the_feedforward_in_the_trained_network(pendubot_run, tmp_path):
    cfg = TrajoptConfig(clone_steps=600, clone_check=300)
    knots = np.array(SWING["knots"])
    before = load_policy_controller(pendubot_run)
    policy, score = clone(str(pendubot_run), knots, cfg, log=lambda line: None)
    spec = plant_spec("double_pendulum", "pendubot")
    assert score == R.benchmark_score(policy.controller(spec, 100.0))  # the snapshot kept
    ff = Feedforward(knots, cfg.knot_s, 0.002)
    (run,) = R.simulate(Feedforward(knots, cfg.knot_s, 0.002), "pendubot", catch=100.0)
    obs = np.stack([np.cos(run.q[:, 0]), np.sin(run.q[:, 0]), np.cos(run.q[:, 1]),
                    np.sin(run.q[:, 1]), run.qd[:, 0], run.qd[:, 1]], 1).astype(np.float32)
    want = np.array([ff(None)[0] for _ in range(500)])   # before the catch acts
    after = act(policy.controller(spec), obs[:500])
    untrained = act(before, obs[:500])
    assert np.sqrt(np.mean((after - want) ** 2)) < 0.5 * np.sqrt(np.mean((untrained - want) ** 2))
    found = Search(knots, {"score": 0.698}, [])
    path = trajopt.save_run(policy, "pendubot", cfg, found, tmp_path / "clone")
    ctrl = load_policy_controller(tmp_path / "clone")
    assert isinstance(ctrl, LQRCatch) and ctrl.level == 100.0
    np.testing.assert_allclose(act(ctrl.inner, obs[:500]), after, atol=1e-6)
    assert path.name == "deployed.pt"
    # a GRPO run starts from it: its network, its catch
    assert main(["train", "--init", str(tmp_path / "clone"), "--iterations", "1",
                 "--time-budget", "0", "--overlap", "false", "--num-starts", "2",
                 "--group-size", "2", "--horizon", "8", "--loss-steps", "4",
                 "--eval-episodes", "1", "--out", str(tmp_path / "tuned")]) == 0
    assert load_policy_controller(tmp_path / "tuned").level == 100.0


def test_the_command_writes_a_run_that_eval_scores(pendubot_run, tmp_path, monkeypatch,
                                                   capsys):
    """The command with its search stood in by the stored swing-up (a real search takes
    minutes): the clone's run, its two scores printed, the one eval prints."""
    knots = np.array(SWING["knots"])
    methods = []

    def stored(preset, cfg, log):
        methods.append(cfg.method)
        _, criteria, _ = run_candidates(knots[None], preset, cfg)
        return Search(knots, criteria[0], [])

    monkeypatch.setattr(trajopt, "search", stored)
    # a short fit (a dataclass's defaults are bound in its __init__: the class is replaced)
    @dataclasses.dataclass
    class Short(TrajoptConfig):
        clone_steps: int = 300
        robust_rounds: int = 1
        robust_rollouts: int = 8
        robust_fit_steps: int = 300

    monkeypatch.setattr(trajopt, "TrajoptConfig", Short)
    out = tmp_path / "clone"
    assert main(["trajopt", str(pendubot_run), "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "RealAI score 0.6979" in line and str(out) in line
    cloned = float(line.split("network: ")[1].split(":")[0])
    assert main(["eval", str(out), "--score", "realaigym"]) == 0
    printed = capsys.readouterr().out
    score = [row for row in printed.splitlines() if row.startswith("RealAI score")][0]
    assert float(score.split()[2]) == pytest.approx(cloned, abs=5e-4)
    # --robust, one small round: the run records whether the clone was taught, as printed
    robust = tmp_path / "robust"
    assert main(["trajopt", str(pendubot_run), "--out", str(robust), "--robust",
                 "--search", "cma"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert methods == ["cem", "cma"] and 'trajopt_method = "cma"' in (robust /
                                                                   "config.toml").read_text()
    record = torch.load(robust / "deployed.pt", weights_only=False)["trajopt"]
    assert record["robust"] == ("taught its tracking feedback" in line)
    cloned = float(line.split("network")[1].split(": ")[1].split(":")[0])
    assert main(["eval", str(robust), "--score", "realaigym"]) == 0
    printed = capsys.readouterr().out
    score = [row for row in printed.splitlines() if row.startswith("RealAI score")][0]
    assert float(score.split()[2]) == pytest.approx(cloned, abs=5e-4)


def test_the_command_refuses_what_it_cannot_do_before_any_search(pendubot_run, tmp_path,
                                                                  capsys):
    pend = tmp_path / "pendulum"
    assert main(["train", "--system", "pendulum", "--preset", "gym", "--iterations", "1",
                 "--time-budget", "0", "--overlap", "false", "--eval-episodes", "1",
                 "--out", str(pend)]) == 0
    capsys.readouterr()
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    for argv, message in [
            (["trajopt", str(pend), "--out", str(tmp_path / "a")], "acrobot or pendubot"),
            (["trajopt", str(pendubot_run), "--out", str(full)], "not an empty folder"),
            (["trajopt", str(tmp_path / "none"), "--out", str(tmp_path / "b")],
             "does not exist"),
            (["trajopt", str(pendubot_run), "--out", str(tmp_path / "c"),
              "--generations", "0"], "generations")]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and err.count("\n") == 1, err
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()
    # a search that finds no swing-up writes nothing (0.1 s of torque: under 0.5 J of the
    # 7.65 J the pendubot needs to stand up)
    assert main(["trajopt", str(pendubot_run), "--out", str(tmp_path / "d"),
                 "--generations", "1", "--duration", "0.1"]) == 2
    assert "no candidate of 1 generations swung up" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_the_tracking_gains_are_the_lqrs_along_upright_at_rest():
    """Along the upright equilibrium the recursion from the LQR's cost-to-go stays at its
    fixed point (every gain the LQR's); with the torque 30x dearer it converges, far from
    the end, to the stationary LQR of those weights (dlqr, an independent solver)."""
    from grpo_ctrl.baselines.lqr import dlqr
    from grpo_ctrl.sim import BatchSim

    lqr = design("double_pendulum", "acrobot")
    sim = BatchSim("double_pendulum", 1, "acrobot")
    rest, zero = np.zeros((1500, 4)), np.zeros(1500)  # 3 s
    same = trajopt.tracking_gains(sim, rest, zero, lqr.Q, lqr.R, lqr.P)
    np.testing.assert_allclose(same, np.repeat(lqr.K, 1500, axis=0), rtol=1e-6)
    dear = trajopt.tracking_gains(sim, rest, zero, lqr.Q, 30 * lqr.R, lqr.P)
    stationary = dlqr(lqr.A, lqr.B, lqr.Q, 30 * lqr.R).K[0]
    np.testing.assert_allclose(dear[0], stationary, atol=1e-6 * np.abs(stationary).max())
    assert np.linalg.norm(dear[-1] - lqr.K[0]) > 0.1 * np.linalg.norm(lqr.K)  # it did move


def test_the_teacher_commands_the_run_on_it_and_corrects_off_it():
    cfg = TrajoptConfig()
    teacher = trajopt.TrackingTeacher("pendubot", np.array(SWING["knots"]), cfg)
    (run,) = R.simulate(Feedforward(SWING["knots"], SWING["knot_s"], 0.002), "pendubot",
                        catch=cfg.catch)
    n = len(teacher.gains)
    assert 500 < n < 800  # the catch takes over between 1.0 and 1.6 s
    x = np.concatenate([run.q, run.qd], axis=1)
    for k in (0, 250, n - 1):
        np.testing.assert_allclose(teacher(k, x[k:k + 1]), run.tau[k:k + 1, 0], atol=1e-12)
        turned = x[k:k + 1] + [[2 * np.pi, -2 * np.pi, 0.0, 0.0]]  # the same pose
        np.testing.assert_allclose(teacher(k, turned), teacher(k, x[k:k + 1]), atol=1e-9)
        off = x[k:k + 1] + [[0.0, 0.0, 0.01, 0.0]]
        np.testing.assert_allclose(teacher(k, off) - run.tau[k, 0],
                                   -0.01 * teacher.gains[k, 2], atol=1e-9)
    lqr = design("double_pendulum", "pendubot")
    near = np.array([[0.01, -0.02, 0.0, 0.1]])
    np.testing.assert_allclose(teacher(n + 5, near), -near @ lqr.K[0], atol=1e-9)


def test_teaching_brings_the_clone_to_the_teachers_commands_off_the_run(pendubot_run):
    """DAgger, small: after two rounds the policy is nearer the teacher's commands at the
    states of noisy runs than the clone it started from was, and the round it keeps scores
    what it reports."""

    cfg = TrajoptConfig(clone_steps=400, clone_check=400, robust_rounds=2, robust_rollouts=8,
                        robust_fit_steps=1000, robust_noise=0.1)
    knots = np.array(SWING["knots"])
    policy, _ = clone(str(pendubot_run), knots, cfg, log=lambda line: None)
    teacher = trajopt.TrackingTeacher("pendubot", knots, cfg)
    spec = plant_spec("double_pendulum", "pendubot")

    def error_off_the_run(p) -> float:
        """rms of the policy's command from the teacher's over 8 runs of the teacher itself
        with 0.1 N m of held torque noise (seed 99: states no round saw)."""
        from grpo_ctrl.sim import BatchSim

        rng, sim = np.random.default_rng(99), BatchSim("double_pendulum", 8, "pendubot")
        obs, sq = sim.reset(), []
        for k in range(len(teacher.gains)):
            label = teacher(k, sim.get_state()["x"])
            with torch.no_grad():
                u = p.u_max * torch.tanh(p.mu(p.normalise(torch.as_tensor(obs)))).reshape(-1)
            sq.append((u.numpy() - label) ** 2)
            if k % 25 == 0:
                noise = 0.1 * rng.standard_normal(8)
            obs = sim.step((label + noise).astype(np.float32))[0]
        return float(np.sqrt(np.mean(sq)))

    before = error_off_the_run(policy)
    untaught = {k: v.clone() for k, v in policy.net.state_dict().items()}
    taught, score, was_taught = trajopt.teach(policy, "pendubot", teacher, cfg,
                                              log=lambda line: None)
    assert was_taught and error_off_the_run(taught) < 0.7 * before
    assert score == R.benchmark_score(taught.controller(spec, cfg.catch))

    # a teacher whose pupil never swings up (it commands nothing): the policy comes back as
    # it came, with its own score
    class Idle:
        gains = np.zeros((100, 4))

        def __call__(self, k, x):
            return np.zeros(len(x))

    taught.net.load_state_dict(untaught)
    own = R.benchmark_score(taught.controller(spec, cfg.catch))
    small = TrajoptConfig(robust_rounds=1, robust_rollouts=4, robust_fit_steps=300)
    back, score, was_taught = trajopt.teach(taught, "pendubot", Idle(), small,
                                            log=lambda line: None)
    assert not was_taught and score == own > 0
    for k, v in back.net.state_dict().items():
        assert torch.equal(v, untaught[k])
