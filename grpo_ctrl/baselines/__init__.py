"""Classic control baselines: LQR and energy swing-up plus LQR, for every plant.

``make_controller(name, system, preset)`` is what
``grpo_ctrl.controller.load_controller`` calls for ``lqr`` and
``swingup-lqr``; both return stateless controllers under the contract of
``grpo_ctrl.controller``.
"""
from __future__ import annotations

from grpo_ctrl.errors import UserError
from grpo_ctrl.plant import resolve_plant

BASELINES = ("lqr", "swingup-lqr")  # the names a user may give instead of a run
# plants without an energy swing-up (the double pendulum's is not written): LQR only
NO_SWINGUP = ("double_pendulum",)


def available(system: str) -> tuple[str, ...]:
    """The baselines a plant has."""
    return ("lqr",) if system in NO_SWINGUP else BASELINES


def make_controller(name: str, system: str, preset: str | None = None):
    """The baseline ``name`` ("lqr" or "swingup-lqr") for a plant preset."""
    resolve_plant(system, preset)
    if name == "lqr":
        from grpo_ctrl.baselines.lqr import make_lqr
        return make_lqr(system, preset)
    if name == "swingup-lqr":
        from grpo_ctrl.baselines.swingup import make_swingup_lqr
        return make_swingup_lqr(system, preset)
    raise UserError(f"unknown baseline {name!r}; choose one of {', '.join(BASELINES)}")
