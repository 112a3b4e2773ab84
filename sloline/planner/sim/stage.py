"""One stage's centralized batched queue, simulated by batches: the estimator's inner loop
(§4.2).

A stage is a FIFO queue served by ``replicas`` identical replicas with the router's pull
dispatch: whenever a replica is idle and the queue is non-empty it takes
``min(queue length, max_batch)`` items at once and is busy for the batch's service time
plus the hop overhead (the worker holds its batch until the router has its results). A
batch that starts on a replica which sat idle also pays the profile's idle penalty for
the time its worker waited: from the end of its previous batch's model time to the start
of this one's, i.e. the replica's idle time plus one hop (half on each side).

Because queues are FIFO and nothing pushes back upstream, a stage's behaviour depends only
on the times its items become ready. Given those times sorted, the stage is one pass over
*batches*: the replica that frees first takes the next batch, starting at
``max(free time, next ready time)``. Ties follow the router: items ready at the same instant
are pushed one at a time in sequence order and each push dispatches at once, so an idle
replica takes a lone item; a replica freeing at time t sees every item ready at or before t.
``tests/unit/planner/test_equivalence.py`` checks this against a global event-heap simulation.

The loop is compiled with numba (eagerly, cached on disk): one hour at 100 rps is ~360 k
items per stage, and the planner runs the estimator thousands of times. docs/planner.md has
the measurements behind the choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt

from sloline.planner.sim.draws import ServiceDraws
from sloline.planner.sim.rule import batch_service, eager, idle_penalty, kernel

__all__ = ["StageRun", "serve"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True, eq=False)
class StageRun:
    """Result of serving one stage: completion time per item (in ready order), the number
    of batches and the total replica busy time."""

    done_s: FloatArray
    batches: int
    busy_s: float


def _input(dtype: numba.types.Type, ndim: int) -> numba.types.Array:
    # Read-only in the signature so that frozen (read-only) arrays are accepted too.
    return numba.types.Array(dtype, ndim, "C", readonly=True)


@kernel
def _batch_size(ready: FloatArray, i: int, avail: int, max_batch: int, start: float) -> int:
    """How many items, from the i-th, a replica freeing at ``start`` takes (every item
    ready by then, up to ``max_batch``); ``avail``: items known to be ready already."""
    avail = max(avail, i + 1)
    limit = min(i + max_batch, ready.shape[0])
    while avail < limit and ready[avail] <= start:
        avail += 1
    return avail - i


@kernel
def _replace_first(free: FloatArray, end: float) -> None:
    """Replace the root of the min-heap of replica free times (the replica just used)
    with its new free time."""
    replicas = free.shape[0]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= replicas:
            break
        if child + 1 < replicas and free[child + 1] < free[child]:
            child += 1
        if free[child] >= end:
            break
        free[pos] = free[child]
        pos = child
    free[pos] = end


_SIGNATURE = numba.types.Tuple((numba.int64, numba.float64))(  # type: ignore[no-untyped-call]
    _input(numba.float64, 1),  # ready times, sorted
    numba.int64,  # max batch
    _input(numba.float64, 3),  # service table [1, max_batch + 1, J]
    _input(numba.int64, 2),  # per-batch column [1, batches or 0]
    _input(numba.float64, 2),  # per-batch scale [1, batches or 0]
    numba.float64,  # hop overhead
    _input(numba.float64, 3),  # idle penalty table [1, 2, K]
    numba.float64[::1],  # scratch: min-heap of replica free times, all -inf
    numba.float64[::1],  # out: completion per item
)


@eager(_SIGNATURE)
def _serve(
    ready: FloatArray,
    max_batch: int,
    table: FloatArray,  # one stage's, as batch_service() takes them
    cols: IntArray,
    scales: FloatArray,
    hop: float,
    idle: FloatArray,
    free: FloatArray,
    done: FloatArray,
) -> tuple[int, float]:
    n = ready.shape[0]
    i = 0
    avail = 0  # items [i, avail) are known to be ready by the current start
    batches = 0
    busy = 0.0
    while i < n:
        first_free = free[0]
        if first_free < ready[i]:
            start = ready[i]  # an idle replica takes the item the moment it is pushed
            k = 1
        else:
            start = first_free  # the replica frees with a queue: it takes what is there
            k = _batch_size(ready, i, avail, max_batch, start)
            avail = i + k
        # The worker waited from its last model time (half a hop before the replica
        # freed) to this one's (half a hop after the dispatch).
        service = batch_service(table, cols, scales, 0, batches, k)
        service = service + hop + idle_penalty(idle, 0, start - first_free + hop)
        end = start + service
        busy += service
        done[i : i + k] = end
        _replace_first(free, end)
        i += k
        batches += 1
    return batches, busy


def serve(ready_s: FloatArray, max_batch: int, replicas: int, service: ServiceDraws) -> StageRun:
    """Serve items whose ready times ``ready_s`` are sorted (ties in sequence order)."""
    if max_batch < 1 or replicas < 1:
        raise ValueError(f"max_batch and replicas must be >= 1, got {max_batch}, {replicas}")
    if service.table_s.shape[0] <= max_batch:
        raise ValueError(f"service table covers batches up to {service.table_s.shape[0] - 1}")
    done = np.empty(ready_s.shape[0], dtype=np.float64)
    batches, busy = _serve(
        np.ascontiguousarray(ready_s, dtype=np.float64),
        max_batch,
        np.ascontiguousarray(service.table_s, dtype=np.float64)[None],
        np.ascontiguousarray(service.cols, dtype=np.int64)[None],
        np.ascontiguousarray(service.scales, dtype=np.float64)[None],
        float(service.hop_s),
        np.ascontiguousarray(service.idle_s, dtype=np.float64)[None],
        np.full(replicas, -np.inf),
        done,
    )
    return StageRun(done, int(batches), float(busy))
