"""Study (docs/research.md §19): w_smooth's temporal term on the command the plant receives,
the LQR catch's blend of the policy's mean, instead of the policy's mean alone; the acrobot's
2 ms fine-tuning. Patches the loss and runs the CLI, so every `grpo-ctrl train` flag applies:

    python benchmarks/study_handover_smoothness.py train --init TUNED2 --out RUN \
        --overlap false --action-repeat 1 --horizon 5000 --loss-steps 5000 --iterations 150

Found no difference (seeds 3 and 0, paired with the same run unpatched)."""
import sys
import torch
from torch import nn
import grpo_ctrl.grpo as G
from grpo_ctrl.baselines.lqr import LQRCatch, design, obs_to_state
from grpo_ctrl.plant import plant_spec
from grpo_ctrl.baselines import portable

spec = plant_spec("double_pendulum", "acrobot")
CATCH = LQRCatch(nn.Identity(), spec, design("double_pendulum", "acrobot"), 100.0)
_orig = G.policy_loss
state = {}


def policy_loss(policy, ref, batch, idx, cfg, eps_low, eps_high, gen):
    state["raw"] = batch.raw_loss_obs[idx]
    return _orig(policy, ref, batch, idx, cfg, eps_low, eps_high, gen)


def mean_command_smoothness(policy, obs, mu, mask, sigma, gen, temporal=True):
    a = torch.tanh(mu)
    moved = torch.tanh(policy.mu(obs + sigma * torch.randn(obs.shape, generator=gen)))
    spatial = ((moved - a) ** 2 * mask).sum() / mask.sum().clamp(min=1.0)
    raw = state["raw"]
    with torch.no_grad():
        flat = raw.reshape(-1, raw.shape[-1])
        x = obs_to_state(spec, flat)
        share = CATCH.share(x).reshape(a.shape)
        lqr = (torch.clamp(-portable.dot(x, CATCH.gain[0]), -spec.u_max, spec.u_max)
               / spec.u_max).reshape(a.shape)
    b = share * lqr + (1.0 - share) * a
    both = mask[:, 1:] * mask[:, :-1]
    return spatial + ((b[:, 1:] - b[:, :-1]) ** 2 * both).sum() / both.sum().clamp(min=1.0)


G.policy_loss = policy_loss
G.mean_command_smoothness = mean_command_smoothness
from grpo_ctrl.cli import main  # noqa: E402
sys.exit(main(sys.argv[1:]))
