"""The layout of a run folder: what ``grpo-ctrl train`` writes there and
every loader of a run reads, named in one place.

* ``config.toml``: the resolved configuration (loadable with ``--config``),
  the plant's ``system`` and ``preset`` included;
* ``metrics.jsonl``: one line per iteration;
* ``curve.png``: the training curve;
* ``latest.pt`` and ``deployed.pt``: the last checkpoint and the deployed one
  (what eval, export and run load from a folder): by ``deploy``, the one with the
  best deterministic evaluation return, the policy training ended with, or the
  calm one (grpo_ctrl/deploy.py). Run folders made before hold it as ``best.pt``,
  which every loader still reads.
"""
from __future__ import annotations

import json
from pathlib import Path

from grpo_ctrl.errors import UserError

CONFIG = "config.toml"
METRICS = "metrics.jsonl"
CURVE = "curve.png"
LATEST = "latest"
DEPLOYED = "deployed"
OLD_NAMES = {DEPLOYED: "best"}  # what run folders made before call a checkpoint


def checkpoint_file(which: str) -> str:
    """The file name of checkpoint ``which`` (``LATEST`` or ``DEPLOYED``)."""
    return f"{which}.pt"


def checkpoint_path(path: Path, which: str = DEPLOYED) -> Path:
    """The checkpoint a run folder or file names: ``deployed.pt`` of a run folder
    by default (``best.pt`` in a folder made before; ``latest.pt`` if there is
    none of them yet)."""
    path = Path(path)
    if path.is_dir():
        names = [checkpoint_file(which)]
        if which in OLD_NAMES:
            names.append(checkpoint_file(OLD_NAMES[which]))
        names = list(dict.fromkeys([*names, checkpoint_file(LATEST)]))
        for name in names:
            if (path / name).is_file():
                return path / name
        raise UserError(f"run folder {str(path)!r} has no checkpoint ({' or '.join(names)}); "
                        "is training finished, or is this the right folder?")
    if not path.exists():
        raise UserError(f"{str(path)!r} does not exist; name a run folder or a checkpoint file")
    return path


def run_of(source: Path, checkpoint: Path) -> Path | None:
    """The run folder a loaded checkpoint belongs to, if any."""
    if Path(source).is_dir() or checkpoint.parent.joinpath(CONFIG).exists():
        return checkpoint.parent
    return None


def read_metrics(path: Path) -> list[dict]:
    """The whole rows of a metrics.jsonl: a line without its newline (cut
    short by a crash or SIGKILL) or that is not JSON is left out."""
    if not path.is_file():
        return []
    rows = []
    with open(path) as fh:
        for line in fh:
            try:
                row = json.loads(line) if line.endswith("\n") else None
            except json.JSONDecodeError:
                row = None
            if isinstance(row, dict):
                rows.append(row)
    return rows
