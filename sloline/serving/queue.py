"""The centralized batched queue of one stage (InferLine §3; Clipper's batching queue).

FIFO; whenever a worker is idle (it holds one credit) and work is queued, the worker gets
`min(queue length, max_batch)` items at once. This is exactly what the estimator
simulates, so planned latencies hold in production. The queue is a synchronous state
machine with no I/O: every call takes `now` and returns what to do (batches to send,
items that expired or failed), and the router performs it. Every pushed item leaves the
queue exactly once: in a completed batch, expired (deadline passed or request cancelled),
or failed (a worker died holding it alone in its batch, `max_attempts` deaths or more).

Poison isolation. When a worker dies, the items of its batch go back to the head of the
FIFO in order (a worker also dies for reasons of its own: OOM, kill -9), and the next
idle worker takes its usual batch from there. When a worker dies holding a batch again -
some item in it has now been held by `max_attempts` dead workers - the batch is split in
two and each half becomes an isolation batch: dispatched alone, as it is, ahead of the
FIFO, to any idle worker. A half that dies again is split again, recursively, until the
item that kills its workers dies alone in a batch: only that item fails, and its
batch-mates complete. An item is held by at most ``max_attempts +
ceil(log2(max_batch))`` dead workers (5 at max batch 8).

Many routers. A worker that serves several routers still holds one credit in total. Here
it is idle (the credit is parked here), busy (it holds a batch of ours) or on standby
(its credit is at another router). A standby worker is told when work is queued here
(`Step.notify`, once per stretch of non-empty queue, and at once when it joins or turns
standby while work is queued) and may `grant` its credit; an idle one may `withdraw` it
(`Step.released`; a busy one is not affected: its batch is served). A worker returning
a batch while it knows of older work elsewhere (`elsewhere_age_s`) stays idle here only
if this queue's head has waited at least that long, else it turns standby and is
released. With one router no worker is ever on standby and none of this happens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from sloline.common.tensors import Tensor


class QueueFull(Exception):
    """The stage queue is at capacity; the caller sheds the request (503)."""


@dataclass(slots=True, eq=False)
class WorkItem:
    """One request's visit to one stage."""

    request: Any  # opaque to the queue: the router's per-request state
    inputs: dict[str, Tensor]
    deadline: float
    enqueued_at: float = 0.0
    attempts: int = 0  # times handed to a worker (= dead workers that held it, once it dies)
    cancelled: bool = False  # its request already failed or finished elsewhere


@dataclass(frozen=True, slots=True)
class Dispatch:
    worker: Hashable
    batch_id: int
    items: list[WorkItem]


@dataclass(slots=True)
class Step:
    """What a queue operation asks the caller to do."""

    dispatches: list[Dispatch] = field(default_factory=list)
    expired: list[WorkItem] = field(default_factory=list)  # fail with DeadlineExceeded
    # fail: a worker died holding it alone in its batch, its `attempts`-th death
    failed: list[WorkItem] = field(default_factory=list)
    completed: list[WorkItem] = field(default_factory=list)  # deliver results
    # workers whose credit this queue no longer holds (tell them, with the backlog)
    released: list[Hashable] = field(default_factory=list)
    # standby workers to tell that work is queued here (module docstring, "Many routers")
    notify: list[Hashable] = field(default_factory=list)


class StageQueue:
    """FIFO batched queue with credit-based pull dispatch to workers."""

    def __init__(self, stage: str, *, max_batch: int, capacity: int, max_attempts: int = 2):
        if max_batch < 1 or capacity < 1:
            raise ValueError("max_batch and capacity must be at least 1")
        self.stage = stage
        self.max_batch = max_batch
        self.capacity = capacity
        self.max_attempts = max_attempts
        self._items: deque[WorkItem] = deque()
        # Halves of batches whose workers died repeatedly: each goes to a worker alone, as
        # it is, before the FIFO's work (module docstring, "Poison isolation").
        self._isolating: deque[list[WorkItem]] = deque()
        self._idle: deque[Hashable] = deque()  # workers holding a credit, longest idle first
        self._busy: dict[Hashable, Dispatch] = {}
        self._draining: set[Hashable] = set()
        # Connected workers whose credit is at another router, in joining order.
        self._standby: dict[Hashable, None] = {}
        self._announced = False  # standby workers were told of the current backlog
        # Each worker's batch limit: `max_batch` when it joined. A re-planned stage changes
        # `max_batch` for the workers of its new configuration; the old ones keep theirs.
        self._limits: dict[Hashable, int] = {}
        self._batch_ids = count(1)

    def __len__(self) -> int:
        return len(self._items) + sum(map(len, self._isolating))

    @property
    def isolating(self) -> int:
        """Items waiting in isolation batches (already counted in `len`)."""
        return sum(map(len, self._isolating))

    @property
    def workers(self) -> int:
        return len(self._idle) + len(self._busy) + len(self._standby)

    @property
    def busy_workers(self) -> int:
        return len(self._busy)

    @property
    def standby_workers(self) -> int:
        """Connected workers whose credit is at another router (serving it, or about to)."""
        return len(self._standby)

    def in_flight(self) -> int:
        return sum(len(d.items) for d in self._busy.values())

    def push(self, item: WorkItem, now: float) -> Step:
        if len(self) >= self.capacity:
            raise QueueFull(f"stage {self.stage!r} queue is full ({self.capacity} items)")
        item.enqueued_at = now
        self._items.append(item)
        return self._dispatch(now, Step())

    def head_age(self, now: float) -> float | None:
        """How long the oldest queued item has waited; None when nothing is queued."""
        heads = [group[0].enqueued_at for group in self._isolating if group]
        if self._items:
            heads.append(self._items[0].enqueued_at)
        return now - min(heads) if heads else None

    def add_worker(self, worker: Hashable, now: float, *, standby: bool = False) -> Step:
        """A worker connected (or reconnected): idle, or on standby when its credit is at
        another router (then it is told at once if work is queued)."""
        if worker in self._busy or worker in self._idle or worker in self._standby:
            raise ValueError(f"worker {worker!r} is already registered on {self.stage!r}")
        self._draining.discard(worker)
        self._limits[worker] = self.max_batch
        if standby:
            self._standby[worker] = None
            step = Step()
            if len(self):
                step.notify.append(worker)
            return step
        self._idle.append(worker)
        return self._dispatch(now, Step())

    def grant(self, worker: Hashable, now: float) -> Step:
        """A standby worker gives this queue its credit: it is idle here now."""
        if worker not in self._standby:
            return Step()  # not ours to take (a protocol slip): ignore it
        del self._standby[worker]
        self._idle.append(worker)
        return self._dispatch(now, Step())

    def withdraw(self, worker: Hashable) -> Step:
        """An idle worker takes its credit back (`Step.released`); a busy one keeps its
        batch (the withdrawal crossed it and is void)."""
        step = Step()
        if worker in self._idle:
            self._idle.remove(worker)
            self._standby[worker] = None
            step.released.append(worker)
        return step

    def worker_done(
        self, worker: Hashable, batch_id: int, now: float, elsewhere_age_s: float | None = None
    ) -> Step:
        """The worker returned the results of `batch_id`; it is idle again unless draining,
        or unless it knows of work elsewhere that has waited longer than this queue's head
        (`elsewhere_age_s`): then it is released to standby."""
        dispatch = self._busy.get(worker)
        if dispatch is None or dispatch.batch_id != batch_id:
            raise KeyError(f"worker {worker!r} holds no batch {batch_id} on {self.stage!r}")
        del self._busy[worker]
        step = Step(completed=dispatch.items)
        if worker in self._draining:
            pass
        elif elsewhere_age_s is None:
            self._idle.append(worker)
        else:
            head_age = self.head_age(now)
            if head_age is not None and head_age >= elsewhere_age_s:
                self._idle.append(worker)
            else:
                self._standby[worker] = None
                step.released.append(worker)
        return self._dispatch(now, step)

    def drain_worker(self, worker: Hashable) -> bool:
        """The worker is leaving: it finishes its batch but gets no new one. Returns True
        when it holds no batch, so it can be let go now."""
        self._draining.add(worker)
        self._standby.pop(worker, None)
        if worker in self._idle:
            self._idle.remove(worker)
        return worker not in self._busy

    def draining(self, worker: Hashable) -> bool:
        return worker in self._draining

    def remove_worker(self, worker: Hashable, now: float) -> Step:
        """The worker is gone. The first time a worker dies holding an item, the item goes
        back to the head of the FIFO in order. A batch holding an item that has now died
        `max_attempts` times is split into two isolation batches; such an item alone in
        its batch fails instead (module docstring, "Poison isolation")."""
        self._draining.discard(worker)
        self._limits.pop(worker, None)
        self._standby.pop(worker, None)
        if worker in self._idle:
            self._idle.remove(worker)
        step = Step()
        dispatch = self._busy.pop(worker, None)
        if dispatch is not None:
            live: list[WorkItem] = []
            for item in dispatch.items:
                (step.expired if item.cancelled else live).append(item)
            if any(item.attempts >= self.max_attempts for item in live):
                if len(dispatch.items) == 1:  # alone in its batch: it killed the worker
                    step.failed.extend(live)
                elif len(live) == 1:  # its batch-mates left; one of them may be the poison
                    self._isolating.appendleft(live)
                else:
                    half = (len(live) + 1) // 2
                    self._isolating.extendleft((live[half:], live[:half]))
            else:
                self._items.extendleft(reversed(live))
        return self._dispatch(now, step)

    def cancel_expired(self, now: float) -> Step:
        """Drop queued items whose deadline passed or whose request is gone."""
        step = Step()
        if any(i.cancelled or i.deadline <= now for i in self._items):
            keep: deque[WorkItem] = deque()
            for item in self._items:
                (step.expired if item.cancelled or item.deadline <= now else keep).append(item)
            self._items = keep
        if self._isolating:
            groups: deque[list[WorkItem]] = deque()
            for group in self._isolating:
                live = _live(group, now, step)
                if live:
                    groups.append(live)
            self._isolating = groups
        if not self._items and not self._isolating:
            self._announced = False
        return step

    def _dispatch(self, now: float, step: Step) -> Step:
        isolating = self._isolating
        while self._idle and isolating:
            batch = _live(isolating.popleft(), now, step)
            limit = self._limits.get(self._idle[0], self.max_batch)
            if len(batch) > limit:  # a worker of a smaller re-planned batch: take a part
                isolating.appendleft(batch[limit:])
                batch = batch[:limit]
            if batch:
                self._send(batch, step)
        items = self._items
        while self._idle and items:
            batch = []
            limit = self._limits.get(self._idle[0], self.max_batch)
            while items and len(batch) < limit:
                item = items.popleft()
                if item.cancelled or item.deadline <= now:
                    step.expired.append(item)
                    continue
                batch.append(item)
            if batch:
                self._send(batch, step)
        if not items and not isolating:
            self._announced = False
        elif self._standby and not self._announced:
            self._announced = True
            step.notify.extend(self._standby)
        return step

    def _send(self, batch: list[WorkItem], step: Step) -> None:
        for item in batch:
            item.attempts += 1
        worker = self._idle.popleft()
        dispatch = Dispatch(worker, next(self._batch_ids), batch)
        self._busy[worker] = dispatch
        step.dispatches.append(dispatch)


def _live(group: list[WorkItem], now: float, step: Step) -> list[WorkItem]:
    """The items of `group` still wanted; the others go to `step.expired`."""
    live: list[WorkItem] = []
    for item in group:
        (step.expired if item.cancelled or item.deadline <= now else live).append(item)
    return live
