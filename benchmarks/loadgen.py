#!/usr/bin/env python3
"""A busy machine on demand: the load a user's laptop or a CI runner adds
while the control loop runs.

Kinds (each a set of child processes, stopped when the ``load`` block ends):

* ``cpu``: one busy-looping process per CPU;
* ``crowd``: eight per CPU, an oversubscribed runner (a CI machine shared with
  other jobs): run the loop under ``setpriv --bounding-set -sys_nice`` too, as
  a container without CAP_SYS_NICE gets no real-time priority;
* ``disk``: two writers of 64 MiB blocks, each followed by fsync, up to
  ``DISK_GB`` per file before it is deleted and begun again, and one writer
  of ``3 * DISK_GB`` without fsync (dirty pages pile up until the kernel
  throttles every process that writes);
* ``memory``: a process that holds ``MEMORY_GB`` and keeps touching every page
  of it, so the kernel reclaims page cache (the loop's code pages among them);
* ``pip``: a scratch venv created and the project installed into it from the
  local tree (``pip install --no-index --no-deps``), over and over: the
  package-install and C-compiler load of issue 10;
* ``mix``: all of the above at once.

    python benchmarks/loadgen.py mix --seconds 60     # a busy machine for a minute
    python benchmarks/loadgen.py mix -- pytest -q tests/test_run.py   # a command under load

From Python: ``with load("disk"): ...``.
"""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KINDS = ("cpu", "crowd", "disk", "memory", "pip", "mix")
DISK_GB = 2.0
MEMORY_GB = 4.0
REPO = Path(__file__).resolve().parent.parent


def _spin() -> None:
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def _write_files(folder: str, gb: float, fsync: bool) -> None:
    """64 MiB blocks to a file of ``gb`` GB, deleted and begun again. With
    fsync each block waits for the disk (the journal commits behind it);
    without, dirty pages pile up until the kernel throttles every writer on
    the machine (balance_dirty_pages)."""
    block = os.urandom(64 << 20)
    path = os.path.join(folder, f"fill-{os.getpid()}")
    while True:
        with open(path, "wb") as f:
            for _ in range(max(1, int(gb * 16))):
                f.write(block)
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())
        os.remove(path)


def _hold_memory(gb: float) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    buf = bytearray(int(gb * (1 << 30)))
    while True:
        for i in range(0, len(buf), page):
            buf[i] = (buf[i] + 1) & 0xFF


def _install_loop(folder: str) -> None:
    """Scratch venv + pip install of this project (C extensions compiled), again and again."""
    src = os.path.join(folder, "src")  # a copy: pip builds in the tree it installs from
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "runs", "build", "*.egg-info", "__pycache__", "*.so"))
    n = 0
    while True:
        venv = os.path.join(folder, f"venv-{n % 2}")
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q",
                        "--no-index", "--no-deps", "--no-build-isolation", src],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       cwd=folder)
        n += 1


def _own_group(fn, *args) -> None:
    os.setpgid(0, 0)  # its children (pip, the compiler) are stopped with it
    fn(*args)


def _targets(kind: str, folder: str, disk_gb: float, memory_gb: float):
    cpus = os.cpu_count() or 1
    if kind in ("cpu", "mix"):
        yield from ((_spin, ()) for _ in range(cpus))
    if kind == "crowd":
        yield from ((_spin, ()) for _ in range(8 * cpus))
    if kind in ("disk", "mix"):
        yield from ((_write_files, (folder, disk_gb, True)) for _ in range(2))
        yield _write_files, (folder, 3 * disk_gb, False)
    if kind in ("memory", "mix"):
        yield _hold_memory, (memory_gb,)
    if kind in ("pip", "mix"):
        yield _install_loop, (folder,)


@contextlib.contextmanager
def load(kind: str, disk_gb: float = DISK_GB, memory_gb: float = MEMORY_GB, folder=None):
    """Run the load ``kind`` (or nothing for ``quiet``/None) for the block's duration."""
    if kind in (None, "quiet"):
        yield
        return
    if kind not in KINDS:
        raise ValueError(f"unknown load {kind!r}; choose one of quiet, {', '.join(KINDS)}")
    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="loadgen-", dir=folder) as scratch:
        procs = [ctx.Process(target=_own_group, args=(fn, *a), daemon=True)
                 for fn, a in _targets(kind, scratch, disk_gb, memory_gb)]
        for p in procs:
            p.start()
        try:
            time.sleep(0.5)  # let it build up
            yield
        finally:
            for p in procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.kill()
            for p in procs:
                p.join()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="after --: a command to run under the load; its exit "
                                        "status is returned")
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--seconds", type=float, default=None,
                    help="run the load this long (default: until the command ends)")
    ap.add_argument("--disk-gb", type=float, default=DISK_GB)
    ap.add_argument("--memory-gb", type=float, default=MEMORY_GB)
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    with load(args.kind, args.disk_gb, args.memory_gb):
        if command:
            return subprocess.run(command).returncode
        time.sleep(args.seconds if args.seconds is not None else 1e9)
    return 0


if __name__ == "__main__":
    sys.exit(main())
