"""Study (research §19): GRPO over trajopt's feedforward knots against its cross-entropy method.
A time-indexed Gaussian policy over the 33 knots; one query (hanging), its group the population
(96 branches sampling every knot from pi_old); A = (fitness - group mean) / group std; the
per-knot clipped ratio, Adam (lr LR_REL x the mean std); the std learned above trajopt's floor.
    python benchmarks/study_grpo_knots.py pendubot SEED GENERATIONS LR_REL EPOCHS EPS LR_STD TAG
(the record: pendubot 0 1500 0.5 4 0.2 0.05 a; 0 1500 1.0 8 0.5 0.05 b)."""
import sys
import time

import numpy as np
import torch

from grpo_ctrl.trajopt import TrajoptConfig, run_candidates
from grpo_ctrl.grpo import group_advantages
from grpo_ctrl.trust_region import clipped_surrogate

PRESET = sys.argv[1]; SEED = int(sys.argv[2]); GENS = int(sys.argv[3])
LR_REL = float(sys.argv[4]); EPOCHS = int(sys.argv[5]); EPS = float(sys.argv[6])
LR_STD = float(sys.argv[7]); TAG = sys.argv[8]
cfg = TrajoptConfig(generations=GENS, seed=SEED)
u_max = 6.0
nk = int(round(cfg.duration / cfg.knot_s)) + 1
torch.manual_seed(SEED)
rng = np.random.default_rng(SEED)
mu = torch.zeros(nk, dtype=torch.float64, requires_grad=True)
log_std = torch.full((nk,), np.log(cfg.sigma_init), dtype=torch.float64, requires_grad=True)
opt = torch.optim.Adam([{"params": [mu], "lr": 0.1}, {"params": [log_std], "lr": LR_STD}])
G = cfg.population
best, best_knots, best_crit = -np.inf, None, None
t0 = time.time()
for gen in range(GENS):
    floor = max(cfg.sigma_min, cfg.sigma_floor - (cfg.sigma_floor - cfg.sigma_min) * gen / (GENS / 2))
    with torch.no_grad():
        log_std.clamp_(min=np.log(floor))
        m, s = mu.numpy().copy(), np.exp(log_std.numpy())
    a = m + s * rng.standard_normal((G, nk))
    rows = np.clip(np.vstack([a, m[None]]), -u_max, u_max)
    fit, crit, _ = run_candidates(rows, PRESET, cfg)
    i = int(np.argmax(fit))
    if fit[i] > best:
        best, best_knots, best_crit = fit[i], rows[i].copy(), crit[i]
    adv = torch.as_tensor(group_advantages(fit[None, :G], "group")[0])[:, None]
    at = torch.as_tensor(a)
    with torch.no_grad():
        logp_old = -0.5 * ((at - mu) / torch.exp(log_std)) ** 2 - log_std
    opt.param_groups[0]["lr"] = LR_REL * float(s.mean())
    for _ in range(EPOCHS):
        logp = -0.5 * ((at - mu) / torch.exp(log_std)) ** 2 - log_std
        loss = -clipped_surrogate(torch.exp(logp - logp_old), adv, EPS, EPS).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        mu.clamp_(-u_max, u_max)
    if gen % 50 == 0 or gen == GENS - 1:
        print(f"{gen} {time.time() - t0:.0f}s best {max(best, 0):.4f} gen {fit[i]:.4f} mean "
              f"{fit[G]:.4f} std {s.mean():.3f} success {np.mean(fit[:G] > 0):.2f}", flush=True)
print("best", best, best_crit)
np.save(f"gk_{PRESET}_{TAG}_s{SEED}.npy", best_knots)
