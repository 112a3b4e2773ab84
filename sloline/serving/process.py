"""Process-wide settings of a serving process (the router or a worker): its event loop, its
garbage collector and gRPC's I/O threads. The entry points (`sloline run`, `sloline
router`, `sloline worker`) call these; library code and tests run with whatever loop and
gRPC settings they are given. :class:`ChildProcess` is the one way sloline drives a helper
process of its own (the profiler's and the calibration's clients).

- **uvloop**: the router's and the workers' work per request is mostly event-loop
  bookkeeping (transports, futures, callbacks from gRPC's poller); uvloop does it in C.
- **`gc.freeze()` after start-up**: planning leaves ~290k long-lived objects in the
  router's process; every full collection walked them all (~200 ms, the event loop
  stalled meanwhile). Frozen, they are never scanned again, and a full collection only
  looks at what serving allocated since.
- **gRPC's I/O manager instead of its EventEngine**: since grpcio 1.80 the EventEngine
  does socket I/O on its own threads, so each message on a worker stream passes one
  more thread (and, on a VM, one more costly wake-up) on each side. With the I/O manager
  that grpcio used before, the thread waiting for completions polls the sockets itself.
  It makes a hop about a fifth faster (docs/benchmarks.md, "Micro-benchmarks behind
  design choices"). grpc keeps the switch as an experiment it plans to remove; then this
  setting does nothing. A `GRPC_EXPERIMENTS` already in the environment wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing as mp
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")

GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener"


def use_grpc_iomgr() -> None:
    """Ask gRPC for its I/O manager; gRPC reads this when it is first imported, so call
    it before that (child processes inherit it)."""
    os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)


def lower_priority(nice: int) -> None:
    """Raise the nice value of every thread of this process by ``nice`` (at most to 19):
    a lower CPU priority than the processes beside it. On Linux a nice value belongs to
    a thread, and threads started later inherit their starter's."""
    if nice <= 0:
        return
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no procfs: one call for the process
        os.nice(nice)
        return
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):  # a thread that has just ended
            now = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, now + nice))


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a uvloop event loop."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def freeze_startup_heap() -> None:
    """Collect start-up garbage, then move every surviving object out of the collector's
    reach (they live as long as the process)."""
    gc.collect()
    gc.freeze()


class ChildProcess:
    """A helper process driven over a pipe (the profiler's probe client, the calibration
    client, the benchmarks' load generators). Spawned, not forked: it inherits no threads
    and no gRPC state. ``target(conn, *args)`` answers each command it receives on
    ``conn`` and returns when it receives None."""

    def __init__(self, name: str, target: Callable[..., None], *args: Any) -> None:
        self.name = name
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=target, args=(child, *args), daemon=True)
        self.process.start()
        child.close()

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def call(self, command: Any, timeout_s: float | None = None) -> Any:
        """Send ``command`` and wait for the answer (TimeoutError after ``timeout_s``)."""
        self.conn.send(command)
        if timeout_s is not None and not self.conn.poll(timeout_s):
            raise TimeoutError(f"the {self.name} gave no answer in {timeout_s:.0f} s")
        return self.conn.recv()

    async def call_async(self, command: Any, timeout_s: float | None = None) -> Any:
        """:meth:`call` without blocking the running event loop."""
        return await asyncio.get_running_loop().run_in_executor(None, self.call, command, timeout_s)

    def close(self) -> None:
        """Ask the process to stop; terminate it if it has not within 10 s."""
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(10)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
