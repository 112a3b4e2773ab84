"""The compiled queues of the routed pipeline simulation: a FIFO server's jobs (the router,
a co-located client) and the heap of timed events.

Each is a structured array of entries plus a one-element structured array of its scalars
(its header), so that compiled functions change it in place by field name.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from sloline.planner.sim.rule import inlined

__all__ = ["EVENT", "HEAP", "JOB", "QUEUE", "fifo_pop", "fifo_push", "heap_pop", "heap_push"]

Records = npt.NDArray[np.void]

JOB = np.dtype([("kind", np.int64), ("ref", np.int64), ("cost", np.float64)])
# A FIFO server's header: its head job, how many are queued, when the head one ends in the
# server's virtual time (CPU seconds at full speed).
QUEUE = np.dtype([("head", np.int64), ("size", np.int64), ("vend", np.float64)])
EVENT = np.dtype([("t", np.float64), ("seq", np.int64), ("kind", np.int64), ("ref", np.int64)])
HEAP = np.dtype([("size", np.int64), ("next_seq", np.int64)])


@inlined
def fifo_push(jobs: Records, queue: Records, vnow: float, kind: int, ref: int, cost: float) -> None:
    """Queue a job (``cost`` CPU seconds) at virtual time ``vnow``; an idle server starts
    it at once."""
    q = queue[0]
    job = jobs[(q.head + q.size) % jobs.shape[0]]
    job.kind, job.ref, job.cost = kind, ref, cost
    if q.size == 0:
        q.vend = vnow + cost
    q.size += 1


@inlined
def fifo_pop(jobs: Records, queue: Records, vnow: float) -> tuple[int, int]:
    """The head job ended at virtual time ``vnow``: remove it (returns its kind and ref);
    the next one starts."""
    q = queue[0]
    job = jobs[q.head]
    kind, ref = job.kind, job.ref
    q.head = (q.head + 1) % jobs.shape[0]
    q.size -= 1
    if q.size > 0:
        q.vend = vnow + jobs[q.head].cost
    return kind, ref


@inlined
def _before(events: Records, a: int, t: float, seq: int) -> bool:
    return bool(events[a].t < t or (events[a].t == t and events[a].seq < seq))


@inlined
def _move(events: Records, src: int, dst: int) -> None:
    e, f = events[src], events[dst]
    f.t, f.seq, f.kind, f.ref = e.t, e.seq, e.kind, e.ref


@inlined
def heap_push(events: Records, heap: Records, t: float, kind: int, ref: int) -> None:
    """Push an event at time t onto the binary min-heap; ties go in push order."""
    h = heap[0]
    seq = h.next_seq
    h.next_seq += 1
    pos = h.size
    h.size += 1
    while pos > 0:
        parent = (pos - 1) // 2
        if _before(events, parent, t, seq):
            break
        _move(events, parent, pos)
        pos = parent
    e = events[pos]
    e.t, e.seq, e.kind, e.ref = t, seq, kind, ref


@inlined
def heap_pop(events: Records, heap: Records) -> tuple[int, int]:
    """Remove the earliest event; returns its kind and ref."""
    kind0, ref0 = events[0].kind, events[0].ref
    h = heap[0]
    n = h.size - 1
    h.size = n
    last = events[n]
    t, seq, kind, ref = last.t, last.seq, last.kind, last.ref
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= n:
            break
        right = child + 1
        if right < n and _before(events, right, events[child].t, events[child].seq):
            child = right
        if not _before(events, child, t, seq):
            break
        _move(events, child, pos)
        pos = child
    e = events[pos]
    e.t, e.seq, e.kind, e.ref = t, seq, kind, ref
    return kind0, ref0
