"""How the training process runs, apart from what it computes: threads, the heap,
the garbage collector and the fused Adam step. None of it changes a result.

Import this module before torch (grpo_ctrl/grpo.py and grpo_ctrl/train.py do):
idle OpenMP threads then sleep instead of spinning. On a machine shared with
other processes, spinning made two-thread updates 20-60x slower.
"""
from __future__ import annotations

import gc
import os
import weakref

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read once, when torch loads OpenMP

import torch  # noqa: E402

from grpo_ctrl.heap import keep_freed_memory  # noqa: E402


def tune_process() -> None:
    """Every training iteration frees and allocates the same large tensors: keep the
    pages rather than fault them in again (thousands of faults per iteration
    otherwise; grpo_ctrl/heap.py)."""
    keep_freed_memory()


def use_threads(n: int) -> None:
    """torch's threads for what follows: one for the rollout (small ops), ``threads``
    for the update."""
    torch.set_num_threads(n)


def freeze_setup() -> None:
    """Move every object made so far (modules, the trainer, the simulators) out of the
    garbage collector's reach: its full collections, triggered by the loop's many small
    allocations, then walk only what the loop made. ``thaw`` undoes it."""
    gc.freeze()


def thaw() -> None:
    """Undo ``freeze_setup`` (a process that trains several times in a row)."""
    gc.unfreeze()


def adam(params, lr: float) -> torch.optim.Adam:
    """Adam, fused where this torch has a fused CPU kernel (2.4 and later): all the
    parameters in one kernel, 44 against 130 us a step at the gym default (two steps an
    iteration)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):  # older torch: CUDA only
        return torch.optim.Adam(params, lr=lr)


# fused Adam's step counts, one tensor per optimiser (adam_step)
_STEP_COUNTERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def adam_step(opt: torch.optim.Optimizer) -> None:
    """``opt.step()``; for fused Adam, its kernel called directly, as torch's own step
    calls it. The same arithmetic on the same state, so checkpoints and results do not
    change, without torch.optim's Python around it: 40 us a step when warm, 94-280 us
    in training, where the rollout before it leaves the caches cold; the direct call
    15 / 27 us. torch.optim.Adam's step where the call does not apply: another
    optimiser or option, a first step (no state yet), a parameter without a gradient,
    a torch without the kernel (``torch._fused_adam_`` is private)."""
    group = opt.param_groups[0] if len(opt.param_groups) == 1 else {}
    params = group.get("params", [])
    states = [opt.state.get(p) for p in params]
    if (not isinstance(opt, torch.optim.Adam) or not group.get("fused") or group["amsgrad"]
            or group["maximize"] or group["weight_decay"] != 0
            or group.get("decoupled_weight_decay") or group["differentiable"]
            or not hasattr(torch, "_fused_adam_") or not all(states)
            or any(p.grad is None for p in params)):
        opt.step()
        return
    steps = [st["step"] for st in states]
    counter = _STEP_COUNTERS.get(opt)
    if (counter is None or len(counter[1]) != len(steps)
            or any(a is not b for a, b in zip(steps, counter[1]))):
        # each parameter's step count as a view of one tensor: one add for them all,
        # not a foreach add (3 against 35 us in training)
        flat = torch.stack(steps)
        views = flat.unbind()
        for st, view in zip(states, views):
            st["step"] = view
        counter = _STEP_COUNTERS[opt] = (flat, views)
        steps = list(views)
    counter[0].add_(1)
    beta1, beta2 = group["betas"]
    torch._fused_adam_(params, [p.grad for p in params], [st["exp_avg"] for st in states],
                       [st["exp_avg_sq"] for st in states], [], steps, amsgrad=False,
                       lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=0.0,
                       eps=group["eps"], maximize=False, grad_scale=None, found_inf=None)
