"""Overlap: the next batch of groups is collected in a second process while
the trainer updates the policy on this one (docs/grpo.md §4, docs/research.md §5).

The collector is a forked process (so it does not share the GIL) that owns the
trajectory pool from the start. It collects each batch with the next policy in
the pipe, one update older than the policy the batch will train: the trainer
sends each policy as its update ends, while the collector is still on the batch
before, and asks for two batches at the start. A batch's arrays cross in shared
memory made before the fork in the shapes of a first batch (``SharedSlots``, two
sets that alternate); the pipe carries the rest. Each policy crosses the same way
(``PolicySlots``).
"""
from __future__ import annotations

import atexit
import ctypes
import multiprocessing
import multiprocessing.util  # registers its exit hook (join every child) before ours, below
import os
import signal
import weakref
from dataclasses import fields

import numpy as np
import torch


def _die_with_parent() -> None:
    """Linux: the kernel kills the collector when the trainer dies, even by
    SIGKILL, so it is never left blocked in a pipe write."""
    try:
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the daemon flag still ends it at a clean exit
        pass


class _InSlot:
    """The message's placeholder for an array that crossed in its shared slot."""


class SharedSlots:
    """Shared memory for a batch's arrays (its tensor and ndarray fields): two sets of
    slots, one slot per field in the shape and type of ``example``'s, made before the
    collector is forked. The collector copies each array into a slot of one set and pipes
    the rest (``pack``), the next batch into the other set. The trainer copies a batch's
    arrays out (``unpack``) as soon as its message is in; meanwhile the collector writes
    the next batch into the other set, and it writes this set again only for the batch
    after next, which it starts on the policy the trainer sends after its update. An
    array that does not fit its slot (another shape or type) goes through the pipe.
    Pickling ~270 kB of arrays through the pipe cost the collector ~1 ms an iteration
    (docs/research.md §13)."""

    SETS = 2

    def __init__(self, example):
        self.slots = [{} for _ in range(self.SETS)]
        for f in fields(example):
            value = getattr(example, f.name)
            if isinstance(value, (torch.Tensor, np.ndarray)):
                for slots in self.slots:
                    slots[f.name] = torch.empty_like(torch.as_tensor(value)).share_memory_()

    def pack(self, batch, which: int) -> tuple:
        """The message for ``batch``, its arrays copied into set ``which``."""
        values, tensors = {}, []
        for f in fields(batch):
            value = getattr(batch, f.name)
            if isinstance(value, torch.Tensor):
                tensors.append(f.name)
            slot = self.slots[which].get(f.name)
            array = (torch.as_tensor(value) if isinstance(value, (torch.Tensor, np.ndarray))
                     else None)
            if (slot is not None and array is not None and array.shape == slot.shape
                    and array.dtype == slot.dtype):
                slot.copy_(array)
                values[f.name] = _InSlot()
            else:
                values[f.name] = value.numpy() if isinstance(value, torch.Tensor) else value
        return which, type(batch), tensors, values

    def unpack(self, message: tuple):
        which, cls, tensors, values = message
        slots, out = self.slots[which], {}
        for k, v in values.items():
            if isinstance(v, _InSlot):
                out[k] = slots[k].clone() if k in tensors else slots[k].numpy().copy()
            else:
                out[k] = torch.from_numpy(v) if k in tensors else v
        return cls(**out)


class PolicySlots:
    """Shared memory for a policy's tensors (its network's parameters and buffers, then
    log std) flat in float32 and its normaliser's statistics in float64: two sets, made
    before the fork from a policy of the trainer's architecture. The trainer writes each
    policy into the next set and pipes only which set; the collector copies the set into
    its policy before it collects. The trainer writes a set again two policies later,
    after the batch collected by the policy the set held has come back, so the collector
    has read it by then. Pickling the policy through the pipe took the trainer 0.17 ms
    an iteration, the process the overlap waits on (docs/research.md §13)."""

    SETS = 2

    def __init__(self, policy):
        self.shapes = [t.shape for t in self._tensors(policy)]
        n = sum(shape.numel() for shape in self.shapes)
        self.slots = [torch.empty(n).share_memory_() for _ in range(self.SETS)]
        k = policy.obs_norm.mean.numel()
        # the normaliser's statistics: count, mean (k), variance (k), float64
        self.norms = [torch.empty(1 + 2 * k, dtype=torch.float64).share_memory_()
                      for _ in range(self.SETS)]
        self.next = 0  # the set the trainer writes next

    @staticmethod
    def _tensors(policy) -> list:
        return list(policy.net.state_dict(keep_vars=True).values()) + [policy.log_std]

    def _of(self, policy) -> list:
        tensors = self._tensors(policy)
        if [t.shape for t in tensors] != self.shapes:
            raise ValueError(f"the policy's tensors {[tuple(t.shape) for t in tensors]} "
                             f"are not the slots' {[tuple(s) for s in self.shapes]}")
        return tensors

    def write(self, policy) -> int:
        """Copy ``policy`` into the next set; returns that set, the message for the pipe."""
        which, self.next = self.next, (self.next + 1) % self.SETS
        norm = policy.obs_norm
        with torch.no_grad():
            torch.cat([t.detach().reshape(-1) for t in self._of(policy)], out=self.slots[which])
            self.norms[which][0] = norm.count
            torch.cat([norm.mean, norm.var], out=self.norms[which][1:])
        return which

    def read(self, which: int, policy) -> None:
        """``write``'s policy, in set ``which``, copied into ``policy`` in place."""
        with torch.no_grad():
            parts = self.slots[which].split([shape.numel() for shape in self.shapes])
            for t, part in zip(self._of(policy), parts):
                t.copy_(part.view(t.shape))
        k = (len(self.norms[which]) - 1) // 2
        count, mean, var = self.norms[which].split([1, k, k])
        policy.obs_norm.load_state_dict({"count": float(count), "mean": mean.clone(),
                                         "var": var.clone()})
        policy.refresh_norm()


def _serve(conn, parent: int, make_rollout, make_policy, seed: int, slots: SharedSlots,
           policies: PolicySlots) -> None:
    """The collector's loop: a policy (and the reward's cost scale) in, a batch collected
    by it out, until None."""
    _die_with_parent()
    if os.getppid() != parent:  # the trainer died before the line above took effect
        os._exit(0)
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # sent to the whole process
        signal.signal(stop, signal.SIG_IGN)  # group too; the trainer decides when to stop
    torch.set_num_threads(1)
    rollout, policy = make_rollout(), make_policy()
    gen = torch.Generator().manual_seed(seed + 1)
    conn.send("ready")
    which = 0  # the set of slots the next batch goes to: they alternate
    while (message := conn.recv()) is not None:
        try:
            which_policy, cost_scale = message
            policies.read(which_policy, policy)
            rollout.set_cost_scale(cost_scale)
            conn.send(slots.pack(rollout.collect(policy, gen), which))
            which = (which + 1) % slots.SETS
        except Exception as e:  # reported, and raised, by the trainer
            conn.send(e)


class _Link:
    """The trainer's end of one collector: what stopping it needs, apart from
    the collector object, so that a finalizer can stop it without keeping the
    object alive."""

    def __init__(self, pipe, process):
        # policies sent for which no batch has come back yet
        self.pipe, self.process, self.pending = pipe, process, 0

    def stop(self) -> None:
        """Ask the collector to end, then make sure it has: it ignores SIGTERM
        (multiprocessing's exit hook would send that and then wait forever)."""
        try:
            while self.pending and self.pipe.poll(10):
                self.pipe.recv()  # the batches it is collecting: nobody will train on them
                self.pending -= 1
            self.pipe.send(None)
        except (EOFError, OSError):  # it is gone already
            pass
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.pipe.close()


# Collectors nobody closed are stopped at exit, before multiprocessing's own hook
# (registered earlier, so run later) joins them.
_unclosed: set = set()
atexit.register(lambda: [stop() for stop in list(_unclosed)])


class OverlapCollector:
    """A second process that collects batches one update ahead of the trainer.

    ``make_rollout()`` and ``make_policy()`` build, inside the collector, the
    rollout pool (an object with ``collect(policy, generator) -> batch``) and a
    policy of the trainer's architecture. ``close()`` stops it; so do garbage
    collection and interpreter exit, for a trainer that was never closed."""

    def __init__(self, make_rollout, make_policy, seed: int):
        ctx = multiprocessing.get_context("fork")
        # a first batch, here, gives the shared slots their shapes (a few ms)
        example = make_policy()
        self._slots = SharedSlots(make_rollout().collect(example,
                                                         torch.Generator().manual_seed(seed)))
        self._policies = PolicySlots(example)
        pipe, theirs = ctx.Pipe()
        process = ctx.Process(target=_serve, daemon=True,
                              args=(theirs, os.getpid(), make_rollout, make_policy, seed,
                                    self._slots, self._policies))
        process.start()
        theirs.close()  # the collector's end lives in the collector: EOF here when it dies
        self._link = _Link(pipe, process)
        self._stop = weakref.finalize(self, self._link.stop)
        self._stop.atexit = False  # the hook above runs it, in the right order
        _unclosed.difference_update([f for f in _unclosed if not f.alive])  # collected ones
        _unclosed.add(self._stop)
        if pipe.recv() != "ready":
            self.close()
            raise RuntimeError("the overlap collector did not start")

    def next_batch(self, policy, cost_scale: float = 1.0):
        """The batch collected with the policy of one update ago; the first two
        times, with this one (two batches from the start keep one in hand while the
        trainer updates). ``cost_scale``: the reward's costs of effort for those two
        (``GroupRollout.set_cost_scale``)."""
        link = self._link
        if not link.pending:
            which = self._policies.write(policy)
            for _ in range(2):
                link.pipe.send((which, cost_scale))
            link.pending = 2
        message = link.pipe.recv()
        link.pending -= 1
        if isinstance(message, Exception):
            raise message
        return self._slots.unpack(message)

    def updated(self, policy, cost_scale: float = 1.0) -> None:
        """The policy an update has just made, for the batch after the one in hand:
        sent now, it waits in the pipe until the collector finishes that one, so the
        collector does not wait for the trainer's round trip (0.23 ms an iteration,
        docs/research.md §13)."""
        self._link.pipe.send((self._policies.write(policy), cost_scale))
        self._link.pending += 1

    def close(self) -> None:
        _unclosed.discard(self._stop)
        self._stop()  # a finalizer runs once: a second close does nothing
