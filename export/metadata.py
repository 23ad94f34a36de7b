"""The metadata an exported controller carries: one home for its keys.

Every key lives in the ONNX model's ``metadata_props`` under the
``grpo_ctrl.`` prefix, as a string. ``parse`` turns them back into Python
values (without the prefix); the serial bridge and ``grpo-ctrl inspect`` read
them through it.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

# onnx is imported where a model is written, not here: the serial bridge reads the
# metadata through onnxruntime alone (the base install has no onnx)

PREFIX = "grpo_ctrl."

# key (without prefix) -> what it holds; the order is the order ``inspect`` prints
KEYS = {
    "system": "plant: pendulum, cartpole, furuta or double_pendulum",
    "preset": "parameter preset of the plant",
    "obs_names": "observation components, comma-separated, in input order",
    "action_name": "what the output commands",
    "action_unit": "unit of the output",
    "observation_convention": "each angle's zero and direction, the units, what the output "
                              "drives (the plant layer's PlantSpec.observation_convention)",
    "u_max": "actuator limit: the output lies in [-u_max, u_max]",
    "dt": "control period, s",
    "source": "run folder or checkpoint, or baseline name",
    "source_sha256": "SHA-256 of the checkpoint (baselines: of the exported graph)",
    "randomize": "the plant ranges it was trained on: the run's [randomize] table, as JSON",
    "version": "grpo-ctrl version that exported it",
    "exporter": "torch and onnx versions that exported it",
    "verified_max_abs_error": "largest |onnxruntime - torch| over the verification observations",
    "verified_samples": "number of verification observations",
    "verified_tolerance": "the largest difference verification accepted: 1e-5, or twice the "
                          "controller's own float32 rounding where larger (at most 1e-3 of "
                          "u_max)",
}
_FLOATS = ("u_max", "dt", "verified_max_abs_error", "verified_tolerance")
_INTS = ("verified_samples",)


def for_controller(controller, source: str, source_sha256: str) -> dict[str, str]:
    """The descriptive keys of ``controller`` (all but the verification result)."""
    import onnx
    import torch

    import grpo_ctrl

    spec = controller.spec
    return {
        "system": spec.system,
        "preset": spec.preset,
        "obs_names": ",".join(spec.obs_names),
        "action_name": spec.action_name,
        "action_unit": spec.action_unit,
        "observation_convention": spec.observation_convention,
        "u_max": repr(float(spec.u_max)),
        "dt": repr(float(spec.dt)),
        "source": source,
        "source_sha256": source_sha256,
        "randomize": getattr(controller, "source_info", {}).get("randomize", "{}"),
        "version": grpo_ctrl.__version__,
        "exporter": f"torch {torch.__version__} (TorchScript exporter), onnx {onnx.__version__}",
    }


def write(model: "onnx.ModelProto", values: dict[str, str]) -> None:
    """Set ``values`` (keys without prefix) in ``model``, replacing old ones."""
    unknown = set(values) - set(KEYS)
    if unknown:
        raise KeyError(f"unknown metadata keys {sorted(unknown)}; known: {list(KEYS)}")
    kept = [p for p in model.metadata_props if p.key.removeprefix(PREFIX) not in values
            or not p.key.startswith(PREFIX)]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key in KEYS:
        if key in values:
            model.metadata_props.add(key=PREFIX + key, value=str(values[key]))


def raw(model_or_props) -> dict[str, str]:
    """The ``grpo_ctrl.`` keys of a model (or of ``{key: value}`` as
    onnxruntime's ``custom_metadata_map`` gives them), prefix removed."""
    props = (model_or_props if isinstance(model_or_props, dict)
             else {p.key: p.value for p in model_or_props.metadata_props})
    return {k.removeprefix(PREFIX): v for k, v in props.items() if k.startswith(PREFIX)}


def parse(values: dict[str, str]) -> dict:
    """Typed values: ``obs_names`` a list, floats and ints as numbers."""
    out: dict = dict(values)
    if "obs_names" in out:
        out["obs_names"] = out["obs_names"].split(",") if out["obs_names"] else []
    for key in _FLOATS:
        if key in out:
            out[key] = float(out[key])
    for key in _INTS:
        if key in out:
            out[key] = int(out[key])
    if "randomize" in out:
        out["randomize"] = json.loads(out["randomize"])
    return out


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
