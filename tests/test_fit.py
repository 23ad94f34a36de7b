"""``grpo-ctrl train --fit uno|m4``: the network chosen so that the on-device
tick stays within 25 % of the preset's period on the board, by the counts
``grpo-ctrl bench boards`` gives (simavr's cycles for the Uno, the Cortex-M4
TRM model on QEMU's trace for the M4).

The chooser's counts are checked against an independent graph: the rig
policy's own exported ONNX (tests/data) with its weights replaced by random
3-H-H-1 ones (``boards.widened``), measured on the emulator directly."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")

from grpo_ctrl import fit
from grpo_ctrl.cli import main
from grpo_ctrl.errors import UserError
from grpo_ctrl.export.verify import operating_observations
from grpo_ctrl.firmware_bridge import boards

RIG = Path(__file__).parent / "data" / "pendulum-rig-grpo.onnx"
UNO, MPS2 = boards.BOARDS["uno"], boards.BOARDS["mps2-an386"]
UNO_BUDGET = 0.25 * 16e6 / 200  # 25 % of the rig's 5 ms at 16 MHz


def need(missing: str | None) -> None:
    if missing:
        pytest.skip(missing)


def test_candidates_go_from_the_most_multiply_adds_down():
    nets = fit.candidates(4, 2, 3)
    macs = [n.macs(3) for n in nets]
    assert macs == sorted(macs, reverse=True)
    assert nets[0] == fit.Network(2, 4, None) and nets[1] == fit.Network(2, 4, "q15")
    assert nets[-1] == fit.Network(1, 1, None) and macs[-1] == 3 + 1
    # q15 only on a hidden-to-hidden layer of an even width
    assert all(n.layers > 1 and n.hidden % 2 == 0 for n in nets if n.quantize)
    assert fit.Network(2, 64, None).macs(3) == 4352  # the rig policy's SizeReport


def test_uno_fit_is_the_widest_network_whose_simavr_tick_is_within_25_percent():
    """The rig at 200 Hz on the Uno: 3-12-1 with every layer in int16 (48 multiply-adds);
    in float 3-2-2-1 (12) is already over. The chooser times every unit active (software
    floating point is faster on a ReLU's zero); measured here on the independent graph
    with the same kind of weights, the float 3-2-2-1 is over 20,000 cycles, and every
    wider int16 network the chooser measured is over too."""
    need(boards.emulator_missing(UNO))
    choice = fit.choose("uno", "pendulum", "rig", 64, 2)
    assert choice.network == fit.Network(1, 12, "int16") and choice.measured
    assert choice.budget == UNO_BUDGET and choice.cycles <= UNO_BUDGET
    obs = operating_observations("pendulum", "rig", 8)
    model = boards.widened(onnx.load(RIG), 2)
    for t in model.graph.initializer:  # every unit active, as the chooser times it
        if t.name.startswith("net."):
            a = np.abs(numpy_helper.to_array(t)) + 0.1
            t.CopyFrom(numpy_helper.from_array(a.astype(np.float32), t.name))
    two_layers = boards.target_check(UNO, boards.controller_c(UNO, model), obs)["ondevice"]
    assert two_layers > UNO_BUDGET
    refused = {n: c for n, c, measured in choice.refused if measured}
    assert refused[fit.Network(1, 13, "int16")] > UNO_BUDGET
    assert all(c > UNO_BUDGET for c in refused.values())
    assert all(n.macs(3) > choice.network.macs(3) for n in refused)


def test_a_network_just_over_the_uno_budget_is_refused_in_one_line(capsys):
    need(boards.emulator_missing(UNO))
    with pytest.raises(UserError, match="no network fits 25 % of the 200 Hz period on the uno"):
        fit.choose("uno", "pendulum", "rig", 5, 2, exact=True)  # 3-5-5-1: 20,176 in int16
    # the command: one line, exit 2, before a run folder is made
    assert main(["train", "--fit", "uno", "--preset", "rig", "--hidden", "5", "--layers", "2",
                 "--out", "/nonexistent/never"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "20,000 cycles" in err


def test_m4_fit_keeps_the_rig_network_at_200_hz():
    """On the Cortex-M4F at 25 MHz 25 % of 5 ms is 31,250 cycles: the
    preset's 3-64-64-1 in float fits (about 18,100 by the TRM model)."""
    need(boards.emulator_missing(MPS2))
    choice = fit.choose("m4", "pendulum", "rig", 64, 2)
    assert choice.network == fit.Network(2, 64, None) and choice.measured
    assert choice.cycles <= choice.budget == 0.25 * 25e6 / 200 and not choice.refused


def test_fit_sets_the_training_arguments(capsys):
    """apply_fit writes the choice into train's arguments (Fourier features
    off) and prints one line naming the size and the firmware command."""
    need(boards.emulator_missing(UNO))
    import argparse

    p = argparse.ArgumentParser()
    fit.add_arguments(p)
    args = p.parse_args(["--fit", "uno", "--system", "pendulum", "--preset", "rig"])
    fit.apply_fit(args)
    assert (args.hidden, args.layers, args.features) == (12, 1, 0)
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and "hidden 12 x 1 layers" in out
    assert "grpo-ctrl firmware --board uno" in out


def test_fit_refuses_a_plant_the_boards_do_not_run():
    with pytest.raises(UserError, match="not the cartpole"):
        fit.choose("uno", "cartpole", "swingup", 8, 2)


def test_distill_puts_the_swing_up_lqr_into_a_small_network(tmp_path, capsys):
    """grpo-ctrl distill, DAgger on the simulator: the swing-up LQR baseline
    (energy pumping, LQR near upright; 100 % success on the rig) imitated by
    a 3-8-8-1 network for a few rounds; each round's fit lowers the imitation loss
    on the states gathered so far (the first, from an untrained student, by more than
    40 %), and the student, evaluated like a trained run on
    held-out starts, swings up. (The loss from round to round is on a growing set of
    the student's own, harder states, so it need not fall.)"""
    from grpo_ctrl import distill
    from grpo_ctrl.controller import load_controller

    teacher = load_controller("swingup-lqr", "pendulum", "rig")
    cfg = distill.DistillConfig(hidden=8, layers=2, rounds=3, envs=64, steps=500, batch=2048)
    student, history = distill.distill(teacher, cfg, log=lambda *_: None)
    assert [h[0] for h in history] == [1.0, 0.5, 0.25]  # the teacher's share, halving
    assert [h[1] for h in history] == [32000, 64000, 96000]  # every 4th of 2000 steps x 64
    # (teacher's share, states, loss before the round's fit, after it)
    assert history[0][3] < 0.6 * history[0][2], history
    assert all(after < before for *_, before, after in history), history
    run = tmp_path / "student"
    distill.save_run(student, teacher.spec, cfg, "swingup-lqr", run)
    assert main(["eval", str(run), "--episodes", "50"]) == 0
    out = capsys.readouterr().out
    success = float(re.search(r"success\s+([0-9.]+) %", out).group(1))
    assert success >= 90.0, out


def test_distill_needs_a_size(tmp_path, capsys):
    assert main(["distill", "swingup-lqr", "--system", "pendulum", "--preset", "rig",
                 "--out", str(tmp_path / "s")]) == 2
    assert "--hidden H --layers L" in capsys.readouterr().err
