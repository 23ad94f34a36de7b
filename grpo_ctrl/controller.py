"""What every controller is, trained or hand-written: one home for the contract.

A controller is a ``torch.nn.Module`` with

* ``spec``: the ``grpo_ctrl.plant.PlantSpec`` of the plant it was made for;
* ``forward(obs)``: float32 observations ``(N, nobs)``, exactly as the
  simulator (or the device's host bridge) reports them, to float32 actuator
  commands ``(N, 1)`` in physical units (N m, N or V), already clipped to
  ``[-spec.u_max, spec.u_max]``. Stateless: the same observation always gives
  the same command, so the ONNX and C exports compute the same function.

``load_controller`` turns what a user names on the command line into one.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from grpo_ctrl.baselines import BASELINES, make_controller
from grpo_ctrl.errors import UserError
from grpo_ctrl.policy import load_policy_controller


def load_controller(source: str, system: str | None = None, preset: str | None = None):
    """A controller from a run folder, a checkpoint file, or a baseline name
    (``lqr``, ``swingup-lqr``; these need ``system``, and take ``preset``)."""
    if source in BASELINES:
        if system is None:
            raise UserError(f"the baseline {source!r} needs a plant: add --system "
                            "pendulum|cartpole|furuta")
        return make_controller(source, system, preset)
    path = Path(source)
    if not path.exists():
        raise UserError(f"{source!r} is neither a run folder, a checkpoint file nor a baseline "
                        f"({', '.join(BASELINES)})")
    return load_policy_controller(path)


@torch.no_grad()
def act(controller, obs: np.ndarray) -> np.ndarray:
    """Commands ``(N,)`` float32 for observations ``(N, nobs)``, in numpy."""
    return controller(torch.as_tensor(obs, dtype=torch.float32)).reshape(-1).numpy()
