"""``python -m grpo_ctrl``: the ``grpo-ctrl`` command, for launchers that start
a module (``torchrun ... -m grpo_ctrl train ...``)."""
import sys

from grpo_ctrl.cli import main

sys.exit(main())
