"""The Gaussian MLP policy GRPO trains, and the deterministic controller it deploys.

Distribution. The network maps normalised observations to the mean ``mu`` of
a Gaussian over a pre-squash action ``z``; the standard deviation
``exp(log_std)`` is one learned number, state-independent. The actuator
command is the tanh-squashed sample ``a = u_max * tanh(z)``, so it never
leaves ``[-u_max, u_max]`` and the simulator's clip never bites. The density
of ``a`` carries the change-of-variables Jacobian::

    log pi(a | s) = log N(z; mu, sigma) - log(u_max * (1 - tanh(z)^2))

(``squashed_log_prob``). The trainer keeps ``z`` of every sample, so every
ratio it forms (pi/pi_old, pi_ref/pi) compares densities at the same ``z``
and the Jacobian term, which does not depend on the parameters, cancels: the
update needs only ``gaussian_log_prob``.

Deployment. The deterministic action is ``u_max * tanh(mu)``. ``PolicyController``
freezes the observation normalisation into the module, and uses only Linear,
ReLU/ELU/tanh, tanh squashing, affine scaling and clamp (with ``features``, also
a matrix product, sin and a concatenation), which export simply to ONNX opset 17
and to plain C. ReLU is the default hidden activation:
``torch.tanh`` is an order of magnitude slower than ReLU on this CPU.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import pickle
from pathlib import Path

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

from grpo_ctrl._pendsim import ffi, lib
from grpo_ctrl.errors import UserError, one_line
from grpo_ctrl.files import atomic_write
from grpo_ctrl.plant import plant_spec
from grpo_ctrl.run_folder import DEPLOYED, checkpoint_path, run_of

CHECKPOINT_FORMAT = "grpo-ctrl-policy-v1"
ACTIVATIONS = {"relu": nn.ReLU, "elu": nn.ELU, "tanh": nn.Tanh}
LOG_2PI = math.log(2.0 * math.pi)


def gaussian_log_prob(z: torch.Tensor, mu: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """log N(z; mu, exp(log_std)^2), elementwise."""
    return -0.5 * ((z - mu) * torch.exp(-log_std)) ** 2 - log_std - 0.5 * LOG_2PI


def log_tanh_jacobian(z: torch.Tensor, u_max: float) -> torch.Tensor:
    """log |da/dz| for a = u_max tanh(z), computed stably as
    log u_max + 2 (log 2 - z - softplus(-2 z))."""
    return math.log(u_max) + 2.0 * (math.log(2.0) - z - F.softplus(-2.0 * z))


def squashed_log_prob(z, mu, log_std, u_max: float) -> torch.Tensor:
    """Log-density of the command a = u_max tanh(z), z ~ N(mu, sigma^2), at a(z)."""
    return gaussian_log_prob(z, mu, log_std) - log_tanh_jacobian(z, u_max)


def _row_deviations(x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """x - mean for rows x (N, n), computed on rows of 16 observations where N allows: the
    same differences, but a broadcast over rows n = 3 wide runs 3-4x slower than one over
    rows 48 wide (50 against 14 us at 16,384 x 3)."""
    n, k = x.shape
    r = next((r for r in (16, 8, 4, 2) if n % r == 0), 1)
    if r == 1 or not x.is_contiguous():
        return x - mean
    return (x.view(n // r, r * k) - mean.expand(r, k).reshape(r * k)).view(n, k)


class RunningNorm:
    """Running mean and variance of observations (Chan et al.'s parallel
    update), used to normalise the policy's input. Frozen into the controller."""

    def __init__(self, n: int):
        self.mean = torch.zeros(n, dtype=torch.float64)
        self.var = torch.ones(n, dtype=torch.float64)
        self.count = 0.0
        # fixed (a run that starts from a trained policy): the function it learned stays
        # the same function of the observation
        self.frozen = False

    def update(self, x: torch.Tensor) -> None:
        self.merge_moments(self.moments(x.reshape(-1, self.mean.numel())))

    @staticmethod
    def moments(x: torch.Tensor) -> torch.Tensor:
        """[count, mean, biased variance] of observations x (N, n), float64, in one
        tensor: what ``update`` folds in, computed where the batch was collected (the
        overlap collector ships these instead of the observations)."""
        if (x.dtype == torch.float32 and x.is_contiguous() and x.device.type == "cpu"
                and x.shape[0] > 0):
            # the simulators' observations: two passes in C (csrc/policy_rollout.h), 0.02
            # against 0.2 ms by torch at 16,384 x 3
            out = torch.empty(1 + 2 * x.shape[1], dtype=torch.float64)
            if lib.pr_moments(ffi.cast("float *", x.data_ptr()), x.shape[0], x.shape[1],
                              ffi.cast("double *", out.data_ptr())):
                raise ValueError(f"pr_moments refused observations of shape {tuple(x.shape)}")
            return out
        x = x.double()
        mean = x.mean(0)
        dev = _row_deviations(x, mean)
        return torch.cat([torch.tensor([float(x.shape[0])], dtype=torch.float64), mean,
                          dev.mul_(dev).mean(0)])  # (x - mean) ** 2: the same products

    def merge_moments(self, moments: torch.Tensor) -> None:
        """Fold in ``moments(x)`` of new observations x."""
        k = self.mean.numel()
        self.merge(float(moments[0]), moments[1:1 + k], moments[1 + k:])

    def merge(self, n: float, m: torch.Tensor, v: torch.Tensor) -> None:
        """Fold in the moments of n new observations: their mean m and their
        (biased) variance v. Data-parallel training passes those of the whole
        batch across processes (grpo_ctrl/distributed.py). Nothing while ``frozen``."""
        if self.frozen:
            return
        total = self.count + n
        delta = m - self.mean
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + v * n + delta ** 2 * self.count * n / total) / total
        self.count = total

    def scale(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, 1/std) as float32, std floored so constant inputs stay finite."""
        return self.mean.float(), (1.0 / torch.sqrt(self.var + 1e-8)).clamp(max=1e4).float()

    def state_dict(self) -> dict:
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": float(self.count)}

    def load_state_dict(self, d: dict) -> None:
        self.mean, self.var, self.count = d["mean"].double(), d["var"].double(), float(d["count"])


class FourierFeatures(nn.Module):
    """x -> [sin(x B + b), x]: random Fourier features (Rahimi and Recht 2007; Tancik et
    al. 2020) of the normalised observation, with the observation itself. B (nin x n,
    N(0, scale^2)) and the phases b (uniform in [0, 2 pi)) are drawn once and fixed
    (buffers: saved, loaded and exported with the network, never trained). A ReLU
    network of the raw observation is slow to fit a command that switches sharply
    across the state space (the swing-up's switching curve); on these features it
    fits it several times faster (docs/research.md §10). Exports as MatMul,
    Add, Sin and Concat, which ONNX and the C generator support."""

    def __init__(self, nin: int, n: int, scale: float):
        super().__init__()
        self.register_buffer("B", torch.randn(nin, n) * float(scale))
        self.register_buffer("b", torch.rand(n) * (2.0 * math.pi))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([plain_sin(x @ self.B + self.b), x], dim=-1)


# torch.export and the dynamo ONNX exporter trace with fake tensors (torch >= 2.3 says so;
# 2.2, the oldest torch this package takes, exports by torch.jit's tracer)
_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


def plain_sin(x: torch.Tensor) -> torch.Tensor:
    """torch.sin(x), by numpy where nothing needs torch's own op (no gradient, no
    tracing or export, a CPU tensor): numpy's float32 sine is 2-2.6x faster on this CPU
    (256 x 64 values: 8 against 19 us, a tenth of a rollout step; docs/research.md
    §11), and within an ulp of it."""
    if (x.requires_grad or x.device.type != "cpu" or torch.jit.is_tracing()
            or _compiling()):
        return torch.sin(x)
    return torch.from_numpy(np.sin(x.numpy()))


def mlp(nin: int, hidden: int, layers: int, activation: str, features: int = 0,
        feature_scale: float = 1.0) -> nn.Sequential:
    """nin -> [FourierFeatures (features > 0)] -> [hidden, activation] * layers -> 1, the
    mean of z."""
    if activation not in ACTIVATIONS:
        raise UserError(f"unknown activation {activation!r}; choose one of {list(ACTIVATIONS)}")
    mods, n = [], nin
    if features:
        mods, n = [FourierFeatures(nin, features, feature_scale)], nin + features
    for _ in range(layers):
        mods += [nn.Linear(n, hidden), ACTIVATIONS[activation]()]
        n = hidden
    head = nn.Linear(n, 1)
    nn.init.zeros_(head.bias)
    with torch.no_grad():
        head.weight.mul_(0.01)  # start near mu = 0: unbiased exploration
    mods.append(head)
    return nn.Sequential(*mods)


def run_layers(layers, x: torch.Tensor) -> torch.Tensor:
    """``nn.Sequential(*layers)(x)``: the same ops, bit for bit, without nn.Module's call
    machinery, which costs a sixth of a rollout step at hidden 32 (docs/research.md
    §11). Hooks on the layers do not run."""
    for layer in layers:
        kind = type(layer)
        if kind is nn.Linear:
            x = F.linear(x, layer.weight, layer.bias)
        elif kind is nn.ReLU:
            x = torch.relu(x)
        elif kind is FourierFeatures:
            x = layer.forward(x)
        else:
            x = layer(x)
    return x


def mlp_for(arch: dict) -> nn.Sequential:
    """A fresh mean network of a policy's ``arch`` (GaussianPolicy.arch)."""
    return mlp(arch["nobs"], arch["hidden"], arch["layers"], arch["activation"],
               arch["features"], arch["feature_scale"])


class GaussianPolicy(nn.Module):
    """The trained object: mean network, log_std, observation normaliser, u_max."""

    def __init__(self, nobs: int, u_max: float, hidden: int = 64, layers: int = 2,
                 activation: str = "relu", log_std_init: float = 0.0,
                 log_std_min: float = -math.inf, features: int = 0, feature_scale: float = 1.0):
        super().__init__()
        self.arch = {"nobs": nobs, "hidden": hidden, "layers": layers, "activation": activation,
                     "features": int(features), "feature_scale": float(feature_scale)}
        self.u_max = float(u_max)
        self.net = mlp_for(self.arch)
        self.log_std = nn.Parameter(torch.full((1,), float(log_std_init)))
        self.log_std_min = float(log_std_min)
        self.obs_norm = RunningNorm(nobs)
        self.refresh_norm()
        self._c_layers = (None, [])  # c_mean_network's flat views of the layers, and their key

    def refresh_norm(self) -> None:
        """Copy the running statistics into the (frozen) scaling used by forward."""
        self._obs_mean, self._obs_inv_std = self.obs_norm.scale()

    def normalise(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs - self._obs_mean) * self._obs_inv_std

    def mu(self, obs_normalised: torch.Tensor) -> torch.Tensor:
        """Mean of z for normalised observations, shape (N,)."""
        return run_layers(self.net, obs_normalised).squeeze(-1)

    def command(self, obs_normalised: torch.Tensor) -> torch.Tensor:
        """The deterministic command u_max tanh(mu) in N m, shape (N,): what the deployed
        controller computes, here with gradients (for fitting it)."""
        return self.u_max * torch.tanh(self.mu(obs_normalised))

    def dist(self, obs_normalised: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log std) of z for normalised observations: shapes (N,) and (1,) (the
        std is state-independent: it broadcasts)."""
        return self.mu(obs_normalised), self.log_std

    def c_mean_network(self) -> tuple[dict, np.ndarray] | None:
        """The mean network as the C rollout takes it (csrc/policy_rollout.h, ``pr_net``):
        its sizes, and the normaliser, features and layers in one float32 array in that
        header's order; None where C does not run this network (an activation other than
        ReLU)."""
        arch = self.arch
        if arch["activation"] != "relu":
            return None
        layers, transposed = [], None
        for layer in self.net:
            if isinstance(layer, FourierFeatures):
                transposed = layer.B
                layers += [layer.B, layer.b]
            elif isinstance(layer, nn.Linear):
                layers += [layer.weight, layer.bias]
        # their flat views, made again only where a tensor was replaced or moved (an
        # update changes them in place; 3 against 30 us an iteration); B transposed is a
        # copy, made again when B changes (its version: load_state_dict copies in place)
        key = [(id(t), t.data_ptr(), t._version if t is transposed else 0) for t in layers]
        if self._c_layers[0] != key:
            self._c_layers = (key, [(t.t() if t is transposed else t).detach().reshape(-1)
                                    for t in layers])
        params = torch.cat([self._obs_mean, self._obs_inv_std, *self._c_layers[1]]).numpy()
        return {"nobs": arch["nobs"], "nfeat": arch["features"], "nhidden": arch["layers"],
                "width": arch["hidden"]}, params

    def checkpoint(self, spec, config: dict, extra: dict | None = None) -> dict:
        """Everything needed to act and to resume, as plain tensors and numbers."""
        return {"format": CHECKPOINT_FORMAT, "arch": dict(self.arch), "u_max": self.u_max,
                "system": spec.system, "preset": spec.preset, "config": dict(config),
                "net": {k: v.clone() for k, v in self.net.state_dict().items()},
                "log_std": self.log_std.detach().clone(), "obs_norm": self.obs_norm.state_dict(),
                **(extra or {})}

    @classmethod
    def from_checkpoint(cls, ck: dict) -> "GaussianPolicy":
        """The policy of a checkpoint; UserError for one of a per-state std or gSDE, which
        were removed (docs/research.md)."""
        arch = ck["arch"]
        for removed in ("state_std", "sde"):
            if arch.get(removed):
                raise UserError(f"this checkpoint's policy uses {removed}, which was removed "
                                f"(docs/research.md; the tag research-2026-12 still reads it)")
        p = cls(arch["nobs"], ck["u_max"], arch["hidden"], arch["layers"], arch["activation"],
                log_std_min=ck.get("config", {}).get("log_std_min", -math.inf),
                features=arch.get("features", 0), feature_scale=arch.get("feature_scale", 1.0))
        p.net.load_state_dict(ck["net"])
        with torch.no_grad():
            p.log_std.copy_(ck["log_std"])
        p.obs_norm.load_state_dict(ck["obs_norm"])
        p.refresh_norm()
        return p

    def controller(self, spec, catch: float = 0.0, source_info: dict | None = None) -> nn.Module:
        """The deterministic controller of this policy (``PolicyController``), which the
        LQR about upright catches inside x'Px < ``catch`` where catch > 0 (the run's
        ``GRPOConfig.catch``: it trained with that catch in its simulator)."""
        controller = PolicyController(self, spec, source_info)
        if catch > 0:
            from grpo_ctrl.baselines.lqr import LQRCatch, design
            return LQRCatch(controller, spec, design(spec.system, spec.preset), catch)
        return controller


class PolicyController(nn.Module):
    """The deployed controller: obs (N, nobs) float32 -> command (N, 1) in
    physical units, u_max * tanh(mu(normalised obs)), clamped to +-u_max.
    A frozen copy, independent of the policy it came from."""

    def __init__(self, policy: GaussianPolicy, spec, source_info: dict | None = None):
        super().__init__()
        self.spec = spec
        self.source_info = dict(source_info or {})
        mean, inv_std = policy.obs_norm.scale()
        self.register_buffer("obs_mean", mean.clone())
        self.register_buffer("obs_inv_std", inv_std.clone())
        self.net = mlp_for(policy.arch)
        self.net.load_state_dict(policy.net.state_dict())
        self.u_max = float(policy.u_max)
        self.requires_grad_(False)
        self.eval()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        z = self.net((obs - self.obs_mean) * self.obs_inv_std)
        return torch.clamp(self.u_max * torch.tanh(z), -self.u_max, self.u_max)


# ---------------------------------------------------------------------- files
def save_checkpoint(ck: dict, path: Path) -> None:
    """Write a checkpoint whole or not at all."""
    buffer = io.BytesIO()
    torch.save(ck, buffer)
    atomic_write(path, buffer.getvalue())


def save_policy_run(out: Path, policy: "GaussianPolicy", spec, config: dict, table: dict,
                    extra: dict) -> Path:
    """``out`` as the run folder of a policy that no training run wrote (``distill``,
    ``trajopt``): config.toml (the plant, ``config``, then ``table``) and the deployed
    checkpoint (``config``; ``extra`` beside it). Returns the checkpoint's path."""
    from grpo_ctrl.files import write_toml
    from grpo_ctrl.run_folder import CONFIG, checkpoint_file

    out.mkdir(parents=True, exist_ok=True)
    write_toml(out / CONFIG, {"system": spec.system, "preset": spec.preset, **config, **table})
    path = out / checkpoint_file(DEPLOYED)
    save_checkpoint(policy.checkpoint(spec, config, extra), path)
    return path


def read_checkpoint(path: Path) -> dict:
    """Load and check a checkpoint file; UserError if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {str(path)!r} does not exist; train one with "
                        "`grpo-ctrl train` or point at a run folder")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # not torch's advice: weights_only=False would run its code
        raise UserError(f"{str(path)!r} is not a grpo-ctrl checkpoint (not a file of tensors "
                        "and plain values; nothing in it was run); point at a checkpoint from "
                        "`grpo-ctrl train`") from None
    except Exception as e:  # torch raises many types for a damaged file
        raise UserError(f"{str(path)!r} is not a readable grpo-ctrl checkpoint "
                        f"({type(e).__name__}: {one_line(e)}); retrain or point at another "
                        "checkpoint") from None
    if not isinstance(ck, dict) or ck.get("format") != CHECKPOINT_FORMAT:
        raise UserError(f"{str(path)!r} is not a grpo-ctrl policy checkpoint (format "
                        f"{ck.get('format') if isinstance(ck, dict) else type(ck).__name__!r}, "
                        f"expected {CHECKPOINT_FORMAT!r})")
    return ck


def load_policy(path: Path, which: str = DEPLOYED) -> tuple[GaussianPolicy, dict, Path]:
    ck_path = checkpoint_path(path, which)
    ck = read_checkpoint(ck_path)
    try:
        return GaussianPolicy.from_checkpoint(ck), ck, ck_path
    except (KeyError, RuntimeError, TypeError) as e:
        raise UserError(f"{str(ck_path)!r} is a damaged checkpoint ({type(e).__name__}: "
                        f"{one_line(e)}); "
                        "retrain or point at another checkpoint") from None


def load_policy_controller(path, which: str = DEPLOYED) -> nn.Module:
    """The deterministic controller of a run folder (its deployed checkpoint by
    default) or of a checkpoint file, per grpo_ctrl.controller's contract.
    ``.source_info`` = {run, checkpoint, sha256} of what it was loaded from."""
    policy, ck, ck_path = load_policy(Path(path), which)
    try:
        spec = plant_spec(ck["system"], ck["preset"])
    except ValueError as e:
        raise UserError(f"{str(ck_path)!r} names a plant this simulator lacks: {e}") from None
    if policy.arch["nobs"] != spec.nobs:
        raise UserError(f"{str(ck_path)!r} is a damaged checkpoint: its network takes "
                        f"{policy.arch['nobs']} observations, its plant {spec.system}/"
                        f"{spec.preset} has {spec.nobs}; retrain or point at another checkpoint")
    digest = hashlib.sha256(ck_path.read_bytes()).hexdigest()
    run = run_of(path, ck_path)
    info = {"run": str(run) if run is not None else "", "checkpoint": str(ck_path),
            "sha256": digest, "randomize": json.dumps(ck.get("randomize", {}))}
    return policy.controller(spec, float(ck.get("config", {}).get("catch", 0.0)), info)
