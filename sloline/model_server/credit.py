"""Where a worker's one credit is, across the routers it serves (docs/architecture.md,
"Many routers").

A worker holds one credit in total, so it has at most one batch in service. The credit
is at one router at a time: parked there while the worker is idle (that router
dispatches to it as soon as work is queued), or in service there while it runs that
router's batch. The other routers have the worker on standby and tell it when work is
queued for its stage and how long the oldest item has waited (Backlog). The rule:

- a worker that finishes a batch and knows of older work queued at another router
  returns the result with that age; the router keeps the credit only if its own queue
  head is at least as old, else releases it, and the worker grants it to the router
  whose head is oldest. So a free worker takes its next batch, `min(queue, max_batch)`
  items of that router's queue alone, from the router whose head is oldest;
- an idle worker whose credit is parked at a router with nothing queued, told of work
  elsewhere, withdraws the credit: the router answers that it is released, or has
  already sent a batch (the withdrawal crossed it: the batch is served, and the worker
  decides again when it returns it);
- a credit released or lost (its router went away) goes to the router with the oldest
  known head, else back where it was, else to any connected router.

With one router the worker never hears of work elsewhere, so none of this sends a
message: Hello, batches and results as with a single router.

Pure bookkeeping: no I/O; the worker performs the returned `(router, grant)` actions
(`grant`: give the credit, otherwise withdraw it) and passes the local clock in.
"""

from __future__ import annotations

from collections.abc import Hashable

Action = tuple[Hashable, bool]  # (router, True: grant the credit / False: withdraw it)


class CreditLedger:
    """One worker's credit and what it knows of the routers' queues."""

    def __init__(self) -> None:
        self.routers: dict[Hashable, None] = {}  # connected routers, in joining order
        self.holder: Hashable | None = None  # where the credit is (parked or in service)
        self.awaiting = False  # the holder owes an answer: a batch or a release
        self.heads: dict[Hashable, float] = {}  # router -> when its queue head arrived
        self.stopping = False

    def join(self, router: Hashable) -> bool:
        """`router` is about to be greeted; returns whether it joins on standby (the
        credit is elsewhere) or gets the credit with the Hello."""
        if self.holder is None:
            self.holder = router
            self.awaiting = False
            return False
        return True

    def welcomed(self, router: Hashable) -> list[Action]:
        """`router` accepted the worker: it may now be told about credit moves, and gets
        the credit if it is free (its router went away while this one was greeted)."""
        self.routers[router] = None
        if self.holder is None:
            return self._place(None)
        return self._rebalance()

    def leave(self, router: Hashable) -> list[Action]:
        """The stream to `router` ended; a credit that was there is free again."""
        self.routers.pop(router, None)
        self.heads.pop(router, None)
        if self.holder != router:
            return []
        self.holder = None
        self.awaiting = False
        return self._place(None)

    def batch(self, router: Hashable) -> None:
        """A batch arrived from `router` (the holder): whatever was asked is answered."""
        self.holder = router
        self.awaiting = False

    def elsewhere_age(self, router: Hashable, now: float) -> float | None:
        """Returning `router`'s batch: the head age of the oldest work queued at another
        router (the result then asks `router` to keep the credit only if its head is at
        least as old), or None to give the credit back unconditionally."""
        if self.stopping or not self.heads:
            return None
        oldest = self._oldest(exclude=router)
        if oldest is None:
            return None
        self.awaiting = True
        return now - self.heads[oldest]

    def backlog(
        self, router: Hashable, head_age_s: float | None, released: bool, now: float
    ) -> list[Action]:
        """`router` told what it has queued (`head_age_s`, None: nothing) and, with
        `released`, that the credit is back with the worker."""
        if head_age_s is None:
            self.heads.pop(router, None)
        else:
            self.heads[router] = now - head_age_s
        if released and self.holder == router:
            self.holder = None
            self.awaiting = False
            return self._place(router)
        return self._rebalance()

    def _oldest(self, exclude: Hashable | None = None) -> Hashable | None:
        best: Hashable | None = None
        for router, arrived in self.heads.items():
            if (
                router != exclude
                and router in self.routers
                and (best is None or arrived < self.heads[best])
            ):
                best = router
        return best

    def _place(self, previous: Hashable | None) -> list[Action]:
        if self.stopping or not self.routers:
            return []
        target = self._oldest()
        if target is None:
            target = previous if previous in self.routers else next(iter(self.routers))
        self.holder = target
        self.heads.pop(target, None)  # it dispatches at once if that work is still there
        return [(target, True), *self._rebalance()]

    def _rebalance(self) -> list[Action]:
        """Withdraw a parked credit when work is known to wait at another router."""
        holder = self.holder
        if holder not in self.routers or self.awaiting or self.stopping:
            return []
        if self._oldest(exclude=holder) is None:
            return []
        self.awaiting = True
        return [(holder, False)]
