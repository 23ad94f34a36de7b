"""Writing output files whole or not at all."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from grpo_ctrl.errors import UserError


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder
    and a rename, so a reader never sees a half-written file and a failure
    leaves nothing behind. Raises ``UserError`` when the folder is missing or
    not writable."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UserError(f"cannot write {str(path)!r}: it is a folder; give a file name")
    if not folder.is_dir():
        raise UserError(f"cannot write {str(path)!r}: the folder {str(folder)!r} does not exist; "
                        "create it first")
    payload = data.encode() if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise UserError(f"cannot write {str(path)!r}: {e.strerror or e}; choose a writable "
                        "folder") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise UserError(f"cannot write {str(path)!r}: {e.strerror or e}") from None
        raise
    return path
