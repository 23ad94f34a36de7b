"""Physics of the plants against analytic invariants: energy conservation,
power balance, the linearisation about upright, and mirror symmetry."""
import numpy as np
import pytest

from grpo_ctrl.sim import BatchSim, presets, systems

ALL_PRESETS = [(s, p) for s in systems() for p in presets(s)]


def frictionless(system):
    """A plant with every non-conservative force removed, RK4 at 1 ms."""
    if system == "pendulum":
        sim = BatchSim("pendulum", 1, preset="rig", integrator="rk4", dt=0.001, substeps=1)
        sim.set_param("b", 0.0)
        sim.set_param("fc", 0.0)
        x0 = [2.0, 1.0]  # a large swing, 115 degrees from upright
    elif system == "furuta":
        sim = BatchSim("furuta", 1, preset="qube-servo2", integrator="rk4", dt=0.001, substeps=1)
        sim.set_param("dr", 0.0)
        sim.set_param("dp", 0.0)
        # with km = 0 the motor neither drives nor brakes the arm: its back-EMF
        # torque -km^2/rm * theta_dot would otherwise dissipate energy
        sim.set_param("km", 0.0)
        x0 = [0.3, np.pi - 1.2, 2.0, -1.0]
    else:  # cartpole: Gymnasium's equations are frictionless already
        sim = BatchSim("cartpole", 1, preset="swingup", integrator="rk4", dt=0.001, substeps=1)
        x0 = [0.0, 0.5, np.pi - 1.0, 2.0]
    sim.set_state({"x": np.array([x0])})
    return sim


@pytest.mark.parametrize("system", ["pendulum", "furuta", "cartpole"])
def test_frictionless_rk4_conserves_energy_over_10000_steps(system):
    sim = frictionless(system)
    x0 = sim.get_state()["x"][0]
    e0 = sim.energy()
    assert e0 > 0.01  # a real swing, not a state at rest
    energies = []
    for _ in range(100):
        sim.rollout(np.zeros((100, 1), np.float32))
        energies.append(sim.energy())
    drift = np.max(np.abs(np.array(energies) - e0)) / e0
    assert drift < 1e-6, drift
    assert np.abs(sim.get_state()["x"][0] - x0).max() > 0.1  # it really swung


@pytest.mark.parametrize("system", ["pendulum", "furuta", "cartpole"])
def test_damping_dissipates_energy(system):
    """The same start with the presets' friction (and, for the Furuta, the motor's
    back-EMF) on loses energy: the conservation test above is not vacuous."""
    preset = {"pendulum": "rig", "furuta": "qube-servo2", "cartpole": "swingup"}[system]
    sim = BatchSim(system, 1, preset=preset, integrator="rk4", dt=0.001, substeps=1)
    sim.set_state({"x": frictionless(system).get_state()["x"]})
    if system == "cartpole":  # frictionless by design; add a braking force instead
        x = sim.get_state()["x"][0]
        e0 = sim.energy()
        sim.rollout(np.full((100, 1), -np.sign(x[1]) * 1.0, np.float32))
    else:
        e0 = sim.energy()
        sim.rollout(np.zeros((1000, 1), np.float32))
    assert sim.energy() < e0 * (1 - 1e-4)


def _energy_rate_and_power(sim, x, u, eps=1e-6):
    """dE/dt along the flow (central difference of E along f) and the power
    the input and friction put in, from first principles."""
    f = sim.dynamics(x, u)
    rate = (sim.energy(x + eps * f) - sim.energy(x - eps * f)) / (2 * eps)
    p = dict(zip(sim.spec.param_names, sim.get_state()["param"][0]))
    if sim.system == "pendulum":
        thd = x[1]
        vc = float(sim.model.coulomb_vc)
        coulomb = np.tanh(thd / vc) if vc > 0 else np.sign(thd)  # vc = 0: the exact sign
        power = (u - p["b"] * thd - p["fc"] * coulomb) * thd
    elif sim.system == "cartpole":
        power = u * x[1]  # force times cart velocity
    elif sim.system == "double_pendulum":
        # the motor's torque on its joint; viscous and atan-shaped Coulomb friction on both
        vc = float(sim.model.coulomb_vc)
        power = u * x[2 + sim.model.actuated]
        for j, qd in enumerate(x[2:]):
            power -= (p[f"b{j + 1}"] * qd + p[f"cf{j + 1}"] * np.arctan(qd / vc)) * qd
    else:
        thd, ald = x[2], x[3]
        torque = p["km"] * (u - p["km"] * thd) / p["rm"]
        power = (torque - p["dr"] * thd) * thd - p["dp"] * ald * ald
    return rate, power


@pytest.mark.parametrize("system,preset", ALL_PRESETS)
def test_energy_changes_at_the_rate_the_input_and_friction_do_work(system, preset):
    sim = BatchSim(system, 1, preset=preset)
    rng = np.random.default_rng(3)
    for _ in range(20):
        x = rng.uniform(-3, 3, sim.spec.nx)
        u = rng.uniform(-sim.spec.u_max, sim.spec.u_max)
        rate, power = _energy_rate_and_power(sim, x, u)
        assert rate == pytest.approx(power, rel=1e-6, abs=1e-9 * (1 + abs(sim.energy(x))))


def test_energy_zero_hanging_at_rest_and_potential_at_upright():
    pend = BatchSim("pendulum", 1, preset="gym")
    assert pend.energy(np.array([np.pi, 0.0])) == pytest.approx(0.0, abs=1e-12)
    assert pend.energy(np.array([0.0, 0.0])) == pytest.approx(1.0 * 10.0 * 1.0)  # m g l
    furuta = BatchSim("furuta", 1, preset="qube-servo2")
    assert furuta.energy(np.array([0.7, np.pi, 0.0, 0.0])) == pytest.approx(0.0, abs=1e-12)
    assert furuta.energy(np.array([0.0, 0.0, 0.0, 0.0])) == pytest.approx(0.024 * 9.81 * 0.129)


def numeric_jacobian(sim, x0, u0, eps=1e-6):
    """A = df/dx and b = df/du by central differences of sim.dynamics."""
    n = len(x0)
    A = np.empty((n, n))
    for k in range(n):
        dx = np.zeros(n)
        dx[k] = eps
        A[:, k] = (sim.dynamics(x0 + dx, u0) - sim.dynamics(x0 - dx, u0)) / (2 * eps)
    b = (sim.dynamics(x0, u0 + eps) - sim.dynamics(x0, u0 - eps)) / (2 * eps)
    return A, b


@pytest.mark.parametrize("preset", ["gym", "rig"])
def test_pendulum_linearisation_about_upright(preset):
    sim = BatchSim("pendulum", 1, preset=preset)
    p = dict(zip(sim.spec.param_names, sim.get_state()["param"][0]))
    g, m, l, b, fc = p["g"], p["m"], p["l"], p["b"], p["fc"]
    vc = float(sim.model.coulomb_vc)
    inertia = m * l * l / 3  # uniform rod about its end
    A, B = numeric_jacobian(sim, np.zeros(2), 0.0)
    A_exact = np.array([[0.0, 1.0],
                        [3 * g / (2 * l), -(b + fc / vc) / inertia]])  # tanh'(0) = 1
    B_exact = np.array([0.0, 1.0 / inertia])
    np.testing.assert_allclose(A, A_exact, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(B, B_exact, rtol=1e-7, atol=1e-8)
    if preset == "gym":
        assert A[1, 0] == pytest.approx(15.0) and B[1] == pytest.approx(3.0)


def furuta_linear_model(p):
    """Hand-linearised Furuta about upright: with alpha small, sin al ~ al,
    cos al ~ 1 and the velocity products drop out, so
        M0 [thdd, aldd]' = [km/rm (V - km thd) - dr thd, -dp ald + mp g lp / 2 al]'
    with M0 = [[jr + mp lr^2, -mp lp lr / 2], [-mp lp lr / 2, jp + mp lp^2 / 4]]."""
    M0 = np.array([[p["jr"] + p["mp"] * p["lr"] ** 2, -p["mp"] * p["lp"] * p["lr"] / 2],
                   [-p["mp"] * p["lp"] * p["lr"] / 2, p["jp"] + p["mp"] * p["lp"] ** 2 / 4]])
    # generalised forces' derivatives: columns th, al, thd, ald and V
    dQ = np.array([[0.0, 0.0, -p["km"] ** 2 / p["rm"] - p["dr"], 0.0, p["km"] / p["rm"]],
                   [0.0, p["mp"] * p["g"] * p["lp"] / 2, 0.0, -p["dp"], 0.0]])
    acc = np.linalg.solve(M0, dQ)
    A = np.zeros((4, 4))
    A[0, 2] = A[1, 3] = 1.0
    A[2:, :] = acc[:, :4]
    B = np.concatenate([[0.0, 0.0], acc[:, 4]])
    return A, B


def test_furuta_linearisation_about_upright_matches_hand_derived_model():
    sim = BatchSim("furuta", 1, preset="qube-servo2")
    p = dict(zip(sim.spec.param_names, sim.get_state()["param"][0]))
    A_exact, B_exact = furuta_linear_model(p)
    A, B = numeric_jacobian(sim, np.zeros(4), 0.0)
    np.testing.assert_allclose(A, A_exact, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(B, B_exact, rtol=1e-6, atol=1e-6)
    # the Qube-Servo 2 linear model as Quanser's courseware prints it (to 4
    # decimals): gravity on alpha and the voltage column
    assert A[2, 1] == pytest.approx(149.2751, rel=1e-6)
    assert A[3, 1] == pytest.approx(261.6091, rel=1e-6)
    assert B[2] == pytest.approx(49.7275, rel=1e-6)
    assert B[3] == pytest.approx(49.1493, rel=1e-6)
    # the linear model is unstable (the pendulum falls) with one fast pole
    assert np.max(np.linalg.eigvals(A).real) > 10


def test_furuta_linearisation_holds_at_any_arm_angle():
    """The arm angle never enters the equations: the plant is the same wherever the arm points."""
    sim = BatchSim("furuta", 1, preset="qube-servo2")
    A0, B0 = numeric_jacobian(sim, np.zeros(4), 0.0)
    A1, B1 = numeric_jacobian(sim, np.array([1.3, 0.0, 0.0, 0.0]), 0.0)
    np.testing.assert_allclose(A1, A0, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(B1, B0, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("system,preset", ALL_PRESETS)
def test_mirrored_state_and_action_give_mirrored_derivative(system, preset):
    """Every plant is symmetric under reflection: f(-x, -u) = -f(x, u), exactly."""
    sim = BatchSim(system, 1, preset=preset)
    rng = np.random.default_rng(5)
    for _ in range(50):
        x = rng.uniform(-4, 4, sim.spec.nx)
        u = rng.uniform(-sim.spec.u_max, sim.spec.u_max)
        np.testing.assert_array_equal(sim.dynamics(-x, -u), -sim.dynamics(x, u))


@pytest.mark.parametrize("system,preset", ALL_PRESETS)
def test_mirrored_trajectories_stay_mirrored(system, preset):
    """Through the integrator, clipping and saturation too: environment 1
    starts at -x0 and gets -u, and stays at exactly -x of environment 0."""
    sim = BatchSim(system, 2, preset=preset)
    x0 = sim.get_state()["x"][0]
    sim.set_state({"x": np.stack([x0, -x0])})
    rng = np.random.default_rng(6)
    u = rng.uniform(-1.5, 1.5, 100).astype(np.float32) * np.float32(sim.spec.u_max)
    _, reward, _, _ = sim.rollout(np.stack([u, -u], axis=1))
    x = sim.get_state()["x"]
    np.testing.assert_array_equal(x[1], -x[0])
    np.testing.assert_allclose(reward[:, 1], reward[:, 0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("com, inertia", [(0.5, 1 / 3), (1.0, 1.0), (0.7, 0.55)])
def test_pendulum_with_any_centre_of_mass_and_inertia(com, inertia):
    """thdd = (m g lc sin th + u - b thd - fc tanh(thd / vc)) / J with lc = com l and
    J = inertia m l^2: the uniform rod, the point mass and a body in between."""
    sim = BatchSim("pendulum", 1, preset="rig")
    sim.set_param("com", com)
    sim.set_param("inertia", inertia)
    p = dict(zip(sim.spec.param_names, sim.get_state()["param"][0]))
    g, m, l, b, fc = p["g"], p["m"], p["l"], p["b"], p["fc"]
    vc = float(sim.model.coulomb_vc)
    J = inertia * m * l * l
    for th, thd, u in [(0.3, -1.0, 0.05), (2.5, 4.0, -0.1), (-1.2, 0.001, 0.0)]:
        expected = (m * g * com * l * np.sin(th) + u - b * thd - fc * np.tanh(thd / vc)) / J
        f = sim.dynamics(np.array([th, thd]), u)
        assert f[0] == thd
        assert f[1] == pytest.approx(expected, rel=1e-12)
        energy = 0.5 * J * thd ** 2 + m * g * com * l * (1 + np.cos(th))
        assert sim.energy(np.array([th, thd])) == pytest.approx(energy, rel=1e-12)


def realaigym_rk4_step(q, qd, tau, dt=0.01):
    """RealAIGym's simple pendulum (sim_parameters.py: point mass m on a massless rod l,
    inertia m l^2, damping b, Coulomb friction cf times the sign of the velocity, torque
    limit 2), angle q zero hanging, one classical RK4 step of dt, written from their
    published equations independently of the simulator."""
    m, l, b, cf, g = 0.57288, 0.5, 0.10, 0.093, 9.81
    tau = min(max(tau, -2.0), 2.0)

    def f(x):
        return np.array([x[1], (tau - m * g * l * np.sin(x[0]) - b * x[1]
                                - np.sign(x[1]) * cf) / (m * l * l)])
    x = np.array([q, qd])
    k1 = f(x)
    k2 = f(x + 0.5 * dt * k1)
    k3 = f(x + 0.5 * dt * k2)
    k4 = f(x + dt * k3)
    return x + dt * (k1 + 2 * (k2 + k3) + k4) / 6


def test_realaigym_preset_steps_as_their_plant():
    """Our angle is zero upright, theirs zero hanging: q = th + pi, same torque sign."""
    sim = BatchSim("pendulum", 1, preset="realaigym")
    model = sim.model
    assert (model.dt, model.substeps, model.u_max, model.v_max, model.max_steps) == \
        (0.01, 1, 2.0, 0.0, 1000)
    x0 = sim.get_state()["x"][0]
    assert x0[0] == pytest.approx(np.pi, abs=0) and x0[1] == 0.0  # hanging at rest
    rng = np.random.default_rng(0)
    for _ in range(50):
        th, thd, u = rng.uniform(-np.pi, np.pi), rng.uniform(-8, 8), rng.uniform(-3, 3)
        if rng.random() < 0.2:
            thd = 0.0  # at rest the Coulomb term is 0, as np.sign(0)
        sim.set_state({"x": np.array([[th, thd]])})
        sim.step(np.array([u], np.float32))
        x = sim.get_state()["x"][0]
        q, qd = realaigym_rk4_step(th + np.pi, thd, float(np.float32(u)))
        assert np.angle(np.exp(1j * (x[0] + np.pi - q))) == pytest.approx(0.0, abs=1e-12)
        assert x[1] == pytest.approx(qd, rel=1e-12, abs=1e-12)
