"""Process-wide settings of a serving process (the router or a worker): its event loop and
its garbage collector. The entry points (`sloline run`, `sloline router`, `sloline
worker`) call these; library code and tests run on whatever loop they are given.

- **uvloop**: the router's and the workers' work per request is mostly event-loop
  bookkeeping (transports, futures, callbacks from gRPC's poller); uvloop does it in C.
- **`gc.freeze()` after start-up**: planning leaves ~290k long-lived objects in the
  router's process; every full collection walked them all (~200 ms, the event loop
  stalled meanwhile). Frozen, they are never scanned again, and a full collection only
  looks at what serving allocated since.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a uvloop event loop."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def freeze_startup_heap() -> None:
    """Collect start-up garbage, then move every surviving object out of the collector's
    reach (they live as long as the process)."""
    gc.collect()
    gc.freeze()
