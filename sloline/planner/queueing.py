"""One stage's centralized batched queue, simulated: the estimator's inner loop (§4.2).

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

from dataclasses import dataclass, field

import numba
import numpy as np
import numpy.typing as npt

__all__ = ["ServiceDraws", "StageRun", "serve"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


_NO_IDLE = np.zeros((2, 1), dtype=np.float64)


@dataclass(frozen=True, slots=True, eq=False)
class ServiceDraws:
    """How long each batch occupies a replica: ``table_s[k, j]`` is a service time of a
    batch of k; the b-th batch dispatched uses column ``cols[b]`` (0 when ``cols`` is
    empty) times ``scales[b]`` (1 when empty), plus ``hop_s``, plus the idle penalty
    ``idle_s`` (``[2, K]``: gaps from 0, extra times from 0, see
    :meth:`~sloline.planner.profile.IdlePenalty.table`) for the time its worker was idle."""

    table_s: FloatArray  # [max_batch + 1, J], C-contiguous
    cols: IntArray  # [>= number of batches] or empty
    scales: FloatArray  # [>= number of batches] or empty
    hop_s: float
    idle_s: FloatArray = field(default_factory=lambda: _NO_IDLE)

    def time_s(self, batch_index: int, size: int, idle_gap_s: float = 0.0) -> float:
        """Occupancy of the ``batch_index``-th batch, of ``size`` items, its worker idle for
        ``idle_gap_s`` before it (same arithmetic as the compiled loop, so both give
        bit-identical times)."""
        col = int(self.cols[batch_index]) if self.cols.size else 0
        service = float(self.table_s[size, col])
        if self.scales.size:
            service = service * float(self.scales[batch_index])
        return service + self.hop_s + idle_penalty(self.idle_s, idle_gap_s)


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


@numba.njit(cache=True, nogil=True)
def idle_penalty(idle: FloatArray, gap: float) -> float:
    """The idle penalty after ``gap`` seconds: linear between the table's points, the last
    value beyond them (``idle[0]`` gaps from 0, ``idle[1]`` extra times from 0)."""
    last = idle.shape[1] - 1
    for j in range(1, last + 1):
        if gap < idle[0, j]:
            weight = (gap - idle[0, j - 1]) / (idle[0, j] - idle[0, j - 1])
            return float(idle[1, j - 1] + (idle[1, j] - idle[1, j - 1]) * weight)
    return float(idle[1, last])


_SIGNATURE = numba.types.Tuple((numba.int64, numba.float64))(  # type: ignore[no-untyped-call]
    _input(numba.float64, 1),  # ready times, sorted
    numba.int64,  # max batch
    numba.int64,  # replicas
    _input(numba.float64, 2),  # service table
    _input(numba.int64, 1),  # per-batch column
    _input(numba.float64, 1),  # per-batch scale
    numba.float64,  # hop overhead
    _input(numba.float64, 2),  # idle penalty table
    numba.float64[::1],  # out: completion per item
)


@numba.njit(_SIGNATURE, cache=True, nogil=True)
def _serve(
    ready: FloatArray,
    max_batch: int,
    replicas: int,
    table: FloatArray,
    cols: IntArray,
    scales: FloatArray,
    hop: float,
    idle: FloatArray,
    done: FloatArray,
) -> tuple[int, float]:
    n = ready.shape[0]
    free = np.full(replicas, -np.inf)  # min-heap of replica free times
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
            avail = max(avail, i + 1)
            limit = min(i + max_batch, n)
            while avail < limit and ready[avail] <= start:
                avail += 1
            k = avail - i
        col = cols[batches] if cols.shape[0] else 0
        service = table[k, col]
        if scales.shape[0]:
            service = service * scales[batches]
        # The worker waited from its last model time (half a hop before the replica
        # freed) to this one's (half a hop after the dispatch).
        service = service + hop + idle_penalty(idle, start - first_free + hop)
        end = start + service
        busy += service
        done[i : i + k] = end
        # Replace the heap root (the replica just used) with its new free time.
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
        replicas,
        np.ascontiguousarray(service.table_s, dtype=np.float64),
        np.ascontiguousarray(service.cols, dtype=np.int64),
        np.ascontiguousarray(service.scales, dtype=np.float64),
        float(service.hop_s),
        np.ascontiguousarray(service.idle_s, dtype=np.float64),
        done,
    )
    return StageRun(done, int(batches), float(busy))
