"""Writing output files whole or not at all: the one home for it.

Checkpoints, configs, ONNX files, C sources, plots and reports all go
through ``atomic_write``, so an interrupted or failed write never leaves a
half-written file behind."""
from __future__ import annotations

import io
import json
import math
import os
import tempfile
from pathlib import Path

from grpo_ctrl.errors import UserError


def check_writable(path: str | os.PathLike) -> Path:
    """``UserError`` unless a file can be created at ``path`` (its folder
    exists and is writable, and ``path`` is not a folder): checked before
    long work, so it fails early."""
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        raise UserError(f"cannot write {str(path)!r}: it is a folder; give a file name")
    if not folder.is_dir():
        raise UserError(f"cannot write {str(path)!r}: the folder {str(folder)!r} does not exist; "
                        "create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"cannot write {str(path)!r}: the folder {str(folder)!r} is not writable; "
                        "choose another place")
    return path


def check_folder(path: str | os.PathLike) -> Path:
    """``UserError`` if ``path`` exists and is not a folder (a missing one is
    created when written to)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{str(path)!r} exists and is not a folder; give a folder for the C files")
    return path


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder
    and a rename, so a reader never sees a half-written file and a failure
    leaves nothing behind. Raises ``UserError`` when the folder is missing or
    not writable."""
    path = check_writable(path)
    payload = data.encode() if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise UserError(f"cannot write {str(path)!r}: {e.strerror or e}; choose a writable "
                        "folder") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 is for the temporary file only
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise UserError(f"cannot write {str(path)!r}: {e.strerror or e}") from None
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_figure(fig, path: str | os.PathLike, **savefig_kwargs) -> Path:
    """A matplotlib figure as PNG, written atomically."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", **savefig_kwargs)
    return atomic_write(path, buffer.getvalue())


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if math.isfinite(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(str(v))


def write_toml(path: str | os.PathLike, data: dict) -> None:
    """TOML of strings, numbers, bools and lists, with dict values as tables
    after the plain keys, written atomically."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for name, table in data.items():
        if isinstance(table, dict):
            lines += ["", f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    atomic_write(path, "\n".join(lines) + "\n")
