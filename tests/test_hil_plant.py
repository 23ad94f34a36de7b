"""A HIL that is not the preset: --param, --plant, --mystery, --reveal. The
served plant is checked against the C simulator holding the same plant, and
the encoder offset against the device's own state frames."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from grpo_ctrl.cli import main
from grpo_ctrl.errors import UserError
from grpo_ctrl.firmware_bridge import protocol as P
from grpo_ctrl.firmware_bridge.hil import HilConfig, serve_hil
from grpo_ctrl.firmware_bridge.link import Link, await_frame, handshake
from grpo_ctrl.plant import plant_spec
from grpo_ctrl.plant_file import PlantValues, mystery_plant, nominal_params, read_plant_file
from grpo_ctrl.sim import BatchSim

try:
    import tomllib  # novermin: 3.10 takes the except branch
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

SPEC = plant_spec("pendulum", "rig")


def _free_swing(plant: dict, angle0: float, n: int) -> np.ndarray:
    sim = BatchSim("pendulum", 1, preset="rig", hold_plant=True)
    sim.set_plant(plant)
    sim.set_state({"x": np.array([[angle0, 0.0]])})
    xs = []
    for _ in range(n):
        sim.step(np.zeros(1, np.float32))
        xs.append(sim.get_state()["x"][0].copy())
    return np.array(xs)


def test_served_plant_is_the_one_asked_for():
    values = PlantValues({**nominal_params(SPEC), "m": 0.2, "l": 0.22, "b": 0.004}, delay=1,
                         offset=0.04)
    angle0 = math.pi - 0.6
    with serve_hil(HilConfig(system="pendulum", preset="rig", angle0=angle0,
                             plant=values)) as hil:
        with Link(hil.port) as link:
            handshake(link)
            got = await_frame(link, lambda f, m: isinstance(m, P.State), 2.0)
        deadline = time.monotonic() + 10
        while len(hil.trace()["t"]) < 150 and time.monotonic() < deadline:
            time.sleep(0.05)
        trace = hil.trace()
    # unarmed, the actuator is 0: a free swing of the asked-for plant, step for step
    n = 120
    want = _free_swing({"m": 0.2, "l": 0.22, "b": 0.004}, angle0, n)
    preset = _free_swing({}, angle0, n)
    np.testing.assert_allclose(trace["x"][:n], want, atol=1e-9)
    assert np.max(np.abs(trace["x"][:n, 0] - preset[:, 0])) > 0.05  # not the preset
    # the encoder reads the true angle plus the offset (to one count of 2048 per turn)
    assert got is not None
    state = got[1]
    k = int(np.argmin(np.abs(trace["t"] - state.t_us * 1e-6)))
    assert state.pos[0] * 2 * math.pi / 2048 == pytest.approx(trace["x"][k, 0] + 0.04,
                                                             abs=2 * math.pi / 2048)


def test_mystery_is_hidden_reproducible_and_revealed(tmp_path, capsys):
    a, b, c = mystery_plant(SPEC, 3), mystery_plant(SPEC, 3), mystery_plant(SPEC, 4)
    assert a == b and a != c
    nominal = nominal_params(SPEC)
    for name, v in a.params.items():
        if name == "g":
            assert v == nominal["g"]
        else:
            assert 0.7 * nominal[name] <= v <= 1.3 * nominal[name]
    assert a.delay in (0, 1, 2) and abs(a.offset) <= 0.05 and 0.5 <= a.motor_k <= 1
    reveal = tmp_path / "truth.toml"
    assert main(["hil", "--system", "pendulum", "--preset", "rig", "--mystery", "3",
                 "--reveal", str(reveal), "--duration", "0.2"]) == 0
    out = capsys.readouterr().out
    for v in a.params.values():
        if v != nominal["g"]:
            assert f"{v:.3g}" not in out and repr(v) not in out
    data = tomllib.loads(reveal.read_text())
    assert set(data) == set(SPEC.param_names) | {"delay", "offset", "motor_k"}
    back = read_plant_file(reveal, SPEC)
    assert back.params == pytest.approx(a.params) and back.delay == a.delay
    assert back.offset == pytest.approx(a.offset) and back.motor_k == pytest.approx(a.motor_k)


def test_param_and_plant_flags(tmp_path, capsys):
    reveal = tmp_path / "p.toml"
    assert main(["hil", "--preset", "rig", "--param", "m=0.2", "--param", "delay=2",
                 "--param", "offset=0.01", "--reveal", str(reveal), "--duration", "0.1"]) == 0
    back = read_plant_file(reveal, SPEC)
    assert back.params["m"] == 0.2 and back.params["l"] == nominal_params(SPEC)["l"]
    assert back.delay == 2 and back.offset == 0.01
    again = tmp_path / "q.toml"
    assert main(["hil", "--preset", "rig", "--plant", str(reveal), "--param", "l=0.25",
                 "--reveal", str(again), "--duration", "0.1"]) == 0
    both = read_plant_file(again, SPEC)
    assert both.params["m"] == 0.2 and both.params["l"] == 0.25 and both.delay == 2
    capsys.readouterr()


@pytest.mark.parametrize("args,message", [
    (["--param", "mass=0.2"], "not a parameter"),
    (["--param", "m=-1"], ">= 0"),
    (["--param", "m"], "NAME=VALUE"),
    (["--param", "delay=1.5"], "whole control steps"),
    (["--param", "offset=nan"], "offset"),
    (["--param", "motor_k=0"], "motor_k"),
    (["--param", "motor_k=1.5"], "motor_k"),
    (["--plant", "/nonexistent/p.toml"], "does not exist"),
    (["--mystery", "1", "--param", "m=0.2"], "leave out"),
])
def test_bad_plant_flags_get_one_line(capsys, args, message):
    assert main(["hil", "--preset", "rig", "--duration", "0.1", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_train_plant_centres_the_randomisation_on_the_fit(tmp_path):
    """train --plant: every drawn plant lies within max(3 std, 10%) of the
    fit, the delay within a step of it plus the host loop's tick (the fit
    counts from the applied command, which a host's policy sets a tick after
    the measurement); the draws cover the range."""
    pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")
    import argparse

    from grpo_ctrl.train import add_arguments, resolve
    fitted = tmp_path / "fitted.toml"
    fitted.write_text("m = 0.2\nl = 0.25\nb = 0.003\nfc = 0.005\ndelay = 2\noffset = 0.03\n\n"
                      "[std]\nm = 0.01\nl = 0.0001\noffset = 0.001\n")
    p = argparse.ArgumentParser()
    add_arguments(p)
    *_, randomize = resolve(p.parse_args(["--preset", "rig", "--plant", str(fitted),
                                          "--out", str(tmp_path / "run")]))
    assert randomize.absolute["m"] == pytest.approx((0.17, 0.23))       # 3 std = 15%
    assert randomize.absolute["l"] == pytest.approx((0.225, 0.275))     # the 10% floor
    assert randomize.delay == (2, 4) and randomize.offset >= 0.033
    sim = BatchSim("pendulum", 4000, preset="rig", randomize=randomize, seed=1)
    sim.reset()
    drawn = sim.plant()
    assert 0.17 <= drawn["m"].min() < 0.175 and 0.225 < drawn["m"].max() <= 0.23
    assert set(np.unique(drawn["delay"])) == {2, 3, 4}
    assert np.all(drawn["g"] == 9.81)
    with pytest.raises(UserError, match="not a parameter"):
        bad = tmp_path / "bad.toml"
        bad.write_text("mass = 0.2\n")
        resolve(p.parse_args(["--preset", "rig", "--plant", str(bad)]))


@pytest.mark.parametrize("value", ["-1", "1.5", "nan"])
def test_mystery_seed_refused_by_the_parser(capsys, value):
    assert main(["hil", "--mystery", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_sensor_noise_is_gaussian_before_the_count():
    """--sensor-noise: the encoder reads the true angle plus N(0, std) noise,
    then counts; at rest the readings spread by about std (a count is
    3 mrad, the noise 10 mrad)."""
    with serve_hil(HilConfig(system="pendulum", preset="rig", angle0=math.pi,
                             sensor_noise=0.01)) as hil:
        with Link(hil.port) as link:
            handshake(link)
            readings = []
            deadline = time.monotonic() + 10
            while len(readings) < 300 and time.monotonic() < deadline:
                got = await_frame(link, lambda f, m: isinstance(m, P.State), 1.0)
                if got is not None:
                    readings.append(got[1].pos[0] * 2 * math.pi / 2048)
    error = np.remainder(np.array(readings), 2 * math.pi) - math.pi  # at rest hanging
    assert len(readings) >= 100
    assert abs(np.mean(error)) < 0.004 and 0.008 < np.std(error) < 0.012
