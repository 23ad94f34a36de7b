"""Classic baselines: linearisation, Riccati, LQR and swing-up, checked against
independent references (hand-derived Jacobians, scipy, Quanser's published
Qube-Servo 2 model, Gymnasium's own Pendulum-v1) and by closed-loop runs."""
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install -e '.[train]'")

import scipy.linalg
import torch

from grpo_ctrl.baselines import available, make_controller
from grpo_ctrl.closed_loop import (evaluate, evaluate_on_gymnasium_pendulum,
                                   near_upright_start)
from grpo_ctrl.baselines.linearize import discrete_by_simulation, linearize
from grpo_ctrl.baselines.lqr import design, dlqr, solve_dare
from grpo_ctrl.baselines.swingup import make_swingup_lqr
from grpo_ctrl.cli import main
from grpo_ctrl.errors import UserError
from grpo_ctrl.sim import BatchSim, presets, systems

torch.set_num_threads(1)

ALL_PRESETS = [(s, p) for s in systems() for p in presets(s)]
# every baseline of every preset
ALL_BASELINES = [(name, s, p) for s, p in ALL_PRESETS for name in available(s)]
# the double pendulum's LQR holds a smaller region than 10 degrees (tests/test_double_pendulum.py)
BALANCE_PRESETS = [(s, p) for s, p in ALL_PRESETS if s != "double_pendulum"]


# ---------------------------------------------------------------- linearisation
@pytest.mark.parametrize("preset", ["gym", "rig"])
def test_finite_difference_jacobian_matches_the_analytic_one_for_the_pendulum(preset):
    sim = BatchSim("pendulum", 1, preset)
    p = dict(zip(sim.spec.param_names, sim.get_state()["param"][0]))
    g, m, l, b, fc = (p[k] for k in ("g", "m", "l", "b", "fc"))
    # a uniform rod unless the plant says otherwise: centre of mass at l/2, inertia m l^2/3
    lc, inertia = p.get("com", 0.5) * l, p.get("inertia", 1.0 / 3.0) * m * l * l
    vc = sim.model.coulomb_vc
    x0, u0 = np.array([0.7, 0.004]), 0.03  # off equilibrium, inside the Coulomb layer
    A, B = linearize(sim, x0, u0)
    sech2 = 1.0 / np.cosh(x0[1] / vc) ** 2
    A_exact = np.array([[0.0, 1.0],
                        [m * g * lc / inertia * np.cos(x0[0]), -(b + fc / vc * sech2) / inertia]])
    B_exact = np.array([[0.0], [1.0 / inertia]])
    np.testing.assert_allclose(A, A_exact, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(B, B_exact, rtol=1e-8)


def zoh(A: np.ndarray, B: np.ndarray, dt: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact zero-order-hold discretisation: ``expm([[A, B], [0, 0]] dt)``
    holds ``Ad`` and ``Bd`` in its top block row."""
    nx, nu = B.shape
    M = np.zeros((nx + nu, nx + nu))
    M[:nx, :nx], M[:nx, nx:] = A, B
    E = scipy.linalg.expm(M * dt)
    return E[:nx, :nx], E[:nx, nx:]


@pytest.mark.parametrize("system,preset", [("pendulum", "rig"), ("cartpole", "swingup"),
                                           ("furuta", "qube-servo2")])
def test_simulated_step_and_zero_order_hold_agree_for_rk4_presets(system, preset):
    sim = BatchSim(system, 1, preset)
    Ad, Bd = discrete_by_simulation(sim)
    Az, Bz = zoh(*linearize(sim), sim.spec.dt)
    # RK4 differs from the exact flow by O(dt^5); the rig's stiff Coulomb slope
    # (fc / v_c at rest) makes its error the largest
    np.testing.assert_allclose(Ad, Az, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(Bd, Bz, rtol=1e-3, atol=1e-6)


def test_simulated_step_is_the_gym_integrators_by_hand():
    # Pendulum-v1: semi-implicit Euler, thd' = thd + (a th + c u) dt, th' = th + thd' dt
    sim = BatchSim("pendulum", 1, "gym")
    dt, a, c = 0.05, 15.0, 3.0
    Ad, Bd = discrete_by_simulation(sim)
    np.testing.assert_allclose(Ad, [[1 + a * dt * dt, dt], [a * dt, 1]], rtol=1e-6)
    np.testing.assert_allclose(Bd, [[c * dt * dt], [c * dt]], rtol=1e-6)
    # CartPole-v1: explicit Euler, so Ad = I + A dt and Bd = B dt exactly
    sim = BatchSim("cartpole", 1, "gym")
    A, B = linearize(sim)
    Ad, Bd = discrete_by_simulation(sim)
    np.testing.assert_allclose(Ad, np.eye(4) + A * 0.02, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(Bd, B * 0.02, rtol=1e-6)


def test_furuta_linearisation_matches_quansers_published_model():
    # Quanser's Qube-Servo 2 rotary pendulum state-space model about upright, state
    # (theta, alpha, theta_dot, alpha_dot), voltage input, as quoted in public drivers
    A, B = linearize(BatchSim("furuta", 1, "qube-servo2"))
    for (row, col), published in {(2, 1): 149.28, (3, 1): 261.61}.items():
        assert abs(A[row, col]) == pytest.approx(published, rel=0.02)
    assert abs(B[2, 0]) == pytest.approx(49.73, rel=0.02)
    assert abs(B[3, 0]) == pytest.approx(49.15, rel=0.02)
    # the sign conventions agree up to a common flip of each coordinate
    assert np.sign(A[2, 1]) == np.sign(A[3, 1]) and np.sign(B[2, 0]) == np.sign(B[3, 0])


# ---------------------------------------------------------------- Riccati and LQR
@pytest.mark.parametrize("system,preset", ALL_PRESETS)
def test_riccati_solution_and_gain_match_scipy(system, preset):
    d = design(system, preset)
    P = scipy.linalg.solve_discrete_are(d.A, d.B, d.Q, d.R)
    np.testing.assert_allclose(d.P, P, rtol=1e-8, atol=1e-10 * np.abs(P).max())
    K = np.linalg.solve(d.R + d.B.T @ P @ d.B, d.B.T @ P @ d.A)
    np.testing.assert_allclose(d.K, K, rtol=1e-7)
    assert np.all(np.abs(d.poles) < 1.0)
    np.testing.assert_allclose(np.sort_complex(d.poles),
                               np.sort_complex(np.linalg.eigvals(d.A - d.B @ K)), atol=1e-8)


def test_riccati_on_random_systems_matches_scipy():
    rng = np.random.default_rng(1)
    for n, m in [(2, 1), (4, 1), (5, 2)]:
        A, B = rng.normal(size=(n, n)), rng.normal(size=(n, m))
        Qh = rng.normal(size=(n, n))
        Q, R = Qh @ Qh.T + 0.1 * np.eye(n), np.eye(m) * 0.5
        np.testing.assert_allclose(solve_dare(A, B, Q, R),
                                   scipy.linalg.solve_discrete_are(A, B, Q, R), rtol=1e-8)
        assert np.all(np.abs(dlqr(A, B, Q, R).poles) < 1.0)


def test_riccati_reports_an_unstabilisable_system():
    A, B = np.diag([2.0, 0.5]), np.array([[0.0], [1.0]])  # the unstable mode has no input
    with pytest.raises(ValueError, match="stabilisable"):
        solve_dare(A, B, np.eye(2), np.eye(1))


def test_the_lqr_is_the_same_bits_whichever_kernels_numpys_blas_picks():
    """The acrobot's design (its catch acts in every training step) computed where
    numpy's OpenBLAS runs each x86-64 kernel set this CPU allows (OPENBLAS_CORETYPE):
    the same bits. Its Riccati iteration through numpy's BLAS differed by 3e-11 of P
    between the Haswell and Sandybridge kernels."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("OPENBLAS_CORETYPE's kernel names here are x86-64's")
    with open("/proc/cpuinfo") as f:
        flags = set(next((line.split(":")[1].split() for line in f
                          if line.startswith("flags")), []))
    cores = ["Prescott"] + ["Sandybridge"] * ("avx" in flags) + ["Haswell"] * ("avx2" in flags)
    code = ("from grpo_ctrl.baselines.lqr import design; d = design('double_pendulum', "
            "'acrobot'); print(d.K.tobytes().hex() + d.P.tobytes().hex())")
    bits = set()
    for core in cores:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "OPENBLAS_CORETYPE": core}, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        bits.add(done.stdout.split()[-1])
    assert len(bits) == 1, cores


@pytest.mark.parametrize("system,preset", BALANCE_PRESETS)
def test_lqr_balances_from_10_degrees_off_upright(system, preset):
    ep = evaluate(make_controller("lqr", system, preset), 200, seed=3,
                  **near_upright_start(system, np.radians(10.0)))
    assert ep.success.all()


# ---------------------------------------------------------------- swing-up
def test_swingup_on_gymnasiums_own_pendulum_scores_about_minus_150():
    # an independent implementation of the same idea scores about -152
    ep = evaluate_on_gymnasium_pendulum(make_controller("swingup-lqr", "pendulum", "gym"), 1000)
    assert ep.returns.mean() > -150.0
    assert ep.success.all()


@pytest.mark.parametrize("system,preset", [("pendulum", "rig"), ("cartpole", "swingup"),
                                           ("furuta", "qube-servo2")])
def test_swingup_brings_every_episode_up_from_hanging(system, preset):
    sim = BatchSim(system, 1, preset)
    hanging = np.abs(np.array([sim.model.x0_low[k] for k in range(sim.spec.nx)]))
    assert hanging.max() > 3.0  # the preset really starts near hanging
    ep = evaluate(make_controller("swingup-lqr", system, preset), 100, seed=11)
    assert ep.success.all()


@pytest.mark.parametrize("system,preset", [("pendulum", "gym"), ("pendulum", "rig"),
                                           ("cartpole", "swingup"), ("furuta", "qube-servo2")])
def test_swingup_leaves_exact_rest_at_the_bottom(system, preset):
    # hanging perfectly still (an encoder-differenced speed is exactly zero) is an
    # equilibrium of every energy law whose push is proportional to a velocity
    rest = {"pendulum": [np.pi, 0.0], "cartpole": [0.0, 0.0, np.pi, 0.0],
            "furuta": [0.0, np.pi, 0.0, 0.0]}[system]
    ep = evaluate(make_controller("swingup-lqr", system, preset), 1, x0_low=rest, x0_high=rest)
    assert ep.success.all()


@pytest.mark.parametrize("start", ["hanging", "near upright"])
def test_rig_swingup_survives_latency_and_sensor_noise(start):
    # the serial bridge sees the 2048-count encoder (in the preset), a few
    # control periods of latency and a velocity estimated from encoder counts
    box = near_upright_start("pendulum") if start == "near upright" else {}
    ep = evaluate(make_controller("swingup-lqr", "pendulum", "rig"), 100, seed=5,
                  delay=2, noise_std=[0.0, 0.3], **box)
    assert ep.success.all()


@pytest.mark.parametrize("system,preset", [("cartpole", "swingup"), ("furuta", "qube-servo2")])
def test_swingup_model_matches_the_simulator(system, preset):
    # the controller's copy of the equations (actuated acceleration affine in the
    # generalised force) must be the simulator's
    c = make_swingup_lqr(system, preset)
    sim = BatchSim(system, 1, preset)
    rng = np.random.default_rng(2)
    X = rng.normal(size=(16, 4)) * [0.5, 2.0, 3.0, 5.0]
    U = rng.normal(size=16) * 3.0
    angle = torch.tensor(X[:, 2 if system == "cartpole" else 1:][:, :1], dtype=torch.float64)
    f, g = c.accel_affine(torch.tensor(X, dtype=torch.float64), torch.cos(angle), torch.sin(angle))
    q_dd = 1 if system == "cartpole" else 2
    for i in range(16):
        if system == "furuta":
            p = dict(zip(sim.spec.param_names, sim.get_state()["param"][0]))
            tau = p["km"] * (U[i] - p["km"] * X[i, 2]) / p["rm"]
        else:
            tau = U[i]
        want = sim.dynamics(X[i], U[i])[q_dd]
        assert float(f[i, 0] + g[i, 0] * tau) == pytest.approx(want, rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------- the controller contract
@pytest.mark.parametrize("name,system,preset", ALL_BASELINES)
def test_controllers_keep_the_contract(name, system, preset):
    c = make_controller(name, system, preset)
    assert (c.spec.system, c.spec.preset) == (system, preset)
    rng = np.random.default_rng(4)
    sim = BatchSim(system, 256, preset, seed=1)
    obs = sim.reset().copy()
    obs[:8] *= 1e3  # far outside anything seen: still finite and clipped
    u = c(torch.as_tensor(obs))
    assert u.dtype == torch.float32 and u.shape == (256, 1)
    assert torch.isfinite(u).all() and (u.abs() <= c.spec.u_max).all()
    x = torch.tensor(rng.normal(size=(256, c.spec.nobs)), dtype=torch.float32)
    assert torch.equal(c(x), c(x))  # stateless
    assert torch.equal(c(x[:3]), c(x)[:3])  # each row on its own


@pytest.mark.parametrize("name,system,preset", ALL_BASELINES)
def test_controllers_export_bit_exactly_to_onnx_and_c(name, system, preset):
    # gains up to 86 N/rad turn one unit in the last place of an angle into
    # more than the export's 1e-5 tolerance; the controllers are built from
    # baselines.portable's ops, which torch, onnxruntime and C round alike
    import onnxruntime

    from grpo_ctrl.export.c_build import check_c, host_cc
    from grpo_ctrl.export.c_codegen import generate_c
    from grpo_ctrl.export.onnx_export import to_onnx
    from grpo_ctrl.export.verify import operating_observations

    c = make_controller(name, system, preset)
    model = to_onnx(c)
    obs = operating_observations(system, preset)
    got = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"obs": obs})[0]
    np.testing.assert_array_equal(got, c(torch.as_tensor(obs)).numpy())
    if host_cc() is not None:
        assert check_c(generate_c(model), model, obs) == 0.0


def test_make_controller_names_bad_input():
    with pytest.raises(UserError, match="unknown baseline"):
        make_controller("pid", "pendulum")
    with pytest.raises(UserError, match="unknown preset"):
        make_controller("lqr", "pendulum", "moon")
    with pytest.raises(UserError, match="unknown system"):
        make_controller("lqr", "double-pendulum")


# ---------------------------------------------------------------- the command
def test_baselines_command_writes_the_table(tmp_path, capsys):
    out = tmp_path / "baselines.md"
    assert main(["baselines", "--episodes", "3", "--output", str(out), "--no-gymnasium"]) == 0
    text = out.read_text()
    assert text in capsys.readouterr().out
    for system, preset in ALL_PRESETS:
        for name in available(system):
            assert f"| {system} | {preset} | `{name}` | preset | C (batched) | 3 |" in text
    assert list(tmp_path.iterdir()) == [out]  # no temporary file left behind


def test_baselines_command_rejects_bad_arguments(tmp_path, capsys):
    assert main(["baselines", "--episodes", "0", "--output", str(tmp_path / "b.md")]) == 2
    assert "--episodes" in capsys.readouterr().err
    assert main(["baselines", "--output", str(tmp_path / "missing" / "b.md")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "b.md").exists()
