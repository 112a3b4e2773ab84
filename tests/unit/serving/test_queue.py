"""Property tests of the centralized batched queue: FIFO, batches never exceed max_batch,
every item leaves exactly once, a dead worker's batch is retried once at the head."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloline.serving.queue import QueueFull, StageQueue, Step, WorkItem

ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 3)),
        st.tuples(st.just("add"), st.integers(0, 3)),
        st.tuples(st.just("done"), st.integers(0, 3)),
        st.tuples(st.just("kill"), st.integers(0, 3)),
        st.tuples(st.just("tick"), st.integers(1, 5)),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, max_batch=st.integers(1, 5), deadline_span=st.integers(3, 50))
def test_random_interleavings(  # noqa: C901 - one branch per random operation
    ops: list[tuple[str, int]], max_batch: int, deadline_span: int
) -> None:
    q = StageQueue("s", max_batch=max_batch, capacity=1000)
    now = 0.0
    pushed: list[WorkItem] = []
    outcomes: dict[int, str] = {}  # id(item) -> how it left
    held: dict[int, tuple[int, list[WorkItem]]] = {}
    dispatched_order: list[int] = []

    def apply(step: Step) -> None:
        for d in step.dispatches:
            assert 1 <= len(d.items) <= max_batch
            assert d.worker not in held
            held[int(str(d.worker))] = (d.batch_id, d.items)
            dispatched_order.extend(i.request for i in d.items if i.attempts == 1)
        for kind, items in (
            ("done", step.completed),
            ("expired", step.expired),
            ("failed", step.failed),
        ):
            for item in items:
                assert id(item) not in outcomes, "item left the queue twice"
                outcomes[id(item)] = kind

    workers: set[int] = set()
    for op, arg in ops:
        if op == "push":
            item = WorkItem(len(pushed), {}, deadline=now + deadline_span)
            pushed.append(item)
            apply(q.push(item, now))
        elif op == "add" and arg not in workers:
            workers.add(arg)
            apply(q.add_worker(str(arg), now))
        elif op == "done" and arg in held:
            batch_id, _ = held.pop(arg)
            apply(q.worker_done(str(arg), batch_id, now))
        elif op == "kill" and arg in workers:
            workers.discard(arg)
            held.pop(arg, None)
            apply(q.remove_worker(str(arg), now))
        elif op == "tick":
            now += arg
            apply(q.cancel_expired(now))
    # Drain: finish held batches, add a worker, expire nothing, complete everything.
    for w in list(held):
        batch_id, _ = held.pop(w)
        apply(q.worker_done(str(w), batch_id, now))
    if not workers:
        workers.add(99)
        apply(q.add_worker("99", now))
    while held or len(q):
        for w in list(held):
            batch_id, _ = held.pop(w)
            apply(q.worker_done(str(w), batch_id, now))
    assert len(outcomes) == len(pushed), "every item leaves exactly once"
    # FIFO: first dispatches happen in push order.
    assert dispatched_order == sorted(dispatched_order)
    for item in pushed:
        assert item.attempts <= 2


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
    assert step.failed == [a], "second death fails the item explicitly"
    assert len(q) == 2  # b (first death) and c remain


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
