"""Data-parallel GRPO on torch.distributed (gloo): the ranks, the collectives
the trainer needs, and the launcher of local workers (docs/distributed.md).

Each rank owns ``num_starts / world`` of the start states (the global batch
is the configured one, whatever the number of processes), its own simulator
and random streams (seeded per rank), and collects its groups: a group never
spans ranks, so group statistics stay where they are. One collective per
minibatch step averages the flattened gradients before clipping, so every
rank takes the same optimiser step and holds the same weights. Batch-level
statistics (the batch std of ``adv_scale = batch``; the observation
normaliser's moments and the diagnostics, in one collective) are reduced
across ranks. Rank 0's clock sets the learning-rate schedule and decides when
to stop; it rides on the batch statistics' message (train.py), so no rank
waits in a collective the others never reach.

A sum over ranks is an all-gather followed by additions in rank order
(``Ranks._sum``): gloo's all-gather takes half the messages of its
all-reduce (6 against 12 per rank with 2 ranks, whatever the size), and the
result has the same bits on every rank by construction. Each collective is
waited for by polling, yielding the CPU between polls, for up to
``GRPO_CTRL_DIST_SPIN_MS`` (default 5) before sleeping, or until other work
wants the core: on a virtual machine a rank whose core goes idle in every
collective pays the hypervisor's wake-up several times per message
(docs/distributed.md §5). Workers as many as the machine's CPUs are each
bound to one (``pin_ranks``): a rank's gloo threads then wake on its CPU,
never on another rank's.

With one process no process group exists and every reduction below is the
identity: the trainer computes exactly what it computed before, bit for bit.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import replace
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grpo_ctrl.errors import UserError
from grpo_ctrl.grpo_config import GRPOConfig, check_config

# rank r's simulators and noise are seeded with seed + r * RANK_SEED_STRIDE (rank 0: the seed)
RANK_SEED_STRIDE = 1_000_003
# a poll's yield that took longer gave the core to other work (a gloo thread handles a
# message in tens of microseconds; another process runs for a time slice, >= 0.7 ms) ...
YIELD_TAKEN = 300e-6
# ... and then the next collectives sleep at once: the core has other work to do, and a
# yielding rank resumes only at its turn, where a sleeping one is woken ahead of it
SLEEP_AFTER_TAKEN = 30


def collective_timeout() -> timedelta:
    """How long a collective waits for the other ranks: GRPO_CTRL_DIST_TIMEOUT
    seconds, 300 by default. Rank 0 alone evaluates and checkpoints in
    between, so this must exceed the longest evaluation; a rank that dies is
    usually noticed sooner, by the launcher or by gloo's closed connection."""
    text = os.environ.get("GRPO_CTRL_DIST_TIMEOUT", "300")
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise UserError(f"GRPO_CTRL_DIST_TIMEOUT={text!r} is not a positive number of seconds; "
                        "unset it (300 s) or set e.g. 600")
    return timedelta(seconds=seconds)


def spin_seconds() -> float:
    """How long a rank polls a collective before it sleeps:
    GRPO_CTRL_DIST_SPIN_MS milliseconds, 5 by default, 0 to sleep at once.
    Polling keeps the core busy (yielding it to any other runnable thread),
    so the messages of a collective do not each wait for an idle core to
    wake; a rank that waits longer (rank 0 evaluating) sleeps after it
    (``Ranks._wait``)."""
    text = os.environ.get("GRPO_CTRL_DIST_SPIN_MS", "5")
    try:
        ms = float(text)
    except ValueError:
        ms = -1.0
    if not 0 <= ms <= 60_000:
        raise UserError(f"GRPO_CTRL_DIST_SPIN_MS={text!r} is not a number of milliseconds from 0 "
                        "to 60000; unset it (5) or set 0 to sleep in every collective")
    return ms / 1e3


class Ranks:
    """This process's place among the data-parallel training processes, and
    the reductions the trainer makes across them. ``collectives`` counts the
    collectives this process took part in, ``waited_s`` the wall time it
    spent in them (the benchmark reads both)."""

    def __init__(self, rank: int = 0, world: int = 1, spin: float | None = None):
        self.rank, self.world = rank, world
        if spin is None:
            spin = spin_seconds() if world > 1 else 0.0
        self.spin = spin  # seconds a collective is polled (Ranks._wait)
        self.collectives, self.waited_s = 0, 0.0
        self._sleep_next = 0  # collectives that sleep at once, after other work took the core
        self._grads: list[torch.Tensor] = []  # views into _flat, the parameters' .grad
        self._flat = torch.empty(0)

    @classmethod
    def current(cls) -> "Ranks":
        """The initialised process group's ranks, or a single process."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def is_main(self) -> bool:
        """Rank 0 evaluates, logs, plots and checkpoints."""
        return self.rank == 0

    def seed(self, base: int) -> int:
        return base + RANK_SEED_STRIDE * self.rank

    def local_config(self, cfg: GRPOConfig) -> GRPOConfig:
        """The configuration of this rank's rollouts: its share of the start
        states (whole groups, the same number on every rank), checked."""
        if cfg.num_starts % self.world:
            below = cfg.num_starts // self.world * self.world
            fits = " or ".join(str(n) for n in (below, below + self.world) if n > 0)
            raise UserError(f"num_starts ({cfg.num_starts}) must be a multiple of the number of "
                            f"processes ({self.world}), each holding an equal share of the "
                            f"groups: set num_starts to {fits}")
        local = replace(cfg, num_starts=cfg.num_starts // self.world)
        try:
            check_config(local)
        except UserError as e:
            raise UserError(f"with {self.world} processes, each rank's share: {e}") from None
        return local

    def average_gradients(self, params) -> None:
        """Replace each gradient by its mean over the ranks: one collective
        of the flattened gradients. The first call moves the gradients into
        one flat buffer and leaves each parameter's .grad a view of it; as
        long as they stay there (zero_grad(set_to_none=False)) no call
        copies them again."""
        if self.world == 1:
            return
        params = [p for p in params if p.grad is not None]
        if len(params) != len(self._grads) or any(p.grad is not g
                                                  for p, g in zip(params, self._grads)):
            self._flat = torch.cat([p.grad.reshape(-1) for p in params])
            self._grads, offset = [], 0
            for p in params:
                p.grad = self._flat[offset:offset + p.numel()].view_as(p)
                self._grads.append(p.grad)
                offset += p.numel()
        self._sum(self._flat, out=self._flat)
        self._flat /= self.world

    def batch_std(self, x: np.ndarray) -> float:
        """Standard deviation (unbiased) of all ranks' x together: the
        two-pass formula, one collective per pass."""
        if self.world == 1:
            return float(x.std(ddof=1))
        total = self._sum(torch.tensor([x.sum(), x.size], dtype=torch.float64))
        mean = float(total[0] / total[1])
        squares = self._sum(torch.tensor([((x - mean) ** 2).sum()], dtype=torch.float64))
        return float(np.sqrt(squares[0] / (total[1] - 1)))

    def reduce_batch(self, norm, obs: torch.Tensor | None, diagnostics: dict | None = None,
                     lead=None, moments: torch.Tensor | None = None) -> dict:
        """Fold all ranks' observations obs (N, nobs) into the RunningNorm
        norm, and return the diagnostics' means over the ranks: one
        collective of counts, sums and squares about the running mean (the
        same on every rank, so the sums stay small where the data is).
        ``lead``, a function of no arguments returning floats (train.py's
        clock and stop flag), is called on every rank just before the
        collective; rank 0's values come back on every rank under "lead".
        ``moments`` (one process): ``RunningNorm.moments(obs)``, computed where the
        batch was collected (Batch.obs_moments); obs may then be None."""
        diagnostics = diagnostics or {}
        if self.world == 1:
            if moments is not None:
                norm.merge_moments(moments)
            else:
                norm.update(obs)
            return {**diagnostics, **({"lead": list(lead())} if lead is not None else {})}
        x = obs.reshape(-1, norm.mean.numel()).double()
        d = x - norm.mean
        ride = [float(v) for v in lead()] if lead is not None else []
        mine = torch.cat([torch.tensor([float(x.shape[0])], dtype=torch.float64), d.sum(0),
                          (d * d).sum(0), torch.tensor(list(diagnostics.values()) + ride,
                                                       dtype=torch.float64)])
        rows = self._gather(mine)
        total = self._sum_rows(rows[:, :mine.numel() - len(ride)])
        k = norm.mean.numel()
        n, shift = total[0], total[1:1 + k] / total[0]
        var = (total[1 + k:1 + 2 * k] / n - shift * shift).clamp(min=0.0)
        norm.merge(int(n), norm.mean + shift, var)
        out = {key: float(v) / self.world for key, v in zip(diagnostics, total[1 + 2 * k:])}
        if lead is not None:
            out["lead"] = rows[0, mine.numel() - len(ride):].tolist()
        return out

    def agree(self, values: list[float]) -> list[float]:
        """Rank 0's values, on every rank."""
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        self._wait(dist.broadcast(t, 0, async_op=True))
        return t.tolist()

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        """Rank 0's parameters, on every rank (one flattened broadcast)."""
        if self.world == 1:
            return
        params = list(module.parameters())
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        dist.broadcast(flat, 0)
        offset = 0
        with torch.no_grad():
            for p in params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def _gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x (the same shape everywhere), row r from rank r."""
        rows = torch.empty((self.world, *x.shape), dtype=x.dtype)
        self._wait(dist.all_gather(list(rows.unbind(0)), x.contiguous(), async_op=True))
        return rows

    @staticmethod
    def _sum_rows(rows: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """rows[0] + rows[1] + ... in this order: the same bits on every rank
        and machine (with 2 ranks, the bits of gloo's all-reduce)."""
        out = rows[0].clone() if out is None else out.copy_(rows[0])
        for row in rows[1:]:
            out += row
        return out

    def _sum(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The sum of x over the ranks (into out, which may be x)."""
        return self._sum_rows(self._gather(x), out)

    def _wait(self, work) -> None:
        """Wait for a collective started with async_op=True: poll it,
        yielding the CPU, for up to ``spin`` seconds, then sleep in wait()
        (which also raises the collective's error, or gloo's timeout). A
        yield that gave the core away for longer than a message takes to
        handle (YIELD_TAKEN) means other work wants this core: then the
        core is not idling anyway, polling would only take from that work,
        and this and the next SLEEP_AFTER_TAKEN collectives sleep."""
        started = time.perf_counter()
        deadline = started + (self.spin if not self._sleep_next else 0.0)
        self._sleep_next = max(self._sleep_next - 1, 0)
        now = started
        while now < deadline and not work.is_completed():
            os.sched_yield()
            before, now = now, time.perf_counter()
            if now - before > YIELD_TAKEN:
                self._sleep_next = SLEEP_AFTER_TAKEN
                break
        work.wait()
        self.collectives += 1
        self.waited_s += time.perf_counter() - started


# ----------------------------------------------------------------- launching
def torchrun_world() -> int | None:
    """The world size torchrun (or another env:// launcher) set, or None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    return None


def run_from_env(worker, args: tuple = ()) -> None:
    """Run ``worker(*args)`` as one rank of the process group a launcher such
    as torchrun described in the environment (MASTER_ADDR, MASTER_PORT,
    RANK, WORLD_SIZE)."""
    spin_seconds()  # a bad setting stops every rank before any work
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))  # this machine's workers (torchrun)
    if local and pin_ranks(local):
        _bind_to_cpu(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("gloo", init_method="env://", timeout=collective_timeout())
    try:
        worker(*args)
        _leave_together()
    finally:
        dist.destroy_process_group()


def _leave_together() -> None:
    """Every rank waits here for the others to finish their work (rank 0 ends with the final
    evaluation and the run folder's files) before any tears its process group down: a rank
    that left first aborted in gloo's teardown ("terminate called without an active
    exception", SIGABRT) in about 1 of 10 runs of two torchrun nodes."""
    dist.barrier()


def exit_rank(code: int) -> None:
    """End a launcher's rank (``run_from_env``: its group torn down, its run's files closed)
    without the interpreter's own teardown. There, in about 1 of 10 runs of two torchrun
    nodes even after ``_leave_together``, a thread of torch's left joinable ended the worker
    in "terminate called without an active exception" (SIGABRT), and torchrun reported the
    finished run as failed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class WorkerFailed(RuntimeError):
    """A local worker died or raised; the others were stopped."""


def pin_ranks(nproc: int) -> bool:
    """Whether ``nproc`` workers on this machine (``--nproc``, or torchrun's
    LOCAL_WORLD_SIZE) are each bound to one CPU:
    GRPO_CTRL_DIST_PIN=1 always, 0 never, unset (or ``auto``) when they are as
    many as the CPUs this process may use. A rank and the gloo threads it
    starts then stay on their CPU and do not land on the other ranks' between
    messages: on this 2-core VM the ranks' arrival at a collective differed by
    ~0.3 ms pinned, and by 5-6 ms in runs of iterations unpinned
    (docs/distributed.md §5). With fewer workers than CPUs, a pinned rank could
    not move off a CPU that other work took, so they stay free unless asked."""
    text = os.environ.get("GRPO_CTRL_DIST_PIN", "auto")
    if text not in ("0", "1", "auto"):
        raise UserError(f"GRPO_CTRL_DIST_PIN={text!r} is neither 0, 1 nor auto; unset it (pinned "
                        "when there are as many workers as CPUs), 1 to bind each local worker "
                        "to its own CPU, 0 not to")
    if text == "auto":
        return hasattr(os, "sched_getaffinity") and nproc == len(os.sched_getaffinity(0))
    return text == "1"


def _bind_to_cpu(local_rank: int) -> None:
    """Bind this process to its own CPU, before gloo starts its threads, so
    that they inherit it."""
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[local_rank % len(cpus)]})


def _run_rank(rank: int, world: int, port: int, worker, args: tuple) -> None:
    if pin_ranks(world):
        _bind_to_cpu(rank)
    timeout = collective_timeout()
    store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        worker(*args)
        _leave_together()
    finally:
        dist.destroy_process_group()


def launch(nproc: int, worker, args: tuple = ()) -> None:
    """Run ``worker(*args)`` in ``nproc`` forked processes, ranks 0..nproc-1
    of one gloo group on loopback (this process holds the rendezvous store).
    If one dies or raises, the others are stopped and WorkerFailed says which
    and why in one line."""
    spin_seconds()  # a bad setting is refused before any worker starts
    pin_ranks(nproc)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback, whatever the hostname says
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)  # we say it once
    store = dist.TCPStore("127.0.0.1", 0, nproc + 1, is_master=True, wait_for_workers=False,
                          timeout=collective_timeout())
    try:
        mp.start_processes(_run_rank, args=(nproc, store.port, worker, args), nprocs=nproc,
                           start_method="fork")
    except mp.ProcessExitedException as e:
        how = (f"was killed by signal {e.signal_name}" if e.signal_name else
               f"exited with code {e.exit_code}")
        raise WorkerFailed(f"worker rank {e.error_index} (pid {e.error_pid}) {how}; the other "
                           f"workers were stopped") from None
    except mp.ProcessRaisedException as e:
        last = e.msg.strip().splitlines()[-1]
        raise WorkerFailed(f"worker rank {e.error_index} (pid {e.error_pid}) failed: {last}; the "
                           f"other workers were stopped") from None
