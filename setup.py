# The C simulator is compiled at install time by cffi (API mode, out-of-line);
# everything else is declared in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["grpo_ctrl/_build_sim.py:ffibuilder",
                     "firmware_bridge/_build_firmware.py:ffibuilder"])
