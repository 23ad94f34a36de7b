"""Overlap: the next batch of groups is collected in a second process while
the trainer updates the policy on this one (docs/grpo.md §6).

The collector is a forked process (so it does not share the GIL) that owns the
trajectory pool from the start. It receives the policy as it is after each
update, answers with the batch it collected with the policy one update older,
and starts on the next one. Tensors cross the pipe as numpy arrays: pickling
those is ~20x faster than pickling tensors.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
from dataclasses import fields

import torch


def _die_with_parent() -> None:
    """Linux: the kernel kills the collector when the trainer dies, even by
    SIGKILL, so it is never left blocked in a pipe write."""
    try:
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the daemon flag still ends it at a clean exit
        pass


def _pack(batch) -> tuple:
    tensors = [f.name for f in fields(batch) if isinstance(getattr(batch, f.name), torch.Tensor)]
    values = {f.name: getattr(batch, f.name) for f in fields(batch)}
    return type(batch), tensors, {k: v.numpy() if k in tensors else v for k, v in values.items()}


def _unpack(message: tuple):
    cls, tensors, values = message
    return cls(**{k: torch.from_numpy(v) if k in tensors else v for k, v in values.items()})


def _serve(conn, parent: int, make_rollout, make_policy, seed: int) -> None:
    """The collector's loop: a policy in, a batch collected by it out, until None."""
    _die_with_parent()
    if os.getppid() != parent:  # the trainer died before the line above took effect
        os._exit(0)
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # sent to the whole process
        signal.signal(stop, signal.SIG_IGN)  # group too; the trainer decides when to stop
    torch.set_num_threads(1)
    rollout, policy = make_rollout(), make_policy()
    gen = torch.Generator().manual_seed(seed + 1)
    conn.send("ready")
    while (state := conn.recv()) is not None:
        try:
            policy.load_numpy_state(state)
            conn.send(_pack(rollout.collect(policy, gen)))
        except Exception as e:  # reported, and raised, by the trainer
            conn.send(e)


class OverlapCollector:
    """A second process that collects batches one update ahead of the trainer.

    ``make_rollout()`` and ``make_policy()`` build, inside the collector, the
    rollout pool (an object with ``collect(policy, generator) -> batch``) and a
    policy of the trainer's architecture."""

    def __init__(self, make_rollout, make_policy, seed: int):
        ctx = multiprocessing.get_context("fork")
        self._pipe, theirs = ctx.Pipe()
        self._process = ctx.Process(target=_serve, daemon=True,
                                    args=(theirs, os.getpid(), make_rollout, make_policy, seed))
        self._process.start()
        self._pending = False
        if self._pipe.recv() != "ready":
            raise RuntimeError("the overlap collector did not start")

    def next_batch(self, policy):
        """The batch collected with the policy of one update ago (the first
        time: with this one); the collection of the next starts now, with
        this policy."""
        if not self._pending:
            self._pipe.send(policy.numpy_state())
        message = self._pipe.recv()
        if isinstance(message, Exception):
            raise message
        self._pipe.send(policy.numpy_state())
        self._pending = True
        return _unpack(message)

    def close(self) -> None:
        if self._pending:
            self._pipe.recv()  # the batch it is collecting: nobody will train on it
        self._pipe.send(None)
        self._process.join(timeout=10)
        self._pipe.close()

