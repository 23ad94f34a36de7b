"""Training end to end: a seconds-long run improves, reproduces, round-trips
through its checkpoint, and the command line fails cleanly on bad input."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")

import torch

from grpo_ctrl import cli
from grpo_ctrl.closed_loop import evaluate
from grpo_ctrl.errors import UserError
from grpo_ctrl.grpo import Trainer
from grpo_ctrl.grpo_config import GRPOConfig, default_config
from grpo_ctrl.policy import (ACTIVATIONS, GaussianPolicy, load_policy, load_policy_controller,
                              plain_sin)
from grpo_ctrl.sim import BatchSim

torch.set_num_threads(1)

# a short pendulum run: ~2 s on one idle core
SHORT = dict(time_budget=0.0, eval_every=1e9, eval_episodes=16, threads=1)


def _trained(seed: int, iterations: int, **overrides) -> Trainer:
    tr = Trainer(GRPOConfig(seed=seed, iterations=iterations, **SHORT, **overrides),
                 "pendulum", "gym")
    for _ in range(iterations):
        tr.step()
    tr.close()
    return tr


def _score(trainer: Trainer) -> float:
    return float(evaluate(trainer.policy.controller(trainer.spec), 100, seed=5).returns.mean())


def test_short_training_improves_the_return():
    before = _score(Trainer(GRPOConfig(seed=3, **SHORT), "pendulum", "gym"))
    after = _score(_trained(3, 100))
    # an untrained policy leaves the pendulum hanging (about -1200); 100
    # iterations learn the swing-up (published results are about -150)
    assert before < -900
    assert after > -300, (before, after)


def test_the_same_seed_reproduces_the_same_policy():
    first, second, other = _trained(3, 8), _trained(3, 8), _trained(4, 8)
    for a, b in zip(first.policy.parameters(), second.policy.parameters()):
        assert torch.equal(a, b)
    assert _score(first) == _score(second)
    assert not torch.equal(other.policy.net[0].weight, first.policy.net[0].weight)


def test_the_gym_pendulums_noise_floor_holds_through_updates():
    """Without a floor the gym pendulum's learnt noise keeps falling in long runs, and
    the swing-up from hanging down is lost (docs/research.md §6)."""
    cfg = default_config("pendulum", "gym")
    floor = cfg.log_std_min
    assert floor == pytest.approx(-0.5)
    tiny = dict(num_starts=4, group_size=4, horizon=16, loss_steps=8, overlap=False, seed=1,
                **SHORT)
    below = Trainer(GRPOConfig(**{**vars(cfg), **tiny, "log_std_init": -3.0}), "pendulum", "gym")
    below.step()  # Adam moves log std by <= ~lr a step (2 minibatches): the floor lifts it
    lifted = float(below.policy.log_std.detach())
    assert floor <= lifted <= floor + 2 * cfg.lr
    assert float(below.rollout.collect(below.policy, below.gen).log_std_old) == lifted
    fast = Trainer(GRPOConfig(**{**vars(cfg), **tiny, "log_std_init": -0.45, "lr": 0.3}),
                   "pendulum", "gym")
    for _ in range(5):
        fast.step()
        assert float(fast.policy.log_std.detach()) >= floor - 1e-7


def test_overlapped_collection_learns_and_is_reproducible():
    """With overlap the next batch is collected in a second process by a
    copy of the policy one update old: the schedule is fixed, so the same
    seed gives the same policy whatever the processes' timing, and it learns."""
    first, second = _trained(3, 100, overlap=True), _trained(3, 100, overlap=True)
    for a, b in zip(first.policy.parameters(), second.policy.parameters()):
        assert torch.equal(a, b)
    assert _score(first) > -300
    synchronous = _trained(3, 3, overlap=False)
    overlapped = _trained(3, 3, overlap=True)
    assert not torch.equal(synchronous.policy.net[0].weight, overlapped.policy.net[0].weight)


def test_the_costs_of_effort_apply_from_costs_from_in_either_process():
    """Before costs_from of the budget the reward's costs of effort are at costs_early (the
    double pendulum's swing-up is found first); the overlap collector's rollout gets the
    scale with each policy. The first batch is the same trajectories under each scale."""
    sim = BatchSim("double_pendulum", 1, "pendubot")
    m = sim.model
    x, u = np.array([2.0, -0.7, 1.5, -2.5]), np.float32(3.0)
    h = (0.2 * np.cos(2.0) + 0.3 * np.cos(2.0 - 0.7)) / 0.5
    task = m.w_height * (1 - h) + m.w_down  # below 0.9: the time term
    effort = m.w_u * 9.0 + m.w_x[2] * 1.5**2 + m.w_x[3] * 2.5**2 + m.w_power * 3.0 * 1.5
    for scale in (1.0, 0.01, 0.0):
        sim.scale_costs(scale)
        sim.set_state({"x": x[None]})
        assert sim.step(np.array([u]))[1][0] == pytest.approx(-(task + scale * effort),
                                                              rel=1e-13)
    cfg = replace(default_config("double_pendulum", "pendubot"), num_starts=4, group_size=4,
                  horizon=16, loss_steps=8, seed=3, **SHORT)

    def first_return(costs_from: float, progress: float, overlap: bool,
                     costs_early: float = 0.01) -> float:
        trainer = Trainer(replace(cfg, costs_from=costs_from, costs_early=costs_early,
                                  overlap=overlap), "double_pendulum", "pendubot")
        try:
            trainer.set_progress(progress)
            assert trainer.cost_scale == (costs_early if progress < costs_from else 1.0)
            return trainer.step()["branch_return"]
        finally:
            trainer.close()
    for overlap in (False, True):
        full = first_return(0.0, 0.2, overlap)
        assert first_return(0.5, 0.6, overlap) == full
        early = first_return(0.5, 0.2, overlap)
        assert early > full + 1.0
        # the costs at 10 % rather than 1 %: the same trajectories, costs between the two
        assert full < first_return(0.5, 0.2, overlap, costs_early=0.1) < early


@dataclass
class Shaped:  # a batch-like dataclass for the shared slots (pickled: at module level)
    a: torch.Tensor
    b: np.ndarray
    c: "torch.Tensor | None"
    d: float


def test_shared_slots_carry_a_batch_and_fall_back_to_the_pipe():
    """The collector's shared slots (overlap.SharedSlots): a batch shaped like the example
    crosses with only markers in the message; the next batch, written into the other set
    before this one is copied out, leaves it alone; the trainer's copy stays its own when
    the collector writes into the same set again; an array of another shape, and None, go
    in the message."""
    import multiprocessing
    import pickle

    from grpo_ctrl.overlap import SharedSlots

    example = Shaped(torch.zeros(4, 3), np.zeros(5), torch.zeros(2), 0.0)
    slots = SharedSlots(example)
    first = Shaped(torch.arange(12.0).reshape(4, 3), np.arange(5.0), None, 1.5)
    second = Shaped(-torch.ones(4, 3), -np.ones(5), torch.ones(3), 2.0)

    def send(conn):  # the collector's side, in a forked process as in the trainer
        conn.send(slots.pack(first, 0))
        conn.send(slots.pack(second, 1))  # the next batch, before the first is copied out
        conn.close()

    ours, theirs = multiprocessing.get_context("fork").Pipe()
    child = multiprocessing.get_context("fork").Process(target=send, args=(theirs,))
    child.start()
    theirs.close()  # EOF here, not a hang, should the child fail
    message, message2 = ours.recv(), ours.recv()
    child.join()
    assert len(pickle.dumps(message)) < 1000  # the arrays stayed in shared memory
    got = slots.unpack(message)
    assert torch.equal(got.a, first.a) and np.array_equal(got.b, first.b)
    assert got.c is None and got.d == 1.5
    got2 = slots.unpack(message2)
    assert torch.equal(got2.a, second.a) and torch.equal(got2.c, torch.ones(3))
    slots.pack(Shaped(torch.ones(4, 3), np.ones(5), None, 3.0), 0)  # the batch after next
    assert torch.equal(got.a, first.a) and np.array_equal(got.b, first.b)
    odd = slots.unpack(slots.pack(Shaped(torch.ones(2, 3), np.ones(5, np.float32),
                                          torch.ones(3), 0.0), 1))
    assert torch.equal(odd.a, torch.ones(2, 3)) and odd.b.dtype == np.float32
    assert torch.equal(odd.c, torch.ones(3))


def test_policy_slots_carry_each_policy_in_turn_across_a_fork():
    """The policy's shared slots (overlap.PolicySlots): two policies written into the two
    sets cross to a forked process with only the set's number in the message, each
    arriving bit for bit, its normaliser too; a parameter replaced after the first write
    is the one sent next; a policy of other shapes is refused."""
    import multiprocessing

    from grpo_ctrl.overlap import PolicySlots
    from grpo_ctrl.policy import GaussianPolicy

    def make(seed):
        torch.manual_seed(seed)
        p = GaussianPolicy(3, 2.0, 8, 2, features=4, feature_scale=2.0)
        p.obs_norm.update(torch.randn(50, 3) + seed)
        p.refresh_norm()
        return p

    sent, receiver = make(1), make(0)
    slots = PolicySlots(receiver)
    first = slots.write(sent)
    with torch.no_grad():
        sent.net[-1].weight = torch.nn.Parameter(torch.full_like(sent.net[-1].weight, 0.5))
        sent.log_std.fill_(-1.25)
    second = slots.write(sent)
    assert (first, second) == (0, 1)
    x = torch.randn(20, 3)

    def receive(conn, message):
        slots.read(message, receiver)
        with torch.no_grad():
            conn.send([t.numpy() for t in receiver.dist(receiver.normalise(x))])
        conn.close()

    for message in (first, second):
        ours, theirs = multiprocessing.get_context("fork").Pipe()
        child = multiprocessing.get_context("fork").Process(target=receive,
                                                            args=(theirs, message))
        child.start()
        theirs.close()
        got = ours.recv()
        child.join()
        if message is second:
            with torch.no_grad():
                want = [t.numpy() for t in sent.dist(sent.normalise(x))]
            assert all(np.array_equal(a, b) for a, b in zip(got, want))
            assert float(got[1][0]) == -1.25
        else:
            assert float(got[1][0]) != -1.25
    with pytest.raises(ValueError, match="not the slots"):
        slots.write(GaussianPolicy(3, 2.0, 16, 2, features=4))


def test_overlap_refuses_extra_update_threads():
    with pytest.raises(UserError, match="threads = 1"):
        Trainer(GRPOConfig(overlap=True, threads=2), "pendulum", "gym")


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "pend"
    rc = cli.main(["train", "--system", "pendulum", "--preset", "gym", "--out", str(out),
                   "--iterations", "4", "--time-budget", "0", "--eval-episodes", "8",
                   "--quiet", "--seed", "1"])
    assert rc == 0
    return out


def test_run_folder_holds_config_metrics_curve_and_checkpoints(run_folder):
    for name in ("config.toml", "metrics.jsonl", "curve.png", "latest.pt", "deployed.pt"):
        assert (run_folder / name).is_file(), name
    rows = [json.loads(line) for line in (run_folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    for key in ("branch_return", "group_reward_std", "zero_spread", "clip_low", "clip_high",
                "kl_old", "kl_ref", "entropy", "grad_norm", "sim_steps", "wall_time"):
        assert all(np.isfinite(r[key]) for r in rows), key
    assert rows[-1]["sim_steps"] == 4 * 32 * 8 * 64
    config = (run_folder / "config.toml").read_text()
    assert 'system = "pendulum"' in config and "eval_episodes = 8" in config


def test_checkpoint_round_trip_gives_the_same_controller(run_folder):
    ctrl = load_policy_controller(run_folder / "latest.pt")
    ck = torch.load(run_folder / "latest.pt", weights_only=True)
    from grpo_ctrl.policy import GaussianPolicy
    policy = GaussianPolicy.from_checkpoint(ck)
    obs = torch.randn(64, 3) * torch.tensor([1.0, 1.0, 4.0])
    with torch.no_grad():
        expected = 2.0 * torch.tanh(policy.mu(policy.normalise(obs)))
    assert torch.allclose(ctrl(obs).squeeze(1), expected, atol=1e-6)
    assert ctrl(obs).shape == (64, 1) and ctrl(obs).dtype == torch.float32
    assert ctrl.spec.system == "pendulum" and ctrl.spec.preset == "gym"
    assert ctrl.source_info["sha256"] == hashlib.sha256(
        (run_folder / "latest.pt").read_bytes()).hexdigest()
    # a run folder loads its deployed checkpoint
    assert load_policy_controller(run_folder).source_info["checkpoint"].endswith("deployed.pt")


def test_resume_continues_the_iteration_count(run_folder, tmp_path):
    import shutil
    out = tmp_path / "resumed"
    shutil.copytree(run_folder, out)
    assert cli.main(["train", "--out", str(out), "--resume", "--iterations", "6",
                     "--quiet"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6]


def test_config_file_then_flags_take_precedence(tmp_path):
    from grpo_ctrl.train import add_arguments, resolve
    import argparse
    conf = tmp_path / "c.toml"
    conf.write_text('system = "cartpole"\npreset = "swingup"\ngroup_size = 4\nlr = 0.01\n')
    p = argparse.ArgumentParser()
    add_arguments(p)
    system, preset, cfg, _, _ = resolve(p.parse_args(["--config", str(conf), "--lr", "0.002",
                                                      "--out", str(tmp_path / "r")]))
    assert (system, preset, cfg.group_size, cfg.lr) == ("cartpole", "swingup", 4, 0.002)
    assert cfg.horizon == 160  # the cart-pole swing-up's own default, from no file or flag


@pytest.mark.parametrize("argv, file, want", [
    ([], "", {"gamma": 0.99, "num_starts": 32, "time_budget": 30.0}),
    (["--time-budget", "119"], "", {"gamma": 0.99, "num_starts": 32}),
    (["--time-budget", "120"], "", {"gamma": 0.995, "num_starts": 64}),
    (["--time-budget", "600", "--gamma", "0.98"], "", {"gamma": 0.98, "num_starts": 64}),
    ([], "time_budget = 300\nnum_starts = 16\n", {"gamma": 0.995, "num_starts": 16}),
    (["--time-budget", "0", "--iterations", "9000"], "", {"gamma": 0.99}),  # no clock, no guess
    (["--preset", "rig", "--time-budget", "600"], "", {"gamma": 0.99, "num_starts": 32}),
])
def test_long_runs_of_the_gym_pendulum_get_their_own_defaults(tmp_path, argv, file, want):
    """From 120 s on, gamma 0.995 and 64 starts (LONG_BUDGET_DEFAULTS), unless a flag or
    the config file names them; other plants and shorter runs keep theirs."""
    from grpo_ctrl.train import add_arguments, resolve
    import argparse
    p = argparse.ArgumentParser()
    add_arguments(p)
    conf = tmp_path / "c.toml"
    conf.write_text(file)
    *_, cfg, _, _ = resolve(p.parse_args(argv + ["--config", str(conf),
                                                 "--out", str(tmp_path / "r")]))
    assert {k: getattr(cfg, k) for k in want} == want


@pytest.mark.parametrize("argv, message", [
    (["train", "--system", "trolley"], "unknown system"),
    (["train", "--preset", "moon"], "unknown preset"),
    (["train", "--continuation", "oracle"], "continuation"),
    (["train", "--group-size", "1"], "--group-size"),
    (["train", "--loss-steps", "100", "--horizon", "50"], "loss_steps"),
    (["train", "--out", __file__], "is a file, not a run folder"),
    # each within its own range, together beyond this machine's memory
    (["train", "--num-starts", "1000000", "--horizon", "10000"], "GiB"),
    (["train", "--hidden", "60000", "--layers", "60"], "GiB"),
    (["train", "--preset", "rig", "--randomize", "delay=0,99"], "delay"),
    (["train", "--randomize", "scale.mass=0.9,1.1"], "not parameters"),
    (["train", "--randomize", "pushes=1"], "unknown randomize key"),
    (["train", "--deploy", "score"], "has none of; choose --deploy best"),
    (["eval", "/nonexistent/run"], "neither a run folder"),
    (["eval"], "name a RUN"),
])
def test_cli_errors_are_one_clean_line(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_bad_config_file_and_corrupt_checkpoint_are_clean_errors(tmp_path, capsys):
    conf = tmp_path / "bad.toml"
    conf.write_text("group_sise = 4\n")
    assert cli.main(["train", "--config", str(conf), "--out", str(tmp_path / "r")]) == 2
    assert "unknown field(s) ['group_sise']" in capsys.readouterr().err
    conf.write_text("lr = 'fast'\n")
    assert cli.main(["train", "--config", str(conf), "--out", str(tmp_path / "r")]) == 2
    assert "lr must be a float" in capsys.readouterr().err
    conf.write_text("time_budget = nan\n")  # was: trained forever, recorded as -inf
    assert cli.main(["train", "--config", str(conf), "--out", str(tmp_path / "r")]) == 2
    assert "time_budget must be a finite number" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    bad = tmp_path / "broken.pt"
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(UserError, match="not a grpo-ctrl checkpoint"):
        load_policy_controller(bad)
    # a pickle that runs code when loaded: named for what it is, not loaded, and torch's
    # advice to retry with weights_only=False is not passed on
    marker = tmp_path / "code-ran"
    torch.save({"format": _RunsCode(str(marker))}, tmp_path / "evil.pt")
    assert cli.main(["eval", str(tmp_path / "evil.pt")]) == 2
    err = capsys.readouterr().err
    assert "is not a grpo-ctrl checkpoint" in err and "weights_only" not in err, err
    assert err.count("\n") == 1 and not marker.exists()
    empty = tmp_path / "emptyrun"
    empty.mkdir()
    with pytest.raises(UserError, match="has no checkpoint"):
        load_policy_controller(empty)
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(UserError, match="not a grpo-ctrl policy checkpoint"):
        load_policy_controller(tmp_path / "other.pt")


def test_config_files_checkpoints_and_run_folders_of_earlier_versions(run_folder, tmp_path,
                                                                       capsys):
    """What earlier versions wrote still reads: a removed field at the value that meant
    "off" is dropped, a renamed field or value is mapped with a one-line note, an old run
    folder's best.pt is its deployed checkpoint. A removed field, or loss type, that asks
    for what is gone is a one-line error naming it, exit 2; so is a checkpoint of a removed
    policy (per-state std, gSDE)."""
    import argparse
    import shutil
    from grpo_ctrl.policy import GaussianPolicy, read_checkpoint
    from grpo_ctrl.train import add_arguments, resolve
    conf = tmp_path / "old.toml"
    conf.write_text('trust_region = "adaptive"\ncontinuation = "policy"\nsde = false\n'
                    'noise_corr = 0.0\nlr_decay = "linear"\nreward_form = "outcome"\n')
    p = argparse.ArgumentParser()
    add_arguments(p)
    *_, cfg, _, _ = resolve(p.parse_args(["--config", str(conf), "--out", str(tmp_path / "r")]))
    assert (cfg.loss_type, cfg.continuation) == ("adaptive_clip", "mean")
    notes = capsys.readouterr().err.splitlines()
    assert len(notes) == 2
    assert "trust_region = 'adaptive' is now loss_type = 'adaptive_clip'" in notes[0]
    assert "continuation = 'policy' is now continuation = 'mean'" in notes[1]
    assert p.parse_args(["--continuation", "policy"]).continuation == "mean"  # the old flag
    for text, named in (("noise_corr = 0.5\n", "noise_corr = 0.5 was removed"),
                        ('trust_region = "cispo"\n', "'cispo' was removed"),
                        ('lr_decay = "exponential"\n', "lr_decay = 'exponential' was removed"),
                        ("probes = 2\n", "probes = 2 was removed")):
        conf.write_text(text)
        assert cli.main(["train", "--config", str(conf), "--out", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err
        assert named in err and err.count("\n") == 1, err
    assert not (tmp_path / "r").exists()
    old = tmp_path / "old-run"
    shutil.copytree(run_folder, old)
    (old / "deployed.pt").rename(old / "best.pt")
    assert load_policy_controller(old).source_info["checkpoint"].endswith("best.pt")
    ck = read_checkpoint(old / "best.pt")
    # resumed, the old folder's best.pt becomes its deployed.pt, which the run then updates
    config = (old / "config.toml").read_text()
    assert 'loss_type = "clip"' in config
    (old / "config.toml").write_text(config.replace('loss_type = "clip"',
                                                    'trust_region = "fixed"\nsde = false'))
    assert cli.main(["train", "--out", str(old), "--resume", "--iterations", "4",
                     "--quiet"]) == 0
    assert not (old / "best.pt").exists()
    assert load_policy_controller(old).source_info["checkpoint"].endswith("deployed.pt")
    ck["arch"]["sde"] = True
    with pytest.raises(UserError, match="uses sde, which was removed"):
        GaussianPolicy.from_checkpoint(ck)


class _RunsCode:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_existing_run_folder_is_not_overwritten(run_folder, capsys):
    assert cli.main(["train", "--out", str(run_folder), "--iterations", "1"]) == 2
    assert "already exists" in capsys.readouterr().err


def test_eval_prints_the_scores(run_folder, capsys):
    assert cli.main(["eval", str(run_folder), "--episodes", "5"]) == 0
    out = capsys.readouterr().out
    for word in ("mean return", "median return", "worst return", "success"):
        assert word in out


@pytest.mark.parametrize("overrides", [
    {"adv_scale": "batch"}, {"adv_scale": "none"},
    {"loss_agg": "grpo"}, {"loss_agg": "dr_grpo"}, {"beta": 0.1, "ref_refresh": 2},
    {"loss_type": "adaptive_clip"}, {"loss_type": "sapo", "epochs": 2},
    {"continuation": "greedy"}, {"continuation": "softmax"}, {"continuation": "mean"},
    {"epochs": 2, "minibatches": 4}, {"action_repeat": 3},
    {"activation": "elu", "layers": 1}, {"w_smooth": 0.1, "w_du": 0.1},
])
def test_every_variant_trains(overrides):
    cfg = GRPOConfig(num_starts=8, group_size=4, horizon=16, loss_steps=8, **overrides)
    tr = Trainer(cfg, "pendulum", "gym")
    before = [p.detach().clone() for p in tr.policy.parameters()]
    rows = [tr.step() for _ in range(3)]
    for key in ("branch_return", "kl_old", "kl_ref", "clip_low", "clip_high", "entropy",
                "grad_norm"):
        assert all(np.isfinite(r[key]) for r in rows), key
    assert all(r["kl_old"] >= 0 for r in rows)
    assert (rows[-1]["kl_ref"] > 0) == (cfg.beta > 0)
    assert rows[-1]["sim_steps"] == 3 * 8 * 4 * 16 * cfg.action_repeat
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.policy.parameters()))


def test_gym_evaluation_matches_a_plain_gymnasium_loop(run_folder):
    import gymnasium as gym
    from grpo_ctrl.controller import act
    from grpo_ctrl.closed_loop import evaluate_on_gym
    ctrl = load_policy_controller(run_folder)
    returns = []
    for i in range(3):
        env = gym.make("Pendulum-v1")
        obs, _ = env.reset(seed=10 + i)
        total, done = 0.0, False
        while not done:
            obs, r, term, trunc, _ = env.step(act(ctrl, obs[None].astype(np.float32)))
            total, done = total + r, term or trunc
        returns.append(total)
    scores = evaluate_on_gym(ctrl, 3, seed=10)
    assert scores["mean"] == pytest.approx(np.mean(returns), rel=1e-9)
    assert scores["worst"] == pytest.approx(min(returns), rel=1e-9)


def test_gym_evaluation_refuses_other_plants():
    from grpo_ctrl.controller import load_controller
    from grpo_ctrl.closed_loop import evaluate_on_gym
    with pytest.raises(UserError, match="pendulum/gym preset"):
        evaluate_on_gym(load_controller("lqr", "cartpole", "gym"), 2)


def test_the_overlap_collector_dies_with_a_killed_trainer(tmp_path):
    """SIGKILL of the trainer (no chance to clean up) must not leave the
    forked collector blocked in a pipe write, holding its memory."""
    code = ("import time; from grpo_ctrl.grpo import Trainer;"
            "from grpo_ctrl.grpo_config import GRPOConfig;"
            "t = Trainer(GRPOConfig(overlap=True, num_starts=8, group_size=4, horizon=16,"
            " loss_steps=8), 'pendulum', 'gym'); t.step();"
            "print(t._collector._link.process.pid, flush=True); time.sleep(60)")
    trainer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    collector = int(trainer.stdout.readline())
    os.kill(trainer.pid, signal.SIGKILL)
    trainer.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(collector, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{collector}/stat") as fh:  # a zombie is gone in all but name
            if fh.read().split(")")[-1].split()[0] == "Z":
                return
        time.sleep(0.05)
    raise AssertionError(f"collector {collector} outlived its trainer")


def test_a_trainer_never_closed_lets_python_exit_and_its_collector_end():
    """The collector ignores SIGTERM (the trainer decides when to stop), so
    multiprocessing's exit hook, which terminates then joins daemon children,
    waited forever for one nobody closed: pytest itself hung after its summary.
    Exit, and garbage collection, must stop it."""
    code = ("import gc; from grpo_ctrl.grpo import Trainer;"
            "from grpo_ctrl.grpo_config import GRPOConfig;"
            "cfg = GRPOConfig(overlap=True, num_starts=8, group_size=4, horizon=16, loss_steps=8);"
            "t = Trainer(cfg, 'pendulum', 'gym'); t.step();"
            "p = t._collector._link.process; del t; gc.collect();"
            "assert not p.is_alive(), 'collector alive after its trainer was collected';"
            "kept = Trainer(cfg, 'pendulum', 'gym'); kept.step();"
            "from grpo_ctrl import overlap;"
            "assert len(overlap._unclosed) == 1, 'the collected one stays registered';"
            "print(kept._collector._link.process.pid, flush=True)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    collector = int(done.stdout)
    with pytest.raises(ProcessLookupError):
        os.kill(collector, 0)


def test_every_hyperparameter_documents_itself():
    """--help and the config check read each field's doc and choices from the
    dataclass metadata: no field may lack them."""
    from dataclasses import fields
    from grpo_ctrl.grpo_config import CHOICES
    for f in fields(GRPOConfig):
        assert f.metadata.get("doc"), f.name
    assert set(CHOICES) == {"continuation", "adv_scale", "loss_agg", "loss_type", "activation",
                            "smooth_terms", "deploy", "starts"}


def test_train_help_lists_the_fields_by_section(capsys):
    """grpo-ctrl train --help: one group per section, in SECTIONS' order, each listing its
    fields' flags and no other's; every field belongs to a section."""
    from dataclasses import fields
    from grpo_ctrl.grpo_config import SECTIONS
    # costs_from, costs_early: the double pendulum's score; starts: its robustness; catch:
    # the acrobot's balance; init: its fine-tuning on whole episodes
    assert len(fields(GRPOConfig)) <= 50
    assert cli.main(["train", "--help"]) == 0
    text = capsys.readouterr().out
    heads = [text.index(f"GRPO: {name} ") for name in SECTIONS]
    assert heads == sorted(heads)
    for f in fields(GRPOConfig):
        i = SECTIONS.index(f.metadata["section"])
        end = heads[i + 1] if i + 1 < len(heads) else len(text)
        assert "  --" + f.name.replace("_", "-") + " " in text[heads[i]:end], f.name


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig, processes", [
    (signal.SIGTERM, ["--overlap", "true"]), (signal.SIGHUP, ["--overlap", "true"]),
    (signal.SIGTERM, ["--overlap", "false", "--nproc", "2"])], ids=["TERM", "HUP", "TERM-2-ranks"])
def test_a_signal_stops_training_cleanly_and_resume_repeats_no_iteration(sig, processes, tmp_path,
                                                                         capsys):
    """SIGTERM (timeout, systemd) and SIGHUP (terminal closed), sent to the
    whole process group as `timeout` and a terminal do, end `train` like
    Ctrl-C: the collector (or the other ranks) stop, the checkpoint matches the metrics, and a
    resume after a crash-cut metrics line continues without repeating one."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "grpo_ctrl.cli", "train", "--out", str(out), "--quiet",
            *processes, "--num-starts", "8", "--group-size", "4", "--horizon", "16",
            "--loss-steps", "8", "--eval-every", "0.2", "--eval-episodes", "8",
            "--time-budget", "600"]
    train = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    from grpo_ctrl.run_folder import read_metrics
    deadline = time.monotonic() + 120
    while len(read_metrics(out / "metrics.jsonl")) < 5:
        assert train.poll() is None and time.monotonic() < deadline, train.communicate()
        time.sleep(0.1)
    children = [int(p) for p in os.listdir("/proc")
                if p.isdigit() and _parent_of(int(p)) == train.pid]
    assert children, "no collector or worker process"
    os.killpg(train.pid, sig)
    _, err = train.communicate(timeout=120)
    assert train.returncode == 128 + sig, err
    assert err.strip().count("\n") == 0 and f"stopped by {signal.Signals(sig).name}" in err, err
    deadline = time.monotonic() + 10
    while _group_alive(train.pid):  # the collector, had it been left behind
        assert time.monotonic() < deadline, f"processes left in the group: {children}"
        time.sleep(0.05)
    for name in ("config.toml", "metrics.jsonl", "curve.png", "latest.pt", "deployed.pt"):
        assert (out / name).is_file(), name
    rows = read_metrics(out / "metrics.jsonl")
    stopped_at = torch.load(out / "latest.pt", weights_only=True)["trainer"]["iteration"]
    assert [r["iteration"] for r in rows] == list(range(1, stopped_at + 1))

    # what a SIGKILL mid-write leaves: a row past the checkpoint, then a cut-short line
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({**rows[-1], "iteration": stopped_at + 1}) + "\n")
        fh.write('{"iteration": ' + str(stopped_at + 2) + ', "wall_ti')
    (out / "curve.png").unlink()
    assert cli.main(["train", "--out", str(out), "--resume", "--iterations",
                     str(stopped_at + 3), "--quiet"]) == 0
    iterations = [r["iteration"] for r in read_metrics(out / "metrics.jsonl")]
    assert iterations == list(range(1, stopped_at + 4))
    assert (out / "curve.png").is_file()


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
def test_randomize_table_then_flags_and_the_hardware_presets_draw_by_default(tmp_path):
    from grpo_ctrl.train import add_arguments, resolve
    from grpo_ctrl.randomize import default_randomization
    import argparse
    p = argparse.ArgumentParser()
    add_arguments(p)
    *_, r = resolve(p.parse_args(["--preset", "rig", "--out", str(tmp_path / "a")]))
    assert r == default_randomization("pendulum", "rig") and r.active
    *_, r = resolve(p.parse_args(["--preset", "gym", "--out", str(tmp_path / "b")]))
    assert not r.active
    conf = tmp_path / "c.toml"
    conf.write_text('preset = "rig"\n[randomize]\nparams = 0.1\ndelay = [1, 2]\n')
    *_, r = resolve(p.parse_args(["--config", str(conf), "--randomize", "delay=2,3",
                                  "--out", str(tmp_path / "c")]))
    assert (r.params, r.delay) == (0.1, (2, 3))
    assert r.motor_k == default_randomization("pendulum", "rig").motor_k  # the rest: defaults


@pytest.mark.parametrize("deploy", ["best", "final"])
def test_deployed_pt_holds_the_best_evaluation_or_the_final_policy(tmp_path, deploy):
    """deploy = best: deployed.pt is the checkpoint of the highest evaluation return
    in the metrics; deploy = final: it is the last policy, weights and all."""
    from grpo_ctrl.policy import read_checkpoint
    from grpo_ctrl.run_folder import read_metrics
    out = tmp_path / "run"
    assert cli.main(["train", "--preset", "rig", "--out", str(out), "--iterations", "6",
                     "--time-budget", "0", "--num-starts", "4", "--group-size", "2",
                     "--eval-every", "0", "--eval-episodes", "2", "--lr", "0.05",
                     "--overlap", "false", "--deploy", deploy, "--quiet"]) == 0
    best, latest = read_checkpoint(out / "deployed.pt"), read_checkpoint(out / "latest.pt")
    evals = [(row["eval_return"], row["iteration"]) for row in read_metrics(out / "metrics.jsonl")
             if row["eval_return"] is not None]
    assert len(evals) == 6 and latest["trainer"]["iteration"] == 6
    if deploy == "final":
        assert best["trainer"]["iteration"] == 6
        assert all(torch.equal(best["net"][k], latest["net"][k]) for k in latest["net"])
    else:
        top = max(e for e, _ in evals)
        assert best["eval_return"] == top >= latest["eval_return"]
        assert best["trainer"]["iteration"] == min(i for e, i in evals if e == top)


def test_deploy_score_keeps_the_evaluation_with_the_best_benchmark_score(tmp_path, monkeypatch):
    """deploy = score: deployed.pt is the policy of the evaluation whose benchmark run scored
    highest (here a scripted sequence of scores, the final evaluation's last), whatever its
    return; the score of each evaluation is in the metrics and the checkpoints."""
    from grpo_ctrl import train
    from grpo_ctrl.policy import read_checkpoint
    from grpo_ctrl.run_folder import read_metrics
    scripted = iter([0.1, 0.6, 0.3, 0.6, 0.2, 0.4, 0.5])
    monkeypatch.setattr(train, "benchmark_score", lambda controller: next(scripted))
    out = tmp_path / "run"
    assert cli.main(["train", "--system", "double_pendulum", "--preset", "pendubot",
                     "--out", str(out), "--iterations", "6", "--time-budget", "0",
                     "--num-starts", "2", "--group-size", "2", "--horizon", "4",
                     "--loss-steps", "2", "--eval-every", "0", "--eval-episodes", "1",
                     "--lr", "0.05", "--overlap", "false", "--deploy", "score",
                     "--quiet"]) == 0
    rows = [r for r in read_metrics(out / "metrics.jsonl") if r["eval_return"] is not None]
    assert [r["eval_score"] for r in rows] == [0.1, 0.6, 0.3, 0.6, 0.2, 0.4]
    deployed, latest = read_checkpoint(out / "deployed.pt"), read_checkpoint(out / "latest.pt")
    assert deployed["trainer"]["iteration"] == 2  # the first 0.6; the final 0.5 is lower
    assert (deployed["eval_score"], deployed["best_score"]) == (0.6, 0.6)
    assert (latest["eval_score"], latest["best_score"]) == (0.5, 0.6)
    assert not all(torch.equal(deployed["net"][k], latest["net"][k]) for k in latest["net"])


def test_deploy_score_records_the_score_eval_prints(tmp_path, capsys):
    """The score deploy = score chooses by is the one `grpo-ctrl eval RUN --score realaigym`
    prints for the deployed policy: its run of 10 s from hanging on the benchmark model."""
    from grpo_ctrl.policy import read_checkpoint
    out = tmp_path / "run"
    assert cli.main(["train", "--system", "double_pendulum", "--preset", "pendubot-real",
                     "--out", str(out), "--iterations", "2", "--time-budget", "0",
                     "--num-starts", "2", "--group-size", "2", "--horizon", "4",
                     "--loss-steps", "2", "--eval-every", "0", "--eval-episodes", "1",
                     "--overlap", "false", "--deploy", "score", "--quiet"]) == 0
    capsys.readouterr()
    assert cli.main(["eval", str(out), "--score", "realaigym"]) == 0
    table = capsys.readouterr().out
    assert "double_pendulum/pendubot)" in table  # the -real preset's robot's benchmark model
    printed = table.split("RealAI score")[1].split()[0]
    assert printed == f"{read_checkpoint(out / 'deployed.pt')['best_score']:.3f}"


def test_deploy_calm_rule():
    """The latest candidate that chatters no more than swing-up + LQR and succeeds
    as often as the final policy; else the calmest of those that succeed as often.
    Measurements scripted per iteration (the rule, apart from the simulator)."""
    from grpo_ctrl.deploy import CalmChoice
    from grpo_ctrl.grpo import make_policy
    from grpo_ctrl.plant import plant_spec

    def choice(measured: dict[int, tuple[float, float]], reference: float):
        calm = CalmChoice(plant_spec("pendulum", "rig"))
        for it in measured:
            calm.offer(it, make_policy(GRPOConfig(), calm.spec))
        values = iter([(reference, 1.0)] + [measured[it] for it in sorted(measured)[::-1]])
        calm._measure = lambda controller: next(values)
        chosen, record = calm.choose()
        return chosen.iteration, [c[0] for c in record["candidates"]]

    # 30 chatters, 20 is calm: the search stops there
    assert choice({10: (0.01, 1.0), 20: (0.05, 1.0), 30: (0.12, 1.0)}, 0.067) == (20, [30, 20])
    # a calm candidate that fails more often than the final one is passed over
    assert choice({10: (0.03, 1.0), 20: (0.02, 0.9), 30: (0.12, 1.0)}, 0.067) == (10, [30, 20, 10])
    # none calm: the calmest that succeeds as often
    assert choice({10: (0.08, 1.0), 20: (0.07, 0.9), 30: (0.12, 1.0)}, 0.067) == (10, [30, 20, 10])
    assert choice({30: (0.01, 0.0)}, 0.067) == (30, [30])


def test_deploy_calm_writes_the_measured_candidate(tmp_path):
    """A real run: deployed.pt holds the policy whose chatter the record reports for
    the deployed iteration, measured again here on the same episodes; every
    later candidate chattered more than swing-up + LQR."""
    from grpo_ctrl.deploy import CALM_EPISODES, CALM_SEED
    from grpo_ctrl.policy import read_checkpoint
    out = tmp_path / "run"
    assert cli.main(["train", "--preset", "rig", "--out", str(out), "--iterations", "6",
                     "--time-budget", "0", "--num-starts", "4", "--group-size", "2",
                     "--eval-episodes", "2", "--lr", "0.05", "--overlap", "false",
                     "--deploy", "calm", "--calm-window", "1", "--calm-every", "2",
                     "--quiet"]) == 0
    record = read_checkpoint(out / "deployed.pt")["calm"]
    its = [c[0] for c in record["candidates"]]
    assert its == [6, 4, 2][:len(its)] and record["deployed_iteration"] in its
    chatter = {it: ch for it, ch, _ in record["candidates"]}
    deployed = evaluate(load_policy_controller(out), CALM_EPISODES, seed=CALM_SEED)
    assert float(np.mean(deployed.du_sign_changes)) == chatter[record["deployed_iteration"]]
    later = [ch for it, ch in chatter.items() if it > record["deployed_iteration"]]
    assert all(ch > record["reference_chatter"] for ch in later)


def test_run_folder_records_the_randomisation(tmp_path):
    from grpo_ctrl.train import read_toml
    out = tmp_path / "run"
    assert cli.main(["train", "--preset", "rig", "--out", str(out), "--iterations", "1",
                     "--time-budget", "0", "--num-starts", "4", "--group-size", "2",
                     "--eval-episodes", "2", "--overlap", "false", "--randomize", "delay=1,2",
                     "--quiet"]) == 0
    table = read_toml(str(out / "config.toml"))["randomize"]
    assert table["delay"] == [1, 2] and table["params"] == 0.35
    from grpo_ctrl.policy import read_checkpoint
    assert read_checkpoint(out / "deployed.pt")["randomize"] == table


def test_an_iteration_limit_without_a_time_budget_shows_an_iteration_bar(tmp_path, capsys,
                                                                         monkeypatch):
    """--time-budget 0 (no limit) with --iterations: the progress bar counts
    iterations (its seconds format once failed on a missing total). The bar
    is for a terminal (tests/test_train_log.py: a log gets plain lines)."""
    from grpo_ctrl import train_log
    monkeypatch.setattr(train_log, "_terminal", lambda: True)
    assert cli.main(["train", "--out", str(tmp_path / "run"), "--iterations", "2",
                     "--time-budget", "0", "--num-starts", "4", "--group-size", "2",
                     "--horizon", "8", "--loss-steps", "4", "--eval-episodes", "2",
                     "--overlap", "false"]) == 0
    err = capsys.readouterr()
    assert "for 2 iterations" in err.out and "2/2" in err.err
    # no tqdm monitor thread left to take the GIL from a later control loop (grpo-ctrl demo)
    assert not [t for t in threading.enumerate() if type(t).__name__ == "TMonitor"]


def test_fourier_features_feed_sin_of_the_normalised_observation_and_stay_fixed(tmp_path):
    """features: the first layer sees [sin(x B + b), x] of the normalised observation x,
    computed here by hand in numpy (float64); B and b are drawn once, from the run's seed,
    and no update moves them; saved, loaded and copied, the policy is the same."""
    from grpo_ctrl.policy import GaussianPolicy
    cfg = GRPOConfig(num_starts=4, group_size=4, horizon=16, loss_steps=8, overlap=False,
                     seed=2, iterations=1, time_budget=0.0, threads=1, features=8,
                     feature_scale=2.0)
    tr = Trainer(cfg, "pendulum", "gym")
    features = tr.policy.net[0]
    B, b = features.B.clone(), features.b.clone()
    assert B.shape == (3, 8) and b.shape == (8,)
    assert 1.0 < float(B.std()) < 3.5 and 0.0 <= float(b.min()) and float(b.max()) < 2 * np.pi
    again = Trainer(cfg, "pendulum", "gym").policy.net[0]
    assert torch.equal(again.B, B) and torch.equal(again.b, b)  # from the seed
    batch = tr.rollout.collect(tr.policy, tr.gen)
    x = batch.obs.reshape(-1, 3)
    x64, B64, b64 = (t.double().numpy() for t in (x, B, b))
    by_hand = np.concatenate([np.sin(x64 @ B64 + b64), x64], axis=1)
    first = tr.policy.net[1]
    w, c = first.weight.detach().double().numpy(), first.bias.detach().double().numpy()
    with torch.no_grad():
        got = first(features(x)).double().numpy()
    assert np.allclose(got, by_hand @ w.T + c, atol=1e-4)
    tr.step()
    assert torch.equal(features.B, B) and torch.equal(features.b, b)
    assert not torch.equal(first.weight, torch.as_tensor(w, dtype=torch.float32))  # it learned
    _assert_saved_and_copied_alike(tr, batch, tmp_path, GaussianPolicy(
        tr.spec.nobs, tr.spec.u_max, features=8, feature_scale=2.0))


def _assert_saved_and_copied_alike(tr: Trainer, batch, tmp_path, copy) -> None:
    """Saved and loaded, and copied as the overlap collector receives it (into ``copy``),
    the policy has the same distribution; the loaded controller acts on the mean alone."""
    from grpo_ctrl.overlap import PolicySlots
    from grpo_ctrl.policy import GaussianPolicy, read_checkpoint, save_checkpoint
    path = tmp_path / "p.pt"
    save_checkpoint(tr.policy.checkpoint(tr.spec, vars(tr.cfg)), path)
    back = GaussianPolicy.from_checkpoint(read_checkpoint(path))
    slots = PolicySlots(copy)
    slots.read(slots.write(tr.policy), copy)
    with torch.no_grad():
        for loaded in (back, copy):
            for a, b in zip(tr.policy.dist(batch.obs), loaded.dist(batch.obs)):
                assert torch.equal(a, b)
        obs = batch.raw_loss_obs.reshape(-1, batch.raw_loss_obs.shape[-1])
        command = back.controller(tr.spec)(obs).squeeze(-1)
        expected = tr.spec.u_max * torch.tanh(tr.policy.mu(tr.policy.normalise(obs)))
    assert torch.allclose(command, expected, atol=1e-5)


@pytest.mark.parametrize("continuation", ["random", "mean"])
def test_the_noise_is_the_iid_draws_of_the_generator_scaled_by_the_one_std(continuation):
    """Each step's noise is the iid draw of the trainer's generator, scaled by the one std,
    bit for bit; with continuation mean, branch 0 of each group draws none (it follows the
    mean action) and is left out of the loss."""
    cfg = GRPOConfig(num_starts=4, group_size=4, horizon=16, loss_steps=8, overlap=False,
                     seed=2, log_std_min=-1.0, continuation=continuation, **SHORT)
    tr = Trainer(cfg, "pendulum", "gym")
    state = tr.gen.get_state()
    batch = tr.rollout.collect(tr.policy, tr.gen)
    draws = torch.randn(16, 16, generator=torch.Generator().set_state(state))[:8].T
    first = torch.arange(4) * 4
    if continuation == "mean":
        draws[first] = 0.0
    with torch.no_grad():
        assert torch.equal(batch.z, batch.mu_old + draws * torch.exp(tr.policy.log_std))
    assert bool((batch.mask[first] == 0).all()) == (continuation == "mean")
    assert bool((batch.mask[first + 1] == 1).all())


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("features", [0, 16])
def test_the_policy_mean_without_module_calls_is_the_networks_own_bit_for_bit(activation, features):
    """policy.mu skips nn.Module's call machinery (the rollout's speed);
    nn.Sequential's own forward is the reference, values and gradients alike."""
    torch.manual_seed(0)
    policy = GaussianPolicy(3, 2.0, hidden=24, layers=3, activation=activation,
                            features=features, feature_scale=3.0)
    with torch.no_grad():
        for p in policy.net.parameters():
            p.normal_()  # not the near-zero head of a fresh policy: every layer matters
    x = torch.randn(257, 3)
    assert torch.equal(policy.mu(x), policy.net(x).squeeze(-1))
    grads = []
    for forward in (lambda: policy.mu(x), lambda: policy.net(x).squeeze(-1)):
        policy.zero_grad()
        (forward() ** 2).sum().backward()
        grads.append([p.grad.clone() for p in policy.net.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_plain_sin_is_torchs_sine_and_keeps_the_gradient():
    """The features' sine by numpy (the rollout's speed) agrees with torch.sin to an ulp,
    and where a gradient is wanted it is torch's own op, with d sin = cos."""
    x = torch.linspace(-40.0, 40.0, 9_999).reshape(101, 99)
    assert torch.allclose(plain_sin(x), torch.sin(x), rtol=0.0, atol=1.2e-7)
    w = x.clone().requires_grad_(True)
    plain_sin(w).sum().backward()
    assert torch.allclose(w.grad, torch.cos(x), rtol=0.0, atol=1.2e-7)


def test_a_run_starts_from_a_trained_policy_and_keeps_its_normaliser(run_folder, tmp_path):
    """init: the new run's policy computes the trained one's function before its first
    update, its normaliser stays that policy's through the updates (the network moves), and
    the plant and the network's shape come from the checkpoint (hidden 16 and no features,
    where the gym pendulum's defaults are 32 and 64)."""
    small, out = tmp_path / "small", tmp_path / "tuned"
    assert cli.main(["train", "--system", "pendulum", "--out", str(small), "--iterations", "2",
                     "--time-budget", "0", "--hidden", "16", "--features", "0", "--quiet",
                     "--overlap", "false"]) == 0
    assert cli.main(["train", "--init", str(small / "latest.pt"), "--out", str(out),
                     "--iterations", "3", "--time-budget", "0", "--eval-episodes", "4",
                     "--quiet", "--overlap", "false"]) == 0
    conf = (out / "config.toml").read_text()
    assert 'system = "pendulum"' in conf and "hidden = 16" in conf and "features = 0" in conf
    source, _, _ = load_policy(run_folder)
    cfg = replace(default_config("pendulum", "gym", init=str(run_folder)), **SHORT)
    tr = Trainer(cfg, "pendulum", "gym")
    obs = torch.from_numpy(BatchSim("pendulum", 64, "gym", seed=9).observe().copy())
    before = tr.policy.controller(tr.spec)(obs)
    assert torch.equal(before, source.controller(tr.spec)(obs))
    norm = source.obs_norm.state_dict()
    for _ in range(3):
        tr.step()
    tr.close()
    after = tr.policy.obs_norm.state_dict()
    assert torch.equal(after["mean"], norm["mean"]) and torch.equal(after["var"], norm["var"])
    assert after["count"] == norm["count"]
    assert not torch.equal(tr.policy.controller(tr.spec)(obs), before)


@pytest.mark.parametrize("extra, message", [
    (["--hidden", "64"], "hidden = 64, but the policy of init"),
    (["--system", "furuta"], "was trained on pendulum/gym, not furuta/qube-servo2"),
])
def test_init_refuses_a_policy_that_does_not_fit_before_any_work(run_folder, tmp_path, extra,
                                                                 message, capsys):
    out = tmp_path / "never"
    assert cli.main(["train", "--init", str(run_folder), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1
    assert not out.exists()


def test_init_names_a_missing_run_in_one_line(tmp_path, capsys):
    assert cli.main(["train", "--init", str(tmp_path / "nothing"), "--out",
                     str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "never").exists()


def test_the_acrobots_fine_tuning_rolls_whole_benchmark_episodes_with_costs_as_the_score():
    """The acrobot's fine-tuning defaults: every branch is a whole episode from the start
    (the benchmark's 10 s from hanging), all of it in the loss, undiscounted, every
    trajectory restarting; its costs of effort at costs_early throughout, above the plant's
    own weights (towards the score's ratios)."""
    cfg = default_config("double_pendulum", "acrobot", init="a run")
    sim = BatchSim("double_pendulum", 1, "acrobot")
    assert cfg.horizon * cfg.action_repeat == sim.spec.max_steps
    assert (cfg.loss_steps, cfg.gamma, cfg.reset_prob) == (cfg.horizon, 1.0, 1.0)
    assert cfg.costs_from == 1.0 and cfg.costs_early > 1.0
    m = sim.model
    x, u = np.array([2.0, -0.7, 1.5, -2.5]), np.float32(3.0)
    # the acrobot's motor drives the elbow: its power is u times the elbow's velocity
    effort = m.w_u * 9.0 + m.w_x[2] * 1.5**2 + m.w_x[3] * 2.5**2 + m.w_power * 3.0 * 2.5
    h = (0.2 * np.cos(2.0) + 0.3 * np.cos(2.0 - 0.7)) / 0.5  # below 0.9: w_down applies
    sim.scale_costs(cfg.costs_early)
    sim.set_state({"x": x[None]})
    want = -(m.w_height * (1 - h) + m.w_down + cfg.costs_early * effort)
    assert sim.step(np.array([u]))[1][0] == pytest.approx(want, rel=1e-13)
