#!/usr/bin/env python3
"""The policy's C kernels on every SIMD path this CPU runs, side by side.

For each path (csrc/policy_simd.h: avx512, avx2, baseline, plain; the same bits
on each; then avx512+fma and avx2+fma, which round each product with its sum) the time of one rollout step's mean network (the default gym-pendulum
policy: 64 Fourier features, 2 x 32 ReLU, on 256 branches; ``pr_mean``) and of
one update minibatch's gradient (4,096 loss steps; ``pu_gradient``), in one
process and interleaved round by round, with the ratio to the widest path.
Then the network's matrix products alone at the same shapes (no features'
sine, no bias, no activations: a lower bound for a library's network): by
the C kernels on each path (the rollout's), by OpenBLAS's sgemm (the
``scipy-openblas32`` wheel, one thread, through ctypes) and by torch's matmul
(one thread); and torch's whole network. OPENBLAS_CORETYPE=Haswell and
ATEN_CPU_CAPABILITY=avx2 hold the libraries to AVX2 as GRPO_CTRL_SIMD=avx2
holds the C kernels.

    python benchmarks/bench_kernels.py [--rounds 7] [--json out.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before any OpenBLAS loads

import numpy as np  # noqa: E402
import torch  # noqa: E402

from grpo_ctrl._pendsim import ffi, lib  # noqa: E402
from grpo_ctrl.bench_cli import cpu_model  # noqa: E402
from grpo_ctrl.c_gradient import CGradient  # noqa: E402
from grpo_ctrl.grpo_config import default_config  # noqa: E402
from grpo_ctrl.policy import GaussianPolicy  # noqa: E402

BRANCHES = 256      # the rollout's batch: 32 starts x 8 branches
STEPS = 4096        # one update minibatch: 256 branches x 32 loss steps / 2 minibatches
LOSS_STEPS = 32


def default_policy() -> GaussianPolicy:
    """The gym pendulum's default network, weights as initialised, a fitted normaliser."""
    cfg = default_config("pendulum", "gym")
    torch.manual_seed(0)
    p = GaussianPolicy(3, 2.0, cfg.hidden, cfg.layers, features=cfg.features,
                       feature_scale=cfg.feature_scale, log_std_init=cfg.log_std_init)
    p.obs_norm.update(torch.randn(1000, 3))
    p.refresh_norm()
    return p


def per_call(fn, reps: int) -> float:
    """Seconds per call of fn over reps calls."""
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


class Kernels:
    """pr_mean on the rollout's batch and pu_gradient on one minibatch, called directly."""

    def __init__(self, policy: GaussianPolicy):
        rng = np.random.default_rng(0)
        net, self.params = policy.c_mean_network()
        self.net = ffi.new("pr_net *", net)
        self.net.params = ffi.from_buffer("float[]", self.params)
        self.obs = rng.standard_normal((BRANCHES, 3)).astype(np.float32)
        self.mu = np.empty(BRANCHES, np.float32)
        self.work = np.empty(lib.pr_work_size(self.net, BRANCHES), np.float32)
        self.p = [ffi.from_buffer("float[]", a) for a in (self.obs, self.mu, self.work)]
        nb = 2 * STEPS // LOSS_STEPS
        obs = torch.from_numpy(rng.standard_normal((nb, LOSS_STEPS, 3)).astype(np.float32))
        with torch.no_grad():
            mu = policy.mu(obs)
        std = float(policy.log_std.detach().exp())
        z = mu + std * torch.randn(mu.shape)
        logp_old = (-0.5 * ((z - mu) / std) ** 2 - policy.log_std - 0.9189385).detach()
        batch = SimpleNamespace(obs=obs, z=z.detach(), logp_old=logp_old + 0.05 * torch.randn(
            mu.shape), adv=torch.randn(mu.shape), mask=torch.ones(mu.shape))
        self.grad = CGradient(policy)
        self.grad.bind(batch)
        self.rows = torch.arange(0, nb, 2, dtype=torch.int64)  # every other branch: a minibatch
        self.p_rows = ffi.cast("int64_t *", self.rows.data_ptr())
        self.log_std = float(policy.log_std.detach()[0])

    def rollout_step(self) -> None:
        if lib.pr_mean(self.net, BRANCHES, self.p[0], self.p[1], self.p[2]):
            raise RuntimeError("pr_mean refused the network")

    def update_minibatch(self) -> None:
        g = self.grad
        if lib.pu_gradient(g.net, self.log_std, g.batch, self.p_rows, self.rows.numel(),
                           lib.PU_AGG_TOKEN, 0.2, 0.28, 1.0, g.grad_log_std, g.stats, g.p_work):
            raise RuntimeError("pu_gradient refused the batch")

    def outputs(self) -> bytes:
        """The mean and every gradient, as bytes: what must not depend on the path."""
        self.rollout_step()
        self.update_minibatch()
        return self.mu.tobytes() + b"".join(
            t.grad.numpy().tobytes() for m in self.grad.linear for t in (m.weight, m.bias))


def shapes(policy: GaussianPolicy, n: int) -> list[tuple[int, int, int, bool]]:
    """(M, N, K, transposed-A) of the network's products for n samples: features, hidden
    layers and output forward; with the update's backward: each layer's weight gradient
    (dY^T X) and the hidden layers' input gradients (dY W)."""
    a = policy.arch
    f, w, nobs = a["features"], a["hidden"], a["nobs"]
    fwd = [(n, f, nobs, False)] if f else []
    nin = f + nobs if f else nobs
    fwd += [(n, w, nin, False)] + [(n, w, w, False)] * (a["layers"] - 1) + [(n, 1, w, False)]
    return fwd


def update_shapes(policy: GaussianPolicy, n: int) -> list[tuple[int, int, int, bool]]:
    a = policy.arch
    f, w, nobs = a["features"], a["hidden"], a["nobs"]
    nin = f + nobs if f else nobs
    grads = [(w, nin, n, True)] + [(w, w, n, True)] * (a["layers"] - 1) + [(1, w, n, True)]
    back = [(n, w, 1, False)] + [(n, w, w, False)] * (a["layers"] - 1)
    return shapes(policy, n) + grads + back


class OpenBLAS:
    """cblas_sgemm of scipy-openblas32 through ctypes, one thread."""
    ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112

    def __init__(self):
        import scipy_openblas32
        path = os.path.join(scipy_openblas32.get_lib_dir(), scipy_openblas32.get_library()
                            if scipy_openblas32.get_library().endswith(".so")
                            else "lib" + scipy_openblas32.get_library() + ".so")
        self.dll = ctypes.CDLL(path)
        self.dll.scipy_openblas_set_num_threads(1)
        self.corename = self.dll.scipy_openblas_get_corename
        self.corename.restype = ctypes.c_char_p
        self.sgemm = self.dll.scipy_cblas_sgemm
        c_int, c_float, c_void = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
        self.sgemm.argtypes = [c_int, c_int, c_int, c_int, c_int, c_int, c_float, c_void, c_int,
                               c_void, c_int, c_float, c_void, c_int]
        self.sgemm.restype = None

    def calls(self, dims):
        """One closure per product: C[M x N] = op(A) B with A [M x K] (or [K x M] when
        transposed), B [K x N]."""
        rng = np.random.default_rng(1)
        out = []
        for m, n, k, trans in dims:
            a = rng.standard_normal((k, m) if trans else (m, k)).astype(np.float32)
            b = rng.standard_normal((k, n)).astype(np.float32)
            c = np.empty((m, n), np.float32)
            args = (self.ROW_MAJOR, self.TRANS if trans else self.NO_TRANS, self.NO_TRANS, m, n, k,
                    1.0, a.ctypes.data, m if trans else k, b.ctypes.data, n, 0.0, c.ctypes.data, n)
            out.append((args, (a, b, c)))
        return out

    def run(self, calls) -> None:
        for args, _ in calls:
            self.sgemm(*args)


class Products:
    """The rollout's products through pr_simd_product on the path in use: what the BLAS rows
    compute, by the C kernels (no bias, no activation)."""

    def __init__(self, dims):
        rng = np.random.default_rng(1)
        self.calls = []
        for m, n, k, trans in dims:
            assert not trans
            w = rng.standard_normal((n, k)).astype(np.float32)
            x = rng.standard_normal((k, m)).astype(np.float32)
            out = np.empty((n, m), np.float32)
            self.calls.append(((m, k, n) + tuple(ffi.from_buffer("float[]", a)
                                                   for a in (w, x, out)), (w, x, out)))

    def run(self) -> None:
        for args, _ in self.calls:
            if lib.pr_simd_product(*args):
                raise RuntimeError("pr_simd_product refused the sizes")


def torch_calls(dims):
    g = torch.Generator().manual_seed(1)
    out = []
    for m, n, k, trans in dims:
        a = torch.randn((k, m) if trans else (m, k), generator=g)
        out.append((a.t() if trans else a, torch.randn(k, n, generator=g), torch.empty(m, n)))
    return out


def run_torch(calls) -> None:
    for a, b, c in calls:
        torch.mm(a, b, out=c)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median reported)")
    p.add_argument("--seconds", type=float, default=0.05, help="per row per round, about")
    p.add_argument("--json", help="also write the table here")
    args = p.parse_args(argv)
    if args.rounds < 1 or not args.seconds > 0:
        print("error: --rounds must be >= 1 and --seconds > 0", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    paths = ffi.string(lib.pr_simd_paths()).decode().split()
    start = ffi.string(lib.pr_simd_path()).decode()
    policy = default_policy()
    k = Kernels(policy)

    # the paths must agree bit for bit (csrc/policy_simd.h) before they are timed
    ref = None
    for path in paths:
        lib.pr_simd_select(path.encode())
        got = k.outputs()
        if ref is not None and got != ref:
            print(f"error: the {path} path's results differ from the {paths[0]} path's",
                  file=sys.stderr)
            return 1
        ref = got

    # the fused paths (+fma) round each product with its sum: not the same bits, timed beside
    fused = ffi.string(lib.pr_simd_fused_paths()).decode().split()
    rows = {}  # name -> (rollout fn or None, update fn or None)
    for path in paths + fused:
        rows[f"C {path}"] = (path, k.rollout_step, k.update_minibatch)
    products = Products(shapes(policy, BRANCHES))
    for path in paths + fused:
        rows[f"C {path}, products only"] = (path, products.run, None)
    libs = []
    try:
        blas = OpenBLAS()
        roll_calls, upd_calls = blas.calls(shapes(policy, BRANCHES)), blas.calls(
            update_shapes(policy, STEPS))
        rows["OpenBLAS sgemm (products only)"] = (None, lambda: blas.run(roll_calls),
                                                  lambda: blas.run(upd_calls))
        tiny = blas.calls([(1, 1, 1, False)])
        rows["OpenBLAS one 1x1x1 sgemm (call cost)"] = (None, lambda: blas.run(tiny), None)
        libs.append(f"OpenBLAS {blas.corename().decode()} kernels")
    except ImportError:
        libs.append("OpenBLAS: not installed (pip install scipy-openblas32)")
    t_roll, t_upd = torch_calls(shapes(policy, BRANCHES)), torch_calls(update_shapes(policy, STEPS))
    rows["torch mm (products only)"] = (None, lambda: run_torch(t_roll), lambda: run_torch(t_upd))
    x_roll = torch.randn(BRANCHES, 3)
    x_upd = torch.randn(STEPS, 3)

    def torch_net_fwd():
        with torch.no_grad():
            policy.mu(x_roll)

    def torch_net_fwd_bwd():
        policy.zero_grad(set_to_none=False)
        policy.mu(x_upd).sum().backward()

    rows["torch network (fwd; fwd + bwd)"] = (None, torch_net_fwd, torch_net_fwd_bwd)
    libs.append(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}")

    # calls per timing: about --seconds each
    reps = {}
    for name, (path, roll, upd) in rows.items():
        if path:
            lib.pr_simd_select(path.encode())
        for kind, fn in (("rollout", roll), ("update", upd)):
            if fn is not None:
                fn()
                t = per_call(fn, 3)
                reps[name, kind] = max(3, int(args.seconds / max(t, 1e-7)))
    times = {key: [] for key in reps}
    for _ in range(args.rounds):
        for name, (path, roll, upd) in rows.items():
            if path:
                lib.pr_simd_select(path.encode())
            for kind, fn in (("rollout", roll), ("update", upd)):
                if fn is not None:
                    times[name, kind].append(per_call(fn, reps[name, kind]))
    lib.pr_simd_select(start.encode())

    med = {key: statistics.median(v) for key, v in times.items()}
    base_r, base_u = med[f"C {paths[0]}", "rollout"], med[f"C {paths[0]}", "update"]
    print(f"CPU: {cpu_model()}")
    print(f"SIMD paths this CPU runs: {' '.join(paths)} (baseline = "
          f"{ffi.string(lib.pr_simd_baseline()).decode()}); fused: {' '.join(fused) or 'none'}; "
          f"in use: {start}")
    print(f"libraries: {'; '.join(libs)}")
    print(f"rollout step: the mean network on {BRANCHES} branches; update: one minibatch's "
          f"gradient, {STEPS} steps; median of {args.rounds} interleaved rounds")
    print(f"{'':40s} {'rollout us':>11s} {'x ' + paths[0]:>10s} {'update us':>11s} "
          f"{'x ' + paths[0]:>10s}")
    table = []
    for name in rows:
        r, u = med.get((name, "rollout")), med.get((name, "update"))
        cells = [f"{1e6 * r:11.1f}" if r else f"{'-':>11s}",
                 f"{r / base_r:10.2f}" if r else f"{'-':>10s}",
                 f"{1e6 * u:11.1f}" if u else f"{'-':>11s}",
                 f"{u / base_u:10.2f}" if u else f"{'-':>10s}"]
        print(f"{name:40s} {' '.join(cells)}")
        table.append({"row": name, "rollout_us": r and 1e6 * r, "update_us": u and 1e6 * u})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "paths": paths, "libraries": libs, "rows": table}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
