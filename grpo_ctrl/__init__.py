"""grpo-ctrl: train pendulum controllers with GRPO, export them, run them on the rig."""

__version__ = "0.1.0"
