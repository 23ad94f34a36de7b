"""``grpo-ctrl``: one entry point, one subcommand per job.

Each subcommand lives in the module that owns its job. That module provides
``add_arguments(parser)`` and ``run(args) -> int``, and is imported only when
its command is chosen, so ``grpo-ctrl --help`` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from grpo_ctrl.errors import UserError

# command -> (module, one-line help)
COMMANDS = {
    "demo": ("grpo_ctrl.demo", "train, export, serve the HIL pendulum and run the loop: the whole chain"),
    "train": ("grpo_ctrl.train", "train a controller with GRPO"),
    "eval": ("grpo_ctrl.cli_eval", "evaluate a trained run or a baseline controller"),
    "baselines": ("grpo_ctrl.baselines.report", "tabulate the classic controllers on every plant"),
    "export": ("grpo_ctrl.export.cli_export", "export a controller to ONNX and/or C"),
    "inspect": ("grpo_ctrl.export.cli_inspect", "print the metadata of an exported ONNX controller"),
    "verify": ("grpo_ctrl.export.cli_verify", "check an exported ONNX controller against its source"),
    "hil": ("grpo_ctrl.firmware_bridge.hil", "serve a hardware-in-the-loop pendulum on a pseudo-terminal"),
    "run": ("grpo_ctrl.firmware_bridge.host", "run an ONNX controller closed-loop over serial"),
    "bench": ("grpo_ctrl.bench_cli", "run a benchmark (sim, train, export, loop)"),
}


def _parser(command: str | None) -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="grpo-ctrl",
        description="Train pendulum controllers with GRPO, export them, run them on the rig.")
    sub = top.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return top


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in COMMANDS:
        command = None
    args = _parser(command).parse_args(argv)
    if args.command is None:
        _parser(None).print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except UserError as e:  # only these: any other exception is a bug and keeps its traceback
        print(f"grpo-ctrl {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"grpo-ctrl {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`grpo-ctrl inspect x.onnx | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141


if __name__ == "__main__":
    sys.exit(main())
