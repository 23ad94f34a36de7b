"""``grpo-ctrl train``: run GRPO on one plant, writing a run folder
(its files: ``grpo_ctrl.run_folder``).

Configuration precedence: per-plant defaults < ``--config`` file < flags.
Every ``GRPOConfig`` field is a flag (``num_starts`` -> ``--num-starts``).

Ctrl-C, SIGTERM and SIGHUP stop training after the iteration in progress: the
final checkpoint, the metrics and the curve are written, the collector process
ends, and the exit status is 128 + the signal's number. ``--resume`` continues
from ``latest.pt``; metrics rows past its iteration (left by a crash) are
dropped, so no iteration is logged twice.

Data-parallel training (docs/distributed.md): ``--nproc N`` starts N local
workers; under ``torchrun`` (``python -m grpo_ctrl train ...``) each process
the launcher starts is one rank. Rank 0 evaluates and writes the run folder.
The plant's domain randomisation is the file's ``[randomize]`` table
(``grpo_ctrl.randomize.Randomization`` fields) over the plant's default
ranges, then ``--randomize KEY=VALUE`` flags; ``config.toml`` records it.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import mmap
import os
import signal
import sys
import time
from dataclasses import asdict, fields
from datetime import datetime
from pathlib import Path

try:
    import tomllib  # novermin: 3.10 takes the except branch
except ModuleNotFoundError:  # Python 3.10: tomli is the same parser (pyproject requires it there)
    import tomli as tomllib

from grpo_ctrl import runtime  # first: it sets the OpenMP environment before torch loads
from grpo_ctrl import distributed, train_log
from grpo_ctrl.deploy import CalmChoice
from grpo_ctrl.distributed import Ranks
from grpo_ctrl.errors import UserError
from grpo_ctrl.files import atomic_write, write_toml
from grpo_ctrl.grpo import Trainer, check_init, init_policy
from grpo_ctrl.grpo_config import (CHOICES, LONG_BUDGET_DEFAULTS, OLD_VALUES, SECTIONS,
                                   GRPOConfig, check_config, default_config,
                                   long_budget_defaults, upgrade_config)
from grpo_ctrl.option_types import number
from grpo_ctrl.policy import read_checkpoint, save_checkpoint, GaussianPolicy
from grpo_ctrl.plant import plant_spec, resolve_plant
from grpo_ctrl.plant_file import read_plant_file
from grpo_ctrl.randomize import (Randomization, centred_on_fit, default_randomization,
                                 with_overrides)
from grpo_ctrl.realaigym_double import benchmark_score
from grpo_ctrl.sim import BatchSim
from grpo_ctrl.run_folder import (CONFIG, CURVE, DEPLOYED, LATEST, METRICS, OLD_NAMES,
                                  checkpoint_file, read_metrics)

# what config.toml holds besides the GRPOConfig fields
RUN_KEYS = ("system", "preset", "randomize")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--system", help="plant: pendulum (default), cartpole or furuta")
    p.add_argument("--preset", help="parameter preset of the plant (default: its first)")
    p.add_argument("--out", help="run folder (default: runs/SYSTEM-PRESET-TIMESTAMP)")
    p.add_argument("--config", help="TOML file of GRPOConfig fields (and system/preset)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its latest checkpoint for another "
                        "--time-budget seconds")
    p.add_argument("--quiet", action="store_true",
                   help="no progress (a bar on a terminal, else a line per evaluation)")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="also write the metrics as TensorBoard event files in DIR "
                        "(tensorboard --logdir DIR)")
    p.add_argument("--nproc", type=number(int, 1, 1024), default=None, metavar="N",
                   help="data-parallel worker processes on this machine, one per core "
                        "(default 1; overlap is off with more than one; under torchrun the "
                        "launcher sets the processes: leave this out)")
    p.add_argument("--plant", metavar="FILE.toml",
                   help="a fitted rig (grpo-ctrl sysid --out): every parameter drawn within "
                        "max(3 std, 10%%) of the fit, the delay within a step of it plus the "
                        "host loop's tick, encoder offsets up to its size; then --randomize "
                        "applies")
    p.add_argument("--randomize", action="append", default=[], metavar="KEY=VALUE",
                   help="domain randomisation over the plant's default ranges (pendulum/rig "
                        "and furuta/qube-servo2 draw by default; docs/robustness.md): "
                        "params=0.3, delay=1,2, motor_k=0.5,1, scale.m=0.8,1.2, ..., or off")
    groups = {name: p.add_argument_group(f"GRPO: {name} (override the config file)")
              for name in SECTIONS}
    for f in fields(GRPOConfig):
        flag = "--" + f.name.replace("_", "-")
        m = f.metadata
        kind = {"int": int, "float": float, "str": str, "bool": _boolean}[f.type]
        metavar = ("|".join(CHOICES[f.name]) if f.name in CHOICES else
                   "true|false" if kind is _boolean else kind.__name__.upper())
        parse = (number(kind, m["low"], m["high"], m["above"]) if kind in (int, float)
                 else _with_old_values(f.name) if f.name in OLD_VALUES else kind)
        groups[m["section"]].add_argument(flag, dest=f.name, type=parse, default=None,
                                          metavar=metavar, choices=m["choices"],
                                          help=m["doc"].replace("%", "%%"))


def _with_old_values(name: str):
    """A choice's parser that takes its old spellings too (``OLD_VALUES``)."""
    old = OLD_VALUES[name]
    return lambda text: old.get(text, text)


def _boolean(text: str) -> bool:
    if text.lower() in ("true", "1", "yes", "on"):
        return True
    if text.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def read_toml(path: str) -> dict:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise UserError(f"config file {path!r} does not exist") from None
    except OSError as e:  # a folder, or unreadable
        raise UserError(f"cannot read config file {path!r}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"config file {path!r} is not valid TOML: {e}") from None
    data, notes = upgrade_config(data, f"config file {path!r}")
    for note in notes:
        print(f"grpo-ctrl: note: {note}", file=sys.stderr)
    known = {f.name for f in fields(GRPOConfig)} | set(RUN_KEYS)
    unknown = sorted(set(data) - known)
    if unknown:
        raise UserError(f"config file {path!r}: unknown field(s) {unknown}; known: "
                        f"{sorted(known)}")
    return data


def resolve(args) -> tuple[str, str, GRPOConfig, Path, Randomization]:
    """Plant, configuration, run folder and randomisation from defaults, file
    and flags."""
    file_cfg = {}
    out = Path(args.out) if args.out else None
    if args.resume:
        if out is None:
            raise UserError("--resume needs --out RUN_FOLDER (the run to continue)")
        if not (out / CONFIG).is_file() or not (out / checkpoint_file(LATEST)).is_file():
            raise UserError(f"cannot resume {str(out)!r}: it has no {CONFIG} and "
                            f"{checkpoint_file(LATEST)}")
        file_cfg = read_toml(str(out / CONFIG))
    if args.config:
        file_cfg.update(read_toml(args.config))
    given = {}  # flags first, then the file
    for f in fields(GRPOConfig):
        value = getattr(args, f.name, None)
        if value is None and f.name in file_cfg:
            value = file_cfg[f.name]
        if value is not None:
            if f.type == "float" and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)  # TOML's 30 for 30.0
            given[f.name] = value
    init = given.get("init", "")
    if init and not isinstance(init, str):
        raise UserError(f"init must be a run folder or checkpoint path, got {init!r}")
    # a trained policy to start from names its plant (the default) and fixes its network's
    # shape and its catch
    trained_on, fixed = init_policy(init)[1:] if init else ((None, None), {})
    system = args.system or file_cfg.get("system")
    preset = args.preset or file_cfg.get("preset") or (trained_on[1] if system is None else None)
    system, preset = resolve_plant(system or trained_on[0] or "pendulum", preset)
    budget = given.get("time_budget", default_config(system, preset, init=init).time_budget)
    cfg = default_config(system, preset, budget if isinstance(budget, float) else 0.0, init)
    for name, value in {**fixed, **given}.items():
        setattr(cfg, name, value)
    if init:
        check_init(cfg, system, preset, trained_on, fixed)
    check_config(cfg)
    if cfg.deploy == "score" and system != "double_pendulum":
        raise UserError(f"deploy score chooses by RealAIGym's double pendulum score, which "
                        f"{system} has none of; choose --deploy best, final or calm")
    table = file_cfg.get("randomize", {})
    if not isinstance(table, dict):
        raise UserError("randomize in a config file must be a [randomize] table")
    randomize = Randomization.from_table(table, default_randomization(system, preset))
    if getattr(args, "plant", None):  # a fitted rig: its ranges centred on the fit
        fitted = read_plant_file(args.plant, plant_spec(system, preset))
        randomize = centred_on_fit(randomize, fitted.params, fitted.std, fitted.delay,
                                   fitted.offset, fitted.std.get("offset", 0.0))
    randomize = with_overrides(randomize, getattr(args, "randomize", None) or [])
    try:  # names and bounds only the plant knows (its parameters, the longest delay)
        BatchSim(system, 1, preset=preset, randomize=randomize)
    except ValueError as e:
        raise UserError(f"randomize: {e}") from None
    if out is None:
        out = Path("runs") / f"{system}-{preset}-{datetime.now():%Y%m%d-%H%M%S}"
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file, not a run folder; choose another --out")
    if not args.resume and out.exists() and any(out.iterdir()):
        raise UserError(f"run folder {str(out)!r} already exists and is not empty; choose "
                        "another --out, or add --resume to continue it")
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"cannot create the run folder {str(out)!r}: {str(existing)!r} is not a "
                        "writable folder; choose another --out")
    return system, preset, cfg, out, randomize


class RunFolder:
    """The files of one run: config, metrics, checkpoints, curve.

    ``resume_at``: the iteration of the checkpoint a resumed run continues
    from; metrics rows after it (written before a crash, or cut short) are
    dropped, so that no iteration appears twice."""

    def __init__(self, out: Path, system: str, preset: str, cfg: GRPOConfig,
                 randomize: Randomization, resume_at: int | None = None):
        self.out = out
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create run folder {str(out)!r}: {e.strerror or e}; choose "
                            "another --out") from None
        write_toml(out / CONFIG, {"system": system, "preset": preset, **asdict(cfg),
                                  "randomize": randomize.to_table()})
        path = out / METRICS
        if resume_at is not None:
            kept = [row for row in read_metrics(path) if row.get("iteration", 0) <= resume_at]
            atomic_write(path, "".join(json.dumps(row) + "\n" for row in kept))
            old, deployed = (out / checkpoint_file(OLD_NAMES[DEPLOYED]),
                             out / checkpoint_file(DEPLOYED))
            if old.is_file() and not deployed.exists():  # a folder made before the rename
                old.rename(deployed)
        self.metrics = open(path, "a" if resume_at is not None else "w")

    def log(self, row: dict) -> None:
        self.metrics.write(json.dumps(row) + "\n")
        self.metrics.flush()

    def checkpoint(self, trainer: Trainer, name: str, extra: dict,
                   policy: GaussianPolicy | None = None) -> None:
        """``policy``: another than the trainer's (deploy calm's choice)."""
        ck = (policy or trainer.policy).checkpoint(trainer.spec, asdict(trainer.cfg),
                                       {**extra, "trainer": resume_state(trainer),
                                        "randomize": trainer.randomize.to_table()})
        save_checkpoint(ck, self.out / checkpoint_file(name))

    def close(self) -> None:
        self.metrics.close()


def resume_state(trainer: Trainer) -> dict:
    """What beyond the policy a run needs to continue (a checkpoint's "trainer")."""
    return {"optimizer": trainer.opt.state_dict(), "iteration": trainer.iteration,
            "eps_scale": trainer.eps_scale, "torch_rng": trainer.gen.get_state(),
            "sim_steps": trainer.rollout.sim_steps * trainer.ranks.world}


def resume_from(trainer: Trainer, ck: dict) -> None:
    """Continue ``trainer`` from checkpoint ``ck``: its policy, optimiser, iteration,
    clip scale and noise stream; fresh trajectories from a seed tied to the iteration."""
    policy, st, ranks = GaussianPolicy.from_checkpoint(ck), ck["trainer"], trainer.ranks
    trainer.policy.load_state_dict(policy.state_dict())
    trainer.policy.obs_norm.load_state_dict(policy.obs_norm.state_dict())
    trainer.policy.refresh_norm()
    trainer.opt.load_state_dict(st["optimizer"])
    trainer.iteration, trainer.eps_scale = int(st["iteration"]), float(st["eps_scale"])
    trainer.rollout.sim_steps = int(st["sim_steps"]) // ranks.world
    if ranks.is_main:  # the checkpoint holds rank 0's noise stream
        trainer.gen.set_state(st["torch_rng"])
    else:
        trainer.gen.manual_seed(ranks.seed(trainer.cfg.seed) + 7919 * trainer.iteration)
    if trainer.ref is not None:
        trainer.set_ref(trainer.policy)
    trainer.rollout.restart(ranks.seed(trainer.cfg.seed) + 7919 * trainer.iteration)


plot_curve = train_log.plot_curve  # curve.png: train_log.py draws it


def train(system: str, preset: str, cfg: GRPOConfig, out: Path | None, resume: bool = False,
          progress: bool = True, on_iteration=None, ranks: Ranks | None = None,
          randomize: Randomization | None = None, stop=None, tensorboard=None) -> dict:
    """Train until the time budget or iteration limit, or until ``stop()``
    (checked between iterations) is true; returns a summary.
    ``on_iteration(trainer, row)`` is called after every iteration (the
    benchmark snapshots the policy there); its time is not training time.
    In data-parallel training every rank calls this; rank 0's clock decides
    the schedule and the stop, and rank 0 alone evaluates and writes ``out``.
    ``randomize``: the plant's ranges (default: ``default_randomization``).
    ``tensorboard``: a folder for TensorBoard event files (rank 0 writes)."""
    ranks = ranks or Ranks.current()
    if randomize is None:
        randomize = default_randomization(system, preset)
    trainer = Trainer(cfg, system, preset, ranks, randomize)
    wall, best, evals_done = 0.0, -math.inf, 0
    best_score = -math.inf  # deploy score: the best evaluation's benchmark score
    deployed = None  # deploy calm: the iteration whose policy deployed.pt holds
    if resume:
        ck = read_checkpoint(out / checkpoint_file(LATEST))
        resume_from(trainer, ck)
        wall, best = float(ck.get("wall_time", 0.0)), float(ck.get("best_return", -math.inf))
        best_score = float(ck.get("best_score", -math.inf))
    folder = (RunFolder(out, system, preset, cfg, randomize,
                        trainer.iteration if resume else None)
              if out is not None and ranks.is_main else None)
    start_wall, next_eval = wall, wall
    budget = cfg.time_budget if cfg.time_budget > 0 else math.inf
    quiet = not progress or not ranks.is_main
    # a bar on a terminal, a line per evaluation in a log; TensorBoard (train_log.py)
    bar = train_log.Progress(not quiet, budget, cfg.iterations,
                             tensorboard if ranks.is_main else None)
    last_eval = None
    calm = CalmChoice(trainer.spec, catch=cfg.catch) if cfg.deploy == "calm" and folder is not None else None

    def evaluate() -> tuple[float, float, float | None]:  # return, success, benchmark score
        ret, success = trainer.evaluate()
        if cfg.deploy != "score":
            return ret, success, None
        return ret, success, benchmark_score(trainer.policy.controller(trainer.spec, cfg.catch))

    def more(clock: float) -> bool:  # time left and no stop asked, by this process
        return clock - start_wall < budget and not (stop is not None and stop())

    def lead() -> list[float]:  # this process's clock and "go on", as the update ends
        clock = wall + time.perf_counter() - t0
        return [clock, more(clock)]

    # With several processes, rank 0's lead() reaches the others on the batch statistics'
    # message rather than in a collective of its own, so its evaluation and logging count
    # from the next iteration on; the first iteration and one process agree here.
    shared = None
    runtime.freeze_setup()  # what set-up made lives to the end: no collection walks it
    try:
        while True:
            clock, go = shared or ranks.agree([wall, more(wall)])  # rank 0's, on every rank
            if not go or (cfg.iterations and trainer.iteration >= cfg.iterations):
                break
            t0 = time.perf_counter()
            progress = max((clock - start_wall) / budget,
                           trainer.iteration / cfg.iterations if cfg.iterations else 0.0)
            trainer.set_progress(progress)
            row = trainer.step(lead if ranks.world > 1 else None)
            if (calm is not None and progress >= 1.0 - cfg.calm_window
                    and trainer.iteration % cfg.calm_every == 0):
                calm.offer(trainer.iteration, trainer.policy)
            shared = row.pop("lead", None)
            row["eval_return"] = row["eval_success"] = score = None
            if ranks.is_main and (wall >= next_eval or
                                  (cfg.iterations and trainer.iteration >= cfg.iterations)):
                last_eval, row["eval_success"], score = evaluate()
                row["eval_return"] = last_eval
                if score is not None:
                    row["eval_score"] = score
                next_eval = wall + cfg.eval_every
                evals_done += 1
            improved = score is not None and score > best_score  # deploy score's choice
            if improved:
                best_score = score
            dt = time.perf_counter() - t0
            wall += dt
            row["wall_time"] = wall
            row["sim_steps_per_s"] = (cfg.num_starts * cfg.group_size * cfg.horizon
                                      * cfg.action_repeat) / max(row["rollout_s"], 1e-9)
            if folder is not None:
                folder.log(row)
                if row["eval_return"] is not None:
                    extra = {"wall_time": wall, "best_return": max(best, last_eval),
                             "eval_return": last_eval, **_score_record(score, best_score)}
                    if (last_eval > best and cfg.deploy == "best") or improved:
                        folder.checkpoint(trainer, DEPLOYED, extra)
                    folder.checkpoint(trainer, LATEST, extra)
            if last_eval is not None:
                best = max(best, last_eval)
            bar.update(row, dt, trainer.iteration, last_eval, best)
            if on_iteration is not None:
                on_iteration(trainer, row)
    finally:
        bar.close()
        trainer.close()
        runtime.thaw()
        if folder is not None:
            final_eval, _, final_score = evaluate()
            improved = final_score is not None and final_score > best_score
            if improved:
                best_score = final_score
            extra = {"wall_time": wall, "best_return": max(best, final_eval),
                     "eval_return": final_eval, **_score_record(final_score, best_score)}
            if calm is not None:
                calm.offer(trainer.iteration, trainer.policy)
                chosen, record = calm.choose()
                folder.checkpoint(trainer, DEPLOYED, {**extra, "calm": record}, chosen.policy)
                deployed = chosen.iteration
            elif (cfg.deploy == "final" or (final_eval > best and cfg.deploy == "best")
                    or improved
                    or not (out / checkpoint_file(DEPLOYED)).exists()):
                folder.checkpoint(trainer, DEPLOYED, extra)
            best = max(best, final_eval)
            folder.checkpoint(trainer, LATEST, extra)
            folder.close()
            plot_curve(out / METRICS, out / CURVE)
    return {"trainer": trainer, "best_return": best, "wall_time": wall,
            "iterations": trainer.iteration, "out": out, "deployed_iteration": deployed,
            "best_score": best_score}


def _score_record(score: float | None, best_score: float) -> dict:
    """A checkpoint's record of deploy score: this evaluation's and the best so far."""
    return {} if score is None else {"eval_score": score, "best_score": best_score}


def run(args) -> int:
    system, preset, cfg, out, randomize = resolve(args)
    if args.tensorboard:
        train_log.check_tensorboard(args.tensorboard)
    launched = distributed.torchrun_world()
    if launched is not None and args.nproc is not None:
        raise UserError("--nproc starts local workers, but torchrun already started this one: "
                        "leave --nproc out (torchrun's --nproc-per-node sets the processes)")
    world = launched if launched is not None else 1 if args.nproc is None else args.nproc
    if world < 1:
        raise UserError(f"--nproc must be at least 1, got {world}")
    if world > 1:
        if args.overlap:
            raise UserError("--overlap true and more than one process both want the spare "
                            "cores: drop --overlap (one rank per core is faster)")
        cfg.overlap = False
        Ranks(0, world).local_config(cfg)  # each rank's share is whole and valid
        distributed.pin_ranks(world)  # a bad GRPO_CTRL_DIST_PIN, before the run folder
    with StopSignals() as signals:  # before the fork: every rank inherits it
        work = (system, preset, cfg, out, args.resume, not args.quiet, randomize,
                lambda: signals.received is not None, args.tensorboard)
        if launched is not None:
            distributed.run_from_env(_train_and_report, work)
        elif world > 1:
            try:
                distributed.launch(world, _train_and_report, work)
            except distributed.WorkerFailed as e:
                print(f"grpo-ctrl train: error: {e}", file=sys.stderr)
                return 1
        else:
            _train_and_report(*work)
    code = 0
    if signals.received is not None:
        print(f"grpo-ctrl train: stopped by {signal.Signals(signals.received).name}; checkpoint "
              f"and metrics saved; continue with `grpo-ctrl train --resume --out {out}`",
              file=sys.stderr)
        code = 128 + signals.received
    if launched is not None:
        distributed.exit_rank(code)
    return code


def _long_run_note(system: str, preset: str, cfg: GRPOConfig) -> str:
    """Says which of the run's values are the plant's defaults for long runs."""
    used = {k: v for k, v in long_budget_defaults(system, preset, cfg.time_budget).items()
            if getattr(cfg, k) == v}
    if not used:
        return ""
    return (f"; {', '.join(f'{k} = {v:g}' for k, v in used.items())}: the defaults of runs of "
            f"{LONG_BUDGET_DEFAULTS[(system, preset)][0]:g} s or more (docs/grpo.md §7)")


def _train_and_report(system: str, preset: str, cfg: GRPOConfig, out: Path, resume: bool,
                      progress: bool, randomize: Randomization, stop,
                      tensorboard=None) -> None:
    """Train as this process's rank; rank 0 says what it does."""
    ranks = Ranks.current()
    if ranks.is_main:
        limits = ([f"{cfg.time_budget:g} s"] if cfg.time_budget > 0 else []) + (
            [f"{cfg.iterations} iterations"] if cfg.iterations else [])
        print(f"training {system}/{preset} into {out} for "
              + (" or ".join(limits) or "ever (Ctrl-C stops it)")
              + ("; rollouts on the second core (--overlap false: one core)" if cfg.overlap
                 else "")
              + (f"; {ranks.world} data-parallel processes" if ranks.world > 1 else "")
              + ("; plants randomised (docs/robustness.md; --randomize off: nominal)"
                 if randomize.active else "")
              + _long_run_note(system, preset, cfg), flush=True)
    summary = train(system, preset, cfg, out, resume=resume, progress=progress, ranks=ranks,
                    randomize=randomize, stop=stop, tensorboard=tensorboard)
    if ranks.is_main:
        print(f"done: {summary['iterations']} iterations in {summary['wall_time']:.1f} s; best "
              f"evaluation return {summary['best_return']:.1f} ({cfg.eval_episodes} episodes); "
              + (f"deployed the best RealAI score, {summary['best_score']:.3f} (deploy score); "
                 if cfg.deploy == "score" else "")
              + (f"deployed the policy of iteration {summary['deployed_iteration']} (deploy "
                 "calm); " if summary["deployed_iteration"] is not None else "")
              + f"run folder {out} (evaluate with `grpo-ctrl eval {out}`)")


class StopSignals:
    """Ctrl-C, SIGTERM (timeout, systemd, docker) and SIGHUP (terminal closed)
    ask training to stop after the iteration in progress, so that the last
    checkpoint, the metrics and the collector process end consistently; a
    second signal to the same process interrupts at once.

    The request lives in memory shared with the processes forked inside the
    ``with`` block (the ``--nproc`` ranks): a signal sent to the launcher alone
    (docker stop, ``kill PID``) stops them too, while a terminal's Ctrl-C,
    which reaches every process of the group, still counts once in each."""
    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self._mine: int | None = None  # what this process itself received
        self._shared = ctypes.c_int.from_buffer(mmap.mmap(-1, ctypes.sizeof(ctypes.c_int)))

    @property
    def received(self) -> int | None:
        """The signal that asked for the stop, in this process or the launcher."""
        return self._mine if self._mine is not None else (self._shared.value or None)

    def __enter__(self) -> "StopSignals":
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def _handle(self, signum, frame) -> None:
        if self._mine is not None:
            raise KeyboardInterrupt
        self._mine = signum
        self._shared.value = signum

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
