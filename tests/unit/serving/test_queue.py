"""Property tests of the centralized batched queue: FIFO, batches never exceed max_batch,
every item leaves exactly once, a dead worker's batch is retried at the head, and a batch
whose workers keep dying is split until the request that kills them is alone."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import count

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloline.serving.queue import Dispatch, QueueFull, StageQueue, Step, WorkItem

ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 3)),  # 0: a poison request
        st.tuples(st.just("add"), st.integers(0, 3)),
        st.tuples(st.just("done"), st.integers(0, 3)),  # a poison kills its worker instead
        st.tuples(st.just("kill"), st.integers(0, 3)),  # a death of the worker's own
        st.tuples(st.just("cancel"), st.integers(0, 1000)),
        st.tuples(st.just("tick"), st.integers(1, 5)),
    ),
    min_size=30,
    max_size=200,
)


@dataclass
class Model:
    """What the test saw happen to each item (keyed by `request`, the push index)."""

    max_batch: int
    poison: set[int] = field(default_factory=set)
    outcomes: dict[int, str] = field(default_factory=dict)  # how it left
    deaths: dict[int, int] = field(default_factory=dict)  # dead workers that held it
    last_dead: dict[int, list[int]] = field(default_factory=dict)  # the batch it died in
    held: dict[int, tuple[int, list[WorkItem]]] = field(default_factory=dict)
    workers: set[int] = field(default_factory=set)  # connected
    first_dispatches: list[int] = field(default_factory=list)

    def apply(self, step: Step, died: list[WorkItem] | None = None, poison: bool = False) -> None:
        """Check `step`; `died` is the batch of the worker whose death produced it."""
        for d in step.dispatches:
            assert 1 <= len(d.items) <= self.max_batch
            assert int(str(d.worker)) not in self.held
            self.held[int(str(d.worker))] = (d.batch_id, d.items)
            self.first_dispatches.extend(i.request for i in d.items if i.attempts == 1)
            isolated = [i.request for i in d.items if self.deaths.get(i.request, 0) >= 2]
            if isolated:  # an isolation batch: a part of the batch that died, alone
                dead = self.last_dead[isolated[0]]
                assert {i.request for i in d.items} <= set(dead), (d.items, dead)
                assert len(d.items) <= math.ceil(len(dead) / 2)
        for kind, items in (
            ("done", step.completed),
            ("expired", step.expired),
            ("failed", step.failed),
        ):
            for item in items:
                assert item.request not in self.outcomes, "item left the queue twice"
                self.outcomes[item.request] = kind
        for item in step.failed:
            # It fails only alone in its batch, the worker's death being its 2nd or later.
            assert died == [item] and item.attempts >= 2, (died, item)
            if poison:
                assert item.request in self.poison, "an innocent request failed for poison"

    def kill(self, q: StageQueue, worker: int, now: float, *, poison: bool = False) -> None:
        self.workers.discard(worker)
        _, batch = self.held.pop(worker, (0, []))
        for item in batch:
            self.deaths[item.request] = self.deaths.get(item.request, 0) + 1
            self.last_dead[item.request] = [i.request for i in batch]
        self.apply(q.remove_worker(str(worker), now), batch, poison)

    def finish(self, q: StageQueue, worker: int, now: float) -> None:
        """The worker returns its batch, or dies if the batch holds a poison request."""
        batch_id, batch = self.held[worker]
        if any(i.request in self.poison and not i.cancelled for i in batch):
            self.kill(q, worker, now, poison=True)
        else:
            del self.held[worker]
            self.apply(q.worker_done(str(worker), batch_id, now))


@settings(max_examples=400, deadline=None)
@given(
    ops=ops,
    max_batch=st.integers(1, 8),
    deadline_span=st.integers(3, 50),
    kills=st.booleans(),
)
def test_random_interleavings(  # noqa: PLR0912 - a branch per random operation
    ops: list[tuple[str, int]], max_batch: int, deadline_span: int, kills: bool
) -> None:
    q = StageQueue("s", max_batch=max_batch, capacity=1000)
    m = Model(max_batch)
    now = 0.0
    pushed: list[WorkItem] = []
    workers = m.workers
    for op, arg in ops:
        if op == "push":
            item = WorkItem(len(pushed), {}, deadline=now + deadline_span)
            if arg == 0:
                m.poison.add(item.request)
            pushed.append(item)
            m.apply(q.push(item, now))
        elif op == "add" and arg not in workers:
            workers.add(arg)
            m.apply(q.add_worker(str(arg), now))
        elif op == "done" and arg in m.held:
            m.finish(q, arg, now)
        elif op == "kill" and kills and arg in workers:
            m.kill(q, arg, now)
        elif op == "cancel" and pushed:
            pushed[arg % len(pushed)].cancelled = True  # its request failed elsewhere
        elif op == "tick":
            now += arg
            m.apply(q.cancel_expired(now))
        # Work-conserving: no worker idles while work waits, isolation batches included.
        assert q.workers == q.busy_workers or len(q) == 0
    # Drain: a worker (re)joins whenever none is left; poison keeps killing workers.
    spare = 100
    while m.held or len(q):
        if not workers:
            workers.add(spare)
            m.apply(q.add_worker(str(spare), now))
            spare += 1
        for w in list(m.held):
            m.finish(q, w, now)
    assert len(m.outcomes) == len(pushed), "every item leaves exactly once"
    assert q.in_flight() == 0 and len(q) == 0 and q.isolating == 0
    # FIFO: first dispatches happen in push order.
    assert m.first_dispatches == sorted(m.first_dispatches)
    bound = 2 + math.ceil(math.log2(max_batch))
    for item in pushed:
        assert item.attempts <= bound, (item, bound)
        dispatched = item.attempts > 0
        if not kills and not item.cancelled and dispatched:
            # Only poison kills workers: innocents complete, poison fails, unless late.
            want = "failed" if item.request in m.poison else "done"
            assert m.outcomes[item.request] in (want, "expired"), (item, m.outcomes)


def test_idle_worker_takes_min_of_queue_and_max_batch() -> None:
    q = StageQueue("s", max_batch=3, capacity=10)
    items = [WorkItem(i, {}, deadline=100) for i in range(5)]
    for item in items:
        assert q.push(item, 0).dispatches == []
    step = q.add_worker("w", 0)
    assert [i.request for i in step.dispatches[0].items] == [0, 1, 2]
    step = q.worker_done("w", step.dispatches[0].batch_id, 1)
    assert [i.request for i in step.dispatches[0].items] == [3, 4]


def test_a_worker_keeps_the_batch_limit_it_joined_with() -> None:
    """A re-planned stage's new workers take batches of its new max batch; the workers of
    the old configuration keep theirs until they leave."""
    q = StageQueue("s", max_batch=1, capacity=20)
    for i in range(8):
        q.push(WorkItem(i, {}, deadline=100), 0)
    old = q.add_worker("old", 0).dispatches
    q.max_batch = 4
    new = q.add_worker("new", 0).dispatches
    assert [[i.request for i in d.items] for d in old + new] == [[0], [1, 2, 3, 4]]
    again = q.worker_done("old", old[0].batch_id, 1).dispatches
    assert [(d.worker, [i.request for i in d.items]) for d in again] == [("old", [5])]


def test_dead_worker_batch_requeued_at_head_then_failed() -> None:
    q = StageQueue("s", max_batch=2, capacity=10)
    a, b, c = (WorkItem(i, {}, deadline=100) for i in range(3))
    q.add_worker("w1", 0)
    first = q.push(a, 0).dispatches[0]
    q.push(b, 0)
    q.push(c, 0)
    assert first.items == [a]
    step = q.remove_worker("w1", 1)
    assert step.failed == [] and len(q) == 3
    step = q.add_worker("w2", 1)
    assert step.dispatches[0].items == [a, b], "re-queued item goes back to the head"
    step = q.remove_worker("w2", 2)
    assert step.failed == [] and q.isolating == 2, "a second death splits the batch"
    step = q.add_worker("w3", 2)
    assert step.dispatches[0].items == [a], "each half alone, ahead of the FIFO"
    step = q.remove_worker("w3", 3)
    assert step.failed == [a], "alone, it killed its worker again: it fails"
    assert [d.items for d in q.add_worker("w4", 3).dispatches] == [[b]]
    assert len(q) == 1  # c waits behind the isolation batch


def test_expired_items_never_reach_a_worker() -> None:
    q = StageQueue("s", max_batch=4, capacity=10)
    q.push(WorkItem("late", {}, deadline=1.0), 0)
    q.push(WorkItem("ok", {}, deadline=10.0), 0)
    step = q.add_worker("w", 5.0)
    assert [i.request for i in step.expired] == ["late"]
    assert [i.request for i in step.dispatches[0].items] == ["ok"]


def test_capacity_sheds() -> None:
    q = StageQueue("s", max_batch=1, capacity=2)
    q.push(WorkItem(0, {}, deadline=9), 0)
    q.push(WorkItem(1, {}, deadline=9), 0)
    with pytest.raises(QueueFull, match="full"):
        q.push(WorkItem(2, {}, deadline=9), 0)


def test_draining_worker_gets_no_new_batch() -> None:
    q = StageQueue("s", max_batch=1, capacity=5)
    q.add_worker("w", 0)
    d = q.push(WorkItem(0, {}, deadline=9), 0).dispatches[0]
    assert q.drain_worker("w") is False  # still holds a batch
    q.push(WorkItem(1, {}, deadline=9), 0)
    step = q.worker_done("w", d.batch_id, 1)
    assert step.dispatches == [] and q.draining("w")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def tick(self, s: float = 0.01) -> float:
        self.now += s
        return self.now


def run_with_poison(
    q: StageQueue, items: list[WorkItem], poison: set[int], clock: Clock, workers: int = 1
) -> tuple[dict[int, str], int]:
    """Serve `items` with `workers` workers whose process dies on any batch holding a
    poison request (and is restarted at once); how each item left, and how many died."""
    outcomes: dict[int, str] = {}
    held: dict[str, Dispatch] = {}
    deaths = 0
    spawned = count()

    def apply(step: Step) -> None:
        held.update({str(d.worker): d for d in step.dispatches})
        for kind, left in (("done", step.completed), ("expired", step.expired)):
            outcomes.update((i.request, kind) for i in left)
        outcomes.update((i.request, "failed") for i in step.failed)

    for item in items:
        apply(q.push(item, clock.now))
    for _ in range(workers):
        apply(q.add_worker(f"w{next(spawned)}", clock.now))
    while held:
        worker, d = next(iter(held.items()))
        del held[worker]
        if any(i.request in poison for i in d.items):
            deaths += 1
            apply(q.remove_worker(worker, clock.tick()))
            apply(q.add_worker(f"w{next(spawned)}", clock.tick()))
        else:
            apply(q.worker_done(worker, d.batch_id, clock.tick()))
    return outcomes, deaths


def test_a_poison_request_is_isolated_and_only_it_fails() -> None:
    clock = Clock()
    q = StageQueue("s", max_batch=8, capacity=100)
    items = [WorkItem(i, {}, deadline=100) for i in range(8)]
    outcomes, deaths = run_with_poison(q, items, {5}, clock)
    assert outcomes == {i: "failed" if i == 5 else "done" for i in range(8)}
    assert deaths == 2 + 3 == items[5].attempts  # twice whole, then 4, 2, 1 items


def test_three_poison_requests_in_a_burst_fail_alone() -> None:
    clock = Clock()
    q = StageQueue("s", max_batch=8, capacity=100)
    items = [WorkItem(i, {}, deadline=100) for i in range(40)]
    poison = {3, 4, 21}
    outcomes, deaths = run_with_poison(q, items, poison, clock, workers=2)
    assert {i for i, kind in outcomes.items() if kind == "failed"} == poison
    assert len(outcomes) == 40 and all(outcomes[i] == "done" for i in set(range(40)) - poison)
    assert all(items[i].attempts <= 5 for i in poison)
    assert deaths <= 3 * 5


def test_isolation_batches_go_before_the_fifo_to_any_idle_worker() -> None:
    q = StageQueue("s", max_batch=4, capacity=100)
    first = [WorkItem(i, {}, deadline=100) for i in range(4)]
    for item in first:
        q.push(item, 0)
    d = q.add_worker("a", 0).dispatches[0]
    q.remove_worker("a", 1)
    d = q.add_worker("b", 1).dispatches[0]
    assert d.items == first
    later = WorkItem("later", {}, deadline=100)
    q.push(later, 1)
    q.remove_worker("b", 2)
    halves = q.add_worker("c", 2).dispatches + q.add_worker("d", 2).dispatches
    assert [h.items for h in halves] == [first[:2], first[2:]]
    assert [d.items for d in q.add_worker("e", 2).dispatches] == [[later]]


def test_a_survivor_whose_batch_mates_left_is_isolated_not_failed() -> None:
    """A batch-mate whose request was cancelled may have been the one that killed the
    worker: the survivor gets a batch of its own before it can fail."""
    q = StageQueue("s", max_batch=2, capacity=10)
    a, b = WorkItem("a", {}, deadline=100), WorkItem("b", {}, deadline=100)
    q.push(a, 0)
    q.push(b, 0)
    q.add_worker("w1", 0)
    q.remove_worker("w1", 1)
    assert q.add_worker("w2", 1).dispatches[0].items == [a, b]
    b.cancelled = True
    step = q.remove_worker("w2", 2)
    assert step.expired == [b] and step.failed == [] and q.isolating == 1
    alone = q.add_worker("w3", 2).dispatches[0]
    assert alone.items == [a]
    assert q.worker_done("w3", alone.batch_id, 3).completed == [a]


def test_items_expire_while_isolated() -> None:
    q = StageQueue("s", max_batch=4, capacity=10)
    items = [WorkItem(i, {}, deadline=5.0 if i < 2 else 100) for i in range(4)]
    for item in items:
        q.push(item, 0)
    q.add_worker("w1", 0)
    q.remove_worker("w1", 1)
    q.add_worker("w2", 1)
    q.remove_worker("w2", 2)
    items[3].cancelled = True
    assert len(q) == 4 and q.isolating == 4
    step = q.cancel_expired(6.0)
    assert step.expired == [*items[:2], items[3]] and step.failed == []
    assert len(q) == 1 and [d.items for d in q.add_worker("w3", 6).dispatches] == [[items[2]]]
