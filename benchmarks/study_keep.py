#!/usr/bin/env python3
"""Does GRPO keep a near-optimal policy? (docs/grpo.md §9, seventh pass)

A network is fitted to the dynamic-programming optimum's commands as in
``study_capacity.py`` (by default 128 x 3 with its fastest recipe: within ~0.5 of the
optimum), then trained on by GRPO with the gym pendulum's defaults (the same network,
``--overlap false``) at a fixed learning rate, the observation normaliser held at the fitted
one so that only the weights move. Every ``--every`` iterations the policy's mean action is
scored on the 1,000 held-out episodes, paired with the optimum. If GRPO's objective had its
maximum elsewhere (the noisy policy's, the 64-step discounted look-ahead's), the policy would
walk away from the optimum at any step size; if it stays, what holds GRPO below the optimum
from scratch is how it gets there, not where it is going.

    python benchmarks/study_keep.py --grpo-lr 1e-4
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

from grpo_ctrl.baselines.optimum import make_optimum
from grpo_ctrl.grpo import Trainer
from grpo_ctrl.grpo_config import default_config
from grpo_ctrl.heldout import near_hanging, score

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from study_capacity import add_fit_options, dagger, paired_row  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="128x3", metavar="WIDTHxLAYERS")
    add_fit_options(p, rounds=4, epochs=4, batch=512, lr=3e-3)
    p.add_argument("--grpo-lr", type=float, default=1e-4, help="GRPO's Adam, constant")
    p.add_argument("--iterations", type=int, default=1200)
    p.add_argument("--every", type=int, default=200)
    p.add_argument("--log-std", type=float, help="GRPO's noise, start and floor (default: "
                   "the gym default's)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    optimum = make_optimum("pendulum", "gym")
    reference, hanging = score(optimum).returns, near_hanging("pendulum", "gym")
    for fitted, *_ in dagger(args.arch, optimum, args):
        pass
    print("| policy | minus the optimum, paired (s.e.) | hanging | rest |")
    print("|---|---|---|---|")
    print(f"| fitted to the optimum ({args.arch}) | "
          f"{paired_row(fitted, optimum, reference, hanging)} |", flush=True)
    cfg = default_config("pendulum", "gym")
    cfg.hidden, cfg.layers = fitted.arch["hidden"], fitted.arch["layers"]
    cfg.features, cfg.feature_scale = fitted.arch["features"], fitted.arch["feature_scale"]
    cfg.seed = args.seed
    cfg.overlap, cfg.time_budget, cfg.eval_every = False, 0.0, 1e9
    if args.log_std is not None:
        cfg.log_std_init = cfg.log_std_min = args.log_std
    trainer = Trainer(cfg, "pendulum", "gym")
    trainer.policy.net.load_state_dict(fitted.net.state_dict())
    for group in trainer.opt.param_groups:
        group["lr"] = args.grpo_lr

    def fitted_normaliser() -> None:  # step() merges each batch into it: undone every time
        trainer.policy.obs_norm.load_state_dict(fitted.obs_norm.state_dict())
        trainer.policy.refresh_norm()

    fitted_normaliser()
    for it in range(1, args.iterations + 1):
        trainer.step()
        fitted_normaliser()
        if it % args.every == 0:
            print(f"| GRPO, lr {args.grpo_lr:g}, iteration {it} | "
                  f"{paired_row(trainer.policy, optimum, reference, hanging)} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
