"""Property tests of many routers per pipeline: every worker serves every router with one
credit in total (`StageQueue`'s standby/grant/withdraw and the worker's `CreditLedger`,
joined by message channels that deliver in order per direction, in random interleavings,
with routers and workers dying and new ones joining).

Checked: every item leaves its router exactly once (served, expired, or lost with a
router that died); a worker never holds two batches, nor its credit at two routers; a
batch reaches a worker only from the router its ledger says holds the credit; once
everything is delivered no router keeps work queued while a worker is connected to it;
a free worker takes its next batch from the router whose queue head is oldest; and with
one router no message beyond Hello, batches and results is ever sent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sloline.model_server.credit import CreditLedger
from sloline.serving.queue import StageQueue, Step, WorkItem

ROUTERS = 3
WORKERS = 3


@dataclass
class Link:
    """The two directions of one worker's stream to one router."""

    up: deque[tuple[Any, ...]] = field(default_factory=deque)  # worker -> router
    down: deque[tuple[Any, ...]] = field(default_factory=deque)  # router -> worker
    attached: bool = False  # the router has read the Hello


@dataclass
class WorkerModel:
    ledger: CreditLedger = field(default_factory=CreditLedger)
    serving: tuple[int, int, list[WorkItem]] | None = None  # router, batch id, items


class Cluster:
    def __init__(self, routers: int, max_batch: int) -> None:
        self.max_batch = max_batch
        self.queues: dict[int, StageQueue] = {}
        self.links: dict[tuple[int, int], Link] = {}
        self.workers = {w: WorkerModel() for w in range(WORKERS)}
        self.outcomes: dict[int, str] = {}
        self.queued_at: dict[int, int] = {}  # item -> its router
        self.extra_messages = 0  # backlog and credit messages
        self.served_from: list[tuple[int, int]] = []  # (worker, router) of each batch
        self.now = 0.0
        self.pushed = 0
        self.next_router = 0
        for _ in range(routers):
            self.add_router()

    # -- routers ---------------------------------------------------------------------
    def add_router(self) -> int:
        r = self.next_router
        self.next_router += 1
        self.queues[r] = StageQueue("s", max_batch=self.max_batch, capacity=10_000)
        return r

    def kill_router(self, r: int) -> None:
        q = self.queues.pop(r)
        for item in list(q._items) + [i for g in q._isolating for i in g]:
            self.leave(item, "lost")
        for dispatch in q._busy.values():
            for item in dispatch.items:
                self.leave(item, "lost")
        for w in self.workers:
            if (r, w) in self.links:
                del self.links[r, w]
                self.worker_lost(w, r)

    def kill_worker(self, w: int) -> None:
        """Worker `w` dies: every router it was connected to re-queues its batch; a new
        process takes its place with a fresh ledger."""
        for r in list(self.queues):
            link = self.links.pop((r, w), None)
            if link is not None and link.attached:
                self.perform(r, self.queues[r].remove_worker(str(w), self.now))
        self.workers[w] = WorkerModel()

    def worker_lost(self, w: int, r: int) -> None:
        model = self.workers[w]
        self.send_actions(w, model.ledger.leave(r))

    def perform(self, r: int, step: Step) -> None:
        q = self.queues[r]
        for item in step.completed:
            self.leave(item, "done")
        for item in step.expired + step.failed:
            self.leave(item, "expired")
        for d in step.dispatches:
            self.links[r, int(str(d.worker))].down.append(("batch", d.batch_id, d.items))
        head = q.head_age(self.now)
        for worker in step.released:
            self.links[r, int(str(worker))].down.append(("backlog", head, True))
            self.extra_messages += 1
        for worker in step.notify:
            if worker not in step.released and head is not None:
                self.links[r, int(str(worker))].down.append(("backlog", head, False))
                self.extra_messages += 1

    def leave(self, item: WorkItem, how: str) -> None:
        assert item.request not in self.outcomes, f"item {item.request} left twice"
        self.outcomes[item.request] = how

    def push(self, r: int, request: int, deadline: float) -> None:
        item = WorkItem(request, {}, deadline=deadline)
        self.pushed = max(self.pushed, request + 1)
        self.queued_at[request] = r
        self.perform(r, self.queues[r].push(item, self.now))

    def deliver_up(self, r: int, w: int) -> bool:
        link = self.links.get((r, w))
        if link is None or not link.up:
            return False
        kind, *rest = link.up.popleft()
        q = self.queues[r]
        if kind == "hello":
            (standby,) = rest
            link.attached = True
            link.down.append(("welcome",))
            self.perform(r, q.add_worker(str(w), self.now, standby=standby))
        elif kind == "result":
            batch_id, elsewhere = rest
            self.perform(r, q.worker_done(str(w), batch_id, self.now, elsewhere))
        elif kind == "credit":
            (grant,) = rest
            step = q.grant(str(w), self.now) if grant else q.withdraw(str(w))
            self.perform(r, step)
        return True

    # -- workers ---------------------------------------------------------------------
    def connect(self, w: int, r: int) -> None:
        if (r, w) in self.links or r not in self.queues:
            return
        standby = self.workers[w].ledger.join(r)
        self.links[r, w] = Link(up=deque([("hello", standby)]))

    def send_actions(self, w: int, actions: list[tuple[Hashable, bool]]) -> None:
        for router, grant in actions:
            link = self.links.get((int(str(router)), w))
            if link is not None:
                link.up.append(("credit", grant))
                self.extra_messages += 1

    def deliver_down(self, r: int, w: int) -> bool:
        model = self.workers[w]
        link = self.links.get((r, w))
        if link is None or not link.down or model.serving is not None:
            return False  # a worker running a batch reads nothing meanwhile
        kind, *rest = link.down.popleft()
        ledger = model.ledger
        if kind == "welcome":
            self.send_actions(w, ledger.welcomed(r))
        elif kind == "batch":
            batch_id, items = rest
            assert ledger.holder == r, "a batch from a router that does not hold the credit"
            ledger.batch(r)
            model.serving = (r, batch_id, items)
            self.served_from.append((w, r))
        elif kind == "backlog":
            head, released = rest
            self.send_actions(w, ledger.backlog(r, head, released, self.now))
        return True

    def finish(self, w: int) -> bool:
        model = self.workers[w]
        if model.serving is None:
            return False
        r, batch_id, _ = model.serving
        model.serving = None
        elsewhere = model.ledger.elsewhere_age(r, self.now)
        link = self.links.get((r, w))
        if link is not None:  # else its router died: the result is lost with it
            link.up.append(("result", batch_id, elsewhere))
        return True

    def check(self) -> None:
        for w, model in self.workers.items():
            holding = [
                r
                for r, q in self.queues.items()
                if str(w) in q._busy or str(w) in q._idle  # its credit is there
            ]
            assert len(holding) <= 1, f"worker {w}'s credit is at routers {holding}"
            busy = [r for r, q in self.queues.items() if str(w) in q._busy]
            if model.serving is not None and busy:
                assert busy == [model.serving[0]]

    def apply(self, op: str, r: int, w: int, *, kills: bool) -> None:
        """One random operation; router deaths and births only with `kills`."""
        if op == "push" and r in self.queues:
            self.push(r, self.pushed, deadline=self.now + 30)
        elif op == "up":
            self.deliver_up(r, w)
        elif op == "down":
            self.deliver_down(r, w)
        elif op == "finish":
            self.finish(w)
        elif op == "connect":
            self.connect(w, r)
        elif op == "kill_router" and kills and r in self.queues and len(self.queues) > 1:
            self.kill_router(r)
        elif op == "add_router" and kills and len(self.queues) < ROUTERS + 2:
            self.add_router()
        elif op == "kill_worker" and kills:
            self.kill_worker(w)
        elif op == "tick":
            self.now += r
            for router, q in self.queues.items():
                self.perform(router, q.cancel_expired(self.now))

    def settle(self) -> None:
        """Deliver everything and finish every batch until nothing moves."""
        for _ in range(10_000):
            moved = False
            for r, w in list(self.links):
                moved |= self.deliver_up(r, w) | self.deliver_down(r, w)
            for w in self.workers:
                moved |= self.finish(w)
            self.check()
            if not moved:
                return
        raise AssertionError("the routers and workers never settle")


ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, ROUTERS - 1), st.integers(0, 0)),
        st.tuples(st.just("up"), st.integers(0, ROUTERS + 1), st.integers(0, WORKERS - 1)),
        st.tuples(st.just("down"), st.integers(0, ROUTERS + 1), st.integers(0, WORKERS - 1)),
        st.tuples(st.just("finish"), st.integers(0, 0), st.integers(0, WORKERS - 1)),
        st.tuples(st.just("connect"), st.integers(0, ROUTERS + 1), st.integers(0, WORKERS - 1)),
        st.tuples(st.just("kill_router"), st.integers(0, ROUTERS + 1), st.integers(0, 0)),
        st.tuples(st.just("add_router"), st.integers(0, 0), st.integers(0, 0)),
        st.tuples(st.just("kill_worker"), st.integers(0, 0), st.integers(0, WORKERS - 1)),
        st.tuples(st.just("tick"), st.integers(1, 5), st.integers(0, 0)),
    ),
    min_size=40,
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, max_batch=st.integers(1, 4), routers=st.integers(1, ROUTERS), kills=st.booleans())
def test_many_routers_random_interleavings(
    ops: list[tuple[str, int, int]], max_batch: int, routers: int, kills: bool
) -> None:
    c = Cluster(routers, max_batch)
    for w in c.workers:
        for r in list(c.queues):
            c.connect(w, r)
    for op, r, w in ops:
        c.apply(op, r, w, kills=kills)
        c.check()
    # Workers follow the routers that exist (re-resolving), then everything settles.
    for w in c.workers:
        for r in list(c.queues):
            c.connect(w, r)
    c.settle()
    for r, q in c.queues.items():
        assert len(q) == 0, f"router {r} keeps {len(q)} items queued with workers connected"
        assert q.in_flight() == 0
    assert set(c.outcomes) == set(range(c.pushed)), "every item leaves exactly once"
    if routers == 1 and not kills:
        assert c.extra_messages == 0, "one router: Hello, batches and results only"
        assert set(c.outcomes.values()) <= {"done", "expired"}


def test_a_free_worker_takes_the_oldest_head_first() -> None:
    """Worker serving router 0's batch and knowing of router 1's older work: router 0's
    younger work waits; the worker serves router 1, then router 0."""
    c = Cluster(2, max_batch=4)
    c.workers = {0: WorkerModel()}
    c.connect(0, 0)
    c.connect(0, 1)
    c.settle()
    c.now = 1.0
    c.push(1, 1, deadline=100)  # router 1 tells the worker (on standby there)
    c.now = 2.0
    c.push(0, 0, deadline=100)  # router 0 holds the credit: dispatches at once
    assert c.deliver_down(1, 0)  # the notice first: the worker withdraws from router 0
    assert c.deliver_down(0, 0)  # then router 0's batch (the withdrawal crossed it)
    assert c.deliver_up(0, 0)  # router 0 reads the withdrawal while busy: void
    c.now = 3.0
    c.push(0, 2, deadline=100)  # younger than router 1's head
    c.push(1, 3, deadline=100)
    c.now = 4.0
    c.settle()
    assert c.served_from == [(0, 0), (0, 1), (0, 0)]
    assert c.outcomes == {0: "done", 1: "done", 2: "done", 3: "done"}


def test_a_credit_freed_while_a_router_is_greeted_goes_to_it() -> None:
    """The router holding the credit dies while another greets the worker on standby:
    the credit goes to the newcomer once it has welcomed the worker."""
    c = Cluster(2, max_batch=2)
    c.workers = {0: WorkerModel()}
    c.connect(0, 0)
    c.settle()
    c.connect(0, 1)  # Hello on standby: the credit is at router 0
    assert c.deliver_up(1, 0)
    c.kill_router(0)
    c.push(1, 0, deadline=100)
    c.settle()
    assert c.outcomes == {0: "done"} and c.workers[0].ledger.holder == 1


def test_an_idle_worker_moves_its_credit_to_queued_work() -> None:
    """The credit is parked at router 0 (nothing queued); work queued at router 1 is
    served by that worker after a withdrawal and a grant."""
    c = Cluster(2, max_batch=2)
    c.workers = {0: WorkerModel()}
    c.connect(0, 0)
    c.connect(0, 1)
    c.settle()
    assert c.workers[0].ledger.holder == 0
    c.push(1, 0, deadline=100)
    c.settle()
    assert c.served_from == [(0, 1)] and c.outcomes == {0: "done"}
    assert c.extra_messages == 4  # backlog, withdraw, released, grant


def test_a_withdrawal_crossing_a_batch_leaves_it_served_once() -> None:
    c = Cluster(2, max_batch=2)
    c.workers = {0: WorkerModel()}
    c.connect(0, 0)
    c.connect(0, 1)
    c.settle()
    c.push(1, 0, deadline=100)
    while c.deliver_down(1, 0):  # hears of router 1's work, withdraws from router 0
        pass
    c.push(0, 1, deadline=100)  # router 0 dispatches before it reads the withdrawal
    c.settle()
    assert c.outcomes == {0: "done", 1: "done"}
    assert sorted(r for _, r in c.served_from) == [0, 1]
