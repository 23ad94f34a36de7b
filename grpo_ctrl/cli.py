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
    "train": ("grpo_ctrl.fit", "train a controller with GRPO (--fit: sized for a board)"),
    "eval": ("grpo_ctrl.cli_eval", "evaluate a trained run or a baseline controller"),
    "distill": ("grpo_ctrl.distill", "a controller's behaviour in a small network (DAgger)"),
    "trajopt": ("grpo_ctrl.trajopt", "a double pendulum's swing-up optimised on RealAIGym's score, cloned into a network"),
    "replay": ("grpo_ctrl.cli_video", "draw a rig's run from its telemetry (grpo-ctrl run --log) as a GIF or MP4"),
    "baselines": ("grpo_ctrl.baselines.report", "tabulate the classic controllers on every plant"),
    "export": ("grpo_ctrl.export.cli_export", "export a controller to ONNX and/or C"),
    "inspect": ("grpo_ctrl.export.cli_inspect", "print the metadata of an exported ONNX controller"),
    "verify": ("grpo_ctrl.export.cli_verify", "check an exported ONNX controller against its source"),
    "hil": ("grpo_ctrl.firmware_bridge.hil", "serve a hardware-in-the-loop pendulum on a pseudo-terminal"),
    "run": ("grpo_ctrl.firmware_bridge.host", "run an ONNX controller closed-loop over serial"),
    "excite": ("grpo_ctrl.firmware_bridge.excite", "run a safe identification experiment on the rig and log it"),
    "sysid": ("grpo_ctrl.cli_sysid", "fit a plant's parameters, delay and offset to run/excite logs"),
    "firmware": ("grpo_ctrl.firmware_bridge.boards", "write a firmware project for a board (uno, mps2-an386), built and sized"),
    "bench": ("grpo_ctrl.bench_cli", "run a benchmark (sim, train, export, loop)"),
}

# a package that is not in the base install -> the extra that brings it
EXTRAS = {"torch": "train", "onnx": "train", "matplotlib": "train", "tqdm": "train",
          "scipy": "train", "tensorboard": "train", "gymnasium": "gym"}


def missing_extra(error: ImportError) -> str | None:
    """The extra whose package ``error`` says is missing (None: not one of ours)."""
    name = (getattr(error, "name", None) or "").split(".")[0]
    return EXTRAS.get(name) if isinstance(error, ModuleNotFoundError) else None


def _needs(command: str | None, extra: str) -> int:
    print(f"grpo-ctrl{' ' + command if command else ''}: needs the {extra} extra: "
          f"pip install 'grpo-ctrl[{extra}]'", file=sys.stderr)
    return 2


class _OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser(command: str | None) -> argparse.ArgumentParser:
    top = _OneLineParser(
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
    try:  # the command's module imports torch & co. here: seconds in which Ctrl-C is likely
        args = _parser(command).parse_args(argv)
        if args.command is None:
            _parser(None).print_help()
            return 2
        module = importlib.import_module(COMMANDS[args.command][0])
    except SystemExit as e:  # argparse: --help, or a bad argument (its line is printed)
        return e.code
    except KeyboardInterrupt:
        print(f"grpo-ctrl{' ' + command if command else ''}: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as e:  # the base install: no torch, onnx, matplotlib, ...
        if missing_extra(e) is None:
            raise
        return _needs(command, missing_extra(e))
    try:
        return int(module.run(args) or 0)
    except UserError as e:  # only these: any other exception is a bug and keeps its traceback
        print(f"grpo-ctrl {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"grpo-ctrl {args.command}: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as e:  # a lazily imported package of an extra
        if missing_extra(e) is None:
            raise
        return _needs(args.command, missing_extra(e))
    except BrokenPipeError:  # the reader went away (`grpo-ctrl inspect x.onnx | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141


if __name__ == "__main__":
    sys.exit(main())
