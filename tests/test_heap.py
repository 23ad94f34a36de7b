"""The trainer keeps freed heap memory (grpo_ctrl/heap.py): an iteration's
large buffers, freed and allocated again, do not fault their pages in again.
Each case runs in a fresh interpreter, whose allocator has glibc's defaults
until the call."""
import subprocess
import sys

import pytest

from grpo_ctrl.heap import keep_freed_memory

# 10 "iterations" after 2 of warm-up, each allocating and freeing 16 blocks of 2 MB
# (8,192 pages): the minor page faults they take
ITERATIONS = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from grpo_ctrl.heap import keep_freed_memory
    assert keep_freed_memory()
for i in range(12):
    if i == 2:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [np.ones(1 << 18) for _ in range(16)]
    del blocks
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", ITERATIONS, mode], capture_output=True,
                          text=True, timeout=60, check=True)
    return int(done.stdout)


def test_freed_buffers_are_kept_and_not_faulted_in_again():
    if not keep_freed_memory():  # macOS, musl: no thresholds to set (CI's Debian has glibc)
        pytest.skip("the C library has no mallopt thresholds (not glibc)")
    # glibc's defaults: the freed 32 MB leave the process and come back page by page
    assert _faults("default") > 10 * 8192 * 0.9
    assert _faults("keep") < 200
