"""The simulator benchmark runs (CI-sized) and times what it claims to:
its numpy implementation is the same step as the C simulator's and Gymnasium's."""
import argparse
import importlib.util
import json

import gymnasium as gym
import numpy as np
import pytest

from grpo_ctrl import bench_cli, cli
from grpo_ctrl.errors import UserError
from grpo_ctrl.sim import BatchSim


def load_bench_sim():
    path = bench_cli.BENCHMARKS_DIR / "bench_sim.py"
    spec = importlib.util.spec_from_file_location("bench_sim", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_cli_args(*argv):
    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_quick_run_through_the_cli_writes_well_formed_json(tmp_path, capsys):
    out = tmp_path / "sub" / "sim.json"
    assert cli.main(["bench", "sim", "--quick", "--batch-sizes", "1", "64", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "c_vs_numpy" in printed and f"wrote {out}" in printed
    report = json.loads(out.read_text())
    assert report["benchmark"] == "sim" and report["quick"] is True
    assert report["batch_sizes"] == [1, 64]
    assert set(report["results"]) == {"c", "numpy", "gymnasium", "envpool"}
    for name in ("c", "numpy", "gymnasium"):
        for B in ("1", "64"):
            cell = report["results"][name][B]
            assert cell["steps_per_s"] > 0
            assert cell["us_per_call"] * 1e-6 * cell["steps_per_s"] == pytest.approx(int(B))
    envpool = report["results"]["envpool"]
    if report["versions"]["envpool"] is None:
        assert envpool == {"1": None, "64": None}
        assert "not installed" in report["notes"]["envpool"]
    else:
        assert envpool["64"]["steps_per_s"] > 0
    for other in ("numpy", "gymnasium"):
        ratio = report["ratios"][f"c_vs_{other}"]["64"]
        assert ratio == pytest.approx(report["results"]["c"]["64"]["steps_per_s"]
                                      / report["results"][other]["64"]["steps_per_s"])
    t = report["targets"]
    assert t["c_us_per_call_at_1"]["measured"] == report["results"]["c"]["1"]["us_per_call"]
    assert t["c_vs_numpy_at_4096"]["measured"] is None  # batch 4096 was not run
    assert t["c_vs_numpy_at_4096"]["met"] is None
    assert report["agreement"]["max_obs_diff"] <= 1e-6
    assert report["agreement"]["same_episode_ends"] is True
    assert not list(out.parent.glob("*.tmp"))  # written atomically, nothing left over


def test_targets_compare_each_measurement_with_its_goal_in_the_right_direction():
    bench = load_bench_sim()
    goal_ratio, goal_us = bench.TARGETS["c_vs_numpy_at_4096"], bench.TARGETS["c_us_per_call_at_1"]

    def report(ratio, us):
        return {"ratios": {"c_vs_numpy": {"4096": ratio}},
                "results": {"c": {"1": {"us_per_call": us}}}}

    # a ratio is met at or above its goal, a time per call strictly below it
    t = bench.targets(report(goal_ratio, goal_us))
    assert t["c_vs_numpy_at_4096"]["met"] is True and t["c_us_per_call_at_1"]["met"] is False
    t = bench.targets(report(0.99 * goal_ratio, 0.99 * goal_us))
    assert t["c_vs_numpy_at_4096"]["met"] is False and t["c_us_per_call_at_1"]["met"] is True
    assert t["c_vs_numpy_at_4096"]["measured"] == 0.99 * goal_ratio
    assert t["c_vs_envpool_at_4096"] == {"goal": bench.TARGETS["c_vs_envpool_at_4096"],
                                         "measured": None, "met": None}


def test_numpy_implementation_agrees_with_the_c_step():
    bench = load_bench_sim()
    B = 500
    sim = BatchSim("pendulum", B, preset="gym", seed=3, autoreset=True)
    ref = bench.NumpyPendulum(B, seed=3)
    x = sim.get_state()["x"]
    ref.th[:], ref.thd[:] = x[:, 0], x[:, 1]
    actions = np.random.default_rng(4).uniform(-3, 3, (200, B)).astype(np.float32)
    for k in range(200):
        c_obs, c_reward, c_term, c_trunc = sim.step(actions[k])
        n_obs, n_reward, n_term, n_trunc = ref.step(actions[k])
        np.testing.assert_allclose(c_reward, n_reward, rtol=0, atol=1e-9)
        np.testing.assert_array_equal(c_term, n_term)
        np.testing.assert_array_equal(c_trunc, n_trunc)
        if k < 199:  # both then autoreset, each from its own RNG
            np.testing.assert_allclose(c_obs, n_obs, rtol=0, atol=1e-6)
    assert c_trunc.all()
    # after the reset: a fresh start in Pendulum-v1's box
    assert np.all(np.abs(ref.thd) <= 1.0) and (ref.t == 0).all()


def test_numpy_implementation_agrees_with_gymnasium():
    bench = load_bench_sim()
    envs = [gym.make("Pendulum-v1") for _ in range(20)]
    for i, env in enumerate(envs):
        env.reset(seed=100 + i)
    ref = bench.NumpyPendulum(20)
    x = np.array([env.unwrapped.state for env in envs])
    ref.th[:], ref.thd[:] = x[:, 0], x[:, 1]
    actions = np.random.default_rng(5).uniform(-2.5, 2.5, (150, 20)).astype(np.float32)
    for k in range(150):
        n_obs, n_reward, _, _ = ref.step(actions[k])
        results = [env.step(actions[k, i:i + 1]) for i, env in enumerate(envs)]
        np.testing.assert_allclose(n_obs, [r[0] for r in results], rtol=0, atol=1e-6)
        np.testing.assert_allclose(n_reward, [r[1] for r in results], rtol=0, atol=1e-9)


def test_unknown_benchmark_lists_the_available_ones(capsys):
    with pytest.raises(UserError, match=r"unknown benchmark 'nope'; available: .*sim"):
        bench_cli.run(bench_cli_args("nope"))
    assert cli.main(["bench", "nope"]) == 2
    assert "available:" in capsys.readouterr().err


def test_missing_benchmarks_folder_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_cli, "BENCHMARKS_DIR", tmp_path / "benchmarks")
    with pytest.raises(UserError, match="source tree"):
        bench_cli.run(bench_cli_args("sim"))
