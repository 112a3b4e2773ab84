"""The router's dispatch rule, as the compiled functions every simulation of it shares.

- a batch of k items occupies its replica for its service time (:func:`batch_service`:
  the profile's table, the batch's drawn column and scale), the hop, and the idle penalty
  for the time its worker sat idle (:func:`idle_penalty`);
- a stage becomes ready for a query when every stage it depends on is done for it; a
  stage the query does not visit is done at once, and so on down the graph
  (:func:`release`).

The stage kernel (:mod:`sloline.planner.sim.stage`) and the routed pipeline
(:mod:`sloline.planner.sim.pipeline`) call them compiled; the lab's closed-loop engine calls
them from Python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt

from sloline.planner.topology import Topology

__all__ = [
    "batch_service",
    "dependants",
    "eager",
    "idle_penalty",
    "inlined",
    "kernel",
    "release",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_F = TypeVar("_F", bound=Callable[..., Any])

# numba's reference counting off (its private ``_nrt`` option). With it, every array a
# compiled helper is handed costs two atomic operations, which made the routed pipeline's
# loop, written as small functions, run at half the speed of the same loop in one piece;
# without it the loop runs several times faster (benchmarks/estimator_speed.py). The
# price: a kernel cannot create arrays, its Python caller allocates them.
NO_REFCOUNT: dict[str, Any] = {"_nrt": False}


def kernel(fn: _F) -> _F:
    """Compile ``fn`` as the simulations' functions are: nopython, cached on disk, without
    the GIL and without reference counting (arrays come from the caller)."""
    return cast(_F, numba.njit(cache=True, nogil=True, **NO_REFCOUNT)(fn))


def eager(signature: Any) -> Callable[[_F], _F]:
    """:func:`kernel` with one signature: compiled, or loaded from numba's cache, when its
    module is imported, so that no call pays for it."""
    return cast(Callable[[_F], _F], numba.njit(signature, cache=True, nogil=True, **NO_REFCOUNT))


def inlined(fn: _F) -> _F:
    """:func:`kernel`, inlined into its compiled callers (the event handlers: their loop
    runs twice as fast with them inlined)."""
    return cast(_F, numba.njit(cache=True, nogil=True, inline="always", **NO_REFCOUNT)(fn))


@kernel
def idle_penalty(idle: FloatArray, m: int, gap: float) -> float:
    """Stage (or server) m's idle penalty after ``gap`` seconds: linear between the table's
    points, the last value beyond them (``idle[m, 0]`` gaps from 0, ``idle[m, 1]`` extra
    times from 0)."""
    last = idle.shape[2] - 1
    for j in range(1, last + 1):
        if gap < idle[m, 0, j]:
            weight = (gap - idle[m, 0, j - 1]) / (idle[m, 0, j] - idle[m, 0, j - 1])
            return float(idle[m, 1, j - 1] + (idle[m, 1, j] - idle[m, 1, j - 1]) * weight)
    return float(idle[m, 1, last])


@kernel
def batch_service(
    tables: FloatArray, cols: IntArray, scales: FloatArray, m: int, batch: int, size: int
) -> float:
    """Service time of stage m's ``batch``-th batch, of ``size`` items: ``tables[m, size,
    j]`` with j the batch's column ``cols[m, batch]`` (0 when ``cols`` has no columns),
    times its scale ``scales[m, batch]`` (1 when ``scales`` has none)."""
    col = cols[m, batch] if cols.shape[1] else 0
    service = tables[m, size, col]
    if scales.shape[1]:
        service = service * scales[m, batch]
    return float(service)


@kernel
def release(
    q: int,
    done: int,
    pending: npt.NDArray[np.int32],
    visits: npt.NDArray[np.bool_],
    child_ptr: IntArray,
    child_idx: IntArray,
    n_deps: IntArray,
    output: int,
    stack: IntArray,
    ready: IntArray,
) -> int:
    """Stage ``done`` is done for query q, or (``done = -1``) q just arrived. Writes into
    ``ready``, in the order the router acts on them, the stages q is now queued at, and -1
    when the output stage is done (q is answered); returns how many.

    ``pending[q * M + c]``: how many of stage c's dependencies q still waits on (counted
    down here); ``visits[q * M + c]``: q runs stage c; the stages waiting on stage m are
    ``child_idx[child_ptr[m]:child_ptr[m + 1]]``; ``stack``: scratch of M entries. Stages
    without dependencies come first, in stage order, then the skipped ones' dependants."""
    n_stages = n_deps.shape[0]
    base = q * n_stages
    sp = 0
    count = 0
    if done >= 0:
        stack[0] = done
        sp = 1
    else:
        for c in range(n_stages):
            if n_deps[c] == 0:
                if visits[base + c]:
                    ready[count] = c
                    count += 1
                else:
                    stack[sp] = c
                    sp += 1
    while sp > 0:
        sp -= 1
        m = stack[sp]
        if m == output:
            ready[count] = -1
            count += 1
        for e in range(child_ptr[m], child_ptr[m + 1]):
            c = child_idx[e]
            pending[base + c] -= 1
            if pending[base + c] == 0:
                if visits[base + c]:
                    ready[count] = c
                    count += 1
                else:
                    stack[sp] = c
                    sp += 1
    return count


def dependants(topology: Topology) -> tuple[IntArray, IntArray]:
    """The stages waiting on each stage, as :func:`release` takes them: those on stage m
    are ``child_idx[child_ptr[m]:child_ptr[m + 1]]``, in stage order."""
    children: list[list[int]] = [[] for _ in range(len(topology))]
    for m, deps in enumerate(topology.deps):
        for dep in deps:
            children[dep].append(m)
    child_ptr = np.zeros(len(topology) + 1, dtype=np.int64)
    child_ptr[1:] = np.cumsum([len(c) for c in children])
    return child_ptr, np.array([c for cs in children for c in cs], dtype=np.int64)
