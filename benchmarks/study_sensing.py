"""What a trained double pendulum policy sees on a device, offline: 10 s from hanging, the
policy every 2 ms on a model of the HIL's sensing (encoder counts, the device's velocity
estimate, the command one tick late), or on the host's model estimate (``run --estimator``).
Prints, per sensing, whether both joints are within 0.35 rad of upright over the last second
and the velocity estimate's rms error.

    python benchmarks/study_sensing.py tests/data/double-pendulum-acrobot-grpo.onnx acrobot
"""
import math
import sys

import numpy as np

from grpo_ctrl.export.session import PolicySession
from grpo_ctrl.estimator import ModelEstimator
from grpo_ctrl.plant import Observer, plant_spec
from grpo_ctrl.realaigym_double import HANGING, upright
from grpo_ctrl.sim import BatchSim

policy, preset = PolicySession(sys.argv[1]), sys.argv[2]
spec = plant_spec("double_pendulum", preset)
observe = Observer(spec)
T = spec.dt


def fly(counts=4096, velocity="true", cutoff_hz=0.0, bandwidth_hz=10.0, late=True):
    """``velocity``: true, filter (differences through a first-order low-pass of
    ``cutoff_hz``, 0: none), pll (a tracking loop of ``bandwidth_hz``) or model.
    ``late``: the command applies from the next tick on, as on the HIL (whose
    STATE reports the torque applied from its tick on: the estimator's input)."""
    plant = BatchSim("double_pendulum", 1, preset)
    plant.set_state({"x": np.array([HANGING])})
    unit = 2 * math.pi / counts if counts else 0.0
    alpha = 1 - math.exp(-2 * math.pi * cutoff_hz * T) if cutoff_hz > 0 else 1.0
    w = 2 * math.pi * bandwidth_hz
    estimator = ModelEstimator(spec, T, bandwidth_hz) if velocity == "model" else None
    v, q_track, prev = np.zeros(2), None, None
    up, err, applied = [], [], 0.0
    for k in range(spec.max_steps):
        x = plant.get_state()["x"][0]
        q = np.round(x[:2] / unit) * unit if unit else x[:2].copy()
        if velocity == "true":
            v = x[2:].copy()
        elif velocity == "filter" and prev is not None:
            v = v + alpha * ((q - prev) / T - v)
        elif velocity == "pll":
            if q_track is None:
                q_track = q.copy()
            r = q - (q_track + T * v)
            q_track, v = q_track + T * v + 2 * w * T * r, v + w * w * T * r
        prev = q
        meas = np.concatenate([q, v])
        if estimator is not None:
            meas = estimator.update(meas, round(T * 1e6) * k, applied)
        err.append(meas[2:] - x[2:])
        u = float(np.clip(policy(observe(meas).astype(np.float32)), -spec.u_max, spec.u_max))
        plant.step(np.array([applied if late else u], np.float32))
        applied = u
        up.append(bool(upright(plant.get_state()["x"])[0]))
    flew = all(up[-round(1 / T):])
    return flew, np.sqrt(np.mean(np.square(err[round(0.5 / T):]), axis=0))


rows = [("true state, no delay", dict(counts=0, late=False)),
        ("true state, one tick late", dict(counts=0)),
        ("4096 counts, true velocities", dict()),
        ("true angles, differences", dict(counts=0, velocity="filter"))]
rows += [(f"4096 counts, differences, low-pass {fc} Hz" if fc else "4096 counts, differences",
          dict(velocity="filter", cutoff_hz=fc)) for fc in (0, 20, 50, 100)]
rows += [(f"4096 counts, tracking loop {bw} Hz", dict(velocity="pll", bandwidth_hz=bw))
         for bw in (10, 20, 30)]
rows += [(f"4096 counts, model estimate {bw} Hz", dict(velocity="model", bandwidth_hz=bw))
         for bw in (3, 5, 10, 20)]
print(f"{sys.argv[1]} on {preset}, 10 s from hanging")
for name, kw in rows:
    flew, rms = fly(**kw)
    print(f"  {name:40s} {'upright' if flew else 'not upright':12s} velocity rms error "
          f"{rms[0]:.3f} / {rms[1]:.3f} rad/s", flush=True)
