"""glibc malloc tuning for processes that move large tensors (router and workers).

By default glibc serves every allocation over 128 KiB-32 MiB (dynamic) with a fresh mmap
and returns it on free, so each 602 KB request costs several mmaps and ~150 page faults
per copy. Raising the mmap and trim thresholds keeps those buffers on the heap and reuses
them (the gain on 602 KB requests: docs/benchmarks.md, "Micro-benchmarks behind design
choices"). The price is up to 4 x threshold of freed memory kept
by the process instead of returned to the OS.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

DEFAULT_THRESHOLD_BYTES = 64 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # from <malloc.h>


def tune_malloc(threshold_bytes: int = DEFAULT_THRESHOLD_BYTES) -> bool:
    """Apply the thresholds; False (and a debug log) where libc has no mallopt."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold_bytes)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, 4 * threshold_bytes)
        )
    except (OSError, AttributeError):
        ok = False
    if not ok:
        log.debug("mallopt is not available; keeping the default malloc thresholds")
    return ok
