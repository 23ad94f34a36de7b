"""Keep freed heap memory in the process instead of handing it back to the kernel.

Every training iteration allocates and frees the same large tensors (the
rollout's buffers, the update's activations). With glibc's defaults, blocks
over the mmap threshold are unmapped when freed and free memory at the heap's
top is trimmed, so the next iteration faults the same pages in again: at the
default batch 640-1,000 minor page faults per iteration (1-2 ms of kernel
time, 5-11 % of the iteration), at 128 starts 1,700-7,400 (3-14 ms); on this
virtual machine a fault is slow, and how many an iteration takes depends on the
process's allocation history, so two data-parallel ranks doing the same work
took different times and waited for each other (docs/distributed.md §5).
Fixed thresholds keep the memory: the process holds its peak heap until it
ends, and an iteration faults tens of pages, not thousands.
"""
from __future__ import annotations

import ctypes

# <malloc.h>: mallopt's parameters
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
# blocks up to glibc's largest mmap threshold come from the heap, which is trimmed only
# when more than TRIM_THRESHOLD bytes at its top are free
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Set the allocator's thresholds for this process (and the processes it
    forks later); True where the allocator took them (glibc), False where
    there is no ``mallopt`` (macOS) or it ignores them (musl)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, TypeError):  # no such function, or no C library handle
        return False
    took = [mallopt(option, value) for option, value in
            ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD))]
    return all(took)
