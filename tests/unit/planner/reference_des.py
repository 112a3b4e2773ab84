"""A straightforward global discrete-event simulation of the router, for checking the
estimator's stage-by-stage simulation against (test_equivalence.py).

One event heap for the whole pipeline. Events are keyed (time, stage, phase, sequence):
at one instant, stages are handled in topological order; at a stage, pushes (phase 0, in
query order) come before replicas finishing (phase 1). A push dispatches at once if a
replica is idle; a finishing replica takes min(queue, max_batch) queued items. These are
the router's rules (items ready at the same instant are pushed one at a time). Idle
replicas wait in a FIFO (the longest idle takes the next batch); a batch pays the idle
penalty for the time its worker waited: replica idle time plus one hop.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from sloline.planner.config import StageConfig
from sloline.planner.estimator import Workload
from sloline.planner.profile import PipelineProfile
from sloline.planner.sim.draws import ServiceMode, service_draws
from sloline.planner.topology import Topology

Event = tuple[float, int, int, int, str, tuple[int, ...]]  # time, stage, phase, seq, kind, items


class _Router:
    def __init__(
        self,
        topology: Topology,
        profile: PipelineProfile,
        config: Sequence[StageConfig],
        workload: Workload,
        service: ServiceMode,
        seed: int,
    ) -> None:
        self.topology, self.config, self.visits = topology, config, workload.visits
        n, stages = workload.size, len(topology)
        self.children: list[list[int]] = [[] for _ in range(stages)]
        for m, deps in enumerate(topology.deps):
            for d in deps:
                self.children[d].append(m)
        self.draws = [
            service_draws(
                profile.stage(name, cfg.hardware),
                cfg.max_batch,
                service,
                profile.hop_s,
                n,
                seed=seed,
                stage=m,
            )
            for m, (name, cfg) in enumerate(zip(topology.stages, config, strict=True))
        ]
        self.pending = [[len(deps) for deps in topology.deps] for _ in range(n)]
        self.done = np.full((n, stages), np.nan)
        self.queues: list[deque[int]] = [deque() for _ in range(stages)]
        # Per stage, idle replicas as the times they freed, longest idle first.
        self.idle: list[deque[float]] = [deque([-np.inf] * cfg.replicas) for cfg in config]
        self.hop_s = profile.hop_s
        self.batches = [0] * stages
        self.order = itertools.count()
        self.heap: list[Event] = [
            (t, -1, 0, q, "arrive", (q,)) for q, t in enumerate(workload.arrivals_s.tolist())
        ]
        heapq.heapify(self.heap)

    def resolve(self, q: int, m: int, t: float) -> None:
        """All of stage m's dependencies are done (or skipped) for query q at time t."""
        if self.visits[q, m]:
            heapq.heappush(self.heap, (t, m, 0, q, "push", (q,)))
        else:
            self.finish(q, m, t)

    def finish(self, q: int, m: int, t: float) -> None:
        self.done[q, m] = t
        for child in self.children[m]:
            self.pending[q][child] -= 1
            if self.pending[q][child] == 0:
                self.resolve(q, child, t)

    def dispatch(self, m: int, t: float) -> None:
        queue, max_batch = self.queues[m], self.config[m].max_batch
        while self.idle[m] and queue:
            batch = tuple(queue.popleft() for _ in range(min(max_batch, len(queue))))
            freed = self.idle[m].popleft()
            gap = t - freed + self.hop_s
            duration = self.draws[m].time_s(self.batches[m], len(batch), gap)
            self.batches[m] += 1
            heapq.heappush(self.heap, (t + duration, m, 1, next(self.order), "done", batch))

    def run(self) -> npt.NDArray[np.float64]:
        sources = [m for m, deps in enumerate(self.topology.deps) if not deps]
        while self.heap:
            t, m, _, _, kind, items = heapq.heappop(self.heap)
            if kind == "arrive":
                for source in sources:
                    self.resolve(items[0], source, t)
            elif kind == "push":
                self.queues[m].append(items[0])
                self.dispatch(m, t)
            else:
                self.idle[m].append(t)
                for q in items:
                    self.finish(q, m, t)
                self.dispatch(m, t)
        return self.done[:, self.topology.output]


def simulate_reference(
    topology: Topology,
    profile: PipelineProfile,
    config: Sequence[StageConfig],
    workload: Workload,
    *,
    service: ServiceMode = "p50",
    seed: int = 0,
) -> npt.NDArray[np.float64]:
    """Per-query end-to-end latencies, in arrival order."""
    finished = _Router(topology, profile, config, workload, service, seed).run()
    latencies: npt.NDArray[np.float64] = finished - workload.arrivals_s
    return latencies
