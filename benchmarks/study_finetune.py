"""Study (research §19; removed from the product in the next commit, which has `train --init`):
fine-tune a trained double-pendulum policy on whole 10 s episodes from hanging (the
benchmark's one start), GRPO over branches of the full episode, the reward's costs at
score-like weights, optionally a cost for ending below the line (--fail). Scores the
deterministic controller (simulation v2) every --every iterations.

    python benchmarks/study_finetune.py RUN --iters 1000 --every 50 --lr 5e-5 --group 32 \
        --log-std -2.5 --w-smooth 3 --wheight 0 [--fail 8000]
"""
import argparse, copy, json, math, sys, time
import numpy as np, torch
from grpo_ctrl.grpo import Trainer
from grpo_ctrl.grpo_config import GRPOConfig
from grpo_ctrl.policy import GaussianPolicy, read_checkpoint
from grpo_ctrl.train import read_toml
from grpo_ctrl import realaigym_double as rd
from dataclasses import fields

ap = argparse.ArgumentParser()
ap.add_argument("run"); ap.add_argument("--ck", default="deployed.pt")
ap.add_argument("--iters", type=int, default=200)
ap.add_argument("--starts", type=int, default=4); ap.add_argument("--group", type=int, default=16)
ap.add_argument("--repeat", type=int, default=5)
ap.add_argument("--lr", type=float, default=3e-4); ap.add_argument("--log-std", type=float, default=-1.5)
ap.add_argument("--cost", type=float, default=2.5); ap.add_argument("--fail", type=float, default=8000.0)
ap.add_argument("--w-du", type=float, default=None); ap.add_argument("--w-smooth", type=float, default=None)
ap.add_argument("--epochs", type=int, default=1); ap.add_argument("--minibatches", type=int, default=4)
ap.add_argument("--adv", default="group"); ap.add_argument("--every", type=int, default=10)
ap.add_argument("--seed", type=int, default=0); ap.add_argument("--out", default=None)
ap.add_argument("--wheight", type=float, default=None)
a = ap.parse_args()

conf = read_toml(f"{a.run}/config.toml")
preset = conf["preset"]
cfg = GRPOConfig()
for f in fields(GRPOConfig):
    if f.name in conf:
        setattr(cfg, f.name, float(conf[f.name]) if f.type == "float" and isinstance(conf[f.name], int) else conf[f.name])
H = 5000 // a.repeat
cfg.action_repeat, cfg.horizon, cfg.loss_steps, cfg.gamma = a.repeat, H, H, 1.0
cfg.num_starts, cfg.group_size, cfg.reset_prob = a.starts, a.group, 1.0
cfg.lr, cfg.overlap, cfg.seed, cfg.log_std_min = a.lr, False, a.seed, -4.0
cfg.epochs, cfg.minibatches, cfg.adv_scale = a.epochs, a.minibatches, a.adv
cfg.iterations, cfg.time_budget = a.iters, 0.0
if a.w_du is not None: cfg.w_du = a.w_du
if a.w_smooth is not None: cfg.w_smooth = a.w_smooth
tr = Trainer(cfg, "double_pendulum", preset)
ck = read_checkpoint(f"{a.run}/{a.ck}")
pol = GaussianPolicy.from_checkpoint(ck)
tr.policy.load_state_dict(pol.state_dict())
tr.policy.obs_norm.load_state_dict(pol.obs_norm.state_dict())
tr.policy.refresh_norm()
norm_state = copy.deepcopy(tr.policy.obs_norm.state_dict())
tr.policy.refresh_norm = lambda: None  # the normaliser frozen: the function it learned stays
with torch.no_grad():
    tr.policy.log_std.fill_(a.log_std)
tr.rollout.set_cost_scale(a.cost)
for sim in (tr.rollout.pool, tr.rollout.group, tr.rollout.snapshot):
    if a.wheight is not None:
        sim._model.w_height = a.wheight
spec = tr.spec
l1, l2 = 0.2, 0.3

orig_roll = tr.rollout._roll
def roll(policy, sim, spread):
    raw, z, mu, rewards, alive = orig_roll(policy, sim, spread)
    o = raw[-1].numpy()
    c1, s1, c2, s2 = o[:, 0], o[:, 1], o[:, 2], o[:, 3]
    h = (l1 * c1 + l2 * (c1 * c2 - s1 * s2)) / (l1 + l2)
    rewards[-1] -= a.fail * (h < 0.9)
    roll.fail = float((h < 0.9).mean())
    return raw, z, mu, rewards, alive
roll.fail = 0.0
tr.rollout._roll = roll

def score():
    p = copy.deepcopy(tr.policy)
    p.obs_norm.load_state_dict(norm_state)
    c = p.controller(spec, catch=cfg.catch)
    (t,) = rd.simulate(rd.controller_policy(c), rd.robot_of(preset))
    return rd.evaluate(t), p

best = -1
t0 = time.time()
for it in range(a.iters + 1):
    if it % a.every == 0:
        ev, p = score()
        crit = {k: round(float(v), 4) for k, v in ev.items() if k not in ("success",)}
        print(json.dumps({"it": it, "s": round(time.time() - t0), "fail": roll.fail, **crit}), flush=True)
        if a.out and ev["score"] > best:
            best = ev["score"]
            torch.save({"policy": p.state_dict(), "norm": norm_state, "it": it, "score": best}, a.out)
    if it == a.iters:
        break
    frac = it / a.iters
    for g in tr.opt.param_groups:
        g["lr"] = a.lr * (1 - 0.9 * frac)
    m = tr.step()
print("best", best)
