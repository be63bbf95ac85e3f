"""Keep the steps' host allocations on pages the process already holds, so a cell's time does not
depend on whether its memory is new to it, and count the page faults that say whether it did.

glibc returns the top of its heap to the kernel past 128 KiB free (M_TRIM_THRESHOLD) and serves large
blocks by mmap; its heap also fragments from step to step. So each step's backward took its gradients
from fresh pages, 1,000-3,500 minor faults per cell at 1.4-1.6 us each on the cpu preset (about 6% of
a backward), while the calibration pass, run after the step freed its memory, reused them at no cost.
Measured on gpipe p=2 m=1, that made the steps' cells slower than their calibration by more than the
model's 5% target. Here the heap is never trimmed, blocks up to glibc's largest mmap threshold come from
the heap, and once the first step has grown it, as much again is touched and freed at its top, a
reserve for the fragmentation of the steps that follow: afterwards a step faults in no page (run.json's
`minor_faults` shows it per rank).

Only glibc has these knobs; elsewhere nothing is changed and the counts still say what happened.
"""

from __future__ import annotations

import ctypes
import functools
import resource

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
NEVER_TRIM = 2**31 - 1
LARGEST_HEAP_BLOCK = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: larger blocks are mmapped
RESERVE_CHUNK = 16 << 20  # below LARGEST_HEAP_BLOCK, so the reserve comes from the heap's top


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc 2.33 or later (mallinfo2), else None."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt, libc.mallinfo2  # noqa: B018 - attribute lookups raise where they are missing
    except (OSError, AttributeError):
        return None
    libc.mallinfo2.restype = _MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


def keep_heap() -> bool:
    """Never trim the heap and keep blocks up to LARGEST_HEAP_BLOCK on it; False where this is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM)) and bool(
        libc.mallopt(M_MMAP_THRESHOLD, LARGEST_HEAP_BLOCK)
    )


def reserve_heap() -> int:
    """Grow the heap by as much as it holds now, touching every page, and free it again (kept, as the
    heap is never trimmed): the bytes reserved, 0 where this is not glibc."""
    libc = _glibc()
    if libc is None:
        return 0
    chunks = []
    for _ in range(-(-libc.mallinfo2().arena // RESERVE_CHUNK)):
        chunk = libc.malloc(RESERVE_CHUNK)
        if not chunk:
            break
        ctypes.memset(chunk, 1, RESERVE_CHUNK)
        chunks.append(chunk)
    for chunk in chunks:
        libc.free(chunk)
    return len(chunks) * RESERVE_CHUNK


def minor_faults() -> int:
    """The process's minor page faults so far (all its threads)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
