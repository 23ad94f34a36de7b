"""Every option of every command, given NaN, inf, a negative number, zero, a
huge number or text of the wrong type, ends in one line on stderr and exit
status 2, before any work starts and with nothing written.

The commands and their options are read from the argparse parsers, so a new
command or option is covered as soon as it exists. Values an option rightly
takes (zero meaning "no limit", any text naming a file) are listed in
``ACCEPTED`` with the reason, and not run.
"""
import argparse
import importlib.util
import signal

import pytest

from grpo_ctrl import cli

BAD_VALUES = {"nan": "nan", "inf": "inf", "negative": "-1", "zero": "0",
              "huge": "1" + "0" * 30, "wrong type": "x1"}

ANY = set(BAD_VALUES)
# (command, option) -> (the kinds of BAD_VALUES it rightly takes, why)
ACCEPTED = {
    ("train", "--out"): (ANY, "any text names a run folder"),
    ("demo", "--out"): (ANY, "any text names an output folder"),
    ("demo", "--budget"): ({"zero"}, "0: no time limit (--iterations stops it)"),
    ("baselines", "--output"): (ANY, "any text names a file"),
    ("export", "--onnx"): (ANY, "any text names a file"),
    ("export", "--c"): (ANY, "any text names a folder"),
    ("export", "--c-name"): ({"nan", "inf", "wrong type"}, "these are C identifiers"),
    ("run", "--log"): (ANY, "any text names a file"),
    ("run", "--plot"): (ANY, "any text names a file"),
    ("hil", "--duration"): ({"zero"}, "0 serves until Ctrl-C"),
    ("hil", "--angle0"): ({"zero", "negative"}, "an angle from upright, either side"),
    ("hil", "--velocity-limit"): ({"zero"}, "0: no limit"),
    ("hil", "--position-limit"): ({"zero"}, "0: no limit"),
    ("hil", "--velocity-cutoff"): ({"zero"}, "0: raw differences"),
    ("hil", "--disconnect-after"): ({"zero"}, "0: never"),
    ("hil", "--sensor-noise"): ({"zero"}, "0: quantisation only"),
    ("train", "--time-budget"): ({"zero"}, "0: no limit"),
    ("train", "--iterations"): ({"zero"}, "0: no limit"),
    ("train", "--eval-every"): ({"zero"}, "0: every iteration"),
    ("train", "--beta"): ({"zero"}, "0: no KL penalty"),
    ("train", "--lr-end"): ({"zero"}, "a fraction of lr, 0 allowed"),
    ("train", "--max-grad-norm"): ({"zero"}, "0: no clipping"),
    ("train", "--log-std-init"): ({"zero", "negative"}, "a log std"),
    ("train", "--log-std-min"): ({"zero", "negative"}, "a log std"),
    ("train", "--overlap"): ({"zero"}, "0 is false"),
    ("train", "--costs-from"): ({"zero"}, "0: the costs of effort from the start"),
    ("train", "--costs-early"): ({"zero"}, "0: no costs of effort before costs_from"),
    ("train", "--w-du"): ({"zero"}, "0: no action-rate penalty"),
    ("train", "--w-smooth"): ({"zero"}, "0: no smoothness term"),
    ("train", "--saturated"): ({"zero"}, "0: every loss step keeps its advantage"),
    ("train", "--c-rollout"): ({"zero"}, "0 is false: the rollout in torch"),
    ("train", "--c-update"): ({"zero"}, "0 is false: the gradient by torch autograd"),
    ("train", "--features"): ({"zero"}, "0: no Fourier features, the observation alone"),
    ("train", "--catch"): ({"zero"}, "0: no LQR catch"),
    ("eval", "--out"): (ANY, "any text names a folder"),
    ("hil", "--reveal"): (ANY, "any text names a file"),
    ("hil", "--mystery"): ({"zero"}, "seed 0"),
    ("excite", "--log"): (ANY, "any text names a file"),
    ("excite", "--plot"): (ANY, "any text names a file"),
    ("excite", "--seed"): ({"zero"}, "seed 0"),
    ("sysid", "--out"): (ANY, "any text names a file"),
    ("sysid", "--plot"): (ANY, "any text names a file"),
    ("sysid", "--max-delay"): ({"zero"}, "a plant without delay"),
    ("firmware", "--out"): (ANY, "any text names a project folder"),
    ("train", "--tensorboard"): (ANY, "any text names a folder"),
    ("eval", "--video-episodes"): ({"zero"}, "episode 0 is the first"),
    ("firmware", "--start-angle"): ({"zero", "negative"}, "an angle from upright"),
    ("distill", "--out"): (ANY, "any text names a run folder"),
    ("trajopt", "--out"): (ANY, "any text names a run folder"),
    ("trajopt", "--seed"): ({"zero"}, "seed 0"),
    ("distill", "--seed"): ({"zero"}, "seed 0"),
}
for _command in ("train", "demo", "eval", "baselines", "hil"):
    ACCEPTED[(_command, "--seed")] = ({"zero"}, "seed 0")
for _option in ("--corrupt", "--drop", "--latency-ms", "--spike-rate", "--spike-ms"):
    ACCEPTED[("hil", _option)] = ({"zero"}, "0: no fault of that kind")
for _option in ("--reset-prob",):
    ACCEPTED[("train", _option)] = ({"zero"}, "a probability, 0 allowed")


def _missing_extra(command: str) -> str | None:
    """The extra a command's parser needs and this install lacks (None: it builds)."""
    try:
        cli._parser(command)
    except ModuleNotFoundError as e:
        if cli.missing_extra(e) is None:
            raise
        return cli.missing_extra(e)
    return None


# the base install (no train extra): these commands' parsers do not build, and the
# policy file the others' arguments name is exported with torch
UNAVAILABLE = {c: extra for c in cli.COMMANDS if (extra := _missing_extra(c))}
HAVE_TORCH = importlib.util.find_spec("torch") is not None
NEEDS_POLICY = {"verify", "inspect", "run"}


def _arguments(command: str) -> list[argparse.Action]:
    top = cli._parser(command)
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices[command]._actions
            if not isinstance(a, argparse._HelpAction) and a.nargs not in (0, argparse.REMAINDER)]


def _name(action: argparse.Action) -> str:
    return max(action.option_strings, key=len) if action.option_strings else action.dest


CASES = [(command, _name(action), kind) for command in cli.COMMANDS if command not in UNAVAILABLE
         for action in _arguments(command) for kind in BAD_VALUES
         if kind not in ACCEPTED.get((command, _name(action)), (set(), ""))[0]]
_TRAIN = "needs the train extra: pip install -e '.[train]'"
PARAMS = ([pytest.param(*case, marks=pytest.mark.skip(reason=f"its policy file {_TRAIN}"))
           if case[0] in NEEDS_POLICY and not HAVE_TORCH else case for case in CASES]
          + [pytest.param(command, "-", "-", marks=pytest.mark.skip(
              reason=f"grpo-ctrl {command} needs the {extra} extra: pip install -e '.[{extra}]'"))
             for command, extra in UNAVAILABLE.items()])


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory):
    """Files the commands' other arguments need, outside the folder they run in."""
    folder = tmp_path_factory.mktemp("elsewhere")
    if HAVE_TORCH:  # (without it, the cases that name p.onnx skip)
        from grpo_ctrl.controller import load_controller
        from grpo_ctrl.export.onnx_export import export_onnx
        export_onnx(load_controller("lqr", "pendulum", "gym"), folder / "p.onnx", source="lqr")
    from grpo_ctrl.firmware_bridge.telemetry import COLUMNS
    row = {"kind": "state", "dev_seq": "1", "dev_t_us": "0", "actuator": "0.0", "obs": "1 0 0"}
    (folder / "t.csv").write_text(",".join(COLUMNS) + "\n"
                                  + ",".join(row.get(c, "") for c in COLUMNS) + "\n")
    return folder


def _base(command: str, folder) -> tuple[dict, list[str]]:
    """Positionals and options that let a command reach the check of the
    option under test (a valid policy file, a baseline controller, outputs
    outside the working folder, a short duration)."""
    onnx = str(folder / "p.onnx")
    return {
        "eval": ({}, ["--controller", "lqr", "--system", "pendulum"]),
        "export": ({}, ["--controller", "lqr", "--system", "pendulum",
                        "--onnx", str(folder / "out.onnx")]),
        "verify": ({"onnx": onnx}, ["--controller", "lqr"]),
        "inspect": ({"onnx": onnx}, []),
        "baselines": ({}, ["--output", str(folder / "b.md")]),
        "hil": ({}, ["--duration", "0.01"]),
        "run": ({}, ["--port", str(folder / "no-such-port"), "--policy", onnx,
                     "--log", str(folder / "t.csv"), "--duration", "0.01"]),
        "bench": ({"name": "sim"}, []),
        "excite": ({}, ["--port", str(folder / "no-such-port"), "--log", str(folder / "e.csv"),
                        "--duration", "5"]),
        "sysid": ({"logs": str(folder / "no-such-log.csv")}, ["--out", str(folder / "f.toml")]),
        "firmware": ({}, ["--board", "uno", "--out", str(folder / "firmware")]),
        "distill": ({"teacher": "swingup-lqr"}, ["--system", "pendulum", "--preset", "rig",
                                                 "--hidden", "2", "--layers", "1",
                                                 "--out", str(folder / "distilled")]),
        "replay": ({"telemetry": str(folder / "t.csv")}, ["--video", str(folder / "r.gif")]),
        "trajopt": ({"run": str(folder / "no-such-run")}, ["--out", str(folder / "t")]),
    }.get(command, ({}, []))


# a positional names a controller in place of these
CONFLICTS = {"run": {"--controller", "--system", "--preset"}}


def _argv(command: str, option: str, value: str, folder) -> list[str]:
    positionals, options = _base(command, folder)
    drop = {option} | CONFLICTS.get(option, set())
    rest, i = [], 0
    while i < len(options):
        if options[i] in drop:
            i += 2
            continue
        rest += options[i:i + 2]
        i += 2
    argv = [command]
    for action in _arguments(command):
        if action.option_strings:
            continue
        if action.dest == option:
            argv.append(value)
        elif action.dest in positionals:
            argv.append(positionals[action.dest])
    if option.startswith("-"):
        rest += [option, value]
    return argv + rest


class _TooLong(Exception):
    pass


def _alarm(signum, frame):
    raise _TooLong("the command started working instead of refusing the value")


@pytest.mark.parametrize("command, option, kind", PARAMS)
def test_a_bad_value_is_refused_in_one_line_before_any_work(command, option, kind, elsewhere,
                                                            tmp_path, monkeypatch, capsys):
    value = BAD_VALUES[kind]
    monkeypatch.chdir(tmp_path)
    argv = _argv(command, option, value, elsewhere)
    before = sorted(p.name for p in elsewhere.iterdir())
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(30)
    try:
        rc = cli.main(argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, err = capsys.readouterr()
    assert rc == 2, (argv, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    assert out == "", (argv, out)  # nothing started
    assert list(tmp_path.iterdir()) == [], argv
    assert sorted(p.name for p in elsewhere.iterdir()) == before, argv
    if not HAVE_TORCH and f"grpo-ctrl {command}: needs the train extra" in err:
        pytest.skip(f"grpo-ctrl {command} checks {option} once the train extra is loaded: "
                    "pip install -e '.[train]'")
    assert option in err or repr(value) in err, (argv, err)  # it names what was wrong


def test_every_command_is_covered_and_every_exception_is_an_option():
    assert {command for command, _, _ in CASES} == set(cli.COMMANDS) - set(UNAVAILABLE)
    for command, option in ACCEPTED:
        if command not in UNAVAILABLE:
            assert option in {_name(a) for a in _arguments(command)}, (command, option)
    if UNAVAILABLE:
        extras = ",".join(sorted(set(UNAVAILABLE.values())))
        pytest.skip(f"the options of {', '.join(UNAVAILABLE)} are unchecked: they need the "
                    f"{extras} extra: pip install -e '.[{extras}]'")
