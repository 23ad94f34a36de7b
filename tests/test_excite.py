"""grpo-ctrl excite on a mystery HIL pendulum, then grpo-ctrl sysid on its
log: the bring-up rehearsal, checked against --reveal's truth."""
from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("scipy", reason="sysid filters with scipy.signal")

from grpo_ctrl.cli import main  # noqa: E402
from grpo_ctrl.firmware_bridge import protocol as P  # noqa: E402
from grpo_ctrl.firmware_bridge.excite import (ARM_GUARD, AMPLITUDES, ARM_SWEEP_HZ,  # noqa: E402
                                              arm_sweep, multisine)
from grpo_ctrl.firmware_bridge.hil import HilConfig, serve_hil  # noqa: E402
from grpo_ctrl.plant import plant_spec  # noqa: E402
from grpo_ctrl.plant_file import mystery_plant, read_plant_file  # noqa: E402
from grpo_ctrl.sim import BatchSim  # noqa: E402

SPEC = plant_spec("pendulum", "rig")
FURUTA = plant_spec("furuta", "qube-servo2")


def test_multisine_shape():
    u = multisine(20.0, 0.005, 0)
    t = np.arange(len(u)) * 0.005
    assert np.max(np.abs(u)) <= AMPLITUDES[1] + 1e-12
    assert np.max(np.abs(u[t < 10])) <= AMPLITUDES[0] + 1e-12
    assert u[0] == 0 and abs(u[-1]) < 1e-2   # faded in and out
    spectrum = np.abs(np.fft.rfft(u))
    f = np.fft.rfftfreq(len(u), 0.005)
    assert np.sum(spectrum[f > 6] ** 2) < 0.01 * np.sum(spectrum ** 2)  # band-limited


def test_arm_sweep_is_a_faded_sine_and_its_rate():
    ref, rate = arm_sweep(20.0, 0.002, 0.4)
    t = np.arange(len(ref)) * 0.002
    assert np.max(np.abs(ref)) == pytest.approx(0.4, rel=1e-3)
    assert ref[0] == 0 and abs(ref[-1]) < 1e-9 and abs(rate[-1]) < 1e-9  # starts, ends at 0
    middle = (t > 2) & (t < 18)
    np.testing.assert_allclose(ref[middle], 0.4 * np.sin(2 * np.pi * ARM_SWEEP_HZ * t[middle]))
    # the rate is the reference's derivative, fades included: integrated, it gives the reference
    integral = np.concatenate([[0.0], np.cumsum(0.5 * (rate[1:] + rate[:-1]) * 0.002)])
    np.testing.assert_allclose(integral, ref, atol=1e-3)  # half a step of each fade's kink


@pytest.mark.parametrize("seed", [2])
def test_excite_then_sysid_recovers_a_mystery_pendulum(tmp_path, capsys, seed):
    truth = mystery_plant(SPEC, seed)
    log = tmp_path / "excite.csv"
    # a generous watchdog: host and HIL share this (busy) machine and process
    with serve_hil(HilConfig(system="pendulum", preset="rig", plant=truth, angle0=math.pi,
                             watchdog_ms=300)) as hil:
        rc = main(["excite", "--port", hil.port, "--preset", "rig", "--duration", "12",
                   "--log", str(log), "--max-swing", "0.8"])
        trace, stats = hil.trace(), hil.stats()
    assert rc == 0, capsys.readouterr()
    assert stats["mode"] != P.MODE_ARMED                  # ended disarmed
    swing = np.abs(np.remainder(trace["x"][:, 0], 2 * np.pi) - np.pi)
    assert swing.max() < 0.8 + 0.3                        # the guard brakes beyond 0.8 rad
    assert np.max(np.abs(trace["u"])) <= AMPLITUDES[1] * SPEC.u_max + 1e-6
    out = tmp_path / "fitted.toml"
    assert main(["sysid", str(log), "--preset", "rig", "--out", str(out)]) == 0
    fit = read_plant_file(out, SPEC)
    for name in ("m", "l", "b", "fc"):
        assert fit.params[name] == pytest.approx(truth.params[name], rel=0.05), name
    assert fit.delay == truth.delay
    assert fit.offset == pytest.approx(truth.offset, abs=0.005)


def test_excite_then_sysid_recovers_a_mystery_furuta(tmp_path, capsys):
    """A mystery Qube (its motor lagging, encoder noise on): the arm stays
    well inside the device's 2 rad limit, the served plant is the simulator
    holding the same plant step for step (delay and motor lag included), and
    sysid, given the weighed mp and the measured rm, finds the rest."""
    truth = mystery_plant(FURUTA, 2)
    log = tmp_path / "excite.csv"
    with serve_hil(HilConfig(system="furuta", plant=truth, angle0=math.pi, watchdog_ms=300,
                             sensor_noise=0.0005)) as hil:
        rc = main(["excite", "--port", hil.port, "--system", "furuta", "--duration", "12",
                   "--log", str(log)])
        trace, stats = hil.trace(), hil.stats()
    assert rc == 0, capsys.readouterr()
    assert stats["mode"] != P.MODE_ARMED and stats["fault"] == 0    # ended disarmed, no trip
    armed = trace["mode"] == P.MODE_ARMED   # (disarmed, the arm is free, as after any run)
    assert armed.sum() > 5000
    assert np.max(np.abs(trace["x"][armed, 0])) < ARM_GUARD * 2.0  # the arm limit is 2 rad
    swing = np.abs(np.remainder(trace["x"][armed, 1], 2 * np.pi) - np.pi)
    assert swing.max() < 1.0 + 0.4
    # the served plant: replay the applied voltages on the simulator's held plant
    sim = BatchSim("furuta", 1, preset="qube-servo2", hold_plant=True)
    sim.set_plant({**truth.params, "delay": truth.delay, "motor_k": truth.motor_k})
    sim.set_state({"x": FURUTA.rest_state(math.pi)[None]})
    applied = np.concatenate([[0.0], trace["u"][:-1]]).astype(np.float32)[:, None]
    sim.rollout(applied[:2000])
    np.testing.assert_allclose(sim.get_state()["x"][0], trace["x"][1999], atol=1e-6)
    out = tmp_path / "fitted.toml"
    assert main(["sysid", str(log), "--system", "furuta", "--out", str(out),
                 "--known", f"mp={truth.params['mp']}", "--known", f"rm={truth.params['rm']}"]) == 0
    fit = read_plant_file(out, FURUTA)
    for name in ("km", "lr", "jr", "lp", "jp"):
        assert fit.params[name] == pytest.approx(truth.params[name], rel=0.05), name
    assert fit.delay == truth.delay and fit.motor_k == pytest.approx(truth.motor_k, abs=0.05)
    assert fit.offset == pytest.approx(truth.offset, abs=0.005)


def test_excite_refuses_another_plant_before_arming(tmp_path, capsys):
    with serve_hil(HilConfig(system="pendulum", preset="gym")) as hil:
        rc = main(["excite", "--port", hil.port, "--preset", "rig", "--duration", "5",
                   "--log", str(tmp_path / "x.csv")])
        arms = hil.stats()["arms"]
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "not pendulum/rig" in err and len(err.splitlines()) == 1
    assert arms == 0


@pytest.mark.parametrize("flag,value", [("--duration", "2"), ("--duration", "nan"),
                                        ("--max-swing", "-1"), ("--max-swing", "inf"),
                                        ("--seed", "-3")])
def test_excite_options_refused_before_work(tmp_path, capsys, flag, value):
    assert main(["excite", "--port", "/nonexistent", "--log", str(tmp_path / "x.csv"),
                 flag, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
