"""``grpo-ctrl trajopt``: a double pendulum's swing-up found by trajectory optimisation on
RealAIGym's score, cloned into a trained policy's network.

    grpo-ctrl trajopt runs/pendubot --out runs/pendubot-swing --seed 0
    grpo-ctrl eval runs/pendubot-swing --score realaigym

The benchmark scores one run from one start (hanging at rest, 10 s), so the best controller
for it is a torque sequence from that start and a stabiliser at the top. The search: a
feedforward torque, knots every ``knot_s`` seconds over the first ``duration`` seconds
(linear between them, zero after), with the LQR about upright catching the plant inside
x'Px < ``catch`` (``LQRCatch``: its blend moves the command continuously). Each generation
``population`` candidates (within the motor's limit) run side by side on the benchmark's
model. A candidate's fitness is its RealAI score v2 where it succeeds; where it fails, minus
log(1 + the least x'Px it reached) / 10, how near it came to the catch, so that failing
candidates still rank. Two searches: the cross-entropy method (``cem``, the default),
independent normals whose mean and spread move toward the best ``elite`` share, the spread
kept above a floor that falls from ``sigma_floor`` to ``sigma_min`` over the first half of the
generations; and CMA-ES (``cma``, pycma's), which adapts a full covariance of the knots and
stops where it has converged: on the acrobot it found a faster swing-up than any the
cross-entropy method found, on some seeds (docs/double_pendulum.md). Not every seed finds the
cheapest swing-up: run several and keep the best.

The clone. The trained policy of a run of the same robot fits the feedforward torque at the
states of the best run, up to the LQR's taking over (its observation normaliser kept, and what
it learned away from those states: the hold and the recoveries about upright). A small error of
the fit is no promise of the closed loop, so the fit's snapshots fly the benchmark's run and the
best-scoring one is kept. With the catch, it is a controller of the observation like a trained
policy: ``eval``, ``export``, ``hil`` / ``run`` take it, and ``grpo-ctrl train --init`` starts
from it.

The clone for a rig (``--robust``). The clone knows the swing-up's torques at its states and
little about the states beside them, and a swing-up this cheap is fragile: on encoders it
misses the catch. With ``--robust`` the clone is then taught the swing-up's feedback: a
time-varying LQR along the caught run (``TrackingTeacher``) labels the states that the network's
own noisy runs visit, and the network is fitted to every label so far (DAgger, ``teach``).
"""
from __future__ import annotations

import argparse
import copy
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from grpo_ctrl.errors import UserError
from grpo_ctrl.option_types import number

SYSTEM = "double_pendulum"


@dataclass
class TrajoptConfig:
    duration: float = 1.6        # s of feedforward torque from the start
    knot_s: float = 0.05         # s between the torque's knots
    catch: float = 100.0         # the LQR catches inside x'Px < catch
    method: str = "cem"          # the search: "cem" (cross-entropy method) or "cma" (CMA-ES)
    population: int = 96         # candidates a generation
    generations: int = 1500
    cma_sigma: float = 2.0       # N m, CMA-ES's first step size
    elite: float = 0.125         # cem: share of the population the distribution moves toward
    smoothing: float = 0.7       # cem: the elite statistics' weight in the new mean and spread
    sigma_init: float = 3.0      # N m, cem: the first generation's spread
    sigma_floor: float = 0.5     # N m, cem: the spread's floor at the start, falling to sigma_min
    sigma_min: float = 0.02      # N m, cem: by half the generations
    clone_steps: int = 8000      # Adam steps of the clone's fit
    clone_check: int = 500       # steps between the fit's snapshots flown in the benchmark
    clone_lr: float = 1e-3
    # --robust: the clone taught the swing-up's feedback, a time-varying LQR along it (DAgger)
    robust_rounds: int = 5       # rollouts of the network, labelled by the teacher, fitted
    robust_rollouts: int = 64    # a round's rollouts from hanging
    robust_noise: float = 0.1    # N m of torque noise on them, a value held for knot_s
    robust_r_scale: float = 30.0  # the teacher's torque weight over the LQR's: gentler gains
    robust_fit_steps: int = 3000  # Adam steps a round, batches of 4096, lr 3e-4
    seed: int = 0


class Feedforward:
    """Torques of ``knots (N, K)`` for N runs: at step k of ``dt`` seconds, the knots'
    linear interpolation at t = k dt (knot i at t = i knot_s), zero from the last knot's time
    on. Counts its calls: one per control step since ``reset``, as ``simulate`` calls it."""

    def __init__(self, knots: np.ndarray, knot_s: float, dt: float):
        self.knots = np.atleast_2d(np.asarray(knots, dtype=np.float64))
        self.knot_s, self.dt, self.step = float(knot_s), float(dt), 0

    @property
    def duration(self) -> float:
        return (self.knots.shape[1] - 1) * self.knot_s

    def reset(self, n: int | None = None) -> None:
        self.step = 0

    def torque_at(self, t: float) -> np.ndarray:
        """(N,) the torques at time t."""
        s = t / self.knot_s
        i = int(np.floor(s))
        if i >= self.knots.shape[1] - 1:
            return np.zeros(self.knots.shape[0])
        w = s - i
        return self.knots[:, i] * (1.0 - w) + self.knots[:, i + 1] * w

    def __call__(self, obs) -> np.ndarray:
        u = self.torque_at(self.step * self.dt)
        self.step += 1
        return u


def run_candidates(knots: np.ndarray, preset: str, cfg: TrajoptConfig) -> tuple:
    """Benchmark runs of each row of ``knots``, caught by the LQR: (fitness (N,), the
    criteria of each run (dicts), the trajectories)."""
    from grpo_ctrl import realaigym_double as R
    from grpo_ctrl.baselines.lqr import design, region_matrix
    from grpo_ctrl.plant import plant_spec, wrap_angle

    spec = plant_spec(SYSTEM, preset)
    runs = R.simulate(Feedforward(knots, cfg.knot_s, spec.dt), preset, n=len(knots),
                      catch=cfg.catch)
    P = region_matrix(spec, design(SYSTEM, preset))
    fitness, evaluated = np.empty(len(runs)), []
    for i, tr in enumerate(runs):
        e = R.evaluate(tr)
        evaluated.append(e)
        if e["success"]:
            fitness[i] = e["score"]
        else:  # how near it came to the catch (angles wrapped to [-pi, pi))
            x = np.concatenate([wrap_angle(tr.q), tr.qd], axis=1)
            least = np.einsum("ni,ij,nj->n", x, P, x).min()
            fitness[i] = -np.log1p(max(least, 0.0)) / 10.0
    return fitness, evaluated, runs


@dataclass
class Search:
    knots: np.ndarray       # (K,) the best candidate's
    criteria: dict          # its benchmark run's criteria and score
    history: list           # per generation: (best fitness so far, the generation's best)


class CrossEntropy:
    """The cross-entropy method (the module's docstring): independent normals about a mean,
    moved toward the best ``elite`` share; the mean itself is a candidate every generation."""

    def __init__(self, nk: int, u_max: float, cfg: TrajoptConfig):
        self.cfg, self.u_max = cfg, u_max
        self.rng = np.random.default_rng(cfg.seed)
        self.mean, self.sigma = np.zeros(nk), np.full(nk, cfg.sigma_init)
        self.n_elite = max(2, int(round(cfg.elite * cfg.population)))

    def ask(self) -> np.ndarray:
        cfg = self.cfg
        cand = np.clip(self.mean + self.sigma * self.rng.standard_normal(
            (cfg.population, len(self.mean))), -self.u_max, self.u_max)
        cand[0] = np.clip(self.mean, -self.u_max, self.u_max)
        return cand

    def tell(self, cand: np.ndarray, fitness: np.ndarray, gen: int) -> None:
        cfg = self.cfg
        elite = cand[np.argsort(-fitness)[:self.n_elite]]
        floor = max(cfg.sigma_min, cfg.sigma_floor - (cfg.sigma_floor - cfg.sigma_min) *
                    gen / max(1.0, cfg.generations / 2))
        self.mean = cfg.smoothing * elite.mean(0) + (1 - cfg.smoothing) * self.mean
        self.sigma = np.maximum(cfg.smoothing * elite.std(0) + (1 - cfg.smoothing) * self.sigma,
                                floor)

    def stopped(self) -> str:
        return ""


class CMA:
    """CMA-ES (pycma's ``CMAEvolutionStrategy``): the knots from zero with step size
    ``cma_sigma``, within the motor's limits, its full covariance adapted to the score."""

    def __init__(self, nk: int, u_max: float, cfg: TrajoptConfig):
        import cma

        # pycma takes seed 0 as "the time": seed + 1 keeps every seed repeatable
        self.es = cma.CMAEvolutionStrategy(np.zeros(nk), cfg.cma_sigma, {
            "popsize": cfg.population, "seed": cfg.seed + 1, "bounds": [-u_max, u_max],
            "verbose": -9})
        self.u_max = u_max

    def ask(self) -> np.ndarray:
        return np.clip(np.array(self.es.ask()), -self.u_max, self.u_max)

    def tell(self, cand: np.ndarray, fitness: np.ndarray, gen: int) -> None:
        self.es.tell(list(cand), list(-fitness))  # pycma minimises

    def stopped(self) -> str:
        """Why CMA-ES has converged ("" while it has not): its step size or the spread of
        its scores below pycma's tolerances."""
        return ", ".join(self.es.stop())


SEARCHES = {"cem": CrossEntropy, "cma": CMA}  # --search's names


def search(preset: str, cfg: TrajoptConfig, log=print) -> Search:
    """The search over the feedforward's knots (the module's docstring) by ``cfg.method``:
    ``generations`` of it, or fewer where CMA-ES has converged."""
    from grpo_ctrl.plant import plant_spec

    u_max = plant_spec(SYSTEM, preset).u_max
    nk = int(round(cfg.duration / cfg.knot_s)) + 1
    optimiser = SEARCHES[cfg.method](nk, u_max, cfg)
    best, best_knots, best_criteria, history = -np.inf, np.zeros(nk), {}, []
    start = time.monotonic()
    for gen in range(cfg.generations):
        cand = optimiser.ask()
        fitness, evaluated, _ = run_candidates(cand, preset, cfg)
        top = int(np.argmax(fitness))
        if fitness[top] > best:
            best, best_knots, best_criteria = fitness[top], cand[top].copy(), evaluated[top]
        history.append((float(best), float(fitness[top])))
        optimiser.tell(cand, fitness, gen)
        stopped = optimiser.stopped()
        if gen % 100 == 0 or gen == cfg.generations - 1 or stopped:
            log(f"generation {gen + 1}/{cfg.generations}: best RealAI score "
                f"{max(best, 0.0):.4f}, {time.monotonic() - start:.0f} s"
                f"{f' (CMA-ES converged: {stopped})' if stopped else ''}")
        if stopped:
            break
    return Search(best_knots, best_criteria, history)


def takeover_step(spec, catch: float, states) -> int:
    """The first of ``states`` (a tensor (N, nx), angles from upright) where the LQR alone
    commands (``LQRCatch``'s share reaches 1), or N where it never does."""
    import torch

    from grpo_ctrl.baselines.lqr import LQRCatch, design

    lqr_catch = LQRCatch(torch.nn.Identity(), spec, design(SYSTEM, spec.preset), catch)
    with torch.no_grad():
        caught = (lqr_catch.share(states).reshape(-1) >= 1.0).numpy()
    return int(np.argmax(caught)) if caught.any() else len(caught)


def clone(init: str, knots: np.ndarray, cfg: TrajoptConfig, log=print):
    """The trained policy of run ``init`` fitted to the feedforward of ``knots`` at the states
    of its caught run, up to the LQR's taking over (its normaliser kept): the fit's snapshot
    that scores best in the benchmark's run, and that score."""
    import torch

    from grpo_ctrl import realaigym_double as R
    from grpo_ctrl.baselines.lqr import catch_overrides, obs_to_state
    from grpo_ctrl.grpo import init_policy
    from grpo_ctrl.plant import plant_spec
    from grpo_ctrl.sim import BatchSim

    policy, (_, preset), _ = init_policy(init)
    spec = plant_spec(SYSTEM, preset)
    ff = Feedforward(knots, cfg.knot_s, spec.dt)
    sim = BatchSim(SYSTEM, 1, preset, **catch_overrides(spec, cfg.catch))
    obs, torque = [sim.reset().copy()], []
    for _ in range(int(round(ff.duration / spec.dt))):
        torque.append(ff(obs[-1]))
        obs.append(sim.step(torque[-1].astype(np.float32))[0].copy())
    x = torch.as_tensor(np.concatenate(obs[:-1]), dtype=torch.float32)
    y = torch.as_tensor(np.concatenate(torque), dtype=torch.float32)
    # to the step where the LQR alone takes over (x'Px < catch): after it the feedforward's
    # knots were never tried, and what the network learned in training holds there
    n = takeover_step(spec, cfg.catch, obs_to_state(spec, x))
    x, y = x[:n], y[:n]
    xn = policy.normalise(x)
    opt = torch.optim.Adam(policy.net.parameters(), lr=cfg.clone_lr)
    # the step falls to 1 % of clone_lr (cosine): the last steps settle the fit
    fall = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.clone_steps, cfg.clone_lr / 100)

    def error() -> float:
        with torch.no_grad():
            return float(((policy.command(xn) - y) ** 2).mean().sqrt())

    # a small error of the fit is no promise of the closed loop (the swing-up magnifies a
    # deviation, and off the run's states the fit is free): the fit's snapshots every
    # clone_check steps fly the benchmark's run, and the best-scoring one is kept
    best = (-1.0, None, None, 0)
    for step in range(1, cfg.clone_steps + 1):
        loss = ((policy.command(xn) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        fall.step()
        if step % cfg.clone_check == 0 or step == cfg.clone_steps:
            score = R.benchmark_score(policy.controller(spec, cfg.catch))
            if score > best[0]:
                best = (score, copy.deepcopy(policy.net.state_dict()), error(), step)
    policy.net.load_state_dict(best[1])
    log(f"cloned into {spec.nobs}-{'-'.join([str(policy.arch['hidden'])] * policy.arch['layers'])}"
        f"-1 at {len(x)} states: the snapshot of step {best[3]} of {cfg.clone_steps}, its "
        f"command's error {best[2]:.3g} N m rms, RealAI score {best[0]:.4f}")
    return policy, best[0]


def tracking_gains(sim, states: np.ndarray, torques: np.ndarray, Q: np.ndarray, R: np.ndarray,
                   P_end: np.ndarray) -> np.ndarray:
    """The time-varying LQR's gains ``(n, nx)`` along states ``(n, nx)`` and torques ``(n,)``:
    the backward Riccati recursion on ``sim``'s step linearised at each (central differences),
    from the cost-to-go ``P_end`` after the last."""
    from grpo_ctrl.baselines.linearize import discrete_by_simulation

    P, gains = P_end, np.empty((len(states), states.shape[1]))
    for k in range(len(states) - 1, -1, -1):
        A, B = discrete_by_simulation(sim, states[k], float(torques[k]))
        K = np.linalg.solve(R + B.T @ P @ B, B.T @ P @ A)
        P = Q + A.T @ P @ (A - B @ K)
        P = 0.5 * (P + P.T)
        gains[k] = K[0]
    return gains


class TrackingTeacher:
    """A time-varying LQR along a caught feedforward run: at step k < n (n the step where the
    LQR alone takes over) the command u_k - K_k (x - x_k), from the run's states x_k and
    applied torques u_k; from n on the LQR about upright. The gains ``tracking_gains``' from
    the LQR's cost-to-go, with the LQR's weights, the torque's times ``robust_r_scale``."""

    def __init__(self, preset: str, knots: np.ndarray, cfg: TrajoptConfig):
        import torch

        from grpo_ctrl import realaigym_double as R
        from grpo_ctrl.baselines.lqr import design
        from grpo_ctrl.plant import plant_spec, wrap_angle
        from grpo_ctrl.sim import BatchSim

        spec = plant_spec(SYSTEM, preset)
        lqr = design(SYSTEM, preset)
        (run,) = R.simulate(Feedforward(knots, cfg.knot_s, spec.dt), preset, catch=cfg.catch)
        sim = BatchSim(SYSTEM, 1, preset)
        states = np.concatenate([run.q, run.qd], axis=1)
        torques = run.tau[:, int(sim.model.actuated)]
        n = takeover_step(spec, cfg.catch, torch.as_tensor(
            np.concatenate([wrap_angle(run.q), run.qd], axis=1)))
        self.states, self.torques = states[:n], torques[:n]
        self.gains = tracking_gains(sim, self.states, self.torques, lqr.Q,
                                    lqr.R * cfg.robust_r_scale, lqr.P)
        self.lqr_gain, self.u_max = np.asarray(lqr.K, dtype=float).reshape(-1), spec.u_max

    def __call__(self, k: int, x: np.ndarray) -> np.ndarray:
        """The commands ``(B,)`` at step k for states ``x (B, 4)``, clipped to the motor's."""
        from grpo_ctrl.plant import wrap_angle

        if k < len(self.gains):
            dx, u, K = x - self.states[k], self.torques[k], self.gains[k]
        else:
            dx, u, K = x, 0.0, self.lqr_gain
        dx = np.concatenate([wrap_angle(dx[:, :2]), dx[:, 2:]], axis=1)
        return np.clip(u - dx @ K, -self.u_max, self.u_max)


def teach(policy, preset: str, teacher: TrackingTeacher, cfg: TrajoptConfig, log=print):
    """DAgger: each round, ``robust_rollouts`` runs of the policy from hanging (with the
    catch, as deployed; torque noise of ``robust_noise`` held a knot's time; the first round
    half the teacher's command; one rollout without noise) to 0.3 s past the teacher's end;
    every state visited labelled by the teacher's command at its step; the policy fitted to
    all labels so far. The round that scores best in the benchmark's run is kept: (the
    policy, that score, True). Where no round swings up in that run, the policy as it came:
    (it, its score, False)."""
    import torch

    from grpo_ctrl import realaigym_double as R
    from grpo_ctrl.baselines.lqr import catch_overrides
    from grpo_ctrl.plant import plant_spec, state_of_observation
    from grpo_ctrl.sim import BatchSim

    spec = plant_spec(SYSTEM, preset)
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    hold = int(round(cfg.knot_s / spec.dt))
    steps = len(teacher.gains) + int(round(0.3 / spec.dt))
    opt = torch.optim.Adam(policy.net.parameters(), lr=3e-4)
    untaught = copy.deepcopy(policy.net.state_dict())
    obs_seen, labels, best = [], [], (0.0, None)

    def command(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return policy.command(policy.normalise(torch.as_tensor(obs))).numpy()

    for r in range(cfg.robust_rounds):
        sim = BatchSim(SYSTEM, cfg.robust_rollouts, preset,
                       **catch_overrides(spec, cfg.catch))
        obs, teacher_share = sim.reset().copy(), 0.5 if r == 0 else 0.0
        for k in range(steps):
            label = teacher(k, state_of_observation(spec, obs))
            obs_seen.append(obs)
            labels.append(label)
            if k % hold == 0:
                noise = cfg.robust_noise * rng.standard_normal(cfg.robust_rollouts)
                noise[0] = 0.0  # one rollout as deployed
            u = teacher_share * label + (1.0 - teacher_share) * command(obs) + noise
            obs = sim.step(np.clip(u, -spec.u_max, spec.u_max).astype(np.float32))[0].copy()
        x = policy.normalise(torch.as_tensor(np.concatenate(obs_seen)))
        y = torch.as_tensor(np.concatenate(labels), dtype=torch.float32)
        for _ in range(cfg.robust_fit_steps):
            i = torch.randint(0, len(x), (4096,), generator=gen)
            loss = ((policy.command(x[i]) - y[i]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        score = R.benchmark_score(policy.controller(spec, cfg.catch))
        log(f"teaching round {r + 1}/{cfg.robust_rounds}: {len(y)} labelled states, "
            f"RealAI score {score:.4f}")
        if score > best[0]:
            best = (score, copy.deepcopy(policy.net.state_dict()))
    if best[1] is None:
        policy.net.load_state_dict(untaught)
        return policy, R.benchmark_score(policy.controller(spec, cfg.catch)), False
    policy.net.load_state_dict(best[1])
    return policy, best[0], True


def save_run(policy, preset: str, cfg: TrajoptConfig, found: Search, out: Path,
             robust: bool = False) -> Path:
    """``out`` as a run folder: config.toml and the deployed checkpoint (the clone, with its
    catch; the knots, their run's criteria and whether the clone was taught the tracking
    feedback beside it)."""
    from grpo_ctrl.plant import plant_spec
    from grpo_ctrl.policy import save_policy_run

    config = {**policy.arch, "catch": cfg.catch}
    config.pop("nobs")
    found_record = {"knots": [float(k) for k in found.knots], "robust": robust,
                    **{k: float(v) for k, v in found.criteria.items()}}
    return save_policy_run(out, policy, plant_spec(SYSTEM, preset), config,
                           {f"trajopt_{k}": v for k, v in asdict(cfg).items()},
                           {"trajopt": found_record})


# ---------------------------------------------------------------- the command
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a trained run (folder or checkpoint) of double_pendulum's "
                               "acrobot or pendubot: the network the swing-up is cloned into")
    p.add_argument("--out", required=True, help="run folder to write")
    p.add_argument("--generations", type=number(int, 1, 10**6),
                   default=TrajoptConfig.generations,
                   help=f"generations of the search (default {TrajoptConfig.generations})")
    p.add_argument("--duration", type=number(float, 0.1, 10.0), default=TrajoptConfig.duration,
                   metavar="S", help="seconds of feedforward torque from the start "
                                     f"(default {TrajoptConfig.duration})")
    p.add_argument("--search", choices=tuple(SEARCHES), default=TrajoptConfig.method,
                   help="the search over the knots: cem, the cross-entropy method (default), "
                        "or cma, CMA-ES (on the acrobot, faster swing-ups on some seeds)")
    p.add_argument("--seed", type=number(int, 0, 2**31 - 1), default=0)
    p.add_argument("--robust", action="store_true",
                   help="teach the clone a time-varying LQR's feedback along the swing-up "
                        "(DAgger), for a rig: it holds the swing-up against the sensing of "
                        "encoders (flies on the HIL) at a lower score")


def run(args) -> int:
    from grpo_ctrl.grpo import init_policy

    system, preset = init_policy(args.run)[1]
    if (system, preset) not in ((SYSTEM, "acrobot"), (SYSTEM, "pendubot")):
        raise UserError(f"{args.run!r} was trained on {system}/{preset}; trajopt optimises the "
                        f"simulation leaderboard's run of {SYSTEM}'s acrobot or pendubot: "
                        f"give a run of one of them")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {args.out!r} exists and is not an empty folder")
    cfg = TrajoptConfig(generations=args.generations, duration=args.duration, seed=args.seed,
                        method=args.search)

    def log(line: str) -> None:
        print(line, flush=True)

    found = search(preset, cfg, log)
    if not found.criteria.get("success"):
        raise UserError(f"no candidate of {cfg.generations} generations swung up and was "
                        f"caught; run more --generations or another --seed")
    policy, cloned = clone(args.run, found.knots, cfg, log)
    taught = False
    if args.robust:
        policy, cloned, taught = teach(policy, preset, TrackingTeacher(preset, found.knots, cfg),
                                       cfg, log)
        if not taught:
            log("no round of the teaching swung up in the benchmark's run: the clone is kept "
                "untaught; try another --seed")
    path = save_run(policy, preset, cfg, found, out, taught)
    print(f"the feedforward caught by the LQR: RealAI score {found.criteria['score']:.4f} "
          f"(swing-up {found.criteria['swingup_time']:.2f} s, torque cost "
          f"{found.criteria['tau_cost']:.2f}); cloned into {args.run}'s network"
          f"{' and taught its tracking feedback' if taught else ''}: "
          f"{cloned:.4f}: {path}; evaluate with grpo-ctrl eval {out} --score realaigym")
    return 0
