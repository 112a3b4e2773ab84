"""Deadline-aware admission (Clockwork's discipline): refuse at once what cannot finish
in time, instead of queueing it to expire.

At admission the router estimates when a request would finish from the work queued
ahead of it at each stage on its path and each stage's measured batch time, and sheds it
(503 + Retry-After) when that is past its budget. Pure logic, no I/O, no clock: the
router feeds each stage's batch round trips in (`StageModel.observe`) and asks
`Admission.estimate_s` per request.

For each stage on the request's path, with ``B`` its max batch, ``W`` its connected
workers, ``s(b)`` its batch round trip and ``n`` the items that will be ahead of the
request there (queued at the stage, plus queued or in a batch at any stage before it on
the path: they reach it first):

- ``wait`` (from now until the request's batch there comes back): ``r =
  ceil((n + 1) / (B * W))`` rounds, the first ``r - 1`` of full batches ``s(B)``, the
  last the request's own batch ``s(b)`` holding what is left spread over the workers
  (``b <= B``), plus half of the batch in progress when every worker is busy;
- the stage finishes the request at ``max(start + own, wait)``: ``start`` is when its
  last parent finishes it, ``own`` one batch there (a tandem queue: a request leaves a
  stage no sooner than it arrives plus its own batch, and no sooner than the stage has
  worked off what is ahead of it);
- no worker connected, or fewer than `MIN_SAMPLES` batches measured: 0 (unknown, so a
  cold stage never refuses anything; the deadline still bounds the request).

Many routers share the workers (each worker holds one credit and takes its next batch
from the router whose queue head is oldest), so a router's queue is worked off only in
the time the workers give it: the ``r - 1`` rounds ahead take ``s(B) / f`` each, ``f``
the stage's *share*, the fraction of its connected workers serving this router (idle or
busy here, not on standby for another router) while this router has work at the stage
(queued, or in a batch), a moving average sampled at each estimate that finds it so:
arrivals see time averages, so it is the share of that time the workers are here. (Only
when work is queued would undercount: a worker here often takes the whole queue in one
batch, and then only its absences find work queued.) With N routers loaded
alike ``f`` is about 1/N, so a router counts the work queued at the others without
knowing it; without the share each would admit as if it had every worker, N times
too much under overload. With one router no worker is ever on standby and ``f`` is 1.
The half batch in progress counts when no worker is idle here (busy here or elsewhere).

The estimate is the output stage's finish: the longest path through the DAG. A
conditional stage counts as if it runs (conservative: a request that skips it finishes
earlier). A request is refused when its estimate plus a learned margin (the SLO
percentile of how much longer admitted requests took than estimated, `ErrorQuantile`)
is over its budget; when the idle pipeline alone is over the budget, when that is over
its deadline and the idle time (`Admission.refuse`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from sloline.serving.queue import StageQueue
from sloline.spec import PipelineGraph

# A stage's model is trusted once it has seen this many batches.
MIN_SAMPLES = 5
# Weight of the newest batch in the moving averages (~ the last 20 batches matter).
ALPHA = 0.05
# The smallest worker share a stage is estimated with (1/100 of its workers' time).
MIN_SHARE = 0.01


class StageModel:
    """Batch round trip (dispatch to result, as the router sees it) as ``a + c * size``.

    Exponentially weighted least squares over (size, seconds): four moving averages per
    batch, the fit refreshed on each. When the sizes hardly vary (every batch full under
    load, or all of one under light load) the fit is proportional, ``c = mean s / mean
    size``: conservative for larger batches, which is the direction that matters.
    """

    __slots__ = ("_b", "_bb", "_bs", "_s", "fixed_s", "per_item_s", "samples")

    def __init__(self) -> None:
        self.samples = 0
        self._b = self._s = self._bb = self._bs = 0.0
        self.fixed_s = 0.0
        self.per_item_s = 0.0

    def observe(self, size: int, seconds: float) -> None:
        if size < 1 or not 0.0 <= seconds < 3600.0:  # a NaN fails the comparison too
            return
        self.samples += 1
        w = 1.0 / self.samples if self.samples < 1.0 / ALPHA else ALPHA
        b = float(size)
        self._b += w * (b - self._b)
        self._s += w * (seconds - self._s)
        self._bb += w * (b * b - self._bb)
        self._bs += w * (b * seconds - self._bs)
        var = self._bb - self._b * self._b
        if var > 0.25:
            c = (self._bs - self._b * self._s) / var
            a = self._s - c * self._b
            if c >= 0.0 and a >= 0.0:
                self.fixed_s, self.per_item_s = a, c
                return
        self.fixed_s, self.per_item_s = 0.0, self._s / self._b

    def seconds(self, size: int) -> float:
        return self.fixed_s + self.per_item_s * size


# Per stage on the path: its queue, its model, its parents' and its ancestors' positions
# on the path, and whether a later stage counts its items as ahead.
_Step = tuple[StageQueue, StageModel, tuple[int, ...], tuple[int, ...], bool]


class Admission:
    """Estimated time for a new request to pass through the pipeline, right now."""

    __slots__ = ("_finish", "_held", "_path", "_shares", "error", "last_s", "models", "shares")

    def __init__(self, graph: PipelineGraph, queues: Mapping[str, StageQueue]) -> None:
        self.models = {name: StageModel() for name in graph.stages}
        slo = graph.pipeline.spec.slo
        slo_s = slo.latency_ms / 1000.0
        quantile = min(slo.percentile / 100.0, 0.999)
        self.error = ErrorQuantile(quantile, step_s=slo_s / 100.0, cap_s=slo_s / 2)
        self.last_s = math.nan  # the last estimate; NaN while a stage is cold
        # The output stage's ancestors (and itself) in topological order, each with the
        # positions of its parents in that order: the longest path is one pass.
        output = graph.pipeline.spec.output
        needed: set[str] = set()
        todo = [output]
        while todo:
            name = todo.pop()
            if name not in needed:
                needed.add(name)
                todo.extend(graph.stages[name].deps)
        order = [n for n in graph.order if n in needed]
        index = {n: i for i, n in enumerate(order)}
        ancestors: dict[str, set[str]] = {}
        for n in order:
            deps = graph.stages[n].deps
            ancestors[n] = set(deps).union(*(ancestors[d] for d in deps))
        upstream = set().union(*ancestors.values())  # stages some stage waits behind
        self._path: tuple[_Step, ...] = tuple(
            (
                queues[n],
                self.models[n],
                tuple(index[d] for d in graph.stages[n].deps),
                tuple(sorted(index[a] for a in ancestors[n])),
                n in upstream,
            )
            for n in order
        )
        self._finish = [0.0] * len(order)
        self._held = [0] * len(order)
        # Per stage on the path: its workers' share (module docstring) and how many
        # samples the moving average has seen.
        self.shares = [1.0] * len(order)
        self._shares = [0] * len(order)

    def estimate_s(self) -> float:
        """Seconds from now until a request admitted now would leave the output stage."""
        finish = self._finish
        held = self._held
        cold = False
        for i, (queue, model, parents, ancestors, counted) in enumerate(self._path):
            queued = len(queue)
            if counted:
                held[i] = queued + queue.in_flight()
            start = 0.0
            for p in parents:
                start = max(start, finish[p])
            workers = queue.workers
            if not workers or model.samples < MIN_SAMPLES:
                finish[i] = start
                cold = True
                continue
            ahead = queued
            for a in ancestors:
                ahead += held[a]
            busy = queue.busy_workers
            standby = queue.standby_workers
            if queued or busy:  # work here (waiting or in a batch): sample the share
                n = self._shares[i] = self._shares[i] + 1
                w = 1.0 / n if n < 1.0 / ALPHA else ALPHA
                self.shares[i] += w * ((workers - standby) / workers - self.shares[i])
            size = queue.max_batch
            per_round = size * workers
            rounds = -(-(ahead + 1) // per_round)
            # Batches before the request's are full; its own holds what is left, spread
            # over the workers.
            last = min(size, -(-(ahead + 1 - (rounds - 1) * per_round) // workers))
            own = model.fixed_s + model.per_item_s * last
            wait = own
            if rounds > 1:
                full_s = model.fixed_s + model.per_item_s * size
                wait += (rounds - 1) * full_s / max(MIN_SHARE, self.shares[i])
            if busy + standby >= workers:  # none idle here: half of a batch in progress
                in_batch = queue.in_flight() / busy if busy else size
                wait += 0.5 * (model.fixed_s + model.per_item_s * in_batch)
            finish[i] = max(start + own, wait)
        self.last_s = math.nan if cold else finish[-1]
        return finish[-1]

    def idle_s(self) -> float:
        """The same with every stage idle: one batch of one per stage, nothing queued."""
        finish = self._finish
        for i, (queue, model, parents, _, _) in enumerate(self._path):
            start = 0.0
            for p in parents:
                start = max(start, finish[p])
            known = queue.workers and model.samples >= MIN_SAMPLES
            finish[i] = start + (model.seconds(1) if known else 0.0)
        return finish[-1]

    def refuse(self, budget_s: float, deadline_s: float) -> float | None:
        """The estimate plus margin when a request must be refused, else None.

        Refused when the estimate plus the learned margin (`ErrorQuantile`) is over
        `budget_s`. When even the idle pipeline takes longer than the budget (a plan
        too slow for the SLO, huge inputs), the request will be late whatever happens,
        and the limit becomes its deadline (or the idle time, if longer): an idle
        router always admits, and its model keeps learning from the batches it serves.
        The estimate is left in `last_s` (NaN while a stage on the path is cold).
        """
        margin_s = self.error.margin_s
        need_s = self.estimate_s() + margin_s
        if need_s <= budget_s:
            return None
        idle_s = self.idle_s() + margin_s
        if idle_s > budget_s and need_s <= max(idle_s, deadline_s):
            return None
        return need_s


class ErrorQuantile:
    """A streaming quantile of how much longer admitted requests took than estimated.

    The estimate is a typical finish, not a tail: under overload the queue settles where
    estimates meet the budget, and the spread around them (batch timing, hops, the
    event loop) would put a good part of the answers over the SLO. Admission adds this
    margin, the `quantile` (the SLO's percentile) of (latency - estimate) over recent
    answers, so that share of admitted requests finishes within the budget. Stochastic
    approximation: each observation moves the margin up by ``step * q`` when above it,
    down by ``step * (1 - q)`` otherwise; it settles where a share ``1 - q`` is above.
    Bounded to [0, `cap_s`] so no burst of surprises can refuse everything for long.
    """

    __slots__ = ("cap_s", "margin_s", "quantile", "step_s")

    def __init__(self, quantile: float, step_s: float, cap_s: float) -> None:
        self.quantile = quantile
        self.step_s = step_s
        self.cap_s = cap_s
        self.margin_s = 0.0

    def observe(self, error_s: float) -> None:
        if error_s > self.margin_s:
            self.margin_s = min(self.cap_s, self.margin_s + self.step_s * self.quantile)
        else:
            self.margin_s = max(0.0, self.margin_s - self.step_s * (1.0 - self.quantile))
