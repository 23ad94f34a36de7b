"""Classic control baselines: LQR and energy swing-up plus LQR, for every plant.

``make_controller(name, system, preset)`` is what
``grpo_ctrl.controller.load_controller`` calls for ``lqr`` and
``swingup-lqr``; both return stateless controllers under the contract of
``grpo_ctrl.controller``.
"""
from __future__ import annotations

from grpo_ctrl.errors import UserError
from grpo_ctrl.plant import presets, systems

BASELINES = ("lqr", "swingup-lqr")  # the names a user may give instead of a run


def make_controller(name: str, system: str, preset: str | None = None):
    """The baseline ``name`` ("lqr" or "swingup-lqr") for a plant preset."""
    if system not in systems():
        raise UserError(f"unknown system {system!r}; choose one of {', '.join(systems())}")
    if preset is not None and preset not in presets(system):
        raise UserError(f"unknown preset {preset!r} for {system}; choose one of "
                        f"{', '.join(presets(system))}")
    if name == "lqr":
        from grpo_ctrl.baselines.lqr import make_lqr
        return make_lqr(system, preset)
    if name == "swingup-lqr":
        from grpo_ctrl.baselines.swingup import make_swingup_lqr
        return make_swingup_lqr(system, preset)
    raise UserError(f"unknown baseline {name!r}; choose one of {', '.join(BASELINES)}")
